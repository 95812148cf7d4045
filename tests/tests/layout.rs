//! The layout table in `CONTRIBUTING.md` names every file of `lockkit/src`, and
//! names no file that is not there; the crate docs' table of modules names every
//! module of `lockkit/src`'s top level, and no other.

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
    assert_names("CONTRIBUTING.md's layout table", &tree, &named_in_table());
}

/// `table` names exactly what `tree` holds.
fn assert_names(table: &str, tree: &BTreeSet<String>, named: &BTreeSet<String>) {
    let missing: Vec<_> = tree.difference(named).collect();
    let gone: Vec<_> = named.difference(tree).collect();
    assert!(
        missing.is_empty() && gone.is_empty(),
        "{table} is out of date:\n  not in the table: {missing:?}\n  not in the tree: {gone:?}"
    );
}

/// The modules the crate docs' table names: the first cell of each row, in
/// backticks or as a link.
fn named_in_crate_docs() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace().join("lockkit/src/lib.rs")).unwrap();
    let table = text
        .split("//! | module | concept |")
        .nth(1)
        .expect("lib.rs has the table of modules");
    table
        .lines()
        .skip(2) // the rest of the header line, and the `| --- |` line
        .take_while(|line| line.starts_with("//! |"))
        .map(|row| {
            let first_cell = row.trim_start_matches("//! |").split(" | ").next().unwrap();
            first_cell.split('`').nth(1).unwrap().to_owned()
        })
        .collect()
}

#[test]
fn the_crate_docs_name_every_top_level_module() {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(workspace().join("lockkit/src")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        match name.strip_suffix(".rs") {
            Some("lib") => {}
            Some(module) => drop(modules.insert(module.to_owned())),
            None => drop(modules.insert(name)),
        }
    }
    assert_names(
        "lockkit/src/lib.rs's table of modules",
        &modules,
        &named_in_crate_docs(),
    );
}
