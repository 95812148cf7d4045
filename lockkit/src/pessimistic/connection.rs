//! What differs between backends when taking locks: the lock clause, how a
//! locking transaction begins, and how its lock timeout is set.
//!
//! | | PostgreSQL | MySQL / MariaDB | SQLite |
//! | --- | --- | --- | --- |
//! | row lock | `FOR UPDATE` (and strengths) | `FOR UPDATE` / `LOCK IN SHARE MODE` | none: the transaction is `BEGIN IMMEDIATE`, which takes the database's write lock and so serializes writers |
//! | timeout | `SELECT set_config('lock_timeout', $1, true)` (= `SET LOCAL`) | `SET @lockkit_lock_wait_timeout_<depth> = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = ?` (whole seconds; the session's value kept on the server; prepared once per connection), put back from that variable afterwards | `PRAGMA busy_timeout = n; BEGIN IMMEDIATE` in one batch, restored afterwards |
//! | `NOWAIT` / `SKIP LOCKED` | in the clause | in the clause | busy timeout 0: a locked database is [`Error::Busy`] |
//! | wait ran out | [`Error::LockTimeout`] | [`Error::LockTimeout`] | [`Error::LockTimeout`] (busy while taking the write lock) |
//! | nested | savepoint; a timeout is put back before the savepoint is released (`SET LOCAL` outlives `RELEASE SAVEPOINT`) | savepoint | savepoint, then `PRAGMA incremental_vacuum(1)`, which takes the write lock a deferred outer transaction lacks |
//!
//! Options apply to the call that asked for them and to nothing after it, nested
//! or not. How a setting lockkit changes is put back: on PostgreSQL, at the top
//! level, `SET LOCAL` ends with the transaction, and a nested call reads the
//! value in its savepoint first (`current_setting('lock_timeout')`); on
//! MySQL/MariaDB the server keeps the session's value in a user variable of the
//! call's nesting depth (so nested calls keep theirs apart), and the top level
//! sets it before `BEGIN`; on SQLite the busy timeout is read first
//! (`PRAGMA busy_timeout`), and the new value set in one batch with the
//! statement that takes the write lock (as a statement of its own on
//! diesel-async). A panic in the closure rolls the transaction back before it
//! unwinds further, so the connection is never left inside a transaction.
//!
//! # When the server aborts the whole transaction
//!
//! A nested call runs in a savepoint. PostgreSQL rolls back to the savepoint after
//! any error, so retrying there is sound. InnoDB answers a deadlock by rolling back
//! the *whole* transaction, while Diesel still counts it as open; work retried in
//! it would run in autocommit and commit half an operation. So when a nested
//! lockkit transaction ([`locked_transaction`](crate::locked_transaction), behind
//! `with_lock`, and [`transaction_with_retry`](crate::transaction_with_retry)) fails, lockkit
//! asks the server whether its transaction is still open (MariaDB: `SELECT
//! @@in_transaction`; where that variable is missing, a deadlock or a lost
//! connection counts as the end) and, if not, returns
//! [`Error::TransactionAborted`], which is not retryable while that transaction is
//! open: it travels up to the code that opened the outermost transaction, and
//! nothing was committed; once that code has rolled back, the error is retryable
//! like its cause ([`Aborted::is_settled`](crate::Aborted::is_settled)). The lockkit
//! calls that open the outermost transaction themselves retry (or report) the
//! cause. The question costs one statement, on the error path of nested calls only.
//! The async connections (`lockkit::asynchronous`) ask and answer the same way.
//!
//! A single write of lockkit's inside a transaction (a versioned write,
//! [`atomic::update_if`](crate::atomic::update_if)) that is the deadlock's victim
//! (or a lock wait timeout's, under `innodb_rollback_on_timeout`) returns
//! `TransactionAborted` too, so that a `retry` around it does not run it again
//! in autocommit, and opens the stand-in below, whose first statement tells
//! whether the transaction really ended. When the outermost transaction is
//! lockkit's own and its work fails after such an abort, it confirms with the
//! server and returns the cause ([`Error::Deadlock`], or [`Error::LockTimeout`])
//! in the work's error type, whatever the work returned: a `retry` around
//! `with_lock` runs the whole transaction again. (Unless the work wrote after
//! letting a deadlock go: that write ran in autocommit and committed, and the
//! error is one no retry takes up, so that it is not made twice.)
//!
//! On PostgreSQL a failed statement aborts the transaction until a rollback to
//! a savepoint: every later statement fails ("current transaction is aborted",
//! 25P02), which no retry takes up. When the work of lockkit's outermost
//! transaction went on there after a retryable failure (a deadlock, a lock
//! timeout, a serialization failure; most often a `retry` inside the work ran
//! its statements again) and then failed, lockkit hands back that failure, in
//! the work's error type: a `retry` around the call runs the whole transaction
//! again. A work that returns at the failure keeps its own error.
//!
//! The journal counts every lock wait timeout in a transaction as one that may
//! have ended it (a server started with `--innodb-rollback-on-timeout` ends it),
//! so lockkit's next call in that transaction asks the server: one question per
//! timeout, on that error path only.
//!
//! On Galera, another node's write can abort a transaction while its client sits
//! between statements; the client learns it (a deadlock, 1213) at its next
//! statement, which may be lockkit's question itself. A question (or a probe)
//! that fails with a deadlock therefore means the transaction has ended.
//!
//! Code that catches that error and goes on would write in autocommit, each
//! statement committed on its own. So lockkit also opens a read-only transaction
//! in the aborted one's place, only while Diesel still counts the caller's as open:
//!
//! ```sql
//! SET TRANSACTION READ ONLY
//! START TRANSACTION
//! SAVEPOINT lockkit_aborted_<16 random hex digits>
//! SET @lockkit_aborted = 'lockkit_aborted_<the same digits>'
//! ```
//!
//! A later write fails with [`Error::ReadOnly`], and the caller's rollback ends
//! the stand-in. The question above reads the mark with the same statement
//! (`SELECT CAST(@@in_transaction AS SIGNED), CAST(@lockkit_aborted AS CHAR)`);
//! once a stand-in was opened in the session, an open transaction is probed with
//! `ROLLBACK TO SAVEPOINT <the mark>`, which succeeds only in the stand-in (so a
//! call further up still learns that its transaction ended), and a stale mark is
//! cleared (`SET @lockkit_aborted = NULL`). [`Lockable::lock`](crate::Lockable::lock),
//! which asks before it locks, opens the stand-in too.
//!
//! When the outermost transaction is lockkit's own (`transaction_with_retry`,
//! `with_lock`, ...) and its work catches that error and returns `Ok`, lockkit
//! does not commit the stand-in and report success for work the server threw
//! away: before `COMMIT` it asks the same question, rolls back, and returns the
//! cause ([`Error::Deadlock`], or [`Error::LockTimeout`]), which the retrying
//! calls run again. It asks only
//! when a stand-in was opened in the process while the work ran, so no other
//! transaction pays for it. What lockkit cannot undo is the choice of a caller
//! that owns the outermost transaction itself (Diesel's own `transaction`) to
//! catch the error and commit: the server has already thrown away what the
//! transaction wrote before. Let `TransactionAborted` travel.
//!
//! Timeouts come from a [`Duration`](std::time::Duration) and reach the server as a
//! bound parameter (PostgreSQL, MySQL) or a formatted integer (SQLite's `PRAGMA`
//! takes no parameters); no caller text is ever interpolated.

use diesel::query_dsl::methods::LockingDsl;

use super::options::LockOptions;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::error::classification::classify;
use crate::error::Error;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use crate::transaction::transaction_sql;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::transaction::Reach;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
use crate::transaction::{finish, Failure, PanicGuard};
use crate::transaction::{in_transaction, Control};

/// A connection lockkit can take row locks on: `PgConnection`, `MysqlConnection`
/// or `SqliteConnection`, or a `#[derive(diesel::MultiConnection)]` enum over
/// them that implements [`Dispatch`](crate::multi::Dispatch). Sealed: lockkit
/// implements it for these, and its methods are how each backend does what
/// [`locked_transaction`](crate::locked_transaction),
/// [`serializable`](crate::serializable) and the row locks need; call those.
#[diagnostic::on_unimplemented(
    message = "lockkit does not lock rows on `{Self}`",
    label = "not a connection lockkit supports",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), r2d2 pooled connections to them (feature `r2d2`), and `#[derive(diesel::MultiConnection)]` enums over them that implement `lockkit::multi::Dispatch`"
)]
pub trait LockingConnection: Control {
    /// The query with the row-lock clause `L` (a [`RowLock`](super::row_lock::RowLock) or a
    /// [`LockClause`](super::row_lock::LockClause) type; SQLite: the query unchanged).
    type Locked<Q: LockingDsl<L>, L>;

    /// Adds the row-lock clause to a query.
    fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L>;

    /// Runs `f` in a transaction fit for locking, with the options' timeout: the
    /// backend's half of [`locked_transaction`](crate::locked_transaction).
    ///
    /// # Errors
    ///
    /// As [`locked_transaction`](crate::locked_transaction).
    #[doc(hidden)]
    fn locked_transaction<T, E, F>(&mut self, options: &LockOptions, f: F) -> Result<T, E>
    where
        E: From<Error>,
        F: FnOnce(&mut Self) -> Result<T, E>;

    /// Runs `f` in a `SERIALIZABLE` transaction (SQLite: `BEGIN IMMEDIATE`, which
    /// is serializable), once: the backend's half of
    /// [`serializable`](crate::serializable).
    ///
    /// # Errors
    ///
    /// * [`Error::AlreadyInTransaction`] when a transaction is already open.
    /// * [`Error::SerializationFailure`], [`Error::Deadlock`] or another
    ///   classified database error, e.g. from `COMMIT`.
    /// * whatever `f` returns.
    #[doc(hidden)]
    fn serializable_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        E: From<Error>,
        F: FnOnce(&mut Self) -> Result<T, E>;

    /// Whether a transaction is open on this connection.
    fn in_transaction(&mut self) -> bool {
        in_transaction(self)
    }

    /// Makes sure the open transaction holds what row locks need. On SQLite, the
    /// database's write lock, which a deferred transaction (`conn.transaction`)
    /// takes only at its first write: sends `PRAGMA incremental_vacuum(1)`, which
    /// takes it (waiting up to the busy timeout, then [`Error::Busy`]) and changes
    /// no data. A no-op on PostgreSQL and MySQL, whose row locks need nothing more.
    ///
    /// The lock is the `main` database's. Connections whose `main` files differ
    /// and that share a table of an `ATTACH`ed database do not take turns this
    /// way: a transaction begun with `BEGIN IMMEDIATE`
    /// ([`locked_transaction`](crate::locked_transaction)) takes the lock of
    /// every database attached.
    ///
    /// # Errors
    ///
    /// SQLite: [`Error::Busy`] when another connection holds the write lock past
    /// the busy timeout, or another classified database error.
    fn take_write_lock(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

#[diagnostic::on_unimplemented(
    message = "lockkit cannot run its calls on `{Self}`",
    label = "not a connection lockkit supports",
    note = "pass a `PgConnection`, `MysqlConnection` or `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), an r2d2 pooled connection to one (feature `r2d2`; without it, pass `&mut *pooled`), or a `#[derive(diesel::MultiConnection)]` enum that implements `lockkit::multi::Dispatch`"
)]
/// Something that gives access to a [`LockingConnection`]: the connection itself
/// (or a [`Dispatch`](crate::multi::Dispatch) enum) or an r2d2 pooled connection
/// to it (feature `r2d2`). This is what lets `item.with_lock(&mut conn, ..)`
/// take either; the closure receives the underlying connection. The atomic
/// writes ([`atomic::update_if`](crate::atomic::update_if), ..) ask it which
/// backend runs their statement: the backend inside an enum, whose own
/// backend type names none.
pub trait AsLockingConnection {
    /// The underlying connection.
    type Conn: LockingConnection;
    /// Borrows it.
    fn locking_connection(&mut self) -> &mut Self::Conn;
}

#[allow(unused_macros)] // used once per enabled backend
macro_rules! as_locking_connection {
    ($($conn:ty),*) => {$(
        impl AsLockingConnection for $conn {
            type Conn = $conn;
            fn locking_connection(&mut self) -> &mut $conn {
                self
            }
        }

        #[cfg(feature = "r2d2")]
        #[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
        impl AsLockingConnection
            for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<$conn>>
        {
            type Conn = $conn;
            fn locking_connection(&mut self) -> &mut $conn {
                self
            }
        }
    )*};
}

/// `impl LockingConnection` for one backend's connection: the transactions
/// are the backend module's `locked_transaction` and `serializable_transaction`
/// (written once, for the connection and for a
/// [`Dispatch`](crate::multi::Dispatch) enum holding one), the lock clause is
/// Diesel's `with_lock` (`with_lock`) or nothing (`none`: SQLite), and
/// `take_write_lock` is a no-op unless given.
#[allow(unused_macros)] // used once per enabled backend
macro_rules! locking_connection {
    ($conn:ty, lock_clause: $clause:ident $(, take_write_lock: |$c:ident| $take:expr)? $(,)?) => {
        impl LockingConnection for $conn {
            locking_connection!(@clause $clause);

            fn locked_transaction<T, E, F>(&mut self, options: &LockOptions, f: F) -> Result<T, E>
            where
                E: From<Error>,
                F: FnOnce(&mut Self) -> Result<T, E>,
            {
                locked_transaction(self, options, f)
            }

            fn serializable_transaction<T, E, F>(&mut self, f: F) -> Result<T, E>
            where
                E: From<Error>,
                F: FnOnce(&mut Self) -> Result<T, E>,
            {
                serializable_transaction(self, f)
            }

            $(
                fn take_write_lock(&mut self) -> Result<(), Error> {
                    let $c = self;
                    $take
                }
            )?
        }
    };
    (@clause with_lock) => {
        type Locked<Q: LockingDsl<L>, L> = Q::Output;

        fn apply_lock<Q: LockingDsl<L>, L>(query: Q, lock: L) -> Self::Locked<Q, L> {
            query.with_lock(lock)
        }
    };
    (@clause none) => {
        type Locked<Q: LockingDsl<L>, L> = Q;

        fn apply_lock<Q: LockingDsl<L>, L>(query: Q, _lock: L) -> Self::Locked<Q, L> {
            query
        }
    };
}

/// [`Error::AlreadyInTransaction`] when a transaction is open on `conn`: a
/// `SERIALIZABLE` transaction is always the outermost one.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
fn refuse_open_transaction<C: Control>(conn: &mut C) -> Result<(), Error> {
    crate::transaction::refuse_transaction_or_broken(conn)
}

/// [`LockingConnection::serializable_transaction`] where one statement,
/// `begin`, opens it (PostgreSQL, SQLite): refuses an open transaction, then
/// runs `f` once behind the panic guard, for the connection `I` or a
/// [`Dispatch`](crate::multi::Dispatch) enum holding one.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn serializable_begun_with<I, H, T, E, F>(conn: &mut H, begin: &str, f: F) -> Result<T, E>
where
    I: diesel::Connection<TransactionManager = diesel::connection::AnsiTransactionManager>,
    H: Control + Reach<I>,
    E: From<Error>,
    F: FnOnce(&mut H) -> Result<T, E>,
{
    crate::transaction::refuse_if_ended(conn)?;
    refuse_open_transaction(conn)?;
    let mut guard = PanicGuard::default();
    let result = transaction_sql::<I, _, _, _>(conn, begin, |conn| {
        guard.call(conn, |conn| f(conn).map_err(Failure::Closure))
    });
    finish(conn, false, guard, result, None, classify)
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use diesel::expression::SqlLiteral;
    use diesel::sql_types::Text;
    use diesel::{PgConnection, RunQueryDsl};

    use super::*;

    as_locking_connection!(PgConnection);

    /// `SELECT current_setting('lock_timeout')`: the lock timeout in force,
    /// which a nested call puts back. Built here for the blocking and the async
    /// connection.
    pub(crate) fn lock_timeout_query() -> diesel::dsl::select<SqlLiteral<Text>> {
        diesel::select(diesel::dsl::sql::<Text>("current_setting('lock_timeout')"))
    }

    /// Sets the lock timeout, shared with the async connection:
    /// `set_config(.., true)` is `SET LOCAL`, with the value bound.
    pub(crate) const SET_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

    /// The value [`SET_LOCK_TIMEOUT`] binds for a timeout of `millis`, for the
    /// blocking and the async connection.
    pub(crate) fn lock_timeout_value(millis: i32) -> String {
        format!("{millis}ms")
    }

    fn lock_timeout(conn: &mut PgConnection) -> diesel::QueryResult<String> {
        lock_timeout_query().get_result(conn)
    }

    fn set_lock_timeout(conn: &mut PgConnection, value: &str) -> diesel::QueryResult<()> {
        diesel::sql_query(SET_LOCK_TIMEOUT)
            .bind::<Text, _>(value)
            .execute(conn)
            .map(drop)
    }

    locking_connection!(PgConnection, lock_clause: with_lock);

    /// [`LockingConnection::locked_transaction`] on PostgreSQL, for the
    /// connection or a [`Dispatch`](crate::multi::Dispatch) enum holding one.
    pub(crate) fn locked_transaction<H, T, E, F>(
        conn: &mut H,
        options: &LockOptions,
        f: F,
    ) -> Result<T, E>
    where
        H: Control + Reach<PgConnection>,
        E: From<Error>,
        F: FnOnce(&mut H) -> Result<T, E>,
    {
        crate::transaction::refuse_if_ended_before_level(conn)?;
        let nested = in_transaction(conn);
        let mut guard = PanicGuard::default();
        let result = crate::transaction::level(conn, |conn| {
            let outer = match options.timeout_millis() {
                Some(millis) => {
                    let outer = if nested {
                        Some(lock_timeout(conn.reach()?)?)
                    } else {
                        None
                    };
                    set_lock_timeout(conn.reach()?, &lock_timeout_value(millis))?;
                    outer
                }
                None => None,
            };
            let result = guard.call(conn, |conn| f(conn).map_err(Failure::Closure))?;
            // `SET LOCAL` survives `RELEASE SAVEPOINT`: give the outer
            // transaction its own value back (a rollback to the savepoint does).
            if let Some(outer) = outer {
                set_lock_timeout(conn.reach()?, &outer)?;
            }
            Ok(result)
        });
        finish(conn, nested, guard, result, None, classify)
    }

    /// [`LockingConnection::serializable_transaction`] on PostgreSQL, begun
    /// with what Diesel's `build_transaction().serializable()` sends.
    pub(crate) fn serializable_transaction<H, T, E, F>(conn: &mut H, f: F) -> Result<T, E>
    where
        H: Control + Reach<PgConnection>,
        E: From<Error>,
        F: FnOnce(&mut H) -> Result<T, E>,
    {
        serializable_begun_with::<PgConnection, _, _, _, _>(
            conn,
            crate::transaction::PG_BEGIN_SERIALIZABLE,
            f,
        )
    }

    impl Control for PgConnection {
        fn confirms_abort(&mut self, _: &Error) -> bool {
            // In an aborted transaction every statement fails (25P02).
            let probe = crate::transaction::PG_CONFIRM_ABORT;
            diesel::connection::SimpleConnection::batch_execute(self, probe).is_err()
        }
    }
}

#[cfg(feature = "mysql")]
pub(crate) mod mysql {
    use diesel::connection::SimpleConnection;
    use diesel::mysql::Mysql;
    use diesel::query_builder::{AstPass, QueryFragment, QueryId};
    use diesel::sql_types::BigInt;
    use diesel::{MysqlConnection, RunQueryDsl};

    use super::*;

    as_locking_connection!(MysqlConnection);

    /// `SELECT CAST(@@in_transaction AS SIGNED), CAST(@lockkit_aborted AS CHAR)`: whether the
    /// server has a transaction open, and the token of a stand-in for an aborted
    /// one opened in this session ([`StandIn`](crate::transaction::StandIn)), for
    /// the blocking and the async connection.
    pub(crate) fn server_transaction_query() -> diesel::dsl::select<(
        diesel::expression::SqlLiteral<BigInt>,
        diesel::expression::SqlLiteral<diesel::sql_types::Nullable<diesel::sql_types::Text>>,
    )> {
        diesel::select((
            diesel::dsl::sql::<BigInt>("CAST(@@in_transaction AS SIGNED)"),
            diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>(
                "CAST(@lockkit_aborted AS CHAR)",
            ),
        ))
    }

    /// Whether the caller's transaction is alive on the server: open, and not
    /// lockkit's stand-in for an aborted one.
    fn caller_transaction_alive(conn: &mut MysqlConnection) -> diesel::QueryResult<bool> {
        use crate::transaction::StandIn;
        use diesel::connection::SimpleConnection;
        match StandIn::read(server_transaction_query().get_result(conn)?) {
            StandIn::NoTransaction => Ok(false),
            StandIn::Alive => Ok(true),
            StandIn::Probe(token) => match StandIn::probe(&token) {
                Some(probe) => match conn.batch_execute(&probe) {
                    Ok(()) => Ok(false),
                    // The probe met the abort of the caller's transaction
                    // (Galera's 1213 at the next statement): it has ended.
                    Err(err) if crate::transaction::ends_transaction(&err) => Err(err),
                    Err(_) => conn.batch_execute(StandIn::FORGET).map(|()| true),
                },
                None => conn.batch_execute(StandIn::FORGET).map(|()| true),
            },
        }
    }

    /// MariaDB's `@@in_transaction`: whether the server has any transaction open.
    fn in_server_transaction(conn: &mut MysqlConnection) -> diesel::QueryResult<bool> {
        server_transaction_query()
            .get_result::<(i64, Option<String>)>(conn)
            .map(|(open, _)| open != 0)
    }

    /// `SET @lockkit_lock_wait_timeout_<depth> = @@SESSION.innodb_lock_wait_timeout,
    /// SESSION innodb_lock_wait_timeout = ?`: sets the lock wait timeout of a
    /// locking transaction opened at `depth` (0: none open) and keeps the
    /// session's value in a user variable of that depth, in one statement, so
    /// that nothing comes back to read and a nested call keeps its own. Only
    /// the depth, an integer, is written into the SQL; the timeout is bound.
    /// Cached by its SQL: prepared once per connection and depth (Diesel
    /// prepares a `sql_query` anew on every call, one more round trip).
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct SaveAndSetLockWaitTimeout {
        pub(crate) depth: u32,
        pub(crate) secs: i64,
    }

    impl QueryId for SaveAndSetLockWaitTimeout {
        type QueryId = ();
        const HAS_STATIC_QUERY_ID: bool = false;
    }

    impl QueryFragment<Mysql> for SaveAndSetLockWaitTimeout {
        fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Mysql>) -> diesel::QueryResult<()> {
            out.push_sql("SET @lockkit_lock_wait_timeout_");
            out.push_sql(&self.depth.to_string());
            out.push_sql(
                " = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = ",
            );
            out.push_bind_param::<BigInt, _>(&self.secs)
        }
    }

    impl RunQueryDsl<MysqlConnection> for SaveAndSetLockWaitTimeout {}

    /// Puts back the value [`SaveAndSetLockWaitTimeout`] kept: no parameter, so
    /// sent as text, one round trip.
    pub(crate) fn restore_lock_wait_timeout_sql(depth: u32) -> String {
        format!("SET SESSION innodb_lock_wait_timeout = @lockkit_lock_wait_timeout_{depth}")
    }

    fn restore_lock_wait_timeout(
        conn: &mut MysqlConnection,
        depth: u32,
    ) -> diesel::QueryResult<()> {
        conn.batch_execute(&restore_lock_wait_timeout_sql(depth))
    }

    locking_connection!(MysqlConnection, lock_clause: with_lock);

    /// [`LockingConnection::locked_transaction`] on MySQL/MariaDB, for the
    /// connection or a [`Dispatch`](crate::multi::Dispatch) enum holding one.
    pub(crate) fn locked_transaction<H, T, E, F>(
        conn: &mut H,
        options: &LockOptions,
        f: F,
    ) -> Result<T, E>
    where
        H: Control + Reach<MysqlConnection>,
        E: From<Error>,
        F: FnOnce(&mut H) -> Result<T, E>,
    {
        crate::transaction::refuse_if_ended_before_level(conn)?;
        // innodb_lock_wait_timeout is a session setting: set it (keeping the
        // session's value on the server), run, put it back.
        let depth = crate::transaction::transaction_depth(conn);
        let saved = match options.timeout_secs() {
            Some(secs) => {
                let mysql = conn.reach().map_err(classify)?;
                if let Err(err) = (SaveAndSetLockWaitTimeout { depth, secs }).execute(mysql) {
                    // Nested, this may be the first statement to learn that
                    // the caller's transaction ended (another Galera node's
                    // commit aborted it): decided as a failed write's, with
                    // the stand-in, not a plain retryable error.
                    let ends = crate::transaction::journal::Ends::of::<diesel::mysql::Mysql>();
                    return Err(E::from(crate::transaction::failed_write(
                        conn,
                        classify(err),
                        ends,
                    )));
                }
                Some(depth)
            }
            None => None,
        };
        let nested = depth > 0;
        let mut guard = PanicGuard::default();
        let result = crate::transaction::level(conn, |conn| {
            guard.call(conn, |conn| f(conn).map_err(Failure::Closure))
        });
        let restored = saved.map(|depth| {
            conn.reach()
                .and_then(|c| restore_lock_wait_timeout(c, depth))
        });
        finish(conn, nested, guard, result, restored, classify)
    }

    /// [`LockingConnection::serializable_transaction`] on MySQL/MariaDB.
    pub(crate) fn serializable_transaction<H, T, E, F>(conn: &mut H, f: F) -> Result<T, E>
    where
        H: Control + Reach<MysqlConnection>,
        E: From<Error>,
        F: FnOnce(&mut H) -> Result<T, E>,
    {
        refuse_open_transaction(conn)?;
        // Applies to the next transaction only.
        conn.reach()
            .and_then(|c| diesel::sql_query(crate::transaction::MYSQL_SET_SERIALIZABLE).execute(c))
            .map_err(classify)?;
        crate::transaction::run(conn, |conn| f(conn).map_err(Failure::Closure))
    }

    impl Control for MysqlConnection {
        fn begin_level(&mut self) -> diesel::QueryResult<()> {
            use diesel::connection::{AnsiTransactionManager, TransactionManager};
            if crate::transaction::in_transaction(self) {
                return AnsiTransactionManager::begin_transaction(self);
            }
            let marked = crate::transaction::journal::guarded(self);
            let begin = match marked {
                true => crate::transaction::MYSQL_BEGIN_MARKED,
                false => crate::transaction::MYSQL_BEGIN,
            };
            match AnsiTransactionManager::begin_transaction_sql(self, begin) {
                // A server running read-only (a replica) refuses `READ WRITE`
                // to some users where it takes Diesel's `BEGIN`; nothing
                // writes there anyway.
                Err(diesel::result::Error::DatabaseError(_, info))
                    if crate::error::classification::is_read_only_server(info.message()) =>
                {
                    AnsiTransactionManager::begin_transaction(self)
                }
                Ok(()) if marked => {
                    crate::transaction::journal::began_marked(self);
                    Ok(())
                }
                begun => begun,
            }
        }

        fn commit_marked(&mut self) -> diesel::QueryResult<()> {
            use diesel::connection::SimpleConnection;
            // A savepoint's release leaves the mark to the outermost level.
            if crate::transaction::transaction_depth(self) != 1 {
                return Ok(());
            }
            match crate::transaction::journal::marked_commit(self) {
                Some(commit) => self
                    .batch_execute(commit)
                    .map_err(crate::transaction::ended_before_commit),
                None => Ok(()),
            }
        }

        fn transaction_ended(&mut self, cause: Option<&Error>) -> Option<Error> {
            // MariaDB knows.
            let alive = caller_transaction_alive(self);
            crate::transaction::ended_unless_open(self, alive, cause)
        }

        fn confirms_abort(&mut self, cause: &Error) -> bool {
            self.transaction_ended(Some(cause)).is_some()
        }

        fn keep_aborted(&mut self) {
            let _ = crate::transaction::open_stand_in(self);
        }

        fn repair(&mut self) {
            // Galera answers the ROLLBACK of a transaction that another node's
            // write aborted while it sat idle with the abort's 1213; Diesel then
            // calls its transaction manager broken, and every later transaction
            // on the connection fails with `BrokenTransactionManager`. The server
            // has ended the transaction: if it says so, start afresh.
            use diesel::connection::{TransactionManager, TransactionManagerStatus};
            type Manager = <MysqlConnection as diesel::Connection>::TransactionManager;
            if crate::transaction::is_broken(Manager::transaction_manager_status_mut(self))
                && matches!(in_server_transaction(self), Ok(false))
            {
                *Manager::transaction_manager_status_mut(self) =
                    TransactionManagerStatus::default();
            }
        }
    }
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use std::borrow::Cow;

    use diesel::connection::SimpleConnection;
    use diesel::{RunQueryDsl, SqliteConnection};

    use super::*;
    use crate::metrics::LockWait;
    use crate::transaction::journal::own;
    use crate::transaction::SQLITE_BEGIN_IMMEDIATE;

    as_locking_connection!(SqliteConnection);

    #[derive(diesel::QueryableByName)]
    pub(crate) struct BusyTimeout {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pub(crate) timeout: i32,
    }

    /// The write lock's statement (see [`write_lock`]), shared with the async connection.
    pub(crate) const WRITE_LOCK: &str = "PRAGMA incremental_vacuum(1)";
    pub(crate) const BUSY_TIMEOUT: &str = "PRAGMA busy_timeout";

    /// PRAGMA takes no bound parameters; `millis` is an integer, never caller text.
    pub(crate) fn set_busy_timeout_sql(millis: i32) -> String {
        format!("PRAGMA busy_timeout = {millis}")
    }

    /// `lock` (the statement that takes the write lock) under a busy timeout of
    /// `millis`, set in the same batch.
    pub(crate) fn with_busy_timeout_sql(lock: &str, millis: i32) -> String {
        format!("PRAGMA busy_timeout = {millis}; {lock}")
    }

    /// Takes the database's write lock in the open transaction without changing
    /// data: `incremental_vacuum` is a write (so it takes the lock, waiting up to
    /// the busy timeout) that frees at most one unused page, and none unless the
    /// database uses `auto_vacuum = INCREMENTAL`. It reads nothing first: a read
    /// would fix the transaction's snapshot, and a snapshot older than the lock
    /// holder's commit could never be upgraded to a write.
    fn write_lock(conn: &mut SqliteConnection) -> diesel::QueryResult<()> {
        own(conn, |conn| conn.batch_execute(WRITE_LOCK))
    }

    fn set_busy_timeout(conn: &mut SqliteConnection, millis: i32) -> diesel::QueryResult<()> {
        own(conn, |conn| {
            conn.batch_execute(&set_busy_timeout_sql(millis))
        })
    }

    locking_connection!(SqliteConnection, lock_clause: none, take_write_lock: |conn| {
        write_lock(conn).map_err(classify)
    });

    /// [`LockingConnection::locked_transaction`] on SQLite, for the connection
    /// or a [`Dispatch`](crate::multi::Dispatch) enum holding one.
    pub(crate) fn locked_transaction<H, T, E, F>(
        conn: &mut H,
        options: &LockOptions,
        f: F,
    ) -> Result<T, E>
    where
        H: Control + Reach<SqliteConnection>,
        E: From<Error>,
        F: FnOnce(&mut H) -> Result<T, E>,
    {
        crate::transaction::refuse_if_ended_before_level(conn)?;
        let wait = options.wait_mode();
        let nested = in_transaction(conn);
        // The busy timeout is set in one batch with the statement that takes
        // the write lock, and put back once the work is done: at the top level
        // before `COMMIT`, which in rollback-journal mode waits for the
        // database's readers (at `nowait()`'s 0 ms any reader would fail it,
        // after the work ran); elsewhere once the call ended.
        let busy_timeout = match wait.busy_timeout_millis(options.timeout_millis()) {
            Some(millis) => {
                let sqlite = conn.reach().map_err(classify)?;
                let previous = own(sqlite, |c| {
                    diesel::sql_query(BUSY_TIMEOUT).get_result::<BusyTimeout>(c)
                })
                .map_err(classify)?
                .timeout;
                Some((millis, previous))
            }
            None => None,
        };
        let take = |lock: &'static str| match busy_timeout {
            Some((millis, _)) => Cow::Owned(with_busy_timeout_sql(lock, millis)),
            None => Cow::Borrowed(lock),
        };
        let lock_error = |err| wait.classify_write_lock(err);
        let mut restored_before_commit = false;
        let waited = LockWait::start();
        let mut guard = PanicGuard::default();
        let work = |conn: &mut H| f(conn).map_err(Failure::Closure);
        let result = if nested {
            // A savepoint takes no lock, and the outer transaction may be a
            // deferred one that has none yet.
            crate::transaction::level(conn, |conn| {
                conn.reach()
                    .and_then(|c| own(c, |c| c.batch_execute(&take(WRITE_LOCK))))
                    .map_err(lock_error)?;
                waited.acquired("database", 1);
                guard.call(conn, work)
            })
        } else {
            // Takes the write lock before the first read: writers queue here.
            // A failure of Diesel's own statements is read knowing which one
            // failed: `BEGIN IMMEDIATE` waited for the lock, `COMMIT` did not.
            let mut waited = Some(waited);
            transaction_sql::<SqliteConnection, _, _, _>(
                conn,
                &take(SQLITE_BEGIN_IMMEDIATE),
                |conn| {
                    if let Some(waited) = waited.take() {
                        waited.acquired("database", 1);
                    }
                    let done = guard.call(conn, work)?;
                    if let Some((_, previous)) = busy_timeout {
                        conn.reach()
                            .and_then(|c| set_busy_timeout(c, previous))
                            .map_err(Failure::Diesel)?;
                        restored_before_commit = true;
                    }
                    Ok(done)
                },
            )
            .map_err(|failure| match failure {
                Failure::Diesel(err) if waited.is_some() => Failure::Lockkit(lock_error(err)),
                failure => failure,
            })
        };
        let restored = busy_timeout
            .filter(|_| !restored_before_commit)
            .map(|(_, previous)| conn.reach().and_then(|c| set_busy_timeout(c, previous)));
        finish(conn, nested, guard, result, restored, classify)
    }

    /// [`LockingConnection::serializable_transaction`] on SQLite: `BEGIN
    /// IMMEDIATE`, which is serializable.
    pub(crate) fn serializable_transaction<H, T, E, F>(conn: &mut H, f: F) -> Result<T, E>
    where
        H: Control + Reach<SqliteConnection>,
        E: From<Error>,
        F: FnOnce(&mut H) -> Result<T, E>,
    {
        serializable_begun_with::<SqliteConnection, _, _, _, _>(conn, SQLITE_BEGIN_IMMEDIATE, f)
    }

    impl Control for SqliteConnection {}
}
