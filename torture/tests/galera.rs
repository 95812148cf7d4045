//! The torture run on a 3-node MariaDB Galera cluster (`GALERA_URLS`, from
//! `scripts/galera.sh`): worker process N writes through node N, and every
//! invariant must hold exactly. `--tolerate-outages`: the nodes sometimes stop
//! answering a connection whose transaction another node's write aborted (see
//! `scripts/galera.sh`); such an operation is retried on a fresh connection
//! after finding out whether it committed. Every operation runs in lockkit's
//! transaction, so a ROLLBACK the node refused leaves no broken connection.

use std::process::Command;

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection};
use lockkit_tests::support::with_database;

#[test]
fn every_invariant_holds_with_writers_on_three_nodes() {
    let nodes: Vec<String> = std::env::var("GALERA_URLS")
        .unwrap_or_default()
        .split(',')
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        nodes.len() >= 2,
        "GALERA_URLS must list a Galera cluster's nodes (eval \"$(scripts/galera.sh start)\")"
    );
    let name = format!("lk_torture_galera_{}", std::process::id());
    let mut admin = MysqlConnection::establish(&nodes[0]).expect("node 1");
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
        ))
        .expect("create database");
    for node in &nodes {
        MysqlConnection::establish(node)
            .and_then(|mut c| {
                c.batch_execute(&format!("SET SESSION wsrep_sync_wait = 15; USE {name}"))
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)
            })
            .unwrap_or_else(|e| panic!("{node} did not catch up: {e}"));
    }
    let urls: Vec<String> = nodes.iter().map(|u| with_database(u, &name)).collect();
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
            "--seed",
            "20260509",
            "--tolerate-outages",
            "--grace",
            "30",
        ])
        .output()
        .expect("run lockkit-torture");
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}"));
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
