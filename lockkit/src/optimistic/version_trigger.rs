//! Database triggers that bump the version on every `UPDATE`, for writers that
//! bypass lockkit (raw SQL, other services, admin consoles).
//!
//! Optimistic locking only works if every writer bumps the version. A trigger
//! makes the database do it: every `UPDATE` must move the version forward. When
//! the statement already did (lockkit's `lock_version = lock_version + 1`, or a
//! writer that sets a larger number), the trigger leaves it alone; when it left
//! the version unchanged, set it to NULL, or moved it *back* (a plain save of a
//! struct read long ago writes its old version), the trigger sets it to the old
//! version plus one. (On SQLite, whose trigger runs after the row is written,
//! a `NOT NULL` version column refuses the `NULL` first: the write fails.) So the version never repeats, every raw write is visible,
//! and a struct read before a raw write gets [`Error::Stale`](crate::Error::Stale)
//! on its next versioned write.
//!
//! The trigger sees updates only. A row deleted and inserted again (`DELETE`
//! then `INSERT`, MySQL's `REPLACE`, SQLite's `INSERT OR REPLACE`) is a new row
//! to it, at the version its insert writes: a struct (or an ETag) read from the
//! old row can match the new one. Write a row back with an upsert (`ON
//! CONFLICT DO UPDATE`, `ON DUPLICATE KEY UPDATE`), which runs the update
//! trigger, or insert it again with a version past the old one.
//!
//! Put the SQL in a migration:
//!
//! ```
//! use lockkit::version_trigger::{up_sql, Dialect};
//! let sql = up_sql(Dialect::Postgres, "items", "lock_version").unwrap();
//! assert!(sql.contains("CREATE TRIGGER lockkit_version_items_lock_version"));
//! ```
//!
//! The generated SQL, for table `items` and column `lock_version`:
//!
//! ```sql
//! -- PostgreSQL
//! CREATE FUNCTION lockkit_version_items_lock_version() RETURNS trigger AS $$
//! BEGIN
//!   IF NEW."lock_version" IS NULL OR NEW."lock_version" <= OLD."lock_version" THEN
//!     NEW."lock_version" := OLD."lock_version" + 1;
//!   END IF;
//!   RETURN NEW;
//! END
//! $$ LANGUAGE plpgsql;
//! CREATE TRIGGER lockkit_version_items_lock_version BEFORE UPDATE ON "items"
//!   FOR EACH ROW EXECUTE FUNCTION lockkit_version_items_lock_version();
//!
//! -- MySQL / MariaDB
//! CREATE TRIGGER lockkit_version_items_lock_version BEFORE UPDATE ON `items` FOR EACH ROW
//!   SET NEW.`lock_version` = IF(NEW.`lock_version` IS NULL OR NEW.`lock_version` <= OLD.`lock_version`, OLD.`lock_version` + 1, NEW.`lock_version`);
//!
//! -- SQLite (AFTER, as SQLite cannot assign NEW; recursive triggers are off by default)
//! CREATE TRIGGER lockkit_version_items_lock_version AFTER UPDATE ON `items` FOR EACH ROW
//!   WHEN NEW.`lock_version` IS NULL OR NEW.`lock_version` <= OLD.`lock_version`
//!   BEGIN UPDATE `items` SET `lock_version` = OLD.`lock_version` + 1 WHERE rowid = NEW.rowid; END;
//! ```
//!
//! Table and column names are identifiers, not values, so they cannot be bound:
//! they are checked to be plain identifiers (`[A-Za-z_][A-Za-z0-9_]*`, at most 40
//! characters) and anything else is refused. They are quoted, as Diesel
//! quotes them (double quotes on PostgreSQL, backticks elsewhere), so a
//! reserved word (`order`) works: pass them as your `table!` names them. A
//! table of another schema (`archive.items`) is not a plain identifier:
//! write that trigger by hand (a trigger installed for `items` would go to
//! whichever `items` the migration's `search_path` or database finds).
//!
//! Two pairs can make one name (`a_b`.`c` and `a`.`b_c`; on PostgreSQL, which
//! folds the unquoted trigger name to lower case, also `Items` and `items`),
//! and PostgreSQL cuts a name at 63 bytes. MySQL/MariaDB refuse a trigger
//! name over 64 characters (a table and a column of more than 47 together).
//! The server then refuses the second trigger (its function's
//! name is taken, on PostgreSQL; its trigger's, on MySQL/MariaDB and SQLite):
//! nothing replaces the first table's trigger. Rename one column or table, or
//! write that trigger by hand under a name of your own. On PostgreSQL, dropping
//! the table leaves the function: run [`down_sql`] before installing again.

/// The SQL dialect of the generated trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// PostgreSQL 11+ (`EXECUTE FUNCTION`).
    Postgres,
    /// MySQL 5.7+ / MariaDB 10.2+.
    Mysql,
    /// SQLite (a table with a `rowid`).
    Sqlite,
}

/// A table or column name that is not a plain identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a plain SQL identifier ([A-Za-z_][A-Za-z0-9_]*, at most 40 characters)")]
pub struct InvalidIdentifier(pub String);

fn identifier(name: &str) -> Result<&str, InvalidIdentifier> {
    let mut chars = name.chars();
    let valid = name.len() <= 40
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(name)
    } else {
        Err(InvalidIdentifier(name.to_owned()))
    }
}

/// The trigger's name: `lockkit_version_<table>_<column>`.
///
/// # Errors
///
/// [`InvalidIdentifier`] when `table` or `column` is not a plain identifier.
pub fn trigger_name(table: &str, column: &str) -> Result<String, InvalidIdentifier> {
    Ok(format!(
        "lockkit_version_{}_{}",
        identifier(table)?,
        identifier(column)?
    ))
}

/// The SQL that installs the trigger (one or two statements; run it with
/// `batch_execute` or put it in a migration's `up.sql`).
///
/// # Errors
///
/// [`InvalidIdentifier`] when `table` or `column` is not a plain identifier.
pub fn up_sql(dialect: Dialect, table: &str, column: &str) -> Result<String, InvalidIdentifier> {
    let name = trigger_name(table, column)?;
    let (t, c) = (table, column);
    Ok(match dialect {
        // Quoted, as Diesel names them: PostgreSQL folds an unquoted name to
        // lower case, and a reserved word (`order`) is a name only quoted.
        Dialect::Postgres => format!(
            "CREATE FUNCTION {name}() RETURNS trigger AS $$\n\
             BEGIN\n  IF NEW.\"{c}\" IS NULL OR NEW.\"{c}\" <= OLD.\"{c}\" THEN\n    NEW.\"{c}\" := OLD.\"{c}\" + 1;\n  END IF;\n  RETURN NEW;\nEND\n\
             $$ LANGUAGE plpgsql;\n\
             CREATE TRIGGER {name} BEFORE UPDATE ON \"{t}\"\n  FOR EACH ROW EXECUTE FUNCTION {name}();\n"
        ),
        // Quoted with backticks, as Diesel names them there: a table or
        // column named by a reserved word (`order`, `groups`) works.
        Dialect::Mysql => format!(
            "CREATE TRIGGER {name} BEFORE UPDATE ON `{t}` FOR EACH ROW\n  \
             SET NEW.`{c}` = IF(NEW.`{c}` IS NULL OR NEW.`{c}` <= OLD.`{c}`, OLD.`{c}` + 1, NEW.`{c}`);\n"
        ),
        Dialect::Sqlite => format!(
            "CREATE TRIGGER {name} AFTER UPDATE ON `{t}` FOR EACH ROW\n  \
             WHEN NEW.`{c}` IS NULL OR NEW.`{c}` <= OLD.`{c}`\n  \
             BEGIN UPDATE `{t}` SET `{c}` = OLD.`{c}` + 1 WHERE rowid = NEW.rowid; END;\n"
        ),
    })
}

/// The SQL that removes the trigger (for a migration's `down.sql`).
///
/// # Errors
///
/// [`InvalidIdentifier`] when `table` or `column` is not a plain identifier.
pub fn down_sql(dialect: Dialect, table: &str, column: &str) -> Result<String, InvalidIdentifier> {
    let name = trigger_name(table, column)?;
    Ok(match dialect {
        Dialect::Postgres => format!(
            "DROP TRIGGER IF EXISTS {name} ON \"{table}\";\nDROP FUNCTION IF EXISTS {name}();\n"
        ),
        Dialect::Mysql | Dialect::Sqlite => format!("DROP TRIGGER IF EXISTS {name};\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_are_accepted() {
        assert!(up_sql(Dialect::Mysql, "items", "lock_version").is_ok());
        assert!(up_sql(Dialect::Mysql, "_t9", "v").is_ok());
        for bad in [
            "",
            "9items",
            "items; DROP TABLE x",
            "it ems",
            "it\"ems",
            "ítems",
            &"x".repeat(41),
        ] {
            assert_eq!(
                up_sql(Dialect::Postgres, bad, "v"),
                Err(InvalidIdentifier(bad.to_owned())),
                "{bad}"
            );
            assert!(down_sql(Dialect::Sqlite, "items", bad).is_err(), "{bad}");
        }
    }
}
