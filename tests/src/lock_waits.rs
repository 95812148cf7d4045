//! Lock waits made on purpose, for the tests of `lockkit::lock_waits`: one
//! session holds items row 1 with `with_lock`, idle in its transaction, and
//! another waits for it, while the test looks at what the server reports.

use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use diesel::connection::LoadConnection;
use lockkit::bounds::LockRow;
use lockkit::lock_waits::{self, LockMonitorConnection};
use lockkit::{AsLockingConnection, Error, LockOptions, LockingConnection};

use crate::db::TestBackend;
use crate::models::Item;
use crate::TestDb;

/// The two sessions of [`while_a_session_waits_for_item_1`], by the ids
/// `lockkit::lock_waits` reports them under.
#[derive(Debug, Clone, Copy)]
pub struct Sessions {
    /// The session that holds the lock.
    pub holder: i64,
    /// The session that waits for it.
    pub waiter: i64,
}

/// Runs `during` while one session holds `with_lock` on items row 1, then does
/// "something else" with its transaction open ([`TestDb::while_holding`]), and
/// another session asks for the same lock with `with_lock`; then the holder
/// commits. Returns the two sessions, what `during` returned, and what the
/// waiter's `with_lock` returned once it had the row: the row's stock.
pub fn while_a_session_waits_for_item_1<C, T>(
    db: &TestDb<C>,
    during: impl FnOnce(Sessions) -> T,
) -> (Sessions, T, Result<i32, Error>)
where
    C: TestBackend + LoadConnection + LockingConnection + AsLockingConnection<Conn = C> + Send,
    C: LockMonitorConnection,
    Item: LockRow<C>,
    TestDb<C>: Sync,
{
    let holder = OnceLock::new();
    let mut waiter = db.connect();
    let waiter_id = lock_waits::session_id(&mut waiter).unwrap();
    let (sessions, out, waiting) = db.while_holding(
        |conn, wait| {
            holder.set(lock_waits::session_id(conn).unwrap()).unwrap();
            lockkit::with_lock(conn, 1, LockOptions::default(), |_, _: Item| {
                wait();
                Ok::<_, Error>(())
            })
            .unwrap();
        },
        || {
            let sessions = Sessions {
                holder: *holder.get().unwrap(),
                waiter: waiter_id,
            };
            let waiting = thread::spawn(move || {
                lockkit::with_lock(&mut waiter, 1, LockOptions::default(), |_, item: Item| {
                    Ok::<_, Error>(item.stock)
                })
            });
            (sessions, during(sessions), waiting)
        },
    );
    (sessions, out, waiting.join().unwrap())
}

/// Calls `look` every 250 ms until it finds something, for at most `within`:
/// what it found. Panics with `never` when `within` has passed.
pub fn look_until<T>(within: Duration, never: &str, mut look: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = look() {
            return found;
        }
        assert!(Instant::now() < deadline, "{never}");
        thread::sleep(Duration::from_millis(250));
    }
}
