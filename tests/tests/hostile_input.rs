//! Hostile input: everything lockkit takes from a caller, fed with what an
//! attacker or a broken client would send.
//!
//! * Parsers, fuzzed with proptest (no database): the `If-Match` / ETag parser,
//!   bound ETags and the `Idempotency-Key` header never panic and round-trip, the version-trigger identifier check accepts
//!   exactly the plain identifiers it documents, advisory-lock names always hash to
//!   the same short name.
//! * SQL-injection strings through every value lockkit sends to a database:
//!   values written by `update_versioned` / `update_by_version`, keys given to
//!   `with_lock` / `lock_all`, idempotency keys and fingerprints, advisory lock
//!   names; each time the value is stored (or matched) verbatim and the database
//!   is otherwise unchanged (every table still there, row counts as before).
//! * Numbers at the edge: lock timeouts from zero to `Duration::MAX`, versions at
//!   their type's `MIN` and `MAX`, negative versions, and a version column that
//!   is NULL in the database. Each has one defined, tested outcome.
//!
//! The cargo-fuzz target for the same parsers lives in `fuzz/` (see the README).

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel_migrations::MigrationHarness;
use lockkit::advisory::AdvisoryKey;
use lockkit::etag::{self, ETag, EntityTag, Expected, IfMatch, IfMatchError};
use lockkit::etag::{ETagSecret, MIN_SECRET_LEN};
use lockkit::idempotency::{self, Idempotency, Outcome};
use lockkit::prelude::*;
use lockkit::version_trigger::{self, Dialect};
use lockkit::{CurrentState, Error, LockOptions, StaleObjectError};
use lockkit_tests::models::*;
use lockkit_tests::oracles::plain_identifier;
use lockkit_tests::schema::*;
use lockkit_tests::settings::{is_mariadb, lock_timeout};
use lockkit_tests::{exec, idempotency_migrations, seed_items, stock_of};
use proptest::prelude::*;

/// Values an injection would use: quotes of every kind, comment starters,
/// statement separators, placeholders, backslashes (MySQL's escape character),
/// control characters, non-ASCII. None of them is empty or holds a NUL, and each
/// fits Latin-1, so that any server character set can store them.
const HOSTILE: &[&str] = &[
    "x'); DROP TABLE items; --",
    "'; DELETE FROM items WHERE '1'='1",
    "' OR '1'='1",
    "\" OR \"\"=\"",
    "\\'; DROP TABLE items; #",
    "\\",
    "'",
    "''",
    "$1",
    "?",
    "%s %n %%",
    "/* unterminated comment",
    "`items`",
    "items; TRUNCATE items",
    "1; SELECT pg_sleep(10)",
    "' UNION SELECT id, name, stock, lock_version FROM items --",
    "caf\u{e9} cr\u{e8}me",
    "line\nbreak\r\n\ttab",
];

/// Every table of the test schema is still there; `items` has `$items` rows.
macro_rules! assert_intact {
    ($conn:expr, items: $items:expr) => {{
        let conn = $conn;
        let count = |name: &str, n: QueryResult<i64>| {
            n.unwrap_or_else(|e| panic!("table {name} is gone: {e}"))
        };
        assert_eq!(
            count("items", items::table.count().get_result(conn)),
            $items,
            "items rows"
        );
        count("gadgets", gadgets::table.count().get_result(conn));
        count("documents", documents::table.count().get_result(conn));
        count("order_lines", order_lines::table.count().get_result(conn));
        count("jobs", jobs::table.count().get_result(conn));
        count("doctors", doctors::table.count().get_result(conn));
        count("orders", orders::table.count().get_result(conn));
    }};
}

// ---------------------------------------------------------------------------
// Parsers and pure functions: proptest, no database.
// ---------------------------------------------------------------------------

/// Header-shaped strings: the parser's own alphabet (quotes, `W/`, commas, OWS,
/// `*`, `v`, signs, digits) mixed with arbitrary characters, so that generated
/// inputs reach every branch instead of failing on the first character.
fn header_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(vec![
            "\"", "W/", "w/", ",", " ", "\t", "*", "v", "-", "+", "0", "7", "12",
            "9223372036854775807", "9223372036854775808", "\u{e9}", "\u{7f}", "\0", "\r\n",
        ])
        .prop_map(str::to_owned),
        1 => any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

/// A parsed header written back out.
fn render(tags: &[EntityTag]) -> String {
    tags.iter()
        .map(|tag| format!("{}\"{}\"", if tag.weak { "W/" } else { "" }, tag.opaque))
        .collect::<Vec<_>>()
        .join(", ")
}

fn identifier_like() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z_][A-Za-z0-9_]{0,45}",
        "[A-Za-z0-9_;'\"` .()$\u{e9}-]{0,45}",
        any::<String>(),
    ]
}

/// 64-bit FNV-1a, as `AdvisoryKey::from_name` documents it.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Lists of tags: the strong lockkit tags of `versions`, with tags that must be
/// ignored (weak, foreign, malformed versions) between them, and separators of
/// every allowed shape.
fn tag_list(versions: &[i64], noise: &[u8], separators: &[usize]) -> String {
    const SEPARATORS: [&str; 4] = [",", ", ", " ,\t", ", ,"];
    let mut tags = Vec::new();
    for (i, version) in versions.iter().enumerate() {
        if let Some(kind) = noise.get(i) {
            tags.push(match kind % 5 {
                0 => format!("W/{}", ETag::from_version(*version)), // weak: never matches
                1 => "\"abc\"".to_owned(),
                2 => "\"v\"".to_owned(),
                3 => "\"v+1\"".to_owned(),
                _ => format!("\"{version}\""), // no `v`: not a lockkit tag
            });
        }
        tags.push(ETag::from_version(*version).to_string());
    }
    let mut header = String::new();
    for (i, tag) in tags.iter().enumerate() {
        if i > 0 {
            header.push_str(SEPARATORS[separators.get(i).copied().unwrap_or(0) % 4]);
        }
        header.push_str(tag);
    }
    header
}

/// What an `If-Match` header listing the strong lockkit tags of `versions`
/// must yield: nothing to match for none, the version for one distinct
/// version, and every distinct version, ascending, for more.
fn expected_from<V: Ord + Copy>(versions: Vec<V>) -> Result<Expected<V>, IfMatchError> {
    let distinct: Vec<V> = versions
        .into_iter()
        .collect::<std::collections::BTreeSet<V>>()
        .into_iter()
        .collect();
    match distinct[..] {
        [] => Err(IfMatchError::NoMatch),
        [version] => Ok(Expected::Version(version)),
        _ => Ok(Expected::OneOf(distinct)),
    }
}

#[test]
fn a_list_of_tags_yields_its_distinct_strong_versions_ascending() {
    // The values the property below checks against `expected_from`, written out.
    let cases: [(&str, Result<Expected<i64>, IfMatchError>); 5] = [
        (
            r#"W/"v3", "v3", "abc", "v1", "v2", "v3""#,
            Ok(Expected::OneOf(vec![1, 2, 3])),
        ),
        (r#""v5", "v5""#, Ok(Expected::Version(5))),
        (r#""v-2", , "v9""#, Ok(Expected::OneOf(vec![-2, 9]))),
        (r#"W/"v5", "5", "v""#, Err(IfMatchError::NoMatch)),
        (r#""v70000""#, Ok(Expected::Version(70_000))),
    ];
    for (header, expected) in cases {
        assert_eq!(
            etag::expected_version::<i64>(Some(header)),
            expected,
            "{header}"
        );
    }
    // A version that does not fit the type is left out, not wrapped.
    assert_eq!(
        etag::expected_version::<i16>(Some(r#""v70000", "v4""#)),
        Ok(Expected::Version(4))
    );
    assert_eq!(
        etag::expected_version::<i16>(Some(r#""v70000""#)),
        Err(IfMatchError::NoMatch)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn if_match_parsing_never_panics(header in any::<String>(), shaped in header_like()) {
        for header in [&header, &shaped] {
            let _ = header.parse::<IfMatch>();
            let _ = etag::expected_version::<i16>(Some(header));
            let _ = etag::expected_version::<i32>(Some(header));
            let _ = etag::expected_version::<i64>(Some(header));
        }
    }

    #[test]
    fn parsed_headers_are_well_formed_and_round_trip(header in header_like()) {
        match header.parse::<IfMatch>() {
            Ok(IfMatch::Any) => prop_assert_eq!(header.trim_matches([' ', '\t']), "*"),
            Ok(IfMatch::Tags(tags)) => {
                prop_assert!(!tags.is_empty());
                for tag in &tags {
                    prop_assert!(!tag.opaque.contains('"'), "{:?}", tag);
                    prop_assert!(!tag.opaque.chars().any(|c| c.is_ascii_control() || c == ' '), "{:?}", tag);
                }
                // Written back out, the tags parse to the same list.
                prop_assert_eq!(render(&tags).parse::<IfMatch>(), Ok(IfMatch::Tags(tags)));
            }
            Err(err) => prop_assert!(matches!(err, IfMatchError::Malformed(_)), "{:?}", err),
        }
    }

    #[test]
    fn etags_round_trip_for_every_version(v16 in any::<i16>(), v32 in any::<i32>(), v64 in any::<i64>()) {
        let header = ETag::from_version(v16).to_string();
        prop_assert_eq!(etag::expected_version::<i16>(Some(&header)), Ok(Expected::Version(v16)));
        let header = ETag::from_version(v32).to_string();
        prop_assert_eq!(etag::expected_version::<i32>(Some(&header)), Ok(Expected::Version(v32)));
        let header = ETag::from_version(v64).to_string();
        prop_assert_eq!(etag::expected_version::<i64>(Some(&header)), Ok(Expected::Version(v64)));
        prop_assert_eq!(ETag::from_version(v64).version(), v64);
        // A version that does not fit the type names nothing (never a wrapped one).
        if i16::try_from(v64).is_err() {
            prop_assert_eq!(etag::expected_version::<i16>(Some(&header)), Err(IfMatchError::NoMatch));
        }
    }

    #[test]
    fn a_list_of_strong_tags_yields_exactly_those_versions(
        versions in prop::collection::vec(
            prop_oneof![any::<i64>(), -40_000i64..40_000, Just(i64::MIN), Just(i64::MAX)],
            1..10,
        ),
        noise in prop::collection::vec(any::<u8>(), 0..10),
        separators in prop::collection::vec(any::<usize>(), 0..20),
    ) {
        let header = tag_list(&versions, &noise, &separators);
        prop_assert_eq!(etag::expected_version::<i64>(Some(&header)), expected_from(versions.clone()), "{}", header);
        let fitting = |v: &i64| i16::try_from(*v).ok();
        prop_assert_eq!(
            etag::expected_version::<i16>(Some(&header)),
            expected_from(versions.iter().filter_map(fitting).collect()),
            "{}", header
        );
    }

    #[test]
    fn bound_tags_never_panic_and_fit_only_their_resource_and_version(
        header in header_like(),
        garbage in any::<String>(),
        key in any::<String>(),
        other_key in any::<String>(),
        v in any::<i64>(),
        w in any::<i64>(),
        flip in any::<prop::sample::Index>(),
    ) {
        let secret = ETagSecret::new(&[7; MIN_SECRET_LEN]).unwrap();
        let tags = secret.resource("items", &key);
        // Hostile headers: parse, check, compare; never a panic, never a match
        // (the chance of hitting a 128-bit MAC is nil).
        for header in [&header, &garbage] {
            if let Ok(parsed) = header.parse::<IfMatch>() {
                if parsed != IfMatch::Any {
                    prop_assert_eq!(tags.expected(&parsed, v), Err(IfMatchError::NoMatch), "{}", header);
                    prop_assert!(!tags.not_modified(&parsed, v));
                }
            }
        }
        // The tag of (key, v) reads back as v for that resource only.
        let tag = tags.etag(v).to_string();
        let sent: IfMatch = tag.parse().unwrap();
        prop_assert_eq!(tags.expected(&sent, v), Ok(Expected::Version(v)));
        prop_assert_eq!(etag::expected_version::<i64>(Some(&tag)), Err(IfMatchError::NoMatch), "not a plain tag");
        if w != v {
            prop_assert_eq!(tags.expected(&sent, w), Err(IfMatchError::NoMatch));
        }
        if other_key != key {
            prop_assert_eq!(secret.resource("items", &other_key).expected(&sent, v), Err(IfMatchError::NoMatch));
        }
        prop_assert_eq!(secret.resource("orders", &key).expected(&sent, v), Err(IfMatchError::NoMatch));
        // One hex digit changed: another tag, refused.
        let opaque = tags.etag(v).opaque().to_owned();
        let at = flip.index(opaque.len());
        let digit = opaque.as_bytes()[at];
        let changed = if digit == b'0' { '1' } else { '0' };
        let mut altered = opaque.clone();
        altered.replace_range(at..=at, &changed.to_string());
        let altered: IfMatch = format!("\"{altered}\"").parse().unwrap();
        prop_assert_eq!(tags.expected(&altered, v), Err(IfMatchError::NoMatch));
    }

    #[test]
    fn idempotency_key_headers_never_panic_and_round_trip(raw in any::<Vec<u8>>(), key in "[ -~]{1,255}") {
        if let Ok(read) = idempotency::key_from_header(&raw) {
            prop_assert!(!read.is_empty() && read.len() <= idempotency::MAX_LEN);
            prop_assert!(read.bytes().all(|b| (b' '..=b'~').contains(&b)), "{:?}", read);
        }
        // Any visible-ASCII key, written as a structured-field string, reads back.
        let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
        prop_assert_eq!(idempotency::key_from_header(quoted.as_bytes()).ok(), Some(key.clone()));
    }

    #[test]
    fn the_trigger_accepts_exactly_plain_identifiers(table in identifier_like(), column in identifier_like()) {
        let valid = plain_identifier(&table) && plain_identifier(&column);
        for dialect in [Dialect::Postgres, Dialect::Mysql, Dialect::Sqlite] {
            let up = version_trigger::up_sql(dialect, &table, &column);
            let down = version_trigger::down_sql(dialect, &table, &column);
            prop_assert_eq!(up.is_ok(), valid, "{:?} {:?}", table, column);
            prop_assert_eq!(down.is_ok(), valid);
            if let (Ok(up), Ok(down)) = (up, down) {
                // Only the names change the SQL: no quote but those around
                // the names (double quotes on PostgreSQL, backticks
                // elsewhere, as Diesel's), and the statements of the template.
                let template = version_trigger::up_sql(dialect, "t", "c").unwrap();
                prop_assert_eq!(up.matches(';').count(), template.matches(';').count());
                let quote = |name: &str| match dialect {
                    Dialect::Postgres => format!("\"{name}\""),
                    _ => format!("`{name}`"),
                };
                let unquoted = |sql: &str| sql.replace(&quote(&table), "").replace(&quote(&column), "");
                prop_assert!(!unquoted(&up).contains(['\'', '"', '`']) && !unquoted(&down).contains(['\'', '"', '`']));
                let on_table = format!("ON {}", quote(&table));
                prop_assert!(up.contains(&on_table));
                prop_assert_eq!(
                    version_trigger::trigger_name(&table, &column).unwrap(),
                    format!("lockkit_version_{table}_{column}")
                );
            }
        }
    }

    #[test]
    fn advisory_names_hash_to_a_short_fixed_name(name in any::<String>()) {
        let key = AdvisoryKey::from_name(&name);
        prop_assert_eq!(key.0 as u64, fnv1a(name.as_bytes()));
        prop_assert_eq!(key, AdvisoryKey::from(name.as_str()));
        let mysql = key.mysql_name();
        prop_assert_eq!(mysql.len(), 24);
        prop_assert!(mysql.starts_with("lockkit:"));
        prop_assert!(mysql[8..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    }
}

// ---------------------------------------------------------------------------
// Hostile values through the database, on every backend.
// ---------------------------------------------------------------------------

/// The lock timeout PostgreSQL and SQLite are sent for `timeout`, worked out
/// here from the documented clamp: whole milliseconds, 1 ..= `i32::MAX`.
fn sent_millis(timeout: Duration) -> i64 {
    timeout.as_millis().clamp(1, i32::MAX as u128) as i64
}

/// The same for MySQL/MariaDB: whole seconds rounded up, 1 ..= 2^30.
fn sent_secs(timeout: Duration) -> i64 {
    let whole = u128::from(timeout.as_secs()) + u128::from(timeout.subsec_nanos() > 0);
    whole.clamp(1, 1 << 30) as i64
}

diesel::table! {
    /// A table with a text primary key, created by the tests below.
    skus (sku) {
        sku -> Text,
        stock -> Integer,
        lock_version -> Integer,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = skus, primary_key(sku))]
pub struct Sku {
    pub sku: String,
    pub stock: i32,
    pub lock_version: i32,
}

/// `skus`, exact (binary) keys on every backend: on MySQL/MariaDB with an
/// explicit character set, so that keys beyond Latin-1 fit whatever the server's default.
fn skus_ddl(backend: &str) -> &'static str {
    match backend {
        "mysql" => "CREATE TABLE skus (sku VARCHAR(191) PRIMARY KEY, stock INTEGER NOT NULL, \
                    lock_version INTEGER NOT NULL DEFAULT 0) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        _ => "CREATE TABLE skus (sku VARCHAR(191) PRIMARY KEY, stock INTEGER NOT NULL, \
              lock_version INTEGER NOT NULL DEFAULT 0)",
    }
}

diesel::table! {
    /// A legacy table: the schema says `Integer`, the database allows NULL
    /// (created with raw SQL below, no migration).
    nullable_versions (id) {
        id -> Integer,
        name -> Text,
        lock_version -> Integer,
    }
}

#[derive(Debug, Clone, PartialEq, Queryable, Selectable, Identifiable, Versioned)]
#[diesel(table_name = nullable_versions)]
pub struct Legacy {
    pub id: i32,
    pub name: String,
    pub lock_version: i32,
}

const NULLABLE_VERSIONS: &str = "
    CREATE TABLE nullable_versions (id INTEGER PRIMARY KEY, name VARCHAR(100) NOT NULL, lock_version INTEGER);
    INSERT INTO nullable_versions (id, name, lock_version) VALUES (1, 'legacy', NULL);
    INSERT INTO nullable_versions (id, name, lock_version) VALUES (2, 'counted', 0);
";

/// The row as stored, NULL included.
#[derive(Debug, PartialEq, QueryableByName)]
struct RawLegacy {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    lock_version: Option<i32>,
}

/// Loads one row of `$table` as `$model`.
macro_rules! load {
    ($conn:expr, $table:ident, $model:ty, $key:expr) => {
        $table::table
            .find($key)
            .select(<$model>::as_select())
            .first::<$model>($conn)
            .unwrap()
    };
}

/// Sets the version column of one row, bypassing lockkit.
macro_rules! set_version {
    ($conn:expr, $table:ident . $column:ident, $key:expr, $version:expr) => {
        diesel::update($table::table.find($key))
            .set($table::$column.eq($version))
            .execute($conn)
            .unwrap()
    };
}

/// The outcome of every write at the limits of a version type:
///
/// | version in the row | write | outcome |
/// | --- | --- | --- |
/// | `MAX` | `update_versioned`, `touch_versioned`, `update_by_version(MAX)` | `VersionOverflow`, nothing sent, row and struct unchanged |
/// | `MAX - 1` | `update_versioned` | ok, now `MAX` |
/// | `MIN` | `update_versioned` | ok, now `MIN + 1` |
/// | `-1` | `touch_versioned` | ok, now `0` |
/// | `0` | `update_by_version(MIN)` | `Stale` (expected `MIN`, found 0), row unchanged |
/// | `-5` | `update_by_version(-5)` | ok, returns `-4` |
/// | `MAX` | `delete_versioned` | ok: a delete does not bump, so a row at `MAX` can still go |
macro_rules! check_version_limits {
    ($conn:expr, $model:ty, $table:ident . $column:ident, $key:expr, $ty:ty, $changes:expr) => {{
        let conn = $conn;
        let max = <$ty>::MAX;
        let min = <$ty>::MIN;

        set_version!(conn, $table.$column, $key, max);
        let before = load!(conn, $table, $model, $key);
        let mut row = before.clone();
        for err in [
            row.update_versioned(conn).unwrap_err(),
            row.touch_versioned(conn).unwrap_err(),
            <$model>::update_by_version(conn, $key, max, $changes).unwrap_err(),
        ] {
            assert!(
                matches!(err, Error::VersionOverflow { version, .. } if version == i64::from(max)),
                "{err:?}"
            );
            assert!(!err.is_retryable());
        }
        assert_eq!(row, before, "the struct is unchanged");
        assert_eq!(load!(conn, $table, $model, $key), before, "the row is unchanged");

        set_version!(conn, $table.$column, $key, max - 1);
        let mut row = load!(conn, $table, $model, $key);
        row.update_versioned(conn).unwrap();
        assert_eq!(row.version(), max);
        assert_eq!(load!(conn, $table, $model, $key).version(), max);

        set_version!(conn, $table.$column, $key, min);
        let mut row = load!(conn, $table, $model, $key);
        row.update_versioned(conn).unwrap();
        assert_eq!((row.version(), load!(conn, $table, $model, $key).version()), (min + 1, min + 1));

        set_version!(conn, $table.$column, $key, -1 as $ty);
        let mut row = load!(conn, $table, $model, $key);
        row.touch_versioned(conn).unwrap();
        assert_eq!(load!(conn, $table, $model, $key).version(), 0);

        let before = load!(conn, $table, $model, $key);
        match <$model>::update_by_version(conn, $key, min, $changes) {
            Err(Error::Stale(StaleObjectError { expected_version, current, .. })) => {
                assert_eq!(expected_version, i64::from(min));
                assert_eq!(current, CurrentState::Version(0));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(load!(conn, $table, $model, $key), before);

        set_version!(conn, $table.$column, $key, -5 as $ty);
        assert_eq!(<$model>::update_by_version(conn, $key, -5 as $ty, $changes).unwrap(), -4 as $ty);

        set_version!(conn, $table.$column, $key, max);
        let row = load!(conn, $table, $model, $key);
        row.delete_versioned(conn).unwrap();
        assert_eq!($table::table.count().get_result::<i64>(conn).unwrap(), 0);
    }};
}

mod all {
    use super::*;

    lockkit_tests::backend_tests! {
        fn hostile_values_through_versioned_writes_are_stored_verbatim(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10), (2, 20)]);
            exec(&mut conn, "INSERT INTO documents (id, title, note, lock_version) VALUES (1, 'doc', NULL, 0)");
            let untouched = load!(&mut conn, items, Item, 2);
            let mut version = 0;
            for value in HOSTILE {
                // update_versioned: every field of the struct.
                let mut item = load!(&mut conn, items, Item, 1);
                item.name = value.to_string();
                item.update_versioned(&mut conn).unwrap();
                version += 1;
                assert_eq!(load!(&mut conn, items, Item, 1), Item { id: 1, name: value.to_string(), stock: 10, lock_version: version });

                // update_by_version: a changeset with the value, as from a form.
                let reversed: String = value.chars().rev().collect();
                let next = Item::update_by_version(&mut conn, 1, version, items::name.eq(&reversed)).unwrap();
                version += 1;
                assert_eq!(next, version);
                assert_eq!(load!(&mut conn, items, Item, 1).name, reversed);

                // A stale write carrying the value writes nothing.
                let err = Item::update_by_version(&mut conn, 1, version - 1, items::name.eq(*value)).unwrap_err();
                assert!(matches!(err, Error::Stale(_)), "{err:?}");
                assert_eq!(load!(&mut conn, items, Item, 1).name, reversed);

                // update_versioned_with, and an Option field.
                let mut item = load!(&mut conn, items, Item, 1);
                item.update_versioned_with(&mut conn, items::name.eq(*value)).unwrap();
                version += 1;
                let mut doc = load!(&mut conn, documents, Document, 1_i64);
                doc.title = value.to_string();
                doc.note = Some(value.to_string());
                doc.update_versioned(&mut conn).unwrap();
                assert_eq!(load!(&mut conn, documents, Document, 1_i64), doc);
            }
            assert_eq!(load!(&mut conn, items, Item, 1).name, *HOSTILE.last().unwrap());
            assert_eq!(load!(&mut conn, items, Item, 2), untouched, "the other row is untouched");
            assert_intact!(&mut conn, items: 2);
        }

        fn a_nul_byte_in_a_value_is_stored_verbatim_or_refused_whole(db) {
            // PostgreSQL cannot store NUL in text: the write fails whole and
            // nothing changes. MySQL/MariaDB and SQLite store it verbatim.
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let before = load!(&mut conn, items, Item, 1);
            let mut item = before.clone();
            item.name = "nul\0'); DROP TABLE items; --".to_owned();
            let result = item.update_versioned(&mut conn);
            match BACKEND {
                "postgres" => {
                    let err = result.unwrap_err();
                    assert!(matches!(err, Error::Database(_)), "{err:?}");
                    assert!(!err.is_retryable());
                    assert_eq!(item.lock_version, 0, "the struct's version did not advance");
                    assert_eq!(load!(&mut conn, items, Item, 1), before);
                }
                _ => {
                    result.unwrap();
                    assert_eq!(load!(&mut conn, items, Item, 1), item);
                }
            }
            assert_intact!(&mut conn, items: 1);
        }

        fn hostile_keys_lock_exactly_the_rows_they_name(db) {
            let mut conn = db.conn();
            exec(&mut conn, skus_ddl(BACKEND));
            let keys: Vec<String> = HOSTILE
                .iter()
                .map(|k| k.to_string())
                .chain(["\u{1f512} lock".to_owned()])
                .collect();
            for key in keys.iter().chain([&"plain".to_owned()]) {
                diesel::insert_into(skus::table)
                    .values((skus::sku.eq(key), skus::stock.eq(10), skus::lock_version.eq(0)))
                    .execute(&mut conn)
                    .unwrap();
            }
            let plain = load!(&mut conn, skus, Sku, "plain".to_owned());

            // with_lock by each key: that row, fresh, and only it.
            for key in &keys {
                let left = lockkit::with_lock(&mut conn, key.clone(), lockkit::LockOptions::default(), |conn, sku: Sku| {
                    assert_eq!(&sku.sku, key);
                    diesel::update(skus::table.find(&sku.sku)).set(skus::stock.eq(sku.stock - 1)).execute(conn)?;
                    Ok::<_, lockkit::Error>(sku.stock - 1)
                })
                .unwrap();
                assert_eq!(left, 9);
                let sku = load!(&mut conn, skus, Sku, key.clone());
                lockkit::with_lock(&mut conn, sku.key(), LockOptions::default().nowait(), |_, fresh: Sku| {
                    assert_eq!(fresh.stock, 9);
                    Ok::<_, lockkit::Error>(())
                })
                .unwrap();
            }

            // Keys that name no row: NotFound, never "every row".
            for absent in ["' OR 'x'='x", "plain' OR '1'='1' --", "plain%", "%", "plain'--", "PLAIN"] {
                let err = lockkit::with_lock(&mut conn, absent.to_owned(), lockkit::LockOptions::default(), |_, _: Sku| Ok(())).unwrap_err();
                assert!(matches!(err, Error::NotFound), "{absent}: {err:?}");
                let err = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                    Sku::lock_all(conn, &[absent.to_owned()])
                })
                .unwrap_err();
                assert!(matches!(err, Error::NotFound), "{absent}: {err:?}");
                let err = Sku::update_by_version(&mut conn, absent.to_owned(), 0, skus::stock.eq(0)).unwrap_err();
                assert!(matches!(err.as_stale().map(|s| s.current), Some(CurrentState::Deleted)), "{err:?}");
            }

            // lock_all over every key at once, given in reverse: exactly those rows.
            let locked = lockkit::locked_transaction(&mut conn, LockOptions::default(), |conn| {
                let mut wanted = keys.clone();
                wanted.reverse();
                wanted.push(keys[0].clone()); // a duplicate is locked once
                Sku::lock_all(conn, &wanted)
            })
            .unwrap();
            let mut got: Vec<String> = locked.into_iter().map(|sku| sku.sku).collect();
            got.sort();
            let mut want = keys.clone();
            want.sort();
            assert_eq!(got, want);

            // Versioned writes by hostile key.
            // (with_lock and lock_all above advanced each row's version.)
            for key in &keys {
                let version = load!(&mut conn, skus, Sku, key.clone()).lock_version;
                assert_eq!(Sku::update_by_version(&mut conn, key.clone(), version, skus::stock.eq(100)).unwrap(), version + 1);
                assert_eq!(load!(&mut conn, skus, Sku, key.clone()), Sku { sku: key.clone(), stock: 100, lock_version: version + 1 });
            }
            assert_eq!(load!(&mut conn, skus, Sku, "plain".to_owned()), plain, "the other row is untouched");
            assert_eq!(skus::table.count().get_result::<i64>(&mut conn).unwrap(), keys.len() as i64 + 1);
            assert_intact!(&mut conn, items: 0);
        }

        fn extreme_lock_timeouts_are_clamped_never_an_error(db) {
            let mut conn = db.conn();
            seed_items(&mut conn, &[(1, 10)]);
            let outside = lock_timeout(&mut conn, BACKEND);
            // MySQL 8 takes innodb_lock_wait_timeout up to 2^30 s, MariaDB up to
            // 10^8 s and truncates larger values itself (a warning, not an error).
            let server_max = match BACKEND {
                _ if is_mariadb(&mut conn, BACKEND) => 100_000_000,
                _ => i64::MAX,
            };
            for timeout in [
                Duration::ZERO,
                Duration::from_nanos(1),
                Duration::from_micros(999),
                Duration::from_millis(1500),
                Duration::from_millis(i32::MAX as u64),
                Duration::from_millis(i32::MAX as u64 + 1),
                Duration::from_secs(1 << 30) + Duration::from_nanos(1),
                Duration::from_secs(u64::MAX),
                Duration::MAX,
            ] {
                let options = LockOptions::default().timeout(timeout);
                let expected = match BACKEND {
                    "mysql" => sent_secs(timeout).min(server_max),
                    _ => sent_millis(timeout),
                };
                let inside = lockkit::with_lock(&mut conn, 1, options, |conn, _: Item| {
                    Ok::<_, Error>(lock_timeout(conn, BACKEND))
                })
                .unwrap_or_else(|e| panic!("{timeout:?}: {e:?}"));
                assert_eq!(inside, expected, "{timeout:?}");
                let inside = lockkit::locked_transaction(&mut conn, options, |conn| Ok::<_, lockkit::Error>(lock_timeout(conn, BACKEND))).unwrap();
                assert_eq!(inside, expected, "{timeout:?}");
                assert_eq!(lock_timeout(&mut conn, BACKEND), outside, "{timeout:?}: restored afterwards");
            }
            assert_intact!(&mut conn, items: 1);
        }

        fn hostile_idempotency_keys_and_fingerprints_are_stored_verbatim(db) {
            let mut conn = db.conn();
            conn.run_pending_migrations(idempotency_migrations(BACKEND)).unwrap();
            seed_items(&mut conn, &[(1, 1000)]);
            let keys = Idempotency::default();
            for (n, key) in HOSTILE.iter().enumerate() {
                let fingerprint = HOSTILE[(n + 1) % HOSTILE.len()];
                let principal = HOSTILE[(n + 2) % HOSTILE.len()];
                let response = format!("201 {key}");
                let ran = keys.run(&mut conn, principal, key, fingerprint, |conn| {
                    diesel::update(items::table.find(1)).set(items::stock.eq(items::stock - 1)).execute(conn)?;
                    Ok::<_, Error>(response.clone())
                });
                assert_eq!(ran.unwrap(), Outcome::Ran(response.clone()), "{key}");
                let again = keys.run(&mut conn, principal, key, fingerprint, |_| -> Result<String, Error> { panic!("ran twice: {key}") });
                assert_eq!(again.unwrap(), Outcome::Replayed(response.clone()));
                let reused = keys.run(&mut conn, principal, key, "POST /other", |_| -> Result<String, Error> { panic!("ran: {key}") });
                assert!(matches!(reused, Err(Error::IdempotencyKeyReused)), "{reused:?}");
                let stored: (String, String, String, Option<String>) = lockkit_idempotency_keys::table
                    .filter(lockkit_idempotency_keys::idempotency_key.eq(key))
                    .select((
                        lockkit_idempotency_keys::principal,
                        lockkit_idempotency_keys::idempotency_key,
                        lockkit_idempotency_keys::fingerprint,
                        lockkit_idempotency_keys::response,
                    ))
                    .first(&mut conn)
                    .unwrap();
                // The response is stored as JSON: a string is quoted, the rest verbatim.
                let json = serde_json::to_string(&response).unwrap();
                assert_eq!(stored, (principal.to_owned(), key.to_string(), fingerprint.to_owned(), Some(json)));
            }
            let stored = lockkit_idempotency_keys::table.count().get_result::<i64>(&mut conn).unwrap();
            assert_eq!(stored, HOSTILE.len() as i64);
            let stock = stock_of!(&mut conn);
            assert_eq!(stock, 1000 - HOSTILE.len() as i32, "each request's work ran exactly once");

            // The limits, checked before anything is sent: 1 to 255 characters, no NUL.
            let longest = "\u{e9}".repeat(255); // 510 bytes, 255 characters
            let ran = keys.run(&mut conn, &longest, &longest, &longest, |_| Ok::<_, lockkit::Error>("ok".to_owned())).unwrap();
            assert_eq!(ran, Outcome::Ran("ok".to_owned()));
            for (key, fingerprint) in [
                ("", "fp"),
                (&"\u{e9}".repeat(256)[..], "fp"),
                ("k", &"x".repeat(256)[..]),
                ("nul\0'); DROP TABLE items; --", "fp"),
                ("k", "nul\0"),
            ] {
                let refused = keys.run(&mut conn, "tenant-1", key, fingerprint, |_| -> Result<String, Error> { panic!("ran") });
                assert!(matches!(refused, Err(Error::InvalidInput(_))), "{key:?} {fingerprint:?}: {refused:?}");
            }
            // The same limits for principals.
            for principal in ["", &"\u{e9}".repeat(256)[..], "nul\0'); DROP TABLE items; --"] {
                let refused = keys.run(&mut conn, principal, "k", "fp", |_| -> Result<String, Error> { panic!("ran") });
                assert!(matches!(refused, Err(Error::InvalidInput(_))), "{principal:?}: {refused:?}");
            }
            // An empty fingerprint is allowed (the key alone names the request).
            let ran = keys.run(&mut conn, "tenant-1", "no fingerprint", "", |_| Ok::<_, lockkit::Error>("ok".to_owned())).unwrap();
            assert_eq!(ran, Outcome::Ran("ok".to_owned()));
            assert_intact!(&mut conn, items: 1);
        }

        fn versions_at_the_limits_of_i16_i32_and_i64(db) {
            let mut conn = db.conn();
            exec(&mut conn, "INSERT INTO gadgets (id, label, version) VALUES (1, 'g', 0)");
            check_version_limits!(&mut conn, Gadget, gadgets.version, 1, i16, gadgets::label.eq("by version"));
            seed_items(&mut conn, &[(1, 10)]);
            check_version_limits!(&mut conn, Item, items.lock_version, 1, i32, items::name.eq("by version"));
            exec(&mut conn, "INSERT INTO documents (id, title, note, lock_version) VALUES (1, 'd', NULL, 0)");
            check_version_limits!(&mut conn, Document, documents.lock_version, 1_i64, i64, documents::title.eq("by version"));
            // The version of an ETag survives the extremes too.
            for version in [i64::MIN, -1, i64::MAX] {
                let header = ETag::from_version(version).to_string();
                assert_eq!(etag::expected_version::<i64>(Some(&header)), Ok(Expected::Version(version)));
            }
            assert_intact!(&mut conn, items: 0);
        }

        fn a_null_version_never_matches_and_is_reported_stale(db) {
            let mut conn = db.conn();
            conn.batch_execute(NULLABLE_VERSIONS).unwrap();
            fn load(conn: &mut Conn, id: i32) -> Result<Legacy, Error> {
                Ok(nullable_versions::table.find(id).select(Legacy::as_select()).first(conn)?)
            }
            fn raw(conn: &mut Conn) -> RawLegacy {
                diesel::sql_query("SELECT name, lock_version FROM nullable_versions WHERE id = 1")
                    .get_result(conn)
                    .unwrap()
            }
            let stored = RawLegacy { name: "legacy".into(), lock_version: None };

            // Loading the row into the non-Option version field: Diesel's
            // UnexpectedNullError, which `?` turns into Error::Database, unretryable.
            let err = load(&mut conn, 1).unwrap_err();
            assert!(
                matches!(err, Error::Database(diesel::result::Error::DeserializationError(_))),
                "{err:?}"
            );
            assert!(!err.is_retryable());
            assert_eq!(load(&mut conn, 2).unwrap().lock_version, 0, "a counted row loads");

            // Version-checked writes never match a NULL version: nothing is written,
            // and the stale report says why.
            for expected in [0, 1, -1, i32::MIN, i32::MAX - 1] {
                let err = Legacy::update_by_version(&mut conn, 1, expected, nullable_versions::name.eq("overwritten")).unwrap_err();
                assert_eq!(err.as_stale().map(|s| s.current), Some(CurrentState::NullVersion), "{expected}: {err:?}");
                assert!(err.to_string().ends_with("but the row's version is NULL"), "{err}");
                assert_eq!(raw(&mut conn), stored, "{expected}: nothing written");
            }
            let mut struct_from_elsewhere = Legacy { id: 1, name: "overwritten".into(), lock_version: 0 };
            let null_stale = |result: Result<(), Error>| {
                result.unwrap_err().as_stale().map(|s| s.current) == Some(CurrentState::NullVersion)
            };
            assert!(null_stale(struct_from_elsewhere.update_versioned(&mut conn)));
            assert!(null_stale(struct_from_elsewhere.touch_versioned(&mut conn)));
            assert!(null_stale(struct_from_elsewhere.delete_versioned(&mut conn)));
            assert_eq!(struct_from_elsewhere.lock_version, 0);
            let bulk = Legacy::update_all_by_version(&mut conn, &[(2, 0), (1, 0)], nullable_versions::name.eq("overwritten"));
            assert!(matches!(&bulk, Err(Error::StaleRows(rows)) if rows.len() == 1 && rows[0].current == CurrentState::NullVersion), "{bulk:?}");
            // At MAX the overflow check comes first, before anything is sent.
            let err = Legacy::update_by_version(&mut conn, 1, i32::MAX, nullable_versions::name.eq("overwritten")).unwrap_err();
            assert!(matches!(err, Error::VersionOverflow { .. }), "{err:?}");
            assert_eq!(raw(&mut conn), stored);
            assert_eq!(load(&mut conn, 2).unwrap(), Legacy { id: 2, name: "counted".into(), lock_version: 0 }, "the bulk update rolled back whole");
        }
    }
}

mod servers {
    use super::*;
    use lockkit::advisory;

    lockkit_tests::server_tests! {
        fn hostile_advisory_lock_names_are_hashed_never_sent(db) {
            let mut holder = db.connect();
            let mut other = db.connect();
            for name in HOSTILE.iter().copied().chain(["", "\u{1f512}", "NUL\0name"]) {
                let guard = advisory::try_lock(&mut holder, name).unwrap().expect("the lock is free");
                assert!(advisory::try_lock(&mut other, name).unwrap().is_none(), "{name:?} is held");
                // Another name, even one that differs in case only, is another lock.
                let upper = format!("{}X", name.to_uppercase());
                let unrelated = advisory::try_lock(&mut other, upper.as_str()).unwrap();
                assert!(unrelated.is_some(), "{upper:?}");
                drop(unrelated);
                guard.unlock().unwrap();
                let free = advisory::try_lock(&mut other, name).unwrap();
                assert!(free.is_some(), "{name:?} released");
            }
            drop(advisory::lock(&mut holder, HOSTILE[0]).unwrap());
            assert_intact!(&mut holder, items: 0);
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres_only {
    use super::*;
    use lockkit::advisory;

    #[test]
    fn hostile_names_for_transaction_advisory_locks() {
        let db = lockkit_tests::TestDb::<PgConnection>::new("hostile_xact_advisory");
        let mut conn = db.connect();
        let mut other = db.connect();
        for name in HOSTILE {
            conn.transaction(|conn| {
                advisory::xact_lock(conn, *name)?;
                let held = other
                    .transaction::<_, Error, _>(|other| advisory::try_xact_lock(other, *name))?;
                assert!(!held, "{name:?} is held until the first transaction ends");
                Ok::<_, Error>(())
            })
            .unwrap();
            let free = other
                .transaction::<_, Error, _>(|other| advisory::try_xact_lock(other, *name))
                .unwrap();
            assert!(free, "{name:?} released at commit");
        }
        assert_intact!(&mut conn, items: 0);
    }
}

/// Idempotency keys are compared exactly: two keys that differ only in case, or
/// in trailing spaces, are two requests (on MySQL/MariaDB a `VARCHAR` key with the
/// server's default collation would make them one, and replay the first one's
/// response for the second: the key column is `VARBINARY`).
macro_rules! exact_idempotency_keys {
    ($(#[$meta:meta])* $name:ident, $conn:ty, $backend:literal) => {
        #[test]
        $(#[$meta])*
        fn $name() {
            let db = lockkit_tests::TestDb::<$conn>::new(stringify!($name));
            let mut conn = db.conn();
            conn.run_pending_migrations(idempotency_migrations($backend)).unwrap();
            let keys = Idempotency::default();
            for key in ["order-abc", "ORDER-ABC", "Order-Abc", "order-abc ", "order-abc  "] {
                let ran = keys.run(&mut conn, "tenant-1", key, "POST /orders", |_| Ok::<_, lockkit::Error>(format!("201 {key}"))).unwrap();
                assert_eq!(ran, Outcome::Ran(format!("201 {key}")), "{key:?} is a key of its own");
            }
        }
    };
}

#[cfg(feature = "postgres")]
exact_idempotency_keys!(
    idempotency_keys_are_exact_on_postgres,
    PgConnection,
    "postgres"
);
#[cfg(feature = "sqlite")]
exact_idempotency_keys!(
    idempotency_keys_are_exact_on_sqlite,
    SqliteConnection,
    "sqlite"
);
#[cfg(feature = "mysql")]
exact_idempotency_keys!(
    idempotency_keys_are_exact_on_mysql,
    MysqlConnection,
    "mysql"
);
