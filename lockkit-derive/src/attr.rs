//! Reading attributes. lockkit's own keys live in `#[lockkit(...)]` (Diesel
//! rejects unknown keys inside `#[diesel(...)]`); Diesel's keys are read
//! tolerantly: the few lockkit needs are parsed, every other key is skipped.

// `Ident::parse_any` accepts keywords too (`type`, `ref`), as Diesel does.
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::parse::{Parse, ParseStream};
use syn::{Attribute, Ident, LitBool, Path, Token};

use crate::ctxt::{Ctxt, Pos};
use crate::derive::Derive;

pub const LOCKKIT: &str = "lockkit";
pub const DIESEL: &str = "diesel";
/// `#[lockkit(version)]` on a field: this is the version column.
pub const VERSION: &str = "version";
/// `#[lockkit(no_bump)]` on a field: `update_versioned` leaves it out, so that
/// writes of it (counters, timestamps) need not move the version.
pub const NO_BUMP: &str = "no_bump";
/// `#[lockkit(updated_at)]` on a field: every versioned write sets it to the
/// database's clock.
pub const UPDATED_AT: &str = "updated_at";
/// The field used as the version when none is marked.
pub const DEFAULT_VERSION_FIELD: &str = "lock_version";

/// A value and the place of the attribute it was read from, for errors about it.
pub struct Located<T> {
    pub value: T,
    pub pos: Pos,
}

/// `#[diesel(...)]` keys lockkit reads on the struct.
#[derive(Default)]
pub struct DieselContainer {
    pub table_name: Option<Path>,
    pub primary_key: Option<Located<Vec<Ident>>>,
    pub treat_none_as_null: bool,
}

/// `#[diesel(...)]` keys lockkit reads on a field.
#[derive(Default)]
pub struct DieselField {
    pub column_name: Option<Ident>,
    pub skip_update: bool,
    pub treat_none_as_null: Option<bool>,
    /// `serialize_as`, `embed` or `select_expression`: a changeset lockkit
    /// cannot mirror, or a field read from an expression, not its column.
    pub unsupported: Option<Located<Ident>>,
}

/// `#[lockkit(...)]` keys on a field.
#[derive(Default)]
pub struct LockkitField {
    pub version: Option<Located<Ident>>,
    pub no_bump: Option<Located<Ident>>,
    pub updated_at: Option<Located<Ident>>,
}

/// Diesel's attribute forms from before 2.0 (`#[table_name = "items"]`), with
/// the `#[diesel(..)]` key that replaced each. Diesel's `with-deprecated`
/// feature, on by default, still reads them; lockkit would not, and would write
/// another table, column or `None` than Diesel's derives.
const OLD_STRUCT_FORMS: &[(&str, &str, &str)] = &[
    (
        "table_name",
        "`#[table_name = ..]`",
        "#[diesel(table_name = ..)]",
    ),
    (
        "primary_key",
        "`#[primary_key(..)]`",
        "#[diesel(primary_key(..))]",
    ),
    (
        "changeset_options",
        "`#[changeset_options(..)]`",
        "#[diesel(treat_none_as_null = ..)]",
    ),
];
const OLD_FIELD_FORMS: &[(&str, &str, &str)] = &[(
    "column_name",
    "`#[column_name = ..]`",
    "#[diesel(column_name = ..)]",
)];

/// Reports each attribute in `attrs` of one of Diesel's old `forms`.
fn refuse_old_forms(
    cx: &mut Ctxt,
    attrs: &[Attribute],
    forms: &[(&str, &str, &str)],
    pos_of: impl Fn(usize) -> Pos,
) {
    for (index, attr) in attrs.iter().enumerate() {
        if let Some((_, form, new)) = forms.iter().find(|(name, ..)| attr.path().is_ident(name)) {
            cx.error_with_help(
                pos_of(index),
                attr,
                format!("{form} is Diesel's old attribute form, which lockkit does not read"),
                format!("write `{new}`, as Diesel 2 does"),
            );
        }
    }
}

pub fn diesel_container(cx: &mut Ctxt, attrs: &[Attribute]) -> DieselContainer {
    let mut out = DieselContainer::default();
    refuse_old_forms(cx, attrs, OLD_STRUCT_FORMS, Pos::attr);
    read_keys(cx, attrs, DIESEL, None, Pos::attr, |cx, pos, meta| {
        if meta.path.is_ident("table_name") {
            let table_name = diesel_eq(meta.input, "table_name = foo")?;
            if out.table_name.is_some() {
                // As Diesel's single-table derives (`AsChangeset`,
                // `Selectable`) refuse it; `Queryable` and `Insertable`
                // accept several.
                cx.error_with_help(
                    pos,
                    &meta.path,
                    "expected a single table name attribute",
                    "lockkit writes one table: keep one `#[diesel(table_name = ..)]`",
                );
            } else {
                out.table_name = Some(table_name);
            }
        } else if meta.path.is_ident("primary_key") {
            if meta.input.is_empty() {
                return Err(diesel_format_error(
                    meta.input,
                    "parentheses",
                    // Diesel's own note, so that rustc shows the error once.
                    "key1, key2",
                ));
            }
            let content;
            syn::parenthesized!(content in meta.input);
            let keys = content.parse_terminated(Ident::parse_any, Token![,])?;
            if keys.is_empty() {
                // Diesel accepts it, and the model's key would be `()`.
                cx.error_with_help(
                    pos,
                    &meta.path,
                    "`primary_key` needs at least one column",
                    "name the key columns: `#[diesel(primary_key(id))]`",
                );
                return Ok(());
            }
            out.primary_key = Some(Located {
                value: keys.into_iter().collect(),
                pos,
            });
        } else if meta.path.is_ident("treat_none_as_null") {
            out.treat_none_as_null =
                diesel_eq::<LitBool>(meta.input, "treat_none_as_null = true")?.value;
        } else {
            skip_value(meta.input)?;
        }
        Ok(())
    });
    out
}

pub fn diesel_field(cx: &mut Ctxt, field: usize, attrs: &[Attribute]) -> DieselField {
    let mut out = DieselField::default();
    let pos_of = |index: usize| Pos::field_attr(field, index);
    refuse_old_forms(cx, attrs, OLD_FIELD_FORMS, pos_of);
    read_keys(cx, attrs, DIESEL, None, pos_of, |_, pos, meta| {
        if meta.path.is_ident("column_name") {
            let value = diesel_value(meta.input, "column_name = foo")?;
            // Diesel accepts an identifier or a string literal.
            let column = if value.peek(syn::LitStr) {
                value.parse::<syn::LitStr>()?.parse_with(Ident::parse_any)?
            } else {
                value.call(Ident::parse_any)?
            };
            out.column_name = Some(raw_if_keyword(column));
        } else if meta.path.is_ident("skip_update") {
            out.skip_update = true;
        } else if meta.path.is_ident("treat_none_as_null") {
            out.treat_none_as_null =
                Some(diesel_eq::<LitBool>(meta.input, "treat_none_as_null = true")?.value);
        } else if ["serialize_as", "embed", "select_expression"]
            .iter()
            .any(|kind| meta.path.is_ident(kind))
        {
            out.unsupported = meta.path.get_ident().map(|kind| Located {
                value: kind.clone(),
                pos,
            });
            skip_value(meta.input)?;
        } else {
            skip_value(meta.input)?;
        }
        Ok(())
    });
    out
}

pub fn lockkit_field(cx: &mut Ctxt, field: usize, attrs: &[Attribute]) -> LockkitField {
    let mut out = LockkitField::default();
    let pos_of = |index: usize| Pos::field_attr(field, index);
    read_keys(
        cx,
        attrs,
        LOCKKIT,
        Some(FIELD_KEYS),
        pos_of,
        |cx, pos, meta| {
            let slot = if meta.path.is_ident(VERSION) {
                &mut out.version
            } else if meta.path.is_ident(NO_BUMP) {
                &mut out.no_bump
            } else if meta.path.is_ident(UPDATED_AT) {
                &mut out.updated_at
            } else {
                cx.error_with_help(
                    pos,
                    &meta.path,
                    format!(
                        "unknown lockkit attribute `{}`",
                        quote::ToTokens::to_token_stream(&meta.path)
                    ),
                    FIELD_KEYS,
                );
                // Reported above: a value that does not parse adds nothing.
                let _ = skip_value(meta.input);
                return Ok(());
            };
            let name = meta
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            if slot.is_some() {
                cx.error_with_help(
                    pos,
                    &meta.path,
                    format!("duplicate `#[lockkit({name})]`"),
                    format!("write `#[lockkit({name})]` once"),
                );
            }
            if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
                cx.error_with_help(
                    pos,
                    &meta.path,
                    format!("`{name}` takes no value"),
                    format!("write `#[lockkit({name})]`"),
                );
                let _ = skip_value(meta.input); // reported above
            }
            *slot = meta.path.get_ident().map(|ident| Located {
                value: ident.clone(),
                pos,
            });
            Ok(())
        },
    );
    out
}

/// `column` as `table!` names it: a keyword (`type`) as a raw identifier
/// (`r#type`), as Diesel's derives read it. The few that cannot be raw
/// (`self`, `crate`, ..) stay as they are, for rustc to refuse.
fn raw_if_keyword(column: Ident) -> Ident {
    let name = column.to_string();
    let cannot_be_raw = matches!(name.as_str(), "self" | "Self" | "super" | "crate" | "_");
    // A raw identifier (`r#type`) parses as one already.
    if syn::parse_str::<Ident>(&name).is_ok() || cannot_be_raw {
        column
    } else {
        Ident::new_raw(&name, column.span())
    }
}

/// Runs `read` on each key of every `#[name(...)]` attribute in `attrs`, with
/// the attribute's place (`pos_of` its index). A malformed attribute is
/// reported there and the next one is read, so that all mistakes show at once;
/// with `help` (lockkit's own attributes), its error gets that `help:` line.
/// Diesel's keep Diesel's words, which rustc then shows once for both derives.
fn read_keys(
    cx: &mut Ctxt,
    attrs: &[Attribute],
    name: &str,
    help: Option<&str>,
    pos_of: impl Fn(usize) -> Pos,
    mut read: impl FnMut(&mut Ctxt, Pos, ParseNestedMeta) -> syn::Result<()>,
) {
    for (index, attr) in attrs.iter().enumerate() {
        if !attr.path().is_ident(name) {
            continue;
        }
        let pos = pos_of(index);
        // An error `read` returns is about a key it knows; the help is for the
        // attribute's own syntax (`#[lockkit(version version)]`).
        let mut from_read = false;
        let parsed =
            attr.parse_nested_meta(|meta| read(cx, pos, meta).inspect_err(|_| from_read = true));
        match (parsed, help) {
            (Ok(()), _) => {}
            (Err(err), Some(help)) if !from_read => {
                let mut errors = err
                    .into_iter()
                    .map(|err| syn::Error::new(err.span(), format!("{err}\nhelp: {help}")));
                let mut first = errors.next().expect("a syn::Error holds one at least");
                first.extend(errors);
                cx.syn_error(pos, first);
            }
            (Err(err), _) => cx.syn_error(pos, err),
        }
    }
}

/// The `help:` line of a mistake in a field's `#[lockkit(...)]`.
const FIELD_KEYS: &str =
    "lockkit's field attributes are `#[lockkit(version)]`, `#[lockkit(no_bump)]` and `#[lockkit(updated_at)]`";

/// `#[lockkit(crate = ..)]` on the struct: the path the generated code
/// reaches lockkit by, for a crate that depends on lockkit under another name
/// or through a facade crate that re-exports it.
pub const CRATE: &str = "crate";

/// The `help:` line of a mistake in the struct's `#[lockkit(...)]`.
const CONTAINER_KEYS: &str =
    "the struct's one lockkit attribute is `#[lockkit(crate = \"path::to::lockkit\")]`";

/// `#[lockkit(...)]` on the struct itself: `crate = ..` is the one key. The
/// field keys are refused here with a hint to move them.
pub fn lockkit_container(cx: &mut Ctxt, attrs: &[Attribute], derive: Derive) -> Option<Path> {
    let mut krate: Option<Path> = None;
    read_keys(
        cx,
        attrs,
        LOCKKIT,
        Some(CONTAINER_KEYS),
        Pos::attr,
        |cx, pos, meta| {
            let name = quote::ToTokens::to_token_stream(&meta.path).to_string();
            if !meta.path.is_ident(CRATE) {
                let (message, help) = if [VERSION, NO_BUMP, UPDATED_AT].contains(&name.as_str()) {
                    (
                        format!(
                            "`#[lockkit({name})]` is a field attribute, not allowed on the struct"
                        ),
                        match derive {
                            Derive::Versioned => {
                                format!("put `#[lockkit({name})]` on the field it marks")
                            }
                            // Refused on `Lockable`'s fields too.
                            Derive::Lockable => format!(
                                "write `#[derive(Versioned)]` instead (it implements `Lockable` too), \
                                 and put `#[lockkit({name})]` on the field it marks"
                            ),
                        },
                    )
                } else {
                    (
                        format!("unknown lockkit attribute `{name}` on the struct"),
                        CONTAINER_KEYS.to_owned(),
                    )
                };
                cx.error_with_help(pos, &meta.path, message, help);
                // Reported above: a value that does not parse adds nothing.
                let _ = skip_value(meta.input);
                return Ok(());
            }
            if !meta.input.peek(Token![=]) {
                cx.error_with_help(
                    pos,
                    &meta.path,
                    "`crate` needs the path lockkit is reached by",
                    "write `#[lockkit(crate = \"path::to::lockkit\")]`",
                );
                let _ = skip_value(meta.input); // reported above
                return Ok(());
            }
            let value = meta.value()?;
            // A string, as serde's `crate = ".."`, or the path itself.
            let path = if value.peek(syn::LitStr) {
                value
                    .parse::<syn::LitStr>()?
                    .parse_with(Path::parse_mod_style)?
            } else {
                value.call(Path::parse_mod_style)?
            };
            if krate.is_some() {
                cx.error_with_help(
                    pos,
                    &meta.path,
                    "duplicate `#[lockkit(crate = ..)]`",
                    "write `#[lockkit(crate = ..)]` once",
                );
            } else {
                krate = Some(path);
            }
            Ok(())
        },
    );
    krate
}

/// `= value` after a Diesel key, parsed as a `T`.
fn diesel_eq<T: Parse>(input: ParseStream, note: &str) -> syn::Result<T> {
    diesel_value(input, note)?.parse()
}

/// The input after the `=` of a Diesel key, its value next. A Diesel derive
/// beside ours reports the same malformed attribute; the message is Diesel's,
/// word for word (`note`: the key's correct form), so that rustc, which shows
/// identical errors once, shows it once.
fn diesel_value<'a>(input: ParseStream<'a>, note: &str) -> syn::Result<ParseStream<'a>> {
    if input.is_empty() {
        return Err(diesel_format_error(input, "`=`", note));
    }
    input.parse::<Token![=]>()?;
    Ok(input)
}

fn diesel_format_error(input: ParseStream, expected: &str, note: &str) -> syn::Error {
    syn::Error::new(
        input.span(),
        format!(
            "unexpected end of input, expected {expected}\n\
             help: the correct format looks like `#[diesel({note})]`"
        ),
    )
}

/// Skips `= value` or `(...)` after a key lockkit does not read.
fn skip_value(input: ParseStream) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        // Values are types (`sql_type = Nullable<Text>`, which is no expression)
        // or expressions (`base_query = items::table.order_by(items::id)`).
        let fork = input.fork();
        if fork.parse::<syn::Type>().is_ok() && (fork.is_empty() || fork.peek(Token![,])) {
            input.parse::<syn::Type>()?;
        } else {
            input.parse::<syn::Expr>()?;
        }
    } else if input.peek(syn::token::Paren) {
        let _content;
        syn::parenthesized!(_content in input);
        // The group is consumed whole; its contents are Diesel's business.
        let _: proc_macro2::TokenStream = _content.parse()?;
    }
    Ok(())
}
