//! The error that stops the benchmark.

use std::fmt;

/// Errors that stop the benchmark.
#[derive(Debug)]
pub enum BenchError {
    /// A database error outside the measured loop (setup, tally).
    Db(diesel::result::Error),
    /// A connection could not be opened.
    Connection(diesel::ConnectionError),
    /// The pool failed.
    Pool(String),
    /// A file could not be written, or a program not run.
    Io(std::io::Error),
    /// Anything else.
    Other(String),
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Db(e) => write!(f, "database error: {e}"),
            BenchError::Connection(e) => write!(f, "connection error: {e}"),
            BenchError::Pool(e) => write!(f, "pool error: {e}"),
            BenchError::Io(e) => write!(f, "I/O error: {e}"),
            BenchError::Other(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<diesel::result::Error> for BenchError {
    fn from(e: diesel::result::Error) -> Self {
        BenchError::Db(e)
    }
}

impl From<diesel::ConnectionError> for BenchError {
    fn from(e: diesel::ConnectionError) -> Self {
        BenchError::Connection(e)
    }
}

impl From<diesel::r2d2::PoolError> for BenchError {
    fn from(e: diesel::r2d2::PoolError) -> Self {
        BenchError::Pool(e.to_string())
    }
}

impl From<std::io::Error> for BenchError {
    fn from(e: std::io::Error) -> Self {
        BenchError::Io(e)
    }
}

impl From<lockkit::Error> for BenchError {
    fn from(e: lockkit::Error) -> Self {
        BenchError::Other(format!("lockkit: {e}"))
    }
}
