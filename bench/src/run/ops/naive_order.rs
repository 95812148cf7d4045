//! Multi-row orders, row by row + retry: `FOR UPDATE` one row at a time in the
//! buyer's order; two buyers can deadlock, and `lockkit::retry` runs the loser
//! again.

/// Writes `naive_order` into one `bench_backend!` instantiation, where `Conn`
/// is its connection type and `$locks` says whether the backend has row locks.
macro_rules! naive_order_ops {
    ($locks:tt) => {
        /// `FOR UPDATE` one row at a time, in the buyer's order: deadlocks,
        /// retried by `lockkit::retry`.
        fn naive_order(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            order(conn, st, |conn, ids| {
                let mut rows = Vec::with_capacity(ids.len());
                for id in ids {
                    let row: Item =
                        for_update!($locks, items::table.find(id).select(Item::as_select()))
                            .get_result(conn)?;
                    rows.push(row);
                }
                Ok(rows)
            })
        }
    };
}
pub(crate) use naive_order_ops;
