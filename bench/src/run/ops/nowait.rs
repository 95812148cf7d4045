//! Hot row, nowait + retry: `with_lock(.., nowait(), ..)` inside
//! `lockkit::retry`; a held row is `Busy` at once.

/// Writes `nowait` into one `bench_backend!` instantiation, where `Conn` is its
/// connection type and `$locks` says whether the backend has row locks.
macro_rules! nowait_ops {
    ($locks:tt) => {
        /// `with_lock(.., nowait(), ..)` inside `lockkit::retry`.
        fn nowait(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            let policy = st.policy.clone();
            lockkit::retry(&policy, |_| {
                attempt(st, |_| {
                    lockkit::with_lock(
                        conn,
                        HOT_ID,
                        LockOptions::default().nowait(),
                        |conn, item: Item| {
                            diesel::update(items::table.find(item.id))
                                .set(items::stock.eq(item.stock - 1))
                                .execute(conn)?;
                            Ok::<_, lockkit::Error>(())
                        },
                    )
                })
            })?;
            Ok(1)
        }
    };
}
pub(crate) use nowait_ops;
