//! The shape of the closures the async calls take: `async |conn, row| { .. }`,
//! whose future must be `Send` so that it runs on a multi-threaded runtime.
//!
//! Rust cannot yet say "the future of this `AsyncFnOnce` is `Send`" directly.
//! These traits say it the way diesel-async's own `transaction` does: a closure
//! that is both `AsyncFnOnce(..) -> R` (which guides type inference) and
//! `FnOnce(..) -> Fut` names its future as [`AsyncWork::Fut`], on which a
//! `Send` bound can be put (the `AsyncFnOnce` supertrait is what lets Rust infer
//! the closure's argument types). Blanket-implemented; name them only in `where`
//! clauses.
//!
//! The bound each call states is one of the three shapes below, written once:
//! [`ConnWork`] (`async |conn| ..`, run once), [`RowWork`] (`async |conn, row|
//! ..`, run once under the row's lock) and [`ConnAttempt`] (`async |conn| ..`,
//! run again after a retryable error). A generic function of yours that hands
//! a closure on to lockkit states the same bound:
//!
//! ```
//! # #[cfg(feature = "sqlite")] {
//! use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
//! use lockkit::asynchronous::work::ConnWork;
//!
//! type Async = SyncConnectionWrapper<diesel::SqliteConnection>;
//!
//! /// Logs, then runs `f`: a wrapper of your own that takes lockkit's closures.
//! async fn audited<T: Send, F>(conn: &mut Async, f: F) -> Result<T, lockkit::Error>
//! where
//!     F: ConnWork<Async, T, lockkit::Error>,
//! {
//!     tracing::debug!("audited work");
//!     f(conn).await
//! }
//! # }
//! ```

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

/// `async |conn| ..` run once on `&mut C`, returning `Result<T, E>`, whose future
/// is `Send`: the closure of `locked_transaction`, the advisory and lease calls,
/// idempotency keys and the replica's reads.
pub trait ConnWork<C, T, E>: for<'r> AsyncWork<&'r mut C, Result<T, E>, Fut: Send> + Send {}

impl<F, C, T, E> ConnWork<C, T, E> for F where
    F: for<'r> AsyncWork<&'r mut C, Result<T, E>, Fut: Send> + Send
{
}

/// `async |conn, row| ..` run once on `&mut C` and the locked row `M`,
/// returning `Result<T, E>`, whose future is `Send`: the closure of `with_lock`.
pub trait RowWork<C, M, T, E>:
    for<'r> AsyncWork2<&'r mut C, M, Result<T, E>, Fut: Send> + Send
{
}

impl<F, C, M, T, E> RowWork<C, M, T, E> for F where
    F: for<'r> AsyncWork2<&'r mut C, M, Result<T, E>, Fut: Send> + Send
{
}

/// `async |conn| ..` that may run again (one attempt each) on `&mut C`,
/// returning `Result<T, E>`, whose future is `Send`: the closure of `retry`,
/// `transaction_with_retry` and `serializable`.
pub trait ConnAttempt<C, T, E>:
    for<'r> AsyncAttempt<&'r mut C, Result<T, E>, Fut: Send> + Send
{
}

impl<F, C, T, E> ConnAttempt<C, T, E> for F where
    F: for<'r> AsyncAttempt<&'r mut C, Result<T, E>, Fut: Send> + Send
{
}
