//! `cargo run --release -p lockkit-bench -- [--quick]`: see the crate docs and
//! `docs/BENCHMARKS.md`.

use std::process::ExitCode;

use lockkit_bench::suite::{self, Settings};
use lockkit_bench::{alloc, charts, profile, report, Backend, BenchError};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

const USAGE: &str = "\
lockkit-bench: lockkit's strategies on PostgreSQL, MariaDB/MySQL and SQLite

usage: cargo run --release -p lockkit-bench -- [options]

  --quick               one short repetition (about a minute) instead of three
  --backends LIST       comma-separated: postgres,mysql,sqlite (default: all)
  --no-pgbench          skip the pgbench comparison
  --no-callgrind        skip the instruction counts (valgrind; full run only)
  --callgrind           count instructions in a --quick run too
  --durable             keep synchronous_commit = on in PostgreSQL sessions
  --out DIR             where BENCHMARKS.md and the charts go (default: docs/)
  --only TEXT           run only the cases whose label contains TEXT (development)
  --run-ms N            length of one run (pairs: two slices of N/2; pgbench: N rounded up to s)
  --profile-only NAME   run one side of the client-cost profile and exit
                        (for valgrind --tool=callgrind); --ops N calls; on
                        in-memory SQLite, or on the one backend of --backends
  -h, --help            this text

Servers: PG_DATABASE_URL (postgres://postgres@127.0.0.1:5432/test) and
MYSQL_DATABASE_URL (mysql://root@127.0.0.1:3306/test); a database
lkbench_<pid>_* is created on each and dropped at the end.";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockkit-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), BenchError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut settings = if args.iter().any(|a| a == "--quick") {
        Settings::quick()
    } else {
        Settings::full()
    };
    let mut profile_only = None;
    let mut ops = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| BenchError::Other(format!("{name} needs a value\n\n{USAGE}")))
        };
        match arg.as_str() {
            "--quick" => {}
            "--no-pgbench" => settings.pgbench = false,
            "--no-callgrind" => settings.callgrind_ops = 0,
            "--callgrind" => settings.callgrind_ops = Settings::full().callgrind_ops,
            "--durable" => settings.durable = true,
            "--backends" => {
                settings.backends = value("--backends")?
                    .split(',')
                    .map(|b| {
                        Backend::parse(b.trim()).ok_or_else(|| {
                            BenchError::Other(format!("unknown backend {b}\n\n{USAGE}"))
                        })
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--out" => settings.out_dir = value("--out")?.into(),
            "--only" => settings.only = Some(value("--only")?),
            "--run-ms" => {
                let ms = value("--run-ms")?
                    .parse::<u64>()
                    .map_err(|e| BenchError::Other(format!("--run-ms: {e}")))?;
                settings.limits.run = std::time::Duration::from_millis(ms);
                settings.pair_limits.run =
                    std::time::Duration::from_millis(ms / (2 * settings.pair_rounds as u64));
                settings.pgbench_secs = ms.div_ceil(1000).max(1) as u32;
            }
            "--profile-only" => profile_only = Some(value("--profile-only")?),
            "--ops" => {
                ops = Some(
                    value("--ops")?
                        .parse::<u64>()
                        .map_err(|e| BenchError::Other(format!("--ops: {e}")))?,
                )
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => {
                return Err(BenchError::Other(format!(
                    "unknown option {other}\n\n{USAGE}"
                )))
            }
        }
    }

    if let Some(name) = profile_only {
        let ops = ops.unwrap_or(20_000);
        let backend = match settings.backends.as_slice() {
            [one] => *one,
            _ => Backend::Sqlite,
        };
        let (ns, allocs, bytes) = profile::run_one(&name, ops, backend)?;
        println!("{name}: {ops} calls, {ns:.0} ns/call, {allocs:.2} allocations/call, {bytes:.0} bytes/call");
        return Ok(());
    }

    eprintln!(
        "lockkit-bench: {} repetition(s) of {:?} runs on {}; writing to {}",
        settings.reps,
        settings.limits.run,
        settings
            .backends
            .iter()
            .map(|b| b.title())
            .collect::<Vec<_>>()
            .join(", "),
        settings.out_dir.display()
    );
    let results = suite::run(settings)?;
    let dir = &results.settings.out_dir;
    std::fs::create_dir_all(dir)?;
    let charts = charts::write_all(&results, dir)?;
    let path = dir.join("BENCHMARKS.md");
    std::fs::write(&path, report::markdown(&results))?;
    eprintln!(
        "lockkit-bench: wrote {} and {} chart(s) in {:.0?}",
        path.display(),
        charts.len(),
        results.wall
    );
    Ok(())
}
