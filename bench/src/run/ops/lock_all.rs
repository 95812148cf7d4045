//! Multi-row orders, `Item::lock_all`: one statement that locks the rows in key
//! order, so no cycle of waits can form.

/// Writes `lock_all` into one `bench_backend!` instantiation, where `Conn` is
/// its connection type and `$locks` says whether the backend has row locks.
macro_rules! lock_all_ops {
    ($locks:tt) => {
        /// `Item::lock_all` (one statement, key order) in `locked_transaction`.
        fn lock_all(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            let ids = basket(st);
            let policy = st.policy.clone();
            lockkit::retry(&policy, |_| {
                attempt(st, |_| {
                    lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                        let rows = Item::lock_all(conn, &ids)?;
                        for row in &rows {
                            diesel::update(items::table.find(row.id))
                                .set(items::stock.eq(row.stock - 1))
                                .execute(conn)?;
                        }
                        Ok(())
                    })
                })
            })?;
            Ok(ids.len())
        }
    };
}
pub(crate) use lock_all_ops;
