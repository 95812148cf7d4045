//! A stale write's report carries what the loser tried to write (Rails'
//! `StaleObjectError#record`) on every backend, through `?` into
//! `lockkit::Error` and into an application's own error type.

use std::sync::Barrier;
use std::thread;

use diesel::prelude::*;
use lockkit::prelude::*;
use lockkit::Error;
use lockkit_tests::models::*;
use lockkit_tests::schema::*;
use lockkit_tests::seed_items;

const RACERS: i32 = 6;

/// An application's error, as a handler would have it.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] Error),
}

fn save<C>(conn: &mut C, item: &mut Item) -> Result<(), AppError>
where
    C: Connection,
    Item: lockkit::bounds::CurrentVersionQuery<C>,
    for<'a> lockkit::optimistic::version_check::UpdateVersioned<Item, <Item as Versioned>::Changeset<'a>>:
        diesel::query_dsl::methods::ExecuteDsl<C>,
{
    item.update_versioned_recorded(conn)?;
    Ok(())
}

lockkit_tests::backend_tests! {
    fn each_loser_gets_back_exactly_what_it_sent(db) {
        let mut setup = db.connect();
        seed_items(&mut setup, &[(1, 10)]);
        let barrier = Barrier::new(RACERS as usize);
        let outcomes: Vec<(Item, Result<(), AppError>)> = thread::scope(|s| {
            let handles: Vec<_> = (1..=RACERS)
                .map(|racer| {
                    let (db, barrier) = (&db, &barrier);
                    s.spawn(move || {
                        let mut conn = db.connect();
                        let mut item = items::table.find(1).first::<Item>(&mut conn).unwrap();
                        barrier.wait();
                        item.stock = 100 + racer;
                        item.name = format!("racer {racer}");
                        let sent = item.clone();
                        (sent, save(&mut conn, &mut item))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<&Item> = outcomes.iter().filter(|(_, o)| o.is_ok()).map(|(sent, _)| sent).collect();
        assert_eq!(winners.len(), 1, "{outcomes:?}");
        let stored = items::table.find(1).first::<Item>(&mut setup).unwrap();
        assert_eq!((stored.stock, stored.lock_version), (winners[0].stock, 1));
        for (sent, outcome) in outcomes.iter().filter(|(_, o)| o.is_err()) {
            let Err(AppError::Lock(err)) = outcome else { unreachable!() };
            let stale = err.as_stale().expect("a stale write");
            let record = stale.record::<Item>().expect("the loser's record");
            assert_eq!(record, sent, "the record is what this loser sent");
            assert_ne!(record.stock, stored.stock);
            assert_eq!(stale.record.as_ref().unwrap().type_name(), std::any::type_name::<Item>());
            // Another type is not there.
            assert!(stale.record::<String>().is_none());
        }
    }

    fn plain_update_versioned_attaches_nothing_and_with_record_attaches_a_form(db) {
        let mut conn = db.connect();
        seed_items(&mut conn, &[(1, 10)]);
        let mut old = items::table.find(1).first::<Item>(&mut conn).unwrap();
        let mut fresh = old.clone();
        fresh.touch_versioned(&mut conn).unwrap();
        let err = old.update_versioned(&mut conn).unwrap_err();
        assert!(err.as_stale().unwrap().record.is_none());
        old.stock = 1;

        // A form that arrives with the version it was rendered at.
        #[derive(Debug, PartialEq)]
        struct Form { stock: i32, version: i32 }
        let form = Form { stock: 5, version: 0 };
        let err = Item::update_by_version(&mut conn, 1, form.version, items::stock.eq(form.stock))
            .map_err(|e| e.with_record(|| form))
            .unwrap_err();
        assert_eq!(err.as_stale().unwrap().record::<Form>(), Some(&Form { stock: 5, version: 0 }));
        // Other errors pass through untouched, and the closure does not run.
        let other = Error::NotFound.with_record(|| -> Form { panic!("not stale") });
        assert!(matches!(other, Error::NotFound));
    }
}
