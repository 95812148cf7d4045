//! The integer types a version column may have, and what happens at their limit.
//!
//! Versions are `i16`, `i32` or `i64` (`SMALLINT`, `INTEGER`, `BIGINT`). A write
//! bumps the version by exactly one, in SQL: `lock_version = lock_version + 1`.
//!
//! # Overflow policy
//!
//! lockkit never wraps and never panics. A write whose expected version is already
//! the type's maximum is refused with [`Error::VersionOverflow`](crate::Error::VersionOverflow)
//! *before* any statement is sent, so the row and the struct are left untouched.
//! A row that reaches the maximum must have its version reset by an operator (or the
//! column widened); with `i32` that is two billion writes to one row, with `i16` it is
//! 32,767, which is why `i32` or `i64` is the recommended type.
//!
//! One write is not checked first: [`Versioned::update_if`](crate::Versioned::update_if)
//! reads nothing, and its `SET lock_version = lock_version + 1` on a row already
//! at the maximum is the server's to refuse. PostgreSQL and MySQL/MariaDB in
//! strict mode answer with an out-of-range error ([`Error::Database`](crate::Error::Database));
//! SQLite stores the larger number. For `i16` and `i32`, Diesel reads it back
//! wrapped to the type's minimum, which no later versioned write then matches
//! ([`Error::Stale`](crate::Error::Stale) every time) until an operator resets it;
//! for `i64` it becomes a floating-point value read back as the maximum, and
//! later writes are [`Error::VersionOverflow`](crate::Error::VersionOverflow).

use std::fmt::{Debug, Display};

mod sealed {
    pub trait Sealed {}
    impl Sealed for i16 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
}

/// An integer type usable as a lock version: `i16`, `i32` or `i64`. Sealed;
/// name it only in `where` clauses.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a lockkit version type",
    label = "a version is `i16`, `i32` or `i64`",
    note = "use the model's version field, or the type of its `SMALLINT`, `INTEGER` or `BIGINT` column; convert a value with `i64::from(n)`, or `i64::try_from(n)` where it may not fit"
)]
pub trait VersionNumber:
    sealed::Sealed + Copy + Eq + Ord + Debug + Display + Send + Sync + 'static
{
    /// The largest version; a row at this version cannot be written by lockkit.
    const MAX: Self;
    /// The increment, as the column's own type (used in `version + 1`).
    const ONE: Self;

    /// The version after `self`, or `None` at [`Self::MAX`].
    fn checked_next(self) -> Option<Self>;

    /// The version widened to `i64`, for error reports.
    fn to_i64(self) -> i64;

    /// The version from an `i64`, if it fits the type.
    fn from_i64(value: i64) -> Option<Self>;
}

macro_rules! version_number {
    ($($t:ty),*) => {$(
        #[diagnostic::do_not_recommend]
        impl VersionNumber for $t {
            const MAX: Self = <$t>::MAX;
            const ONE: Self = 1;

            #[inline]
            fn checked_next(self) -> Option<Self> {
                self.checked_add(1)
            }

            #[inline]
            fn to_i64(self) -> i64 {
                i64::from(self)
            }

            #[inline]
            fn from_i64(value: i64) -> Option<Self> {
                <$t>::try_from(value).ok()
            }
        }
    )*};
}

version_number!(i16, i32, i64);

#[cfg(test)]
mod tests {
    use super::VersionNumber;

    #[test]
    fn next_stops_at_max() {
        assert_eq!(41i32.checked_next(), Some(42));
        assert_eq!(i16::MAX.checked_next(), None);
        assert_eq!(i32::MAX.checked_next(), None);
        assert_eq!(i64::MAX.checked_next(), None);
        assert_eq!((-1i64).checked_next(), Some(0));
    }
}
