//! The job queue's tables (`migrations/<backend>/` creates them).

/// Work to do: the `jobs` table of lockkit's test suite. A worker claims a
/// pending row, runs its `payload` and sets `done` in the transaction that
/// claimed it; workers take the oldest (lowest `id`) first.
pub use lockkit_tests::schema::jobs;

diesel::table! {
    /// One row per execution of a job: the audit trail that exposes duplicates.
    job_runs (id) {
        /// Primary key.
        id -> Integer,
        /// The job that ran (no query joins it to `jobs`).
        job_id -> Integer,
        /// The worker that ran it (`w1`, `w2`, …).
        worker -> Text,
    }
}

diesel::table! {
    /// The transactional outbox: messages written with the business data, to be
    /// relayed to a message broker.
    outbox (id) {
        /// Primary key.
        id -> Integer,
        /// Where the message goes.
        topic -> Text,
        /// The message.
        payload -> Text,
        /// Set in the transaction that published the message.
        sent -> Bool,
    }
}

diesel::table! {
    /// Stands in for the message broker: one row per published message. Its
    /// primary key makes a second publication of the same message an error.
    published (outbox_id) {
        /// The outbox row published.
        outbox_id -> Integer,
        /// The relay instance that published it.
        relay -> Text,
    }
}

diesel::joinable!(published -> outbox (outbox_id));
diesel::allow_tables_to_appear_in_same_query!(job_runs, outbox, published);
