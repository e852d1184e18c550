//! Following the registrations other replicas make: with the state
//! database, every replica listens for the `registrations` notice, rereads
//! what changed (everything on each resync) and brings its book in line;
//! its hosts' passes then load, adopt or unload as for a local change.
//! Models another replica removed stop being served here at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bulkhead_state::Change;
use tokio::sync::mpsc;

use super::Inner;
use crate::registration::{Record, RegistryDb};

/// How often every registration is reread even without a notice (a
/// notice missed while the LISTEN connection was down is caught so).
pub(super) const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// What was reread.
enum Reread {
    All(Vec<Record>),
    One(String, Option<Record>),
}

/// Applies every change `changes` reports until it ends.
pub(super) async fn follow(inner: Arc<Inner>, db: RegistryDb, mut changes: mpsc::Receiver<Change>) {
    while let Some(change) = changes.recv().await {
        let reread = match change {
            Change::Resync => db.read_all().await.map(Reread::All),
            Change::Changed(name) => db.read(&name).await.map(|r| Reread::One(name, r)),
        };
        match reread {
            Ok(reread) => apply(&inner, reread).await,
            // The request path keeps the last known registrations; the next
            // notice or resync tries again.
            Err(e) => tracing::warn!("cannot reread the shared model registrations: {e}"),
        }
    }
}

/// Brings the book in line with what was reread and has every host pass.
async fn apply(inner: &Inner, reread: Reread) {
    let mut book = inner.book.lock().await;
    let mut removed = Vec::new();
    match reread {
        Reread::All(records) => {
            let fresh: BTreeMap<String, Record> =
                records.into_iter().map(|r| (r.name.clone(), r)).collect();
            if fresh == book.records {
                return;
            }
            removed.extend(
                book.records
                    .keys()
                    .filter(|name| !fresh.contains_key(*name))
                    .cloned(),
            );
            book.records = fresh;
        }
        Reread::One(name, Some(record)) => {
            if book.records.get(&name) == Some(&record) {
                return;
            }
            book.records.insert(name, record);
        }
        Reread::One(name, None) => {
            if book.records.remove(&name).is_none() {
                return;
            }
            removed.push(name);
        }
    }
    // A configured model of the same name stays served.
    let snapshot = inner.snapshot.load();
    removed.retain(|name| !snapshot.policy.models.iter().any(|m| &m.name == name));
    for name in &removed {
        book.refused.remove(name);
        tracing::info!(model = %name, "model unregistered by another replica");
    }
    if !removed.is_empty() {
        inner.table.rcu(|table| {
            let mut next = BTreeMap::clone(table);
            for name in &removed {
                next.remove(name);
            }
            next
        });
    }
    drop(book);
    for sync in &inner.hosts {
        sync.nudge();
    }
}
