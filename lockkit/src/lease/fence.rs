//! Fenced writes: the storage side of fencing tokens, in `lockkit_fences`. Each
//! backend's statements on that table are with its lease statements, in
//! `database`.

use super::{check_name, Error, Fence};
use crate::pessimistic::connection::AsLockingConnection;
use crate::transaction::{self, Failure};

/// Runs `work` in a transaction (a savepoint inside one) that first records
/// `fence` for `resource`, and refuses it when a newer fence was recorded; see
/// the [module docs](super#fenced-writes).
///
/// The fence check and `work` commit together: when `work` fails, nothing of it
/// and no fence is recorded. Fenced transactions on one resource take turns on
/// its `lockkit_fences` row.
///
/// # Errors
///
/// lockkit's errors reach you converted into `E`:
///
/// * [`Error::Fenced`] when `resource` has seen a larger fence; `work` did not
///   run and nothing was written.
/// * [`Error::InvalidInput`] when `resource` is empty, longer than 255 characters
///   or contains NUL; nothing is sent.
/// * whatever `work` returns, untouched (the transaction is rolled back).
/// * a classified database error; see [`classify`](crate::classify()).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use diesel::prelude::*;
/// use diesel::connection::SimpleConnection;
/// use lockkit::lease::{fenced, up_sql, Dialect, Fence};
/// let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// conn.batch_execute(up_sql(Dialect::Sqlite)).unwrap();
/// let write = |conn: &mut SqliteConnection, fence| fenced(conn, "report", Fence(fence), |_| Ok::<_, lockkit::Error>(()));
/// write(&mut conn, 7).unwrap();
/// write(&mut conn, 7).unwrap(); // the same holder again
/// assert!(matches!(write(&mut conn, 6), Err(lockkit::Error::Fenced { current: 7, .. })));
/// write(&mut conn, 8).unwrap(); // a newer holder
/// # }
/// ```
pub fn fenced<C, T, E, F>(conn: &mut C, resource: &str, fence: Fence, work: F) -> Result<T, E>
where
    C: AsLockingConnection,
    C::Conn: FenceStore,
    E: From<Error>,
    F: FnOnce(&mut C::Conn) -> Result<T, E>,
{
    check_name(resource)?;
    transaction::run(conn.locking_connection(), |conn| {
        admitted(resource, fence, C::Conn::raise(conn, resource, fence.0)?)?;
        work(conn).map_err(Failure::Closure)
    })
}

/// What recording the fence found: `Some(current)`, a newer fence stands, so
/// the write is refused.
pub(crate) fn admitted(resource: &str, fence: Fence, newer: Option<i64>) -> Result<(), Error> {
    match newer {
        None => Ok(()),
        Some(current) => Err(Error::Fenced {
            resource: resource.to_owned(),
            fence: fence.0,
            current,
        }),
    }
}

/// The statements behind [`fenced`], per connection type.
///
/// Sealed: implemented by lockkit for each backend feature's connection; name it
/// only in `where` clauses ([`bounds`](crate::bounds)).
#[diagnostic::on_unimplemented(
    message = "lockkit's fenced writes do not support `{Self}`",
    label = "not a connection lockkit's fenced writes support",
    note = "lockkit supports `PgConnection`, `MysqlConnection` and `SqliteConnection` (features `postgres`, `mysql`, `sqlite`), r2d2 pooled connections to them, and `#[derive(diesel::MultiConnection)]` enums over them that implement `lockkit::multi::Dispatch`"
)]
pub trait FenceStore:
    crate::pessimistic::connection::LockingConnection + crate::sealed::Sealed
{
    /// Raises the recorded fence of `resource` to `fence`; `Some(newer)` when it
    /// had seen a larger one (then nothing changed).
    #[doc(hidden)]
    fn raise(conn: &mut Self, resource: &str, fence: i64) -> Result<Option<i64>, Error>;
}

/// How a backend records a fence: one row affected when it was recorded
/// (created, or raised from a smaller or equal one), none when a larger one stands.
#[allow(dead_code)]
pub(crate) enum Raise {
    /// resource, fence: PostgreSQL and SQLite, whose upsert's `DO UPDATE .. WHERE`
    /// refuses a smaller fence in the same statement.
    Upsert(&'static str),
    /// MySQL, whose `ON DUPLICATE KEY UPDATE` reports an unchanged row like a
    /// changed one (Diesel connects with CLIENT_FOUND_ROWS), so "the same fence
    /// again" and "refused" look alike: create the row (resource, fence), then
    /// raise it (fence, resource, fence).
    EnsureThenUpdate {
        ensure: &'static str,
        update: &'static str,
    },
}
