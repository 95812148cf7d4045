//! `http_api`: the items API on SQLite, PostgreSQL or MySQL/MariaDB.
//!
//! ```sh
//! cargo run -p http_api                                   # SQLite file http_api.sqlite
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run -p http_api
//! HTTP_API_ADDR=127.0.0.1:8080 cargo run -p http_api
//! ```

use std::process::ExitCode;

const USAGE: &str = "\
http_api: an items API where ETag / If-Match stop lost updates

USAGE:
    http_api

ENVIRONMENT:
    DATABASE_URL    postgres://..., mysql://... or a SQLite file  [default: http_api.sqlite]
    HTTP_API_ADDR   address to listen on                          [default: 127.0.0.1:3000]

ROUTES:
    POST   /items        {\"name\": \"widget\", \"stock\": 10}       -> 201, ETag
    GET    /items/{id}                                       -> 200, ETag
    PUT    /items/{id}   If-Match: \"v0\"  {\"name\":..,\"stock\":..} -> 200 | 412 | 428
    DELETE /items/{id}   If-Match: \"v1\"                      -> 204 | 412 | 428
";

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Some(arg) = std::env::args().nth(1) {
        eprintln!("http_api: unexpected argument `{arg}`\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "http_api.sqlite".to_owned());
    let addr = std::env::var("HTTP_API_ADDR")
        .ok()
        .filter(|addr| !addr.is_empty())
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());

    let app = match http_api::connect(&url, &http_api::Config::default()) {
        Ok(app) => app,
        Err(e) => {
            eprintln!("http_api: {url}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let backend = app.backend();
    let served = tokio::runtime::Runtime::new().and_then(|runtime| {
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            eprintln!(
                "http_api: listening on http://{} ({backend}); Ctrl-C stops",
                listener.local_addr()?
            );
            http_api::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = tokio::signal::ctrl_c().await;
                })
                .await
        })
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http_api: {addr}: {e}");
            ExitCode::FAILURE
        }
    }
}
