//! The scene of the `lock_all` tests whose second read waits, blocking
//! (`row_locks.rs`) and on diesel-async (`async_locking.rs`): a holder keeps
//! items row 1 locked while row 2 is replaced twice, the second time not
//! committed yet.

use diesel::connection::SimpleConnection;
use diesel::PgConnection;

use crate::{seed_items, TestDb, REPLACE_ITEM_2_UNCOMMITTED};

/// Items 1 and 2 (stock 10), row 1 locked by a holder in a transaction it
/// keeps open, and the connection that replaces row 2 the second time.
pub struct Row2ReplacedTwice {
    holder: PgConnection,
    replacer: PgConnection,
    /// The session of the second replacement, by the id
    /// `lockkit::lock_waits` reports it under.
    pub replacer_id: i64,
}

impl Row2ReplacedTwice {
    /// Seeds items 1 and 2 on `db`, has the holder lock row 1, and opens the
    /// second replacement's connection.
    pub fn new(db: &TestDb<PgConnection>) -> Self {
        seed_items(&mut db.conn(), &[(1, 10), (2, 10)]);
        let mut holder = db.connect();
        holder
            .batch_execute("BEGIN; SELECT id FROM items WHERE id = 1 FOR UPDATE")
            .unwrap();
        let mut replacer = db.connect();
        let replacer_id = lockkit::lock_waits::session_id(&mut replacer).unwrap();
        Self {
            holder,
            replacer,
            replacer_id,
        }
    }

    /// Once `lock_all` waits for row 1: a first replacement of row 2 (stock
    /// 8) commits, a second (stock 7) stays open, and the holder commits.
    pub fn replace_row_2_twice(&mut self, db: &TestDb<PgConnection>) {
        db.conn()
            .batch_execute(
                "BEGIN; DELETE FROM items WHERE id = 2; \
                 INSERT INTO items (id, name, stock, lock_version) VALUES (2, 'first', 8, 0); COMMIT",
            )
            .unwrap();
        self.replacer
            .batch_execute(REPLACE_ITEM_2_UNCOMMITTED)
            .unwrap();
        self.holder.batch_execute("COMMIT").unwrap();
    }

    /// Commits the second replacement of row 2.
    pub fn commit_the_second(&mut self) {
        self.replacer.batch_execute("COMMIT").unwrap();
    }
}
