//! Hot row, `atomic::update_if`: one conditional `UPDATE`, no transaction; and
//! the same statement by hand.

/// Writes `atomic` and `atomic_hand` into one `bench_backend!` instantiation,
/// where `Conn` is its connection type and `$locks` says whether the backend
/// has row locks.
macro_rules! atomic_ops {
    ($locks:tt) => {
        /// `atomic::update_if`: `UPDATE .. SET stock = stock - 1 WHERE id = ? AND stock >= 1`.
        fn atomic(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            attempt(st, |_| {
                lockkit::atomic::update_if(
                    conn,
                    diesel::update(items::table.find(HOT_ID).filter(items::stock.ge(1)))
                        .set(items::stock.eq(items::stock - 1)),
                )
            })?;
            Ok(1)
        }

        /// The same statement by hand, with its own row-count check.
        fn atomic_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let rows = diesel::update(items::table.find(HOT_ID).filter(items::stock.ge(1)))
                .set(items::stock.eq(items::stock - 1))
                .execute(conn)?;
            if rows == 0 {
                return Err(OpError::Other("sold out".into()));
            }
            Ok(1)
        }
    };
}
pub(crate) use atomic_ops;
