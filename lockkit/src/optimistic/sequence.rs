//! The one sequence every versioned write runs, decided here once and without
//! I/O; the blocking writes (`versioned::write`) and the async ones
//! (`asynchronous::versioned`) drive it, each sending the statements it asks
//! for on its own connection.
//!
//! 0. on a connection the journal cannot watch, [`Write::unconfirmed`]: the
//!    server is asked whether the write that gave a held struct its number,
//!    made there in a transaction, still stands (its mark, below), when the
//!    journal cannot tell the open transaction from an earlier one;
//! 1. [`Write::start`]: the [`journal`] says which version to check (the
//!    struct's, or the one before a write of it that was rolled back; a row
//!    just read, [`Origin::Read`], is checked as read), and a
//!    version at its type's maximum is refused before anything is sent;
//! 2. the driver sends the statement ([`Write::statement`]), in a savepoint if
//!    the database does not enforce the declared key ([`Error::AmbiguousKey`]
//!    if it matched several rows), and hands over the rows it matched
//!    ([`Write::wrote`]);
//! 3. one row: the new version is recorded (tentative inside a transaction),
//!    after moving the row past any number a rolled-back write left with
//!    another struct ([`Step::MovePastReused`]); on a connection the journal
//!    cannot watch, the write is marked in its transaction ([`Step::Mark`]);
//! 4. no row: the latest committed version is read ([`Step::ReadCurrent`]),
//!    the row moved past a number a rolled-back write tentatively used
//!    ([`Step::MovePast`]), and the write reported as stale.
//!
//! A statement of the sequence that ends the caller's transaction (on
//! MySQL/MariaDB, a deadlock's victim: the write, but also the follow-up read
//! or a move past) makes the write report [`Error::TransactionAborted`] and
//! open the read-only stand-in, so that the caller's next writes fail instead
//! of committing on their own: the drivers decide it once, as a failed write's
//! error (`transaction::failed_write`).

use std::fmt::Debug;

use crate::error::classification::classify;
use crate::error::{CurrentState, Error, Operation, StaleObjectError};
use crate::optimistic::mark::Mark;
use crate::optimistic::rollbacks::{self, Plan};
use crate::optimistic::version::VersionNumber;
use crate::transaction::journal::{self, Watched};

/// What the sequence knows of a versioned model: the names its reports give,
/// and its key and version types. Every [`Versioned`] model is one
/// (`optimistic::versioned`), so that this file needs none of its traits.
///
/// [`Versioned`]: crate::Versioned
pub(crate) trait Model {
    /// The table's name (`Lockable::TABLE_NAME`).
    const TABLE_NAME: &'static str;
    /// The version column's name.
    const VERSION_COLUMN: &'static str;
    /// The primary key's Rust type, shown in reports.
    type Key: Debug;
    /// The version's Rust type.
    type Version: VersionNumber;
}

/// Where the version a write expects comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// A struct the caller held: it may hold a number a rolled-back write gave
    /// it, which the [`journal`] restores.
    Held,
    /// A number from outside the process (a form's field, an `If-Match`
    /// header; `update_by_version` and its kin): the client read it from a
    /// committed row, so a number a rolled-back write of this process left is
    /// not one it read. The write is refused (`Stale`) where a held struct's
    /// would be restored, and the row moved past the number where it holds it:
    /// a tag naming a number that never committed never writes over the
    /// row's content, nor over another process's commit of that number.
    Outside,
    /// The row, just read from the database (under lock in the open
    /// transaction, or the adaptive policy's optimistic read): the row's own
    /// number, never one a rollback left behind (which another process, unseen
    /// by this one's journal, may have committed since). Restoring it would
    /// write on an older number and find the row past it: a `Stale` for a race
    /// that never happened (under lock, in a transaction that then rolls back,
    /// again on every retry).
    Read,
}

/// How a versioned write ended, when it did not fail.
pub(crate) enum Written<V> {
    /// One row matched; `Some(version)` is the row's new version (`None` for a delete).
    Done(Option<V>),
    /// No row matched (boxed: the report is large, and rare next to `Done`).
    Stale(Box<StaleObjectError>),
}

impl<V> Written<V> {
    /// A stale report names the table as the database names it
    /// (`TableName::qualified`), which the driver asks its connection for.
    #[inline]
    pub(crate) fn named(self, table: impl FnOnce() -> &'static str) -> Self {
        match self {
            Written::Stale(mut stale) => {
                stale.database_table = Some(table());
                Written::Stale(stale)
            }
            done => done,
        }
    }

    /// The version the write left (`None` for a delete), or [`Error::Stale`].
    pub(crate) fn version(self) -> Result<Option<V>, Error> {
        match self {
            Written::Done(next) => Ok(next),
            Written::Stale(stale) => Err((*stale).into()),
        }
    }
}

/// The version a successful write will leave, or [`Error::VersionOverflow`].
pub(crate) fn checked_next<M: Model>(
    key: &M::Key,
    expected: M::Version,
) -> Result<M::Version, Error> {
    expected
        .checked_next()
        .ok_or_else(|| Error::VersionOverflow {
            table: M::TABLE_NAME,
            key: format!("{key:?}"),
            version: expected.to_i64(),
        })
}

/// A versioned statement run where the database does not enforce the key
/// matched `rows` rows: more than one is [`Error::AmbiguousKey`], and the
/// caller undoes the write. Decided here for the blocking and the async writes.
pub(crate) fn at_most_one<M: Model>(key: &M::Key, rows: usize) -> Result<usize, Error> {
    match rows {
        0 | 1 => Ok(rows),
        _ => Err(Error::AmbiguousKey {
            table: M::TABLE_NAME,
            key: format!("{key:?}"),
        }),
    }
}

/// What every step of one write knows: the row, the journal's plan for it, and
/// what the caller expected.
struct Row<'k, M: Model> {
    key: &'k M::Key,
    /// The row's identity for the journal (`CurrentVersionQuery::row_id`).
    id: Option<&'k str>,
    plan: Plan,
    expected: M::Version,
    operation: Operation,
}

/// A versioned write before its statement: the first step of the sequence.
///
/// The steps' methods are `#[inline]`: inlined into each driver, the sequence
/// costs a versioned write about 70 client instructions more than the
/// hand-rolled control flow it replaced (about 120 without the hint), against
/// some 19,000 for the whole call on in-memory SQLite (the benchmark's
/// client-cost profile, under callgrind).
pub(crate) struct Write<'k, M: Model> {
    row: Row<'k, M>,
    /// The version the statement checks: `expected`, or the one the journal
    /// restores.
    checked: M::Version,
    /// The version it leaves; `None` for a delete.
    next: Option<M::Version>,
}

impl<'k, M: Model> Write<'k, M> {
    /// Before [`start`](Self::start): the mark of the write that gave a held
    /// struct its number, when the journal cannot tell whether that write
    /// still stands (made on this connection, which it cannot watch, in a
    /// transaction that may be the open one or an earlier one). The driver
    /// asks the server (`CurrentVersionQuery::mark_stands`) and hands the
    /// answer to [`Write::confirmed`].
    #[inline]
    pub(crate) fn unconfirmed<W: Watched>(
        watched: &mut W,
        id: Option<&str>,
        expected: M::Version,
        origin: Origin,
    ) -> Option<Mark> {
        match origin {
            Origin::Held | Origin::Outside => {
                rollbacks::unconfirmed(watched, M::VERSION_COLUMN, id, expected.to_i64())
            }
            Origin::Read => None,
        }
    }

    /// The server answered whether the mark [`unconfirmed`](Self::unconfirmed)
    /// named stands.
    pub(crate) fn confirmed<W: Watched>(
        watched: &mut W,
        id: Option<&str>,
        mark: Mark,
        stands: bool,
    ) {
        if let Some(id) = id {
            rollbacks::confirmed(watched, M::VERSION_COLUMN, id, mark, stands);
        }
    }

    /// A write of the row `key` (`id` for the journal) from a struct or a
    /// read that holds `expected`: the journal's plan, the version the
    /// statement checks and the one it leaves, or [`Error::VersionOverflow`].
    #[inline]
    pub(crate) fn start<W: Watched>(
        watched: &mut W,
        key: &'k M::Key,
        id: Option<&'k str>,
        expected: M::Version,
        origin: Origin,
        operation: Operation,
    ) -> Result<Self, Error> {
        // If the statement ends the transaction, the write says so.
        journal::before_write(watched);
        let plan = match origin {
            Origin::Held => rollbacks::plan(watched, M::VERSION_COLUMN, id, expected.to_i64()),
            Origin::Outside => {
                match rollbacks::plan(watched, M::VERSION_COLUMN, id, expected.to_i64()) {
                    Plan::Restore { tentative, .. } => Plan::Refuse { tentative },
                    plan => plan,
                }
            }
            Origin::Read => Plan::Write,
        };
        let checked = match plan {
            Plan::Restore { restore, .. } => M::Version::from_i64(restore).unwrap_or(expected),
            Plan::Write | Plan::Refuse { .. } => expected,
        };
        let next = match operation {
            Operation::Delete => None,
            Operation::Update | Operation::Touch => Some(checked_next::<M>(key, checked)?),
        };
        Ok(Write {
            row: Row {
                key,
                id,
                plan,
                expected,
                operation,
            },
            checked,
            next,
        })
    }

    /// What the statement may leave on its row, for a driver that can be
    /// given up on with it in flight ([`Tentative`]); `None` where nothing is
    /// sent, the journal cannot name the row, or the write is a delete (which
    /// the journal records only once it commits).
    #[cfg(feature = "async")]
    pub(crate) fn tentative(&self) -> Option<Tentative> {
        let checked = self.statement()?;
        Some(Tentative {
            column: M::VERSION_COLUMN,
            id: self.row.id?.to_owned(),
            from: checked.to_i64(),
            to: self.next?.to_i64(),
        })
    }

    /// The version the statement is to check, or `None` where the journal
    /// refuses the write: then nothing is sent, and the driver hands over 0
    /// rows.
    #[inline]
    pub(crate) fn statement(&self) -> Option<M::Version> {
        match self.row.plan {
            Plan::Refuse { .. } => None,
            Plan::Write | Plan::Restore { .. } => Some(self.checked),
        }
    }

    /// The statement matched `rows` rows (0 or 1): what comes next.
    #[inline]
    pub(crate) fn wrote<W: Watched>(self, watched: &mut W, rows: usize) -> Step<'k, M> {
        let Write { row, checked, next } = self;
        if rows != 1 {
            return Step::ReadCurrent(ReadCurrent { row });
        }
        match next {
            Some(next) => Step::MovePastReused(
                next,
                MovePastReused {
                    row,
                    then: AfterReused::Done { checked },
                },
            ),
            None => row.done(watched, checked, None),
        }
    }
}

/// A write sent in a transaction whose answer never came: an async write
/// dropped with its statement in flight. PostgreSQL still runs it in the
/// transaction, so a struct read after it may hold the number it left;
/// recorded as if it had matched, so that if the transaction rolls back, that
/// number is never matched again (the journal's rule 3). If it matched nothing,
/// the record only makes a later write of that number move past it, or a
/// struct holding it stale: never a lost update. Not in autocommit: there a
/// record would make the journal forget the numbers below it, as a commit
/// does, for a write that may not have run.
#[cfg(feature = "async")]
pub(crate) struct Tentative {
    column: &'static str,
    id: String,
    from: i64,
    to: i64,
}

#[cfg(feature = "async")]
impl Tentative {
    /// Records the write as done ([`rollbacks::written_unanswered`]). On a
    /// connection no journal watches, the mark that would tell its fate is not
    /// sent: asked later, it is not found, and the write counts as rolled back.
    pub(crate) fn record<W: Watched>(self, watched: &mut W) {
        rollbacks::written_unanswered(watched, self.column, &self.id, self.from, self.to);
    }
}

/// What the sequence asks its driver for next.
pub(crate) enum Step<'k, M: Model> {
    /// Read the row's latest committed version
    /// (`CurrentVersionQuery::load_current_version`) and hand the read, as it
    /// came, to [`ReadCurrent::read`].
    ReadCurrent(ReadCurrent<'k, M>),
    /// Move the row past this version with one statement
    /// (`CurrentVersionQuery::bump_past`) and hand the rows it changed to
    /// [`MovePast::moved`].
    MovePast(M::Version, MovePast<'k, M>),
    /// Move the row on from this version while it is a number a rolled-back
    /// write left with another struct (`move_past_reused`, for
    /// [`MovePastReused::id`] and [`MovePastReused::plan`]), and hand the
    /// version it ends at to [`MovePastReused::moved`].
    MovePastReused(M::Version, MovePastReused<'k, M>),
    /// Mark the write in its transaction (`CurrentVersionQuery::mark`): it
    /// was made on a connection the journal cannot watch. Then it is over.
    Mark(Mark, Written<M::Version>),
    /// The write is over.
    Done(Written<M::Version>),
}

/// Waits for the follow-up read of a write that matched no row.
pub(crate) struct ReadCurrent<'k, M: Model> {
    row: Row<'k, M>,
}

impl<'k, M: Model> ReadCurrent<'k, M> {
    /// The follow-up read returned `read`: the row is stale, unless it must
    /// first be moved past the number a rolled-back write tentatively used
    /// (see [`rollbacks::must_move_past`]). At the version's maximum there is no
    /// number past it: [`Error::VersionOverflow`].
    #[inline]
    pub(crate) fn read<W: Watched>(
        self,
        watched: &mut W,
        read: diesel::QueryResult<Option<M::Version>>,
    ) -> Result<Step<'k, M>, Error> {
        let row = self.row;
        let current = current_state(read, row.expected)?;
        match current {
            CurrentState::Version(v) if rollbacks::must_move_past(row.plan, v) => {
                checked_next::<M>(row.key, row.expected)?;
                Ok(Step::MovePast(row.expected, MovePast { row, from: v }))
            }
            _ => Ok(Step::Done(row.stale(watched, current))),
        }
    }
}

/// Waits for the statement that moves a stale row past a number a rolled-back
/// write tentatively used.
pub(crate) struct MovePast<'k, M: Model> {
    row: Row<'k, M>,
    /// The version the follow-up read found.
    from: i64,
}

impl<'k, M: Model> MovePast<'k, M> {
    /// The statement changed `bumped` rows: the row is at `from + 1` when it
    /// changed it, and then not onto a number another struct's rolled-back
    /// write left.
    #[inline]
    pub(crate) fn moved<W: Watched>(self, watched: &mut W, bumped: usize) -> Step<'k, M> {
        let MovePast { row, from } = self;
        if bumped != 1 {
            return Step::Done(row.stale(watched, CurrentState::Version(from)));
        }
        match M::Version::from_i64(from + 1) {
            Some(at) => Step::MovePastReused(
                at,
                MovePastReused {
                    row,
                    then: AfterReused::Stale { from },
                },
            ),
            None => Step::Done(row.stale(watched, CurrentState::Version(from + 1))),
        }
    }
}

/// Waits for the row to be moved past the numbers rolled-back writes left with
/// other structs.
pub(crate) struct MovePastReused<'k, M: Model> {
    row: Row<'k, M>,
    then: AfterReused<M::Version>,
}

/// What a [`Step::MovePastReused`] ends.
enum AfterReused<V> {
    /// The write, which checked this version.
    Done { checked: V },
    /// The report of a stale write, whose row was moved past its own
    /// rolled-back number from `from`, the version the follow-up read found.
    Stale { from: i64 },
}

impl<'k, M: Model> MovePastReused<'k, M> {
    /// The row's identity for the journal.
    #[inline]
    pub(crate) fn id(&self) -> Option<&'k str> {
        self.row.id
    }

    /// The row ended at `at`.
    #[inline]
    pub(crate) fn moved<W: Watched>(self, watched: &mut W, at: M::Version) -> Step<'k, M> {
        let row = self.row;
        match self.then {
            AfterReused::Done { checked } => row.done(watched, checked, Some(at)),
            AfterReused::Stale { from } => {
                row.moved_past(watched, from, at.to_i64());
                Step::Done(row.stale(watched, CurrentState::Version(at.to_i64())))
            }
        }
    }
}

impl<'k, M: Model> Row<'k, M> {
    /// The write checked `checked` and left `next` on its row: the journal
    /// records it, and on a connection it cannot watch the write is marked
    /// in its transaction ([`Step::Mark`]).
    #[inline]
    fn done<W: Watched>(
        &self,
        watched: &mut W,
        checked: M::Version,
        next: Option<M::Version>,
    ) -> Step<'k, M> {
        let to = next.map(VersionNumber::to_i64);
        match rollbacks::written(watched, M::VERSION_COLUMN, self.id, checked.to_i64(), to) {
            Some(mark) => Step::Mark(mark, Written::Done(next)),
            None => Step::Done(Written::Done(next)),
        }
    }

    /// The row was moved past the struct's rolled-back number, from `from` to
    /// `at`, in a transaction the journal watches: recorded as a write, so
    /// that if the transaction rolls back, a struct read after the move (which
    /// holds `at`, a number only the transaction had) is restored to `from`,
    /// and one written after it is never restored (the journal's rule 3).
    /// Outside a transaction the move committed, and nothing is recorded.
    fn moved_past<W: Watched>(&self, watched: &mut W, from: i64, at: i64) {
        if rollbacks::in_watched_transaction(watched) {
            let _ = rollbacks::written(watched, M::VERSION_COLUMN, self.id, from, Some(at));
        }
    }

    /// The write matched no row, which the follow-up read found at `current`
    /// (after the move past, if any): the journal learns what it can, and the
    /// caller gets the report, counted in the metrics.
    fn stale<W: Watched>(&self, watched: &mut W, current: CurrentState) -> Written<M::Version> {
        rollbacks::found_stale(watched, M::VERSION_COLUMN, self.id, self.plan, current);
        let stale = StaleObjectError {
            table: M::TABLE_NAME,
            // The driver names it ([`Written::named`]): this step knows no backend.
            database_table: None,
            key: format!("{:?}", self.key),
            version_column: M::VERSION_COLUMN,
            operation: self.operation,
            expected_version: self.expected.to_i64(),
            current,
            record: None,
        };
        crate::metrics::record_stale(
            stale.table,
            &stale.key,
            stale.operation,
            stale.expected_version,
            stale.current,
        );
        Written::Stale(Box::new(stale))
    }
}

/// What the follow-up read of a stale write found: the row's version, a version
/// behind the one expected, no row, or a `NULL` version.
fn current_state<V: VersionNumber>(
    read: diesel::QueryResult<Option<V>>,
    expected: V,
) -> Result<CurrentState, Error> {
    Ok(match read {
        Ok(Some(version)) if version.to_i64() < expected.to_i64() => {
            CurrentState::Behind(version.to_i64())
        }
        Ok(Some(version)) => CurrentState::Version(version.to_i64()),
        Ok(None) => CurrentState::Deleted,
        Err(diesel::result::Error::DeserializationError(err))
            if err.is::<diesel::result::UnexpectedNullError>() =>
        {
            CurrentState::NullVersion
        }
        Err(err) => return Err(classify(err)),
    })
}
