//! `lockkit::classify` against each real server: every lock error is provoked
//! for real and must arrive as its typed variant.

use std::sync::Barrier;
use std::thread;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use lockkit::{classify, classify_nowait, Error};
use lockkit_tests::db::TestBackend;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use lockkit_tests::models::Item;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use lockkit_tests::schema::items;
use lockkit_tests::{seed_items, TestDb};

/// Runs `blocked` on the calling thread while another connection holds an
/// uncommitted write lock on items row 1.
fn while_row_locked<C: TestBackend, T>(db: &TestDb<C>, blocked: impl FnOnce() -> T) -> T {
    db.while_holding(
        |conn, wait| {
            conn.transaction(|conn| {
                conn.batch_execute("UPDATE items SET stock = stock WHERE id = 1")?;
                wait();
                diesel::QueryResult::Ok(())
            })
            .unwrap();
        },
        blocked,
    )
}

/// Seeds items row 1 and, while another connection holds its write lock, runs
/// `setting` (a timeout) and an `UPDATE` of the row in one transaction: the
/// error the wait ended in.
fn update_while_locked<C: TestBackend>(db: &TestDb<C>, setting: &str) -> diesel::result::Error {
    seed_items(&mut db.connect(), &[(1, 10)]);
    while_row_locked(db, || {
        db.connect()
            .transaction(|conn| {
                conn.batch_execute(setting)?;
                conn.batch_execute("UPDATE items SET stock = 0 WHERE id = 1")
            })
            .unwrap_err()
    })
}

/// [`update_while_locked`] with the lock wait timeout `setting`: the wait must
/// end in `LockTimeout`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn assert_lock_timeout<C: TestBackend>(db: &TestDb<C>, setting: &str) {
    assert!(matches!(
        classify(update_while_locked(db, setting)),
        Error::LockTimeout
    ));
}

/// Two transactions lock rows 1 and 2 in opposite order: exactly one of them
/// must fail, with `Deadlock`, and the other succeed.
fn assert_one_deadlock<C: TestBackend>(db: &TestDb<C>) {
    seed_items(&mut db.connect(), &[(1, 10), (2, 10)]);
    let barrier = Barrier::new(2);
    let outcomes: Vec<_> = thread::scope(|s| {
        let runs: Vec<_> = [(1, 2), (2, 1)]
            .into_iter()
            .map(|(first, second)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut conn = db.connect();
                    conn.transaction(|conn| {
                        conn.batch_execute(&format!(
                            "UPDATE items SET stock = stock - 1 WHERE id = {first}"
                        ))?;
                        barrier.wait();
                        conn.batch_execute(&format!(
                            "UPDATE items SET stock = stock - 1 WHERE id = {second}"
                        ))
                    })
                    .map_err(classify)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let deadlocks = outcomes
        .iter()
        .filter(|o| matches!(o, Err(Error::Deadlock)))
        .count();
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!((deadlocks, ok), (1, 1), "{outcomes:?}");
    assert!(Error::Deadlock.is_retryable());
}

/// Reads items row 1 `FOR UPDATE NOWAIT` in a transaction on `conn` (Diesel's
/// `.for_update().no_wait()`: PostgreSQL and MySQL/MariaDB, SQLite has no row
/// locks) while another connection holds it: the error the read ends in.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn nowait_read<C>(conn: &mut C) -> diesel::result::Error
where
    C: Connection,
    for<'a> NowaitRead: diesel::query_dsl::LoadQuery<'a, C, Item>,
{
    conn.transaction(|conn| {
        items::table
            .find(1)
            .for_update()
            .no_wait()
            .first::<Item>(conn)
    })
    .unwrap_err()
}

/// The query of [`nowait_read`].
#[cfg(any(feature = "postgres", feature = "mysql"))]
type NowaitRead = diesel::dsl::Limit<
    diesel::dsl::NoWait<diesel::dsl::ForUpdate<diesel::dsl::Find<items::table, i32>>>,
>;

#[test]
fn not_found_is_not_found() {
    assert!(matches!(
        classify(diesel::result::Error::NotFound),
        Error::NotFound
    ));
}

#[test]
fn messages_are_read_for_every_kind_but_constraint_violations() {
    use diesel::result::DatabaseErrorKind as Kind;
    let error = |kind, message: &str| {
        diesel::result::Error::DatabaseError(kind, Box::new(message.to_owned()))
    };
    // Diesel's PostgreSQL connection reports a failed send with libpq's text.
    let lost = error(
        Kind::UnableToSendCommand,
        "server closed the connection unexpectedly",
    );
    assert!(matches!(classify(lost), Error::ConnectionLost));
    // diesel-async's drivers word a closed connection their own way, without
    // a code (seen on a killed session: `async_lock_errors.rs`).
    for (kind, message) in [
        (Kind::UnableToSendCommand, "connection closed"),
        (
            Kind::UnableToSendCommand,
            "error communicating with the server: Connection reset by peer (os error 104)",
        ),
        (
            Kind::Unknown,
            "Input/output error: Input/output error: Broken pipe (os error 32)",
        ),
        (
            Kind::Unknown,
            "Driver error: `Connection to the server is closed.'",
        ),
    ] {
        let err = classify(error(kind, message));
        assert!(matches!(err, Error::ConnectionLost), "{message}: {err:?}");
    }
    // A constraint violation's message may hold user data: never read.
    for kind in [
        Kind::UniqueViolation,
        Kind::ForeignKeyViolation,
        Kind::NotNullViolation,
        Kind::CheckViolation,
        Kind::RestrictViolation,
        Kind::ExclusionViolation,
    ] {
        let err = classify(error(kind, "deadlock detected"));
        assert!(matches!(err, Error::Database(_)), "{kind:?}: {err:?}");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use diesel::PgConnection;

    type Db = TestDb<PgConnection>;

    #[test]
    fn deadlock_40p01() {
        assert_one_deadlock(&Db::new("pg_deadlock"));
    }

    #[test]
    fn nowait_55p03_is_busy() {
        let db = Db::new("pg_nowait");
        seed_items(&mut db.connect(), &[(1, 10)]);
        let err = while_row_locked(&db, || nowait_read(&mut db.connect()));
        assert!(err.to_string().contains("could not obtain lock"), "{err}");
        assert!(matches!(classify(clone_error(&err)), Error::Busy));
        assert!(matches!(classify_nowait(err), Error::Busy));
    }

    #[test]
    fn lock_timeout_55p03_is_lock_timeout() {
        assert_lock_timeout(
            &Db::new("pg_lock_timeout"),
            "SET LOCAL lock_timeout = '100ms'",
        );
    }

    #[test]
    fn statement_timeout_57014_is_statement_timeout() {
        let db = Db::new("pg_statement_timeout");
        let err = update_while_locked(&db, "SET LOCAL statement_timeout = '100ms'");
        let err = classify(err);
        assert!(matches!(err, Error::StatementTimeout), "{err:?}");
        assert!(!err.is_retryable());
    }

    #[test]
    fn serialization_failure_40001() {
        let db = Db::new("pg_serialization");
        seed_items(&mut db.connect(), &[(1, 10)]);
        let mut a = db.connect();
        let err = a
            .build_transaction()
            .serializable()
            .run(|a| {
                let _ = items::table.find(1).first::<Item>(a)?;
                db.connect()
                    .batch_execute("UPDATE items SET stock = 5 WHERE id = 1")?;
                a.batch_execute("UPDATE items SET stock = 0 WHERE id = 1")
            })
            .unwrap_err();
        assert!(matches!(classify(err), Error::SerializationFailure));
    }

    #[test]
    fn other_errors_stay_database_errors() {
        let db = Db::new("pg_other");
        seed_items(&mut db.connect(), &[(1, 10)]);
        // A duplicate key whose value spells "deadlock" must not be read as one.
        let err = db
            .connect()
            .batch_execute("INSERT INTO items (id, name, stock) VALUES (1, 'deadlock detected', 0)")
            .unwrap_err();
        assert!(matches!(classify(err), Error::Database(_)));
    }

    fn clone_error(err: &diesel::result::Error) -> diesel::result::Error {
        match err {
            diesel::result::Error::DatabaseError(kind, info) => {
                diesel::result::Error::DatabaseError(*kind, Box::new(info.message().to_owned()))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use diesel::MysqlConnection;
    use lockkit_tests::settings::is_mariadb;

    type Db = TestDb<MysqlConnection>;

    #[test]
    fn deadlock_1213() {
        assert_one_deadlock(&Db::new("my_deadlock"));
    }

    #[test]
    fn lock_wait_timeout_1205() {
        assert_lock_timeout(
            &Db::new("my_lock_wait"),
            "SET SESSION innodb_lock_wait_timeout = 1",
        );
    }

    #[test]
    fn nowait_is_busy_mariadb_reports_it_as_1205() {
        let db = Db::new("my_nowait");
        seed_items(&mut db.connect(), &[(1, 10)]);
        let mariadb = is_mariadb(&mut db.connect(), "mysql");
        let (plain, nowait) = while_row_locked(&db, || {
            let mut conn = db.connect();
            (
                classify(nowait_read(&mut conn)),
                classify_nowait(nowait_read(&mut conn)),
            )
        });
        assert!(matches!(nowait, Error::Busy), "{nowait:?}");
        if mariadb {
            // MariaDB's NOWAIT error is 1205, indistinguishable from a lock wait timeout.
            assert!(matches!(plain, Error::LockTimeout), "{plain:?}");
        } else {
            assert!(matches!(plain, Error::Busy), "{plain:?}");
        }
    }

    #[test]
    fn statement_timeout_is_statement_timeout() {
        let db = Db::new("my_statement_timeout");
        seed_items(&mut db.connect(), &[(1, 10)]);
        let mut conn = db.connect();
        let setting = if is_mariadb(&mut conn, "mysql") {
            "SET SESSION max_statement_time = 0.2"
        } else {
            "SET SESSION max_execution_time = 200"
        };
        conn.batch_execute(setting).unwrap();
        let err = while_row_locked(&db, || {
            conn.transaction(|conn| items::table.find(1).for_update().first::<Item>(conn))
                .unwrap_err()
        });
        assert!(matches!(classify(err), Error::StatementTimeout));
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use diesel::SqliteConnection;

    #[test]
    fn database_is_locked_is_busy() {
        let db = TestDb::<SqliteConnection>::new("sqlite_busy");
        seed_items(&mut db.connect(), &[(1, 10)]);
        let err = db.while_holding(
            |conn, wait| {
                conn.immediate_transaction(|conn| {
                    conn.batch_execute("UPDATE items SET stock = 1 WHERE id = 1")?;
                    wait();
                    diesel::QueryResult::Ok(())
                })
                .unwrap();
            },
            || {
                let mut conn = db.connect();
                conn.batch_execute("PRAGMA busy_timeout = 0").unwrap();
                conn.batch_execute("UPDATE items SET stock = 2 WHERE id = 1")
                    .unwrap_err()
            },
        );
        assert!(matches!(classify(err), Error::Busy));
    }
}
