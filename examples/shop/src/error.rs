//! The error type of the shop.

use crate::Backend;

/// Everything that can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// A bad option or configuration.
    #[error("{0}")]
    Usage(String),

    /// The URL names a backend this build has no cargo feature for.
    #[error("this build of shop has no {0} support (enable the `{0}` feature)")]
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

    /// A database error that the strategy could not handle (classified by lockkit).
    #[error(transparent)]
    Database(#[from] lockkit::Error),

    /// A buyer thread panicked.
    #[error("a buyer thread panicked")]
    BuyerPanicked,
}

impl From<diesel::result::Error> for ShopError {
    fn from(err: diesel::result::Error) -> Self {
        ShopError::Database(err.into())
    }
}
