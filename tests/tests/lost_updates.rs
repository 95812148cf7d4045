//! Lost updates found by combining lockkit's optimistic tools in ways the other
//! files do not: each test states the promise (README, module docs) it checks,
//! and fails while the promise is broken.

use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::Error;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::{b_commits_then_a_is_stale, exec, item, seed_items, stock_of};

/// The journal's names of rows in two tables must differ: A's versioned
/// write of item 1 rolls back on `$a`; an ordinary committed write of row 1 of
/// another table (`$where`: item 1 of another database on `$other`, or the
/// block `$other_write`); B reads item 1, writes its 7 and commits on `$b`
/// (A's table). A writes again from its rolled-back 1: it must be stale, and
/// B's 7 stay.
macro_rules! written_elsewhere {
    ($a:expr, $b:expr, $other:expr, $where:literal) => {
        written_elsewhere!($a, $b, $where, {
            let mut other = item!($other, 1);
            other.update_versioned($other).unwrap();
        })
    };
    ($a:expr, $b:expr, $where:literal, $other_write:block) => {{
        let mut a = item!($a, 1);
        lockkit_tests::write_rolled_back!($a, a, 5);
        $other_write
        b_commits_then_a_is_stale!($a, $b, a, concat!("a write in ", $where, " had cleared the journal"));
    }};
}

/// Row 1 of the archive's `items` (`archive::items`), read on `$conn`. A
/// macro: Diesel checks the query per connection type.
macro_rules! archived_item_1 {
    ($conn:expr) => {
        archive::items::table
            .find(1)
            .first::<Archived>($conn)
            .unwrap()
    };
}

mod journal {
    use super::*;

    /// Item 1 at stock 10, then in one transaction that rolls back: `a1` (read
    /// before it) writes stock 9 (v0 -> v1), and `a2`, read there after that
    /// write, renames the row (v1 -> v2). Two code paths that each load and save
    /// the row. The connection and both structs, holding 1 and 2.
    macro_rules! rolled_back_pair {
        ($db:expr) => {{
            let mut conn = $db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let mut a1 = item!(&mut conn, 1);
            let mut a2 = None;
            let rolled_back: Result<(), Error> = conn.transaction(|c| {
                a1.stock = 9;
                a1.update_versioned(c)?; // v0 -> v1
                let mut second = item!(c, 1); // reads v1 (a1's stock 9)
                second.name = "renamed".into();
                second.update_versioned(c)?; // v1 -> v2
                a2 = Some(second);
                Err(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            let a2 = a2.unwrap();
            assert_eq!((a1.lock_version, a2.lock_version), (1, 2));
            (conn, a1, a2)
        }};
    }

    /// Item 1 at stock 10, read on `$conn` and written (stock `$stock`, v0 ->
    /// v1) in a transaction that rolls back: the struct, holding the
    /// rolled-back 1.
    macro_rules! rolled_back_write {
        ($conn:ident, $stock:expr) => {{
            seed_items(&mut $conn, &[(1, 10)]);
            let mut a = item!(&mut $conn, 1);
            lockkit_tests::write_rolled_back!($conn, a, $stock);
            a
        }};
    }

    /// Item 1 at stock 10, read as a form whose save (stock 9, v0 -> v1) rolls
    /// back; the form is kept and opened twice (cloned after the rollback, as
    /// `update_versioned_recorded`'s example clones): two connections and the
    /// two copies, alice's and bob's, both holding the rolled-back 1.
    macro_rules! rolled_back_form {
        ($db:expr) => {{
            let mut a_conn = $db.conn();
            let b_conn = $db.conn();
            let form = rolled_back_write!(a_conn, 9);
            (a_conn, b_conn, form.clone(), form)
        }};
    }

    /// Bob renames the row from his copy of the rolled-back form, on `$conn`:
    /// he must be stale, and the row keep `$stock`, the stock of `$whose` write.
    macro_rules! bob_is_stale_over {
        ($bob:ident, $conn:ident, $stock:expr, $whose:literal) => {{
            $bob.name = "bob's rename".into();
            let saved = $bob.update_versioned(&mut $conn);
            let row = item!(&mut $conn, 1);
            assert!(
                matches!(saved, Err(Error::Stale(_))) && row.stock == $stock,
                "bob's copy of the rolled-back struct matched {}: {saved:?}, row {row:?} \
                 (its {} lost)",
                $whose,
                $stock
            );
        }};
    }

    lockkit_tests::backend_tests! {
        fn two_structs_written_in_one_rolled_back_transaction_never_write_over_each_others_retry(db) {
            // README: a struct whose versioned write was rolled back "writes as if
            // its version had been restored ... and it can never succeed over
            // somebody else's later write". Two structs of one row written in one
            // transaction (two code paths that each load and save the row), which
            // rolls back; then both retry.
            let (mut conn, mut a1, mut a2) = rolled_back_pair!(db);

            // a1 retries with stock 8 and commits (restored: v0 -> v1).
            a1.stock = 8;
            a1.update_versioned(&mut conn).unwrap();
            assert_eq!(stock_of!(&mut conn), 8);

            // a2 retries its rename from the copy that carries a1's rolled-back
            // stock 9: a1's committed write came after it was read.
            let again = a2.update_versioned(&mut conn);
            let stock = stock_of!(&mut conn);
            assert!(
                matches!(again, Err(Error::Stale(_))) && stock == 8,
                "a2's rolled-back version 2 was restored to 1, which a1's retry had just \
                 committed: {again:?}, stock {stock} (a1's 8 lost)"
            );
        }

        fn two_structs_written_in_one_rolled_back_transaction_retried_in_the_other_order(db) {
            // As above, the second struct retrying first. It was read after the
            // first struct's write, in the transaction that rolled back: it
            // carries that write's stock 9, and lockkit cannot tell it from the
            // first struct written twice. It is refused, not restored (restored
            // to 0 it would commit the rolled-back 9; restored to 1 it would
            // match the first struct's retry), and the row is left as it is.
            let (mut conn, mut a1, mut a2) = rolled_back_pair!(db);

            let renamed = a2.update_versioned(&mut conn);
            let stored = item!(&mut conn, 1);
            assert!(
                matches!(renamed, Err(Error::Stale(_))) && (stored.stock, stored.lock_version) == (10, 0),
                "a2 rests on a1's rolled-back write: {renamed:?}, row {stored:?}"
            );

            // a1 retries from the copy it read before: restored, it writes once.
            a1.stock = 8;
            a1.update_versioned(&mut conn).unwrap();
            let stored = item!(&mut conn, 1);
            assert_eq!((stored.stock, stored.name.as_str()), (8, "item 1"));
        }

        fn moving_past_a_reused_number_never_lands_on_another_structs_rolled_back_number(db) {
            // The same two structs; this time the row is written between by a
            // versioned conditional update (`Item::update_if`: one sale), and a1's
            // retry finds the row at the very number it holds. lockkit moves the
            // row one further, "so that neither writes on a guess"; that number is
            // a2's.
            let (mut conn, mut a1, mut a2) = rolled_back_pair!(db);

            // One sale, with the versioned conditional update: stock 9, v1.
            Item::update_if(&mut conn, 1, items::stock.ge(1), items::stock.eq(items::stock - 1)).unwrap();

            // a1 retries: stale (the row's 1 is the sale's), and the row is moved past 1.
            let first = a1.update_versioned(&mut conn);
            assert!(matches!(first, Err(Error::Stale(_))), "{first:?}");

            // a2 retries its rename, from a copy read before the sale.
            a2.stock = 20; // (what it read, changed: whatever it writes must not land)
            let again = a2.update_versioned(&mut conn);
            let stock = stock_of!(&mut conn);
            assert!(
                matches!(again, Err(Error::Stale(_))) && stock == 9,
                "a2's rolled-back version 2 matched the number lockkit moved the row to: \
                 {again:?}, stock {stock} (the sale's 9 overwritten)"
            );
        }

        fn a_write_to_a_table_of_another_schema_does_not_make_the_journal_forget_a_rolled_back_write(db) {
            // A `table!` named with its schema (`lockkit_archive.items`, as
            // `print-schema --schema` writes it) is not the `items` of the
            // connection's schema, though both are `items` to Rust.
            let (mut a_conn, mut b_conn) = (db.conn(), db.conn());
            seed_items(&mut a_conn, &[(1, 10)]);
            exec(&mut a_conn, &lockkit_tests::archive_sql(BACKEND, 1));
            written_elsewhere!(&mut a_conn, &mut b_conn, "lockkit_archive.items", {
                let mut archived = archived_item_1!(&mut a_conn);
                archived.stock = 9;
                archived.update_versioned(&mut a_conn).unwrap();
            });
        }

        fn a_copy_of_a_rolled_back_struct_never_writes_over_the_restored_write(db) {
            // README, Guarantees: a struct whose versioned write was rolled back
            // "can never succeed over somebody else's later write", and no write
            // commits a number a rolled-back write left. Alice saves the form
            // first, restored; bob, who never saw alice's save, must be stale.
            let (mut a_conn, mut b_conn, mut alice, mut bob) = rolled_back_form!(db);
            alice.stock = 7;
            alice.update_versioned(&mut a_conn).unwrap();
            bob_is_stale_over!(bob, b_conn, 7, "alice's restored write");
        }

        fn a_copy_of_a_rolled_back_struct_never_writes_over_a_fresh_readers_write_after_a_second_rollback(db) {
            // As above, alice's restored write in a transaction that rolls back
            // too; then a fresh reader writes the row and commits. bob's copy
            // still holds the first rolled-back number: it must be stale.
            let (mut a_conn, mut b_conn, mut alice, mut bob) = rolled_back_form!(db);
            let rolled_back_again: Result<(), Error> = a_conn.transaction(|c| {
                alice.stock = 8;
                alice.update_versioned(c)?; // restored, then rolled back
                Err(Error::NoRowMatched)
            });
            assert!(rolled_back_again.is_err());
            let mut fresh = item!(&mut a_conn, 1);
            fresh.stock = 6;
            fresh.update_versioned(&mut a_conn).unwrap();
            bob_is_stale_over!(bob, b_conn, 6, "the fresh reader's write");
        }

        fn a_rolled_back_delete_does_not_make_the_journal_forget_a_rolled_back_write(db) {
            // README, Guarantees: "A struct whose versioned write was rolled back
            // ... can never succeed over somebody else's later write."
            let mut a_conn = db.conn();
            let mut b_conn = db.conn();

            // A writes v0 -> v1 in a transaction that rolls back: `a` holds 1,
            // the row is back at 0.
            let mut a = rolled_back_write!(a_conn, 5);
            assert_eq!(a.lock_version, 1);

            // D deletes the row (v0) in a transaction that rolls back too: the
            // row is still there, at v0, untouched.
            let d = item!(&mut b_conn, 1);
            let undone: Result<(), Error> = b_conn.transaction(|c| {
                d.delete_versioned(c)?;
                Err(Error::NoRowMatched)
            });
            assert!(undone.is_err());
            assert_eq!(item!(&mut b_conn, 1).lock_version, 0, "the delete was undone");

            // B reads v0, writes its 7 and commits: v1 (or v2), B's data. A
            // writes again from its rolled-back 1: it must not land over B's.
            b_commits_then_a_is_stale!(
                &mut a_conn,
                &mut b_conn,
                a,
                "a rolled-back delete had cleared the journal"
            );
        }

        fn a_committed_delete_does_not_make_the_journal_forget_a_rolled_back_write(db) {
            // As above, with a delete that commits (in autocommit), and the
            // row inserted again "with a version past the old one", as the
            // README advises: past 0, at 1, the very number `a` holds from its
            // rolled-back write. `a`'s write, an edit of the deleted row, must
            // not land on the new one.
            let mut conn = db.conn();
            let mut a = rolled_back_write!(conn, 5);
            assert_eq!(a.lock_version, 1);
            item!(&mut conn, 1).delete_versioned(&mut conn).unwrap();
            exec(&mut conn, "INSERT INTO items (id, name, stock, lock_version) VALUES (1, 'new', 99, 1)");
            a.stock = 3;
            let written = a.update_versioned(&mut conn);
            assert!(matches!(written, Err(Error::Stale(_))), "{written:?}");
            assert_eq!(stock_of!(&mut conn, 1), 99, "the new row stands");
        }

    }
}

mod version_limits {
    use super::*;
    use lockkit_tests::exec;

    lockkit_tests::backend_tests! {
        fn a_rolled_back_write_to_the_i64_maximum_neither_panics_nor_wraps(db) {
            // lockkit::optimistic::version: "lockkit never wraps and never
            // panics." A struct whose write to i64::MAX was rolled back; the row
            // then reaches i64::MAX through `Document::update_if`; the struct
            // writes again, and lockkit moves the row past the number it holds.
            let mut conn = db.conn();
            exec(&mut conn, &format!(
                "INSERT INTO documents (id, title, note, lock_version) VALUES (1, 'd', NULL, {})",
                i64::MAX - 1
            ));
            let load = |conn: &mut Conn| documents::table.find(1_i64).first::<Document>(conn);
            let mut a = load(&mut conn).unwrap();
            let rolled_back: Result<(), Error> = conn.transaction(|c| {
                a.title = "a".into();
                a.update_versioned(c)?;
                Err(Error::NoRowMatched)
            });
            assert!(rolled_back.is_err());
            assert_eq!(a.lock_version, i64::MAX);
            Document::update_if(&mut conn, 1, documents::title.eq("d"), documents::title.eq("b")).unwrap();

            a.title = "a again".into();
            let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                a.update_versioned(&mut conn)
            }));
            let stored = load(&mut conn).map(|d| (d.title, d.lock_version));
            assert!(
                matches!(again, Ok(Err(_))),
                "the write of a struct holding i64::MAX: {}; the row now reads {stored:?}",
                match &again {
                    Ok(result) => format!("{result:?}"),
                    Err(panic) => format!(
                        "panicked: {}",
                        panic.downcast_ref::<String>().map(String::as_str)
                            .or(panic.downcast_ref::<&str>().copied()).unwrap_or("?")
                    ),
                }
            );
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_in_memory {
    use super::*;
    use diesel::connection::SimpleConnection;
    use diesel::SqliteConnection;

    /// A private in-memory database with the suite's `items` table and row 1 at
    /// version `version`.
    fn in_memory(version: i32) -> SqliteConnection {
        let mut conn = SqliteConnection::establish(":memory:").unwrap();
        conn.batch_execute(&format!(
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, \
             stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0); \
             INSERT INTO items VALUES (1, 'item 1', 10, {version})"
        ))
        .unwrap();
        conn
    }

    #[test]
    fn a_write_to_another_in_memory_database_does_not_make_the_journal_forget_a_rolled_back_write()
    {
        // Two in-memory SQLite databases in one process (two tenants, or a
        // cache and a scratch database): lockkit names both `""` in its
        // journal, so a row of one is taken for the row of the other.
        let mut one = in_memory(0);
        let mut two = in_memory(4);

        written_elsewhere!(&mut one, &mut one, &mut two, "another in-memory database");
    }

    #[test]
    fn an_error_in_innodbs_words_ends_no_sqlite_transaction() {
        // A trigger of the user's refuses a sale below zero with the words of
        // InnoDB's deadlock, and the caller lets the error go. SQLite ends no
        // transaction on it: a nested `with_lock` and a versioned write after
        // it must go through, not be refused as if MariaDB had rolled the
        // transaction back. lockkit's journal was installed by an earlier
        // lockkit call, or by the user (`Journal::new`, which knows no
        // backend until lockkit tells it).
        for installed_by_lockkit in [true, false] {
            let mut conn = in_memory(0);
            conn.batch_execute(
                "INSERT INTO items VALUES (2, 'item 2', 10, 0); \
                 CREATE TRIGGER items_refuse_negative BEFORE UPDATE ON items \
                 WHEN NEW.stock < 0 BEGIN SELECT RAISE(ABORT, \
                 'Deadlock found when trying to get lock; try restarting transaction'); END",
            )
            .unwrap();
            if installed_by_lockkit {
                lockkit::locked_transaction(&mut conn, lockkit::LockOptions::default(), |_| {
                    Ok::<_, Error>(())
                })
                .unwrap();
            } else {
                conn.set_instrumentation(lockkit::journal::Journal::new());
            }
            let outcome = conn.transaction(|conn| {
                let refused = diesel::update(items::table.find(2))
                    .set(items::stock.eq(-1))
                    .execute(conn);
                assert!(refused.is_err(), "the trigger refused nothing");
                lockkit::with_lock(
                    conn,
                    1,
                    lockkit::LockOptions::default(),
                    |conn, item: Item| {
                        diesel::update(items::table.find(1))
                            .set(items::stock.eq(item.stock - 1))
                            .execute(conn)?;
                        Ok::<_, Error>(())
                    },
                )?;
                let mut one = item!(conn, 1);
                one.stock -= 1;
                one.update_versioned(conn)
            });
            let stock: i32 = items::table
                .find(1)
                .select(items::stock)
                .first(&mut conn)
                .unwrap();
            assert!(
                outcome.is_ok() && stock == 8,
                "journal installed by lockkit: {installed_by_lockkit}; the sales got \
                 {outcome:?}, item 1's stock {stock}"
            );
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres_schemas {
    use super::*;
    use diesel::PgConnection;
    use lockkit_tests::{exec, TestDb};

    /// A tenant's connection: its `search_path` set once, as a pool per tenant does.
    fn tenant(db: &TestDb<PgConnection>, search_path: &str) -> PgConnection {
        let mut conn = db.connect();
        exec(&mut conn, &format!("SET search_path TO {search_path}"));
        conn
    }

    #[test]
    fn a_write_in_another_schema_does_not_make_the_journal_forget_a_rolled_back_write() {
        // Schema-per-tenant: each tenant's `items` in a schema of its own, the
        // connection's `search_path` choosing it. lockkit's journal names a row by
        // database, server, table and key, so tenant 2's row 1 is taken for
        // tenant 1's.
        let db = TestDb::<PgConnection>::new("schema_per_tenant_journal");
        let mut setup = db.connect();
        for (tenant, version) in [("tenant_1", 0), ("tenant_2", 4)] {
            exec(
                &mut setup,
                &format!(
                    "CREATE SCHEMA {tenant}; \
                     CREATE TABLE {tenant}.items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, \
                     stock INTEGER NOT NULL, lock_version INTEGER NOT NULL DEFAULT 0); \
                     INSERT INTO {tenant}.items VALUES (1, 'item 1', 10, {version})"
                ),
            );
        }
        let (mut a_conn, mut b_conn, mut two) = (
            tenant(&db, "tenant_1"),
            tenant(&db, "tenant_1"),
            tenant(&db, "tenant_2"),
        );

        written_elsewhere!(&mut a_conn, &mut b_conn, &mut two, "tenant 2's schema");
    }

    #[test]
    fn a_table_named_with_its_schema_is_one_table_whatever_the_connections_search_path() {
        // Schema-per-tenant connections reach a shared table whose `table!`
        // names its schema (`lockkit_archive.items`). A's write of its row 1
        // rolls back on tenant 1's connection; B commits the row (0 -> 1) on
        // tenant 2's; A retries there. The row is one row, whichever schema
        // comes first in the connection's `search_path`: A must be stale.
        let db = TestDb::<PgConnection>::new("qualified_table_across_search_paths");
        let mut setup = db.connect();
        let archive = lockkit_tests::archive_sql("postgres", 1);
        exec(
            &mut setup,
            &format!("CREATE SCHEMA tenant_1; CREATE SCHEMA tenant_2; {archive}"),
        );
        let (mut one, mut two) = (tenant(&db, "tenant_1"), tenant(&db, "tenant_2"));
        lockkit_tests::rolled_back_on_one_retried_on_the_other!(
            &mut one,
            &mut two,
            |conn: &mut PgConnection| archived_item_1!(conn),
            "tenant 2's connection"
        );
    }

    /// Schema-per-tenant connections (`search_path` tenant_N, public) reach
    /// the shared `public.items` through a `table!` without a schema: each
    /// connection's first schema is its tenant's, where no `items` is. A's
    /// write of row 1 rolls back on tenant 1's connection; B commits the row
    /// on tenant 2's; A retries there: one row, so A must be stale. `prepare`
    /// readies each tenant's connection, before the shared table is there
    /// (it is created, as a migration would, right after).
    fn shared_table_through_search_paths(name: &str, prepare: fn(&mut PgConnection)) {
        let db = TestDb::<PgConnection>::new(name);
        let mut setup = db.connect();
        exec(
            &mut setup,
            "CREATE SCHEMA tenant_1; CREATE SCHEMA tenant_2; ALTER TABLE items RENAME TO items_later",
        );
        let (mut one, mut two) = (
            tenant(&db, "tenant_1, public"),
            tenant(&db, "tenant_2, public"),
        );
        prepare(&mut one);
        prepare(&mut two);
        exec(&mut setup, "ALTER TABLE items_later RENAME TO items");
        seed_items(&mut setup, &[(1, 10)]);
        lockkit_tests::rolled_back_on_one_retried_on_the_other!(
            &mut one,
            &mut two,
            |conn: &mut PgConnection| item!(conn, 1),
            "tenant 2's connection"
        );
    }

    #[test]
    fn a_shared_table_found_through_the_search_path_is_one_table_to_every_tenant() {
        // The connections' journals learn the schema with the key check.
        shared_table_through_search_paths("shared_table_across_search_paths", |_| {});
    }

    #[test]
    fn a_shared_table_created_after_a_tenants_first_write_to_it_is_one_table_to_every_tenant() {
        // An application that serves while its migrations run: each
        // connection's first versioned write finds no `items` and fails. What
        // the connection found then (nothing) must not name the table later.
        shared_table_through_search_paths("shared_table_created_later", |conn| {
            let mut early = Item {
                id: 1,
                name: "item 1".into(),
                stock: 1,
                lock_version: 0,
            };
            let refused = early.update_versioned(conn);
            assert!(
                refused.is_err(),
                "a write to a table not there yet: {refused:?}"
            );
        });
    }

    #[test]
    fn a_shared_table_found_through_the_search_path_is_one_table_on_connections_lockkit_cannot_watch(
    ) {
        // With instrumentation of their own, the connections keep no journal:
        // the schema is asked at each write that names its row.
        shared_table_through_search_paths("shared_table_unwatched", |conn| {
            conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
        });
    }

    #[test]
    fn a_database_reached_through_a_unix_socket_and_tcp_is_one_database() {
        // `inet_server_addr()` is the address the connection reached, NULL
        // over a Unix socket: the server part of a row's name depends on the
        // path, and must not make one row two.
        let db = TestDb::<PgConnection>::new("socket_and_tcp");
        let mut tcp = db.connect();
        seed_items(&mut tcp, &[(1, 10)]);
        let (dirs, port): (String, String) = diesel::select((
            diesel::dsl::sql::<diesel::sql_types::Text>(
                "current_setting('unix_socket_directories')",
            ),
            diesel::dsl::sql::<diesel::sql_types::Text>("current_setting('port')"),
        ))
        .get_result(&mut tcp)
        .unwrap();
        let dir = dirs.split(',').next().unwrap_or_default().trim();
        assert!(!dir.is_empty(), "the test server listens on no Unix socket");
        let (user, rest) = db.url.split_once('@').unwrap();
        let name = rest.rsplit_once('/').unwrap().1;
        let socket_url = format!("{user}@/{name}?host={dir}&port={port}");
        let mut socket = PgConnection::establish(&socket_url)
            .unwrap_or_else(|e| panic!("cannot reach the test server at {socket_url}: {e}"));

        lockkit_tests::rolled_back_on_one_retried_on_the_other!(
            &mut tcp,
            &mut socket,
            |conn: &mut PgConnection| item!(conn, 1),
            "a Unix socket"
        );
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_attached {
    use super::*;
    use diesel::SqliteConnection;
    use lockkit_tests::{exec, TestDb};

    #[test]
    fn a_database_attached_by_connections_with_different_main_files_is_one_database() {
        // A file of shared rows, attached as `lockkit_archive` by two
        // connections whose own (main) databases differ, one spelling the
        // name in capitals (SQLite's names ignore case).
        let shared = TestDb::<SqliteConnection>::empty("attached_shared");
        exec(
            &mut shared.connect(),
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, \
             stock INTEGER NOT NULL, lock_version INTEGER NOT NULL); \
             INSERT INTO items VALUES (1, 'shared', 10, 0)",
        );
        let (main_1, main_2) = (
            TestDb::<SqliteConnection>::empty("attached_main_1"),
            TestDb::<SqliteConnection>::empty("attached_main_2"),
        );
        let attach = |main: &TestDb<SqliteConnection>, alias: &str| {
            let mut conn = main.connect();
            let file = shared.url.replace('\'', "''");
            exec(&mut conn, &format!("ATTACH DATABASE '{file}' AS {alias}"));
            conn
        };
        let (mut one, mut two) = (
            attach(&main_1, "lockkit_archive"),
            attach(&main_2, "LOCKKIT_ARCHIVE"),
        );

        lockkit_tests::rolled_back_on_one_retried_on_the_other!(
            &mut one,
            &mut two,
            |conn: &mut SqliteConnection| archived_item_1!(conn),
            "another main file"
        );
    }
}

#[cfg(feature = "mysql")]
mod mysql_aborted {
    use super::*;
    use diesel::MysqlConnection;
    use lockkit::{retry, LockOptions, RetryPolicy};
    use lockkit_tests::aborts::{
        assert_refused, beside_neighbour, seed_for_deadlock, twin_holder, Cue,
        DEADLOCK_WORDED_REFUSAL,
    };
    use lockkit_tests::{exec, TestDb};
    use std::sync::mpsc;

    /// Item 2's stock and the count of order lines, read on a new connection.
    fn sold_and_lines(db: &TestDb<MysqlConnection>) -> (i32, i64) {
        let mut fresh = db.connect();
        let stock = stock_of!(&mut fresh, 2);
        let lines = orders::table.count().get_result::<i64>(&mut fresh).unwrap();
        (stock, lines)
    }

    /// Sells one unit of item 2 the README's way: re-read, change,
    /// `update_versioned`.
    fn sell_two(conn: &mut MysqlConnection) -> Result<(), Error> {
        let mut two = item!(conn, 2);
        two.stock -= 1;
        two.update_versioned(conn)
    }

    /// Run `run` of an owner's work, which holds item 1: records order line
    /// `run`, waits for the cue on the first run, then [`sell_two`] in a nested
    /// `retry`, whose UPDATE is then the deadlock's victim.
    fn record_and_sell(conn: &mut MysqlConnection, run: i32, cue: &Cue) -> Result<(), Error> {
        let line = format!("INSERT INTO orders (id, item_id, qty) VALUES ({run}, NULL, 1)");
        exec(conn, &line);
        if run == 1 {
            cue.wait();
        }
        retry(&RetryPolicy::default(), |_| sell_two(conn))
    }

    /// Runs `run` beside the heavier neighbour on a new database `name`, handing
    /// it the count of the outer transaction's runs to keep; then the whole
    /// transaction must have run again after the deadlock: `Ok`, one order line,
    /// one unit of item 2 sold.
    fn assert_retried_whole(
        name: &str,
        run: impl FnOnce(&mut MysqlConnection, &Cue, &mut i32) -> Result<(), Error>,
    ) {
        let db = TestDb::<MysqlConnection>::new(name);
        let mut runs = 0;
        let outcome = beside_neighbour(&db, "mysql", |conn, cue| run(conn, cue, &mut runs));
        let (stock, lines) = sold_and_lines(&db);
        assert!(
            outcome.is_ok() && (stock, lines) == (9, 1),
            "item 2's stock {stock}, order lines {lines} after {runs} runs of the outer \
             transaction; the caller got {outcome:?}"
        );
    }

    /// README, Guarantees: "Nothing is retried inside a transaction the server
    /// has aborted." The README's own retry loop around `sell` (one unit of
    /// item 2) inside the caller's transaction, which first records an order
    /// line, on the connection `wrap` makes of a MariaDB one. `sell`'s UPDATE is
    /// the deadlock's victim: InnoDB rolls back the whole transaction, order line
    /// included; nothing of it may commit.
    fn nested_retry_commits_nothing<C: Connection>(
        name: &str,
        wrap: impl FnOnce(MysqlConnection) -> C,
        mut sell: impl FnMut(&mut C) -> Result<(), Error>,
    ) {
        let db = TestDb::<MysqlConnection>::new(name);
        let mut attempts = 0;
        let outcome: Result<(), Error> = beside_neighbour(&db, "mysql", |conn, cue| {
            let mut conn = wrap(std::mem::replace(conn, db.connect()));
            conn.transaction(|conn| {
                exec(
                    conn,
                    "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
                );
                exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                cue.wait();
                retry(&RetryPolicy::default(), |_| {
                    attempts += 1;
                    sell(&mut *conn)
                })
            })
        });
        let (stock, lines) = sold_and_lines(&db);
        assert!(
            (stock, lines) == (10, 0) || (stock, lines) == (9, 1),
            "half of the caller's transaction committed: item 2's stock {stock}, order lines \
             {lines}, after {attempts} attempts; the caller got {outcome:?}"
        );
    }

    /// Sells one unit of item 2 with `Item::update_if`, the versioned
    /// conditional update (`atomic::update_if`), on `$conn` of either
    /// connection type the tests use.
    macro_rules! conditional_sale {
        ($conn:expr) => {
            Item::update_if(
                $conn,
                2,
                items::stock.ge(1),
                items::stock.eq(items::stock - 1),
            )
        };
    }

    #[test]
    fn a_deadlocked_versioned_write_under_a_nested_retry_commits_nothing() {
        // Re-read, change, `update_versioned`.
        nested_retry_commits_nothing("nested_retry_versioned_deadlock", |c| c, sell_two);
    }

    #[test]
    fn a_deadlocked_conditional_update_under_a_nested_retry_commits_nothing() {
        nested_retry_commits_nothing(
            "nested_retry_update_if_deadlock",
            |c| c,
            |conn| conditional_sale!(conn),
        );
    }

    #[test]
    fn a_deadlocked_conditional_update_through_a_multi_connection_enum_commits_nothing() {
        // The enum's backend type names no server: the journal learns it from
        // MariaDB's own words.
        nested_retry_commits_nothing(
            "nested_retry_update_if_enum",
            lockkit_tests::support::AnyConnection::Mysql,
            |conn| conditional_sale!(conn),
        );
    }

    #[test]
    fn a_deadlocked_versioned_write_on_an_instrumented_connection_commits_nothing() {
        // Instrumentation of the caller's own, not wrapped in `Journal::wrap`:
        // no journal watches, and the write still must not be run again in
        // autocommit.
        nested_retry_commits_nothing(
            "nested_retry_instrumented",
            |mut conn| {
                conn.set_instrumentation(|_: diesel::connection::InstrumentationEvent<'_>| {});
                conn
            },
            sell_two,
        );
    }

    #[test]
    fn a_deadlocked_versioned_write_under_a_nested_retry_is_not_applied_twice_by_the_owners_retry()
    {
        // As above, with lockkit owning the outer transaction
        // (`transaction_with_retry`, which reruns it after the abort): the
        // nested retry's write, committed on its own, must not be applied again
        // by the rerun. One order line, one unit sold.
        let db = TestDb::<MysqlConnection>::new("owner_retry_versioned_deadlock");
        let mut runs = 0;
        let outcome: Result<(), Error> = beside_neighbour(&db, "mysql", |conn, cue| {
            lockkit::transaction_with_retry(conn, &RetryPolicy::default(), |conn| {
                runs += 1;
                exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                record_and_sell(conn, runs, cue)
            })
        });
        let (stock, lines) = sold_and_lines(&db);
        assert!(
            10 - i64::from(stock) == lines,
            "{} units of item 2 sold for {lines} order lines (runs of the outer transaction: \
             {runs}; the caller got {outcome:?})",
            10 - stock
        );
    }

    /// A plain Diesel sale of one unit of item 2 in a `retry`, counting its
    /// attempts: `retry` sees no connection, and the error is the deadlock
    /// `From` made of Diesel's.
    fn plain_sale_retried(conn: &mut MysqlConnection, attempts: &mut i32) -> Result<(), Error> {
        retry(&RetryPolicy::default(), |_| {
            *attempts += 1;
            diesel::update(items::table.find(2))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)?;
            Ok(())
        })
    }

    #[test]
    fn a_deadlocked_plain_write_under_a_nested_retry_is_not_applied_twice_by_the_owners_retry() {
        // The owner's transaction records order line `run`, then a `retry`
        // inside it runs a plain Diesel sale, the deadlock's victim: InnoDB
        // rolled back the whole transaction, so a second attempt in it would
        // commit on its own, and the owner's rerun would sell again.
        let db = TestDb::<MysqlConnection>::new("owner_retry_plain_deadlock");
        let mut runs = 0;
        let mut attempts = 0;
        let outcome: Result<(), Error> = beside_neighbour(&db, "mysql", |conn, cue| {
            lockkit::transaction_with_retry(conn, &RetryPolicy::default(), |conn| {
                runs += 1;
                exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                let line =
                    format!("INSERT INTO orders (id, item_id, qty) VALUES ({runs}, NULL, 1)");
                exec(conn, &line);
                if runs == 1 {
                    cue.wait();
                }
                plain_sale_retried(conn, &mut attempts)
            })
        });
        let (stock, lines) = sold_and_lines(&db);
        assert!(
            outcome.is_ok() && (stock, lines) == (9, 1),
            "item 2's stock {stock}, order lines {lines} after {runs} runs of the outer \
             transaction and {attempts} attempts of the inner retry; the caller got {outcome:?}"
        );
    }

    #[test]
    fn a_lock_wait_timeout_under_a_nested_retry_is_retried_in_the_live_transaction() {
        // A lock wait timeout ends the statement only (the server's default,
        // without `--innodb-rollback-on-timeout`): the transaction is alive,
        // and a `retry` inside it may run the sale again there. Another
        // session holds item 2 for 2.5 s; each attempt waits 1 s.
        let db = TestDb::<MysqlConnection>::new("nested_retry_lock_wait_timeout");
        seed_for_deadlock(&mut db.conn());
        let (held_tx, held_rx) = mpsc::channel();
        let mut attempts = 0;
        let outcome: Result<(), Error> = std::thread::scope(|s| {
            s.spawn(|| {
                let mut holder = db.connect();
                holder
                    .transaction(|conn| {
                        exec(conn, "SELECT id FROM items WHERE id = 2 FOR UPDATE");
                        held_tx.send(()).unwrap();
                        std::thread::sleep(std::time::Duration::from_millis(2_500));
                        Ok::<_, diesel::result::Error>(())
                    })
                    .unwrap();
            });
            let mut conn = db.connect();
            exec(&mut conn, "SET SESSION innodb_lock_wait_timeout = 1");
            held_rx.recv().unwrap();
            conn.transaction(|conn| {
                exec(
                    conn,
                    "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
                );
                Item::lock_all(conn, &[1])?;
                let policy = RetryPolicy::immediate(5);
                retry(&policy, |_| {
                    attempts += 1;
                    diesel::update(items::table.find(2))
                        .set(items::stock.eq(items::stock - 1))
                        .execute(conn)?;
                    Ok(())
                })
            })
        });
        let (stock, lines) = sold_and_lines(&db);
        assert!(
            outcome.is_ok() && (stock, lines) == (9, 1) && attempts > 1,
            "item 2's stock {stock}, order lines {lines}, after {attempts} attempts; the caller \
             got {outcome:?}"
        );
    }

    #[test]
    fn a_deadlocked_plain_write_under_a_nested_retry_in_your_transaction_commits_nothing() {
        // The caller's own transaction, which locks item 1 through lockkit
        // (`lock_all`, so lockkit watches the connection), then runs a plain
        // sale in a `retry`: the sale is the deadlock's victim, and its retry
        // must not run again in autocommit.
        let db = TestDb::<MysqlConnection>::new("nested_retry_plain_deadlock");
        let mut attempts = 0;
        let outcome: Result<(), Error> = beside_neighbour(&db, "mysql", |conn, cue| {
            conn.transaction(|conn| {
                exec(
                    conn,
                    "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
                );
                Item::lock_all(conn, &[1])?;
                cue.wait();
                plain_sale_retried(conn, &mut attempts)
            })
        });
        let (stock, lines) = sold_and_lines(&db);
        assert!(
            (stock, lines) == (10, 0),
            "half of the caller's transaction committed: item 2's stock {stock}, order lines \
             {lines}, after {attempts} attempts; the caller got {outcome:?}"
        );
        assert!(
            matches!(outcome, Err(Error::Deadlock)),
            "the deadlock is handed back, retryable by a retry around the transaction: {outcome:?}"
        );
    }

    #[test]
    fn a_write_after_a_caught_abort_of_a_versioned_write_is_refused() {
        // README, Guarantees: "A write after a caught abort is refused". The
        // caller's transaction holds item 1; `sell_two`'s UPDATE is the
        // deadlock's victim, and the caller catches its `TransactionAborted` and
        // records an order line: that INSERT must not commit on its own.
        let db = TestDb::<MysqlConnection>::new("caught_versioned_abort_write");
        let mut caught = None;
        let outcome: Result<(), Error> = beside_neighbour(&db, "mysql", |conn, cue| {
            conn.transaction(|conn| {
                exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                cue.wait();
                caught = Some(sell_two(conn));
                diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)")
                    .execute(conn)
                    .map_err(lockkit::classify)?;
                Ok(())
            })
        });
        let (stock, lines) = sold_and_lines(&db);
        let rows = format!("item 2's stock {stock}, order lines {lines}");
        assert_refused(&caught, true, &outcome, (stock, lines) == (10, 0), &rows);
    }

    /// README, Guarantees: "A write after a caught abort is refused", for a
    /// versioned write of a model whose key the database does not enforce
    /// (`Twin`), in the caller's own transaction at `isolation` (the server's
    /// default when `None`): it records order line 1 and holds item 1, then
    /// writes `twin` (the row is at version 1) while [`twin_holder`] holds the
    /// twin's row and waits for item 1, so that one of the write's statements
    /// is the deadlock's victim. The caller catches the write's error and
    /// records order line 2: that INSERT must not commit on its own.
    fn caught_twin_abort(name: &str, isolation: Option<&str>, mut twin: Twin) {
        let db = TestDb::<MysqlConnection>::new(name);
        seed_for_deadlock(&mut db.conn());
        let (locked, locked_rx) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let mut caught = None;
        let outcome: Result<(), Error> = std::thread::scope(|s| {
            let neighbour = s.spawn(|| twin_holder(&mut db.connect(), locked, go_rx));
            let mut conn = db.connect();
            if let Some(level) = isolation {
                exec(
                    &mut conn,
                    &format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"),
                );
            }
            let outcome = conn.transaction(|conn| {
                exec(
                    conn,
                    "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
                );
                exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                locked_rx.recv().unwrap();
                go.send(()).unwrap();
                twin.label = "sold".into();
                caught = Some(twin.update_versioned(conn));
                diesel::sql_query("INSERT INTO orders (id, item_id, qty) VALUES (2, NULL, 1)")
                    .execute(conn)
                    .map_err(lockkit::classify)?;
                Ok(())
            });
            neighbour.join().unwrap();
            outcome
        });
        let (_, lines) = sold_and_lines(&db);
        let rows = format!("order lines {lines}");
        assert_refused(&caught, true, &outcome, lines == 0, &rows);
    }

    #[test]
    fn a_write_after_a_caught_abort_of_a_stale_writes_follow_up_read_is_refused() {
        // READ COMMITTED: the stale UPDATE (the twin at 0, the row at 1) does
        // not wait for the neighbour's lock (InnoDB's semi-consistent read
        // finds the row's last committed version, which does not match), and
        // the follow-up read of the current version (`LOCK IN SHARE MODE`)
        // then waits for it: that read is the deadlock's victim.
        let stale = Twin {
            id: 1,
            label: "a".into(),
            lock_version: 0,
        };
        caught_twin_abort("caught_follow_up_read_abort", Some("READ COMMITTED"), stale);
    }

    #[test]
    fn a_write_after_a_caught_abort_of_a_write_in_a_savepoint_is_refused() {
        // The twin at the row's version: its UPDATE, in a savepoint (the key
        // is not enforced), waits for the neighbour's lock and is the
        // deadlock's victim; InnoDB has rolled back the whole transaction, so
        // the savepoint is gone with it.
        let fresh = Twin {
            id: 1,
            label: "a".into(),
            lock_version: 1,
        };
        caught_twin_abort("caught_savepoint_write_abort", None, fresh);
    }

    /// A refusal of the user's own that reads like a deadlock (a trigger's
    /// `SIGNAL` with InnoDB's words, [`DEADLOCK_WORDED_REFUSAL`]) ends nothing
    /// on the server: the caller's transaction is still open, so lockkit must
    /// not open its read-only stand-in, whose `START TRANSACTION` would commit
    /// the caller's work so far. The caller records an order line, the write is
    /// refused, the caller rolls back: nothing of it may be left.
    #[test]
    fn a_trigger_refusal_worded_like_a_deadlock_leaves_the_callers_transaction_to_roll_back() {
        let db = TestDb::<MysqlConnection>::new("deadlock_worded_refusal");
        let mut conn = db.conn();
        seed_for_deadlock(&mut conn);
        exec(&mut conn, DEADLOCK_WORDED_REFUSAL);
        let mut refused = None;
        let outcome: Result<(), Error> = conn.transaction(|conn| {
            exec(
                conn,
                "INSERT INTO orders (id, item_id, qty) VALUES (1, NULL, 1)",
            );
            let mut two = item!(conn, 2);
            two.stock = -1;
            refused = Some(two.update_versioned(conn));
            Err(Error::NoRowMatched)
        });
        let (stock, lines) = sold_and_lines(&db);
        let rows = format!("item 2's stock {stock}, order lines {lines}");
        assert_refused(&refused, false, &outcome, (stock, lines) == (10, 0), &rows);
    }

    #[test]
    fn a_retry_around_the_callers_transaction_runs_it_again_after_a_deadlocked_versioned_write() {
        // The README's `retry` (and the shop example's optimistic strategy)
        // around the caller's own Diesel transaction: an order line, then
        // `sell_two`, whose UPDATE is the deadlock's victim on the first run.
        // Nothing of that run is left once the caller rolled it back, so the
        // `TransactionAborted` it returned is retryable by then, and the retry
        // runs the whole transaction again: `Ok`, one order line, one unit sold.
        assert_retried_whole("retry_around_own_transaction", |conn, cue, runs| {
            retry(&RetryPolicy::default(), |_| {
                *runs += 1;
                conn.transaction(|conn| {
                    exec(conn, "SELECT id FROM items WHERE id = 1 FOR UPDATE");
                    let line =
                        format!("INSERT INTO orders (id, item_id, qty) VALUES ({runs}, NULL, 1)");
                    exec(conn, &line);
                    if *runs == 1 {
                        cue.wait();
                    }
                    sell_two(conn)
                })
            })
        });
    }

    #[test]
    fn a_deadlocked_bulk_versioned_update_outside_a_transaction_is_retried() {
        // `update_all_by_version` opens the outermost transaction itself; its
        // UPDATE of item 2 (after item 1's) is the deadlock's victim. Nothing of
        // it is left, so the `retry` around it must run it again: `Ok`, and
        // both rows written once.
        let db = TestDb::<MysqlConnection>::new("bulk_versioned_deadlock_retry");
        let mut attempts = 0;
        let outcome: Result<(), Error> = beside_neighbour(&db, "mysql", |conn, cue| {
            cue.wait();
            retry(&RetryPolicy::default(), |_| {
                attempts += 1;
                let rows = [
                    (1, item!(conn, 1).lock_version),
                    (2, item!(conn, 2).lock_version),
                ];
                Item::update_all_by_version(conn, &rows, items::stock.eq(items::stock - 1))
                    .map(drop)
            })
        });
        let mut fresh = db.connect();
        let stocks = (stock_of!(&mut fresh, 1), stock_of!(&mut fresh, 2));
        assert!(
            outcome.is_ok() && stocks == (9, 9),
            "stocks of items 1 and 2: {stocks:?} after {attempts} attempts; the caller got \
             {outcome:?}"
        );
    }

    #[test]
    fn a_deadlocked_versioned_write_in_an_outermost_with_lock_is_retried_whole() {
        // The owner of the outermost transaction is lockkit's `with_lock`, inside
        // the README's `retry`; a nested `retry` sells item 2 with
        // `update_versioned`, whose UPDATE is a deadlock's victim on the first
        // run. The nested retry must not run it in autocommit, and the outer one
        // must take the abort up (the deadlock, retryable) and run the whole
        // transaction again: one order line, one unit sold, and `Ok`.
        assert_retried_whole("with_lock_retry_versioned_deadlock", |conn, cue, runs| {
            retry(&RetryPolicy::default(), |_| {
                lockkit::with_lock(conn, 1, LockOptions::default(), |conn, _one: Item| {
                    *runs += 1;
                    record_and_sell(conn, *runs, cue)
                })
            })
        });
    }

    #[test]
    fn work_whose_transaction_ended_without_a_failed_statement_is_not_run_again() {
        // The work sells one unit, then the transaction ends under it with no
        // statement failing (here a statement that commits implicitly; on a
        // Galera node, an abort for another node's write that the server did
        // not report, as the cluster's tests caught), and it sells another:
        // that sale committed on its own. Another connection of the process
        // opens a stand-in meanwhile, so lockkit asks the server before COMMIT
        // and finds no transaction open. A rerun would sell twice more for
        // one order; the caller must get an error that is not retried.
        let db = TestDb::<MysqlConnection>::new("ended_without_a_failed_statement");
        seed_items(&mut db.conn(), &[(1, 10)]);
        let (mut conn, mut other) = (db.connect(), db.connect());
        let sell = |conn: &mut MysqlConnection| {
            diesel::update(items::table.find(1))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)
        };
        let mut attempts = 0u32;
        let outcome =
            lockkit::transaction_with_retry(&mut conn, &RetryPolicy::immediate(3), |conn| {
                attempts += 1;
                sell(conn)?;
                exec(
                    conn,
                    "CREATE TABLE IF NOT EXISTS committed_implicitly (id INT)",
                );
                sell(conn)?;
                lockkit_tests::aborts::open_a_stand_in(&mut other);
                Ok::<_, Error>(())
            });
        let stock = stock_of!(&mut db.connect());
        lockkit_tests::aborts::assert_not_run_again(attempts, &outcome, stock);
    }
}

mod if_match {
    use lockkit::etag::{self, ETag, Expected};

    #[test]
    fn if_match_compares_entity_tags_strongly_character_by_character() {
        // lockkit::etag: "parses If-Match per RFC 9110"; RFC 9110 §8.8.3.2: two
        // entity tags are strongly equal when both are not weak and their
        // opaque-tags match character-by-character. The server only ever sends
        // `"v7"`; `"v07"`, `"v007"` and `"v-0"` are tags it never issued.
        assert_eq!(ETag::from_version(7_i32).to_string(), "\"v7\"");
        let mut accepted = Vec::new();
        for header in ["\"v07\"", "\"v007\"", "\"v-0\"", "\"v-00\""] {
            match etag::expected_version::<i32>(Some(header)) {
                Err(_) => {}
                Ok(expected) => accepted.push(format!("{header} -> {expected:?}")),
            }
        }
        assert!(
            accepted.is_empty(),
            "tags the server never sent were taken for its own: {accepted:?}"
        );
        // The tags it did send still match.
        assert_eq!(
            etag::expected_version::<i32>(Some("\"v0\"")),
            Ok(Expected::Version(0))
        );
    }
}
