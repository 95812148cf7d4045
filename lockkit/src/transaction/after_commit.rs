//! Work that must not run while the row is locked, nor at all if the
//! transaction rolls back: [`after_commit`].

use super::scope;
use crate::error::Error;

/// Queues `work` to run once the outermost transaction on `conn` commits, and
/// never if it rolls back. Call it inside the closure of a lockkit transaction
/// ([`with_lock`](crate::with_lock), [`Lockable::with_lock`](crate::Lockable::with_lock),
/// [`locked_transaction`](crate::locked_transaction),
/// [`transaction_with_retry`](crate::transaction_with_retry),
/// [`serializable`](crate::serializable)), with the connection the closure got.
///
/// The slow parts of a sale (the payment gateway, the e-mail, an HTTP call) do
/// not belong inside `FOR UPDATE`: every other buyer of the row waits for them,
/// and if the transaction then rolls back the e-mail is already gone. Queue them
/// here instead:
///
/// * they run after `COMMIT` returned, in the order queued, on this thread,
///   before the lockkit call returns; the locks are released by then;
/// * after a rollback (the closure's `Err`, a panic, a failed `COMMIT`) they are
///   dropped without running;
/// * in a nested lockkit transaction (a savepoint) they wait for the outermost
///   one; if the savepoint rolls back they are dropped, the rest stays queued;
/// * under [`transaction_with_retry`](crate::transaction_with_retry) and
///   [`serializable`](crate::serializable), the work an attempt queued is
///   dropped with that attempt: work runs once, for the attempt that committed.
///
/// The work gets no connection and must be `'static`: move what it needs into it
/// (ids, an `Arc`, a channel's sender). It runs after the commit: if it fails,
/// the data stays committed, so make it retryable on its own (or write an outbox
/// row in the transaction instead, see `lockkit::outbox`). A panic in it goes on
/// to the caller, the transaction committed, and the work queued after it does
/// not run.
///
/// lockkit sees the commits of its own transactions only. Diesel's
/// `conn.transaction(..)` inside a lockkit transaction is a savepoint lockkit does
/// not see (work queued in it runs when lockkit's transaction commits, even if
/// that savepoint rolled back), and a lockkit transaction nested in one of
/// Diesel's cannot queue work at all: [`Error::NotInTransaction`].
///
/// # Errors
///
/// [`Error::NotInTransaction`] when no lockkit transaction is open on `conn`, or
/// when the outermost transaction on it is not lockkit's; `work` is dropped.
///
/// # Example
///
/// ```
/// use std::sync::mpsc;
/// use diesel::prelude::*;
/// use lockkit::prelude::*;
/// # diesel::table! { items (id) { id -> Integer, stock -> Integer } }
/// # #[derive(Queryable, Selectable, lockkit::Lockable)]
/// # #[diesel(table_name = items)]
/// # pub struct Item { pub id: i32, pub stock: i32 }
/// # fn main() -> Result<(), lockkit::Error> {
/// # let mut conn = SqliteConnection::establish(":memory:").unwrap();
/// # diesel::sql_query("CREATE TABLE items (id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)").execute(&mut conn)?;
/// # diesel::sql_query("INSERT INTO items VALUES (1, 10)").execute(&mut conn)?;
/// let (mail, outbox) = mpsc::channel();
/// lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, item: Item| {
///     diesel::update(items::table.find(item.id)).set(items::stock.eq(item.stock - 1)).execute(conn)?;
///     let mail = mail.clone();
///     lockkit::after_commit(conn, move || mail.send(format!("sold item {}", item.id)).unwrap())?;
///     assert!(outbox.try_recv().is_err(), "nothing is sent while the row is locked");
///     Ok::<_, lockkit::Error>(())
/// })?;
/// assert_eq!(outbox.try_recv().unwrap(), "sold item 1");
///
/// // Rolled back: the work never runs.
/// let rolled_back = lockkit::with_lock(&mut conn, 1, lockkit::LockOptions::default(), |conn, _: Item| {
///     let mail = mail.clone();
///     lockkit::after_commit(conn, move || mail.send("never".to_string()).unwrap())?;
///     Err::<(), _>(lockkit::Error::NoRowMatched)
/// });
/// assert!(rolled_back.is_err());
/// assert!(outbox.try_recv().is_err());
///
/// // Outside a lockkit transaction there is no commit to wait for.
/// let outside = lockkit::after_commit(&mut conn, || ());
/// assert!(matches!(outside, Err(lockkit::Error::NotInTransaction)));
/// # Ok(()) }
/// ```
pub fn after_commit<C, F>(conn: &mut C, work: F) -> Result<(), Error>
where
    C: diesel::Connection,
    F: FnOnce() + 'static,
{
    let conn = scope::conn_id(conn);
    scope::queue(conn, Box::new(work)).map_err(|_dropped| Error::NotInTransaction)
}
