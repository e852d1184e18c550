//! Limits shared by gateway replicas through Redis (`[limits] store =
//! "redis://..."`).
//!
//! One script call per admission (`script::ADMIT`) decides the request
//! rate, the concurrency lease and the token reservation for all replicas
//! at once; the reply carries the `x-ratelimit-*` figures. What the request
//! holds then settles without blocking anyone: its token reservation gives
//! back the unused part (or charges the overrun) when it ends, and its
//! lease is renewed every third of `lease_ttl_ms` while the stream lives
//! (one script call per tick for all of this replica's leases) and removed
//! at the end. A replica killed with `kill -9` stops renewing, so its leases
//! drop out within the TTL.
//!
//! A request never waits on Redis longer than `store_timeout_ms`. The first
//! failure marks the store down: from then on admission does not ask Redis
//! at all ([`StoreUnavailable`]; the caller falls back to this replica's own
//! limiters at 1/`replicas` of the rates, or refuses, per `on_store_error`),
//! and a prober pings with backoff (50 ms doubling to 5 s) until Redis
//! answers again. What cannot reach Redis meanwhile errs on the tenant's
//! side of caution: a refund that fails is lost (the tenant is charged its
//! reservation). A lease's removal is sent whatever the mark says, and one
//! Redis does not confirm is sent again when it answers (or, past a bound,
//! lapses with its TTL): a lease left behind would refuse the tenant's
//! requests in its place.

mod lease;
mod script;

#[cfg(test)]
mod tests;

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rand_core::{OsRng, RngCore};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, TlsCertificates};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

pub(crate) use lease::Lease;
use lease::LeaseBook;
use script::{Outcome, Reply, Scripts};

use super::headers::RateLimitHeaders;
use super::store::{OnStoreError, RedisStore};
use super::tenant::{
    concurrency_rejection, never_fits_rejection, rate_rejection, token_rate_rejection, who,
};
use super::tokens::{Bucket, Settle, TokenReservation};
use super::{Admission, Limits, Rejection, Slot};

/// The store did not answer (now, or recently enough that it is not asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the shared limit store is not answering")]
pub struct StoreUnavailable;

/// Limits kept in Redis. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SharedLimits {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: RedisStore,
    client: Client,
    /// Multiplexed: every call clones it. Replaced by the prober after a
    /// failure, so a connection that hangs is never asked again.
    conn: ArcSwap<ConnectionManager>,
    scripts: Scripts,
    /// Whether admission asks Redis (false from the first failure until a
    /// probe succeeds).
    up: AtomicBool,
    /// Wakes the prober when the store goes down (and on drop, to end it).
    wake_prober: Arc<Notify>,
    /// Names this process's leases: random, so a restarted replica never
    /// renews a lease its former self took.
    replica: String,
    next_lease: AtomicU64,
    leases: LeaseBook,
    /// `bulkhead_limit_store_errors_total`.
    errors: Counter,
    /// `bulkhead_limit_store_up`.
    up_gauge: Gauge,
    runtime: tokio::runtime::Handle,
}

/// Longest a probe or a lease renewal waits (they are off the request path).
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl SharedLimits {
    /// Connects to the store (waiting at most a second: a Redis that is down
    /// at start is reported and probed like one that goes down later) and
    /// starts the prober and the lease renewer. `errors` and `up` are the
    /// metrics it keeps.
    pub async fn connect(
        store: RedisStore,
        errors: Counter,
        up: Gauge,
    ) -> Result<SharedLimits, String> {
        let client = client(&store)?;
        let conn = connection(&client).map_err(|e| format!("limit store {}: {e}", store.url))?;
        let inner = Arc::new(Inner {
            client,
            conn: ArcSwap::from_pointee(conn),
            scripts: Scripts::new(),
            up: AtomicBool::new(false),
            wake_prober: Arc::new(Notify::new()),
            replica: replica_id(),
            next_lease: AtomicU64::new(0),
            leases: LeaseBook::default(),
            errors,
            up_gauge: up,
            runtime: tokio::runtime::Handle::current(),
            store,
        });
        match inner.ping().await {
            Ok(()) => inner.recovered(false),
            Err(why) => {
                inner.errors.inc();
                tracing::error!(
                    store = %inner.store.url,
                    error = %why,
                    "the shared limit store does not answer at start; {}",
                    inner.fallback_words(),
                );
                inner.wake_prober.notify_one();
            }
        }
        tokio::spawn(probe(Arc::downgrade(&inner)));
        tokio::spawn(lease::renew(Arc::downgrade(&inner)));
        Ok(SharedLimits { inner })
    }

    /// Whether admission asks the store now.
    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Acquire)
    }

    /// What to do while it is down.
    pub fn on_error(&self) -> OnStoreError {
        self.inner.store.on_error
    }

    /// Admits one request of `tenant` under its `limits` (the tenant's whole
    /// limits: the store is shared), like [`super::Limiters::admit`].
    pub async fn admit(
        &self,
        tenant: &str,
        limits: &Limits,
        sub: Option<&str>,
        estimated_tokens: u64,
    ) -> Result<Result<Admission, Rejection>, StoreUnavailable> {
        let inner = &self.inner;
        if !inner.up.load(Ordering::Acquire) {
            return Err(StoreUnavailable);
        }
        let emission_us = 1_000_000_u64.div_ceil(u64::from(limits.requests_per_s.max(1)));
        let keys = Keys::new(&inner.store.key_prefix, tenant, limits, emission_us);
        let rate_key = match (limits.per_sub, sub) {
            (true, sub) => keys.rate_of(sub.unwrap_or("")),
            (false, _) => keys.rate.clone(),
        };
        let serial = inner.next_lease.fetch_add(1, Ordering::Relaxed);
        let member: Arc<str> = format!("{}:{serial}", inner.replica).into();
        let mut call = inner.scripts.admit.prepare_invoke();
        call.key(&rate_key)
            .key(&keys.tokens)
            .key(&*keys.leases)
            .arg(emission_us)
            .arg(limits.burst.max(1))
            .arg(limits.tokens_per_min.max(1))
            .arg(estimated_tokens)
            .arg(limits.max_concurrent.max(1))
            .arg(&*member)
            .arg(millis(inner.store.lease_ttl));
        let mut conn = ConnectionManager::clone(&inner.conn.load());
        let answer = tokio::time::timeout(
            inner.store.timeout,
            call.invoke_async::<Vec<i64>>(&mut conn),
        )
        .await;
        let reply = match answer {
            Ok(Ok(values)) => match Reply::decode(&values) {
                Some(reply) => reply,
                None => {
                    inner.failed(format!(
                        "unexpected reply to the admission script: {values:?}"
                    ));
                    return Err(StoreUnavailable);
                }
            },
            Ok(Err(e)) => {
                inner.failed(e);
                return Err(StoreUnavailable);
            }
            Err(_) => {
                inner.failed(format!(
                    "no answer within store_timeout_ms ({} ms)",
                    inner.store.timeout.as_millis()
                ));
                let sink = TokenSink {
                    inner: Arc::clone(inner),
                    key: keys.tokens,
                    capacity: limits.tokens_per_min.max(1),
                };
                inner.undo_unanswered(keys.leases, member, sink, estimated_tokens);
                return Err(StoreUnavailable);
            }
        };
        let headers = RateLimitHeaders {
            limit_requests: limits.burst,
            remaining_requests: reply.requests_remaining,
            reset_requests: reply.requests_reset,
            limit_tokens: limits.tokens_per_min,
            remaining_tokens: reply.tokens_remaining,
            reset_tokens: reply.tokens_reset,
        };
        Ok(match reply.outcome {
            Outcome::Admitted => {
                let lease = Lease::new(Arc::clone(&self.inner), serial, keys.leases, member);
                let sink = TokenSink {
                    inner: Arc::clone(&self.inner),
                    key: keys.tokens,
                    capacity: limits.tokens_per_min.max(1),
                };
                Ok(Admission {
                    headers,
                    tokens: TokenReservation::new(Bucket::Shared(Box::new(sink)), estimated_tokens),
                    _slot: Slot::Shared(lease),
                })
            }
            Outcome::RequestRate => Err(rate_rejection(
                &who(tenant, sub, limits.per_sub),
                limits.requests_per_s,
                reply.retry_after,
                headers,
            )),
            Outcome::Concurrency => Err(concurrency_rejection(
                tenant,
                limits.max_concurrent,
                headers,
            )),
            Outcome::TooManyTokens => Err(never_fits_rejection(tenant, estimated_tokens, headers)),
            Outcome::TokenRate => Err(token_rate_rejection(
                tenant,
                estimated_tokens,
                reply.tokens_available,
                reply.retry_after,
                headers,
            )),
        })
    }
}

impl Inner {
    async fn ping(&self) -> Result<(), String> {
        let mut conn = ConnectionManager::clone(&self.conn.load());
        let command = redis::cmd("PING");
        let ping = command.query_async::<String>(&mut conn);
        match tokio::time::timeout(BACKGROUND_TIMEOUT, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {BACKGROUND_TIMEOUT:?}")),
        }
    }

    /// A call failed: count it and, if the store was up, mark it down and
    /// start probing.
    ///
    /// One failure is enough, a reply later than `store_timeout_ms`
    /// included. A timeout cannot tell a Redis that is slow from one that
    /// hangs, and waiting for several in a row would make every request in
    /// flight meanwhile (hundreds, under load) pay the full timeout on each
    /// outage before the mark spares the next ones. Where late replies come
    /// from a starved machine rather than Redis, the calls in flight tend
    /// to be late together (this process's own threads were late to read
    /// them), so a count would spare few marks. A mark set by a late reply
    /// is made cheap instead: the prober's first ping goes out at once and
    /// lifts it within a round trip, and lease removals and the undoing of
    /// late admissions go out whatever the mark says.
    fn failed(&self, why: impl Display) {
        self.errors.inc();
        if self.up.swap(false, Ordering::AcqRel) {
            self.up_gauge.set(0);
            tracing::warn!(
                store = %self.store.url,
                error = %why,
                "the shared limit store stopped answering; {}",
                self.fallback_words(),
            );
            self.wake_prober.notify_one();
        } else {
            tracing::debug!(store = %self.store.url, error = %why, "limit store call failed");
        }
    }

    fn recovered(&self, was_down: bool) {
        self.up.store(true, Ordering::Release);
        self.up_gauge.set(1);
        if was_down {
            tracing::info!(store = %self.store.url, "the shared limit store answers again");
        }
    }

    fn fallback_words(&self) -> String {
        match self.store.on_error {
            OnStoreError::Local => format!(
                "admitting with this replica's own limits at 1/{} of each tenant's until it answers",
                self.store.replicas
            ),
            OnStoreError::Deny => "refusing requests (503) until it answers".to_string(),
        }
    }

    /// Runs `work` off the request path (settling, releasing).
    fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        self.runtime.spawn(work);
    }

    /// Undoes an admission whose answer did not come in time, if Redis ran
    /// it after all (the request was admitted locally instead): its lease
    /// member is removed, and when there was one (the script admitted),
    /// its token reservation is given back. Without this a slow Redis
    /// would hold a lease per unanswered call until the TTL, and under
    /// load they pile up to the tenant's concurrency limit. Calls on one
    /// connection run in order, so this runs after the admission if that
    /// ran at all.
    fn undo_unanswered(
        self: &Arc<Self>,
        leases: Arc<str>,
        member: Arc<str>,
        tokens: TokenSink,
        reserved: u64,
    ) {
        let inner = Arc::clone(self);
        self.spawn(async move {
            // Sent again later if Redis does not confirm it now (the
            // reservation is then lost: the tenant's side of caution).
            if lease::release(&inner, leases, member).await == Some(1) {
                tokens.settle_now(i128::from(reserved)).await;
            }
        });
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ends the prober if it waits.
        self.wake_prober.notify_one();
    }
}

/// Waits for the store to go down, then pings with backoff until it
/// answers; ends when the store is dropped.
async fn probe(inner: Weak<Inner>) {
    loop {
        {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            // Outlives the store, which notifies it on drop.
            let notify = Arc::clone(&strong.wake_prober);
            let wake = notify.notified();
            tokio::pin!(wake);
            wake.as_mut().enable();
            if strong.up.load(Ordering::Acquire) {
                drop(strong);
                wake.await;
            }
        }
        let mut backoff = FIRST_BACKOFF;
        loop {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            if strong.up.load(Ordering::Acquire) {
                break;
            }
            match strong.ping().await {
                Ok(()) => {
                    strong.recovered(true);
                    lease::release_unconfirmed(&strong).await;
                    break;
                }
                Err(why) => {
                    tracing::debug!(error = %why, "limit store probe failed");
                    // The next probe, and every call after it, on a fresh
                    // connection.
                    if let Ok(fresh) = connection(&strong.client) {
                        strong.conn.store(Arc::new(fresh));
                    }
                }
            }
            drop(strong);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// Gives a request's unused tokens back to the shared bucket (or charges
/// an overrun), off the request path.
#[derive(Debug)]
struct TokenSink {
    inner: Arc<Inner>,
    key: String,
    capacity: u64,
}

impl TokenSink {
    /// Gives `tokens` back (or charges them) now, on this task.
    async fn settle_now(&self, tokens: i128) {
        let Ok(tokens) = i64::try_from(tokens) else {
            return;
        };
        let mut call = self.inner.scripts.settle.prepare_invoke();
        call.key(&self.key).arg(self.capacity).arg(tokens);
        let mut conn = ConnectionManager::clone(&self.inner.conn.load());
        let done = call.invoke_async::<i64>(&mut conn);
        match tokio::time::timeout(BACKGROUND_TIMEOUT, done).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => self.inner.failed(e),
            Err(_) => self.inner.failed("no answer to a token settlement"),
        }
    }
}

impl Settle for TokenSink {
    fn settle(&self, tokens: i128) {
        if tokens == 0 || !self.inner.up.load(Ordering::Acquire) {
            return;
        }
        let sink = TokenSink {
            inner: Arc::clone(&self.inner),
            key: self.key.clone(),
            capacity: self.capacity,
        };
        self.inner
            .spawn(async move { sink.settle_now(tokens).await });
    }
}

/// A tenant's keys. The `{t:TENANT}` hash tag puts them in one cluster
/// slot, so one script may touch them all.
struct Keys {
    /// The tenant's request rate (without `per_sub`).
    rate: String,
    tokens: String,
    leases: Arc<str>,
}

impl Keys {
    /// The keys of `tenant` under `limits`. The rate and token keys name
    /// the limits they count against: a reload that changes them starts
    /// from a full bucket, as the memory store does, rather than carrying
    /// debt taken at the old rate (the old keys expire on their own).
    fn new(prefix: &str, tenant: &str, limits: &Limits, emission_us: u64) -> Keys {
        let base = format!("{prefix}:{{t:{tenant}}}");
        Keys {
            rate: format!("{base}:rate:{emission_us}x{}", limits.burst.max(1)),
            tokens: format!("{base}:tokens:{}", limits.tokens_per_min.max(1)),
            leases: format!("{base}:leases").into(),
        }
    }

    /// A subject's request-rate key, named by the SHA-256 of its `sub` (a
    /// tenant chooses its subjects; the digest bounds the key's size).
    fn rate_of(&self, sub: &str) -> String {
        use std::fmt::Write;
        let digest = Sha256::digest(sub.as_bytes());
        let mut key = String::with_capacity(self.rate.len() + 65);
        key.push_str(&self.rate);
        key.push(':');
        for byte in digest {
            // Writing into a String cannot fail.
            let _ = write!(key, "{byte:02x}");
        }
        key
    }
}

/// A connection manager that connects on first use and gives up on a
/// call after [`BACKGROUND_TIMEOUT`] (request-path calls time out sooner,
/// on their own).
fn connection(client: &Client) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(BACKGROUND_TIMEOUT))
        .set_response_timeout(Some(BACKGROUND_TIMEOUT))
        .set_number_of_retries(1)
        .set_max_delay(BACKGROUND_TIMEOUT);
    ConnectionManager::new_lazy_with_config(client.clone(), config)
}

/// The client for `store`: its URL, the password from its file and, for
/// `rediss://` with `tls_ca`, those roots.
fn client(store: &RedisStore) -> Result<Client, String> {
    let fail = |e: redis::RedisError| format!("limit store {}: {e}", store.url);
    let mut info = store.url.as_str().into_connection_info().map_err(fail)?;
    if let Some(password) = &store.password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    match &store.tls_ca {
        Some(pem) => Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        )
        .map_err(fail),
        None => Client::open(info).map_err(fail),
    }
}

fn replica_id() -> String {
    let mut bytes = [0_u8; 8];
    OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
