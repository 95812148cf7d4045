//! Hot row, `atomic::update_if`: one conditional `UPDATE`, no transaction; and
//! the same statement by hand.

use crate::run::worker::OpError;

/// The hand-written sale's row-count check: one row, or sold out.
pub fn sold(rows: usize) -> Result<usize, OpError> {
    match rows {
        0 => Err(OpError::Other("sold out".into())),
        _ => Ok(1),
    }
}

/// Writes `atomic` and `atomic_hand` into one `bench_backend!` instantiation,
/// where `Conn` is its connection type and `$locks` says whether the backend
/// has row locks.
macro_rules! atomic_ops {
    ($locks:tt) => {
        /// `atomic::update_if` of `atomic::update`: `UPDATE .. SET stock = stock - 1 WHERE id = ? AND stock >= 1`,
        /// prepared once per connection.
        fn atomic(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            attempt(st, |_| {
                lockkit::atomic::update_if(
                    conn,
                    super::statements::sell_if_stocked_prepared(HOT_ID, 1),
                )
            })?;
            Ok(1)
        }

        /// The same statement by hand, with its own row-count check.
        fn atomic_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let rows = super::statements::sell_if_stocked(HOT_ID, 1).execute(conn)?;
            super::atomic::sold(rows)
        }
    };
}
pub(crate) use atomic_ops;
