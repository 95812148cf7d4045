//! What the person changed, and what re-applying it on the current row gives.
//!
//! A conflict page that offers "save mine anyway" with the whole form would
//! write back the fields the person never touched, as they were when the page
//! was rendered: the other person's change to them would be lost again. The form
//! therefore also carries the values it showed (`orig_*`); a field the person
//! changed takes their value, any other field keeps the value now stored. A
//! field both changed differently is a *clash*: the person's value is offered,
//! and the page says so, next to the other value.

use serde::Deserialize;

/// The fields a person edits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    pub name: String,
    pub stock: i32,
}

/// What the edit form posts.
#[derive(Debug, Clone, Deserialize)]
pub struct Submitted {
    pub name: String,
    pub stock: i32,
    /// The values the page showed, for [`merge`].
    pub orig_name: String,
    pub orig_stock: i32,
    /// The version the page was rendered from.
    pub lock_version: i32,
}

impl Submitted {
    /// The person's values.
    pub fn mine(&self) -> Fields {
        Fields {
            name: self.name.clone(),
            stock: self.stock,
        }
    }

    /// The values the page showed.
    pub fn original(&self) -> Fields {
        Fields {
            name: self.orig_name.clone(),
            stock: self.orig_stock,
        }
    }
}

/// The person's changes re-applied on the current row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub fields: Fields,
    /// The fields both people changed, to different values.
    pub clashes: Vec<&'static str>,
}

/// Re-applies what changed from `original` to `mine` on top of `current`.
pub fn merge(original: &Fields, mine: &Fields, current: &Fields) -> Merged {
    let mut clashes = Vec::new();
    let name = pick(
        "name",
        &original.name,
        &mine.name,
        &current.name,
        &mut clashes,
    )
    .clone();
    let stock = *pick(
        "stock",
        &original.stock,
        &mine.stock,
        &current.stock,
        &mut clashes,
    );
    Merged {
        fields: Fields { name, stock },
        clashes,
    }
}

/// One field: the person's value if they changed it, else the current one.
fn pick<'a, T: PartialEq>(
    field: &'static str,
    original: &'a T,
    mine: &'a T,
    current: &'a T,
    clashes: &mut Vec<&'static str>,
) -> &'a T {
    if mine == original {
        return current;
    }
    if current != original && current != mine {
        clashes.push(field);
    }
    mine
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(name: &str, stock: i32) -> Fields {
        Fields {
            name: name.to_owned(),
            stock,
        }
    }

    #[test]
    fn each_side_keeps_the_field_it_changed() {
        let merged = merge(
            &fields("mug", 10),
            &fields("Blue mug", 10),
            &fields("mug", 5),
        );
        assert_eq!(merged.fields, fields("Blue mug", 5));
        assert!(merged.clashes.is_empty());
    }

    #[test]
    fn a_field_both_changed_is_a_clash_with_mine_offered() {
        let merged = merge(&fields("mug", 10), &fields("mug", 7), &fields("mug", 5));
        assert_eq!(merged.fields, fields("mug", 7));
        assert_eq!(merged.clashes, ["stock"]);
    }

    #[test]
    fn the_same_change_on_both_sides_is_no_clash() {
        let merged = merge(&fields("mug", 10), &fields("mug", 5), &fields("mug", 5));
        assert_eq!(merged.fields, fields("mug", 5));
        assert!(merged.clashes.is_empty());
    }
}
