//! The example's error type.

use crate::Backend;

/// What can go wrong in the example's processes.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// lockkit's error (the outbox, the inbox, the relay's transaction).
    #[error(transparent)]
    Lockkit(#[from] lockkit::Error),
    /// A database error outside lockkit's calls.
    #[error("database: {0}")]
    Database(#[from] diesel::result::Error),
    /// The connection could not be opened.
    #[error("cannot connect: {0}")]
    Connection(#[from] diesel::ConnectionError),
    /// The migrations failed.
    #[error("migrations: {0}")]
    Migration(String),
    /// NATS refused or could not be reached.
    #[error("broker: {0}")]
    Broker(String),
    /// A message no delivery of which can ever be applied: not an order's,
    /// without a usable `Outbox-Id` header, or for an item without stock. The
    /// consumer rejects it (JetStream delivers it no more) and goes on.
    #[error("unusable message {id:?}: {reason}")]
    BadMessage {
        /// Its `Outbox-Id` header.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A backend whose cargo feature is off.
    #[error("{} support is not compiled in: build with `--features {}`", .0.title(), .0.name())]
    Unsupported(Backend),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
}

impl OutboxError {
    /// Whether the same work may succeed when run again: a lockkit error that
    /// other transactions caused ([`lockkit::Error::is_retryable`]: a deadlock,
    /// a lock wait timeout, SQLite's busy database).
    pub fn is_retryable(&self) -> bool {
        matches!(self, OutboxError::Lockkit(err) if err.is_retryable())
    }
}

/// The shared connection code's errors, as this example words them.
impl From<lockkit_tests::support::ProgramError> for OutboxError {
    fn from(err: lockkit_tests::support::ProgramError) -> Self {
        use lockkit_tests::support::ProgramError;
        match err {
            ProgramError::Connection(e) => OutboxError::Connection(e),
            ProgramError::Migration(e) => OutboxError::Migration(e),
            ProgramError::Unsupported(backend) => OutboxError::Unsupported(backend),
            ProgramError::Database(e) => OutboxError::Lockkit(e),
            other => OutboxError::Usage(other.to_string()),
        }
    }
}
