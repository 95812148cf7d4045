//! The layout table in `CONTRIBUTING.md` names every file of `lockkit/src`, and
//! names no file that is not there.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `lockkit/src` files the table names: in each row, a folder in backticks
/// (ending in `/`) followed by the files in it, or a file named with its path.
fn named_in_table() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace().join("CONTRIBUTING.md")).unwrap();
    let layout = text
        .split("## Layout")
        .nth(1)
        .expect("CONTRIBUTING.md has a Layout section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut named = BTreeSet::new();
    for row in layout.lines().filter(|l| l.starts_with("| `lockkit/src/")) {
        let first_cell = row.split(" | ").next().unwrap();
        let mut folder = String::new();
        for (i, token) in first_cell.split('`').enumerate() {
            if i % 2 == 0 {
                continue; // outside backticks
            }
            if token.ends_with('/') {
                folder = token.to_owned();
            } else if token.starts_with("lockkit/src/") {
                named.insert(token.to_owned());
            } else {
                named.insert(format!("{folder}{token}"));
            }
        }
    }
    named
}

fn in_tree(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if entry.file_type().unwrap().is_dir() {
            in_tree(&entry.path(), &format!("{prefix}{name}/"), out);
        } else if name.ends_with(".rs") {
            out.insert(format!("{prefix}{name}"));
        }
    }
}

#[test]
fn the_layout_table_matches_lockkit_src() {
    let mut tree = BTreeSet::new();
    in_tree(&workspace().join("lockkit/src"), "lockkit/src/", &mut tree);
    let named = named_in_table();
    let missing: Vec<_> = tree.difference(&named).collect();
    let gone: Vec<_> = named.difference(&tree).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "CONTRIBUTING.md's layout table is out of date:\n  not in the table: {missing:?}\n  not in the tree: {gone:?}"
    );
}
