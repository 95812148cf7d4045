//! Collects every error of a derive so the user sees all mistakes in one build.

use std::fmt::Display;

use proc_macro2::TokenStream;
use quote::ToTokens;

#[derive(Default)]
pub struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// An error at `tokens`, with a `help:` line showing the correct form.
    pub fn error_with_help(&mut self, tokens: impl ToTokens, message: impl Display, help: &str) {
        self.errors.push(syn::Error::new_spanned(
            tokens,
            format!("{message}\n\nhelp: {help}"),
        ));
    }

    pub fn syn_error(&mut self, error: syn::Error) {
        self.errors.push(error);
    }

    /// All errors as one `compile_error!` block, or `None` if there were none.
    pub fn check(self) -> Result<(), TokenStream> {
        let mut errors = self.errors.into_iter();
        let Some(mut first) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            first.combine(error);
        }
        Err(first.to_compile_error())
    }
}
