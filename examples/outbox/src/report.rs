//! What the processes report, and the audit.

use std::fmt;

/// What one relay process did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Batches it claimed and committed.
    pub batches: u64,
    /// Messages JetStream acked and the relay marked published.
    pub published: u64,
    /// Messages JetStream refused or did not ack (retried after a backoff).
    pub failed: u64,
}

impl fmt::Display for RelayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "batches={} published={} failed={}",
            self.batches, self.published, self.failed
        )
    }
}

/// What one consumer process did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Messages it received (every delivery counts).
    pub delivered: u64,
    /// Of those, deliveries JetStream marked as redeliveries (after an ack timeout).
    pub redelivered: u64,
    /// Messages whose effect it applied.
    pub applied: u64,
    /// Deliveries the inbox recognised as already applied: duplicates absorbed.
    pub absorbed: u64,
    /// Messages no delivery of which could be applied (not an order's, no
    /// `Outbox-Id` header, an item without stock): terminated, not redelivered.
    pub rejected: u64,
    /// Deliveries a retryable database error (a deadlock, a busy database)
    /// stopped: not acked, so JetStream delivers them again.
    pub retried: u64,
}

impl ConsumerReport {
    /// Reads the report back from the last line a consumer process printed.
    pub fn from_output(stdout: &str) -> Option<ConsumerReport> {
        let line = stdout.lines().rev().find(|l| l.contains("delivered="))?;
        let field = |name: &str| -> Option<u64> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
                .parse()
                .ok()
        };
        Some(ConsumerReport {
            delivered: field("delivered")?,
            redelivered: field("redelivered")?,
            applied: field("applied")?,
            absorbed: field("absorbed")?,
            rejected: field("rejected")?,
            retried: field("retried")?,
        })
    }
}

impl std::ops::Add for ConsumerReport {
    type Output = ConsumerReport;
    fn add(self, other: ConsumerReport) -> ConsumerReport {
        ConsumerReport {
            delivered: self.delivered + other.delivered,
            redelivered: self.redelivered + other.redelivered,
            applied: self.applied + other.applied,
            absorbed: self.absorbed + other.absorbed,
            rejected: self.rejected + other.rejected,
            retried: self.retried + other.retried,
        }
    }
}

impl fmt::Display for ConsumerReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "delivered={} redelivered={} applied={} absorbed={} rejected={} retried={}",
            self.delivered,
            self.redelivered,
            self.applied,
            self.absorbed,
            self.rejected,
            self.retried
        )
    }
}

/// What the tables and the stream hold at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Orders placed.
    pub orders: i64,
    /// Outbox messages not marked published.
    pub unpublished: i64,
    /// Messages in the stream: every publish JetStream acked, duplicates included.
    pub stream_messages: u64,
    /// Message ids in the consumer's inbox.
    pub inbox: i64,
    /// Reservation rows: one per applied effect.
    pub reservations: i64,
    /// Orders without exactly one reservation: `(order, reservations)`.
    pub not_once: Vec<(i32, i64)>,
    /// The quantity ordered, over all orders.
    pub ordered_qty: i64,
    /// The quantity reserved, over all items.
    pub reserved_qty: i64,
}

impl Audit {
    /// Every order applied exactly once, nothing lost, the counts agreeing.
    pub fn is_exactly_once(&self) -> bool {
        self.unpublished == 0
            && self.not_once.is_empty()
            && self.reservations == self.orders
            && self.inbox == self.orders
            && self.ordered_qty == self.reserved_qty
            && self.stream_messages >= self.orders.unsigned_abs()
    }

    /// Messages JetStream stored more than once (relays that died before marking).
    pub fn duplicates_published(&self) -> u64 {
        self.stream_messages
            .saturating_sub(self.orders.unsigned_abs())
    }
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "orders {}, messages in the stream {} ({} published twice), unpublished {}",
            self.orders,
            self.stream_messages,
            self.duplicates_published(),
            self.unpublished
        )?;
        writeln!(
            f,
            "applied: inbox {}, reservations {}, quantity ordered {} / reserved {}",
            self.inbox, self.reservations, self.ordered_qty, self.reserved_qty
        )?;
        if !self.not_once.is_empty() {
            let shown = &self.not_once[..self.not_once.len().min(10)];
            writeln!(
                f,
                "{} orders not applied exactly once, e.g. (order, times): {shown:?}",
                self.not_once.len()
            )?;
        }
        write!(
            f,
            "{}",
            if self.is_exactly_once() {
                "every order applied exactly once"
            } else {
                "NOT exactly once"
            }
        )
    }
}
