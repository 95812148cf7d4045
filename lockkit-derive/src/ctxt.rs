//! Collects every error of a derive so the user sees all mistakes in one build,
//! in the order they appear in the source.

use std::fmt::Display;

use quote::ToTokens;

/// Where an error sits in the input, so that errors can be reported in source
/// order whatever stage found them. A proc macro cannot read the line of a span
/// on every supported rustc, so each error names its place in the struct's
/// syntax instead: the struct's attributes, its name, then field by field its
/// attributes, name and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    /// `None` for the struct itself, which comes before its fields.
    field: Option<usize>,
    part: Part,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    /// The attribute at this index of the `attrs` list.
    Attr(usize),
    /// The struct's keyword and name, or the field's name.
    Name,
    /// The field's type.
    Type,
}

impl Pos {
    /// `struct Item` (or `enum`, `union`).
    pub const NAME: Pos = Pos {
        field: None,
        part: Part::Name,
    };

    /// The struct's attribute at `attr` in its `attrs`.
    pub fn attr(attr: usize) -> Pos {
        Pos {
            field: None,
            part: Part::Attr(attr),
        }
    }

    /// The field's attribute at `attr` in its `attrs`.
    pub fn field_attr(field: usize, attr: usize) -> Pos {
        Pos {
            field: Some(field),
            part: Part::Attr(attr),
        }
    }

    pub fn field_name(field: usize) -> Pos {
        Pos {
            field: Some(field),
            part: Part::Name,
        }
    }

    pub fn field_type(field: usize) -> Pos {
        Pos {
            field: Some(field),
            part: Part::Type,
        }
    }
}

#[derive(Default)]
pub struct Ctxt {
    errors: Vec<(Pos, syn::Error)>,
}

impl Ctxt {
    /// An error at `tokens`: what is wrong, then a `help:` line with the correct
    /// form. The layout is Diesel's, so that lockkit's own errors and the Diesel
    /// errors it repeats word for word (see `attr::diesel_eq`) read alike.
    pub fn error_with_help(
        &mut self,
        pos: Pos,
        tokens: impl ToTokens,
        message: impl Display,
        help: impl Display,
    ) {
        self.errors.push((
            pos,
            syn::Error::new_spanned(tokens, format!("{message}\nhelp: {help}")),
        ));
    }

    pub fn syn_error(&mut self, pos: Pos, error: syn::Error) {
        self.errors.push((pos, error));
    }

    /// Every error in source order (errors at one place in the order they were
    /// found), or `Ok` if there were none.
    pub fn check(self) -> Result<(), Vec<syn::Error>> {
        let mut errors = self.errors;
        if errors.is_empty() {
            return Ok(());
        }
        errors.sort_by_key(|(pos, _)| *pos); // stable
        Err(errors.into_iter().map(|(_, error)| error).collect())
    }
}
