//! The torture tables. Their names start with `torture_` so that the run never
//! touches an application's own tables; `setup` drops and recreates them.

diesel::table! {
    /// The hot rows: a handful of items every strategy sells from at once.
    torture_items (id) {
        id -> Integer,
        name -> Text,
        stock -> Integer,
        lock_version -> Integer,
    }
}

diesel::table! {
    /// One line per item of an order, written in the same transaction as the
    /// stock change. A restock is a line with a negative quantity, so that for
    /// every item `stock + SUM(qty) = initial stock`.
    torture_order_lines (op_id, line_no) {
        op_id -> BigInt,
        line_no -> Integer,
        item_id -> Integer,
        qty -> Integer,
        strategy -> Text,
    }
}

diesel::table! {
    /// The work queue: seeded jobs (ids from 1) and one shipment job per order
    /// (id = the order's op id), claimed with `FOR UPDATE SKIP LOCKED`.
    torture_jobs (id) {
        id -> BigInt,
        done -> Bool,
    }
}

diesel::table! {
    /// One row per job execution; the primary key makes a second run of a job
    /// a unique violation, and the counts prove each job ran exactly once.
    torture_job_runs (job_id) {
        job_id -> BigInt,
        op_id -> BigInt,
        worker -> Text,
    }
}

/// The DDL, the same on PostgreSQL, MySQL/MariaDB and SQLite. No `CHECK (stock >= 0)`
/// on purpose: "no item below zero" is the applications' job, and the audit checks it.
pub const CREATE_TABLES: &str = "
DROP TABLE IF EXISTS torture_job_runs;
DROP TABLE IF EXISTS torture_jobs;
DROP TABLE IF EXISTS torture_order_lines;
DROP TABLE IF EXISTS torture_items;
CREATE TABLE torture_items (
    id INTEGER PRIMARY KEY,
    name VARCHAR(64) NOT NULL,
    stock INTEGER NOT NULL,
    lock_version INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE torture_order_lines (
    op_id BIGINT NOT NULL,
    line_no INTEGER NOT NULL,
    item_id INTEGER NOT NULL,
    qty INTEGER NOT NULL,
    strategy VARCHAR(32) NOT NULL,
    PRIMARY KEY (op_id, line_no)
);
CREATE TABLE torture_jobs (
    id BIGINT PRIMARY KEY,
    done BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX torture_jobs_pending ON torture_jobs (done, id);
CREATE TABLE torture_job_runs (
    job_id BIGINT PRIMARY KEY,
    op_id BIGINT NOT NULL,
    worker VARCHAR(64) NOT NULL
);
";
