//! An HTML edit form that does not lose anyone's change: Rails' `lock_version` in
//! a hidden field, with lockkit.
//!
//! A person opens `/items/1/edit`, edits for minutes, and saves. The form carries
//! the version the page was rendered from (and the values it showed); the save is
//! `Item::update_by_version`, one `UPDATE .. WHERE id = ? AND lock_version = ?`.
//! If someone saved in between, nothing is written and the person gets a
//! conflict page (`409`): their values next to the values now stored, and a form
//! that re-applies *their* changes on the current version, keeping the other
//! person's changes to the fields they did not touch ([`merge`]).
//!
//! | file | what it holds |
//! | --- | --- |
//! | [`schema`] | the `items` table, the `Item` model, the database set-up |
//! | [`merge`] | what the person changed, and what re-applying it on the current row gives |
//! | [`pages`] | the HTML: edit page, conflict page |
//! | [`routes`] | the axum handlers |

pub mod merge;
pub mod pages;
pub mod routes;
pub mod schema;

pub use routes::app;
pub use schema::{setup, Item, Pool};
