//! The start and the end of an example program's `main`.

use std::fmt::Display;
use std::path::Path;
use std::process::ExitCode;

use super::{redact, Backend};

/// The database a program runs on, and how to print it: the server that
/// `DATABASE_URL` names (printed without its password), else the SQLite file
/// `sqlite_file`. A `DATABASE_URL` naming SQLite is ignored: the file is the
/// command line's to choose.
pub fn database_url(sqlite_file: &Path) -> (String, String) {
    let server = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| Backend::from_url(url) != Backend::Sqlite);
    match server {
        Some(url) => {
            let shown = redact(&url);
            (url, shown)
        }
        None => {
            let path = sqlite_file.display().to_string();
            (path.clone(), path)
        }
    }
}

/// The exit status of a program that checks what it did: success for
/// `Ok(true)`; failure for `Ok(false)`, and for an error, which is printed
/// after the program's name.
pub fn exit_code<E: Display>(program: &str, outcome: Result<bool, E>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}
