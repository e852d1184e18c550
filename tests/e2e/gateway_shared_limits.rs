//! Gateway replicas sharing limits through Redis (`[limits] store`): the
//! machine's Redis on 127.0.0.1:6379 (`BULKHEAD_TEST_REDIS` overrides),
//! reached through a proxy in this test that can stop answering, as a dead
//! Redis or a cut network does, and answer again. Each test keeps its keys
//! under a prefix of its own and deletes them.

use bulkhead_tests::redis::{Keys, Proxy, prefix, redis_addr};
use bulkhead_tests::{Gateway, PolicyDir, gateway_toml};
use serde_json::json;

const MODEL: &str = "bulkhead-demo-tiny";

/// A replica's policy folder: the demo tenant with `limits`, and a Redis
/// store at `store_addr` under `prefix`. The store may take 250 ms (not
/// the default 20): these tests cut Redis off on purpose, and a busy
/// machine must not do it for them.
fn replica_policies(
    name: &str,
    store_addr: &str,
    prefix: &str,
    store: &str,
    limits: &str,
) -> PolicyDir {
    let policies = PolicyDir::new(name);
    policies.write(
        "gateway.toml",
        &format!(
            "{}{}\n[limits]\nstore = \"redis://{store_addr}/0\"\nkey_prefix = \"{prefix}\"\n\
             store_timeout_ms = 250\n{store}\n",
            gateway_toml(""),
            policies.state_tables()
        ),
    );
    policies.set_demo_limits(limits);
    policies
}

fn completion() -> String {
    json!({"model": MODEL, "prompt": "Emma was", "max_tokens": 1, "temperature": 0}).to_string()
}

fn complete(gateway: &Gateway, token: &str) -> bulkhead_tests::Response {
    gateway.request("POST", "/v1/completions", Some(token), Some(&completion()))
}

#[test]
fn two_replicas_admit_one_burst_between_them() {
    let prefix = prefix("burst");
    let _keys = Keys(prefix.clone());
    let store = "replicas = 2";
    // 1 request a minute at most refills during the test: the burst is
    // what both replicas together may admit.
    let limits = "requests_per_s = 1\nburst = 4\ntokens_per_min = 100000";
    let a_policies = replica_policies("shared-a", &redis_addr(), &prefix, store, limits);
    let b_policies = replica_policies("shared-b", &redis_addr(), &prefix, store, limits);
    let a = Gateway::start(&a_policies);
    let b = Gateway::start(&b_policies);
    let token = a_policies.token("demo", &[]);
    assert_eq!(a.metric("bulkhead_limit_store_up", &[]), 1.0);

    let mut admitted = 0;
    let mut refused = None;
    // With the memory store each replica would admit 4: 8 in all.
    for i in 0..8 {
        let replica = if i % 2 == 0 { &a } else { &b };
        let r = complete(replica, &token);
        match r.status {
            200 => admitted += 1,
            429 => {
                refused.get_or_insert(r);
            }
            other => panic!("{other}: {}", r.body),
        }
    }
    // 4, plus a cell or two refilled while the requests ran (1 a second).
    assert!((4..=6).contains(&admitted), "{admitted} admitted");
    let refused = refused.expect("the replicas together refuse past the burst");
    assert_eq!(
        refused.error_code(),
        "rate_limit_requests",
        "{}",
        refused.body
    );
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(refused.header("x-ratelimit-limit-requests"), Some("4"));
    assert!(refused.header("retry-after").is_some());
    assert_eq!(a.metric("bulkhead_limit_store_fallbacks_total", &[]), 0.0);
}

#[test]
fn a_dead_store_falls_back_to_each_replicas_share_and_back() {
    let prefix = prefix("fallback");
    let _keys = Keys(prefix.clone());
    let proxy = Proxy::start(&redis_addr());
    let policies = replica_policies(
        "shared-fallback",
        &proxy.addr,
        &prefix,
        "replicas = 2\non_store_error = \"local\"",
        // Alone, this replica may admit a burst of 2 (4 / 2 replicas)
        // while Redis is away.
        "requests_per_s = 1\nburst = 4\ntokens_per_min = 100000",
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    assert_eq!(complete(&gateway, &token).status, 200);
    assert_eq!(gateway.metric("bulkhead_limit_store_up", &[]), 1.0);

    proxy.cut();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(complete(&gateway, &token).status);
    }
    // The first call notices (within store_timeout_ms) and falls back like
    // the rest: this replica's share of the burst, then 429.
    assert_eq!(&statuses[..2], [200, 200], "{statuses:?}");
    assert_eq!(statuses[3], 429, "{statuses:?}");
    assert_eq!(gateway.metric("bulkhead_limit_store_up", &[]), 0.0);
    assert!(
        gateway.metric(
            "bulkhead_limit_store_fallbacks_total",
            &[("tenant", "demo")]
        ) >= 4.0
    );
    assert!(gateway.metric("bulkhead_limit_store_errors_total", &[]) >= 1.0);
    gateway.log.wait_for(
        "the shared limit store stopped answering",
        0,
        std::time::Duration::from_secs(10),
    );

    proxy.heal();
    gateway.eventually("the store answers again", || {
        gateway.metric("bulkhead_limit_store_up", &[]) == 1.0
    });
    gateway.log.wait_for(
        "the shared limit store answers again",
        0,
        std::time::Duration::from_secs(10),
    );
    let fallbacks = gateway.metric("bulkhead_limit_store_fallbacks_total", &[]);
    // Redis's own burst (4, one spent before the cut) decides again.
    let r = complete(&gateway, &token);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        gateway.metric("bulkhead_limit_store_fallbacks_total", &[]),
        fallbacks
    );
    // The log names the store but never a secret or prompt.
    assert!(!gateway.log.text().contains("Emma was"));
}

#[test]
fn deny_answers_503_while_the_store_is_away() {
    let prefix = prefix("deny");
    let _keys = Keys(prefix.clone());
    let proxy = Proxy::start(&redis_addr());
    let policies = replica_policies(
        "shared-deny",
        &proxy.addr,
        &prefix,
        "on_store_error = \"deny\"",
        "requests_per_s = 100\nburst = 100\ntokens_per_min = 100000",
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    assert_eq!(complete(&gateway, &token).status, 200);
    proxy.cut();
    let r = complete(&gateway, &token);
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.error_code(), "limits_unavailable", "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        !r.body.contains(&proxy.addr),
        "the store's address is the operator's business"
    );
    proxy.heal();
    gateway.eventually("admission through the store again", || {
        complete(&gateway, &token).status == 200
    });
}
