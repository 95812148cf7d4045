//! `cargo run --release -p lockkit-bench -- [--quick]`: see the crate docs and
//! `docs/BENCHMARKS.md`; `-- --help` lists the options.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use lockkit_bench::error::BenchError;
use lockkit_bench::plan::Settings;
use lockkit_bench::report::{self, charts};
use lockkit_bench::run;
use lockkit_bench::run::ops::Session;
use lockkit_bench::run::profile::{self, alloc};
use lockkit_bench::vocabulary::{report_name, Backend};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// lockkit-bench: lockkit's strategies on PostgreSQL, MariaDB/MySQL and SQLite
///
/// Servers: PG_DATABASE_URL (postgres://postgres@127.0.0.1:5432/test) and
/// MYSQL_DATABASE_URL (mysql://root@127.0.0.1:3306/test); a database
/// lkbench_<pid>_* is created on each and dropped at the end.
#[derive(Debug, Parser)]
#[command(
    name = "lockkit-bench",
    override_usage = "cargo run --release -p lockkit-bench -- [OPTIONS]"
)]
struct Cli {
    /// One short repetition (about a minute) instead of three
    #[arg(long)]
    quick: bool,
    /// Comma-separated: postgres,mysql,sqlite [default: all]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = backend)]
    backends: Vec<Backend>,
    /// Skip the pgbench comparison
    #[arg(long)]
    no_pgbench: bool,
    /// Skip the instruction counts (valgrind; full run only)
    #[arg(long, conflicts_with = "callgrind")]
    no_callgrind: bool,
    /// Count instructions in a --quick run too
    #[arg(long)]
    callgrind: bool,
    /// Keep synchronous_commit = on in PostgreSQL sessions
    #[arg(long)]
    durable: bool,
    /// Where BENCHMARKS.md and the charts go [default: docs/]
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Run only the cases whose label contains TEXT (development)
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// Length of one run (pairs: two slices of N/2; pgbench: N rounded up to s)
    #[arg(long, value_name = "N")]
    run_ms: Option<u64>,
    /// Run one side of the client-cost profile and exit (for valgrind
    /// --tool=callgrind); --ops N calls; on in-memory SQLite, or on the one
    /// backend of --backends
    #[arg(long, value_name = "NAME")]
    profile_only: Option<String>,
    /// Calls for --profile-only
    #[arg(
        long,
        value_name = "N",
        requires = "profile_only",
        default_value_t = 20_000
    )]
    ops: u64,
}

/// One name of `--backends`.
fn backend(name: &str) -> Result<Backend, String> {
    Backend::parse(name.trim()).ok_or_else(|| format!("unknown backend {name}"))
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockkit-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), BenchError> {
    let mut settings = if cli.quick {
        Settings::quick()
    } else {
        Settings::full()
    };
    settings.pgbench &= !cli.no_pgbench;
    if cli.no_callgrind {
        settings.callgrind_ops = 0;
    }
    if cli.callgrind {
        settings.callgrind_ops = Settings::full().callgrind_ops;
    }
    settings.durable |= cli.durable;
    if !cli.backends.is_empty() {
        settings.backends = cli.backends;
    }
    if let Some(out) = cli.out {
        settings.out_dir = out;
    }
    settings.only = cli.only;
    if let Some(ms) = cli.run_ms {
        settings.limits.run = std::time::Duration::from_millis(ms);
        settings.pair_limits.run =
            std::time::Duration::from_millis(ms / (2 * settings.pair_rounds as u64));
        settings.pgbench_secs = ms.div_ceil(1000).max(1) as u32;
    }
    let (profile_only, ops) = (cli.profile_only, cli.ops);

    if let Some(name) = profile_only {
        let backend = match settings.backends.as_slice() {
            [one] => *one,
            _ => Backend::Sqlite,
        };
        let session = Session {
            durable: settings.durable,
        };
        let (ns, allocs, bytes) = profile::run_one(&name, ops, backend, session)?;
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
            .map(|&b| report_name(b))
            .collect::<Vec<_>>()
            .join(", "),
        settings.out_dir.display()
    );
    let results = run::all(settings)?;
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
    // After the report, which shows them: a strategy meant to lose nothing
    // that lost something fails the run (naive is expected to lose).
    let failed = results.failed_checks();
    if !failed.is_empty() {
        return Err(BenchError::Other(format!(
            "{} run(s) of strategies meant to lose nothing failed their correctness check: {}",
            failed.len(),
            failed
                .iter()
                .map(|s| format!(
                    "{} {} ({})",
                    report_name(s.backend),
                    s.case.label(),
                    s.check.detail
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn an_option_is_not_taken_for_a_value() {
        // `--only --quick` used to run only the cases labelled "--quick", in quick mode.
        assert!(Cli::try_parse_from(["lockkit-bench", "--only", "--quick"]).is_err());
        let cli =
            Cli::try_parse_from(["lockkit-bench", "--backends", "postgres,sqlite", "--quick"])
                .unwrap();
        assert_eq!(cli.backends, [Backend::Postgres, Backend::Sqlite]);
        assert!(cli.quick);
    }
}
