//! The private supertrait that seals lockkit's backend traits
//! ([`bounds`](crate::bounds)) and the lock-clause types
//! ([`LockClause`](crate::pessimistic::row_lock::LockClause)): each one's impls
//! are lockkit's own SQL for a backend or a clause, so no other crate can add
//! one, and lockkit can add methods to them without a breaking release. And
//! [`every_connection!`], the list of the blocking connections that the bound
//! traits implemented once per connection type with the same body
//! (`CurrentVersionQuery`, `CurrentValues`) are written for.

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

/// An r2d2 pooled connection (feature `r2d2`) to `C`.
#[cfg(feature = "r2d2")]
#[allow(unused)] // without a backend feature
pub(crate) type Pooled<C> = diesel::r2d2::PooledConnection<diesel::r2d2::ConnectionManager<C>>;

/// Calls `$impls!` with each blocking connection of the enabled backend
/// features, `connection: cfg` (`diesel::PgConnection: feature = "postgres"`,
/// ..), and again with the r2d2 pooled connections to them (feature `r2d2`):
/// for the bound traits implemented once per connection, whose bounds name
/// the connection (a `MultiConnection` enum's impls are `multi.rs`'s).
macro_rules! every_connection {
    ($impls:ident) => {
        $impls!(
            diesel::PgConnection: feature = "postgres",
            diesel::MysqlConnection: feature = "mysql",
            diesel::SqliteConnection: feature = "sqlite",
        );
        #[cfg(feature = "r2d2")]
        $impls!(
            $crate::sealed::Pooled<diesel::PgConnection>: feature = "postgres",
            $crate::sealed::Pooled<diesel::MysqlConnection>: feature = "mysql",
            $crate::sealed::Pooled<diesel::SqliteConnection>: feature = "sqlite",
        );
    };
}
pub(crate) use every_connection;
