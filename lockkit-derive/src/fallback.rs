//! What the derive emits when the input is wrong: the errors, and the traits
//! implemented anyway, so that a call such as `item.update_versioned(conn)` or
//! `with_lock(..)` further down adds no error of its own. The user sees the
//! mistakes in the derive, not one more error per call site.
//!
//! Every associated type of these impls is `[(); compile_error!(..)]`, with the
//! first error as the array's length: rustc reports that error once and treats
//! the type as erroneous, which silences every trait bound that mentions it.
//! The other errors follow as items, so all of them come out in source order.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Path};

use crate::derive::Derive;
use crate::dummy::dummy_const;

pub fn expand(
    krate: Option<&Path>,
    input: &DeriveInput,
    derive: Derive,
    errors: &[syn::Error],
) -> TokenStream {
    let mut errors = errors.iter().map(syn::Error::to_compile_error);
    let first = errors
        .next()
        .expect("the fallback is for inputs with errors");
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();

    let on_lock = match derive {
        Derive::Versioned => quote!(__lockkit::__private::BumpVersion),
        Derive::Lockable => quote!(__lockkit::__private::NoVersion),
    };
    let versioned = (derive == Derive::Versioned).then(|| {
        quote! {
            #[automatically_derived]
            impl #impl_generics __lockkit::__private::Versioned for #ident #ty_generics #where_clause {
                type VersionColumn = __LockkitInvalid;
                type Version = __LockkitInvalid;
                type Changeset<'__lockkit> = __LockkitInvalid where Self: '__lockkit;
                type UpdatedAt = __LockkitInvalid;

                fn version(&self) -> Self::Version {
                    ::core::unreachable!()
                }

                fn set_version(&mut self, _: Self::Version) {
                    ::core::unreachable!()
                }

                fn versioned_changeset(&self) -> Self::Changeset<'_> {
                    ::core::unreachable!()
                }
            }
        }
    });

    let impls = dummy_const(
        krate,
        quote! {
            type __LockkitInvalid = [(); #first];

            #[automatically_derived]
            impl #impl_generics __lockkit::__private::Lockable for #ident #ty_generics #where_clause {
                type Table = __LockkitInvalid;
                type Key = __LockkitInvalid;
                type OnLock = #on_lock;

                const TABLE_NAME: &'static str = "";
                const KEY_COLUMNS: &'static [&'static str] = &[];

                fn key(&self) -> Self::Key {
                    ::core::unreachable!()
                }
            }

            #versioned
        },
    );
    quote! {
        #impls
        #(#errors)*
    }
}
