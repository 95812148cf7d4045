//! The example programs' tests run the programs as processes: pointing one at a
//! database, and waiting for several at once.

use std::io::Read;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::Backend;

/// Points an example program at the database `url`: a server URL goes in
/// `DATABASE_URL`, a SQLite file in `--sqlite-file` (as `database_url` reads them).
pub fn point_at_database<'c>(command: &'c mut Command, url: &str) -> &'c mut Command {
    match Backend::from_url(url) {
        Backend::Sqlite => command
            .env_remove("DATABASE_URL")
            .args(["--sqlite-file", url]),
        Backend::Postgres | Backend::Mysql => command.env("DATABASE_URL", url),
    }
}

/// Waits for every child (spawned with piped stdout and stderr), killing all of
/// them and panicking if one takes longer than `limit`; returns each one's exit
/// status, stdout and stderr.
pub fn wait_all(mut children: Vec<Child>, limit: Duration) -> Vec<(ExitStatus, String, String)> {
    let deadline = Instant::now() + limit;
    let mut statuses = vec![None; children.len()];
    while statuses.iter().any(Option::is_none) {
        for (child, status) in children.iter_mut().zip(&mut statuses) {
            if status.is_none() {
                *status = child.try_wait().expect("try_wait");
            }
        }
        if Instant::now() > deadline {
            for child in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            panic!("processes still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let read = |pipe: Option<&mut dyn Read>| {
        let mut text = String::new();
        if let Some(pipe) = pipe {
            pipe.read_to_string(&mut text)
                .expect("read a child's output");
        }
        text
    };
    children
        .iter_mut()
        .zip(statuses)
        .map(|(child, status)| {
            let stdout = read(child.stdout.as_mut().map(|p| p as &mut dyn Read));
            let stderr = read(child.stderr.as_mut().map(|p| p as &mut dyn Read));
            (status.expect("waited for"), stdout, stderr)
        })
        .collect()
}
