//! `http_api`: the items API on SQLite, PostgreSQL or MySQL/MariaDB.
//!
//! ```sh
//! cargo run -p http_api                                   # SQLite file http_api.sqlite
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run -p http_api --features postgres
//! cargo run -p http_api -- --addr 127.0.0.1:8080          # or HTTP_API_ADDR=...
//! RUST_LOG=debug cargo run -p http_api                    # more detail than the default
//! ```

use std::process::ExitCode;

use clap::Parser;
use lockkit_tests::support::redact;
use tracing_subscriber::EnvFilter;

/// What `--help` prints after the options.
const AFTER_HELP: &str = "\
ROUTES:
    POST   /items        {\"name\": \"widget\", \"stock\": 10}       -> 201, ETag
    GET    /items/{id}                                       -> 200, ETag
    PUT    /items/{id}   If-Match: \"v0\"  {\"name\":..,\"stock\":..} -> 200 | 412 | 428
    DELETE /items/{id}   If-Match: \"v1\"                      -> 204 | 412 | 428
    POST   /items/{id}/sell     {\"quantity\": 2}               -> 200 | 409 | 503
    POST   /items/{id}/restock  {\"quantity\": 5}               -> 200 | 503
    PUT    /blocking/items/{id}  as PUT /items/{id}, on blocking Diesel

A postgres:// or mysql:// DATABASE_URL needs a build with `--features postgres`
or `--features mysql`. RUST_LOG filters the log (default: info, and every request from tower_http).
";

/// http_api: an items API where ETag / If-Match stop lost updates
#[derive(Debug, Parser)]
#[command(name = "http_api", after_help = AFTER_HELP)]
struct Cli {
    /// postgres://..., mysql://... or a SQLite file
    #[arg(
        long,
        env = "DATABASE_URL",
        value_name = "URL",
        default_value = "http_api.sqlite"
    )]
    database_url: String,
    /// Address to listen on
    #[arg(
        long,
        env = "HTTP_API_ADDR",
        value_name = "ADDR",
        default_value = "127.0.0.1:3000"
    )]
    addr: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,tower_http=debug")),
        )
        .init();

    let served = tokio::runtime::Runtime::new()
        .map_err(|e| format!("tokio runtime: {e}"))
        .and_then(|runtime| {
            runtime.block_on(async {
                let app = http_api::connect(&cli.database_url, &http_api::Config::default())
                    .await
                    .map_err(|e| format!("{}: {e}", redact(&cli.database_url)))?;
                let backend = app.backend();
                let listen = async {
                    let listener = tokio::net::TcpListener::bind(&cli.addr).await?;
                    tracing::info!(
                        "listening on http://{} ({backend}); Ctrl-C stops",
                        listener.local_addr()?
                    );
                    http_api::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = tokio::signal::ctrl_c().await;
                        })
                        .await
                };
                listen.await.map_err(|e| format!("{}: {e}", cli.addr))
            })
        });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
