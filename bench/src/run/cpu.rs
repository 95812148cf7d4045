//! Where the CPU went during a run: this process (the client), its waited-for
//! children (pgbench) and the database server's processes, from `/proc/*/stat`
//! (clock ticks of 10 ms; Linux only, zeros elsewhere).
//!
//! Both sides of a comparison run on the same two cores, so a client that burns
//! more CPU per transaction leaves less to the server: these numbers say whether
//! a gap is on the client's side or the server's.

use crate::vocabulary::Backend;

/// Clock ticks per second (`USER_HZ`, 100 on Linux).
pub const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time, in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cpu {
    /// This process.
    pub client: u64,
    /// This process's finished children (pgbench).
    pub children: u64,
    /// The server: every `postgres` process (with the postmaster's finished
    /// children), or the `mariadbd`/`mysqld` process. 0 for SQLite.
    pub server: u64,
}

impl Cpu {
    /// The CPU used between `self` (earlier) and `later`.
    pub fn until(&self, later: &Cpu) -> Cpu {
        Cpu {
            client: later.client.saturating_sub(self.client),
            children: later.children.saturating_sub(self.children),
            server: later.server.saturating_sub(self.server),
        }
    }
}

/// (comm, utime + stime, cutime + cstime) of one `/proc/<pid>/stat`.
fn stat(path: &std::path::Path) -> Option<(String, u64, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_owned();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state): utime 14, stime 15, cutime 16, cstime 17.
    let num = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((comm, num(11)? + num(12)?, num(13)? + num(14)?))
}

/// What has been used so far.
pub fn snapshot(backend: Backend) -> Cpu {
    let (client, children) = stat(std::path::Path::new("/proc/self/stat"))
        .map(|(_, own, kids)| (own, kids))
        .unwrap_or_default();
    let names: &[&str] = match backend {
        Backend::Postgres => &["postgres"],
        Backend::Mysql => &["mariadbd", "mysqld"],
        Backend::Sqlite => &[],
    };
    let mut server = 0;
    if !names.is_empty() {
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if !name.bytes().all(|b| b.is_ascii_digit()) {
                    continue;
                }
                if let Some((comm, own, kids)) = stat(&entry.path().join("stat")) {
                    if names.contains(&comm.as_str()) {
                        server += own + kids;
                    }
                }
            }
        }
    }
    Cpu {
        client,
        children,
        server,
    }
}

/// Microseconds of CPU per unit of work.
pub fn micros_per(ticks: u64, units: f64) -> f64 {
    if units <= 0.0 {
        return f64::NAN;
    }
    ticks as f64 / TICKS_PER_SECOND * 1e6 / units
}
