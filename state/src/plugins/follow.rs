//! [`follow_plugins`]: a replica's index kept in step with the plugins in
//! the state database, from LISTEN notices and the periodic resync.

use std::collections::BTreeSet;
use std::time::Duration;

use bulkhead_plugin_host::{PluginRegistry, StoreError};
use tokio::task::JoinHandle;

use super::PLUGINS_TOPIC;
use crate::{Change, Db};

/// How often a replica rereads every tenant's plugins, whatever notices
/// said: the bound on how late a missed notice makes a change.
pub const PLUGIN_RESYNC: Duration = Duration::from_secs(30);

/// Wait before trying again after a refresh failed (the database went
/// away): the whole index is reread then.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// What is left to reread.
#[derive(Debug, Default)]
struct Pending {
    every_tenant: bool,
    tenants: BTreeSet<String>,
}

impl Pending {
    fn add(&mut self, change: Change) {
        match change {
            Change::Resync => self.every_tenant = true,
            Change::Changed(tenant) => {
                self.tenants.insert(tenant);
            }
        }
    }

    fn is_empty(&self) -> bool {
        !self.every_tenant && self.tenants.is_empty()
    }

    /// Rereads what is pending; stops at the first failure.
    fn apply(self, registry: &PluginRegistry) -> Result<(), StoreError> {
        if self.every_tenant {
            registry.refresh(None)?;
            return Ok(());
        }
        for tenant in &self.tenants {
            registry.refresh(Some(tenant))?;
        }
        Ok(())
    }
}

/// Spawns the task that keeps `registry` in step with the plugins in `db`:
/// it listens on [`PLUGINS_TOPIC`] and rereads a tenant when a notice names
/// it, and every tenant on (re)connecting and every `resync_every`. Notices
/// that arrive during a refresh are taken together in the next one. A
/// refresh that fails leaves the index as it was and is tried again (for
/// every tenant) a second later. Refreshes run on blocking threads; the
/// task ends when the runtime does (or when aborted).
pub fn follow_plugins(db: Db, registry: PluginRegistry, resync_every: Duration) -> JoinHandle<()> {
    let mut changes = crate::listen(db, PLUGINS_TOPIC, resync_every);
    tokio::spawn(async move {
        let mut pending = Pending::default();
        loop {
            if pending.is_empty() {
                let Some(change) = changes.recv().await else {
                    return;
                };
                pending.add(change);
            } else {
                // Left over from a failed refresh: a moment's wait, or the
                // next notice, whichever comes first.
                tokio::select! {
                    change = changes.recv() => match change {
                        Some(change) => pending.add(change),
                        None => return,
                    },
                    () = tokio::time::sleep(RETRY_AFTER_FAILURE) => {}
                }
            }
            while let Ok(change) = changes.try_recv() {
                pending.add(change);
            }
            let work = std::mem::take(&mut pending);
            let registry = registry.clone();
            let done = tokio::task::spawn_blocking(move || work.apply(&registry)).await;
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(
                        "plugins not refreshed from the state database (serving the last ones \
                         known; retrying): {e}"
                    );
                    pending.every_tenant = true;
                }
                Err(e) if e.is_cancelled() => return,
                Err(e) => {
                    // A bug; the follower outlives it and rereads everything.
                    tracing::error!("refreshing plugins from the state database panicked: {e}");
                    pending.every_tenant = true;
                }
            }
        }
    })
}
