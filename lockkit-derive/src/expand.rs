//! Code generation: the `Versioned` impl, from a validated [`Model`].

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::DeriveInput;

use crate::ast::{self, Model, ModelField};
use crate::ctxt::Ctxt;

/// The whole derive, as a `proc_macro2` function so tests can call and snapshot it.
pub fn derive_versioned(input: &DeriveInput) -> TokenStream {
    let mut cx = Ctxt::default();
    let parsed = ast::fields(&mut cx, input);
    let model = parsed
        .as_ref()
        .and_then(|(container, fields)| ast::model(&mut cx, input, container, fields));
    match (cx.check(), model) {
        (Ok(()), Some(model)) => expand(&model),
        (Err(errors), _) => errors,
        (Ok(()), None) => unreachable!("a missing model always records an error"),
    }
}

fn expand(model: &Model<'_>) -> TokenStream {
    let ident = &model.input.ident;
    let (impl_generics, ty_generics, where_clause) = model.input.generics.split_for_impl();
    let table = &model.table;
    let table_name = table
        .segments
        .last()
        .map(|segment| segment.ident.to_string())
        .unwrap_or_default();
    let lifetime = syn::Lifetime::new("'__lockkit", proc_macro2::Span::call_site());

    let (key_type, key_value) = match model.keys.as_slice() {
        [key] => {
            let (ty, field) = (key.ty, key.ident);
            (quote!(#ty), quote!(::core::clone::Clone::clone(&self.#field)))
        }
        keys => {
            let types = keys.iter().map(|k| k.ty);
            let fields = keys.iter().map(|k| k.ident);
            (
                quote!((#(#types,)*)),
                quote!((#(::core::clone::Clone::clone(&self.#fields),)*)),
            )
        }
    };

    let version_field = model.version.ident;
    let version_type = model.version.ty;
    let version_column = &model.version.column;

    let (changeset_type, changeset_value) = if model.changeset.is_empty() {
        // Nothing but key and version: the version bump is the whole update.
        (
            quote!(::core::option::Option<diesel::dsl::Eq<#table::#version_column, #version_type>>),
            quote!(::core::option::Option::None),
        )
    } else {
        let types = model
            .changeset
            .iter()
            .map(|f| changeset_type(table, f, &lifetime));
        let values = model.changeset.iter().map(|f| changeset_value(table, f));
        (quote!((#(#types,)*)), quote!((#(#values,)*)))
    };

    let dummy = format_ident!("_");
    quote! {
        const #dummy: () = {
            use ::lockkit::__private::diesel;

            #[automatically_derived]
            impl #impl_generics ::lockkit::Versioned for #ident #ty_generics #where_clause {
                type Table = #table::table;
                type Key = #key_type;
                type VersionColumn = #table::#version_column;
                type Version = #version_type;
                type Changeset<#lifetime> = #changeset_type where Self: #lifetime;

                const TABLE_NAME: &'static str = #table_name;

                fn key(&self) -> Self::Key {
                    #key_value
                }

                fn version(&self) -> Self::Version {
                    self.#version_field
                }

                fn set_version(&mut self, version: Self::Version) {
                    self.#version_field = version;
                }

                fn versioned_changeset(&self) -> Self::Changeset<'_> {
                    #changeset_value
                }
            }
        };
    }
}

/// Mirrors Diesel's `AsChangeset` for `&Model`: `Option` fields are skipped when
/// `None` unless `treat_none_as_null`.
fn changeset_type(table: &syn::Path, field: &ModelField<'_>, lifetime: &syn::Lifetime) -> TokenStream {
    let column = &field.column;
    match (field.skip_none, ast::option_inner(field.ty)) {
        (true, Some(inner)) => {
            quote!(::core::option::Option<diesel::dsl::Eq<#table::#column, &#lifetime #inner>>)
        }
        _ => {
            let ty = field.ty;
            quote!(diesel::dsl::Eq<#table::#column, &#lifetime #ty>)
        }
    }
}

fn changeset_value(table: &syn::Path, field: &ModelField<'_>) -> TokenStream {
    let column = &field.column;
    let ident = field.ident;
    if field.skip_none {
        quote!(::core::option::Option::map(
            ::core::option::Option::as_ref(&self.#ident),
            |value| diesel::ExpressionMethods::eq(#table::#column, value),
        ))
    } else {
        quote!(diesel::ExpressionMethods::eq(#table::#column, &self.#ident))
    }
}
