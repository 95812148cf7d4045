// The future of an async closure handed to lockkit must be `Send`, so that the
// call can run on a multi-threaded runtime: a closure that holds an `Rc` across
// an `.await` must not compile, and the error must point at the closure.
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::RunQueryDsl;
use lockkit::LockOptions;
use std::rc::Rc;

type Async = SyncConnectionWrapper<diesel::SqliteConnection>;

async fn count(conn: &mut Async) -> Result<usize, lockkit::Error> {
    lockkit::asynchronous::locked_transaction(conn, LockOptions::default(), async |conn| {
        let shared = Rc::new(1);
        let rows = diesel::sql_query("SELECT 1").execute(conn).await?;
        Ok(rows + *shared)
    })
    .await
}

fn main() {
    drop(count);
}
