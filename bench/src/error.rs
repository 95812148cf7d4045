//! The error that stops the benchmark.

/// Errors that stop the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A database error outside the measured loop (setup, tally).
    #[error("database error: {0}")]
    Db(#[from] diesel::result::Error),
    /// A connection could not be opened.
    #[error("connection error: {0}")]
    Connection(#[from] diesel::ConnectionError),
    /// The pool failed.
    #[error("pool error: {0}")]
    Pool(String),
    /// A file could not be written, or a program not run.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl From<diesel::r2d2::PoolError> for BenchError {
    fn from(e: diesel::r2d2::PoolError) -> Self {
        BenchError::Pool(e.to_string())
    }
}

impl From<lockkit::Error> for BenchError {
    fn from(e: lockkit::Error) -> Self {
        BenchError::Other(format!("lockkit: {e}"))
    }
}
