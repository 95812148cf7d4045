//! `updated_at`, set by the database's clock on every versioned write.
//!
//! Mark a timestamp field `#[lockkit(updated_at)]` and every versioned write
//! (`update_versioned`, `update_versioned_with`, `update_by_version`,
//! `update_all_by_version`, `touch_versioned`, and the version bump of an
//! exclusive lock) sets it in the same statement:
//!
//! ```sql
//! UPDATE posts SET title = $1, lock_version = lock_version + 1, updated_at = CURRENT_TIMESTAMP
//!  WHERE posts.id = $2 AND posts.lock_version = $3
//! ```
//!
//! Put it on a column of a date-and-time or text type (`Timestamp`,
//! `Timestamptz`, `Datetime`, `Text`): lockkit does not check the column's
//! type, and an integer column (epoch milliseconds) takes what the server makes
//! of `CURRENT_TIMESTAMP` there, on MySQL/MariaDB the number `20261206050058`,
//! on SQLite the text, read back as `2026` (PostgreSQL refuses it).
//!
//! `CURRENT_TIMESTAMP` is the database's clock on PostgreSQL (the transaction's
//! start, as `NOW()`), MySQL/MariaDB (to the second, also in a `DATETIME(6)`
//! column) and SQLite (UTC, to the second), so
//! application servers with skewed clocks agree. The field is left out of the
//! fields `update_versioned` writes, and the struct keeps the value it was read
//! with: re-read the row to see the new time. A model without the attribute sends
//! exactly the statements it sent before.
//!
//! ```
//! use diesel::prelude::*;
//! use lockkit::prelude::*;
//!
//! diesel::table! { posts (id) { id -> Integer, title -> Text, updated_at -> Nullable<Text>, lock_version -> Integer } }
//!
//! #[derive(Queryable, Selectable, Versioned)]
//! #[diesel(table_name = posts)]
//! pub struct Post {
//!     pub id: i32,
//!     pub title: String,
//!     #[lockkit(updated_at)]
//!     pub updated_at: Option<String>,
//!     pub lock_version: i32,
//! }
//!
//! # fn main() -> Result<(), lockkit::Error> {
//! # let mut conn = SqliteConnection::establish(":memory:").unwrap();
//! # diesel::sql_query("CREATE TABLE posts (id INTEGER PRIMARY KEY, title TEXT NOT NULL, updated_at TEXT, lock_version INTEGER NOT NULL)").execute(&mut conn)?;
//! # diesel::sql_query("INSERT INTO posts VALUES (1, 'draft', NULL, 0)").execute(&mut conn)?;
//! let mut post = posts::table.find(1).first::<Post>(&mut conn)?;
//! post.title = "final".into();
//! post.update_versioned(&mut conn)?;
//! let stamped = posts::table.find(1).select(posts::updated_at).first::<Option<String>>(&mut conn)?;
//! assert!(stamped.is_some());
//! # Ok(()) }
//! ```

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AsChangeset, AstPass, QueryFragment, QueryId};
use diesel::{Column, QueryResult, Table};

/// `<column> = CURRENT_TIMESTAMP`: the [`Versioned::UpdatedAt`](crate::Versioned::UpdatedAt)
/// of a model with a `#[lockkit(updated_at)]` field.
pub struct SetUpdatedAt<C>(PhantomData<C>);

/// Nothing: the [`Versioned::UpdatedAt`](crate::Versioned::UpdatedAt) of a model
/// without an `updated_at` field. Adds no SQL to a write.
pub struct NoUpdatedAt<T>(PhantomData<T>);

macro_rules! zero_sized {
    ($($name:ident),*) => {$(
        impl<P> Default for $name<P> {
            fn default() -> Self {
                $name(PhantomData)
            }
        }

        impl<P> Clone for $name<P> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<P> Copy for $name<P> {}

        impl<P> std::fmt::Debug for $name<P> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($name))
            }
        }

        impl<P: 'static> QueryId for $name<P> {
            type QueryId = Self;
            const HAS_STATIC_QUERY_ID: bool = true;
        }
    )*};
}

zero_sized!(SetUpdatedAt, NoUpdatedAt);

impl<C: Column> AsChangeset for SetUpdatedAt<C> {
    type Target = C::Table;
    type Changeset = Self;

    fn as_changeset(self) -> Self {
        self
    }
}

impl<C: Column, DB: Backend> QueryFragment<DB> for SetUpdatedAt<C> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_identifier(C::NAME)?;
        out.push_sql(" = CURRENT_TIMESTAMP");
        Ok(())
    }
}

impl<T: Table> AsChangeset for NoUpdatedAt<T> {
    type Target = T;
    type Changeset = Self;

    fn as_changeset(self) -> Self {
        self
    }
}

impl<T, DB: Backend> QueryFragment<DB> for NoUpdatedAt<T> {
    fn walk_ast<'b>(&'b self, _: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        Ok(())
    }

    // A changeset list leaves out what is a no-op, comma included.
    fn is_noop(&self, _: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}
