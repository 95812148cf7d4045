//! Replicas: reads that see the reader's own writes, and stale reads that cannot
//! lose updates (feature `replica`, PostgreSQL streaming replication).
//!
//! A standby replays the primary's write-ahead log (WAL) a little later than the
//! primary wrote it. A user who saves a form and is shown the page again, read on
//! the replica, may see the old data: the replica has not replayed the save yet.
//! The cure is **read-your-writes**: after a write, take the primary's WAL
//! position; send that user's later reads to the replica only once the replica
//! has replayed that far, else wait a bounded time or read on the primary.
//!
//! | call | what it does |
//! | --- | --- |
//! | [`commit_lsn`] | on the primary, after the write's commit: the [`Lsn`] a replica must reach |
//! | [`replayed_lsn`] | on the replica: how far it has replayed (`None`: not a standby) |
//! | [`route`] | with a [`Policy`]: the [`Route`] of a read (the replica, or the primary and why), waiting as the policy allows |
//! | [`Router`] (feature `r2d2`) | the three over a primary and a replica pool: [`Router::write`] returns the position, [`Router::read`] the connection |
//! | [`asynchronous`] (feature `async`) | the first three on diesel-async's `AsyncPgConnection`, waiting with tokio's timer; its `Router` over bb8 or deadpool pools (feature `bb8` or `deadpool`) |
//!
//! The SQL:
//!
//! ```sql
//! -- on the primary, after the commit
//! SELECT pg_current_wal_insert_lsn()::text AS lsn
//! -- on the replica, once, or every 1 to 20 ms while the policy waits
//! SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END AS lsn
//! ```
//!
//! The position is the token a web app carries between a client's requests: its
//! text form (`16/B374D848`) goes into a cookie or a header, and
//! [`Lsn`]'s `FromStr` reads it back without ever panicking.
//!
//! ```no_run
//! use std::time::Duration;
//! use diesel::prelude::*;
//! use lockkit::replica::{self, Lsn, Policy};
//!
//! let mut primary = PgConnection::establish("postgres://app@primary/shop").unwrap();
//! let mut replica = PgConnection::establish("postgres://app@replica/shop").unwrap();
//!
//! // The write, committed; then its position, for the client.
//! diesel::sql_query("UPDATE items SET stock = stock - 1 WHERE id = 1").execute(&mut primary).unwrap();
//! let token = replica::commit_lsn(&mut primary).unwrap().to_string();
//!
//! // The client's next request brings the token back.
//! let written = token.parse::<Lsn>().ok();
//! let route = replica::route(&mut replica, written, Policy::WaitThenPrimary(Duration::from_millis(100))).unwrap();
//! let conn = if route.is_replica() { &mut replica } else { &mut primary };
//! # let _ = conn;
//! ```
//!
//! # Stale reads cannot lose updates
//!
//! A read from a lagging replica is an old snapshot, like any read that a
//! concurrent writer overtook. What loses updates is a blind write of that
//! snapshot on the primary (`UPDATE .. SET stock = 7 WHERE id = 1`). A
//! [`Versioned`](crate::Versioned) write carries the version it read, and the
//! primary refuses it ([`Error::Stale`](crate::Error::Stale)) when the row moved
//! on: read where you like, write versioned on the primary, and nothing is lost.
//! Locks are taken on the primary only: a standby refuses `FOR UPDATE` and every
//! write with [`Error::ReadOnly`](crate::Error::ReadOnly).
//!
//! # What holds, and what does not
//!
//! * A read routed to the replica sees every transaction committed on the
//!   primary before [`commit_lsn`] was taken, on that connection or any other.
//! * Only PostgreSQL physical (streaming) replication: `pg_last_wal_replay_lsn`
//!   means nothing on a logical replica or on MySQL.
//! * One WAL history: positions are compared as numbers, without their
//!   timeline. After a failover, a standby left behind on the old timeline
//!   (one that had replayed further than the promoted one, and cannot follow
//!   it) reads as caught up with the new primary's positions below its own:
//!   take it out of the replica pool, as the failover note below says of reads
//!   without a position, and never point the pool at another cluster's
//!   standby.
//! * The token comes from the client, so a client can forge it. A position from
//!   the past reads that client's stale data, which it could read anyway; a
//!   position far ahead makes its reads wait the policy's full wait (then the
//!   primary, or [`Error::ReplicaBehind`](crate::Error::ReplicaBehind)). Keep
//!   the waits short, or sign the token if that matters.
//! * After a failover, the new primary's positions continue from where the
//!   standby stood: a token of a write the old primary never shipped waits, then
//!   goes to the primary, as a lagging replica would. A read with a position
//!   never reads a replica that is not in recovery
//!   ([`Route::PrimaryNotAStandby`]); a read without one goes to the replica pool
//!   without a question (no statement more per read), so take a promoted
//!   standby out of the replica pool when you fail over.
//! * [`Policy::Primary`]'s window is the token's lifetime, which the app sets
//!   (a cookie's `Max-Age`): lockkit keeps no clock.
//! * The look and the read must reach the same standby: each read is routed
//!   by asking its own connection how far that server has replayed. A replica
//!   URL behind a pooler that spreads one client connection's statements over
//!   several standbys (PgBouncer in transaction mode over several hosts,
//!   Pgpool-II's statement-level load balancing) can send the read to a
//!   standby the look never asked. Point the replica pool at standbys
//!   directly, or at a pooler in session mode.
//! * A connection Diesel marked broken (a call dropped in a transaction
//!   there) is refused with `BrokenTransactionManager` where the route looks
//!   at the replica (a read with a position to see): the transaction it
//!   left may still be open on the server, and a read there would see that
//!   transaction's old snapshot, whatever the look found.

#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub mod asynchronous;
mod position;
mod route;
#[cfg(feature = "r2d2")]
mod router;

pub use crate::lsn::{Lsn, ParseLsnError};
pub use position::{commit_lsn, replayed_lsn};
pub use route::{route, Policy, Route};
#[cfg(feature = "r2d2")]
#[cfg_attr(docsrs, doc(cfg(feature = "r2d2")))]
pub use router::{PgPool, PgPooled, RoutedConnection, Router};
