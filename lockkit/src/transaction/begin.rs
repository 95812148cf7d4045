//! How lockkit's transactions begin: the `BEGIN` each backend is sent where
//! Diesel's default will not do (an isolation level, SQLite's write lock taken
//! first), for the blocking and the async connections, and the backend
//! connection it goes to.

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::connection::AnsiTransactionManager;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::Connection;

/// PostgreSQL's serializable `BEGIN` (what Diesel's
/// `build_transaction().serializable()` sends), shared with the async side.
#[cfg(feature = "postgres")]
pub(crate) const PG_BEGIN_SERIALIZABLE: &str = "BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE";
/// How lockkit's transactions begin on MySQL/MariaDB: read-write whatever the
/// session's default, so that a session made read-only outside them (`SET
/// SESSION TRANSACTION READ ONLY`) refuses a write the server would otherwise
/// run in autocommit after it ended the transaction without an error (MariaDB
/// Galera; README, "Galera"). Diesel's own `BEGIN` is read-only there.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_BEGIN: &str = "START TRANSACTION READ WRITE";
/// [`MYSQL_BEGIN`] on a session that refuses writes outside transactions
/// (README, "Galera"), with a savepoint only this transaction holds: the
/// server may end the transaction without an error after the work's last
/// statement, where no write of the work follows to be refused, and a `COMMIT`
/// with no transaction open succeeds. [`MYSQL_COMMIT_MARKED`] then fails
/// instead of committing nothing.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_BEGIN_MARKED: &str = "START TRANSACTION READ WRITE; SAVEPOINT lockkit_open";
/// The `COMMIT` of a transaction begun with [`MYSQL_BEGIN_MARKED`], sent as one
/// batch: where the savepoint went with a transaction the server ended, its
/// release fails and the `COMMIT` is not run ([`ended_before_commit`]).
/// Diesel's own `COMMIT` follows, with no transaction left to end, to close
/// its books.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_COMMIT_MARKED: &str = "RELEASE SAVEPOINT lockkit_open; COMMIT";
/// [`MYSQL_COMMIT_MARKED`] on MariaDB, whose Galera may end a transaction
/// without an error and leave its savepoints in place: the batch also asks
/// `@@in_transaction` before the `COMMIT`, and fails as a deadlock where no
/// transaction is open. Measured on a three-node cluster: with the release
/// alone, about one run in eight of the read-only writers' test had a write
/// reported and not committed; with the question, none in 40. Sent where
/// the session was made read-only through
/// [`read_only_outside_transactions`](crate::read_only_outside_transactions),
/// which asks whether the server answers `@@in_transaction`.
#[cfg(feature = "mysql")]
pub(crate) const MARIADB_COMMIT_MARKED: &str = "RELEASE SAVEPOINT lockkit_open; \
     BEGIN NOT ATOMIC IF @@in_transaction = 0 THEN SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, \
     MESSAGE_TEXT = 'Deadlock found when trying to get lock (lockkit: the transaction had ended \
     before its COMMIT)'; END IF; END; COMMIT";
/// What a failed [`MYSQL_COMMIT_MARKED`] whose savepoint was gone (1305)
/// becomes: InnoDB's words for a deadlock, which lockkit classifies as
/// [`Error::Deadlock`](crate::Error::Deadlock), retryable. Nothing of the work
/// committed: it ran on a session that refuses writes outside transactions,
/// and a write of it after the end would have been refused.
#[cfg(feature = "mysql")]
pub(crate) fn ended_before_commit(err: diesel::result::Error) -> diesel::result::Error {
    match &err {
        diesel::result::Error::DatabaseError(_, info)
            if info.message().starts_with("SAVEPOINT lockkit_open ")
                && info.message().ends_with("does not exist") =>
        {
            diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::SerializationFailure,
                Box::new(ENDED_BEFORE_COMMIT.to_owned()),
            )
        }
        _ => err,
    }
}
#[cfg(feature = "mysql")]
const ENDED_BEFORE_COMMIT: &str = "Deadlock found when trying to get lock (the server had ended \
     the transaction without an error before its COMMIT: the savepoint it began with was gone)";
/// MySQL/MariaDB: a write lockkit makes outside any transaction, refused there
/// on a session made read-only, is sent again in a transaction of its own,
/// begun so (one round trip), and ended with [`MYSQL_END_ALONE`] before its
/// `COMMIT`.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_BEGIN_ALONE: &str = "START TRANSACTION READ WRITE; SAVEPOINT lockkit_alone";
/// Fails where the server ended [`MYSQL_BEGIN_ALONE`]'s transaction without an
/// error (the savepoint went with it): then its `COMMIT` would commit nothing.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_END_ALONE: &str = "RELEASE SAVEPOINT lockkit_alone";
/// MySQL/MariaDB: sent before `BEGIN`; applies to the next transaction only.
#[cfg(feature = "mysql")]
pub(crate) const MYSQL_SET_SERIALIZABLE: &str = "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE";
/// SQLite: one writer at a time is serializable. Also how a locked transaction
/// begins (the write lock taken before the first read), on both sides.
#[cfg(feature = "sqlite")]
pub(crate) const SQLITE_BEGIN_IMMEDIATE: &str = "BEGIN IMMEDIATE";

/// The connection lockkit's statements for one backend go to: the connection
/// itself, or the one inside a [`Dispatch`](crate::multi::Dispatch) enum
/// (implemented in [`multi`](crate::multi)).
pub(crate) trait Reach<I> {
    /// The backend connection. A `Dispatch` enum that holds another backend now
    /// (its closure replaced it in the middle of lockkit's transaction) is
    /// Diesel's `BrokenTransactionManager`: the transaction lockkit began is no
    /// longer there.
    fn reach(&mut self) -> diesel::QueryResult<&mut I>;
}

/// Diesel's `Connection::transaction` with a `BEGIN` of its own (`BEGIN
/// IMMEDIATE`, an isolation level), sent to the backend connection `I` that
/// `conn` is or holds; `COMMIT` and `ROLLBACK` go through `conn`'s transaction
/// manager, which for a [`Dispatch`](crate::multi::Dispatch) enum is `I`'s.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn transaction_sql<I, H, T, E>(
    conn: &mut H,
    begin: &str,
    f: impl FnOnce(&mut H) -> Result<T, E>,
) -> Result<T, E>
where
    I: Connection<TransactionManager = AnsiTransactionManager>,
    H: Connection + Reach<I>,
    E: From<diesel::result::Error>,
{
    AnsiTransactionManager::begin_transaction_sql(conn.reach()?, begin)?;
    let result = f(conn);
    end_level(conn, result)
}

/// Diesel's `Connection::transaction` for a lockkit call's own level (a
/// savepoint when a transaction is open), ended as [`end_level`] decides.
pub(crate) fn level<C, T, E>(conn: &mut C, f: impl FnOnce(&mut C) -> Result<T, E>) -> Result<T, E>
where
    C: super::Control,
    E: From<diesel::result::Error>,
{
    conn.begin_level()?;
    let result = f(conn).and_then(|value| conn.commit_marked().map(|()| value).map_err(E::from));
    end_level(conn, result)
}

/// [`level`] on any connection, opened as Diesel opens it: a savepoint in the
/// caller's transaction, else Diesel's `BEGIN` (on MySQL/MariaDB read-only in
/// a session made read-only: see [`MYSQL_BEGIN`]).
pub(crate) fn diesel_level<C, T, E>(
    conn: &mut C,
    f: impl FnOnce(&mut C) -> Result<T, E>,
) -> Result<T, E>
where
    C: diesel::Connection,
    E: From<diesel::result::Error>,
{
    use diesel::connection::TransactionManager;
    C::TransactionManager::begin_transaction(conn)?;
    let result = f(conn);
    end_level(conn, result)
}

/// Commits the level `result` succeeded in, or rolls it back, as Diesel's
/// `transaction` does, but for the rollback that finds nothing to roll back
/// because SQLite already rolled the whole transaction back under the work
/// (a trigger's `RAISE(ROLLBACK, ..)`, an `ON CONFLICT ROLLBACK`): the work's
/// own error is what the caller gets ([`rolled_back_by_sqlite`]), not that of
/// the `ROLLBACK` ([`wrote_after_sqlite_rollback`] decides when it cannot).
fn end_level<C, T, E>(conn: &mut C, result: Result<T, E>) -> Result<T, E>
where
    C: diesel::Connection,
    E: From<diesel::result::Error>,
{
    use diesel::connection::TransactionManager;
    match result {
        Ok(value) => {
            C::TransactionManager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(err) => {
            // Read before the rollback, whose end the journal forgets it at.
            let wrote = super::journal::wrote_after_failed(conn);
            match C::TransactionManager::rollback_transaction(conn) {
                // A broken transaction manager says less than the error behind it.
                Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(err),
                Err(rollback) if rolled_back_by_sqlite(&rollback) => {
                    Err(wrote_after_sqlite_rollback(wrote).map_or(err, E::from))
                }
                // MySQL/MariaDB had rolled the whole transaction back under
                // the work, its savepoints with it: a lock wait timeout under
                // `--innodb-rollback-on-timeout` (Diesel forgives the failed
                // `ROLLBACK TO SAVEPOINT` of a deadlock itself). The work's
                // error is what happened; Diesel has given up on its books.
                Err(rollback) if savepoint_gone_on_mysql(&rollback) => Err(err),
                Err(rollback) => Err(rollback.into()),
            }
        }
    }
}

/// What the caller of a level gets in place of the work's own error, once
/// [`rolled_back_by_sqlite`] said SQLite had rolled the whole transaction back
/// under the work: where a statement of the work wrote after one failed
/// (`wrote`), that write ran in autocommit and committed on its own, and the
/// work's error, which a retry may take up, would apply it twice. Then
/// [`WROTE_AFTER_SQLITE_ROLLBACK`](super::WROTE_AFTER_SQLITE_ROLLBACK), not
/// retryable; else nothing (the work's error stands). For the blocking and the
/// async end.
pub(crate) fn wrote_after_sqlite_rollback(wrote: bool) -> Option<diesel::result::Error> {
    wrote.then(|| {
        diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new(super::WROTE_AFTER_SQLITE_ROLLBACK.to_owned()),
        )
    })
}

/// Whether `rollback`, the error of a lockkit level's `ROLLBACK TO SAVEPOINT`,
/// is MySQL/MariaDB's for a savepoint the server no longer has (1305): the
/// whole transaction ended under the level's work.
fn savepoint_gone_on_mysql(rollback: &diesel::result::Error) -> bool {
    let diesel::result::Error::DatabaseError(_, info) = rollback else {
        return false;
    };
    let message = info.message();
    message.starts_with("SAVEPOINT diesel_savepoint_") && message.ends_with("does not exist")
}

/// Whether `rollback`, the error of a lockkit level's rollback, is SQLite's
/// answer where it had already rolled the whole transaction back (no other
/// server fails a `ROLLBACK` so: PostgreSQL warns, MySQL/MariaDB succeed, and
/// MySQL's missing savepoint after a deadlock is Diesel's to forgive).
/// ("cannot rollback - no transaction is active" at the outermost level, "no
/// such savepoint" nested; Diesel's SQLite connection has then already counted
/// the level out, with no transaction open.) Shared with the async end.
pub(crate) fn rolled_back_by_sqlite(rollback: &diesel::result::Error) -> bool {
    let diesel::result::Error::DatabaseError(_, info) = rollback else {
        return false;
    };
    let message = info.message();
    message == "cannot rollback - no transaction is active"
        || message.starts_with("no such savepoint: diesel_savepoint_")
}
