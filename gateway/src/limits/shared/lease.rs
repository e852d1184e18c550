//! Concurrency leases: an admitted request's place in its tenant's lease
//! set in Redis, renewed while it lives and removed when it ends.
//!
//! A lease's removal goes out whether or not the store is marked up: the
//! mark is set by a single late reply, and on a loaded machine with the
//! default `store_timeout_ms` it comes and goes many times a minute. A
//! removal skipped then held the tenant's slot for the whole TTL (a soak
//! found ~100 members in the set with 12 requests in flight), refusing a
//! tenant near `max_concurrent` meanwhile. A removal Redis does not confirm
//! is kept and sent again as soon as it answers.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use super::{BACKGROUND_TIMEOUT, Inner, millis};

/// Most removals kept for a store that did not confirm them: a long outage
/// under load must not grow this replica's memory without bound (each is a
/// key and a member, ~100 bytes). Past it a lease lapses with its TTL, as
/// every lease would without the retry.
const MAX_UNRELEASED: usize = 16_384;

/// The leases this replica holds, by serial: what the renewer extends.
#[derive(Debug, Default)]
pub(super) struct LeaseBook {
    live: Mutex<Live>,
    /// Removals Redis did not confirm, oldest first.
    unreleased: Mutex<Vec<Unreleased>>,
}

/// Lease serial → (lease-set key, member).
type Live = HashMap<u64, (Arc<str>, Arc<str>)>;

/// A lease whose removal Redis did not confirm.
#[derive(Debug)]
struct Unreleased {
    key: Arc<str>,
    member: Arc<str>,
    /// When it ended: it was last renewed before then, so a TTL later Redis
    /// has dropped it on its own and there is nothing left to remove.
    ended: Instant,
}

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

    /// Keeps `removals` to be sent again (up to [`MAX_UNRELEASED`]).
    fn keep_unreleased(&self, removals: impl IntoIterator<Item = Unreleased>) {
        let mut kept = self.unreleased_lock();
        let room = MAX_UNRELEASED.saturating_sub(kept.len());
        kept.extend(removals.into_iter().take(room));
    }

    /// The kept removals whose leases may still be in Redis (younger than
    /// `ttl`); the rest are forgotten.
    fn take_unreleased(&self, ttl: Duration) -> Vec<Unreleased> {
        let mut taken = std::mem::take(&mut *self.unreleased_lock());
        taken.retain(|r| r.ended.elapsed() < ttl);
        taken
    }

    fn unreleased_lock(&self) -> std::sync::MutexGuard<'_, Vec<Unreleased>> {
        // Pushes and takes cannot leave the list half changed.
        self.unreleased
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
        let inner = Arc::clone(&self.inner);
        let key = Arc::clone(&self.key);
        let member = Arc::clone(&self.member);
        self.inner.spawn(async move {
            let _ = release(&inner, key, member).await;
        });
    }
}

/// Removes `member` from the lease set `key` (off the request path, at
/// most [`BACKGROUND_TIMEOUT`]), whether or not the store is marked up.
/// Returns how many Redis removed (0: it was not there), or `None` when
/// Redis did not confirm: then the removal is kept for
/// [`release_unconfirmed`], and the failure counted.
pub(super) async fn release(inner: &Arc<Inner>, key: Arc<str>, member: Arc<str>) -> Option<i64> {
    let sent_while_up = inner.up.load(Ordering::Acquire);
    let mut conn = ConnectionManager::clone(&inner.conn.load());
    let mut command = redis::cmd("ZREM");
    command.arg(&*key).arg(&*member);
    let removal = command.query_async::<i64>(&mut conn);
    let why = match tokio::time::timeout(BACKGROUND_TIMEOUT, removal).await {
        Ok(Ok(removed)) => return Some(removed),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer to a lease release".to_string(),
    };
    inner.leases.keep_unreleased([Unreleased {
        key,
        member,
        ended: Instant::now(),
    }]);
    if sent_while_up {
        inner.failed(why);
    } else {
        failed_while_down(inner, why);
        // The prober sends the kept removals when the store comes back; if
        // it came back while this one waited, it may have sent them before
        // this one was kept.
        if inner.up.load(Ordering::Acquire) {
            let again = Arc::clone(inner);
            inner.spawn(async move { release_unconfirmed(&again).await });
        }
    }
    None
}

/// Sends the removals Redis did not confirm again, in one pipeline (called
/// when the store answers again). Those it still does not confirm are kept
/// for the next time.
pub(super) async fn release_unconfirmed(inner: &Inner) {
    let removals = inner.leases.take_unreleased(inner.store.lease_ttl);
    if removals.is_empty() {
        return;
    }
    let mut pipe = redis::pipe();
    for removal in &removals {
        pipe.cmd("ZREM")
            .arg(&*removal.key)
            .arg(&*removal.member)
            .ignore();
    }
    let mut conn = ConnectionManager::clone(&inner.conn.load());
    let sent = pipe.query_async::<()>(&mut conn);
    let why = match tokio::time::timeout(BACKGROUND_TIMEOUT, sent).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer to the lease releases sent again".to_string(),
    };
    inner.leases.keep_unreleased(removals);
    inner.failed(why);
}

/// A release sent while the store was already marked down failed: it is
/// counted, and logged only at debug level (under load there is one per
/// request ending, and the mark was already logged). It does not mark the
/// store down again: the mark is the prober's to lift, and this failure
/// says nothing new (it may come from the connection the prober has since
/// replaced).
fn failed_while_down(inner: &Inner, why: impl Display) {
    inner.errors.inc();
    tracing::debug!(store = %inner.store.url, error = %why, "lease release failed");
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
