//! Hot row (and own rows), `with_lock`: `SELECT .. FOR UPDATE`, write, commit; and the same
//! transaction by hand. The write is user code, the same on both sides: the
//! `diesel::update` users write in the closure ([`set_stock`](super::statements::set_stock)).

/// Writes `with_lock` and `with_lock_hand` into one `bench_backend!`
/// instantiation, where `Conn` is its connection type and `$locks` says whether
/// the backend has row locks.
macro_rules! with_lock_ops {
    ($locks:tt) => {
        /// `lockkit::with_lock`: `SELECT .. FOR UPDATE`, write, commit.
        fn with_lock(conn: &mut Conn, st: &mut WorkerState, id: i32) -> Result<usize, OpError> {
            attempt(st, |_| {
                lockkit::with_lock(conn, id, LockOptions::default(), |conn, item: Item| {
                    super::statements::set_stock(item.id, item.stock - 1).execute(conn)?;
                    Ok::<_, lockkit::Error>(())
                })
            })?;
            Ok(1)
        }

        /// The same by hand: a transaction, `SELECT .. FOR UPDATE`, write.
        fn with_lock_hand(
            conn: &mut Conn,
            st: &mut WorkerState,
            id: i32,
        ) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            write_transaction!($locks, conn, |conn: &mut Conn| {
                let item: Item =
                    for_update!($locks, items::table.find(id).select(Item::as_select()))
                        .get_result(conn)?;
                super::statements::set_stock(item.id, item.stock - 1).execute(conn)?;
                Ok::<_, diesel::result::Error>(())
            })?;
            Ok(1)
        }
    };
}
pub(crate) use with_lock_ops;
