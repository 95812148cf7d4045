//! `#[derive(Versioned)]` and `#[derive(Lockable)]` for [lockkit](https://docs.rs/lockkit).
//!
//! The derives only *describe* a model to lockkit: its table and primary key
//! (`Lockable`), plus its version column and type and the changeset of its other
//! fields (`Versioned`, which implements both traits). All behaviour
//! lives in the `lockkit` crate as generic code. Use them through lockkit, whose
//! docs list the attributes: [`lockkit::Versioned`](https://docs.rs/lockkit/latest/lockkit/derive.Versioned.html)
//! and [`lockkit::Lockable`](https://docs.rs/lockkit/latest/lockkit/derive.Lockable.html).
//!
//! Stages, one private module each: `attr` reads `#[diesel(...)]` and
//! `#[lockkit(...)]`, `ast` builds and validates the model (collecting every error
//! through `ctxt`), and `expand` generates the impl; on errors, `fallback` emits
//! them with stub impls, so that call sites add no errors of their own.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod fallback;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Implements `lockkit::Versioned` and `lockkit::Lockable`. The attributes
/// (`#[lockkit(version)]`, the `lock_version` default, the `#[diesel(..)]` keys it
/// reads) are documented on [`lockkit::Versioned`](https://docs.rs/lockkit/latest/lockkit/derive.Versioned.html).
#[proc_macro_derive(Versioned, attributes(lockkit))]
pub fn derive_versioned(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive_versioned(&input).into()
}

/// Implements `lockkit::Lockable` (table and primary key) for a model without a
/// version column.
#[proc_macro_derive(Lockable, attributes(lockkit))]
pub fn derive_lockable(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive_lockable(&input).into()
}
