//! Hot row, naive: read, then write what was read minus one. Plain Diesel; it
//! loses updates, and the check counts them.

/// Writes `naive` into one `bench_backend!` instantiation, where `Conn` is its
/// connection type and `$locks` says whether the backend has row locks.
macro_rules! naive_ops {
    ($locks:tt) => {
        /// Read, then write what was read minus one: loses updates.
        fn naive(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let stock: i32 = items::table
                .find(HOT_ID)
                .select(items::stock)
                .get_result(conn)?;
            diesel::update(items::table.find(HOT_ID))
                .set(items::stock.eq(stock - 1))
                .execute(conn)?;
            Ok(1)
        }
    };
}
pub(crate) use naive_ops;
