//! `#[derive(Versioned)]` and `#[derive(Lockable)]` for [lockkit](https://docs.rs/lockkit).
//!
//! The derives only *describe* a model to lockkit: its table and primary key
//! (`Lockable`), plus its version column and type and the changeset of its other
//! fields (`Versioned`, which implements both traits). All behaviour lives in the
//! `lockkit` crate as generic code. Use them through lockkit (`lockkit::Versioned`,
//! `lockkit::Lockable`); their attributes are documented on the two derives below.
//!
//! Stages, one private module each: `attr` reads `#[diesel(...)]` and
//! `#[lockkit(...)]`, `ast` builds and validates the model (collecting every error
//! through `ctxt`), and `expand` generates the impl; on errors, `fallback` emits
//! them with stub impls, so that call sites add no errors of their own; both
//! wrap what they generate in `dummy`'s `const _`.

mod ast;
mod attr;
mod ctxt;
mod derive;
mod dummy;
mod expand;
mod fallback;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Implements `lockkit::Versioned` and `lockkit::Lockable` for a struct that
/// maps a table with a version column.
///
/// The derive only describes the model: its table and primary key, its version
/// column and type, and the changeset of its other fields. Every method is
/// generic code in lockkit.
///
/// # Attributes
///
/// lockkit's own attributes, on fields each without a value, and one on the
/// struct:
///
/// | attribute | on | default | meaning |
/// | --- | --- | --- | --- |
/// | `#[lockkit(crate = "my_db::lockkit")]`, or the path without quotes | struct | `::lockkit` | the path the generated code reaches lockkit by: for a crate that depends on lockkit under another name, or only through a facade crate that re-exports it (`pub use lockkit;`) |
/// | `#[lockkit(version)]` | one field | the field named `lock_version` | this field is the version column |
/// | `#[lockkit(no_bump)]` | any fields but the key and the version | not set | `update_versioned` leaves the column out: a counter or timestamp written on its own (`lockkit::atomic::update_counters`) neither makes an editor stale nor is written back by the editor |
/// | `#[lockkit(updated_at)]` | one field, not the key or the version, on a timestamp column (its type is not checked: on a text column the server stores the time as text) | not set | every versioned write sets the column to `CURRENT_TIMESTAMP`, the database's clock; `update_versioned` does not write the field's own value |
///
/// The version field is `i16`, `i32` or `i64`: not an `Option` (a `NULL` version
/// cannot be compared; declare the column `NOT NULL DEFAULT 0`), and not part of
/// the primary key.
///
/// Everything else is read from Diesel's own `#[diesel(..)]` attributes, with
/// Diesel's defaults, so the model says nothing twice. Keys not listed here are
/// left to Diesel.
///
/// | attribute | on | default | used for |
/// | --- | --- | --- | --- |
/// | `#[diesel(table_name = items)]`, or a path (`crate::schema::items`) | struct | the struct's name in snake case plus `s` (`FooBar` → `foo_bars`) | the table of every statement |
/// | `#[diesel(primary_key(id))]`, `primary_key(a, b)` | struct | `id` | the `WHERE` of every write; a composite key is a tuple (`Key = (i32, i32)`) |
/// | `#[diesel(column_name = version)]` | field | the field's name | the field's column, for the key, the version and the changeset |
/// | `#[diesel(skip_update)]` | field | not set | `update_versioned` leaves the column out |
/// | `#[diesel(treat_none_as_null = true)]` | struct, or field (which wins) | `false` | `update_versioned` writes `None` as `NULL`; by default a `None` leaves its column alone, as Diesel's `AsChangeset` does |
/// | `#[diesel(serialize_as = ..)]`, `#[diesel(embed)]`, `#[diesel(select_expression = ..)]` | field | | refused unless the field is `skip_update`: `update_versioned` cannot write it (a selected expression is not its column's value); write it with `update_versioned_with` |
///
/// Each column has one field: a second field on the version column or on a key
/// column is refused. Diesel's attribute forms from before 2.0
/// (`#[table_name = ".."]`, `#[primary_key(..)]`, `#[column_name = ".."]`,
/// `#[changeset_options(..)]`), which Diesel still reads with its default
/// `with-deprecated` feature, are refused: write the `#[diesel(..)]` form.
///
/// # Errors
///
/// Every mistake is a compile error at the attribute, field or type at fault:
/// what is wrong, then a `help:` line with the correct form. All of them are
/// reported in one build, in source order:
///
/// ```text
/// error: the version must be `i16`, `i32` or `i64`
///        help: write `lock_version: i32`, on an `INTEGER` column (`i16` for `SMALLINT`, `i64` for `BIGINT`)
///   --> src/models.rs:14:23
///    |
/// 14 |     pub lock_version: String,
///    |                       ^^^^^^
/// ```
///
/// The traits are implemented even then, so that calls such as
/// `update_versioned` or `with_lock` add no errors of their own.
///
/// # What it generates
///
/// For `struct Item { id: i32, name: String, lock_version: i32 }` with
/// `#[diesel(table_name = items)]`, inside a `const _: () = { .. };` that
/// begins `use ::lockkit as __lockkit;` (the `crate` path when one is given),
/// the one name of lockkit the generated code uses:
///
/// ```text
/// impl Lockable for Item {
///     type Table = items::table;
///     type Key = i32;
///     type OnLock = BumpVersion; // an exclusive lock advances the version
///     const TABLE_NAME: &'static str = "items";
///     const KEY_COLUMNS: &'static [&'static str] = &["id"];
///     fn key(&self) -> i32 {
///         self.id.clone()
///     }
/// }
///
/// impl Versioned for Item {
///     type VersionColumn = items::lock_version;
///     type Version = i32;
///     // `ByType`: Diesel prepares the UPDATE once per connection, keyed by type
///     // (`BySql`, keyed by its SQL text, when an `Option` field is skipped when `None`).
///     type Changeset<'a> = ByType<(Eq<items::name, &'a String>,)> where Self: 'a;
///     // `SetUpdatedAt<items::updated_at>` for a `#[lockkit(updated_at)]` field.
///     type UpdatedAt = NoUpdatedAt<items::table>;
///     fn version(&self) -> i32 {
///         self.lock_version
///     }
///     fn set_version(&mut self, version: i32) {
///         self.lock_version = version;
///     }
///     fn versioned_changeset(&self) -> Self::Changeset<'_> {
///         ByType((items::name.eq(&self.name),))
///     }
/// }
/// ```
#[proc_macro_derive(Versioned, attributes(lockkit))]
pub fn derive_versioned(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive_versioned(&input).into()
}

/// Implements `lockkit::Lockable` for a struct without a version column: its
/// table and primary key, for `with_lock` and `lock_all`. A lock writes nothing
/// to the row (`OnLock = NoVersion`).
///
/// `#[derive(Versioned)]` implements `Lockable` too: derive one or the other.
/// On a table with a version column, every model that locks its rows must be
/// `Versioned`: a `Lockable` one's lock would leave the version as it is, and an
/// editor holding an older copy of the row would write over the locked change.
/// A field on the column `lock_version` is refused for this reason; a version
/// column of another name the derive cannot recognise.
///
/// # Attributes
///
/// lockkit's one attribute is `#[lockkit(crate = "my_db::lockkit")]` on the
/// struct, as for `#[derive(Versioned)]`; the field attributes `version`,
/// `no_bump` and `updated_at` are refused, with a hint to derive `Versioned`.
/// From Diesel's `#[diesel(..)]`, with Diesel's defaults:
///
/// | attribute | on | default | used for |
/// | --- | --- | --- | --- |
/// | `#[diesel(table_name = jobs)]`, or a path (`crate::schema::jobs`) | struct | the struct's name in snake case plus `s` (`FooBar` → `foo_bars`) | the table locked |
/// | `#[diesel(primary_key(id))]`, `primary_key(a, b)` | struct | `id` | the `WHERE` of the locked read; a composite key is a tuple (`Key = (i32, i32)`) |
/// | `#[diesel(column_name = job_id)]` | field | the field's name | the field's column, to find the key's fields |
///
/// # Errors
///
/// As for `#[derive(Versioned)]`: each mistake once, in source order, with a
/// `help:` line, and the trait implemented anyway so that call sites add no
/// errors of their own.
#[proc_macro_derive(Lockable, attributes(lockkit))]
pub fn derive_lockable(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive_lockable(&input).into()
}
