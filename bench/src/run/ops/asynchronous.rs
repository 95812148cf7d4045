//! The diesel-async operations: the blocking ones' statements
//! (`statements.rs`), awaited on `AsyncPgConnection`,
//! `AsyncMysqlConnection` and `SyncConnectionWrapper<SqliteConnection>`. Written
//! once as `async_backend!`, which `bench_backend!` expands for each backend's
//! async connection; the blocking connection of the same backend
//! ([`AsyncBenchConnection::Blocking`]) resets and tallies the tables.
//!
//! | case | lockkit | hand-written diesel-async |
//! | --- | --- | --- |
//! | uncontended | `AsyncVersioned::update_versioned` | the versioned `UPDATE`, its own row-count check |
//! | hot row, `with_lock` | `lockkit::asynchronous::with_lock` | `transaction`: `SELECT .. FOR UPDATE`, `UPDATE` |
//! | hot row, atomic | `lockkit::asynchronous::atomic::update_if` | the conditional `UPDATE`, its own row-count check |
//! | queue | `lockkit::asynchronous::queue::claim` in `locked_transaction` | `transaction`: `.limit(n).for_update().skip_locked()` |
//!
//! SQLite has no row locks: there the hand-written transactions are diesel-async's
//! `immediate_transaction` (`BEGIN IMMEDIATE`), as lockkit's are.

use std::future::Future;

use diesel::QueryResult;
use diesel_async::pooled_connection::{ManagerConfig, PoolableConnection};

use super::BenchConnection;
use crate::run::worker::{OpError, WorkerState};
use crate::vocabulary::Case;

/// A diesel-async connection type the benchmark runs on; implemented by
/// `async_backend!`.
pub trait AsyncBenchConnection: PoolableConnection + Send + 'static {
    /// The blocking connection of the same backend.
    type Blocking: BenchConnection;
    /// Its bb8 manager (diesel-async's).
    type Manager: bb8::ManageConnection<Connection = Self>;

    /// The manager of connections to `url`, set up by `config`.
    fn manager(url: &str, config: ManagerConfig<Self>) -> Self::Manager;

    /// Per-worker setup before the start line (loads the worker's own row).
    fn prepare_worker<'a>(
        &'a mut self,
        case: &'a Case,
        st: &'a mut WorkerState,
    ) -> impl Future<Output = QueryResult<()>> + Send + 'a;

    /// One operation of `case`: units completed, as the blocking
    /// [`BenchConnection::op`].
    fn op<'a>(
        &'a mut self,
        case: &'a Case,
        st: &'a mut WorkerState,
    ) -> impl Future<Output = Result<usize, OpError>> + Send + 'a;
}

/// Writes the diesel-async operations for one connection type, in a module
/// `asynchronous` of the backend's `bench_backend!` instantiation (which names
/// the connection, its blocking twin and whether the backend has row locks).
macro_rules! async_backend {
    (connection: $conn:ty, blocking: $blocking:ty, row_locks: $locks:tt) => {
        /// The diesel-async operations on this backend.
        mod asynchronous {
            use diesel::{QueryDsl, SelectableHelper};
            // `transaction` (SQLite's `immediate_transaction` is inherent).
            #[allow(unused_imports)]
            use diesel_async::AsyncConnection;
            use diesel_async::RunQueryDsl;
            use lockkit::asynchronous::AsyncVersioned;
            use lockkit::LockOptions;

            use crate::run::ops::asynchronous::AsyncBenchConnection;
            use crate::run::ops::statements;
            use crate::run::ops::versioned::hand_update;
            use crate::run::worker::{OpError, WorkerState};
            use crate::vocabulary::schema::{items, Item};
            use crate::vocabulary::{Case, Flavor, Strategy, Workload, HOT_ID, OWN_BASE};

            /// The connection type of this instantiation.
            type Conn = $conn;

            impl AsyncBenchConnection for Conn {
                type Blocking = $blocking;
                type Manager = diesel_async::pooled_connection::AsyncDieselConnectionManager<Conn>;

                fn manager(
                    url: &str,
                    config: diesel_async::pooled_connection::ManagerConfig<Conn>,
                ) -> Self::Manager {
                    Self::Manager::new_with_config(url, config)
                }

                async fn prepare_worker(
                    &mut self,
                    case: &Case,
                    st: &mut WorkerState,
                ) -> diesel::QueryResult<()> {
                    if case.workload == Workload::Uncontended {
                        let id = OWN_BASE + st.index as i32;
                        st.own = Some(
                            items::table
                                .find(id)
                                .select(Item::as_select())
                                .get_result(self)
                                .await?,
                        );
                    }
                    Ok(())
                }

                async fn op(
                    &mut self,
                    case: &Case,
                    st: &mut WorkerState,
                ) -> Result<usize, OpError> {
                    match (case.strategy, case.flavor) {
                        (Strategy::Versioned, Flavor::Lockkit) => versioned(self, st).await,
                        (Strategy::Versioned, Flavor::Hand) => versioned_hand(self, st).await,
                        (Strategy::WithLock, Flavor::Lockkit) => with_lock(self, st).await,
                        (Strategy::WithLock, Flavor::Hand) => with_lock_hand(self, st).await,
                        (Strategy::Atomic, Flavor::Lockkit) => atomic(self, st).await,
                        (Strategy::Atomic, Flavor::Hand) => atomic_hand(self, st).await,
                        (Strategy::Claim, Flavor::Lockkit) => claim(self, case.batch, st).await,
                        (Strategy::Claim, Flavor::Hand) => claim_hand(self, case.batch, st).await,
                        _ => Err(OpError::Other(format!(
                            "no diesel-async operation for {}",
                            case.label()
                        ))),
                    }
                }
            }

            /// `AsyncVersioned::update_versioned` on the worker's own row.
            async fn versioned(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let item = st.own.as_mut().expect("own row loaded");
                item.stock -= 1;
                if let Err(err) = AsyncVersioned::update_versioned(item, conn).await {
                    item.stock += 1;
                    st.counts.saw(&err);
                    return Err(OpError::Lockkit(err));
                }
                Ok(1)
            }

            /// The same statement by hand, with its own row-count check.
            async fn versioned_hand(
                conn: &mut Conn,
                st: &mut WorkerState,
            ) -> Result<usize, OpError> {
                hand_update!(st, statements::versioned_write, |w| w.execute(conn).await)
            }

            /// `lockkit::asynchronous::with_lock` on the hot row: `SELECT .. FOR
            /// UPDATE`, write (the closure's `diesel::update`, as the hand-written
            /// twin's), commit.
            async fn with_lock(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let result = lockkit::asynchronous::with_lock(
                    conn,
                    HOT_ID,
                    LockOptions::default(),
                    async |conn: &mut Conn, item: Item| {
                        statements::set_stock(item.id, item.stock - 1)
                            .execute(conn)
                            .await?;
                        Ok::<_, lockkit::Error>(())
                    },
                )
                .await;
                st.counted(result)?;
                Ok(1)
            }

            /// The same by hand: a transaction, `SELECT .. FOR UPDATE`, write.
            async fn with_lock_hand(
                conn: &mut Conn,
                st: &mut WorkerState,
            ) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                write_transaction!($locks, conn, async |conn: &mut Conn| {
                    let item: Item =
                        for_update!($locks, items::table.find(HOT_ID).select(Item::as_select()))
                            .get_result(conn)
                            .await?;
                    statements::set_stock(item.id, item.stock - 1)
                        .execute(conn)
                        .await?;
                    Ok::<_, diesel::result::Error>(())
                })
                .await?;
                Ok(1)
            }

            /// `lockkit::asynchronous::atomic::update_if`: `UPDATE .. SET stock =
            /// stock - 1 WHERE id = ? AND stock >= 1`.
            async fn atomic(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                let result = lockkit::asynchronous::atomic::update_if(
                    conn,
                    statements::sell_if_stocked_prepared(HOT_ID, 1),
                )
                .await;
                st.counted(result)?;
                Ok(1)
            }

            /// The conditional `UPDATE` by hand, with its own row-count check.
            async fn atomic_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let rows = statements::sell_if_stocked(HOT_ID, 1).execute(conn).await?;
                crate::run::ops::atomic::sold(rows)
            }

            /// `lockkit::asynchronous::queue::claim` in `locked_transaction`;
            /// mark each job done by key.
            async fn claim(
                conn: &mut Conn,
                batch: i64,
                st: &mut WorkerState,
            ) -> Result<usize, OpError> {
                let result = lockkit::asynchronous::locked_transaction(
                    conn,
                    LockOptions::default(),
                    async |conn: &mut Conn| {
                        let ids: Vec<i32> = lockkit::asynchronous::queue::claim(
                            conn,
                            statements::pending_jobs(),
                            batch,
                        )
                        .await?;
                        for id in &ids {
                            statements::mark_done(*id).execute(conn).await?;
                        }
                        Ok::<_, lockkit::Error>(ids)
                    },
                )
                .await;
                let ids = st.counted(result)?;
                st.claimed.extend_from_slice(&ids);
                Ok(ids.len())
            }

            /// The same by hand: `LIMIT n FOR UPDATE SKIP LOCKED` in a transaction.
            async fn claim_hand(
                conn: &mut Conn,
                batch: i64,
                st: &mut WorkerState,
            ) -> Result<usize, OpError> {
                st.counts.attempts += 1;
                let ids = write_transaction!($locks, conn, async |conn: &mut Conn| {
                    let ids: Vec<i32> =
                        skip_locked!($locks, statements::pending_jobs().limit(batch))
                            .load(conn)
                            .await?;
                    for id in &ids {
                        statements::mark_done(*id).execute(conn).await?;
                    }
                    Ok::<_, diesel::result::Error>(ids)
                })
                .await?;
                st.claimed.extend_from_slice(&ids);
                Ok(ids.len())
            }
        }
    };
}
pub(crate) use async_backend;
