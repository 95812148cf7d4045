//! The version trigger's identifier check (`lockkit::version_trigger`) on
//! arbitrary table and column names: it never panics and accepts exactly the
//! plain identifiers it documents (`[A-Za-z_][A-Za-z0-9_]*`, at most 40
//! characters), so nothing else can reach the generated SQL.

#![no_main]

use libfuzzer_sys::fuzz_target;
use lockkit::version_trigger::{down_sql, trigger_name, up_sql, Dialect};

// The rule as the test suite's property test checks it, from one file.
#[path = "../../tests/src/oracles.rs"]
mod oracles;
use oracles::plain_identifier;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (table, column) = text.split_once('\n').unwrap_or((&text, "lock_version"));
    let valid = plain_identifier(table) && plain_identifier(column);
    assert_eq!(trigger_name(table, column).is_ok(), valid);
    for dialect in [Dialect::Postgres, Dialect::Mysql, Dialect::Sqlite] {
        let up = up_sql(dialect, table, column);
        let down = down_sql(dialect, table, column);
        assert_eq!(up.is_ok(), valid, "{table:?} {column:?}");
        assert_eq!(down.is_ok(), valid);
        if let Ok(sql) = up {
            assert!(!sql.contains(['\'', '"', '`']));
            let template = up_sql(dialect, "t", "c").unwrap();
            assert_eq!(sql.matches(';').count(), template.matches(';').count());
        }
    }
});
