//! How lockkit's transactions begin: the `BEGIN` each backend is sent where
//! Diesel's default will not do (an isolation level, SQLite's write lock taken
//! first), for the blocking and the async connections, and the backend
//! connection it goes to.

#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::connection::{AnsiTransactionManager, TransactionManager};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use diesel::Connection;

/// PostgreSQL's serializable `BEGIN` (what Diesel's
/// `build_transaction().serializable()` sends), shared with the async side.
#[cfg(feature = "postgres")]
pub(crate) const PG_BEGIN_SERIALIZABLE: &str = "BEGIN TRANSACTION ISOLATION LEVEL SERIALIZABLE";
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
    match f(conn) {
        Ok(value) => {
            H::TransactionManager::commit_transaction(conn)?;
            Ok(value)
        }
        Err(err) => match H::TransactionManager::rollback_transaction(conn) {
            // A broken transaction manager says less than the error behind it.
            Ok(()) | Err(diesel::result::Error::BrokenTransactionManager) => Err(err),
            Err(rollback) => Err(rollback.into()),
        },
    }
}
