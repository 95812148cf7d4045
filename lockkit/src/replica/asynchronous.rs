//! Read-your-writes on diesel-async (features `replica` and `async`):
//! [`commit_lsn`], [`replayed_lsn`] and [`route`] on an `AsyncPgConnection`.
//!
//! The blocking functions' twins: the same statements, the same [`Policy`],
//! the same [`Route`] values and the same errors, decided by the same code;
//! only the execution differs. A waiting [`route`] pauses with tokio's timer
//! (1 to 20 ms between two looks at the replica), never blocking the thread,
//! so other tasks run while a read waits for the replica. Connections of
//! diesel-async's bb8 and deadpool pools are passed as `&mut *conn`.
//!
//! ```no_run
//! use std::time::Duration;
//! use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
//! use lockkit::replica::asynchronous as replica;
//! use lockkit::replica::{Lsn, Policy};
//!
//! # async fn handler() -> Result<(), Box<dyn std::error::Error>> {
//! let mut primary = AsyncPgConnection::establish("postgres://app@primary/shop").await?;
//! let mut standby = AsyncPgConnection::establish("postgres://app@replica/shop").await?;
//!
//! // The write, committed; then its position, for the client.
//! diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1")
//!     .execute(&mut primary)
//!     .await?;
//! let token = replica::commit_lsn(&mut primary).await?.to_string();
//!
//! // The client's next request brings the token back.
//! let written = token.parse::<Lsn>().ok();
//! let policy = Policy::WaitThenPrimary(Duration::from_millis(100));
//! let route = replica::route(&mut standby, written, policy).await?;
//! let conn = if route.is_replica() { &mut standby } else { &mut primary };
//! # let _ = conn;
//! # Ok(())
//! # }
//! ```
//!
//! # Cancellation
//!
//! None of the three opens a transaction: a dropped [`route`] future (a
//! `tokio::time::timeout` around it) leaves no transaction open on the
//! connection, and the pause it was in ends with it.

use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::position::{Position, COMMIT_LSN, REPLAYED_LSN};
use super::route::{Routing, Step};
use super::{Lsn, Policy, Route};
use crate::asynchronous::connection::in_transaction;
use crate::{Error, Result};

/// The position on the primary a replica must have replayed to show everything
/// committed on `primary` so far: call it right after the write's transaction
/// committed. The async twin of [`replica::commit_lsn`](super::commit_lsn),
/// which says which position it takes and why.
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] when a transaction is open on `primary`.
/// * [`Error::Database`] when `primary` is a standby itself.
pub async fn commit_lsn(primary: &mut AsyncPgConnection) -> Result<Lsn> {
    if in_transaction(primary) {
        return Err(Error::AlreadyInTransaction);
    }
    diesel::sql_query(COMMIT_LSN)
        .get_result::<Position>(primary)
        .await?
        .committed()
}

/// How far `replica` has replayed the primary's WAL; `None` when it is not a
/// standby. The async twin of [`replica::replayed_lsn`](super::replayed_lsn).
pub async fn replayed_lsn(replica: &mut AsyncPgConnection) -> Result<Option<Lsn>> {
    diesel::sql_query(REPLAYED_LSN)
        .get_result::<Position>(replica)
        .await?
        .replayed()
}

/// Decides where a read that must see everything up to `written` goes, asking
/// `replica` how far it has replayed and waiting as `policy` allows, with
/// `tokio::time::sleep` between two looks. The async twin of
/// [`replica::route`](super::route()): the same steps, the same answers.
///
/// Needs a tokio runtime with its timer enabled (`enable_time`, which
/// `#[tokio::main]` turns on) when it waits.
///
/// # Errors
///
/// [`Error::ReplicaBehind`] when the wait of [`Policy::WaitOrFail`] ran out; the
/// errors of the replica's connection.
pub async fn route(
    replica: &mut AsyncPgConnection,
    written: Option<Lsn>,
    policy: Policy,
) -> Result<Route> {
    let mut routing = match Routing::start(written, policy) {
        Ok(routing) => routing,
        Err(route) => return Ok(route),
    };
    loop {
        match routing.look(replayed_lsn(replica).await?) {
            Step::Done(decided) => return decided,
            Step::Pause(pause) => tokio::time::sleep(pause).await,
        }
    }
}
