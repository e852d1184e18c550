//! Against the machine's Redis (127.0.0.1:6379; `BULKHEAD_TEST_REDIS`
//! overrides), each test under a key prefix of its own that it deletes
//! when done. Several `SharedLimits` on one store stand for replicas.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::*;
use crate::limits::RejectReason;

fn redis_addr() -> String {
    std::env::var("BULKHEAD_TEST_REDIS").unwrap_or_else(|_| "127.0.0.1:6379".into())
}

/// A unique key prefix, deleted (all keys under it) on drop.
struct Prefix(String);

impl Prefix {
    fn new(test: &str) -> Prefix {
        let mut bytes = [0_u8; 6];
        OsRng.fill_bytes(&mut bytes);
        let tag: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Prefix(format!("bh-test-{test}-{tag}"))
    }

    fn keys(&self) -> Vec<String> {
        let client = Client::open(format!("redis://{}/", redis_addr())).expect("url");
        let mut conn = client.get_connection().expect("test Redis answers");
        redis::cmd("KEYS")
            .arg(format!("{}:*", self.0))
            .query(&mut conn)
            .expect("KEYS")
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let keys = self.keys();
        if keys.is_empty() {
            return;
        }
        let client = Client::open(format!("redis://{}/", redis_addr())).expect("url");
        if let Ok(mut conn) = client.get_connection() {
            let _: Result<i64, _> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

fn store(addr: &str, prefix: &Prefix) -> RedisStore {
    RedisStore {
        url: format!("redis://{addr}/"),
        password: None,
        tls_ca: None,
        key_prefix: prefix.0.clone(),
        replicas: 3,
        on_error: OnStoreError::Local,
        timeout: Duration::from_millis(200),
        lease_ttl: Duration::from_secs(15),
    }
}

async fn replica(store: RedisStore) -> SharedLimits {
    SharedLimits::connect(store, Counter::default(), Gauge::default())
        .await
        .expect("a valid store")
}

fn limits(rps: u32, burst: u32, tokens_per_min: u64, max_concurrent: u32) -> Limits {
    Limits {
        requests_per_s: rps,
        burst,
        tokens_per_min,
        max_concurrent,
        ..Limits::DEFAULT
    }
}

async fn admit(
    replica: &SharedLimits,
    limits: &Limits,
    tokens: u64,
) -> Result<Admission, Rejection> {
    replica
        .admit("acme", limits, None, tokens)
        .await
        .expect("the store answers")
}

/// Polls `check` until it holds (settlements run after the request, off
/// its path); panics after 5 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_request_burst() {
    let prefix = Prefix::new("burst");
    let a = replica(store(&redis_addr(), &prefix)).await;
    let b = replica(store(&redis_addr(), &prefix)).await;
    assert!(a.is_up() && b.is_up());
    // 1 request/s, burst 4: four in a row pass whichever replica takes
    // them, the fifth is refused.
    let limits = limits(1, 4, 1_000_000, 100);
    let mut held = Vec::new();
    for (i, replica) in [&a, &b, &a, &b].into_iter().enumerate() {
        let admission = admit(replica, &limits, 1).await.expect("within the burst");
        assert_eq!(admission.headers().limit_requests, 4);
        assert_eq!(admission.headers().remaining_requests, 3 - i as u32);
        held.push(admission);
    }
    let refused = admit(&a, &limits, 1).await.expect_err("over the burst");
    assert_eq!(refused.reason, RejectReason::RequestRate);
    assert_eq!(refused.headers.remaining_requests, 0);
    let retry = refused.retry_after.expect("a rate refusal says when");
    assert!(retry > Duration::from_millis(900) && retry <= Duration::from_secs(1));
    assert!(refused.message.contains("request rate of 1/s (burst 4)"));
    assert!(
        refused
            .to_header_pairs()
            .contains(&("retry-after", "1".into())),
        "{:?}",
        refused.to_header_pairs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_limits_start_from_a_full_bucket() {
    // As a reload does in memory: debt taken at the old rate does not
    // hold back the new one, and the same limits keep their state.
    let prefix = Prefix::new("retune");
    let a = replica(store(&redis_addr(), &prefix)).await;
    let slow = limits(1, 2, 1_000_000, 100);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(admit(&a, &slow, 1).await.expect("within the burst"));
    }
    assert!(
        admit(&a, &slow, 1).await.is_err(),
        "the slow burst is spent"
    );
    let fast = limits(1000, 1000, 1_000_000, 100);
    let admission = admit(&a, &fast, 1)
        .await
        .expect("a new limit, a new bucket");
    assert_eq!(admission.headers().remaining_requests, 999);
    held.push(admission);
    assert!(
        admit(&a, &slow, 1).await.is_err(),
        "back to the old limits: their state is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_subject_rates_are_separate_and_keys_are_digests() {
    let prefix = Prefix::new("sub");
    let a = replica(store(&redis_addr(), &prefix)).await;
    let limits = Limits {
        per_sub: true,
        ..limits(1, 1, 1_000_000, 100)
    };
    let first = a.admit("acme", &limits, Some("alice"), 1).await.unwrap();
    first.expect("alice's first");
    let refused = a.admit("acme", &limits, Some("alice"), 1).await.unwrap();
    let refused = refused.expect_err("alice's second is over her rate");
    assert!(refused.message.contains("subject `alice` of tenant `acme`"));
    let bob = a.admit("acme", &limits, Some("bob"), 1).await.unwrap();
    bob.expect("bob has his own rate");
    let keys = prefix.keys();
    assert!(
        keys.iter()
            .all(|k| !k.contains("alice") && !k.contains("bob")),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_reserved_across_replicas_and_the_unused_part_refunded() {
    let prefix = Prefix::new("tokens");
    let a = replica(store(&redis_addr(), &prefix)).await;
    let b = replica(store(&redis_addr(), &prefix)).await;
    let limits = limits(1000, 1000, 1000, 100);
    let big = admit(&a, &limits, 600).await.expect("600 of 1000 fit");
    assert_eq!(big.headers().remaining_tokens, 400);
    let short = admit(&b, &limits, 500).await.expect_err("400 are left");
    assert_eq!(short.reason, RejectReason::TokenRate);
    assert!(short.message.contains("500 tokens, 400 are available"));
    // 100 missing tokens at 1000/min: 6 s.
    let retry = short.retry_after.expect("when");
    assert!(retry > Duration::from_millis(5900) && retry <= Duration::from_secs(6));
    let never = admit(&b, &limits, 1001)
        .await
        .expect_err("over a minute's budget");
    assert_eq!(never.reason, RejectReason::TooManyTokens);
    assert_eq!(never.retry_after, None);

    // 100 of the 600 used: 500 come back when the request ends.
    big.tokens().record_used(100);
    drop(big);
    eventually("the refund", async || match admit(&b, &limits, 850).await {
        Ok(_) => true,
        Err(e) => {
            assert_eq!(e.reason, RejectReason::TokenRate);
            false
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_exact_count_is_charged_at_once() {
    let prefix = Prefix::new("charge");
    let a = replica(store(&redis_addr(), &prefix)).await;
    let limits = limits(1000, 1000, 1000, 100);
    let admission = admit(&a, &limits, 100).await.expect("fits");
    // The exact prompt turned out larger: 700 held now.
    admission.tokens().set_reserved(700);
    eventually("the charge", async || match admit(&a, &limits, 301).await {
        Ok(_) => false,
        Err(e) => e.reason == RejectReason::TokenRate,
    })
    .await;
    drop(admission);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_counted_across_replicas_and_freed_at_the_end() {
    let prefix = Prefix::new("conc");
    let a = replica(store(&redis_addr(), &prefix)).await;
    let b = replica(store(&redis_addr(), &prefix)).await;
    let limits = limits(1000, 1000, 1_000_000, 2);
    let first = admit(&a, &limits, 1).await.expect("one");
    let _second = admit(&b, &limits, 1).await.expect("two");
    let third = admit(&a, &limits, 1).await.expect_err("a third");
    assert_eq!(third.reason, RejectReason::Concurrency);
    assert_eq!(third.retry_after, Some(Duration::from_secs(1)));
    drop(first);
    eventually("the release", async || admit(&b, &limits, 1).await.is_ok()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_leases_lapse_and_a_live_ones_are_renewed() {
    let prefix = Prefix::new("lease");
    let ttl = Duration::from_millis(600);
    let short_ttl = RedisStore {
        lease_ttl: ttl,
        ..store(&redis_addr(), &prefix)
    };
    let limits = limits(1000, 1000, 1_000_000, 1);
    let survivor = replica(short_ttl.clone()).await;

    // A live lease outlasts several TTLs: the renewer extends it.
    let held = admit(&survivor, &limits, 1).await.expect("the only slot");
    tokio::time::sleep(ttl * 3).await;
    let refused = admit(&survivor, &limits, 1).await;
    assert_eq!(
        refused.expect_err("still held").reason,
        RejectReason::Concurrency
    );
    drop(held);
    eventually("the release", async || {
        admit(&survivor, &limits, 1).await.is_ok()
    })
    .await;

    // A replica that dies holding a lease (as with `kill -9`: no release,
    // and its runtime, renewer included, is gone): the slot frees within
    // the TTL.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let doomed = replica(short_ttl).await;
            // The survivor's last probe above was admitted and dropped; its
            // release reaches Redis a moment later.
            let mut taken = None;
            eventually("the doomed replica's admission", async || {
                taken = admit(&doomed, &limits, 1).await.ok();
                taken.is_some()
            })
            .await;
            std::mem::forget(taken);
        });
        runtime.shutdown_background();
    })
    .join()
    .expect("the doomed replica");
    let died_at = Instant::now();
    let refused = admit(&survivor, &limits, 1).await;
    assert_eq!(
        refused.expect_err("held by the dead").reason,
        RejectReason::Concurrency
    );
    eventually("the lease's lapse", async || {
        admit(&survivor, &limits, 1).await.is_ok()
    })
    .await;
    // Renewals stopped with the replica; the lease lapsed a TTL after its
    // last renewal, so within two TTLs of the death.
    assert!(died_at.elapsed() < ttl * 2 + Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_never_admit_more_than_the_limits_together() {
    let prefix = Prefix::new("race");
    let store = store(&redis_addr(), &prefix);
    let replicas = [
        replica(store.clone()).await,
        replica(store.clone()).await,
        replica(store).await,
    ];
    // 1 request/s with a burst of 40, 5 at once, 64 callers.
    let limits = limits(1, 40, 10_000_000, 5);
    let in_flight = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let admitted = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for caller in 0..64 {
        let replica = replicas[caller % 3].clone();
        let (in_flight, peak, admitted) = (
            Arc::clone(&in_flight),
            Arc::clone(&peak),
            Arc::clone(&admitted),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                if let Ok(admission) = admit(&replica, &limits, 1).await {
                    let now = in_flight.fetch_add(1, Ordering::AcqRel) + 1;
                    peak.fetch_max(now, Ordering::AcqRel);
                    admitted.fetch_add(1, Ordering::AcqRel);
                    tokio::task::yield_now().await;
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                    drop(admission);
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("caller");
    }
    assert!(peak.load(Ordering::Acquire) <= 5, "{peak:?}");
    // 256 tries in well under a second: the burst, plus a cell or so
    // refilled meanwhile.
    let admitted = admitted.load(Ordering::Acquire);
    assert!(admitted >= 5, "{admitted}");
    assert!(admitted <= 42, "{admitted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_is_down_at_start_is_reported_and_never_waited_on() {
    let prefix = Prefix::new("down");
    // Nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let errors = Counter::default();
    let up = Gauge::default();
    let shared = SharedLimits::connect(store(&addr, &prefix), errors.clone(), up.clone())
        .await
        .expect("a valid URL");
    assert!(!shared.is_up());
    assert_eq!(up.get(), 0);
    assert!(errors.get() >= 1);
    let started = Instant::now();
    let answer = shared.admit("acme", &limits(1, 1, 1, 1), None, 1).await;
    assert_eq!(answer.err(), Some(StoreUnavailable));
    assert!(started.elapsed() < Duration::from_millis(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_costs_a_request_at_most_the_timeout() {
    let prefix = Prefix::new("hang");
    let proxy = Proxy::start(&redis_addr()).await;
    let errors = Counter::default();
    let up = Gauge::default();
    let store = RedisStore {
        timeout: Duration::from_millis(100),
        ..store(&proxy.addr, &prefix)
    };
    let shared = SharedLimits::connect(store, errors.clone(), up.clone())
        .await
        .expect("valid");
    let limits = limits(1000, 1000, 1_000_000, 100);
    admit_once_up(&shared, &limits, 1)
        .await
        .expect("through the proxy");
    assert_eq!(up.get(), 1);

    // Redis stops answering (the proxy swallows everything).
    proxy.hang();
    let started = Instant::now();
    let answer = shared.admit("acme", &limits, None, 1).await;
    assert_eq!(answer.err(), Some(StoreUnavailable));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(!shared.is_up());
    assert_eq!(up.get(), 0);
    // Now down: not asked at all.
    let started = Instant::now();
    assert!(shared.admit("acme", &limits, None, 1).await.is_err());
    assert!(started.elapsed() < Duration::from_millis(20));

    // It answers again: the prober finds out and admission goes back to it.
    proxy.heal();
    eventually("the store's return", async || shared.is_up()).await;
    assert_eq!(up.get(), 1);
    admit(&shared, &limits, 1)
        .await
        .expect("through the store again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_answered_too_late_is_undone() {
    // Redis runs the script but its answer misses store_timeout_ms: the
    // request was admitted locally, so the lease the script took is
    // removed and its token reservation given back, not held for the TTL.
    // The timeout is generous for a loaded machine; only the slowed call
    // (ten times the timeout) must miss it.
    let prefix = Prefix::new("late");
    let proxy = Proxy::start(&redis_addr()).await;
    let store = RedisStore {
        timeout: Duration::from_millis(100),
        ..store(&proxy.addr, &prefix)
    };
    let shared = replica(store).await;
    let limits = limits(1000, 1000, 1000, 100);
    drop(admit_once_up(&shared, &limits, 1).await);
    proxy.slow(1000);
    // Half the bucket, so the script admits whatever the first request's
    // settlement left.
    let answer = shared.admit("acme", &limits, None, 500).await;
    assert_eq!(answer.err(), Some(StoreUnavailable));
    let leases = format!("{}:{{t:acme}}:leases", prefix.0);
    let client = Client::open(format!("redis://{}/", redis_addr())).expect("url");
    let mut conn = client.get_connection().expect("test Redis answers");
    let mut count = || -> i64 { redis::cmd("ZCARD").arg(&leases).query(&mut conn).unwrap() };
    // Without the undo the lease would stay for the TTL (15 s) and the
    // bucket would stay empty for a minute.
    eventually("the late lease's removal", async || count() == 0).await;
    proxy.slow(0);
    eventually("the store's return", async || shared.is_up()).await;
    // The whole bucket again: the reservation came back.
    admit_once_up(&shared, &limits, 1000)
        .await
        .expect("the late admission's 500 tokens were given back");
}

/// [`admit`], asked again while the store is marked down (a call that
/// missed the timeout on a busy machine marks it so); panics after 5 s.
async fn admit_once_up(
    replica: &SharedLimits,
    limits: &Limits,
    tokens: u64,
) -> Result<Admission, Rejection> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match replica.admit("acme", limits, None, tokens).await {
            Ok(answer) => return answer,
            Err(StoreUnavailable) => assert!(
                Instant::now() < deadline,
                "the store did not answer within 5 s"
            ),
        }
        eventually("the store's return", async || replica.is_up()).await;
    }
}

/// How many members the tenant `acme`'s lease set under `prefix` has, read
/// straight from Redis.
fn lease_members(prefix: &Prefix) -> i64 {
    let leases = format!("{}:{{t:acme}}:leases", prefix.0);
    let client = Client::open(format!("redis://{}/", redis_addr())).expect("url");
    let mut conn = client.get_connection().expect("test Redis answers");
    redis::cmd("ZCARD").arg(&leases).query(&mut conn).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ended_while_the_store_is_marked_down_is_still_removed() {
    // The soak's case: one late reply marked the store down (Redis itself
    // answers) just as a request ended. Its lease must not hold the
    // tenant's slot for the TTL (15 s) meanwhile.
    let prefix = Prefix::new("marked");
    let shared = replica(store(&redis_addr(), &prefix)).await;
    let limits = limits(1000, 1000, 1_000_000, 1);
    let held = admit(&shared, &limits, 1).await.expect("the only slot");
    assert_eq!(lease_members(&prefix), 1);
    // The mark as `failed` sets it, without waking the prober, so it stays
    // while the lease ends.
    shared.inner.up.store(false, Ordering::Release);
    let ended = Instant::now();
    drop(held);
    eventually("the lease's removal", async || lease_members(&prefix) == 0).await;
    assert!(
        ended.elapsed() < Duration::from_secs(2),
        "{:?}",
        ended.elapsed()
    );
    shared.inner.recovered(true);
    admit(&shared, &limits, 1)
        .await
        .expect("the slot is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_removal_redis_missed_is_sent_again_when_it_answers() {
    // Redis stops answering, a request ends (its removal is lost on the
    // hung connection), Redis answers again: the lease goes at once, not a
    // TTL (15 s) later.
    let prefix = Prefix::new("resend");
    let proxy = Proxy::start(&redis_addr()).await;
    let errors = Counter::default();
    let store = RedisStore {
        timeout: Duration::from_millis(100),
        ..store(&proxy.addr, &prefix)
    };
    let shared = SharedLimits::connect(store, errors.clone(), Gauge::default())
        .await
        .expect("valid");
    let limits = limits(1000, 1000, 1_000_000, 1);
    let held = admit_once_up(&shared, &limits, 1)
        .await
        .expect("the only slot");
    assert_eq!(lease_members(&prefix), 1);

    proxy.hang();
    let answer = shared.admit("acme", &limits, None, 1).await;
    assert_eq!(answer.err(), Some(StoreUnavailable));
    assert!(!shared.is_up());
    let ended = Instant::now();
    drop(held);
    // The removal goes out on the hung connection and waits out its
    // second there in vain.
    tokio::time::sleep(BACKGROUND_TIMEOUT + Duration::from_millis(200)).await;
    assert_eq!(
        lease_members(&prefix),
        1,
        "the removal got through the hang"
    );

    proxy.heal();
    eventually("the lease's removal", async || lease_members(&prefix) == 0).await;
    assert!(
        ended.elapsed() < Duration::from_secs(7),
        "{:?}",
        ended.elapsed()
    );
    eventually("the store's return", async || shared.is_up()).await;
    admit(&shared, &limits, 1)
        .await
        .expect("the slot is free again");
    // Counted: the admission's timeout, the lost removal and the late
    // admission's undo, lost the same way.
    assert!(errors.get() >= 3, "{}", errors.get());
}

/// A TCP proxy to Redis that can be made to swallow traffic (a store that
/// hangs) and to pass it again.
struct Proxy {
    addr: String,
    hung: Arc<AtomicBool>,
    /// Milliseconds each reply from Redis is held before it is passed on.
    slow_ms: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hung = Arc::new(AtomicBool::new(false));
        let slow_ms = Arc::new(AtomicU64::new(0));
        let upstream = upstream.to_string();
        let (flag, slow) = (Arc::clone(&hung), Arc::clone(&slow_ms));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let (hung, slow) = (Arc::clone(&flag), Arc::clone(&slow));
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        pump(client, server, hung, slow).await;
                    }
                });
            }
        });
        Proxy {
            addr,
            hung,
            slow_ms,
            accept,
        }
    }

    /// Holds each reply `ms` before passing it on (a Redis that answers,
    /// late).
    fn slow(&self, ms: u64) {
        self.slow_ms.store(ms, Ordering::Release);
    }

    /// Holds every byte from now on; open connections stay open.
    fn hang(&self) {
        self.hung.store(true, Ordering::Release);
    }

    fn heal(&self) {
        self.hung.store(false, Ordering::Release);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways; while `hung`, reads are held back (never forwarded:
/// dropped, so the connection a hang caught stays broken, as after a real
/// network fault).
async fn pump(client: TcpStream, server: TcpStream, hung: Arc<AtomicBool>, slow: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let copy = async |from: &mut tokio::net::tcp::OwnedReadHalf,
                      to: &mut tokio::net::tcp::OwnedWriteHalf,
                      hung: &AtomicBool,
                      slow: Option<&AtomicU64>| {
        let mut buffer = vec![0_u8; 16 << 10];
        let mut broken = false;
        loop {
            let n = match tokio::io::AsyncReadExt::read(from, &mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            broken |= hung.load(Ordering::Acquire);
            if let Some(ms) = slow.map(|s| s.load(Ordering::Acquire)).filter(|ms| *ms > 0) {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if !broken && to.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(
        copy(&mut client_read, &mut server_write, &hung, None),
        copy(&mut server_read, &mut client_write, &hung, Some(&slow)),
    );
}

/// A Redis of the test's own on a free port, over TLS only (the
/// repository's test certificates: `tests/fixtures/tls`) and with a
/// password: the machine's `redis-server`, stopped on drop.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
}

const TLS_REDIS_PASSWORD: &str = "a-redis-password-for-tests";

fn tls_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/tls")
        .join(name)
}

impl TlsRedis {
    async fn start() -> TlsRedis {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
            .arg("--tls-cert-file")
            .arg(tls_fixture("server.pem"))
            .arg("--tls-key-file")
            .arg(tls_fixture("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(tls_fixture("ca.pem"))
            .args(["--requirepass", TLS_REDIS_PASSWORD])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (the machine's Redis package) starts");
        let redis = TlsRedis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        redis
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_password_from_the_store_settings() {
    let redis = TlsRedis::start().await;
    let prefix = Prefix::new("tls");
    let over_tls = RedisStore {
        url: format!("rediss://127.0.0.1:{}/", redis.port),
        password: Some(TLS_REDIS_PASSWORD.into()),
        tls_ca: Some(std::fs::read(tls_fixture("ca.pem")).unwrap()),
        ..store(&redis_addr(), &prefix)
    };
    let shared = replica(over_tls.clone()).await;
    assert!(shared.is_up());
    let limits = limits(1, 2, 1000, 10);
    admit(&shared, &limits, 10)
        .await
        .expect("admitted over TLS");
    let second = admit(&shared, &limits, 10)
        .await
        .expect("the burst's second");
    assert_eq!(second.headers().remaining_requests, 0);

    // A wrong password, a server certificate the system's roots do not
    // trust, and plain TCP to a TLS port: each leaves the store down
    // (counted and logged), never admitting through it.
    for (what, store) in [
        (
            "a wrong password",
            RedisStore {
                password: Some("not-the-password-at-all".into()),
                ..over_tls.clone()
            },
        ),
        (
            "no CA for the server's certificate",
            RedisStore {
                tls_ca: None,
                ..over_tls.clone()
            },
        ),
        (
            "plain TCP",
            RedisStore {
                url: format!("redis://127.0.0.1:{}/", redis.port),
                tls_ca: None,
                ..over_tls.clone()
            },
        ),
    ] {
        let errors = Counter::default();
        let shared = SharedLimits::connect(store, errors.clone(), Gauge::default())
            .await
            .expect("a valid URL");
        assert!(!shared.is_up(), "{what}: the store is up");
        assert!(errors.get() >= 1, "{what}: no error counted");
        let answer = shared.admit("acme", &limits, None, 1).await;
        assert_eq!(answer.err(), Some(StoreUnavailable), "{what}");
    }
}
