//! Counters without conflicts on every backend: `lockkit::atomic::update_counters`
//! adds in SQL (no read), and a `#[lockkit(no_bump)]` counter neither makes an
//! editor's versioned write stale nor is written back by it.

use std::sync::Barrier;
use std::thread;

use diesel::prelude::*;
use lockkit::atomic::{counter, update_counters};
use lockkit::prelude::*;
use lockkit_tests::exec;

diesel::table! {
    posts (id) {
        id -> Integer,
        title -> Text,
        views -> Nullable<Integer>,
        likes -> BigInt,
        lock_version -> Integer,
    }
}

/// `views` and `likes` are counters: `update_versioned` leaves them alone.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Versioned)]
#[diesel(table_name = posts)]
struct Post {
    id: i32,
    title: String,
    #[lockkit(no_bump)]
    views: Option<i32>,
    #[lockkit(no_bump)]
    likes: i64,
    lock_version: i32,
}

/// The same table without `no_bump`: `update_versioned` writes the counters too.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Versioned)]
#[diesel(table_name = posts)]
struct PostWritingCounters {
    id: i32,
    title: String,
    views: Option<i32>,
    likes: i64,
    lock_version: i32,
}

const THREADS: i32 = 6;
const PER_THREAD: i32 = 25;

fn create<C: Connection>(conn: &mut C) {
    exec(
        conn,
        "CREATE TABLE posts (id INTEGER PRIMARY KEY, title VARCHAR(100) NOT NULL, views INTEGER NULL, \
         likes BIGINT NOT NULL, lock_version INTEGER NOT NULL)",
    );
    exec(
        conn,
        "INSERT INTO posts VALUES (1, 'draft', NULL, 0, 0), (2, 'other', 7, 0, 0)",
    );
}

lockkit_tests::backend_tests! {
    fn counters_add_in_sql_and_null_counts_as_zero(db) {
        let mut conn = db.connect();
        create(&mut conn);
        let rows = update_counters(&mut conn, posts::table.find(1), (counter(posts::views, 3), counter(posts::likes, -2))).unwrap();
        assert_eq!(rows, 1);
        let post = posts::table.find(1).first::<Post>(&mut conn).unwrap();
        assert_eq!((post.views, post.likes, post.lock_version), (Some(3), -2, 0));
        // Row 2 is untouched; a missing row is NoRowMatched.
        assert_eq!(posts::table.find(2).select(posts::views).first::<Option<i32>>(&mut conn).unwrap(), Some(7));
        let missing = update_counters(&mut conn, posts::table.find(9), counter(posts::views, 1));
        assert!(matches!(missing, Err(lockkit::Error::NoRowMatched)));
        // Several rows at once.
        let rows = update_counters(&mut conn, posts::table.filter(posts::id.le(2)), counter(posts::likes, 10)).unwrap();
        assert_eq!(rows, 2);
    }

    fn counters_from_threads_give_the_exact_sum(db) {
        let mut setup = db.connect();
        create(&mut setup);
        thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut conn = db.connect();
                    for _ in 0..PER_THREAD {
                        update_counters(&mut conn, posts::table.find(1), counter(posts::views, 1)).unwrap();
                    }
                });
            }
        });
        let views = posts::table.find(1).select(posts::views).first::<Option<i32>>(&mut setup).unwrap();
        assert_eq!(views, Some(THREADS * PER_THREAD));
    }

    fn naive_baseline_read_then_write_loses_increments(db) {
        let mut setup = db.connect();
        create(&mut setup);
        exec(&mut setup, "UPDATE posts SET views = 0 WHERE id = 1");
        let barrier = Barrier::new(THREADS as usize);
        thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut conn = db.connect();
                    for _ in 0..PER_THREAD {
                        let read = posts::table.find(1).select(posts::views).first::<Option<i32>>(&mut conn).unwrap();
                        barrier.wait(); // every thread has read before any writes
                        diesel::update(posts::table.find(1))
                            .set(posts::views.eq(read.unwrap_or(0) + 1))
                            .execute(&mut conn)
                            .unwrap();
                        barrier.wait();
                    }
                });
            }
        });
        let views = posts::table.find(1).select(posts::views).first::<Option<i32>>(&mut setup).unwrap();
        // Each round added one, not THREADS: the other increments were lost.
        assert_eq!(views, Some(PER_THREAD));
    }

    fn a_no_bump_counter_and_a_versioned_edit_both_land(db) {
        let mut setup = db.connect();
        create(&mut setup);
        let editor_read = Barrier::new(THREADS as usize + 1);
        let halfway = Barrier::new(THREADS as usize + 1);
        let edited = thread::scope(|s| {
            for _ in 0..THREADS {
                s.spawn(|| {
                    let mut conn = db.connect();
                    editor_read.wait();
                    for i in 0..PER_THREAD {
                        if i == PER_THREAD / 2 {
                            halfway.wait();
                        }
                        update_counters(&mut conn, posts::table.find(1), (counter(posts::views, 1), counter(posts::likes, 2))).unwrap();
                    }
                });
            }
            let editor = s.spawn(|| {
                let mut conn = db.connect();
                let mut post = posts::table.find(1).first::<Post>(&mut conn).unwrap();
                editor_read.wait();
                halfway.wait(); // increments landed since the read, more are running
                post.title = "edited".into();
                post.update_versioned(&mut conn).map(|()| post.lock_version)
            });
            editor.join().unwrap()
        });
        // The edit was not refused although the counters moved since its read ...
        assert_eq!(edited.unwrap(), 1);
        let stored = posts::table.find(1).first::<Post>(&mut setup).unwrap();
        assert_eq!(stored.title, "edited");
        assert_eq!(stored.lock_version, 1);
        // ... and it did not write its stale counters back: every increment is there.
        assert_eq!(stored.views, Some(THREADS * PER_THREAD));
        assert_eq!(stored.likes, i64::from(2 * THREADS * PER_THREAD));
    }

    fn without_no_bump_the_edit_writes_stale_counters_back(db) {
        let mut conn = db.connect();
        create(&mut conn);
        let mut post = posts::table.find(2).first::<PostWritingCounters>(&mut conn).unwrap();
        assert_eq!(post.views, Some(7));
        for _ in 0..5 {
            update_counters(&mut conn, posts::table.find(2), counter(posts::views, 1)).unwrap();
        }
        post.title = "edited".into();
        post.update_versioned(&mut conn).unwrap();
        // The five views are gone: the edit wrote back the 7 it read.
        let views = posts::table.find(2).select(posts::views).first::<Option<i32>>(&mut conn).unwrap();
        assert_eq!(views, Some(7));
    }

    fn no_bump_fields_are_left_out_of_every_update_versioned(db) {
        let mut conn = db.connect();
        create(&mut conn);
        let mut post = posts::table.find(1).first::<Post>(&mut conn).unwrap();
        post.views = Some(1000);
        post.likes = 1000;
        post.title = "renamed".into();
        post.update_versioned(&mut conn).unwrap();
        let stored = posts::table.find(1).first::<Post>(&mut conn).unwrap();
        assert_eq!((stored.title.as_str(), stored.views, stored.likes, stored.lock_version), ("renamed", None, 0, 1));
        let sql = diesel::debug_query::<Backend, _>(&post.update_versioned_statement()).to_string();
        assert!(!sql.contains("views") && !sql.contains("likes"), "{sql}");
    }
}
