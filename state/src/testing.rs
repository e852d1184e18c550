//! For tests that use the state database (this crate's and other crates',
//! through the `testing` feature): a fresh schema on the test server,
//! dropped when the test ends, pass or fail.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{PgSettings, StateError, pool};

/// The test server's URL; without it, [`DEFAULT_TEST_POSTGRES`].
pub const TEST_POSTGRES_ENV: &str = "BULKHEAD_TEST_POSTGRES";
/// The test server when [`TEST_POSTGRES_ENV`] is unset.
pub const DEFAULT_TEST_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test server's URL.
pub fn test_postgres_url() -> String {
    std::env::var(TEST_POSTGRES_ENV)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| DEFAULT_TEST_POSTGRES.to_string())
}

/// A schema `bulkhead_test_<random hex>` of the test server, dropped
/// (`DROP SCHEMA ... CASCADE`, on a connection of its own) on drop.
#[derive(Debug)]
pub struct TestSchema {
    settings: PgSettings,
}

impl TestSchema {
    /// Settings for a new, unused schema (not created yet: connecting
    /// creates it), and the guard that drops it. Panics, naming
    /// [`TEST_POSTGRES_ENV`], if the test server does not answer.
    pub async fn new() -> (PgSettings, TestSchema) {
        let mut settings = PgSettings::new(test_postgres_url());
        settings.schema = unique_name();
        let resolved = settings
            .resolve()
            .unwrap_or_else(|e| panic!("{TEST_POSTGRES_ENV}: {e}"));
        let probe = async {
            let client = pool::session(&resolved, 1000).await?;
            client.batch_execute("").await.map_err(StateError::from)
        };
        if let Err(e) = probe.await {
            panic!("the test PostgreSQL does not answer (set {TEST_POSTGRES_ENV}): {e}");
        }
        let guard = TestSchema {
            settings: settings.clone(),
        };
        (settings, guard)
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.settings.schema
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // Drop cannot await, and may run inside a runtime that must not
        // block on itself: a thread with a runtime of its own.
        let settings = self.settings.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let dropping = runtime.block_on(async {
                let resolved = settings.resolve()?;
                let client = pool::session(&resolved, 10_000).await?;
                let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", resolved.schema);
                client.batch_execute(&sql).await?;
                Ok::<_, StateError>(())
            });
            dropping.map_err(|e| e.to_string())
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("test schema {} not dropped: {e}", self.settings.schema),
            Err(_) => eprintln!("test schema {} not dropped: panic", self.settings.schema),
        }
    }
}

/// `bulkhead_test_` and 16 hex digits, different in every call and process.
fn unique_name() -> String {
    format!("bulkhead_test_{}", unique_suffix())
}

/// 16 hex digits, different in every call and process.
pub(crate) fn unique_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // std seeds each RandomState's keys from the OS.
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", hasher.finish())
}
