//! `rust-version` tells the truth: no dependency of the published crates
//! (`lockkit` with every feature, `lockkit-derive`) declares a newer Rust than they
//! do, and none of `examples/outbox` (its broker client) a newer one than lockkit. Only one toolchain exists where the suite runs, so this reads the
//! declarations in `cargo metadata` instead of building with the old compiler.

use std::collections::{HashMap, HashSet};
use std::process::Command;

use serde_json::Value;

/// `"1.86"` / `"1.86.0"` as `[1, 86, 0]`.
fn parse(version: &str) -> [u64; 3] {
    let mut parts = version
        .split('.')
        .map(|p| p.parse::<u64>().expect("a numeric rust-version"));
    [(); 3].map(|()| parts.next().unwrap_or(0))
}

fn cargo(args: &[&str]) -> Vec<u8> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

#[test]
fn no_dependency_of_the_published_crates_needs_a_newer_rust() {
    // Every package's declared rust-version, by name and version.
    let metadata: Value = serde_json::from_slice(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--all-features",
        "--locked",
    ]))
    .expect("cargo metadata is JSON");
    let declared: HashMap<(String, String), Option<String>> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let key = (
                p["name"].as_str().unwrap().to_owned(),
                p["version"].as_str().unwrap().to_owned(),
            );
            (key, p["rust_version"].as_str().map(str::to_owned))
        })
        .collect();

    let rust_version_of = |name: &str| {
        declared
            .iter()
            .find(|((n, _), _)| n == name)
            .and_then(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} declares a rust-version"))
    };
    let mut too_new = Vec::new();
    // The published crates against their own rust-version; `examples/outbox`'s
    // dependencies (its broker client, NATS's async-nats, and all it pulls in)
    // against lockkit's, so that the example builds wherever lockkit does.
    for (name, ours) in [
        ("lockkit", rust_version_of("lockkit")),
        ("lockkit-derive", rust_version_of("lockkit-derive")),
        ("outbox", rust_version_of("lockkit")),
    ] {
        // What a user gets with every feature, on every platform: `cargo tree`
        // resolves features for this crate alone (`cargo metadata` unifies the
        // workspace and lists weak optional dependencies as if enabled).
        let tree = cargo(&[
            "tree",
            "--locked",
            "-p",
            name,
            "--all-features",
            "-e",
            "normal,build",
            "--target",
            "all",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ]);
        let dependencies: HashSet<(String, String)> = String::from_utf8(tree)
            .unwrap()
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                let (dep, version) = (words.next()?, words.next()?.strip_prefix('v')?);
                Some((dep.to_owned(), version.to_owned()))
            })
            // The example's shared helpers are the harness crate's std-only part;
            // the crate itself declares 1.88 for its test tools.
            .filter(|(dep, _)| dep != name && dep != "lockkit-tests")
            .collect();
        for (dep, version) in dependencies {
            let theirs = declared
                .get(&(dep.clone(), version.clone()))
                .cloned()
                .flatten();
            if let Some(theirs) = theirs.filter(|theirs| parse(theirs) > parse(&ours)) {
                too_new.push(format!(
                    "{name} (rust-version {ours}) depends on {dep} {version} (rust-version {theirs})"
                ));
            }
        }
    }
    too_new.sort();
    assert!(
        too_new.is_empty(),
        "raise rust-version, or keep the older dependency in Cargo.lock \
         (`cargo update -p NAME --precise VERSION`):\n{}",
        too_new.join("\n")
    );
}
