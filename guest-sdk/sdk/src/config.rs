//! The plugin's `config` table from the tenant policy.

use crate::host;

/// The value of `key` in this plugin's config, if set.
pub fn config(key: &str) -> Option<String> {
    host::config(key)
}

/// The value of `key`, or `default` when it is not set.
pub fn config_or(key: &str, default: &str) -> String {
    config(key).unwrap_or_else(|| default.to_owned())
}

/// Every config entry, sorted by key (for families of keys like
/// `pattern_1`, `pattern_2`, …).
pub fn config_entries() -> Vec<(String, String)> {
    host::config_entries()
}
