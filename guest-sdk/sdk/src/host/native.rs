//! An in-memory host for native unit tests: config set with
//! [`crate::testing::set_config`], log lines kept for
//! [`crate::testing::take_logs`]. Per thread, so parallel tests stay apart.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::log::Level;

thread_local! {
    static CONFIG: RefCell<BTreeMap<String, String>> = const { RefCell::new(BTreeMap::new()) };
    static LOGS: RefCell<Vec<(Level, String)>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn config(key: &str) -> Option<String> {
    CONFIG.with(|config| config.borrow().get(key).cloned())
}

pub(crate) fn config_entries() -> Vec<(String, String)> {
    CONFIG.with(|config| {
        config
            .borrow()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
}

pub(crate) fn log(level: Level, message: &str) {
    LOGS.with(|logs| logs.borrow_mut().push((level, message.to_owned())));
}

pub(crate) fn set_config(entries: BTreeMap<String, String>) {
    CONFIG.with(|config| *config.borrow_mut() = entries);
}

pub(crate) fn take_logs() -> Vec<(Level, String)> {
    LOGS.with(|logs| std::mem::take(&mut *logs.borrow_mut()))
}
