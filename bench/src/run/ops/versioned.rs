//! Uncontended: `update_versioned` on the worker's own row; the same `UPDATE`
//! by hand, in lockkit's shape (`lock_version = lock_version + 1`) and binding
//! the next version (`lock_version = ?`, as users write it); the same by hand as
//! a statement Diesel may cache ([`CacheableVersionedUpdate`]); and the peer
//! crate `diesel_versioning`.

use diesel::QueryResult;

use crate::run::worker::{OpError, WorkerState};

/// After a hand-written versioned write of the worker's own row, taking one
/// unit: the row-count check, then the row as it now is.
pub fn hand_written(st: &mut WorkerState, rows: usize) -> Result<usize, OpError> {
    if rows != 1 {
        st.counts.stale += 1;
        return Err(OpError::Other("stale write".into()));
    }
    let item = st.own.as_mut().expect("own row loaded");
    item.stock -= 1;
    item.lock_version += 1;
    Ok(1)
}

/// The versioned `UPDATE` as a hand-built statement that Diesel may cache.
///
/// Diesel 2.3 marks every `UpdateStatement` unsafe to cache (a changeset with
/// `Option` fields changes its SQL from call to call), so each hand-written
/// `diesel::update` is prepared anew: SQLite compiles it again, PostgreSQL
/// parses and plans it again (unnamed statement), MySQL spends a prepare round
/// trip on it (lockkit's versioned writes are a statement of its own, which
/// Diesel caches). This fragment renders the same statement with a static query
/// id and no such mark, to measure what caching would save by hand.
#[derive(Debug, Clone, diesel::query_builder::QueryId)]
pub struct CacheableVersionedUpdate {
    /// New name.
    pub name: String,
    /// New stock.
    pub stock: i32,
    /// Primary key.
    pub id: i32,
    /// The version read.
    pub version: i32,
}

impl<DB> diesel::query_builder::QueryFragment<DB> for CacheableVersionedUpdate
where
    DB: diesel::backend::Backend
        + diesel::sql_types::HasSqlType<diesel::sql_types::Text>
        + diesel::sql_types::HasSqlType<diesel::sql_types::Integer>,
    String: diesel::serialize::ToSql<diesel::sql_types::Text, DB>,
    i32: diesel::serialize::ToSql<diesel::sql_types::Integer, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        use diesel::sql_types::{Integer, Text};
        out.push_sql("UPDATE items SET name = ");
        out.push_bind_param::<Text, _>(&self.name)?;
        out.push_sql(", stock = ");
        out.push_bind_param::<Integer, _>(&self.stock)?;
        out.push_sql(", lock_version = lock_version + 1 WHERE id = ");
        out.push_bind_param::<Integer, _>(&self.id)?;
        out.push_sql(" AND lock_version = ");
        out.push_bind_param::<Integer, _>(&self.version)?;
        Ok(())
    }
}

/// The hand-written versioned `UPDATE` of the worker's own row, with its own
/// row-count check: `$build` (a function of `statements.rs`) builds it from the
/// row's key, version, name and stock less one, `$execute` runs it (`$w`),
/// blocking or awaited.
macro_rules! hand_update {
    ($st:expr, $build:path, |$w:ident| $execute:expr) => {{
        $st.counts.attempts += 1;
        let rows = {
            let item = $st.own.as_ref().expect("own row loaded");
            let $w = $build(item.id, item.lock_version, &item.name, item.stock - 1);
            $execute?
        };
        crate::run::ops::versioned::hand_written($st, rows)
    }};
}
pub(crate) use hand_update;

/// Writes `versioned`, `versioned_hand`, `versioned_hand_next`,
/// `versioned_cacheable` and `versioned_peer` into one
/// `bench_backend!` instantiation, where `Conn` is its connection type and
/// `$locks` says whether the backend has row locks.
macro_rules! versioned_ops {
    ($locks:tt) => {
        /// `item.update_versioned(conn)` on the worker's own row.
        fn versioned(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let item = st.own.as_mut().expect("own row loaded");
            item.stock -= 1;
            if let Err(err) = item.update_versioned(conn) {
                item.stock += 1;
                st.counts.saw(&err);
                return Err(OpError::Lockkit(err));
            }
            Ok(1)
        }

        /// The same statement by hand: `UPDATE .. SET name, stock,
        /// lock_version = lock_version + 1 WHERE id = ? AND lock_version = ?`,
        /// with its own row-count check.
        fn versioned_hand(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            use super::statements::versioned_write;
            super::versioned::hand_update!(st, versioned_write, |w| w.execute(conn))
        }

        /// The same by hand, binding the next version as users write it:
        /// `UPDATE .. SET name, stock, lock_version = ? WHERE id = ? AND
        /// lock_version = ?` (under the version check, the same value).
        fn versioned_hand_next(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            use super::statements::versioned_write_next;
            super::versioned::hand_update!(st, versioned_write_next, |w| w.execute(conn))
        }

        /// The peer crate: `diesel_versioning::Versioned::update_versioned` on the
        /// same row, as its own model.
        fn versioned_peer(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let item = st.own.as_mut().expect("own row loaded");
            let mut peer = crate::vocabulary::schema::peer::PeerItem {
                id: item.id,
                name: item.name.clone(),
                stock: item.stock - 1,
                lock_version: item.lock_version,
            };
            if let Err(err) = diesel_versioning::Versioned::update_versioned(&mut peer, conn) {
                st.counts.stale += 1;
                return Err(OpError::Other(err.to_string()));
            }
            item.stock = peer.stock;
            item.lock_version = peer.lock_version;
            Ok(1)
        }

        /// The same statement as [`CacheableVersionedUpdate`](super::versioned::CacheableVersionedUpdate),
        /// which Diesel caches.
        fn versioned_cacheable(conn: &mut Conn, st: &mut WorkerState) -> Result<usize, OpError> {
            st.counts.attempts += 1;
            let item = st.own.as_mut().expect("own row loaded");
            let statement = super::versioned::CacheableVersionedUpdate {
                name: item.name.clone(),
                stock: item.stock - 1,
                id: item.id,
                version: item.lock_version,
            };
            let rows = diesel::query_dsl::methods::ExecuteDsl::execute(statement, conn)?;
            if rows != 1 {
                st.counts.stale += 1;
                return Err(OpError::Other("stale write".into()));
            }
            item.stock -= 1;
            item.lock_version += 1;
            Ok(1)
        }
    };
}
pub(crate) use versioned_ops;
