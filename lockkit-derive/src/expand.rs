//! Code generation: the `Lockable` and `Versioned` impls, from a validated [`Model`].

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::{DeriveInput, Path};

use crate::ast::{self, Model, ModelField, Versioning};
use crate::attr;
use crate::ctxt::Ctxt;
use crate::derive::Derive;
use crate::dummy::dummy_const;
use crate::fallback;

/// `#[derive(Versioned)]`, as a `proc_macro2` function so tests can call and
/// snapshot it.
pub fn derive_versioned(input: &DeriveInput) -> TokenStream {
    derive(input, Derive::Versioned)
}

/// `#[derive(Lockable)]`.
pub fn derive_lockable(input: &DeriveInput) -> TokenStream {
    derive(input, Derive::Lockable)
}

fn derive(input: &DeriveInput, derive: Derive) -> TokenStream {
    let mut cx = Ctxt::default();
    // Read first and apart from the model: the fallback needs it too.
    let krate = attr::lockkit_container(&mut cx, &input.attrs, derive);
    let parsed = ast::fields(&mut cx, input, derive);
    let model = parsed
        .as_ref()
        .and_then(|(container, fields)| ast::model(&mut cx, input, container, fields, derive));
    match (cx.check(), model) {
        (Ok(()), Some(model)) => expand(krate.as_ref(), &model),
        (Err(errors), _) => fallback::expand(krate.as_ref(), input, derive, &errors),
        (Ok(()), None) => unreachable!("a missing model always records an error"),
    }
}

fn expand(krate: Option<&Path>, model: &Model<'_>) -> TokenStream {
    let lockable = expand_lockable(model);
    let versioned = model
        .versioning
        .as_ref()
        .map(|versioning| expand_versioned(model, versioning));
    dummy_const(
        krate,
        quote! {
            #lockable
            #versioned
        },
    )
}

/// `impl Lockable`: the table and the primary key.
fn expand_lockable(model: &Model<'_>) -> TokenStream {
    let ident = &model.input.ident;
    let (impl_generics, ty_generics, where_clause) = model.input.generics.split_for_impl();
    let table = &model.table;
    let table_name = table
        .segments
        .last()
        .map(|segment| segment.ident.unraw().to_string())
        .unwrap_or_default();

    let (key_type, key_value) = match model.keys.as_slice() {
        [key] => {
            let (ty, field) = (key.ty, key.ident);
            (
                quote!(#ty),
                quote!(::core::clone::Clone::clone(&self.#field)),
            )
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

    // The key must be the `table!`'s primary key, column for column: lockkit
    // finds the row with `table.find(key)`.
    let key_check_span = model
        .keys
        .first()
        .map_or_else(proc_macro2::Span::call_site, |k| k.ident.span());
    let primary_key = match model.keys.as_slice() {
        [key] => {
            let column = &key.column;
            quote!(#table::#column)
        }
        keys => {
            let columns = keys.iter().map(|k| &k.column);
            quote!((#(#table::#columns,)*))
        }
    };
    let key_check = quote::quote_spanned! {key_check_span=>
        __lockkit::__private::key_is_primary_key::<#table::table, #primary_key>()
    };

    let key_columns = model.keys.iter().map(|k| {
        let column = &k.column;
        quote!(<#table::#column as __lockkit::__private::diesel::Column>::NAME)
    });
    let on_lock = match model.versioning {
        Some(_) => quote!(__lockkit::__private::BumpVersion),
        None => quote!(__lockkit::__private::NoVersion),
    };

    quote! {
        #[automatically_derived]
        impl #impl_generics __lockkit::__private::Lockable for #ident #ty_generics #where_clause {
            type Table = #table::table;
            type Key = #key_type;
            type OnLock = #on_lock;

            const TABLE_NAME: &'static str = #table_name;
            const KEY_COLUMNS: &'static [&'static str] = &[#(#key_columns),*];

            fn key(&self) -> Self::Key {
                #key_value
            }
        }

        const _: fn() = || #key_check;
    }
}

/// `impl Versioned`: the version column and the changeset of the other fields.
fn expand_versioned(model: &Model<'_>, versioning: &Versioning<'_>) -> TokenStream {
    let ident = &model.input.ident;
    let (impl_generics, ty_generics, where_clause) = model.input.generics.split_for_impl();
    let table = &model.table;
    let lifetime = syn::Lifetime::new("'__lockkit", proc_macro2::Span::call_site());

    let version_field = versioning.version.ident;
    let version_type = versioning.version.ty;
    let version_column = &versioning.version.column;

    // How Diesel caches the UPDATE: by type when the SQL follows from the fields'
    // types, by SQL text when a field is left out at run time (`None`).
    let (fields_type, fields_value, cache) = if versioning.changeset.is_empty() {
        // Nothing but key and version: the version bump is the whole update.
        (
            quote!(::core::option::Option<__lockkit::__private::diesel::dsl::Eq<#table::#version_column, #version_type>>),
            quote!(::core::option::Option::None),
            quote!(BySql),
        )
    } else {
        let types = versioning
            .changeset
            .iter()
            .map(|f| changeset_type(table, f, &lifetime));
        let values = versioning
            .changeset
            .iter()
            .map(|f| changeset_value(table, f));
        let cache = if versioning.changeset.iter().any(|f| f.skip_none) {
            quote!(BySql)
        } else {
            quote!(ByType)
        };
        (quote!((#(#types,)*)), quote!((#(#values,)*)), cache)
    };
    let updated_at = match versioning.updated_at {
        Some(field) => {
            let column = &field.column;
            quote!(__lockkit::__private::SetUpdatedAt<#table::#column>)
        }
        None => quote!(__lockkit::__private::NoUpdatedAt<#table::table>),
    };
    let changeset_type = quote!(__lockkit::__private::#cache<#fields_type>);
    let changeset_value = quote!(__lockkit::__private::#cache(#fields_value));

    quote! {
        #[automatically_derived]
        impl #impl_generics __lockkit::__private::Versioned for #ident #ty_generics #where_clause {
            type VersionColumn = #table::#version_column;
            type Version = #version_type;
            type Changeset<#lifetime> = #changeset_type where Self: #lifetime;
            type UpdatedAt = #updated_at;

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
    }
}

/// Mirrors Diesel's `AsChangeset` for `&Model`: `Option` fields are skipped when
/// `None` unless `treat_none_as_null`.
fn changeset_type(
    table: &syn::Path,
    field: &ModelField<'_>,
    lifetime: &syn::Lifetime,
) -> TokenStream {
    let column = &field.column;
    match (field.skip_none, ast::option_inner(field.ty)) {
        (true, Some(inner)) => {
            quote!(::core::option::Option<__lockkit::__private::diesel::dsl::Eq<#table::#column, &#lifetime #inner>>)
        }
        _ => {
            let ty = field.ty;
            quote!(__lockkit::__private::diesel::dsl::Eq<#table::#column, &#lifetime #ty>)
        }
    }
}

fn changeset_value(table: &syn::Path, field: &ModelField<'_>) -> TokenStream {
    let column = &field.column;
    let ident = field.ident;
    if field.skip_none {
        quote!(::core::option::Option::map(
            ::core::option::Option::as_ref(&self.#ident),
            |value| __lockkit::__private::diesel::ExpressionMethods::eq(#table::#column, value),
        ))
    } else {
        quote!(__lockkit::__private::diesel::ExpressionMethods::eq(#table::#column, &self.#ident))
    }
}
