//! The host functions as the component imports them.

use crate::bindings::bulkhead::plugin::host;
use crate::log::Level;

pub(crate) fn config(key: &str) -> Option<String> {
    host::config(key)
}

pub(crate) fn config_entries() -> Vec<(String, String)> {
    host::config_entries()
}

pub(crate) fn log(level: Level, message: &str) {
    host::log(level, message);
}
