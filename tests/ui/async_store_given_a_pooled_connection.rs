// lockkit's async stores (leases, fences, outbox, idempotency keys) take the
// diesel-async connection itself: a bb8 pooled connection passed as
// `&mut pooled`, not `&mut *pooled`, must not compile, and the error must say
// which connections lockkit takes and how to pass a pooled one, without a list
// of lockkit's own impls.
use diesel_async::pooled_connection::bb8::PooledConnection;
use diesel_async::AsyncPgConnection;
use std::time::Duration;

type Pooled<'a> = PooledConnection<'a, AsyncPgConnection>;

async fn lease(pooled: &mut Pooled<'_>) {
    let _ = lockkit::asynchronous::lease::acquire(pooled, "nightly", Duration::from_secs(5));
}

async fn outbox(pooled: &mut Pooled<'_>) {
    let _ = lockkit::asynchronous::outbox::enqueue(pooled, "sold", "{}");
}

fn main() {
    drop(lease);
    drop(outbox);
}
