//! Multi-row orders, `Item::lock_all`: one statement that locks the rows in key
//! order, so no cycle of waits can form.

/// Writes `lock_all` into one `bench_backend!` instantiation, where `Conn` is
/// its connection type and `$locks` says whether the backend has row locks.
macro_rules! lock_all_ops {
    ($locks:tt) => {
        /// `Item::lock_all` (one statement, key order) in `locked_transaction`.
        fn lock_all(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            order(conn, st, |conn, ids| Item::lock_all(conn, ids))
        }
    };
}
pub(crate) use lock_all_ops;
