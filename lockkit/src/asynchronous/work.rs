//! The shape of the closures the async calls take: `async |conn, row| { .. }`,
//! whose future must be `Send` so that it runs on a multi-threaded runtime.
//!
//! Rust cannot yet say "the future of this `AsyncFnOnce` is `Send`" directly.
//! These traits say it the way diesel-async's own `transaction` does: a closure
//! that is both `AsyncFnOnce(..) -> R` (which guides type inference) and
//! `FnOnce(..) -> Fut` names its future as [`AsyncWork::Fut`], on which a
//! `Send` bound can be put. Blanket-implemented; name them only in `where`
//! clauses.

use std::future::Future;

/// An `async` closure of one argument whose future is named, so that it can be
/// required to be `Send`.
pub trait AsyncWork<A, R>:
    AsyncFnOnce(A) -> R + FnOnce(A) -> <Self as AsyncWork<A, R>>::Fut
{
    /// The closure's future.
    type Fut: Future<Output = R>;
}

impl<F, A, Fut, R> AsyncWork<A, R> for F
where
    F: AsyncFnOnce(A) -> R + FnOnce(A) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// An `async` closure of two arguments (the connection and the locked row)
/// whose future is named, so that it can be required to be `Send`.
pub trait AsyncWork2<A, B, R>:
    AsyncFnOnce(A, B) -> R + FnOnce(A, B) -> <Self as AsyncWork2<A, B, R>>::Fut
{
    /// The closure's future.
    type Fut: Future<Output = R>;
}

impl<F, A, B, Fut, R> AsyncWork2<A, B, R> for F
where
    F: AsyncFnOnce(A, B) -> R + FnOnce(A, B) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}

/// An `async` closure that may run more than once (one attempt each), whose
/// future is named, so that it can be required to be `Send`.
pub trait AsyncAttempt<A, R>:
    AsyncFnMut(A) -> R + FnMut(A) -> <Self as AsyncAttempt<A, R>>::Fut
{
    /// The closure's future.
    type Fut: Future<Output = R>;
}

impl<F, A, Fut, R> AsyncAttempt<A, R> for F
where
    F: AsyncFnMut(A) -> R + FnMut(A) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}
