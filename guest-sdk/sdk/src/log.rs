//! Writes to the gateway's log, tagged with the tenant and the plugin. The
//! gateway cuts long messages and caps how much one hook call may log.

use crate::host;

pub use crate::bindings::bulkhead::plugin::host::Level;

/// Logs `message` at `level`.
pub fn log(level: Level, message: &str) {
    host::log(level, message);
}

/// Logs at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message);
}

/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message);
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message);
}

/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message);
}
