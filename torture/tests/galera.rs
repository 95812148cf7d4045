//! The torture run on a 3-node MariaDB Galera cluster (`GALERA_URLS`, from
//! `scripts/galera.sh`): worker process N writes through node N, and every
//! invariant must hold exactly. `--tolerate-outages`: the nodes sometimes stop
//! answering a connection whose transaction another node's write aborted (see
//! `scripts/galera.sh`); such an operation is retried on a fresh connection
//! after finding out whether it committed. Every operation runs in lockkit's
//! transaction, so a ROLLBACK the node refused leaves no broken connection.
//!
//! `--bump lockkit`: no version trigger. On MariaDB 10.11's Galera a node now
//! and then fails every write to a table with lockkit's version trigger, with
//! "Unknown trigger has an error in its body" ('Query was empty', or a syntax
//! error in the trigger's own text), for seconds or the rest of the run (3 of
//! about 80 runs; README, "Galera"). The trigger is the single-server runs'
//! (`tests/torture.rs`).

use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection};
use lockkit_tests::support::{create_galera_database, galera_nodes};

#[test]
fn every_invariant_holds_with_writers_on_three_nodes() {
    let nodes = galera_nodes();
    let name = format!("lk_torture_galera_{}", std::process::id());
    let urls = create_galera_database(&nodes, &name);
    let output = Command::new(env!("CARGO_BIN_EXE_lockkit-torture"))
        .args([
            "--url",
            &urls.join(","),
            "--processes",
            "3",
            "--threads",
            "2",
        ])
        .args([
            "--seconds",
            "3",
            "--bump",
            "lockkit",
            "--seed",
            "20260509",
            "--tolerate-outages",
            "--read-only-sessions",
            "--grace",
            "30",
        ])
        .output()
        .expect("run lockkit-torture");
    if let Ok(mut admin) = MysqlConnection::establish(&nodes[0]) {
        let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"));
    }
    let out = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the torture run failed:\n{out}");
    assert!(out.contains("all 22 invariants hold"), "{out}");
    assert!(
        !out.contains("committed no operation"),
        "a strategy never committed:\n{out}"
    );
    println!("{out}");
}
