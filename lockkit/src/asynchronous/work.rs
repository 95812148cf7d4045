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

/// Declares one closure shape: `$name`, the closure of that kind and arguments
/// whose future is named `Fut` (the pattern diesel-async's `transaction` uses),
/// and `$alias<C, .., T, E>`, the bound lockkit's calls state: the first
/// argument is `&mut C`, the output `Result<T, E>`, the closure and its future
/// `Send`. The pattern is written once for the three shapes.
macro_rules! closure_shape {
    (
        $(#[$doc:meta])*
        $name:ident: $async_fn:ident + $fn:ident ($($arg:ident),+);
        $(#[$alias_doc:meta])*
        $alias:ident(&mut C $(, $extra:ident)*) -> Result<T, E>;
    ) => {
        $(#[$doc])*
        pub trait $name<$($arg,)+ R>:
            $async_fn($($arg),+) -> R + $fn($($arg),+) -> <Self as $name<$($arg,)+ R>>::Fut
        {
            /// The closure's future.
            type Fut: Future<Output = R>;
        }

        impl<F, $($arg,)+ Fut, R> $name<$($arg,)+ R> for F
        where
            F: $async_fn($($arg),+) -> R + $fn($($arg),+) -> Fut,
            Fut: Future<Output = R>,
        {
            type Fut = Fut;
        }

        $(#[$alias_doc])*
        pub trait $alias<C, $($extra,)* T, E>:
            for<'r> $name<&'r mut C, $($extra,)* Result<T, E>, Fut: Send> + Send
        {
        }

        impl<F, C, $($extra,)* T, E> $alias<C, $($extra,)* T, E> for F where
            F: for<'r> $name<&'r mut C, $($extra,)* Result<T, E>, Fut: Send> + Send
        {
        }
    };
}

closure_shape! {
    /// An `async` closure of one argument whose future is named, so that it can
    /// be required to be `Send`.
    AsyncWork: AsyncFnOnce + FnOnce(A);
    /// `async |conn| ..` run once on `&mut C`, returning `Result<T, E>`, whose
    /// future is `Send`: the closure of `locked_transaction`, the advisory and
    /// lease calls, idempotency keys and the replica's reads.
    ConnWork(&mut C) -> Result<T, E>;
}

closure_shape! {
    /// An `async` closure of two arguments (the connection and the locked row)
    /// whose future is named, so that it can be required to be `Send`.
    AsyncWork2: AsyncFnOnce + FnOnce(A, B);
    /// `async |conn, row| ..` run once on `&mut C` and the locked row `M`,
    /// returning `Result<T, E>`, whose future is `Send`: the closure of
    /// `with_lock`.
    RowWork(&mut C, M) -> Result<T, E>;
}

closure_shape! {
    /// An `async` closure that may run more than once (one attempt each),
    /// whose future is named, so that it can be required to be `Send`.
    AsyncAttempt: AsyncFnMut + FnMut(A);
    /// `async |conn| ..` that may run again (one attempt each) on `&mut C`,
    /// returning `Result<T, E>`, whose future is `Send`: the closure of
    /// `retry`, `transaction_with_retry` and `serializable`.
    ConnAttempt(&mut C) -> Result<T, E>;
}
