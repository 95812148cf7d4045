//! The error type of the shop.

/// Everything that can stop a run: a bad option ([`ShopError::Usage`]), a
/// database that could not be set up, an error a strategy could not handle, or
/// a buyer thread that panicked.
pub type ShopError = lockkit_tests::support::ProgramError;
