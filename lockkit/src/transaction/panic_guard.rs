//! The panic guard of every lockkit transaction.

use super::Failure;

/// Catches a panic in a closure run inside a transaction, so that the transaction
/// is rolled back before the panic goes on: the connection is then left usable,
/// with no transaction open (and a pooled one is not returned mid-transaction).
#[derive(Default)]
pub(crate) struct PanicGuard(Option<Box<dyn std::any::Any + Send + 'static>>);

impl PanicGuard {
    /// Runs `f`; a panic becomes an error that makes Diesel roll back.
    pub(crate) fn call<C, T, E>(
        &mut self,
        conn: &mut C,
        f: impl FnOnce(&mut C) -> Result<T, Failure<E>>,
    ) -> Result<T, Failure<E>> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn))) {
            Ok(result) => result,
            Err(payload) => {
                self.0 = Some(payload);
                Err(Failure::Diesel(diesel::result::Error::RollbackTransaction))
            }
        }
    }

    /// Goes on with the caught panic, if there was one (after the rollback).
    pub(crate) fn resume(self) {
        if let Some(payload) = self.0 {
            std::panic::resume_unwind(payload);
        }
    }
}
