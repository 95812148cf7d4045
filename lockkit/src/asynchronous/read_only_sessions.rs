//! The guard against a transaction the server ends without an error, on
//! diesel-async: [`read_only_outside_transactions`].

#[cfg(feature = "mysql")]
use crate::error::{classify, Error};

/// The blocking [`read_only_outside_transactions`](crate::read_only_outside_transactions)
/// on diesel-async's MySQL/MariaDB connection: makes the session refuse writes
/// outside transactions (`SET SESSION TRANSACTION READ ONLY`), and tells
/// lockkit so. lockkit's async transactions begin read-write too.
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncMysqlConnection};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = AsyncMysqlConnection::establish("mysql://root@127.0.0.1/app").await?;
/// lockkit::asynchronous::read_only_outside_transactions(&mut conn).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
///
/// The server's refusal of the `SET`, or a failure of the question after it,
/// classified as every lockkit error is.
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub async fn read_only_outside_transactions(
    conn: &mut diesel_async::AsyncMysqlConnection,
) -> Result<(), Error> {
    use diesel_async::SimpleAsyncConnection;
    conn.batch_execute(crate::transaction::SET_READ_ONLY)
        .await
        .map_err(classify)?;
    let answer = diesel_async::RunQueryDsl::get_result(
        crate::transaction::in_transaction_probe(),
        &mut *conn,
    )
    .await;
    let mariadb = crate::transaction::answers_in_transaction(answer)?;
    crate::transaction::journal::guard(
        &mut crate::transaction::journal::AsyncWatched(conn),
        mariadb,
    );
    Ok(())
}
