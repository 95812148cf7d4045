//! The error type of the job queue.

use crate::Backend;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum JobQueueError {
    /// A bad option or configuration.
    #[error("{0}")]
    Usage(String),

    /// The URL names a backend this build has no cargo feature for.
    #[error("this build of job_queue has no {0} support (enable the `{0}` feature)")]
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

    /// A database error, classified by lockkit: a worker that waited longer than
    /// the lock timeout fails with `lockkit::Error::LockTimeout` here.
    #[error(transparent)]
    Database(#[from] lockkit::Error),

    /// A worker thread panicked.
    #[error("a worker thread panicked")]
    WorkerPanicked,
}

impl From<diesel::result::Error> for JobQueueError {
    fn from(err: diesel::result::Error) -> Self {
        JobQueueError::Database(err.into())
    }
}
