//! Resource-bound, opaque ETags (feature `bound-etags`), re-exported by
//! [`etag`](crate::etag).
//!
//! The plain tag `"v7"` says how often a row was written, and `"v7"` from item 1
//! satisfies `If-Match` on item 2 when that one is at version 7 too. A bound tag
//! is an HMAC-SHA256, under a server secret, of the table, the row's key and its
//! version, truncated to 128 bits and written as 32 hex digits: it reveals
//! nothing, matches only the resource and version it was made for, and cannot
//! be made or altered without the secret.
//!
//! Since the version cannot be read back out of such a tag, a write first reads
//! the row's current version and checks the client's tag against it
//! ([`ResourceTags::expected`]); the write itself is still version-checked, so a
//! change in between is a stale write (`412`), never a lost update.
//!
//! | `If-Match` | outcome | status |
//! | --- | --- | --- |
//! | the tag of this resource at its current version | the write happens | 200 / 204 |
//! | a tag of an older version, of another resource, made with another secret, altered, weak, or a plain `"v7"` | [`IfMatchError::NoMatch`] | 412 |
//! | `*` | any version (the row must exist) | 200 / 404 |
//! | none / not a list of entity tags | [`IfMatchError::Missing`] / [`IfMatchError::Malformed`] | 428 / 400 |
//!
//! ```
//! use lockkit::etag::{ETagSecret, Expected, IfMatch};
//!
//! let secret = ETagSecret::new(b"a server secret of at least 32 bytes, from config").unwrap();
//! let item_1 = secret.resource("items", 1);
//! let item_2 = secret.resource("items", 2);
//! let tag = item_1.etag(7_i32).to_string(); // "\"3f0c…\"": 32 hex digits in quotes
//!
//! let if_match: IfMatch = tag.parse().unwrap();
//! assert_eq!(item_1.expected(&if_match, 7_i32), Ok(Expected::Version(7)));
//! assert!(item_1.expected(&if_match, 8_i32).is_err()); // changed since: 412
//! assert!(item_2.expected(&if_match, 7_i32).is_err()); // another resource: 412
//! ```

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{Expected, IfMatch, IfMatchError, Problem, Rendering};
use crate::error::{Error, StaleObjectError};
use crate::optimistic::version::VersionNumber;

type HmacSha256 = Hmac<Sha256>;

/// The shortest secret [`ETagSecret::new`] takes, in bytes.
pub const MIN_SECRET_LEN: usize = 32;

/// Bytes of the HMAC kept in a tag (128 bits).
const TAG_BYTES: usize = 16;

/// Separates these MACs from any other use of the same secret.
const DOMAIN: &[u8] = b"lockkit bound etag v1\0";

/// The server secret that bound ETags are made with: keep it out of the code
/// (configuration, a secret store), at least [`MIN_SECRET_LEN`] random bytes. All
/// servers of a service share it; changing it turns every tag clients hold into a
/// `412` (they re-read, nothing is lost).
#[derive(Clone)]
pub struct ETagSecret(HmacSha256);

impl fmt::Debug for ETagSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ETagSecret(..)")
    }
}

/// [`ETagSecret::new`] refuses a secret shorter than [`MIN_SECRET_LEN`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an ETag secret must be at least {MIN_SECRET_LEN} bytes; this one has {0}")]
pub struct SecretTooShort(pub usize);

impl ETagSecret {
    /// A secret from its bytes.
    ///
    /// # Errors
    ///
    /// [`SecretTooShort`] when `secret` has fewer than [`MIN_SECRET_LEN`] bytes.
    pub fn new(secret: &[u8]) -> Result<Self, SecretTooShort> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(SecretTooShort(secret.len()));
        }
        // HMAC takes keys of any length; the error cannot happen.
        HmacSha256::new_from_slice(secret)
            .map(ETagSecret)
            .map_err(|_| SecretTooShort(secret.len()))
    }

    /// The tags of one resource: the row of `table` whose key formats as `key`
    /// (the same table name and key formatting on every server). A refusal's
    /// problem ([`ResourceTags::problem`]) carries the resource's current tag
    /// only when the stale report names it: `table` as the database names the
    /// table (`"items"`; `"archive.items"` for a `table!` that names the schema
    /// `archive`; the `sql_name` of a `table!` that renames it: what a stale
    /// report's [`database_table`](StaleObjectError::database_table) says) and
    /// a single-column key; otherwise (another name, a composite key) the
    /// `412` carries none, and the client re-reads.
    ///
    /// Pass the key as the model holds it (`7`, not `"7"`): stale reports
    /// name rows by the key's `Debug`, which the resource keeps to tell its
    /// own from another row's.
    pub fn resource(&self, table: &str, key: impl fmt::Display + fmt::Debug) -> ResourceTags {
        let mut mac = self.0.clone();
        mac.update(DOMAIN);
        let shown = key.to_string();
        for part in [table.as_bytes(), shown.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        ResourceTags {
            mac,
            table: table.to_owned(),
            key: format!("{key:?}"),
        }
    }
}

/// The bound ETags of one resource; from [`ETagSecret::resource`].
#[derive(Clone)]
pub struct ResourceTags {
    /// Keyed with the secret, fed with the table and key.
    mac: HmacSha256,
    /// The table and key it was made for (the key as stale reports format
    /// it, with `Debug`), to tell a stale report of this resource from one of
    /// another row ([`names`](Self::names)).
    table: String,
    key: String,
}

impl fmt::Debug for ResourceTags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResourceTags(..)")
    }
}

/// A resource-bound, opaque entity tag: 32 hex digits, shown with its quotes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoundETag(String);

impl BoundETag {
    /// The tag without quotes.
    pub fn opaque(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BoundETag {
    /// The header value, quotes included.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0)
    }
}

impl ResourceTags {
    fn mac_of(&self, version: i64) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(&version.to_be_bytes());
        mac
    }

    /// The resource's tag at `version`.
    pub fn etag<V: VersionNumber>(&self, version: V) -> BoundETag {
        self.etag_of(version.to_i64())
    }

    /// Whether a stale report is of this resource: the same table, as the
    /// database names it (the report's `database_table`; its `table` in a
    /// report made by hand, which has none), and the same key, both formatted
    /// with `Debug` (`"sku-9"` for a string, so that a key whose text is `"x"`,
    /// quotes included, is not row `x`). Another row's version must never be
    /// handed out as this resource's tag: a client would hold a tag for a
    /// version it never read, good as soon as the resource reaches that
    /// number. That includes the row of another table whose `table!` has the
    /// same Rust name (`archive::items`).
    pub(crate) fn names(&self, stale: &StaleObjectError) -> bool {
        stale.database_table.unwrap_or(stale.table) == self.table && stale.key == self.key
    }

    pub(crate) fn etag_of(&self, version: i64) -> BoundETag {
        let mac = self.mac_of(version).finalize().into_bytes();
        BoundETag(crate::http::hex(&mac[..TAG_BYTES]))
    }

    /// Whether `opaque` (a tag without quotes) is this resource's tag at
    /// `version`, compared in constant time.
    fn is_tag_of(&self, opaque: &str, version: i64) -> bool {
        let bytes = opaque.as_bytes();
        if bytes.len() != 2 * TAG_BYTES {
            return false;
        }
        let mut mac = [0_u8; TAG_BYTES];
        for (out, pair) in mac.iter_mut().zip(bytes.chunks_exact(2)) {
            match (hex_value(pair[0]), hex_value(pair[1])) {
                (Some(high), Some(low)) => *out = high << 4 | low,
                _ => return false,
            }
        }
        self.mac_of(version).verify_truncated_left(&mac).is_ok()
    }

    /// Whether `If-Match` allows a write over the resource at version `current`:
    /// `*`, or a strong tag of this resource at `current`.
    pub fn matches<V: VersionNumber>(&self, if_match: &IfMatch, current: V) -> bool {
        match if_match {
            IfMatch::Any => true,
            IfMatch::Tags(tags) => tags
                .iter()
                .any(|tag| !tag.weak && self.is_tag_of(&tag.opaque, current.to_i64())),
        }
    }

    /// The version a write may go over, for an `If-Match` read against the
    /// resource's `current` version: [`Expected::Version`]`(current)` when the
    /// header holds its tag, [`Expected::Any`] for `*`. Then write with
    /// [`Expected::apply`], which still checks the version, so a change in
    /// between is refused as stale.
    ///
    /// # Errors
    ///
    /// [`IfMatchError::NoMatch`] (`412`) when no strong tag in the header is this
    /// resource's at `current`: the client's copy is old, or the tag belongs to
    /// another resource or was forged or altered.
    pub fn expected<V: VersionNumber>(
        &self,
        if_match: &IfMatch,
        current: V,
    ) -> Result<Expected<V>, IfMatchError> {
        match if_match {
            IfMatch::Any => Ok(Expected::Any),
            _ if self.matches(if_match, current) => Ok(Expected::Version(current)),
            _ => Err(IfMatchError::NoMatch),
        }
    }

    /// `If-None-Match` on a `GET` (RFC 9110 §13.1.2): whether the client's copy
    /// is the resource at `current`, so the answer is `304 Not Modified`. Weak
    /// comparison: `W/` tags count too; `*` matches.
    pub fn not_modified<V: VersionNumber>(&self, if_none_match: &IfMatch, current: V) -> bool {
        match if_none_match {
            IfMatch::Any => true,
            IfMatch::Tags(tags) => tags
                .iter()
                .any(|tag| self.is_tag_of(&tag.opaque, current.to_i64())),
        }
    }

    /// The problem for a lockkit error on this resource: the status and title of
    /// [`Problem::from_error`], with this resource's bound tag as the current
    /// ETag and no version in the detail. The tag is given only when the stale
    /// report is of this resource (the table and key it was made with, the key
    /// as the report formats it): a report of another row written in the same
    /// request gives none, as its version is not this resource's; and where
    /// that other row was deleted, the answer is `412`, not this resource's
    /// `404`.
    pub fn problem(&self, error: &Error) -> Problem {
        Problem::render(error, Rendering::Bound(self))
    }

    /// The problem for an `If-Match` that did not match: [`Problem::from_if_match`]
    /// with the resource's tag at `current` as the current ETag.
    pub fn if_match_problem<V: VersionNumber>(&self, error: &IfMatchError, current: V) -> Problem {
        let mut problem = Problem::from_if_match(error);
        if *error == IfMatchError::NoMatch {
            problem.current_etag = Some(self.etag(current).to_string());
        }
        problem
    }
}

/// A lowercase hex digit's value (tags are made lowercase; anything else is not
/// one of ours).
fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(byte: u8) -> ETagSecret {
        ETagSecret::new(&[byte; MIN_SECRET_LEN]).unwrap()
    }

    fn header(value: &str) -> IfMatch {
        value.parse().unwrap()
    }

    #[test]
    fn a_stale_report_names_its_own_resource_only() {
        use crate::error::{CurrentState, Operation, StaleObjectError};
        // Reports format keys with `Debug`: row `x` is `"x"`, quotes
        // included, which is also the `Display` of another key.
        let report = |key: &str| {
            StaleObjectError::new(
                "items",
                key,
                "lock_version",
                Operation::Update,
                0,
                CurrentState::Version(9),
            )
        };
        let row_x = report(&format!("{:?}", "x"));
        assert!(secret(1).resource("items", "x").names(&row_x));
        assert!(
            !secret(1).resource("items", "\"x\"").names(&row_x),
            "row x named the resource \"x\""
        );
        assert!(!secret(1).resource("orders", "x").names(&row_x));
        let row_7 = report(&format!("{:?}", 7));
        assert!(secret(1).resource("items", 7).names(&row_7));
        assert!(
            !secret(1).resource("items", "7").names(&row_7),
            "row 7 named the resource \"7\""
        );
    }

    #[test]
    fn a_tag_matches_its_resource_and_version_only() {
        let items_1 = secret(1).resource("items", 1);
        let tag = items_1.etag(7_i32);
        assert_eq!(tag.opaque().len(), 32);
        assert!(tag.opaque().bytes().all(|b| hex_value(b).is_some()));
        let sent = header(&tag.to_string());
        assert_eq!(items_1.expected(&sent, 7_i32), Ok(Expected::Version(7)));
        for (other, version) in [
            (secret(1).resource("items", 2), 7),
            (secret(1).resource("orders", 1), 7),
            (secret(1).resource("items", "1 "), 7),
            (secret(2).resource("items", 1), 7),
            (secret(1).resource("items", 1), 8),
        ] {
            assert_eq!(
                other.expected(&sent, version),
                Err(IfMatchError::NoMatch),
                "{other:?} {version}"
            );
        }
        // Table and key are length-prefixed: moving bytes between them is another resource.
        assert_ne!(
            secret(1).resource("ab", "c").etag(1_i64),
            secret(1).resource("a", "bc").etag(1_i64)
        );
        assert_eq!(items_1.expected(&header("*"), 3_i32), Ok(Expected::Any));
        assert_eq!(
            items_1.expected(&header("\"v7\""), 7_i32),
            Err(IfMatchError::NoMatch),
            "plain tags are not accepted for a bound resource"
        );
        assert_eq!(
            items_1.expected(&header(&format!("W/{tag}")), 7_i32),
            Err(IfMatchError::NoMatch),
            "weak"
        );
        assert!(items_1.not_modified(&header(&format!("W/{tag}")), 7_i32));
        assert!(!items_1.not_modified(&sent, 8_i32));
    }

    #[test]
    fn a_problem_binds_only_its_own_rows_version() {
        use crate::error::{CurrentState, Operation};
        let stale = |table, key: &str| {
            Error::Stale(StaleObjectError::new(
                table,
                key,
                "lock_version",
                Operation::Update,
                3,
                CurrentState::Version(9),
            ))
        };
        let sku = secret(1).resource("items", "sku-9");
        let own = Some(sku.etag(9_i32).to_string());
        // Reports format keys with `Debug`: only that form is this resource.
        assert_eq!(sku.problem(&stale("items", "\"sku-9\"")).current_etag, own);
        for (table, key) in [
            ("items", "sku-9"),
            ("items", "\"sku-8\""),
            ("orders", "\"sku-9\""),
            ("items", "sku-9 "),
        ] {
            let problem = sku.problem(&stale(table, key));
            assert_eq!(
                (problem.status, problem.current_etag),
                (412, None),
                "{table} {key}"
            );
        }
    }

    #[test]
    fn a_problem_tells_tables_apart_by_their_database_names() {
        use crate::error::{CurrentState, Operation};
        // What a versioned write reports: the `table!`'s Rust name, and the
        // table as the database names it.
        let stale = |database_table| {
            let mut report = StaleObjectError::new(
                "items",
                "1",
                "lock_version",
                Operation::Update,
                3,
                CurrentState::Version(9),
            );
            report.database_table = Some(database_table);
            Error::Stale(report)
        };
        let items = secret(1).resource("items", 1);
        let archived = secret(1).resource("archive.items", 1);
        let own = |tags: &ResourceTags| Some(tags.etag(9_i32).to_string());
        assert_eq!(items.problem(&stale("items")).current_etag, own(&items));
        assert_eq!(
            archived.problem(&stale("archive.items")).current_etag,
            own(&archived)
        );
        for (tags, other) in [
            (&items, "archive.items"),
            (&items, "items_archive"),
            (&archived, "items"),
        ] {
            let problem = tags.problem(&stale(other));
            assert_eq!(
                (problem.status, problem.current_etag),
                (412, None),
                "{other}"
            );
        }
    }

    #[test]
    fn an_altered_tag_never_matches() {
        let tags = secret(3).resource("items", 42);
        let opaque = tags.etag(5_i16).opaque().to_owned();
        for i in 0..opaque.len() {
            for replacement in ["0", "f", "A", "g", "é"] {
                let mut altered = opaque.clone();
                altered.replace_range(i..=i, replacement);
                if altered == opaque {
                    continue;
                }
                assert!(
                    !tags.matches(&header(&format!("\"{altered}\"")), 5_i16),
                    "{altered}"
                );
            }
        }
        for bad in [
            "",
            "00",
            &opaque[1..],
            &format!("{opaque}0"),
            &opaque.to_uppercase(),
        ] {
            assert!(
                !tags.matches(&header(&format!("\"{bad}\"")), 5_i16),
                "{bad}"
            );
        }
    }

    #[test]
    fn short_secrets_are_refused() {
        assert_eq!(
            ETagSecret::new(&[0; MIN_SECRET_LEN - 1]).unwrap_err(),
            SecretTooShort(31)
        );
        assert_eq!(format!("{:?}", secret(9)), "ETagSecret(..)");
    }
}
