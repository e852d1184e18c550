//! Native unit tests of plugins (not on wasm32): on other targets the SDK
//! serves [`config`](crate::config()) and [`log`](crate::log) from memory, per
//! test thread, so a test can call a plugin's hooks directly.
//!
//! ```
//! use bulkhead_guest::testing;
//!
//! testing::set_config([("prompt", "Be brief.")]);
//! assert_eq!(bulkhead_guest::config("prompt").as_deref(), Some("Be brief."));
//! bulkhead_guest::log::info("hello");
//! assert_eq!(testing::take_logs().len(), 1);
//! ```

use crate::host;
use crate::log::Level;

/// Replaces this thread's plugin config with `entries`.
pub fn set_config<K, V>(entries: impl IntoIterator<Item = (K, V)>)
where
    K: Into<String>,
    V: Into<String>,
{
    host::set_config(
        entries
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect(),
    );
}

/// The lines this thread logged since the last call, oldest first.
pub fn take_logs() -> Vec<(Level, String)> {
    host::take_logs()
}
