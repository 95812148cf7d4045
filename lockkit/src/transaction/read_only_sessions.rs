//! The guard against a transaction the server ends without an error
//! (MariaDB Galera): [`read_only_outside_transactions`].

#[cfg(feature = "mysql")]
use crate::error::{classify, Error};

/// Makes the MySQL/MariaDB session behind `conn` refuse writes outside
/// transactions (`SET SESSION TRANSACTION READ ONLY`), and tells lockkit so
/// (with whether the server answers `@@in_transaction`, asked here: on
/// MariaDB the `COMMIT` of lockkit's transactions also asks it; docs/SQL.md).
///
/// lockkit's transactions begin read-write whatever the session's default. A
/// statement the server runs after it ended a transaction without an error
/// (MariaDB Galera does, for another node's write) is then refused instead of
/// committing on its own, and lockkit reads that refusal inside its
/// transactions as the end it is: [`Error::Deadlock`], which the retrying
/// calls run again (README, "Galera").
///
/// Telling lockkit makes its journal look, from this call on, for statements
/// of the work that may commit the transaction themselves (DDL, a raw
/// `COMMIT`, `SET autocommit`, a `CALL`, a batch of several statements): a
/// write refused after one is [`Error::ReadOnly`], which no retry takes up,
/// since what came before the commit stands. That look reads each statement's
/// SQL, so lockkit does it only on sessions it knows to be read-only: made so
/// here, or on which its journal saw the server refuse a write. On a session
/// it does not know, every refusal inside its transactions fails the call
/// with [`Error::ReadOnly`], run once: safe, but not retried. Called inside a
/// transaction, it takes that transaction for one that may have committed
/// itself (it did not look at its statements), and the same holds there.
///
/// Every write on the session must then run in lockkit's transactions
/// (README, "Galera", lists the calls that write outside one). Call this
/// where the pool hands out a connection (an r2d2 `CustomizeConnection`),
/// after installing any instrumentation of your own
/// ([`Journal::wrap`](crate::journal::Journal::wrap)): what the journal knows
/// goes with it when it is replaced. On a connection with instrumentation not
/// wrapped in a journal, the session is made read-only, and lockkit sees no
/// refusal. For a `#[derive(MultiConnection)]` enum, call it on its
/// MySQL/MariaDB variant's connection: the enum's journal is that
/// connection's.
///
/// ```no_run
/// use diesel::{Connection, MysqlConnection};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = MysqlConnection::establish("mysql://root@127.0.0.1/app")?;
/// lockkit::read_only_outside_transactions(&mut conn)?;
/// // A write outside lockkit's transactions is refused now.
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
pub fn read_only_outside_transactions(conn: &mut diesel::MysqlConnection) -> Result<(), Error> {
    use diesel::connection::SimpleConnection;
    use diesel::RunQueryDsl;
    conn.batch_execute(SET_READ_ONLY).map_err(classify)?;
    let answers = answers_in_transaction(in_transaction_probe().get_result(conn))?;
    super::journal::guard(conn, answers);
    Ok(())
}

/// `SELECT CAST(@@in_transaction AS SIGNED)`, sent once where a session is
/// made read-only: whether the server answers it (MariaDB does; the `COMMIT`
/// of a marked transaction then asks it, docs/SQL.md). Asked of the variable
/// itself, not read off `VERSION()`, which a server started with `--version`
/// or a proxy may answer for it. Blocking and async.
#[cfg(feature = "mysql")]
pub(crate) fn in_transaction_probe(
) -> diesel::dsl::select<diesel::expression::SqlLiteral<diesel::sql_types::BigInt>> {
    diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>(
        "CAST(@@in_transaction AS SIGNED)",
    ))
}

/// What [`in_transaction_probe`] answered: `true` where the server has the
/// variable, `false` where it has none (MySQL's 1193, "Unknown system
/// variable"); another failure is the call's.
#[cfg(feature = "mysql")]
pub(crate) fn answers_in_transaction(answer: diesel::QueryResult<i64>) -> Result<bool, Error> {
    match answer {
        Ok(_) => Ok(true),
        Err(diesel::result::Error::DatabaseError(_, info))
            if info.message().starts_with("Unknown system variable") =>
        {
            Ok(false)
        }
        Err(err) => Err(classify(err)),
    }
}

/// The session setting of [`read_only_outside_transactions`].
#[cfg(feature = "mysql")]
pub(crate) const SET_READ_ONLY: &str = "SET SESSION TRANSACTION READ ONLY";
