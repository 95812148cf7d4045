//! The mark of a versioned write made in a transaction on a connection
//! lockkit cannot watch ([`journal`](crate::journal)): what the connection
//! keeps in that transaction, per backend
//! ([`OptimisticBackend::mark`](crate::optimistic::backend::OptimisticBackend::mark)),
//! so that a rollback lockkit does not see takes it with the write.

use std::sync::LazyLock;

/// A versioned write made in a transaction on a connection lockkit cannot
/// watch: its caller marks it in the same transaction (or savepoint) with
/// [`OptimisticBackend::mark`](crate::optimistic::backend::OptimisticBackend::mark),
/// so that the mark stands exactly as long as the write does. A rollback
/// lockkit does not see takes the mark with the write; a commit keeps both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a write on an unwatched connection is marked in its transaction"]
#[doc(hidden)]
pub struct Mark {
    /// The write's entry in the record: unique in the process, so that no
    /// other write's mark can be taken for it.
    pub id: i64,
    /// Where the connection keeps it (MySQL/MariaDB, SQLite: the row of
    /// `lockkit_marks`), one of [`Mark::KEPT`], taken in turn by the marks made
    /// through one connection: a mark is overwritten by the `KEPT`th after it.
    pub slot: u32,
}

impl Mark {
    /// How many marks a connection keeps: its latest. A write whose mark was
    /// overwritten since is taken for rolled back, the safe side (its struct
    /// may be reported stale), so this bounds what a connection holds without
    /// touching any transaction of fewer versioned writes.
    pub const KEPT: u32 = 1024;

    /// What the connection keeps: the entry's number offset by a random number
    /// of the process, so that a server session a pooler hands from one
    /// process to another (PgBouncer's transaction pooling) never shows one
    /// process's mark as another's.
    pub fn token(&self) -> i64 {
        static OFFSET: LazyLock<i64> = LazyLock::new(|| fastrand::i64(..));
        self.id.wrapping_add(*OFFSET)
    }
}
