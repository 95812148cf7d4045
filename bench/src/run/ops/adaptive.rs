//! Hot row and own rows, adaptive: `AdaptivePolicy::update`, which reads the
//! row, decrements it and writes it version-checked, optimistically while the
//! row is calm and under `FOR UPDATE` while it is hot. No hand-written twin: it
//! is measured against the fixed strategies (optimistic + retry, with_lock).

/// Writes `adaptive` into one `bench_backend!` instantiation, where `Conn` is
/// its connection type.
macro_rules! adaptive_ops {
    ($locks:tt) => {
        /// `st.adaptive.update(conn, id, |item| item.stock -= 1)`, the policy
        /// shared by the run's workers.
        fn adaptive(conn: &mut Conn, st: &mut WorkerState, id: i32) -> Result<usize, OpError> {
            let policy = std::sync::Arc::clone(&st.adaptive);
            attempt(st, |_| {
                policy.update(conn, id, |item: &mut Item| {
                    item.stock -= 1;
                    Ok::<_, lockkit::Error>(())
                })
            })?;
            Ok(1)
        }
    };
}
pub(crate) use adaptive_ops;
