//! The ground floor: what every lockkit transaction does the same way, whatever
//! it locks. Nothing here is public; the strategies above build on it.

mod panic_guard;

use diesel::connection::TransactionManager;
use diesel::Connection;

pub(crate) use panic_guard::PanicGuard;

/// Whether a transaction is open on `conn`, for any connection type (pooled ones
/// included): Diesel's transaction manager knows its depth.
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> bool {
    matches!(
        C::TransactionManager::transaction_manager_status_mut(conn).transaction_depth(),
        Ok(Some(_))
    )
}
