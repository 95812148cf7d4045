//! The two positions read-your-writes compares: where a write's commit ended on
//! the primary, and how far a standby has replayed.

use diesel::sql_types::{Nullable, Text};
use diesel::{PgConnection, RunQueryDsl};

use super::Lsn;
use crate::error::{Error, Result};
use crate::transaction::refuse_transaction_or_broken;

/// The statement of [`commit_lsn`]; the async twin sends the same text.
pub(crate) const COMMIT_LSN: &str = "SELECT pg_current_wal_insert_lsn()::text AS lsn";

/// The statement of [`replayed_lsn`]; the async twin sends the same text.
/// `pg_last_wal_replay_lsn` alone stays at the last position replayed once
/// recovery ended (a promoted standby, a primary after crash recovery): only a
/// server in recovery is a standby.
pub(crate) const REPLAYED_LSN: &str =
    "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END AS lsn";

/// A WAL position as the server prints it; `NULL` where the server has none.
#[derive(diesel::QueryableByName)]
pub(crate) struct Position {
    #[diesel(sql_type = Nullable<Text>)]
    lsn: Option<String>,
}

impl Position {
    /// The answer to [`COMMIT_LSN`]: never `NULL` on a primary, and a `NULL`
    /// must not become `0/0`, which every replica has replayed.
    pub(crate) fn committed(self) -> Result<Lsn> {
        let text = self.lsn.ok_or_else(|| {
            Error::Database(diesel::result::Error::DeserializationError(
                "the primary returned no WAL position".into(),
            ))
        })?;
        parse(&text)
    }

    /// The answer to [`REPLAYED_LSN`]: `None` when the server is not a standby.
    pub(crate) fn replayed(self) -> Result<Option<Lsn>> {
        self.lsn.as_deref().map(parse).transpose()
    }
}

/// The position on the primary a replica must have replayed to show everything
/// committed on `primary` so far: call it right after the write's transaction
/// committed, and carry the result to the next read (see the [module](super)).
///
/// ```sql
/// SELECT pg_current_wal_insert_lsn()::text AS lsn
/// ```
///
/// The WAL's insert position is past every record inserted so far, the commit's
/// included, however the commit was made. The write position
/// (`pg_current_wal_lsn()`) is not: a commit made with `synchronous_commit =
/// off` (also a `SET LOCAL` of it in the write's own transaction, undone by the
/// time this runs) may still be in the WAL buffers. The insert position can
/// stand a few bytes past the last record (a page header), which a standby
/// reaches with the next WAL written on the primary: a read may wait longer,
/// never see less.
///
/// # Errors
///
/// * [`Error::AlreadyInTransaction`] when a transaction is open on `primary`: the
///   write has not committed yet, and a reader could wait for a position that
///   the rollback makes meaningless.
/// * [`Error::Database`]`(BrokenTransactionManager)` on a connection Diesel
///   marked broken: the transaction a dropped call left may still be open.
/// * [`Error::Database`] when `primary` is a standby itself (PostgreSQL:
///   "recovery is in progress").
pub fn commit_lsn(primary: &mut PgConnection) -> Result<Lsn> {
    refuse_transaction_or_broken(primary)?;
    diesel::sql_query(COMMIT_LSN)
        .get_result::<Position>(primary)?
        .committed()
}

/// Whether another connection may read the position of a write whose own
/// connection failed with `err`: not where a transaction is still open on it
/// (the write, inside a test transaction or the caller's, has not committed).
pub(crate) fn committed_elsewhere(err: &Error) -> bool {
    !matches!(err, Error::AlreadyInTransaction)
}

/// The position of a write that committed on a connection that could not
/// read it (`first`: why), read on another connection to the primary by
/// `other` (blocking and async routers): any position read after the `COMMIT`
/// covers it. Where that fails too, `first`, logged with the second.
pub(crate) fn read_elsewhere(first: Error, other: impl FnOnce() -> Result<Lsn>) -> Result<Lsn> {
    other().map_err(|second| {
        tracing::warn!(target: "lockkit", error = %crate::error::Chain(&first), other = %crate::error::Chain(&second),
            "the write committed, but no connection to the primary read its position");
        first
    })
}

/// How far `replica` has replayed the primary's WAL: its writes up to this
/// position are visible on it. `None` when `replica` is not a standby (not in
/// recovery: a primary, or a standby that was promoted).
///
/// ```sql
/// SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END AS lsn
/// ```
///
/// [`route`](super::route()) compares the two for you, waiting as its
/// [`Policy`](super::Policy) allows; by hand, to watch a standby's lag:
///
/// ```no_run
/// use diesel::prelude::*;
/// use lockkit::replica;
///
/// let mut primary = PgConnection::establish("postgres://app@primary/shop").unwrap();
/// let mut standby = PgConnection::establish("postgres://app@replica/shop").unwrap();
/// let written = replica::commit_lsn(&mut primary).unwrap();
/// match replica::replayed_lsn(&mut standby).unwrap() {
///     Some(replayed) if replayed >= written => println!("the standby shows every commit so far"),
///     Some(replayed) => println!("{} bytes of WAL behind", u64::from(written) - u64::from(replayed)),
///     None => println!("not a standby (a primary, or promoted)"),
/// }
/// ```
pub fn replayed_lsn(replica: &mut PgConnection) -> Result<Option<Lsn>> {
    diesel::sql_query(REPLAYED_LSN)
        .get_result::<Position>(replica)?
        .replayed()
}

/// The server's text of a `pg_lsn`, which always parses; if a server ever sent
/// something else, it is reported as the database's error it is.
fn parse(text: &str) -> Result<Lsn> {
    text.parse()
        .map_err(|e| Error::Database(diesel::result::Error::DeserializationError(Box::new(e))))
}
