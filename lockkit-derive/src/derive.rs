//! Which derive is being expanded: `Versioned` or `Lockable`, read by the
//! attribute parser (its `help:` lines), the model and the code generation.

use syn::Ident;

/// Which derive is being expanded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Derive {
    /// Table, key, version and changeset.
    Versioned,
    /// Table and key only.
    Lockable,
}

impl Derive {
    pub fn name(self) -> &'static str {
        match self {
            Derive::Versioned => "Versioned",
            Derive::Lockable => "Lockable",
        }
    }

    /// The shape the derive expects, for `help:` lines.
    pub fn example(self, ident: &Ident) -> String {
        match self {
            Derive::Versioned => format!("struct {ident} {{ id: i32, lock_version: i32, .. }}"),
            Derive::Lockable => format!("struct {ident} {{ id: i32, .. }}"),
        }
    }
}
