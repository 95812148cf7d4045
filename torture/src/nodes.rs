//! Several nodes of one multi-primary cluster (MariaDB Galera): `--url` may
//! list one URL per node, comma-separated. The parent sets up, drains the queue
//! and audits through the first node; worker process `n` connects to node
//! `(n - 1) % nodes`, so that the writers spread over the nodes. Galera applies
//! another node's writes shortly after they commit, so a worker first waits
//! until its node has the tables, and the audit reads with `wsrep_sync_wait`
//! (each read waits until the node has applied every earlier commit).

use diesel::connection::SimpleConnection;
use diesel::QueryResult;
use lockkit_tests::support;

use crate::config::{Config, Role};

/// The URLs `--url` lists.
pub fn urls(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// The URL of the node `role` connects to.
pub fn node_url(url: &str, role: Role) -> &str {
    let urls = urls(url);
    let node = match role {
        Role::Parent => 0,
        Role::Worker(n) => (n as usize).saturating_sub(1) % urls.len().max(1),
    };
    urls.get(node).copied().unwrap_or(url)
}

/// What to hand to `Connection::establish`: this process's node's URL.
pub fn connection_url(config: &Config) -> &str {
    support::connection_url(node_url(&config.url, config.role))
}

/// Whether `--url` names several nodes.
pub fn is_cluster(config: &Config) -> bool {
    urls(&config.url).len() > 1
}

/// On a cluster, makes `conn`'s reads wait until its node has applied every
/// commit made before them (`wsrep_sync_wait`), and waits so once for the
/// tables the parent created. Elsewhere nothing.
pub fn catch_up<C: SimpleConnection>(conn: &mut C, config: &Config) -> QueryResult<()> {
    if !is_cluster(config) {
        return Ok(());
    }
    conn.batch_execute("SET SESSION wsrep_sync_wait = 1; SELECT COUNT(*) FROM torture_items")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_take_the_nodes_in_turn() {
        let url = "mysql://a/db,mysql://b/db,mysql://c/db";
        assert_eq!(node_url(url, Role::Parent), "mysql://a/db");
        assert_eq!(node_url(url, Role::Worker(1)), "mysql://a/db");
        assert_eq!(node_url(url, Role::Worker(2)), "mysql://b/db");
        assert_eq!(node_url(url, Role::Worker(4)), "mysql://a/db");
        assert_eq!(
            node_url("mysql://one/db", Role::Worker(3)),
            "mysql://one/db"
        );
    }
}
