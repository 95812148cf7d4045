//! The validated model of a `#[derive(Versioned)]` or `#[derive(Lockable)]` input.
//! Code generation reads only this; it never looks at attributes.

use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields, Ident, Path, Type};

use crate::attr::{self, Located, DEFAULT_VERSION_FIELD};
use crate::ctxt::{Ctxt, Pos};
use crate::derive::Derive;

pub struct Model<'a> {
    pub input: &'a DeriveInput,
    /// `items` or `crate::schema::items`.
    pub table: Path,
    /// The primary key fields, in `primary_key(...)` order.
    pub keys: Vec<&'a ModelField<'a>>,
    /// Present for `Versioned`.
    pub versioning: Option<Versioning<'a>>,
}

pub struct Versioning<'a> {
    pub version: &'a ModelField<'a>,
    /// Fields written by `update_versioned`: not a key, not the version, not
    /// `skip_update`, `no_bump` or `updated_at`.
    pub changeset: Vec<&'a ModelField<'a>>,
    /// The field every versioned write sets to the database's clock.
    pub updated_at: Option<&'a ModelField<'a>>,
}

pub struct ModelField<'a> {
    /// The field's place among the struct's fields.
    pub index: usize,
    pub ident: &'a Ident,
    pub ty: &'a Type,
    pub column: Ident,
    /// `Some(inner)` for `Option<inner>` written only when `Some` (Diesel's default).
    pub skip_none: bool,
    pub skip_update: bool,
    pub unsupported: Option<Located<Ident>>,
    pub marked_version: Option<Located<Ident>>,
    pub no_bump: Option<Located<Ident>>,
    pub updated_at: Option<Located<Ident>>,
}

impl ModelField<'_> {
    /// Whether this field maps `column`: `r#name` and `name` are one column, as
    /// in Diesel's `table!`.
    pub fn maps(&self, column: &Ident) -> bool {
        self.column.unraw() == column.unraw()
    }
}

/// Reads the fields; the model borrows them, so they are built first.
pub fn fields<'a>(
    cx: &mut Ctxt,
    input: &'a DeriveInput,
    derive: Derive,
) -> Option<(attr::DieselContainer, Vec<ModelField<'a>>)> {
    let container = attr::diesel_container(cx, &input.attrs);
    let named = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) => named,
            Fields::Unnamed(_) | Fields::Unit => {
                cx.error_with_help(
                    Pos::NAME,
                    &input.ident,
                    format!("`{}` needs a struct with named fields", derive.name()),
                    format!("write `{}`", derive.example(&input.ident)),
                );
                return None;
            }
        },
        Data::Enum(data) => {
            not_a_struct(cx, input, derive, data.enum_token, "an enum");
            return None;
        }
        Data::Union(data) => {
            not_a_struct(cx, input, derive, data.union_token, "a union");
            return None;
        }
    };
    let fields = named
        .named
        .iter()
        .enumerate()
        .map(|(index, field)| {
            let diesel = attr::diesel_field(cx, index, &field.attrs);
            let lockkit = attr::lockkit_field(cx, index, &field.attrs);
            let ident = field.ident.as_ref().expect("named field");
            let treat_none_as_null = diesel
                .treat_none_as_null
                .unwrap_or(container.treat_none_as_null);
            ModelField {
                index,
                ident,
                ty: &field.ty,
                column: diesel.column_name.unwrap_or_else(|| ident.clone()),
                skip_none: option_inner(&field.ty).is_some() && !treat_none_as_null,
                skip_update: diesel.skip_update,
                unsupported: diesel.unsupported,
                marked_version: lockkit.version,
                no_bump: lockkit.no_bump,
                updated_at: lockkit.updated_at,
            }
        })
        .collect();
    Some((container, fields))
}

/// The error for a derive on an enum or a union (`kind`, at its `token`).
fn not_a_struct(
    cx: &mut Ctxt,
    input: &DeriveInput,
    derive: Derive,
    token: impl quote::ToTokens,
    kind: &str,
) {
    cx.error_with_help(
        Pos::NAME,
        token,
        format!("`{}` cannot be derived for {kind}", derive.name()),
        format!(
            "derive it on a struct with named fields: `{}`",
            derive.example(&input.ident)
        ),
    );
}

pub fn model<'a>(
    cx: &mut Ctxt,
    input: &'a DeriveInput,
    container: &attr::DieselContainer,
    fields: &'a [ModelField<'a>],
    derive: Derive,
) -> Option<Model<'a>> {
    let table = container.table_name.clone().unwrap_or_else(|| {
        // `r#Item` names the table of `Item`.
        Ident::new(
            &infer_table_name(&input.ident.unraw().to_string()),
            input.ident.span(),
        )
        .into()
    });

    let (primary_key, key_pos) = match &container.primary_key {
        Some(keys) => (keys.value.clone(), keys.pos),
        None => (vec![Ident::new("id", input.ident.span())], Pos::NAME),
    };
    let keys: Vec<_> = primary_key
        .iter()
        .filter_map(|column| {
            let field = fields.iter().find(|f| f.maps(column));
            if field.is_none() {
                let help = if container.primary_key.is_some() {
                    format!(
                        "add a field `{column}`, or map one to it with `#[diesel(column_name = {column})]`"
                    )
                } else {
                    // The first field that is not the version, as an example.
                    let example = fields
                        .iter()
                        .find(|f| f.marked_version.is_none() && f.ident.unraw() != DEFAULT_VERSION_FIELD)
                        .map_or("code".to_string(), |f| f.column.to_string());
                    format!(
                        "add an `id` field, or name the key columns: `#[diesel(primary_key({example}))]`"
                    )
                };
                cx.error_with_help(
                    key_pos,
                    column,
                    format!("no field maps the primary key column `{column}`"),
                    help,
                );
            }
            field
        })
        .collect();

    let versioning = match derive {
        Derive::Versioned => Some(versioning(cx, input, fields, &keys)?),
        Derive::Lockable => {
            for field in fields {
                if field.column.unraw() == DEFAULT_VERSION_FIELD {
                    cx.error_with_help(
                        Pos::field_name(field.index),
                        field.ident,
                        format!(
                            "a `Lockable` model's locks do not advance the version in `{DEFAULT_VERSION_FIELD}`: \
                             an editor holding an older copy of the row would write over the locked change"
                        ),
                        "write `#[derive(Versioned)]` instead: it implements `Lockable` too, and its locks advance the version",
                    );
                }
                let markers = [&field.marked_version, &field.no_bump, &field.updated_at];
                for marker in markers.into_iter().flatten() {
                    cx.error_with_help(
                        marker.pos,
                        &marker.value,
                        format!("`#[lockkit({})]` has no effect on `Lockable`", marker.value),
                        "write `#[derive(Versioned)]` instead: it implements `Lockable` too",
                    );
                }
            }
            None
        }
    };

    Some(Model {
        input,
        table,
        keys,
        versioning,
    })
}

fn versioning<'a>(
    cx: &mut Ctxt,
    input: &DeriveInput,
    fields: &'a [ModelField<'a>],
    keys: &[&'a ModelField<'a>],
) -> Option<Versioning<'a>> {
    let version = version_field(cx, input, fields)?;
    if let Some(key) = keys.iter().find(|k| k.ident == version.ident) {
        cx.error_with_help(
            Pos::field_name(key.index),
            key.ident,
            "the version field cannot be part of the primary key",
            "add a separate version field, such as `lock_version: i32`",
        );
    }
    check_version_type(cx, version);
    let updated_at = check_unversioned_fields(cx, fields, version, keys);
    check_columns_mapped_twice(cx, fields, version, keys);

    let changeset = fields
        .iter()
        .filter(|f| !f.maps(&version.column) && !keys.iter().any(|k| f.maps(&k.column)))
        .filter(|f| !f.skip_update && f.no_bump.is_none() && f.updated_at.is_none())
        .collect::<Vec<_>>();
    for field in &changeset {
        if let Some(kind) = &field.unsupported {
            cx.error_with_help(
                kind.pos,
                &kind.value,
                format!(
                    "`update_versioned` cannot write a field with `#[diesel({})]`",
                    kind.value
                ),
                "add `#[diesel(skip_update)]` to this field and write it with `update_versioned_with`",
            );
        }
    }

    Some(Versioning {
        version,
        changeset,
        updated_at,
    })
}

/// One field for each column the versioned write names: a second field on the
/// version column would set the version from it (on MySQL, before its bump); on
/// a key column, rewrite the key; on a `no_bump` column, write back the count it
/// read over the increments the marker protects; anywhere else in the write,
/// assign the column twice. Diesel's `AsChangeset` leaves every field on a key
/// column out; lockkit refuses them all. A `skip_update` field is never
/// written: it may read a column that another field writes, but not the key or
/// the version.
fn check_columns_mapped_twice(
    cx: &mut Ctxt,
    fields: &[ModelField<'_>],
    version: &ModelField<'_>,
    keys: &[&ModelField<'_>],
) {
    // The key and the version own their columns wherever they stand; then
    // each written field, in source order, owns its column.
    let mut owners: Vec<(&ModelField<'_>, &str)> = keys
        .iter()
        .map(|key| (*key, "primary key column"))
        .collect();
    // The version on a key column would move the row at every write.
    if let Some(&(key, what)) = owners.iter().find(|(k, _)| version.maps(&k.column)) {
        if key.ident != version.ident {
            mapped_twice(cx, version, key, what);
        }
    }
    owners.push((version, "version column"));
    let pinned = owners.len();
    for field in fields {
        if owners[..pinned].iter().any(|(o, _)| o.ident == field.ident) {
            continue;
        }
        let what = if field.no_bump.is_some() {
            "`no_bump` column"
        } else if field.updated_at.is_some() {
            "`updated_at` column"
        } else {
            "column"
        };
        let written = !field.skip_update || what != "column";
        match owners.iter().position(|(o, _)| field.maps(&o.column)) {
            Some(at) if at < pinned || written => {
                let (owner, what) = owners[at];
                mapped_twice(cx, field, owner, what);
            }
            Some(_) => {}
            None if written => owners.push((field, what)),
            None => {}
        }
    }
}

/// The error for `field` on the column `owner` maps (`what` kind of column).
fn mapped_twice(cx: &mut Ctxt, field: &ModelField<'_>, owner: &ModelField<'_>, what: &str) {
    cx.error_with_help(
        Pos::field_name(field.index),
        field.ident,
        format!(
            "field `{}` maps the {what} `{}`, as `{}` does",
            field.ident,
            owner.column.unraw(),
            owner.ident
        ),
        format!("remove `{}`, or map it to a column of its own", field.ident),
    );
}

/// `no_bump` and `updated_at`: on neither the version nor a key, not both on one
/// field, `updated_at` on one field. Returns the `updated_at` field.
fn check_unversioned_fields<'a>(
    cx: &mut Ctxt,
    fields: &'a [ModelField<'a>],
    version: &ModelField<'_>,
    keys: &[&ModelField<'_>],
) -> Option<&'a ModelField<'a>> {
    let mut updated_at = None;
    for field in fields {
        let is_version = field.ident == version.ident;
        let is_key = keys.iter().any(|k| k.ident == field.ident);
        if let Some(marker) = &field.no_bump {
            if is_version {
                cx.error_with_help(
                    marker.pos,
                    &marker.value,
                    "the version field cannot be `no_bump`: it is what every versioned write bumps",
                    "remove `#[lockkit(no_bump)]` here; put it on counter or timestamp fields",
                );
            } else if is_key {
                cx.error_with_help(
                    marker.pos,
                    &marker.value,
                    "`#[lockkit(no_bump)]` has no effect on a primary key field: lockkit never writes the key",
                    "remove `#[lockkit(no_bump)]` here",
                );
            } else if field.updated_at.is_some() {
                cx.error_with_help(
                    marker.pos,
                    &marker.value,
                    "a field cannot be both `no_bump` and `updated_at`: every versioned write sets `updated_at`",
                    "keep one of `#[lockkit(no_bump)]` and `#[lockkit(updated_at)]`",
                );
            }
        }
        if let Some(marker) = &field.updated_at {
            if is_version || is_key {
                cx.error_with_help(
                    marker.pos,
                    &marker.value,
                    format!(
                        "`#[lockkit(updated_at)]` cannot be on the {}",
                        if is_version {
                            "version field"
                        } else {
                            "primary key"
                        }
                    ),
                    "put it on a timestamp field, such as `updated_at: Option<NaiveDateTime>`",
                );
            } else if updated_at.is_some() {
                cx.error_with_help(
                    marker.pos,
                    &marker.value,
                    "more than one field is marked `#[lockkit(updated_at)]`",
                    "keep `#[lockkit(updated_at)]` on one field only",
                );
            } else {
                updated_at = Some(field);
            }
        }
    }
    updated_at
}

fn version_field<'a>(
    cx: &mut Ctxt,
    input: &DeriveInput,
    fields: &'a [ModelField<'a>],
) -> Option<&'a ModelField<'a>> {
    let marked: Vec<_> = fields
        .iter()
        .filter(|f| f.marked_version.is_some())
        .collect();
    match marked.as_slice() {
        [one] => Some(one),
        [] => {
            let by_name = fields
                .iter()
                .find(|f| f.ident.unraw() == DEFAULT_VERSION_FIELD);
            if by_name.is_none() {
                cx.error_with_help(
                    Pos::NAME,
                    &input.ident,
                    format!("`{}` has no version field", input.ident),
                    "add `lock_version: i32`, or mark an integer field with `#[lockkit(version)]`",
                );
            }
            by_name
        }
        [_, rest @ ..] => {
            for extra in rest {
                let marker = extra.marked_version.as_ref().expect("marked");
                cx.error_with_help(
                    marker.pos,
                    &marker.value,
                    "more than one field is marked `#[lockkit(version)]`",
                    "keep `#[lockkit(version)]` on one field only",
                );
            }
            None
        }
    }
}

/// The types a version may have.
const INTEGERS: [&str; 3] = ["i16", "i32", "i64"];

fn check_version_type(cx: &mut Ctxt, version: &ModelField<'_>) {
    let name = version.ident;
    if let Some(inner) = option_inner(version.ty) {
        cx.error_with_help(
            Pos::field_type(version.index),
            version.ty,
            "the version cannot be an `Option`: a NULL version cannot be compared",
            format!(
                "write `{name}: {}`, on a column declared `NOT NULL DEFAULT 0`",
                type_name(inner)
                    .filter(|t| INTEGERS.contains(&t.as_str()))
                    .as_deref()
                    .unwrap_or("i32")
            ),
        );
    } else if !type_name(version.ty).is_some_and(|t| INTEGERS.contains(&t.as_str())) {
        cx.error_with_help(
            Pos::field_type(version.index),
            version.ty,
            "the version must be `i16`, `i32` or `i64`",
            format!(
                "write `{name}: i32`, on an `INTEGER` column (`i16` for `SMALLINT`, `i64` for `BIGINT`)"
            ),
        );
    }
}

/// `Some(T)` for `Option<T>`, matched by name as Diesel does, also inside the
/// invisible group a `macro_rules!` type fragment (`$t`) arrives in, or
/// parentheses.
pub fn option_inner(ty: &Type) -> Option<&Type> {
    let path = match ty {
        Type::Path(path) => path,
        Type::Group(group) => return option_inner(&group.elem),
        Type::Paren(paren) => return option_inner(&paren.elem),
        _ => return None,
    };
    let last = path.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    match &last.arguments {
        syn::PathArguments::AngleBracketed(args) if args.args.len() == 1 => match &args.args[0] {
            syn::GenericArgument::Type(inner) => Some(inner),
            _ => None,
        },
        _ => None,
    }
}

fn type_name(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(path) if path.qself.is_none() => path.path.get_ident().map(|i| i.to_string()),
        Type::Group(group) => type_name(&group.elem),
        _ => None,
    }
}

/// Diesel's default table name: `FooBar` -> `foo_bars`.
pub fn infer_table_name(name: &str) -> String {
    let mut result = String::with_capacity(name.len() + 1);
    for (i, character) in name.chars().enumerate() {
        if character.is_uppercase() {
            if i > 0 {
                result.push('_');
            }
            result.extend(character.to_lowercase());
        } else {
            result.push(character);
        }
    }
    result.push('s');
    result
}

#[cfg(test)]
mod tests {
    use super::infer_table_name;

    #[test]
    fn table_names_follow_diesel() {
        assert_eq!(infer_table_name("Item"), "items");
        assert_eq!(infer_table_name("FooBar"), "foo_bars");
        assert_eq!(infer_table_name("FooBarBaz"), "foo_bar_bazs");
    }
}
