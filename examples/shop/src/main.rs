//! `shop`: buyers racing for limited stock, once per strategy, on SQLite,
//! PostgreSQL or MySQL/MariaDB. Run `shop --help` for the options.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use lockkit_tests::support::{database_url, exit_code};
use shop::{Backend, Config, ShopError, Strategy};

/// What `--help` prints after the options.
const AFTER_HELP: &str = "\
STRATEGIES (one item, 1-3 units per order):
    naive            read, think, write `stock = <read> - qty`: loses updates
    optimistic       version-checked write (#[derive(Versioned)]), retried when stale
    pessimistic      item.with_lock: SELECT .. FOR UPDATE, check, think, write
    atomic           UPDATE .. SET stock = stock - qty WHERE stock >= qty (update_if)
    nowait           with_lock(.., nowait(), ..): a locked row is Busy, retried
STRATEGIES (baskets of 2-3 items, 1-3 units each, all or nothing):
    basket-naive     FOR UPDATE one item at a time in the buyer's order:
                     deadlocks, retried (none on SQLite, which serializes writers)
    basket-lock-all  Item::lock_all in locked_transaction, in key order: no deadlocks

`conflicts` counts stale writes (optimistic) and busy rows (nowait), `deadlocks`
the transactions the server aborted to break one. For the basket strategies
`orders` are whole baskets and the stock columns add up all items. shop exits
with 1 if a strategy other than naive oversells.

DATABASE_URL=postgres://... (or postgresql://) runs on PostgreSQL,
DATABASE_URL=mysql://... on MySQL/MariaDB (build with `--features postgres` or
`--features mysql`); the tables `items` and `orders` are created there if missing
and emptied. Without it, shop uses the SQLite file. Lowering PostgreSQL's
deadlock_timeout needs a superuser or `GRANT SET ON PARAMETER deadlock_timeout`;
otherwise the server's value stays, and every basket-naive deadlock costs that long.
";

/// shop: the overselling problem, naive and with lockkit
#[derive(Debug, Parser)]
#[command(name = "shop", after_help = AFTER_HELP)]
struct Cli {
    /// Buyer threads
    #[arg(long, value_name = "N", default_value_t = 8)]
    buyers: usize,
    /// Units in stock at the start, per item
    #[arg(long, value_name = "N", default_value_t = 100)]
    stock: i32,
    /// Items on sale in the basket strategies
    #[arg(long, value_name = "N", default_value_t = 4)]
    items: usize,
    /// `all`, or one of the strategies below
    #[arg(long, value_name = "S", default_value = "all", value_parser = strategies)]
    strategy: Strategies,
    /// Purchases each buyer tries at most
    #[arg(long, value_name = "N", default_value_t = 50)]
    attempts: u32,
    /// Pause between read and write, in ms
    #[arg(long, value_name = "N", default_value_t = 5)]
    think_ms: u64,
    /// PostgreSQL deadlock_timeout for the basket strategies; 0 keeps the server's (1 s by default)
    #[arg(long, value_name = "N", default_value_t = 20)]
    pg_deadlock_timeout_ms: u64,
    /// SQLite database, recreated at start
    #[arg(long, value_name = "PATH", default_value = "shop.sqlite")]
    sqlite_file: PathBuf,
}

/// The strategies to run.
#[derive(Debug, Clone)]
struct Strategies(Vec<Strategy>);

/// `--strategy`: `all` or one strategy's name.
fn strategies(value: &str) -> Result<Strategies, ShopError> {
    if value == "all" {
        Ok(Strategies(Strategy::ALL.to_vec()))
    } else {
        Ok(Strategies(vec![value.parse()?]))
    }
}

/// The parsed command line.
struct Options {
    config: Config,
    strategies: Vec<Strategy>,
    sqlite_file: PathBuf,
}

impl From<Cli> for Options {
    fn from(cli: Cli) -> Self {
        Options {
            config: Config {
                buyers: cli.buyers,
                stock: cli.stock,
                items: cli.items,
                attempts: cli.attempts,
                think: Duration::from_millis(cli.think_ms),
                deadlock_timeout: match cli.pg_deadlock_timeout_ms {
                    0 => None,
                    millis => Some(Duration::from_millis(millis)),
                },
                ..Config::default()
            },
            strategies: cli.strategy.0,
            sqlite_file: cli.sqlite_file,
        }
    }
}

fn main() -> ExitCode {
    exit_code("shop", play(&Options::from(Cli::parse())))
}

/// Runs every chosen strategy and prints the table; `Ok(false)` if a strategy
/// that should prevent lost updates did not.
fn play(options: &Options) -> Result<bool, ShopError> {
    let (url, shown) = database_url(&options.sqlite_file);
    if Backend::from_url(&url) == Backend::Sqlite {
        shop::remove_sqlite_files(&options.sqlite_file).map_err(|e| {
            ShopError::Usage(format!(
                "cannot remove {}: {e}",
                options.sqlite_file.display()
            ))
        })?;
    }
    let config = &options.config;
    println!(
        "shop on {} ({shown}): {} buyers, {} in stock, up to {} purchases of 1-3 units each, {} ms think time",
        Backend::from_url(&url),
        config.buyers,
        config.stock,
        config.attempts,
        config.think.as_millis(),
    );
    if options.strategies.iter().any(|s| s.is_basket()) {
        println!(
            "baskets: {} items with {} units each, 2-3 distinct items of 1-3 units per basket",
            config.items, config.stock,
        );
    }
    println!();

    let mut reports = Vec::new();
    let mut metrics = Vec::new();
    for &strategy in &options.strategies {
        let before = lockkit::metrics::snapshot();
        reports.push(shop::run(&url, strategy, config)?);
        metrics.push((strategy, lockkit::metrics::snapshot().since(&before)));
    }
    print!("{}", shop::format_table(&reports));

    // What lockkit itself counted (lockkit::metrics), per strategy.
    println!(
        "
lockkit metrics:"
    );
    for (strategy, delta) in &metrics {
        println!("  {:<16} {delta}", strategy.name());
    }

    let mut ok = true;
    for report in &reports {
        if let Some(note) = &report.note {
            println!("\n{}: {note}", report.strategy);
        }
        if report.is_consistent() {
            continue;
        }
        if report.strategy.is_safe() {
            ok = false;
            println!(
                "\nBUG: {} lost {} units (lowest stock {}), but it must never lose an update",
                report.strategy,
                report.oversold(),
                report.tally.lowest_stock
            );
        } else {
            println!(
                "\n{}: {} units sold that were never in stock (lost updates)",
                report.strategy,
                report.oversold()
            );
        }
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Cli::try_parse_from(std::iter::once("shop").chain(args.iter().copied())).map(Options::from)
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn options_and_defaults() {
        let options = parse(&[]).unwrap();
        let defaults = Config::default();
        assert_eq!(options.config.buyers, 8);
        assert_eq!(options.config.stock, 100);
        assert_eq!(options.config.items, 4);
        assert_eq!(options.config.think, defaults.think);
        assert_eq!(options.config.deadlock_timeout, defaults.deadlock_timeout);
        assert_eq!(options.strategies, Strategy::ALL);
        assert_eq!(options.sqlite_file, PathBuf::from("shop.sqlite"));

        let options = parse(&[
            "--buyers",
            "3",
            "--stock=7",
            "--strategy",
            "naive",
            "--think-ms",
            "0",
        ])
        .unwrap();
        assert_eq!((options.config.buyers, options.config.stock), (3, 7));
        assert_eq!(options.strategies, [Strategy::Naive]);
        assert_eq!(options.config.think, Duration::ZERO);
        assert_eq!(
            parse(&["--strategy", "all"]).unwrap().strategies,
            Strategy::ALL
        );

        let options = parse(&[
            "--strategy",
            "basket-lock-all",
            "--items=6",
            "--pg-deadlock-timeout-ms",
            "0",
        ])
        .unwrap();
        assert_eq!(options.strategies, [Strategy::BasketLockAll]);
        assert_eq!(options.config.items, 6);
        assert_eq!(options.config.deadlock_timeout, None);
        for strategy in Strategy::ALL {
            let parsed = parse(&["--strategy", strategy.name()]).unwrap();
            assert_eq!(parsed.strategies, [*strategy]);
        }
    }

    #[test]
    fn the_help_names_every_strategy() {
        for strategy in Strategy::ALL {
            assert!(
                AFTER_HELP.contains(&format!("\n    {} ", strategy.name())),
                "{strategy} is missing from the help"
            );
        }
    }

    #[test]
    fn bad_options_are_usage_errors() {
        for args in [
            &["--buyers"][..],
            &["--buyers", "many"],
            &["--strategy", "psychic"],
            &["--colour", "red"],
        ] {
            let error = parse(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} parsed"));
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
    }
}
