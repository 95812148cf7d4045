//! The error type of the example programs.

use super::Backend;

/// Why an example program stopped: a bad option, a database it could not set
/// up, or an error its strategy could not handle.
///
/// The examples name it after themselves (`shop::ShopError`,
/// `job_queue::JobQueueError`, `http_api::SetupError`).
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// A bad option or configuration.
    #[error("{0}")]
    Usage(String),

    /// The URL names a backend this build has no cargo feature for.
    #[error("this build has no {0} support (enable the `{0}` feature)")]
    Unsupported(Backend),

    /// The database could not be reached.
    #[error("cannot connect: {0}")]
    Connection(#[from] diesel::ConnectionError),

    /// The connection pool could not be built or gave no connection.
    #[error("connection pool: {0}")]
    Pool(#[from] diesel::r2d2::PoolError),

    /// Applying the embedded migrations failed.
    #[error("migrations: {0}")]
    Migration(String),

    /// A database error that the program could not handle, classified by
    /// lockkit: for example `lockkit::Error::LockTimeout` for a worker that
    /// waited longer than its lock timeout.
    #[error(transparent)]
    Database(#[from] lockkit::Error),

    /// A thread of the program panicked; the text says which kind (`buyer`,
    /// `worker`).
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
}

impl From<diesel::result::Error> for ProgramError {
    fn from(err: diesel::result::Error) -> Self {
        ProgramError::Database(err.into())
    }
}
