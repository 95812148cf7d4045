//! The error type of the job queue.

/// Everything that can stop a run: a bad option ([`JobQueueError::Usage`]), a
/// database that could not be set up, an error a worker could not handle (a
/// worker that waited longer than the lock timeout fails with
/// `lockkit::Error::LockTimeout`), or a worker thread that panicked.
pub type JobQueueError = lockkit_tests::support::ProgramError;
