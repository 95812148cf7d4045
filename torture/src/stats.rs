//! Strategies, operations, and what the workers count and report to the parent.

use std::collections::BTreeMap;

use crate::config::Bump;

/// One way of changing the hot rows (or of draining the queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Read, change, `update_versioned`; `Stale` is retried.
    Optimistic,
    /// `with_lock`: `SELECT .. FOR UPDATE` (SQLite: `BEGIN IMMEDIATE`).
    WithLock,
    /// A multi-item order: `Item::lock_all` in a `locked_transaction`.
    LockAll,
    /// `atomic::update_if`: `UPDATE .. SET stock = stock - q WHERE stock >= q`.
    Atomic,
    /// `with_lock(.., nowait(), ..)`: `Busy` is retried.
    NoWait,
    /// A restock through `Item::update_by_version` (the `If-Match` path).
    ByVersion,
    /// `queue::claim` (`FOR UPDATE SKIP LOCKED`) of jobs, each run recorded once.
    SkipLocked,
    /// `AdaptivePolicy::update`: optimistic while the row is calm, locked while hot.
    Adaptive,
}

impl Strategy {
    pub const ALL: [Strategy; 8] = [
        Strategy::Optimistic,
        Strategy::WithLock,
        Strategy::LockAll,
        Strategy::Atomic,
        Strategy::NoWait,
        Strategy::ByVersion,
        Strategy::SkipLocked,
        Strategy::Adaptive,
    ];

    /// The strategies of `--async`: those `lockkit::asynchronous` has (no
    /// `queue::claim`, `atomic` or `adaptive` on diesel-async yet).
    pub const ASYNC: [Strategy; 5] = [
        Strategy::Optimistic,
        Strategy::WithLock,
        Strategy::LockAll,
        Strategy::NoWait,
        Strategy::ByVersion,
    ];

    /// The strategies a run's workers pick from.
    pub fn of_run(asynchronous: bool) -> &'static [Strategy] {
        if asynchronous {
            &Strategy::ASYNC
        } else {
            &Strategy::ALL
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Optimistic => "optimistic",
            Strategy::WithLock => "with_lock",
            Strategy::LockAll => "lock_all",
            Strategy::Atomic => "atomic",
            Strategy::NoWait => "nowait",
            Strategy::ByVersion => "by_version",
            Strategy::SkipLocked => "skip_locked",
            Strategy::Adaptive => "adaptive",
        }
    }

    /// The lockkit calls behind it, for the report.
    pub fn calls(self) -> &'static str {
        match self {
            Strategy::Optimistic => "update_versioned + retry",
            Strategy::WithLock => "with_lock",
            Strategy::LockAll => "locked_transaction + Item::lock_all (2-3 items)",
            Strategy::Atomic => "atomic::update_if",
            Strategy::NoWait => "with_lock(nowait) + retry",
            Strategy::ByVersion => "update_by_version (restock) + retry",
            Strategy::SkipLocked => "locked_transaction + queue::claim",
            Strategy::Adaptive => "AdaptivePolicy::update (optimistic or with_lock per row)",
        }
    }

    /// How often a worker picks it, relative to the others.
    pub fn weight(self) -> u32 {
        match self {
            Strategy::Optimistic | Strategy::WithLock | Strategy::Atomic => 3,
            Strategy::LockAll | Strategy::NoWait => 2,
            Strategy::ByVersion => 4,
            Strategy::SkipLocked | Strategy::Adaptive => 3,
        }
    }

    /// Whether it sells (and so enqueues a shipment job).
    pub fn sells(self) -> bool {
        !matches!(self, Strategy::ByVersion | Strategy::SkipLocked)
    }

    pub fn index(self) -> usize {
        Strategy::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }

    /// One of `strategies`, by weight.
    pub fn pick(rng: &mut fastrand::Rng, strategies: &[Strategy]) -> Strategy {
        let total: u32 = strategies.iter().map(|s| s.weight()).sum();
        let mut n = rng.u32(0..total.max(1));
        for &strategy in strategies {
            if n < strategy.weight() {
                return strategy;
            }
            n -= strategy.weight();
        }
        Strategy::Optimistic
    }
}

/// One operation: an order, a restock or a claim. `id` is unique over the run:
/// it keys the order's lines and its shipment job, and tells after a lost
/// connection whether the operation committed.
#[derive(Debug, Clone)]
pub struct Op {
    pub id: i64,
    pub strategy: Strategy,
    /// `(item, quantity)`: the stock goes down by `quantity` (negative: a restock).
    pub lines: Vec<(i32, i32)>,
    /// Jobs to claim at most (`SkipLocked`).
    pub batch: i64,
    pub worker: String,
    pub bump: Bump,
}

impl Op {
    /// The line a failure of this operation leaves in the report: the worker,
    /// the op and the calls its strategy makes.
    pub fn failure(&self, failure: impl std::fmt::Display) -> String {
        format!(
            "{} op {} ({}: {}): {failure}",
            self.worker,
            self.id,
            self.strategy.name(),
            self.strategy.calls()
        )
    }
}

/// Op ids: the process (0 = the parent) in bits 40.., the thread in 32..40, a
/// sequence number below. Seeded jobs have ids 1..=N, below `1 << 40`.
pub fn op_id(process: u32, thread: u32, seq: u32) -> i64 {
    (i64::from(process) << 40) | (i64::from(thread & 0xff) << 32) | i64::from(seq)
}

/// The first op id of the workers (process 1).
pub const FIRST_WORKER_OP: i64 = 1 << 40;

/// What a committed operation wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    pub lines: u64,
    pub jobs_created: u64,
    pub jobs_claimed: u64,
    /// The lowest stock the operation wrote (`i64::MAX`: none, or unknown).
    pub lowest_stock: i64,
}

impl Done {
    pub const NOTHING: Done = Done {
        lines: 0,
        jobs_created: 0,
        jobs_claimed: 0,
        lowest_stock: i64::MAX,
    };

    /// What an order or a restock wrote besides the stock: its lines and,
    /// for a sale, its shipment job.
    pub fn recorded(op: &Op) -> Done {
        Done {
            lines: op.lines.len() as u64,
            jobs_created: u64::from(op.strategy.sells()),
            ..Done::NOTHING
        }
    }

    /// An interrupted `op`, from the rows it left (its job runs for a claim, its
    /// order lines otherwise): `None` when it did not commit.
    pub fn committed(op: &Op, rows: i64) -> Option<Done> {
        if rows <= 0 {
            return None;
        }
        Some(if op.strategy == Strategy::SkipLocked {
            Done {
                jobs_claimed: rows as u64,
                ..Done::NOTHING
            }
        } else {
            Done {
                lines: rows as u64,
                ..Done::recorded(op)
            }
        })
    }
}

/// How an operation ended, short of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done(Done),
    /// The order was refused: not enough stock. Nothing was written.
    OutOfStock,
    /// A claim found no job that nobody holds. Nothing was written.
    QueueEmpty,
    /// `--async`: the operation's future was dropped before it committed
    /// (found rolled back). Nothing was written.
    Dropped,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrategyStats {
    /// Committed operations.
    pub ops: u64,
    pub lines: u64,
    pub jobs_created: u64,
    pub jobs_claimed: u64,
    /// Out of stock (orders) or queue empty (claims).
    pub idle: u64,
    /// Attempts that met a retryable conflict and were run again.
    pub retries: u64,
}

/// A counter of a worker's report: its key, how to read it and where to add
/// to it or set it.
type Counter<T> = (&'static str, fn(&T) -> u64, fn(&mut T) -> &mut u64);

impl StrategyStats {
    /// The counters `merge`, `to_report` and `parse_report` go through, in the
    /// report's order (each key after the strategy's name: `optimistic.ops`).
    const COUNTERS: [Counter<StrategyStats>; 6] = [
        ("ops", |p| p.ops, |p| &mut p.ops),
        ("lines", |p| p.lines, |p| &mut p.lines),
        ("jobs_created", |p| p.jobs_created, |p| &mut p.jobs_created),
        ("jobs_claimed", |p| p.jobs_claimed, |p| &mut p.jobs_claimed),
        ("idle", |p| p.idle, |p| &mut p.idle),
        ("retries", |p| p.retries, |p| &mut p.retries),
    ];
}

/// A worker process's report (and the sum of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub per: [StrategyStats; Strategy::ALL.len()],
    pub threads: u64,
    /// Lost connections and server errors retried in `--tolerate-outages` mode.
    pub outage_errors: u64,
    /// `pool.get()` timeouts while the server was unreachable.
    pub pool_errors: u64,
    /// Operations committed after the thread's first outage error.
    pub recovered_ops: u64,
    /// Interrupted operations found committed (not run again).
    pub confirmed: u64,
    /// Interrupted operations found rolled back (run again).
    pub redone: u64,
    /// Retry policies that every attempt of lost a conflict, started again
    /// (`--tolerate-outages`: see `run::is_starved`).
    pub starved: u64,
    /// Outage errors by message.
    pub outages: BTreeMap<String, u64>,
    /// `--async`: operations whose future a `tokio::time::timeout` dropped.
    pub cancelled_timeout: u64,
    /// `--async`: operations whose task was aborted (`JoinHandle::abort`).
    pub cancelled_abort: u64,
    /// Of the dropped operations, those found committed (the drop came after
    /// the `COMMIT` reached the server).
    pub cancelled_committed: u64,
    /// `--async`: pooled connections checked on the server after the run and
    /// found outside any transaction, holding no lock.
    pub pool_clean: u64,
    /// And found inside a transaction or holding a lock.
    pub pool_dirty: u64,
    /// The lowest stock any committed operation wrote (`i64::MAX`: none).
    pub lowest_stock: i64,
    /// Unexpected errors: each one fails the run.
    pub failures: Vec<String>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            per: Default::default(),
            threads: 0,
            outage_errors: 0,
            pool_errors: 0,
            recovered_ops: 0,
            confirmed: 0,
            redone: 0,
            starved: 0,
            outages: BTreeMap::new(),
            cancelled_timeout: 0,
            cancelled_abort: 0,
            cancelled_committed: 0,
            pool_clean: 0,
            pool_dirty: 0,
            lowest_stock: i64::MAX,
            failures: Vec::new(),
        }
    }
}

impl Stats {
    /// The run-wide counters `merge`, `to_report` and `parse_report` go
    /// through, in the report's order.
    const COUNTERS: [Counter<Stats>; 12] = [
        ("threads", |s| s.threads, |s| &mut s.threads),
        (
            "outage_errors",
            |s| s.outage_errors,
            |s| &mut s.outage_errors,
        ),
        ("pool_errors", |s| s.pool_errors, |s| &mut s.pool_errors),
        (
            "recovered_ops",
            |s| s.recovered_ops,
            |s| &mut s.recovered_ops,
        ),
        ("confirmed", |s| s.confirmed, |s| &mut s.confirmed),
        ("redone", |s| s.redone, |s| &mut s.redone),
        ("starved", |s| s.starved, |s| &mut s.starved),
        (
            "cancelled_timeout",
            |s| s.cancelled_timeout,
            |s| &mut s.cancelled_timeout,
        ),
        (
            "cancelled_abort",
            |s| s.cancelled_abort,
            |s| &mut s.cancelled_abort,
        ),
        (
            "cancelled_committed",
            |s| s.cancelled_committed,
            |s| &mut s.cancelled_committed,
        ),
        ("pool_clean", |s| s.pool_clean, |s| &mut s.pool_clean),
        ("pool_dirty", |s| s.pool_dirty, |s| &mut s.pool_dirty),
    ];

    pub fn record(&mut self, strategy: Strategy, outcome: Outcome) {
        let per = &mut self.per[strategy.index()];
        match outcome {
            Outcome::Done(done) => {
                per.ops += 1;
                per.lines += done.lines;
                per.jobs_created += done.jobs_created;
                per.jobs_claimed += done.jobs_claimed;
                self.lowest_stock = self.lowest_stock.min(done.lowest_stock);
            }
            Outcome::OutOfStock | Outcome::QueueEmpty => per.idle += 1,
            Outcome::Dropped => {}
        }
    }

    pub fn merge(&mut self, other: &Stats) {
        for (mine, theirs) in self.per.iter_mut().zip(&other.per) {
            for (_, get, slot) in StrategyStats::COUNTERS {
                *slot(mine) += get(theirs);
            }
        }
        for (_, get, slot) in Stats::COUNTERS {
            *slot(self) += get(other);
        }
        self.lowest_stock = self.lowest_stock.min(other.lowest_stock);
        for (message, n) in &other.outages {
            *self.outages.entry(message.clone()).or_default() += n;
        }
        self.failures.extend(other.failures.iter().cloned());
    }

    pub fn ops(&self) -> u64 {
        self.per.iter().map(|p| p.ops).sum()
    }

    pub fn lines(&self) -> u64 {
        self.per.iter().map(|p| p.lines).sum()
    }

    /// The report a worker prints on stdout for the parent.
    pub fn to_report(&self) -> String {
        let mut out = "RESULT".to_owned();
        for (key, get, _) in Stats::COUNTERS {
            out.push_str(&format!(" {key}={}", get(self)));
        }
        out.push_str(&format!(" lowest_stock={}", self.lowest_stock));
        for strategy in Strategy::ALL {
            let p = &self.per[strategy.index()];
            let name = strategy.name();
            for (key, get, _) in StrategyStats::COUNTERS {
                out.push_str(&format!(" {name}.{key}={}", get(p)));
            }
        }
        out.push('\n');
        for (message, n) in &self.outages {
            out.push_str(&format!("OUTAGE\t{n}\t{}\n", one_line(message)));
        }
        for failure in &self.failures {
            out.push_str(&format!("FAILURE\t{}\n", one_line(failure)));
        }
        out
    }

    /// Reads a worker's report; other output lines are ignored.
    pub fn parse_report(text: &str) -> Result<Stats, String> {
        let mut stats = Stats::default();
        let mut results = 0;
        for line in text.lines() {
            if let Some(fields) = line.strip_prefix("RESULT ") {
                results += 1;
                for field in fields.split_whitespace() {
                    let (key, value) = field
                        .split_once('=')
                        .ok_or_else(|| format!("bad field {field:?}"))?;
                    if key == "lowest_stock" {
                        stats.lowest_stock = value
                            .parse()
                            .map_err(|_| format!("bad value in {field:?}"))?;
                        continue;
                    }
                    let value: u64 = value
                        .parse()
                        .map_err(|_| format!("bad value in {field:?}"))?;
                    stats.set(key, value)?;
                }
            } else if let Some(rest) = line.strip_prefix("OUTAGE\t") {
                let (n, message) = rest.split_once('\t').ok_or("bad OUTAGE line")?;
                let n: u64 = n.parse().map_err(|_| "bad OUTAGE count")?;
                *stats.outages.entry(message.to_owned()).or_default() += n;
            } else if let Some(message) = line.strip_prefix("FAILURE\t") {
                stats.failures.push(message.to_owned());
            }
        }
        match results {
            1 => Ok(stats),
            0 => Err("no RESULT line".into()),
            _ => Err("several RESULT lines".into()),
        }
    }

    fn set(&mut self, key: &str, value: u64) -> Result<(), String> {
        let slot = if let Some((_, _, slot)) = Stats::COUNTERS.iter().find(|c| c.0 == key) {
            slot(self)
        } else {
            let (name, counter) = key.split_once('.').ok_or(format!("unknown key {key}"))?;
            let strategy = Strategy::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .ok_or(format!("unknown strategy {name}"))?;
            let (_, _, slot) = StrategyStats::COUNTERS
                .iter()
                .find(|c| c.0 == counter)
                .ok_or(format!("unknown key {key}"))?;
            slot(&mut self.per[strategy.index()])
        };
        *slot = value;
        Ok(())
    }
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r', '\t'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        let mut stats = Stats {
            threads: 4,
            outage_errors: 3,
            recovered_ops: 9,
            cancelled_abort: 5,
            pool_clean: 6,
            ..Stats::default()
        };
        stats.record(
            Strategy::LockAll,
            Outcome::Done(Done {
                lines: 3,
                jobs_created: 1,
                lowest_stock: -2,
                ..Done::NOTHING
            }),
        );
        stats.record(Strategy::SkipLocked, Outcome::QueueEmpty);
        stats.per[Strategy::NoWait.index()].retries = 7;
        stats.outages.insert("connection lost\nreally".into(), 2);
        stats.failures.push("boom".into());
        let text = format!("noise\n{}more noise\n", stats.to_report());
        let parsed = Stats::parse_report(&text).unwrap();
        assert_eq!(parsed.per, stats.per);
        assert_eq!(parsed.lowest_stock, -2);
        assert_eq!(parsed.outages.get("connection lost really"), Some(&2));
        assert_eq!(parsed.failures, vec!["boom".to_owned()]);
        assert_eq!(
            (parsed.threads, parsed.outage_errors, parsed.recovered_ops),
            (4, 3, 9)
        );
        assert_eq!((parsed.cancelled_abort, parsed.pool_clean), (5, 6));
        assert!(Stats::parse_report("nothing").is_err());
    }

    #[test]
    fn op_ids_do_not_collide() {
        assert_eq!(op_id(1, 0, 0), FIRST_WORKER_OP);
        assert!(op_id(0, 255, u32::MAX) < FIRST_WORKER_OP);
        assert_ne!(op_id(1, 2, 3), op_id(2, 1, 3));
    }
}
