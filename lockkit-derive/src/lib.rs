//! `#[derive(Versioned)]` for [lockkit](https://docs.rs/lockkit).
//!
//! The derive only *describes* a model to lockkit: its table, primary key, version
//! column and version type, and the changeset of its other fields. All behaviour
//! lives in the `lockkit` crate as generic code. See `lockkit::Versioned`.
//!
//! Stages, one module each: [`attr`] reads `#[diesel(...)]` and `#[lockkit(...)]`,
//! [`ast`] builds and validates the model (collecting every error through
//! [`ctxt`]), and [`expand`] generates the impl.

mod ast;
mod attr;
mod ctxt;
mod expand;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Implements `lockkit::Versioned`. See the `lockkit` crate for the attributes.
#[proc_macro_derive(Versioned, attributes(lockkit))]
pub fn derive_versioned(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    expand::derive_versioned(&input).into()
}
