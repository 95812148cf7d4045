//! An idempotency key's work that fails, by returning an error or by
//! panicking, for the tests of what then becomes of its key.

use std::panic::{catch_unwind, AssertUnwindSafe};

use lockkit::bounds::IdempotencyStore;
use lockkit::idempotency::{Idempotency, Outcome};
use lockkit::{AsLockingConnection, Error};

/// Runs work under `keys` on `conn` (principal `tenant-1`, fingerprint `f`)
/// with the key `order-panics` if `panics`, else `order-fails`. The work
/// runs `writes`, then panics ("a bug in the handler") or returns `err`.
/// Returns the key and the run's result, `Err` for the panic (caught).
pub fn fail_under_a_key<C>(
    keys: &Idempotency,
    conn: &mut C,
    panics: bool,
    err: Error,
    writes: impl FnOnce(&mut C::Conn) -> Result<(), Error>,
) -> (
    &'static str,
    std::thread::Result<Result<Outcome<String>, Error>>,
)
where
    C: AsLockingConnection,
    C::Conn: IdempotencyStore,
{
    let key = if panics {
        "order-panics"
    } else {
        "order-fails"
    };
    let failed = catch_unwind(AssertUnwindSafe(|| {
        keys.run(conn, "tenant-1", key, "f", |c| -> Result<String, Error> {
            writes(c)?;
            if panics {
                panic!("a bug in the handler");
            }
            Err(err)
        })
    }));
    (key, failed)
}
