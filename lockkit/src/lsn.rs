//! [`Lsn`]: a position in PostgreSQL's write-ahead log, and its text form, the
//! token a web app carries between requests.

use std::fmt;
use std::str::FromStr;

/// A position in PostgreSQL's write-ahead log (WAL): a `pg_lsn`, a byte offset
/// that only grows. A write's transaction is visible on a standby once the standby
/// has replayed the WAL up to the position taken after its commit
/// ([`commit_lsn`](crate::replica::commit_lsn)).
///
/// Its text form is PostgreSQL's own, `16/B374D848` (two hexadecimal numbers of
/// up to eight digits: the high and the low 32 bits), and it is the token a web
/// app hands back to its client after a write, in a cookie or a header, to get it
/// back with the next request. It holds only characters allowed in cookie values
/// and header values. Parsing never panics: anything that is not exactly that
/// form is a [`ParseLsnError`].
///
/// ```
/// use lockkit::replica::Lsn;
/// let lsn: Lsn = "16/B374D848".parse().unwrap();
/// assert_eq!(lsn.to_string(), "16/B374D848");
/// assert_eq!(u64::from(lsn), 0x16_B374_D848);
/// assert!(lsn > "16/0".parse().unwrap());
/// assert!("16/B374D848; Path=/".parse::<Lsn>().is_err());
/// assert!("+16/0".parse::<Lsn>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(u64);

impl Lsn {
    /// The position zero, `0/0`: before everything.
    pub const ZERO: Lsn = Lsn(0);
}

impl From<u64> for Lsn {
    fn from(position: u64) -> Self {
        Lsn(position)
    }
}

impl From<Lsn> for u64 {
    fn from(lsn: Lsn) -> Self {
        lsn.0
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As PostgreSQL prints a pg_lsn: `%X/%X`.
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// A text that is not a WAL position of the form `16/B374D848`
/// ([`Lsn`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a WAL position (expected two hexadecimal numbers of 1 to 8 digits joined by '/', e.g. 16/B374D848)")]
#[non_exhaustive]
pub struct ParseLsnError;

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (high, low) = text.split_once('/').ok_or(ParseLsnError)?;
        Ok(Lsn((u64::from(half(high)?) << 32) | u64::from(half(low)?)))
    }
}

/// One half of the text form: 1 to 8 hexadecimal digits, nothing else (no sign,
/// which `from_str_radix` would accept, no spaces).
fn half(text: &str) -> Result<u32, ParseLsnError> {
    if text.is_empty() || text.len() > 8 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseLsnError);
    }
    u32::from_str_radix(text, 16).map_err(|_| ParseLsnError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        for value in [0, 1, 0xFFFF_FFFF, 0x1_0000_0000, u64::MAX, 0x16_B374_D848] {
            let lsn = Lsn::from(value);
            assert_eq!(lsn.to_string().parse::<Lsn>(), Ok(lsn));
        }
        assert_eq!("ffffffff/ffffffff".parse::<Lsn>(), Ok(Lsn(u64::MAX)));
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "",
            "/",
            "0/",
            "/0",
            "0",
            "0/0/0",
            " 0/0",
            "0/0 ",
            "+1/0",
            "1/-0",
            "123456789/0",
            "0/123456789",
            "g/0",
            "0x1/0",
            "0/٣",
            "１/0",
        ] {
            assert_eq!(bad.parse::<Lsn>(), Err(ParseLsnError), "{bad:?}");
        }
    }
}
