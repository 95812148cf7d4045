//! A database of a test's own on a multi-primary MariaDB Galera cluster
//! (`GALERA_URLS`, one URL a node; `scripts/galera.sh start` makes one): what
//! `tests/tests/galera.rs` and the torture run on three nodes set up first.

use diesel::connection::SimpleConnection;
use diesel::{Connection, MysqlConnection};

use super::with_database;

/// The nodes' URLs listed in `GALERA_URLS` (comma-separated, each naming the
/// node's database `test`). Panics unless it lists at least two.
pub fn galera_nodes() -> Vec<String> {
    let nodes: Vec<String> = std::env::var("GALERA_URLS")
        .unwrap_or_default()
        .split(',')
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        nodes.len() >= 2,
        "GALERA_URLS must list the URLs of a Galera cluster's nodes, comma-separated \
         (eval \"$(scripts/galera.sh start)\", or run scripts/test.sh); got {nodes:?}"
    );
    nodes
}

/// Creates database `name` through the first of `nodes`, dropping one an
/// earlier run left, and waits until every node has it (Galera applies another
/// node's writes, even `CREATE DATABASE`, shortly after they commit: a read in
/// a session with `wsrep_sync_wait = 15` waits for them first; `USE` alone does
/// not). Returns the database's URL on each node, in the order of `nodes`.
pub fn create_galera_database(nodes: &[String], name: &str) -> Vec<String> {
    establish(&nodes[0])
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {name}; CREATE DATABASE {name}"
        ))
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {}: {e}", nodes[0]));
    for node in nodes {
        establish(node)
            .batch_execute(&format!(
                "SET SESSION wsrep_sync_wait = 15; \
                 SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = '{name}'; \
                 USE {name}"
            ))
            .unwrap_or_else(|e| panic!("{node} did not catch up: {e}"));
    }
    nodes.iter().map(|url| with_database(url, name)).collect()
}

fn establish(url: &str) -> MysqlConnection {
    MysqlConnection::establish(url).unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"))
}
