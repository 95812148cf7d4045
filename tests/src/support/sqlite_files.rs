//! The files a SQLite database is made of.

use std::io;
use std::path::{Path, PathBuf};

/// The files of the SQLite database at `path`: the database itself, its
/// write-ahead log (`-wal`), the log's shared-memory index (`-shm`) and its
/// rollback journal (`-journal`). Any but the first may be missing.
pub fn sqlite_files(path: &Path) -> [PathBuf; 4] {
    ["", "-wal", "-shm", "-journal"].map(|suffix| {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        PathBuf::from(file)
    })
}

/// Removes the files of the SQLite database at `path` ([`sqlite_files`]), so
/// that the next connection starts from an empty database. Missing files are
/// fine; the first other error stops the removal.
pub fn remove_sqlite_files(path: &Path) -> io::Result<()> {
    for file in sqlite_files(path) {
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_and_its_companions() {
        let files = sqlite_files(Path::new("/tmp/shop.sqlite"));
        assert_eq!(
            files.map(|f| f.display().to_string()),
            [
                "/tmp/shop.sqlite",
                "/tmp/shop.sqlite-wal",
                "/tmp/shop.sqlite-shm",
                "/tmp/shop.sqlite-journal",
            ]
        );
    }

    #[test]
    fn missing_files_are_fine() {
        let path = std::env::temp_dir().join(format!("lk_missing_{}.sqlite", std::process::id()));
        assert!(remove_sqlite_files(&path).is_ok());
    }
}
