//! Concurrency leases: an admitted request's place in its tenant's lease
//! set in Redis, renewed while it lives and removed when it ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::{BACKGROUND_TIMEOUT, Inner, millis};

/// The leases this replica holds, by serial: what the renewer extends.
#[derive(Debug, Default)]
pub(super) struct LeaseBook {
    live: Mutex<Live>,
}

/// Lease serial → (lease-set key, member).
type Live = HashMap<u64, (Arc<str>, Arc<str>)>;

impl LeaseBook {
    fn insert(&self, serial: u64, key: Arc<str>, member: Arc<str>) {
        self.lock().insert(serial, (key, member));
    }

    fn remove(&self, serial: u64) {
        self.lock().remove(&serial);
    }

    /// Members by lease-set key.
    fn by_key(&self) -> BTreeMap<Arc<str>, Vec<Arc<str>>> {
        let mut grouped: BTreeMap<Arc<str>, Vec<Arc<str>>> = BTreeMap::new();
        for (key, member) in self.lock().values() {
            grouped
                .entry(Arc::clone(key))
                .or_default()
                .push(Arc::clone(member));
        }
        grouped
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        // Inserts and removes cannot leave the map half changed.
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One admitted request's lease; removed from Redis on drop (off the
/// request path).
#[derive(Debug)]
pub(crate) struct Lease {
    inner: Arc<Inner>,
    serial: u64,
    key: Arc<str>,
    member: Arc<str>,
}

impl Lease {
    /// Lease `serial` (unique in this process), member `member` of `key`.
    pub(super) fn new(inner: Arc<Inner>, serial: u64, key: Arc<str>, member: Arc<str>) -> Lease {
        inner
            .leases
            .insert(serial, Arc::clone(&key), Arc::clone(&member));
        Lease {
            inner,
            serial,
            key,
            member,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.inner.leases.remove(self.serial);
        if !self.inner.up.load(Ordering::Acquire) {
            // Redis is down: the lease lapses with its TTL.
            return;
        }
        let inner = Arc::clone(&self.inner);
        let key = Arc::clone(&self.key);
        let member = Arc::clone(&self.member);
        self.inner.spawn(async move {
            let mut conn = redis::aio::ConnectionManager::clone(&inner.conn.load());
            let mut command = redis::cmd("ZREM");
            command.arg(&*key).arg(&*member);
            let release = command.query_async::<i64>(&mut conn);
            match tokio::time::timeout(BACKGROUND_TIMEOUT, release).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => inner.failed(e),
                Err(_) => inner.failed("no answer to a lease release"),
            }
        });
    }
}

/// Every third of the lease TTL, extends all of this replica's live leases
/// in one script call; ends when the store is dropped.
pub(super) async fn renew(inner: Weak<Inner>) {
    let period = match inner.upgrade() {
        Some(inner) => inner.store.lease_ttl / 3,
        None => return,
    };
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if !inner.up.load(Ordering::Acquire) {
            continue;
        }
        let grouped = inner.leases.by_key();
        if grouped.is_empty() {
            continue;
        }
        let mut call = inner.scripts.renew.prepare_invoke();
        call.arg(millis(inner.store.lease_ttl));
        for (key, members) in &grouped {
            call.key(&**key).arg(members.len());
            for member in members {
                call.arg(&**member);
            }
        }
        let mut conn = redis::aio::ConnectionManager::clone(&inner.conn.load());
        let done = call.invoke_async::<i64>(&mut conn);
        match tokio::time::timeout(BACKGROUND_TIMEOUT, done).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => inner.failed(e),
            Err(_) => inner.failed("no answer to a lease renewal"),
        }
    }
}
