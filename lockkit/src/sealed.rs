//! The private supertrait that seals lockkit's backend traits
//! ([`bounds`](crate::bounds)): each one's impls are lockkit's own SQL for a
//! backend, so no other crate can add one, and lockkit can add methods to them
//! without a breaking release.

/// Implemented for the backends and connections of the enabled features.
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
#[cfg(all(feature = "async", feature = "postgres"))]
impl Sealed for diesel_async::AsyncPgConnection {}
#[cfg(all(feature = "async", feature = "mysql"))]
impl Sealed for diesel_async::AsyncMysqlConnection {}
#[cfg(all(feature = "async", feature = "sqlite"))]
impl Sealed
    for diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
{
}
