//! The one wrapper every generated impl goes in, the derive's own and the
//! fallback's alike.

use proc_macro2::TokenStream;
use quote::quote;
use syn::Path;

/// `const _: () = { .. };`, so that nothing generated leaks into the user's
/// module, hidden from docs and lints. Inside, lockkit is `__lockkit`: `krate`,
/// the path of `#[lockkit(crate = ..)]`, or `::lockkit`.
pub fn dummy_const(krate: Option<&Path>, body: TokenStream) -> TokenStream {
    let krate = match krate {
        Some(path) => quote!(#path),
        None => quote!(::lockkit),
    };
    quote! {
        #[doc(hidden)]
        #[allow(
            non_upper_case_globals,
            unused_attributes,
            unused_qualifications,
            clippy::absolute_paths
        )]
        const _: () = {
            use #krate as __lockkit;
            #body
        };
    }
}
