//! Models covering the shapes `#[derive(Versioned)]` supports.

use diesel::prelude::*;
use lockkit::{Lockable, Versioned};

use crate::schema::{documents, gadgets, items, jobs, notes, order_lines, sku_codes, twins};

/// The classic: `lock_version: i32`, and a Diesel `AsChangeset` that includes it.
/// `#[derive(Versioned)]` makes `lock_version` its optimistic-locking version:
/// `update_versioned` writes only if nobody else wrote since this struct was read.
#[derive(
    Debug, Clone, PartialEq, Eq, Queryable, Selectable, Identifiable, AsChangeset, Versioned,
)]
#[diesel(table_name = items)]
pub struct Item {
    /// Primary key.
    pub id: i32,
    /// Display name.
    pub name: String,
    /// Units left.
    pub stock: i32,
    /// The version this row was read at.
    pub lock_version: i32,
}

/// The same table, with Diesel's `AsChangeset` told to skip the version.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, AsChangeset, Versioned)]
#[diesel(table_name = items)]
pub struct ItemSkippingVersion {
    pub id: i32,
    pub name: String,
    pub stock: i32,
    #[diesel(skip_update)]
    pub lock_version: i32,
}

/// `i16` version under another name, marked explicitly, with a renamed column.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = gadgets)]
pub struct Gadget {
    pub id: i32,
    pub label: String,
    #[lockkit(version)]
    #[diesel(column_name = version)]
    pub revision: i16,
}

/// `i64` key and version, and an `Option` field (skipped when `None`, as Diesel does).
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = documents)]
pub struct Document {
    pub id: i64,
    pub title: String,
    pub note: Option<String>,
    pub lock_version: i64,
}

/// `Document` with `treat_none_as_null`: `None` writes `NULL`.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Versioned)]
#[diesel(table_name = documents, treat_none_as_null = true)]
pub struct DocumentNullable {
    pub id: i64,
    pub title: String,
    pub note: Option<String>,
    pub lock_version: i64,
}

/// A composite primary key.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = order_lines, primary_key(order_id, line_no))]
pub struct OrderLine {
    pub order_id: i32,
    pub line_no: i32,
    pub qty: i32,
    pub lock_version: i32,
}

/// A model without a version column: `Lockable` only.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Lockable)]
#[diesel(table_name = jobs)]
pub struct Job {
    pub id: i32,
    pub payload: String,
    pub done: bool,
}

/// A model whose declared key the database does not enforce.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Versioned)]
#[diesel(table_name = twins)]
pub struct Twin {
    pub id: i32,
    pub label: String,
    pub lock_version: i32,
}

/// A row of `lockkit_archive.items`: [`Item`]'s table name, in another schema,
/// where the database does not enforce its key.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = crate::schema::archive::items)]
pub struct Archived {
    pub id: i32,
    pub name: String,
    pub stock: i32,
    pub lock_version: i32,
}

/// A string primary key.
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = sku_codes, primary_key(code))]
pub struct Sku {
    pub code: String,
    pub stock: i32,
    pub lock_version: i32,
}

/// A model with an `updated_at` column, written by the database's clock. It is
/// never loaded whole (the test crate maps no timestamp type): `updated_at` is
/// written by the database, never from the field.
#[derive(Debug, Clone, Identifiable, Versioned)]
#[diesel(table_name = notes)]
pub struct Note {
    pub id: i32,
    pub body: String,
    #[lockkit(updated_at)]
    pub updated_at: Option<String>,
    pub lock_version: i32,
}

/// A UUID primary key (feature `uuid`; PostgreSQL only).
#[cfg(all(feature = "harness", feature = "postgres"))]
#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = crate::schema::tickets)]
pub struct Ticket {
    pub id: uuid::Uuid,
    pub title: String,
    pub lock_version: i32,
}
