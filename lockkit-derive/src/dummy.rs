//! The one wrapper every generated impl goes in, the derive's own and the
//! fallback's alike.

use proc_macro2::TokenStream;
use quote::quote;

/// `const _: () = { .. };`, so that nothing generated leaks into the user's
/// module, hidden from docs and lints.
pub fn dummy_const(body: TokenStream) -> TokenStream {
    quote! {
        #[doc(hidden)]
        #[allow(
            non_upper_case_globals,
            unused_attributes,
            unused_qualifications,
            clippy::absolute_paths
        )]
        const _: () = {
            #body
        };
    }
}
