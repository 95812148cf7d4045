//! A table as the database names it: what Diesel writes for the model's
//! `table!` (`"items"`, or `"archive"."items"` for a `table!` with a schema),
//! split into its schema and its name.
//!
//! `Lockable::TABLE_NAME` is the last segment of the model's
//! `#[diesel(table_name = ..)]`, which names the Rust module, not the table:
//! `archive.items` (`print-schema --schema archive`) and the `items` of the
//! connection's schema share it. What identifies a table, the journal's row
//! ids and the catalog question whether its key is unique, comes from here.
//! Rendered once per table and backend, for the life of the process.

// Without a backend feature no versioned write names a table.
#![cfg_attr(
    not(any(feature = "postgres", feature = "mysql", feature = "sqlite")),
    allow(dead_code)
)]

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

use diesel::backend::Backend;
use diesel::query_builder::QueryFragment;

/// A table as Diesel writes it for one backend.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TableName {
    /// The schema the `table!` names (on MySQL/MariaDB, the database), or
    /// `None`: the table of the connection's schema (its `search_path`).
    pub(crate) schema: Option<String>,
    /// The table's own name, unquoted.
    pub(crate) name: String,
    /// `schema` and `name` as the journal's row ids write them: quoted as Rust
    /// quotes a string (`"items"`), so that no name runs into the next, and
    /// the same for every backend.
    pub(crate) quoted_schema: Option<String>,
    pub(crate) quoted_name: String,
    /// `schema.name`, or `name` alone: the table as a stale report names it
    /// for bound ETags ([`StaleObjectError`](crate::StaleObjectError)'s
    /// `database_table`).
    pub(crate) qualified: String,
}

/// The name of table `T` on backend `DB`, rendered at the first call and kept.
pub(crate) fn of<T, DB>() -> &'static TableName
where
    T: QueryFragment<DB> + Default + 'static,
    DB: Backend + Default + 'static,
    DB::QueryBuilder: Default,
{
    type Names = HashMap<TypeId, &'static TableName>;
    static NAMES: LazyLock<RwLock<Names>> = LazyLock::new(RwLock::default);
    let id = TypeId::of::<(T, DB)>();
    if let Some(known) = NAMES.read().unwrap_or_else(|p| p.into_inner()).get(&id) {
        return known;
    }
    let rendered = diesel::debug_query::<DB, _>(&T::default()).to_string();
    let mut names = NAMES.write().unwrap_or_else(|p| p.into_inner());
    // One allocation per table and backend the process writes to.
    names
        .entry(id)
        .or_insert_with(|| Box::leak(Box::new(parse(&rendered))))
}

/// Splits what Diesel wrote for a table (`debug_query`'s text: the quoted
/// identifiers, then its list of binds) into schema and name. Text that is
/// not one or two quoted identifiers is kept whole as the name: a table
/// lockkit cannot name is never taken for another, and no catalog finds it.
fn parse(rendered: &str) -> TableName {
    let parts = identifiers(rendered);
    match parts {
        Some(mut parts) if parts.len() <= 2 => {
            let name = parts.pop().unwrap_or_default();
            TableName::new(parts.pop(), name)
        }
        _ => TableName::new(None, rendered.to_owned()),
    }
}

impl TableName {
    fn new(schema: Option<String>, name: String) -> Self {
        TableName {
            quoted_schema: schema.as_ref().map(|schema| format!("{schema:?}")),
            quoted_name: format!("{name:?}"),
            qualified: match &schema {
                Some(schema) => format!("{schema}.{name}"),
                None => name.clone(),
            },
            schema,
            name,
        }
    }
}

/// The leading quoted identifiers of `text` (`"a"."b"`, `` `a` ``; a quote
/// doubled inside stands for itself), separated by dots: `None` when `text`
/// does not start with one.
fn identifiers(text: &str) -> Option<Vec<String>> {
    let mut parts = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(quote) = chars.next_if(|&c| c == '"' || c == '`') {
        let mut part = String::new();
        loop {
            let c = chars.next()?;
            if c != quote {
                part.push(c);
            } else if chars.next_if_eq(&quote).is_some() {
                part.push(quote);
            } else {
                break;
            }
        }
        parts.push(part);
        if chars.next_if_eq(&'.').is_none() {
            break;
        }
    }
    (!parts.is_empty()).then_some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(schema: Option<&str>, name: &str) -> TableName {
        TableName::new(schema.map(Into::into), name.into())
    }

    #[test]
    fn a_table_of_the_connections_schema_has_no_schema() {
        assert_eq!(parse(r#""items" -- binds: []"#), named(None, "items"));
        assert_eq!(parse("`items` -- binds: []"), named(None, "items"));
    }

    #[test]
    fn a_qualified_table_names_its_schema() {
        assert_eq!(
            parse(r#""archive"."items" -- binds: []"#),
            named(Some("archive"), "items")
        );
        assert_eq!(
            parse("`archive`.`items` -- binds: []"),
            named(Some("archive"), "items")
        );
    }

    #[test]
    fn doubled_quotes_and_dots_inside_a_name_are_the_names_own() {
        assert_eq!(
            parse(r#""my ""odd"".schema"."it.ems""#),
            named(Some(r#"my "odd".schema"#), "it.ems")
        );
        assert_eq!(parse("`a``b`"), named(None, "a`b"));
    }

    #[test]
    fn text_that_is_not_a_quoted_name_is_kept_whole() {
        for odd in [
            "items",
            r#""unterminated"#,
            r#""a"."b"."c""#,
            "",
            r#"("items") AS x"#,
        ] {
            assert_eq!(parse(odd), named(None, odd), "{odd:?}");
        }
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn renders_what_diesel_writes_for_a_table() {
        mod archive {
            diesel::table! { archive.items (id) { id -> Integer, } }
        }
        mod plain {
            diesel::table! { items (id) { id -> Integer, } }
        }
        let qualified = of::<archive::items::table, diesel::pg::Pg>();
        assert_eq!(*qualified, named(Some("archive"), "items"));
        let unqualified = of::<plain::items::table, diesel::pg::Pg>();
        assert_eq!(*unqualified, named(None, "items"));
        // Kept: the second call hands out the first rendering.
        assert!(std::ptr::eq(
            qualified,
            of::<archive::items::table, diesel::pg::Pg>()
        ));
    }
}
