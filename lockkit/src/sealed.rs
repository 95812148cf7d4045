//! The private supertrait that seals lockkit's backend traits
//! ([`bounds`](crate::bounds)) and the lock-clause types
//! ([`LockClause`](crate::pessimistic::row_lock::LockClause)): each one's impls
//! are lockkit's own SQL for a backend or a clause, so no other crate can add
//! one, and lockkit can add methods to them without a breaking release.

/// Implemented for the backends and connections of the enabled features, and
/// (in `row_lock`) for the four lock-clause types.
pub trait Sealed {}

#[cfg(feature = "postgres")]
impl Sealed for diesel::pg::Pg {}
#[cfg(feature = "postgres")]
impl Sealed for diesel::PgConnection {}
#[cfg(feature = "mysql")]
impl Sealed for diesel::mysql::Mysql {}
#[cfg(feature = "mysql")]
impl Sealed for diesel::MysqlConnection {}
#[cfg(feature = "sqlite")]
impl Sealed for diesel::sqlite::Sqlite {}
#[cfg(feature = "sqlite")]
impl Sealed for diesel::SqliteConnection {}
/// A pooled connection is sealed where the connection inside is.
#[cfg(feature = "r2d2")]
impl<C> Sealed for diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>> where
    C: Sealed + diesel::r2d2::R2D2Connection + 'static
{
}
#[cfg(all(feature = "async", feature = "postgres"))]
impl Sealed for diesel_async::AsyncPgConnection {}
#[cfg(all(feature = "async", feature = "mysql"))]
impl Sealed for diesel_async::AsyncMysqlConnection {}
#[cfg(all(feature = "async", feature = "sqlite"))]
impl Sealed
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
{
}
