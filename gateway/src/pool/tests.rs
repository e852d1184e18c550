use std::time::Duration;

use bulkhead_protocol::Target;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use super::*;
use crate::reconcile::HostSpec;
use crate::upstream::Supervised;

/// A pool of hosts `h0`, `h1`, … each serving the models listed for it.
/// Their clients are lazy and lead nowhere: these tests never send.
fn pool(models: &[&[&str]]) -> HostPool {
    let syncs: Vec<_> = models
        .iter()
        .enumerate()
        .map(|(i, models)| {
            let (tx, rx) = watch::channel(UpstreamState::Ready);
            std::mem::forget(tx);
            let target = Target::Unix(format!("/nonexistent/h{i}.sock").into());
            let host = Upstream::new(
                &target,
                None,
                None,
                rx.clone(),
                Duration::from_millis(10),
                Supervised::No,
            )
            .unwrap();
            let spec = HostSpec {
                name: format!("h{i}"),
                host,
                state: rx,
                starts: Counter::default(),
            };
            HostSync::for_test(spec, models)
        })
        .collect();
    let targets = (0..models.len()).map(|i| format!("unix:h{i}")).collect();
    HostPool::new(&syncs, targets, Arc::new(Metrics::new()))
}

fn chosen(pool: &HostPool, model: &str, tenant: &str) -> String {
    pool.choose(model, tenant, None)
        .map(|h| h.name().to_string())
        .unwrap_or_default()
}

fn set_load(host: &Host, kv_bytes: u64, kv_bytes_used: u64) {
    host.state.load.store(Arc::new(Some(Load {
        kv_bytes,
        kv_bytes_used,
        ..Load::default()
    })));
}

fn busy(pool: &HostPool, host: usize, n: usize) -> Vec<InFlight> {
    (0..n)
        .map(|_| InFlight::start(&pool.hosts()[host].state, &pool.metrics))
        .collect()
}

#[tokio::test]
async fn the_least_loaded_host_that_holds_the_model_is_chosen() {
    let pool = pool(&[&["m"], &["m"], &["other"]]);
    let _held = busy(&pool, 0, 2);
    assert_eq!(chosen(&pool, "m", "t"), "h1", "fewer in flight");
    let _more = busy(&pool, 1, 3);
    assert_eq!(chosen(&pool, "m", "t"), "h0");
    assert_eq!(chosen(&pool, "other", "t"), "h2", "the only holder");

    // Weighted by free KV: 2 in flight with 3 GiB free beats 3 in flight
    // with 1 GiB free, and loses to it when the first has 0.5 GiB free.
    set_load(&pool.hosts()[0], 4 << 30, 1 << 30);
    set_load(&pool.hosts()[1], 2 << 30, 1 << 30);
    set_load(&pool.hosts()[2], 1 << 30, 0);
    assert_eq!(chosen(&pool, "m", "t"), "h0");
    set_load(&pool.hosts()[0], 4 << 30, (7 << 30) / 2);
    assert_eq!(chosen(&pool, "m", "t"), "h1");
}

#[tokio::test]
async fn ties_are_taken_in_turn() {
    let pool = pool(&[&["m"], &["m"], &["m"]]);
    let picks: BTreeSet<String> = (0..6).map(|_| chosen(&pool, "m", "t")).collect();
    assert_eq!(picks.len(), 3, "{picks:?}");
}

#[tokio::test]
async fn draining_and_ejected_hosts_are_passed_over() {
    let pool = pool(&[&["m"], &["m"]]);
    let metrics = Metrics::new();
    let h0 = &pool.hosts()[0];
    let _held = busy(&pool, 1, 5);
    assert_eq!(chosen(&pool, "m", "t"), "h0");
    h0.eject("connection refused", &metrics);
    assert_eq!(h0.status(), HostStatus::Ejected { for_ms: 0 });
    assert_eq!(chosen(&pool, "m", "t"), "h1", "in rotation beats idle");
    assert!(pool.ready());
    // With every holder out of rotation, the one due back first is tried.
    pool.hosts()[1].eject("timed out", &metrics);
    assert!(!pool.ready());
    assert_eq!(chosen(&pool, "m", "t"), "h0");
    h0.recovered(&metrics);
    assert_eq!(h0.status(), HostStatus::Up);

    // A draining host is never chosen, even as a last resort.
    let deadline = tokio::time::Instant::now();
    assert_eq!(h0.drain(deadline, &metrics).await, (0, 0));
    assert_eq!(h0.status(), HostStatus::Draining);
    assert_eq!(chosen(&pool, "m", "t"), "h1");
    pool.hosts()[1].recovered(&metrics);
    let only_drained = self::pool(&[&["m"]]);
    only_drained.hosts()[0].drain(deadline, &metrics).await;
    assert!(only_drained.choose("m", "t", None).is_none());
    h0.resume(&metrics);
    assert_eq!(chosen(&pool, "m", "t"), "h0");
}

#[tokio::test]
async fn a_retry_goes_to_another_host_that_holds_the_model() {
    let pool = pool(&[&["m"], &[], &["m"]]);
    for _ in 0..4 {
        let first = chosen(&pool, "m", "t");
        let second = pool.choose("m", "t", Some(&first)).unwrap();
        assert_ne!(second.name(), first);
        assert_ne!(second.name(), "h1", "h1 does not hold the model");
    }
    // Before any host is known to hold a model, any may be asked first,
    // but a retry needs one that holds it.
    assert!(!chosen(&pool, "new", "t").is_empty());
    assert!(pool.choose("new", "t", Some("h0")).is_none());
}

#[tokio::test]
async fn a_tenant_goes_where_it_has_a_dedicated_partition() {
    let pool = pool(&[&["m"], &["m"], &["m"]]);
    pool.hosts()[2].set_dedicated(["acme".to_string()].into());
    let _held = busy(&pool, 2, 10);
    for _ in 0..5 {
        assert_eq!(chosen(&pool, "m", "acme"), "h2");
        assert_ne!(chosen(&pool, "m", "beta"), "h2");
    }
}

#[tokio::test]
async fn a_drain_waits_for_the_generations_in_flight() {
    let pool = pool(&[&["m"]]);
    let host = pool.hosts()[0].clone();
    let metrics = Arc::new(Metrics::new());
    let held = busy(&pool, 0, 2);
    let far = tokio::time::Instant::now() + Duration::from_secs(60);
    let drain = {
        let (host, metrics) = (host.clone(), Arc::clone(&metrics));
        tokio::spawn(async move { host.drain(far, &metrics).await })
    };
    // Draining, not drained, while they run.
    tokio::task::yield_now().await;
    assert_eq!(host.status(), HostStatus::Draining);
    let mut held = held;
    held.pop();
    assert!(!drain.is_finished());
    drop(held);
    assert_eq!(drain.await.unwrap(), (2, 0));
    // A deadline ends the wait with what is left.
    let _still = busy(&pool, 0, 1);
    let soon = tokio::time::Instant::now() + Duration::from_millis(20);
    assert_eq!(host.drain(soon, &metrics).await, (1, 1));
}

#[tokio::test]
async fn failed_checks_back_off_to_the_cap_and_an_answer_resets_it() {
    let pool = pool(&[&["m"]]);
    let host = &pool.hosts()[0];
    let metrics = Metrics::new();
    host.failed_check("refused", &metrics);
    let wait = |h: &Host| h.back_at().saturating_duration_since(Instant::now());
    assert!(wait(host) <= EJECT_FIRST);
    for _ in 0..10 {
        host.failed_check("refused", &metrics);
    }
    assert!(wait(host) > EJECT_MOST - Duration::from_secs(1) && wait(host) <= EJECT_MOST);
    assert_eq!(
        metrics
            .gpu_host_ejections
            .get_or_create(&HostLabels { host: "h0".into() })
            .get(),
        1,
        "one ejection, however many checks fail"
    );
    assert_eq!(host.last_error().as_deref(), Some("refused"));
    host.recovered(&metrics);
    assert_eq!(host.status(), HostStatus::Up);
    host.failed_check("refused", &metrics);
    assert!(wait(host) <= EJECT_FIRST, "the backoff starts over");
}
