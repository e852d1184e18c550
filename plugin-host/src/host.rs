//! The ABI's `host` interface: bounded logging and the plugin's config.
//! Log lines (from `host.log` and from captured stdout/stderr) go to
//! `tracing` under the target `bulkhead::plugin`, tagged with tenant and
//! plugin, and quoted so a plugin cannot forge log lines.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::bindings::bulkhead::plugin::host::{self, Level};
use super::bindings::bulkhead::plugin::types;
use super::limits::MAX_LOG_MESSAGE_BYTES;

/// A plugin's `config` table from the tenant policy; `config-entries`
/// returns it sorted by key.
pub type PluginConfig = BTreeMap<String, String>;

/// Where a log line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogSource {
    Host,
    Stdout,
    Stderr,
}

impl LogSource {
    fn as_str(self) -> &'static str {
        match self {
            LogSource::Host => "log",
            LogSource::Stdout => "stdout",
            LogSource::Stderr => "stderr",
        }
    }
}

/// How much one instance logged, and how much was dropped over its budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Bytes of message text written to the log.
    pub written_bytes: usize,
    /// Messages (or stdout/stderr lines) dropped whole because the budget
    /// was spent, plus one for each stretch of stdio output lost to the
    /// capture's bound.
    pub dropped_messages: u64,
    /// Messages cut short (to [`MAX_LOG_MESSAGE_BYTES`] or the budget left).
    pub cut_messages: u64,
}

/// The log volume an instance may still write.
#[derive(Debug)]
pub(crate) struct LogBudget {
    remaining: usize,
    stats: LogStats,
}

impl LogBudget {
    pub(crate) fn new(max_bytes: usize) -> Self {
        LogBudget {
            remaining: max_bytes,
            stats: LogStats::default(),
        }
    }

    /// The part of `message` that may be written: cut to
    /// [`MAX_LOG_MESSAGE_BYTES`] and to what is left of the budget (at a
    /// character boundary), or `None` once the budget is spent.
    pub(crate) fn admit<'m>(&mut self, message: &'m str) -> Option<(&'m str, Cut)> {
        if self.remaining == 0 {
            self.stats.dropped_messages += 1;
            return None;
        }
        let end = message
            .floor_char_boundary(message.len().min(MAX_LOG_MESSAGE_BYTES).min(self.remaining));
        let cut = if end < message.len() {
            self.stats.cut_messages += 1;
            Cut::Yes
        } else {
            Cut::No
        };
        // An empty admission still costs a byte, so a plugin cannot log
        // empty messages for free.
        self.remaining = self.remaining.saturating_sub(end.max(1));
        self.stats.written_bytes += end;
        Some((&message[..end], cut))
    }

    pub(crate) fn note_dropped(&mut self) {
        self.stats.dropped_messages += 1;
    }

    pub(crate) fn stats(&self) -> LogStats {
        self.stats
    }
}

/// Whether a message was cut short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    Yes,
    No,
}

/// What `host` imports see: who is calling, the config, the log budget.
#[derive(Debug)]
pub(crate) struct HostState {
    pub(crate) tenant: Arc<str>,
    pub(crate) plugin: Arc<str>,
    config: Arc<PluginConfig>,
    pub(crate) log: LogBudget,
}

impl HostState {
    pub(crate) fn new(
        tenant: Arc<str>,
        plugin: Arc<str>,
        config: Arc<PluginConfig>,
        max_log_bytes: usize,
    ) -> Self {
        HostState {
            tenant,
            plugin,
            config,
            log: LogBudget::new(max_log_bytes),
        }
    }

    /// Writes one message within the budget.
    pub(crate) fn write_log(&mut self, level: Level, source: LogSource, message: &str) {
        let Some((text, cut)) = self.log.admit(message) else {
            return;
        };
        let (tenant, plugin, source, cut) = (
            &*self.tenant,
            &*self.plugin,
            source.as_str(),
            cut == Cut::Yes,
        );
        macro_rules! emit {
            ($level:expr) => {
                tracing::event!(target: "bulkhead::plugin", $level, tenant, plugin, source, cut, message = ?text)
            };
        }
        match level {
            Level::Debug => emit!(tracing::Level::DEBUG),
            Level::Info => emit!(tracing::Level::INFO),
            Level::Warn => emit!(tracing::Level::WARN),
            Level::Error => emit!(tracing::Level::ERROR),
        }
    }

    /// Writes captured stdout or stderr, one log message per line.
    pub(crate) fn write_captured(&mut self, source: LogSource, bytes: &[u8], dropped_bytes: usize) {
        let level = match source {
            LogSource::Stderr => Level::Warn,
            LogSource::Stdout | LogSource::Host => Level::Info,
        };
        let text = String::from_utf8_lossy(bytes);
        for line in text.lines().filter(|line| !line.is_empty()) {
            self.write_log(level, source, line);
        }
        if dropped_bytes > 0 {
            self.log.note_dropped();
        }
    }
}

impl host::Host for HostState {
    fn log(&mut self, level: Level, message: String) {
        self.write_log(level, LogSource::Host, &message);
    }

    fn config(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }

    fn config_entries(&mut self) -> Vec<(String, String)> {
        self.config
            .iter()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }
}

impl types::Host for HostState {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_budget_cuts_long_messages_and_stops_when_spent() {
        let mut budget = LogBudget::new(MAX_LOG_MESSAGE_BYTES + 10);
        let long = "a".repeat(MAX_LOG_MESSAGE_BYTES * 2);
        let (text, cut) = budget.admit(&long).unwrap();
        assert_eq!((text.len(), cut), (MAX_LOG_MESSAGE_BYTES, Cut::Yes));
        assert_eq!(budget.admit("hello").unwrap(), ("hello", Cut::No));
        // 5 bytes left: cut to them.
        assert_eq!(budget.admit("0123456789").unwrap(), ("01234", Cut::Yes));
        assert_eq!(budget.admit("x"), None);
        assert_eq!(budget.admit(""), None);
        assert_eq!(
            budget.stats(),
            LogStats {
                written_bytes: MAX_LOG_MESSAGE_BYTES + 10,
                dropped_messages: 2,
                cut_messages: 2,
            }
        );
    }

    #[test]
    fn log_budget_cuts_at_a_character_boundary() {
        let mut budget = LogBudget::new(4);
        // "é" is 2 bytes: 4 bytes of budget end inside the third.
        assert_eq!(budget.admit("ééé").unwrap(), ("éé", Cut::Yes));
    }

    #[test]
    fn empty_messages_are_not_free() {
        let mut budget = LogBudget::new(3);
        for _ in 0..3 {
            assert_eq!(budget.admit(""), Some(("", Cut::No)));
        }
        assert_eq!(budget.admit(""), None);
    }
}
