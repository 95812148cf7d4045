//! `lockkit-torture`: every lockkit strategy at once, on a few hot rows, from
//! several OS processes with a connection pool and threads each, then an exact
//! audit of the database. Run `lockkit-torture --help`.
//!
//! The parent process creates the tables, starts `--processes` copies of itself
//! (`--worker N`), waits for their reports, drains the job queue, and checks every
//! invariant against the database: for every item `stock + sold = initial`, no
//! item below zero, every order line and order accounted for, every job done
//! exactly once. It prints the operations per strategy and each invariant, and
//! exits with 1 if any invariant or any worker failed.

mod adaptive;
mod asynchronous;
mod backend;
mod config;
mod model;
mod nodes;
mod plan;
mod report;
mod run;
mod schema;
mod statements;
mod stats;

use std::process::ExitCode;

use config::{Config, Role};

fn main() -> ExitCode {
    let config = match Config::parse(std::env::args().skip(1)) {
        Ok(Some(config)) => config,
        Ok(None) => {
            print!("{}", config::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            eprintln!("lockkit-torture: {message}\n\n{}", config::USAGE);
            return ExitCode::from(2);
        }
    };
    let ok = match config.role {
        Role::Parent => run::parent(&config),
        Role::Worker(n) => run::worker(&config, n),
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
