//! Queue drain, `queue::claim`: `LIMIT n FOR UPDATE SKIP LOCKED` in a
//! transaction, each claimed job marked done by key; and the same by hand.

/// Writes `claim` and `claim_hand` into one `bench_backend!` instantiation,
/// where `Conn` is its connection type and `$locks` says whether the backend
/// has row locks.
macro_rules! claim_ops {
    ($locks:tt) => {
        /// `queue::claim` in `locked_transaction`; mark each job done by key.
        fn claim(conn: &mut Conn, batch: i64, st: &mut WorkerState) -> Result<usize, OpError> {
            let ids = attempt(st, |_| {
                lockkit::locked_transaction(conn, LockOptions::default(), |conn| {
                    let ids: Vec<i32> =
                        lockkit::queue::claim(conn, super::statements::pending_jobs(), batch)?;
                    // One row by primary key at a time: MySQL may scan and
                    // lock other workers' rows for `WHERE id IN (..)`. With
                    // `diesel::update`, as the README's queue does and as the
                    // hand-written twin does: the pair measures `claim`.
                    for id in &ids {
                        super::statements::mark_done(*id).execute(conn)?;
                    }
                    Ok(ids)
                })
            })?;
            st.claimed.extend_from_slice(&ids);
            Ok(ids.len())
        }

        /// The same by hand: `LIMIT n FOR UPDATE SKIP LOCKED` in a transaction.
        fn claim_hand(conn: &mut Conn, batch: i64, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let ids = write_transaction!($locks, conn, |conn: &mut Conn| {
                let ids: Vec<i32> =
                    skip_locked!($locks, super::statements::pending_jobs().limit(batch))
                        .load(conn)?;
                for id in &ids {
                    super::statements::mark_done(*id).execute(conn)?;
                }
                Ok::<_, diesel::result::Error>(ids)
            })?;
            st.claimed.extend_from_slice(&ids);
            Ok(ids.len())
        }
    };
}
pub(crate) use claim_ops;
