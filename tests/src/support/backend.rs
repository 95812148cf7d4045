//! The three backends, and which one a URL names.

use std::fmt;

/// The database server a URL points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// `postgres://…` or `postgresql://…`.
    Postgres,
    /// `mysql://…` (MySQL or MariaDB).
    Mysql,
    /// Anything else: a SQLite file path (an optional `sqlite://` prefix is removed).
    Sqlite,
}

impl Backend {
    /// Every backend, servers first.
    pub const ALL: [Backend; 3] = [Backend::Postgres, Backend::Mysql, Backend::Sqlite];

    /// The backend a database URL selects.
    pub fn from_url(url: &str) -> Backend {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("mysql://") {
            Backend::Mysql
        } else {
            Backend::Sqlite
        }
    }

    /// The backend a short name selects: [`Backend::name`], or `pg`,
    /// `postgresql` or `mariadb`.
    pub fn parse(name: &str) -> Option<Backend> {
        match name {
            "postgres" | "pg" | "postgresql" => Some(Backend::Postgres),
            "mysql" | "mariadb" => Some(Backend::Mysql),
            "sqlite" => Some(Backend::Sqlite),
            _ => None,
        }
    }

    /// The backend's short name, also the name of its cargo feature.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        }
    }

    /// The backend's name in prose: `PostgreSQL`, `MySQL/MariaDB`, `SQLite`.
    pub fn title(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::Mysql => "MySQL/MariaDB",
            Backend::Sqlite => "SQLite",
        }
    }

    /// Whether the backend has row locks (`FOR UPDATE`, `SKIP LOCKED`). SQLite
    /// has none: `lockkit::locked_transaction` takes the whole database's write
    /// lock there, so writers take turns.
    pub fn has_row_locks(self) -> bool {
        !matches!(self, Backend::Sqlite)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_select_the_backend() {
        assert_eq!(Backend::from_url("postgres://h/db"), Backend::Postgres);
        assert_eq!(Backend::from_url("postgresql://h/db"), Backend::Postgres);
        assert_eq!(Backend::from_url("mysql://root@h/db"), Backend::Mysql);
        assert_eq!(Backend::from_url("shop.sqlite"), Backend::Sqlite);
        assert_eq!(Backend::from_url("sqlite://shop.sqlite"), Backend::Sqlite);
    }

    #[test]
    fn names_round_trip() {
        for backend in Backend::ALL {
            assert_eq!(Backend::parse(backend.name()), Some(backend));
            assert_eq!(backend.to_string(), backend.name());
        }
        assert_eq!(Backend::parse("pg"), Some(Backend::Postgres));
        assert_eq!(Backend::parse("mariadb"), Some(Backend::Mysql));
        assert_eq!(Backend::parse("oracle"), None);
    }
}
