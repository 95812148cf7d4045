//! `outbox`: an order service, outbox relays and a consumer with an inbox, on
//! SQLite, PostgreSQL or MySQL/MariaDB, with NATS JetStream as the broker.
//! Run `outbox --help` for the roles and options.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use lockkit_tests::support::{database_url, exit_code};
use outbox::{BrokerConfig, ConsumerOptions, OutboxError, RelayOptions};

/// What `--help` prints after the options.
const AFTER_HELP: &str = "\
A RUN, ONE PROCESS PER STEP (or all of them: --role demo):
    outbox --role setup --items 5          # tables, stock, an empty stream
    outbox --role orders --count 100       # the order service
    outbox --role relay & outbox --role relay   # publish; run as many as you like
    outbox --role consumer                 # apply each message once
    outbox --role audit                    # exactly once? exit status 0 if so

CRASHES, ON PURPOSE (exit status 42):
    outbox --role relay --crash-after-publish 2     # JetStream acked batch 2, marks not committed
    outbox --role consumer --crash-after-effect 3   # effect 3 committed, not acked

DATABASE_URL=postgres://... or mysql://... runs on that server (build with
`--features postgres` or `--features mysql`); without it, the SQLite file.
NATS_URL (default nats://127.0.0.1:4222) names the NATS server, with JetStream on.
";

/// outbox: at-least-once delivery through a transactional outbox, an exactly-once effect through an inbox
#[derive(Debug, Parser)]
#[command(name = "outbox", after_help = AFTER_HELP)]
struct Cli {
    /// What to do
    #[arg(long, value_enum, default_value_t = Role::Demo)]
    role: Role,
    /// Orders to place
    #[arg(long, value_name = "N", default_value_t = 100)]
    count: u32,
    /// Items in stock (setup)
    #[arg(long, value_name = "N", default_value_t = 5)]
    items: i32,
    /// Messages a relay claims per transaction
    #[arg(long, value_name = "N", default_value_t = 10)]
    batch: i64,
    /// This process's name [default: the role and the process id]
    #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    name: Option<String>,
    /// The consumer's name (its durable JetStream consumer and its inbox)
    #[arg(long, value_name = "NAME", default_value = "stock")]
    consumer: String,
    /// The JetStream stream (letters, digits, `_`, `-`)
    #[arg(long, value_name = "NAME", default_value = "ORDERS")]
    stream: String,
    /// Relay: pause after each batch, in ms
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pause_ms: u64,
    /// Relay: exit after JetStream acked batch N, before the marks commit
    #[arg(long, value_name = "N")]
    crash_after_publish: Option<u32>,
    /// Consumer: exit after effect N committed, before its ack
    #[arg(long, value_name = "N")]
    crash_after_effect: Option<u32>,
    /// Consumer: stop after this long without messages, once nothing is pending
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    idle_ms: u64,
    /// SQLite database
    #[arg(long, value_name = "PATH", default_value = "outbox.sqlite")]
    sqlite_file: PathBuf,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Set up, place orders, run two relays and a consumer as threads, audit
    Demo,
    /// Create the tables, empty them, stock the items, create the stream anew
    Setup,
    /// Place orders, each with its message in one transaction
    Orders,
    /// Publish the outbox to JetStream until it is empty
    Relay,
    /// Apply messages through the inbox until nothing is pending
    Consumer,
    /// Check that every order was applied exactly once
    Audit,
}

fn main() -> ExitCode {
    exit_code("outbox", play(&Cli::parse()))
}

fn play(cli: &Cli) -> Result<bool, OutboxError> {
    let (url, shown) = database_url(&cli.sqlite_file);
    let broker = BrokerConfig {
        stream: cli.stream.clone(),
        ..BrokerConfig::default()
    };
    let name = cli
        .name
        .clone()
        .unwrap_or_else(|| format!("{:?}-{}", cli.role, std::process::id()).to_lowercase());
    let relay = RelayOptions {
        name: name.clone(),
        batch: cli.batch,
        crash_after_publish: cli.crash_after_publish,
        pause: Duration::from_millis(cli.pause_ms),
    };
    let consumer = ConsumerOptions {
        name: cli.consumer.clone(),
        crash_after_effect: cli.crash_after_effect,
        idle: Duration::from_millis(cli.idle_ms),
    };
    match cli.role {
        Role::Setup => {
            outbox::setup(&url, &broker, cli.items)?;
            println!(
                "{shown}: tables ready, {} items stocked, stream {} empty",
                cli.items, broker.stream
            );
        }
        Role::Orders => {
            let ids = outbox::place_orders(&url, &broker, cli.count)?;
            println!(
                "order service: placed {} orders with their messages",
                ids.len()
            );
        }
        Role::Relay => println!(
            "relay {name}: {}",
            outbox::run_relay(&url, &broker, &relay)?
        ),
        Role::Consumer => println!(
            "consumer {}: {}",
            consumer.name,
            outbox::run_consumer(&url, &broker, &consumer)?
        ),
        Role::Audit => {
            let audit = outbox::audit(&url, &broker)?;
            println!("{audit}");
            return Ok(audit.is_exactly_once());
        }
        Role::Demo => return demo(&url, &shown, &broker, cli, &consumer),
    }
    Ok(true)
}

/// Every step in one process: two relays and the consumer as threads.
fn demo(
    url: &str,
    shown: &str,
    broker: &BrokerConfig,
    cli: &Cli,
    consumer: &ConsumerOptions,
) -> Result<bool, OutboxError> {
    println!(
        "{shown}, NATS at {}: {} orders, two relays, one consumer",
        broker.url, cli.count
    );
    outbox::setup(url, broker, cli.items)?;
    outbox::place_orders(url, broker, cli.count)?;
    std::thread::scope(|s| {
        let relays: Vec<_> = ["r1", "r2"]
            .map(|name| {
                let options = RelayOptions {
                    name: name.into(),
                    batch: cli.batch,
                    crash_after_publish: None,
                    pause: Duration::ZERO,
                };
                s.spawn(move || {
                    outbox::run_relay(url, broker, &options).map(|r| println!("relay {name}: {r}"))
                })
            })
            .into();
        let consumer = s.spawn(|| {
            outbox::run_consumer(url, broker, consumer)
                .map(|r| println!("consumer {}: {r}", consumer.name))
        });
        relays
            .into_iter()
            .chain([consumer])
            .try_for_each(|t| t.join().expect("a demo thread panicked"))
    })?;
    let audit = outbox::audit(url, broker)?;
    println!("{audit}");
    Ok(audit.is_exactly_once())
}
