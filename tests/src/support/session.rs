//! Session settings: what every connection of a program runs once it is open.

use diesel::r2d2::{CustomizeConnection, R2D2Connection};
use diesel::QueryResult;

/// SQLite: writers queue for up to 10 s instead of failing at once with
/// `SQLITE_BUSY`, WAL lets readers run while one connection writes, and foreign
/// keys are checked.
#[cfg(feature = "sqlite")]
pub fn sqlite_session_settings(conn: &mut diesel::SqliteConnection) -> QueryResult<()> {
    use diesel::connection::SimpleConnection;
    conn.batch_execute(
        "PRAGMA busy_timeout = 10000; PRAGMA journal_mode = WAL; \
         PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;",
    )
}

/// An r2d2 connection customizer that applies the session settings to every
/// connection the pool opens:
/// `Pool::builder().connection_customizer(Box::new(SessionSettings(settings)))`.
pub struct SessionSettings<C>(pub fn(&mut C) -> QueryResult<()>);

impl<C> std::fmt::Debug for SessionSettings<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SessionSettings").finish_non_exhaustive()
    }
}

impl<C: R2D2Connection + 'static> CustomizeConnection<C, diesel::r2d2::Error>
    for SessionSettings<C>
{
    fn on_acquire(&self, conn: &mut C) -> Result<(), diesel::r2d2::Error> {
        (self.0)(conn).map_err(diesel::r2d2::Error::QueryError)
    }
}
