//! A Redis key prefix of its own for one test, on the shared server.

use lockkit::lease::redis::{client, RedisStore};

/// A test's place on the Redis server (`REDIS_URL`, default
/// `redis://127.0.0.1:6379/`): every key it uses starts with [`TestRedis::prefix`],
/// and those keys are deleted when it drops. Nothing else on the server is
/// touched (no `FLUSHALL`, no `SCRIPT FLUSH`: the server is shared).
pub struct TestRedis {
    /// The server's URL.
    pub url: String,
    /// `lk:<test>_<pid>_<n>:`, unique across threads and processes.
    pub prefix: String,
}

impl TestRedis {
    /// A fresh prefix for `test_name`.
    pub fn new(test_name: &str) -> Self {
        TestRedis {
            url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into()),
            prefix: format!(
                "{}:",
                crate::db::unique_name(test_name).replacen('_', ":", 1)
            ),
        }
    }

    /// A store on a connection of its own, with the test's prefix.
    pub fn store(&self) -> RedisStore {
        RedisStore::open(&self.url, self.prefix.clone())
            .unwrap_or_else(|e| panic!("cannot connect to Redis at {}: {e}", self.url))
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let Ok(mut conn) = client::Client::open(self.url.as_str()).and_then(|c| c.get_connection())
        else {
            return;
        };
        let keys: Vec<String> = client::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: Result<i64, _> = client::cmd("DEL").arg(&keys).query(&mut conn);
        }
    }
}
