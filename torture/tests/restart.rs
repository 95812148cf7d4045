//! The server restarting in the middle of a torture run.
//!
//! The test starts its own throwaway PostgreSQL (initdb into a temporary
//! directory, a free port; as the `postgres` user when run as root), starts a
//! torture run against it with `--tolerate-outages`, and restarts the server
//! (`pg_ctl restart -m fast`) while the workers are busy, then stops it for 2.5 s
//! (longer than the pools' checkout timeout) and starts it again. The pools must recover:
//! the workers' in-flight transactions are killed (`Error::ConnectionLost`), each
//! interrupted operation is looked up (committed or not) and, if not, run again
//! on a fresh pooled connection, the workers keep committing after the restart,
//! and every invariant of the run still holds exactly.
//!
//! The shared servers on 5432 / 3306 are never touched. The throwaway server is
//! stopped and its directory removed by a `Drop` guard, also when the test fails.
//! Missing PostgreSQL binaries fail the test (never skip it).

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The newest `/usr/lib/postgresql/<version>/bin`, or `$PG_BIN`.
fn pg_bin() -> Option<PathBuf> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN").map(PathBuf::from) {
        return has_tools(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().unwrap().port()
}

/// A PostgreSQL server of this test's own; stopped and removed on drop.
struct ThrowawayPostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    /// `runuser -u postgres --` when root: PostgreSQL refuses to run as root.
    run_as: Vec<String>,
    started: bool,
}

impl ThrowawayPostgres {
    fn start() -> ThrowawayPostgres {
        let bin = pg_bin().unwrap_or_else(|| {
            panic!(
                "this test starts its own PostgreSQL and needs the server binaries (initdb, \
                 pg_ctl) in /usr/lib/postgresql/<version>/bin or $PG_BIN; install them with \
                 `apt-get install -y postgresql` (scripts/test.sh does)"
            )
        });
        let dir = std::env::temp_dir().join(format!(
            "lockkit-torture-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server directory");
        let mut run_as = Vec::new();
        if is_root() {
            let exists = Command::new("id").arg("postgres").output();
            if !exists.is_ok_and(|out| out.status.success()) {
                run(Command::new("useradd").args(["--system", "--no-create-home", "postgres"]));
            }
            run(Command::new("chown").args(["-R", "postgres"]).arg(&dir));
            run_as = ["runuser", "-u", "postgres", "--"]
                .map(String::from)
                .to_vec();
        }
        let port = free_port();
        assert!(port != 5432 && port != 3306, "never the shared servers");
        let mut server = ThrowawayPostgres {
            bin,
            dir,
            port,
            run_as,
            started: false,
        };
        let data = server.data();
        let mut initdb = server.command("initdb");
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"]);
        run(&mut initdb);
        server.started = true; // from here on, Drop stops it
        let mut start = server.pg_ctl("start");
        run(&mut start);
        server
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn command(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        match self.run_as.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    /// `pg_ctl <action>`, waiting for it to finish, with this server's options.
    fn pg_ctl(&self, action: &str) -> Command {
        let mut command = self.command("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .arg("-w")
            .arg("-o")
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60",
                self.port,
                self.dir.display()
            ))
            .arg(action);
        command
    }

    /// `pg_ctl restart -m fast`: every session is terminated, then the server
    /// starts again on the same port.
    fn restart(&self) {
        let mut restart = self.pg_ctl("restart");
        restart.args(["-m", "fast"]);
        run(&mut restart);
    }

    /// `pg_ctl stop -m fast`, `down` without a server, `pg_ctl start`: longer
    /// than the pool's checkout timeout, so that new connections fail too.
    fn stop_for(&self, down: Duration) {
        let mut stop = self.pg_ctl("stop");
        stop.args(["-m", "fast"]);
        run(&mut stop);
        thread::sleep(down);
        run(&mut self.pg_ctl("start"));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for ThrowawayPostgres {
    fn drop(&mut self) {
        if self.started {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Kills the torture run if the test fails before it ended.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The number right after `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let start = text.find(prefix)? + prefix.len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[test]
fn the_pool_recovers_from_a_server_restart_and_the_totals_stay_exact() {
    let server = ThrowawayPostgres::start();
    let child = Command::new(env!("CARGO_BIN_EXE_lockkit-torture"))
        .args(["--url", &server.url(), "--processes", "2", "--threads", "4"])
        .args(["--seconds", "8", "--tolerate-outages", "--grace", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lockkit-torture");
    let mut child = ChildGuard(child);
    let mut stdout = child.0.stdout.take().unwrap();
    let mut stderr = child.0.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    // Let the workers get going, then pull the server from under them: a fast
    // restart, then an outage of a few seconds.
    thread::sleep(Duration::from_millis(1500));
    let restarting = Instant::now();
    server.restart();
    let restart = restarting.elapsed();
    thread::sleep(Duration::from_millis(1500));
    server.stop_for(Duration::from_millis(2500));

    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the torture run did not stop by itself"
        );
        thread::sleep(Duration::from_millis(50));
    };
    let text = format!(
        "{}\n--- stderr ---\n{}",
        out.join().unwrap(),
        err.join().unwrap()
    );
    let context = format!("{text}\n--- server log ---\n{}", server.log());
    assert!(status.success(), "the run failed:\n{context}");
    assert!(text.contains("all 22 invariants hold"), "{context}");
    let errors = number_after(&text, "outages: ").expect("an outage summary");
    let pool_waits = number_after(&text, "fresh connection, ").expect("the pool waits");
    let recovered = number_after(&text, "found rolled back and run again, ")
        .expect("the operations after the outage");
    assert!(
        errors > 0,
        "the restart interrupted no transaction; it was meant to:\n{context}"
    );
    assert!(
        pool_waits > 0,
        "no checkout failed while the server was down:\n{context}"
    );
    assert!(
        recovered > 0,
        "no operation committed after the restart:\n{context}"
    );
    assert!(
        text.contains("Error::ConnectionLost"),
        "killed sessions are Error::ConnectionLost:\n{context}"
    );
    println!("pg_ctl restart -m fast took {restart:?}\n{text}");
}
