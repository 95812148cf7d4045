//! What optimistic locking needs to know about each backend: which schema a
//! table whose `table!` names none is in, whether a table's declared key is
//! unique in the database, and how to read the latest committed version after
//! a stale write.
//!
//! | | PostgreSQL | MySQL / MariaDB | SQLite |
//! | --- | --- | --- | --- |
//! | schema of a `table!` without one (once per connection and table, at its first versioned write, with the key check) | `pg_class` of `to_regclass(quote_ident(table))`: where the `search_path` finds it | the connection's database | `main` |
//! | key unique? (once per connection and table, at its first versioned write) | `pg_index`: a unique index, without predicate or expressions, on key columns only | `information_schema.STATISTICS`: a unique index on key columns only | `pragma_index_list` / `pragma_index_info`, or the `INTEGER PRIMARY KEY` (rowid) |
//! | mark of a write in a transaction on a connection lockkit cannot watch (a `Mark`), and whether it stands | the session setting `lockkit.marks` (`set_config(.., false)`: undone by a rollback, kept by a commit) | a row of the temporary table `lockkit_marks` (InnoDB: transactional) | a row of the temporary table `temp.lockkit_marks` |
//! | latest version after a stale write | plain `SELECT` (READ COMMITTED sees it; REPEATABLE READ fails the write itself) | `SELECT .. LOCK IN SHARE MODE`: a locking read sees the latest commit even under REPEATABLE READ | plain `SELECT` (one writer at a time) |
//!
//! A key the catalog cannot prove unique (no constraint, a view, a table in
//! another schema) is not an error: lockkit then runs each versioned write in a
//! savepoint and undoes it if it matched more than one row
//! ([`Error::AmbiguousKey`](crate::Error::AmbiguousKey)).

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::query_builder::{BoxedSqlQuery, QueryId, SqlQuery};
use diesel::query_dsl::methods::LockingDsl;
use diesel::{Connection, QueryResult};

use crate::optimistic::mark::Mark;
use crate::transaction::journal;

/// A backend lockkit's versioned writes run on: PostgreSQL, MySQL/MariaDB, SQLite.
///
/// Sealed: implemented by lockkit for each backend feature; name it only in
/// `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's versioned writes do not support the `{Self}` backend",
    label = "not a backend lockkit supports",
    note = "lockkit supports PostgreSQL, MySQL/MariaDB and SQLite (features `postgres`, `mysql`, `sqlite`)"
)]
pub trait OptimisticBackend: Backend + crate::sealed::Sealed {
    /// The query, as a read that sees the latest committed row.
    type Latest<Q: LockingDsl<InShareMode>>;

    /// Makes `query` a read of the latest committed row.
    fn latest<Q: LockingDsl<InShareMode>>(query: Q) -> Self::Latest<Q>;

    /// The statement behind [`database_id`](Self::database_id): one row, text
    /// columns `id`, `server`, `schema` and `attached`. Run by blocking and
    /// async connections alike.
    #[doc(hidden)]
    const DATABASE_ID: &'static str;

    /// Names the database this connection writes to (`id`: on PostgreSQL the
    /// database, on SQLite the file), the server as the connection reached it
    /// (`server`) and the schema its unqualified tables are in (`schema`: on
    /// PostgreSQL the first in its `search_path`, where
    /// [`table_schema_query`](Self::table_schema_query) does not find the
    /// table; on MySQL/MariaDB the database), so that rows of two databases
    /// with the same table and key are told apart. Read once per connection: a
    /// connection that later switches its `search_path` (or, on MySQL, its
    /// database with `USE`) keeps the first name.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn database_id<C>(conn: &mut C) -> QueryResult<DatabaseId>
    where
        C: Connection<Backend = Self> + LoadConnection,
        SqlQuery: for<'q> diesel::query_dsl::LoadQuery<'q, C, DatabaseId>,
    {
        use diesel::RunQueryDsl;
        journal::own(conn, |conn| {
            diesel::sql_query(Self::DATABASE_ID).get_result::<DatabaseId>(conn)
        })
    }

    /// The statement that names the schema where the connection finds the
    /// table `table` written without one, where its search path decides that
    /// table by table (PostgreSQL): one row, text column `schema`, NULL when
    /// it finds no such table. `None` where every such table is in the
    /// connection's schema ([`DatabaseId::schema`]: MySQL/MariaDB's database,
    /// SQLite's `main`). A journaled connection has the answer from its key
    /// check ([`Unique::schema`]); this asks it where nothing keeps that (a
    /// connection with instrumentation of its own that lockkit cannot watch).
    /// Built here once for blocking and async connections.
    #[doc(hidden)]
    fn table_schema_query(table: &str) -> Option<BoxedSqlQuery<'static, Self, SqlQuery>> {
        let _ = table;
        None
    }

    /// Runs [`table_schema_query`](Self::table_schema_query): the schema where
    /// the connection finds `table` (empty where no search decides it: the
    /// connection's), or `None` where it finds no such table.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn table_schema<C>(conn: &mut C, table: &str) -> QueryResult<Option<String>>
    where
        C: Connection<Backend = Self> + LoadConnection,
        BoxedSqlQuery<'static, Self, SqlQuery>:
            for<'q> diesel::query_dsl::LoadQuery<'q, C, TableSchema>,
    {
        use diesel::RunQueryDsl;
        match Self::table_schema_query(table) {
            Some(query) => journal::own(conn, |conn| query.get_result::<TableSchema>(conn))
                .map(|row| row.schema),
            None => Ok(Some(String::new())),
        }
    }

    /// The catalog query behind [`key_is_unique`](Self::key_is_unique), with its
    /// values bound: one row, a `BIGINT` column `unique_key`, non-zero when a
    /// unique index that holds every row (not partial, no expression part)
    /// covers only (some of) `key_columns` of `table` in `schema`
    /// (`None`: the one the connection finds, through its `search_path` or in
    /// its database), and a text column `schema`, the schema the connection
    /// finds the table in, as [`table_schema_query`](Self::table_schema_query)
    /// answers it (NULL when it finds no such table; empty where that is
    /// `None`). Built here once for every connection that runs it, blocking or
    /// async.
    fn key_is_unique_query(
        schema: Option<&str>,
        table: &str,
        key_columns: &[&str],
    ) -> BoxedSqlQuery<'static, Self, SqlQuery>;

    /// Whether a unique index covers only (some of) `key_columns` of `table`, so
    /// that the key can never match two rows, and where the connection finds
    /// the table: [`key_is_unique_query`](Self::key_is_unique_query)'s row.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    fn key_is_unique<C>(
        conn: &mut C,
        schema: Option<&str>,
        table: &str,
        key_columns: &[&str],
    ) -> QueryResult<Unique>
    where
        C: Connection<Backend = Self> + LoadConnection,
        BoxedSqlQuery<'static, Self, SqlQuery>: for<'q> diesel::query_dsl::LoadQuery<'q, C, Unique>,
    {
        use diesel::RunQueryDsl;
        journal::own(conn, |conn| {
            Self::key_is_unique_query(schema, table, key_columns).get_result::<Unique>(conn)
        })
    }

    /// Creates what a connection keeps its [`Mark`]s in, where that is a
    /// temporary table (MySQL/MariaDB, SQLite); `None` where it needs no
    /// creating (PostgreSQL: a setting of the session). Sent when a mark's
    /// statement failed, before it is sent once more.
    #[doc(hidden)]
    const MARKS: Option<&'static str>;

    /// Fails where the connection has no table of [`MARKS`](Self::MARKS) yet:
    /// asked when a mark's statement failed, whose error (worded in the
    /// server's language) may be another one (a deadlock, a trigger's
    /// `RAISE(ROLLBACK)`), to be the write's. A read, harmless in autocommit.
    #[doc(hidden)]
    const MARKS_PRESENT: Option<&'static str>;

    /// The statement that marks a write lockkit made in a transaction on a
    /// connection it cannot watch ([`Mark`]), in that transaction: the mark
    /// stands exactly as long as the write does (a rollback of the
    /// transaction or of the savepoint takes both; a commit keeps both), and
    /// the connection keeps its latest [`Mark::KEPT`]. Built here once for
    /// blocking and async connections.
    #[doc(hidden)]
    fn mark_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery>;

    /// The statement that asks whether the mark `mark` stands on the
    /// connection: one row, a `BIGINT` column `stands`, non-zero when it does.
    #[doc(hidden)]
    fn mark_stands_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery>;

    /// Sends [`mark_query`](Self::mark_query), creating the
    /// [`MARKS`](Self::MARKS) table first if it failed for want of it. Any
    /// other failure is the write's: the mark's statement may have ended the
    /// transaction (a deadlock, a trigger's `RAISE(ROLLBACK)`), and sent again
    /// it would commit on its own, standing for a write that was rolled back.
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    #[doc(hidden)]
    fn marks_missing<C>(conn: &mut C) -> bool
    where
        C: Connection<Backend = Self>,
    {
        Self::MARKS_PRESENT.is_some_and(|probe| conn.batch_execute(probe).is_err())
    }

    /// Sends [`mark_query`](Self::mark_query), creating the table first:
    /// see [`mark`](Self::mark).
    #[doc(hidden)]
    fn mark<C>(conn: &mut C, mark: Mark) -> QueryResult<()>
    where
        C: Connection<Backend = Self>,
        BoxedSqlQuery<'static, Self, SqlQuery>: diesel::query_dsl::methods::ExecuteDsl<C>,
    {
        use diesel::RunQueryDsl;
        match (Self::mark_query(mark).execute(conn), Self::MARKS) {
            (Err(_), Some(create)) if Self::marks_missing(conn) => {
                conn.batch_execute(create)?;
                Self::mark_query(mark).execute(conn).map(drop)
            }
            (sent, _) => sent.map(drop),
        }
    }

    /// Runs [`mark_stands_query`](Self::mark_stands_query), creating the
    /// [`MARKS`](Self::MARKS) table first if it failed for want of it (a mark
    /// in no table does not stand).
    ///
    /// # Errors
    ///
    /// Diesel's error, unclassified (lockkit's callers classify it).
    #[doc(hidden)]
    fn mark_stands<C>(conn: &mut C, mark: Mark) -> QueryResult<bool>
    where
        C: Connection<Backend = Self> + LoadConnection,
        BoxedSqlQuery<'static, Self, SqlQuery>: for<'q> diesel::query_dsl::LoadQuery<'q, C, Stands>,
    {
        use diesel::RunQueryDsl;
        let ask = |conn: &mut C| {
            journal::own(conn, |conn| {
                Self::mark_stands_query(mark).get_result::<Stands>(conn)
            })
            .map(|row| row.stands != 0)
        };
        match (ask(conn), Self::MARKS) {
            (Err(_), Some(create)) if Self::marks_missing(conn) => {
                conn.batch_execute(create)?;
                ask(conn)
            }
            (asked, _) => asked,
        }
    }
}

/// A statement on a table of marks (MySQL/MariaDB's, SQLite's), with its two
/// parameters: the [`Mark`]'s slot, then its token.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn slot_and_token<DB>(sql: &'static str, mark: Mark) -> BoxedSqlQuery<'static, DB, SqlQuery>
where
    DB: Backend
        + diesel::sql_types::HasSqlType<diesel::sql_types::Integer>
        + diesel::sql_types::HasSqlType<diesel::sql_types::BigInt>,
    i32: diesel::serialize::ToSql<diesel::sql_types::Integer, DB>,
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, DB>,
{
    diesel::sql_query(sql)
        .into_boxed()
        .bind::<diesel::sql_types::Integer, _>(mark.slot as i32)
        .bind::<diesel::sql_types::BigInt, _>(mark.token())
}

/// `LOCK IN SHARE MODE` (MySQL/MariaDB): the clause of the latest-version read.
#[derive(Debug, Clone, Copy, Default, QueryId)]
pub struct InShareMode;

/// The row of [`OptimisticBackend::DATABASE_ID`].
#[doc(hidden)]
#[derive(Debug, diesel::QueryableByName)]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub struct DatabaseId {
    /// On PostgreSQL the database; on SQLite the file (empty: in memory);
    /// empty on MySQL/MariaDB, whose database is the schema.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub id: String,
    /// The server as the connection reached it: its address (none over a Unix
    /// socket) and port (PostgreSQL), its host name and port (MySQL/MariaDB);
    /// empty on SQLite. One server reached by two paths (a Unix socket and
    /// TCP) or a cluster's two nodes give two names, so the journal never
    /// takes it for the whole identity; and two servers that give the same
    /// name (two hosts with one host name and port) are one to it.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub server: String,
    /// The schema of the connection's unqualified tables (on MySQL/MariaDB its
    /// database; on SQLite `main`); empty when there is none.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub schema: String,
    /// SQLite: the databases attached with a file, as `name`, U+001F, `file`,
    /// each ended by U+001E (a table in one is named by its file, whatever
    /// the name it is attached under); empty elsewhere.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub attached: String,
}

/// The row of [`OptimisticBackend::table_schema_query`].
#[doc(hidden)]
#[derive(Debug, diesel::QueryableByName)]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub struct TableSchema {
    /// The schema, unquoted; `None` when the connection finds no such table.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub schema: Option<String>,
}

/// The row of [`OptimisticBackend::key_is_unique_query`].
#[doc(hidden)]
#[derive(Debug, diesel::QueryableByName)]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub struct Unique {
    /// Non-zero when the key is unique.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub unique_key: i64,
    /// The schema the connection finds the table in, unquoted, where its
    /// search path decides it table by table (PostgreSQL; `None` when it finds
    /// no such table, as a table not created yet); empty where the
    /// connection's schema is every such table's (MySQL/MariaDB, SQLite). What
    /// [`table_schema_query`](OptimisticBackend::table_schema_query) answers,
    /// asked with the key so that a connection asks the catalog about a table
    /// once.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub schema: Option<String>,
}

/// The row of [`OptimisticBackend::mark_stands_query`].
#[doc(hidden)]
#[derive(Debug, diesel::QueryableByName)]
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]
pub struct Stands {
    /// Non-zero when the mark stands.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub stands: i64,
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use diesel::pg::Pg;
    use diesel::sql_types::{Array, BigInt, Nullable, Text};

    impl OptimisticBackend for Pg {
        type Latest<Q: LockingDsl<InShareMode>> = Q;

        fn latest<Q: LockingDsl<InShareMode>>(query: Q) -> Q {
            query
        }

        // The schema too: with a schema per tenant (the connection's
        // `search_path` choosing it), tenants' tables share names and keys.
        const DATABASE_ID: &'static str = "SELECT current_database() AS id, \
                    concat_ws(':', inet_server_addr(), current_setting('port')) AS server, \
                    COALESCE(current_schema(), '') AS schema, '' AS attached";

        // The table's own schema, as `to_regclass` finds it through the
        // search path: a `public` table that tenants' connections reach
        // through `search_path tenant_n, public` is one table to all of them.
        fn table_schema_query(table: &str) -> Option<BoxedSqlQuery<'static, Self, SqlQuery>> {
            Some(
                diesel::sql_query(
                    "SELECT (SELECT n.nspname::text FROM pg_class c \
                              JOIN pg_namespace n ON n.oid = c.relnamespace \
                             WHERE c.oid = to_regclass(quote_ident($1))) AS schema",
                )
                .into_boxed()
                .bind::<Text, _>(table.to_owned()),
            )
        }

        // A setting of the session, `,1,5,`: set in a transaction, it is
        // undone by the rollback of the transaction or of the savepoint, and
        // kept by a commit, as a row would be.
        const MARKS: Option<&'static str> = None;
        const MARKS_PRESENT: Option<&'static str> = None;

        // The latest `KEPT` marks, in the order they were made.
        fn mark_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            diesel::sql_query(
                "SELECT set_config('lockkit.marks', ( \
                        SELECT ',' || string_agg(m::text, ',' ORDER BY i) || ',' FROM ( \
                          SELECT m, i FROM unnest(string_to_array(trim(BOTH ',' FROM \
                                   COALESCE(current_setting('lockkit.marks', true), '')), ',')::int8[] \
                                   || $1::int8) WITH ORDINALITY AS t(m, i) \
                           ORDER BY i DESC LIMIT $2) AS latest), false)",
            )
            .into_boxed()
            .bind::<BigInt, _>(mark.token())
            .bind::<BigInt, _>(i64::from(Mark::KEPT))
        }

        fn mark_stands_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            diesel::sql_query(
                "SELECT (strpos(COALESCE(current_setting('lockkit.marks', true), ''), \
                        ',' || $1::text || ',') > 0)::int::int8 AS stands",
            )
            .into_boxed()
            .bind::<BigInt, _>(mark.token())
        }

        fn key_is_unique_query(
            schema: Option<&str>,
            table: &str,
            key_columns: &[&str],
        ) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            // The table as the connection finds it, once: its unique
            // indexes, and the schema it is in (`table_schema_query`'s). An
            // index counts if it is valid and checked at each statement (not
            // deferrable); none does for a table that other tables inherit
            // from (`INHERITS`): its `UPDATE` writes their rows too, which its
            // indexes do not cover. (A partitioned table's key covers its
            // partitions.)
            diesel::sql_query(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_class c \
                          WHERE c.oid = t.oid AND c.relkind = 'r' AND c.relhassubclass) THEN 0 \
                        ELSE (SELECT COUNT(*) FROM pg_index i \
                          WHERE i.indrelid = t.oid \
                            AND i.indisunique AND i.indisvalid AND i.indimmediate \
                            AND i.indpred IS NULL AND i.indexprs IS NULL \
                            AND NOT EXISTS (SELECT 1 FROM unnest(i.indkey) AS k(attnum) \
                                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                                 WHERE a.attname::text <> ALL ($3))) END AS unique_key, \
                        (SELECT n.nspname::text FROM pg_class c \
                           JOIN pg_namespace n ON n.oid = c.relnamespace \
                          WHERE c.oid = t.oid) AS schema \
                   FROM (SELECT to_regclass(COALESCE(quote_ident($1) || '.', '') || quote_ident($2)) AS oid) AS t",
            )
            .into_boxed()
            .bind::<Nullable<Text>, _>(schema.map(str::to_owned))
            .bind::<Text, _>(table.to_owned())
            .bind::<Array<Text>, _>(
                key_columns
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>(),
            )
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use diesel::mysql::Mysql;
    use diesel::query_builder::{AstPass, QueryFragment};
    use diesel::sql_types::{Nullable, Text};

    impl QueryFragment<Mysql> for InShareMode {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> QueryResult<()> {
            out.push_sql(" LOCK IN SHARE MODE");
            Ok(())
        }
    }

    impl OptimisticBackend for Mysql {
        type Latest<Q: LockingDsl<InShareMode>> = Q::Output;

        fn latest<Q: LockingDsl<InShareMode>>(query: Q) -> Q::Output {
            query.with_lock(InShareMode)
        }

        const DATABASE_ID: &'static str =
            "SELECT '' AS id, CONCAT_WS(':', @@hostname, @@port) AS server, \
                    COALESCE(DATABASE(), '') AS `schema`, '' AS attached";

        // InnoDB, whatever the server's default: its temporary tables are
        // transactional, savepoints included. Created outside any
        // transaction's reach (no implicit commit, kept by a rollback).
        const MARKS: Option<&'static str> = Some(
            "CREATE TEMPORARY TABLE IF NOT EXISTS lockkit_marks (slot INT PRIMARY KEY, mark BIGINT NOT NULL) ENGINE=InnoDB",
        );
        const MARKS_PRESENT: Option<&'static str> = Some("SELECT 1 FROM lockkit_marks LIMIT 0");

        fn mark_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            slot_and_token(
                "REPLACE INTO lockkit_marks (slot, mark) VALUES (?, ?)",
                mark,
            )
        }

        fn mark_stands_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            slot_and_token(
                "SELECT CAST(EXISTS (SELECT 1 FROM lockkit_marks WHERE slot = ? AND mark = ?) AS SIGNED) AS stands",
                mark,
            )
        }

        // A part that is an expression (MySQL 8.0.13 and later; its
        // `COLUMN_NAME` is NULL) is not a key column: it may read a column
        // outside the key, or be NULL for some rows, which the index then
        // leaves alone as a partial index would. Such an index does not count.
        fn key_is_unique_query(
            schema: Option<&str>,
            table: &str,
            key_columns: &[&str],
        ) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            diesel::sql_query(
                "SELECT CAST(COUNT(*) AS SIGNED) AS unique_key, '' AS `schema` FROM ( \
                   SELECT INDEX_NAME FROM information_schema.STATISTICS \
                    WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
                      AND NON_UNIQUE = 0 \
                    GROUP BY INDEX_NAME \
                   HAVING SUM(COLUMN_NAME IS NULL OR FIND_IN_SET(COLUMN_NAME, ?) = 0) = 0) AS unique_indexes",
            )
            .into_boxed()
            .bind::<Nullable<Text>, _>(schema.map(str::to_owned))
            .bind::<Text, _>(table.to_owned())
            .bind::<Text, _>(key_columns.join(","))
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use diesel::sql_types::{Nullable, Text};
    use diesel::sqlite::Sqlite;

    impl OptimisticBackend for Sqlite {
        type Latest<Q: LockingDsl<InShareMode>> = Q;

        fn latest<Q: LockingDsl<InShareMode>>(query: Q) -> Q {
            query
        }

        const DATABASE_ID: &'static str =
            "SELECT COALESCE((SELECT file FROM pragma_database_list WHERE name = 'main'), '') AS id, \
                    '' AS server, 'main' AS schema, \
                    COALESCE((SELECT group_concat(name || char(31) || file || char(30), '') \
                                FROM pragma_database_list \
                               WHERE name NOT IN ('main', 'temp') AND file <> ''), '') AS attached";

        // In the connection's own `temp` schema, whose tables a transaction's
        // or a savepoint's rollback restores like any other (the table
        // itself, when it was created there).
        const MARKS: Option<&'static str> =
            Some("CREATE TEMP TABLE IF NOT EXISTS lockkit_marks (slot INTEGER PRIMARY KEY, mark INTEGER NOT NULL)");
        const MARKS_PRESENT: Option<&'static str> =
            Some("SELECT 1 FROM temp.lockkit_marks LIMIT 0");

        fn mark_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            slot_and_token(
                "INSERT OR REPLACE INTO temp.lockkit_marks (slot, mark) VALUES (?, ?)",
                mark,
            )
        }

        fn mark_stands_query(mark: Mark) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            slot_and_token(
                "SELECT EXISTS (SELECT 1 FROM temp.lockkit_marks WHERE slot = ? AND mark = ?) AS stands",
                mark,
            )
        }

        // The pragmas' second argument is the schema (an `ATTACH`ed
        // database's name); NULL searches the schemas as an unqualified name does.
        fn key_is_unique_query(
            schema: Option<&str>,
            table: &str,
            key_columns: &[&str],
        ) -> BoxedSqlQuery<'static, Self, SqlQuery> {
            // `,a,b,` lists the key columns for an exact `instr` match.
            let columns = format!(",{},", key_columns.join(","));
            let schema = schema.map(str::to_owned);
            diesel::sql_query(
                "SELECT (EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) AS l \
                          WHERE l.\"unique\" = 1 AND l.partial = 0 \
                            AND NOT EXISTS (SELECT 1 FROM pragma_index_info(l.name, ?2) AS i \
                                 WHERE i.name IS NULL OR instr(?3, ',' || i.name || ',') = 0)) \
                      OR EXISTS (SELECT 1 FROM pragma_table_info(?1, ?2) AS c \
                          WHERE c.pk = 1 AND lower(c.type) = 'integer' \
                            AND instr(?3, ',' || c.name || ',') > 0 \
                            AND (SELECT COUNT(*) FROM pragma_table_info(?1, ?2) WHERE pk > 0) = 1)) AS unique_key, '' AS schema",
            )
            .into_boxed()
            .bind::<Text, _>(table.to_owned())
            .bind::<Nullable<Text>, _>(schema)
            .bind::<Text, _>(columns)
        }
    }
}
