//! The job queue's rows.

use diesel::prelude::*;

use crate::schema::{job_runs, jobs, outbox, published};

/// A job, as a worker claims it.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Identifiable)]
#[diesel(table_name = jobs)]
pub struct Job {
    /// Primary key.
    pub id: i32,
    /// What to do.
    pub payload: String,
    /// Whether it has run.
    pub done: bool,
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Eq, Insertable)]
#[diesel(table_name = jobs)]
pub struct NewJob {
    /// What to do.
    pub payload: String,
    /// Always `false` for a new job.
    pub done: bool,
}

/// One execution of a job, to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Insertable)]
#[diesel(table_name = job_runs)]
pub struct NewJobRun<'a> {
    /// The job that ran.
    pub job_id: i32,
    /// The worker that ran it.
    pub worker: &'a str,
}

/// An outbox message, as a relay claims it.
#[derive(Debug, Clone, PartialEq, Eq, Queryable, Selectable, Identifiable)]
#[diesel(table_name = outbox)]
pub struct OutboxMessage {
    /// Primary key.
    pub id: i32,
    /// Where the message goes.
    pub topic: String,
    /// The message.
    pub payload: String,
    /// Whether it has been published.
    pub sent: bool,
}

/// An outbox message to write.
#[derive(Debug, Clone, PartialEq, Eq, Insertable)]
#[diesel(table_name = outbox)]
pub struct NewOutboxMessage {
    /// Where the message goes.
    pub topic: String,
    /// The message.
    pub payload: String,
    /// Always `false` for a new message.
    pub sent: bool,
}

/// A message handed to the (simulated) broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Insertable)]
#[diesel(table_name = published)]
pub struct NewPublication<'a> {
    /// The outbox row published.
    pub outbox_id: i32,
    /// The relay instance that published it.
    pub relay: &'a str,
}
