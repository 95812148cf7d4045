//! Database URLs: connecting, naming another database, printing.

use super::Backend;

/// What to hand to `Connection::establish` for `url`: the URL itself, or for
/// SQLite the path without an optional `sqlite://`.
pub fn connection_url(url: &str) -> &str {
    match Backend::from_url(url) {
        Backend::Sqlite => url.strip_prefix("sqlite://").unwrap_or(url),
        Backend::Postgres | Backend::Mysql => url,
    }
}

/// The URL of the server database that tests and benchmarks connect to in order
/// to create (and later drop) databases of their own: `PG_DATABASE_URL` or
/// `MYSQL_DATABASE_URL` when set and not empty, else
/// `postgres://postgres@127.0.0.1:5432/test` or `mysql://root@127.0.0.1:3306/test`.
/// `None` for SQLite, which has no server.
pub fn admin_url(backend: Backend) -> Option<String> {
    let default = match backend {
        Backend::Postgres => "postgres://postgres@127.0.0.1:5432/test",
        Backend::Mysql => "mysql://root@127.0.0.1:3306/test",
        Backend::Sqlite => return None,
    };
    let url = std::env::var(admin_url_var(backend)?)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned());
    Some(url)
}

/// The environment variable that overrides [`admin_url`]: `PG_DATABASE_URL` or
/// `MYSQL_DATABASE_URL`; `None` for SQLite.
pub fn admin_url_var(backend: Backend) -> Option<&'static str> {
    match backend {
        Backend::Postgres => Some("PG_DATABASE_URL"),
        Backend::Mysql => Some("MYSQL_DATABASE_URL"),
        Backend::Sqlite => None,
    }
}

/// The server URL `url` with its database name (the URL's path) replaced by
/// `database`; the query string is kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{database}", &base[..host_end]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// `url` without its password, for printing: `postgres://user:***@host/db`.
/// A URL without a password, and a SQLite path, come back unchanged.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].split_once(':') {
            Some((user, _password)) => {
                format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
            }
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_get_the_database_replaced() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/test", "lk_x"),
            "postgres://postgres@127.0.0.1:5432/lk_x"
        );
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306", "lk_x"),
            "mysql://root@127.0.0.1:3306/lk_x"
        );
        assert_eq!(
            with_database("postgres://u:p@h/db?sslmode=disable", "lk_y"),
            "postgres://u:p@h/lk_y?sslmode=disable"
        );
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            redact("mysql://root@127.0.0.1/db"),
            "mysql://root@127.0.0.1/db"
        );
        assert_eq!(redact("mysql://u:p@ss@h/db"), "mysql://u:***@h/db");
        assert_eq!(redact("shop.sqlite"), "shop.sqlite");
    }

    #[test]
    fn sqlite_urls_lose_their_scheme() {
        assert_eq!(connection_url("sqlite://a.sqlite"), "a.sqlite");
        assert_eq!(connection_url("a.sqlite"), "a.sqlite");
        assert_eq!(connection_url("mysql://h/db"), "mysql://h/db");
    }

    #[test]
    fn sqlite_has_no_admin_url() {
        assert_eq!(admin_url(Backend::Sqlite), None);
        assert!(admin_url(Backend::Postgres).is_some_and(|url| url.starts_with("postgres")));
    }
}
