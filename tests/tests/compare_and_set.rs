//! Compare-and-set on chosen columns (`lockkit::compare_and_set`) on every backend:
//! the write lands only while the columns hold what was read, a refused write
//! names each column with the value expected and the value found, and of several
//! racing writers exactly one wins.

use diesel::prelude::*;
use lockkit::compare_and_set::expect;
use lockkit::prelude::*;
use lockkit::Error;
use lockkit_tests::exec;

diesel::table! {
    payments (id) {
        id -> Integer,
        state -> Text,
        amount -> Integer,
        paid_by -> Integer,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Lockable)]
#[diesel(table_name = payments)]
struct Payment {
    id: i32,
    state: String,
    amount: i32,
    paid_by: i32,
}

const RACERS: usize = 8;

fn create<C: Connection>(conn: &mut C) {
    exec(
        conn,
        "CREATE TABLE payments (id INTEGER PRIMARY KEY, state VARCHAR(20) NOT NULL, \
         amount INTEGER NOT NULL, paid_by INTEGER NOT NULL)",
    );
    exec(
        conn,
        "INSERT INTO payments VALUES (5, 'pending', 100, 0), (6, 'pending', 200, 0)",
    );
}

/// Pays payment `$id` if its state is still `pending`: the compare-and-set
/// most tests here make.
macro_rules! pay {
    ($conn:expr, $id:expr) => {
        Payment::compare_and_set(
            $conn,
            $id,
            expect(payments::state, "pending".to_owned()),
            payments::state.eq("paid"),
        )
    };
}

fn stale_columns(err: Error) -> lockkit::StaleColumnsError {
    match err {
        Error::StaleColumns(stale) => stale,
        other => panic!("expected StaleColumns, got {other:?}"),
    }
}

lockkit_tests::backend_tests! {
    fn writes_while_the_column_holds_what_was_read(db) {
        let mut conn = db.connect();
        create(&mut conn);
        let rows = pay!(&mut conn, 5).unwrap();
        assert_eq!(rows, 1);
        let stored = payments::table.find(5).first::<Payment>(&mut conn).unwrap();
        assert_eq!(stored.state, "paid");
        // The other row is untouched.
        assert_eq!(payments::table.find(6).select(payments::state).first::<String>(&mut conn).unwrap(), "pending");

        // On an r2d2 pooled connection too, refusal included.
        let mut pooled = db.conn();
        pay!(&mut pooled, 6).unwrap();
        let again = pay!(&mut pooled, 6);
        assert!(matches!(again, Err(Error::StaleColumns(_))));
    }

    fn a_moved_column_is_refused_and_named_with_both_values(db) {
        let mut conn = db.connect();
        create(&mut conn);
        exec(&mut conn, "UPDATE payments SET state = 'cancelled' WHERE id = 5");
        let err = pay!(&mut conn, 5).unwrap_err();
        assert!(err.is_retryable());
        assert_eq!(err.to_string(), "stale compare-and-set of payments 5: expected state = \"pending\", found \"cancelled\"");
        let stale = stale_columns(err);
        assert_eq!((stale.table, stale.key.as_str(), stale.deleted), ("payments", "5", false));
        assert_eq!(stale.columns.len(), 1);
        assert_eq!(stale.columns[0].column, "state");
        assert_eq!(stale.columns[0].expected, "\"pending\"");
        assert_eq!(stale.columns[0].current.as_deref(), Some("\"cancelled\""));
        // Nothing was written.
        assert_eq!(payments::table.find(5).select(payments::state).first::<String>(&mut conn).unwrap(), "cancelled");
    }

    fn several_columns_each_reported_and_only_the_changed_listed(db) {
        let mut conn = db.connect();
        create(&mut conn);
        let expected = (expect(payments::state, "pending".to_owned()), expect(payments::amount, 100));
        exec(&mut conn, "UPDATE payments SET amount = 90 WHERE id = 5");
        let stale = stale_columns(
            Payment::compare_and_set(&mut conn, 5, expected.clone(), payments::state.eq("paid")).unwrap_err(),
        );
        let columns: Vec<_> = stale.columns.iter().map(|c| (c.column, c.expected.as_str(), c.current.as_deref())).collect();
        assert_eq!(columns, vec![("state", "\"pending\"", Some("\"pending\"")), ("amount", "100", Some("90"))]);
        assert_eq!(stale.changed().map(|c| c.column).collect::<Vec<_>>(), vec!["amount"]);

        // Three columns, all holding their values: the write lands.
        let three = (expect(payments::state, "pending".to_owned()), expect(payments::amount, 90), expect(payments::paid_by, 0));
        Payment::compare_and_set(&mut conn, 5, three, (payments::state.eq("paid"), payments::paid_by.eq(1))).unwrap();
        let stored = payments::table.find(5).first::<Payment>(&mut conn).unwrap();
        assert_eq!((stored.state.as_str(), stored.paid_by), ("paid", 1));
    }

    fn a_deleted_row_is_reported_as_deleted(db) {
        let mut conn = db.connect();
        create(&mut conn);
        exec(&mut conn, "DELETE FROM payments WHERE id = 5");
        let err = pay!(&mut conn, 5).unwrap_err();
        assert_eq!(err.to_string(), "stale compare-and-set of payments 5: expected state = \"pending\", but the row was deleted");
        let stale = stale_columns(err);
        assert!(stale.deleted);
        assert_eq!(stale.columns[0].current, None);
    }

    fn of_racing_writers_exactly_one_wins(db) {
        let mut setup = db.connect();
        create(&mut setup);
        let outcomes: Vec<(i32, Result<usize, Error>)> = db.race(RACERS, |conn, n, barrier| {
            let racer = n as i32 + 1;
            // Every racer read `pending`.
            let read = payments::table.find(5).first::<Payment>(conn).unwrap();
            assert_eq!(read.state, "pending");
            barrier.wait();
            let outcome = Payment::compare_and_set(
                conn, 5, expect(payments::state, read.state),
                (payments::state.eq("paid"), payments::paid_by.eq(racer)),
            );
            (racer, outcome)
        });
        let winners: Vec<i32> = outcomes.iter().filter(|(_, o)| o.is_ok()).map(|(r, _)| *r).collect();
        assert_eq!(winners.len(), 1, "exactly one payment: {outcomes:?}");
        let stored = payments::table.find(5).first::<Payment>(&mut setup).unwrap();
        assert_eq!((stored.state.as_str(), stored.paid_by), ("paid", winners[0]));
        for (_, outcome) in outcomes.into_iter().filter(|(_, o)| o.is_err()) {
            let stale = stale_columns(outcome.unwrap_err());
            assert_eq!(stale.columns[0].current.as_deref(), Some("\"paid\""));
        }
    }

    fn naive_baseline_read_then_write_pays_more_than_once(db) {
        let mut setup = db.connect();
        create(&mut setup);
        let paid: usize = db.race(RACERS, |conn, n, barrier| {
            let read = payments::table.find(5).first::<Payment>(conn).unwrap();
            barrier.wait();
            if read.state != "pending" {
                return 0;
            }
            // The check was in Rust, on a stale read: the write does not repeat it.
            diesel::update(payments::table.find(5))
                .set((payments::state.eq("paid"), payments::paid_by.eq(n as i32 + 1)))
                .execute(conn)
                .unwrap();
            1
        })
        .into_iter()
        .sum();
        // Every racer believed it paid: the payment was taken RACERS times.
        assert_eq!(paid, RACERS);
    }
}
