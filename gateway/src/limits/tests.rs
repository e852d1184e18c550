//! The admission sequence and reloads, through the public API, on a fake clock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use governor::clock::FakeRelativeClock;

use super::*;
use crate::auth::JwtFile;
use crate::policy::{
    GatewaySettings, LocalGpuHost, Policy, SourceFile, TenantPolicy, UpstreamSettings,
};

/// 5 requests/s, burst 10, 1200 tokens/min (20/s), 2 in flight.
const LIMITS: Limits = Limits {
    requests_per_s: 5,
    burst: 10,
    tokens_per_min: 1200,
    max_concurrent: 2,
    max_body_bytes: 1 << 20,
    max_tokens: 512,
    per_sub: false,
};

fn table(tenants: &[(&str, Limits)]) -> (Limiters, FakeRelativeClock) {
    let fake = FakeRelativeClock::default();
    let limiters = Limiters::new(
        tenants.iter().map(|(id, limits)| (*id, limits)),
        LimitClock::fake(fake.clone()),
    );
    (limiters, fake)
}

fn acme(limits: Limits) -> (Limiters, FakeRelativeClock) {
    table(&[("acme", limits)])
}

fn lots_in_flight() -> Limits {
    Limits {
        max_concurrent: 1000,
        ..LIMITS
    }
}

#[test]
fn headers_count_down_request_by_request_and_reset_on_time() {
    let (limiters, clock) = acme(lots_in_flight());
    let mut admissions = Vec::new();
    for expected in (0..10).rev() {
        let admission = limiters.admit("acme", None, 10).expect("within burst");
        let headers = admission.headers();
        assert_eq!(headers.limit_requests, 10);
        assert_eq!(headers.remaining_requests, expected);
        assert_eq!(headers.limit_tokens, 1200);
        assert_eq!(
            headers.remaining_tokens,
            1200 - 10 * (10 - u64::from(expected))
        );
        admissions.push(admission);
    }
    let last = admissions.last().expect("ten").headers().clone();
    assert_eq!(last.reset_requests, Duration::from_secs(2));
    assert_eq!(
        last.reset_tokens,
        Duration::from_secs(5),
        "100 tokens at 20/s"
    );
    for admission in &admissions {
        admission.tokens().record_used(10);
    }
    drop(admissions);

    clock.advance(last.reset_requests.max(last.reset_tokens));
    let fresh = limiters.admit("acme", None, 10).expect("reset");
    assert_eq!(fresh.headers().remaining_requests, 9);
    assert_eq!(fresh.headers().remaining_tokens, 1190);
    assert_eq!(
        fresh.headers().to_header_pairs()[..3],
        [
            ("x-ratelimit-limit-requests", "10".to_owned()),
            ("x-ratelimit-remaining-requests", "9".to_owned()),
            ("x-ratelimit-reset-requests", "200ms".to_owned()),
        ]
    );
}

#[test]
fn request_rate_refusal_says_when_to_retry() {
    let (limiters, clock) = acme(Limits {
        requests_per_s: 1,
        burst: 2,
        ..lots_in_flight()
    });
    let _first = limiters.admit("acme", None, 1).expect("burst");
    let _second = limiters.admit("acme", None, 1).expect("burst");
    let rejection = limiters.admit("acme", None, 1).unwrap_err();
    assert_eq!(rejection.reason, RejectReason::RequestRate);
    assert_eq!(rejection.retry_after, Some(Duration::from_secs(1)));
    assert_eq!(
        rejection.message,
        "tenant `acme` is over its request rate of 1/s (burst 2); retry in 1s"
    );
    assert_eq!(rejection.headers.remaining_requests, 0);
    assert_eq!(rejection.headers.reset_requests, Duration::from_secs(2));
    assert_eq!(rejection.headers.remaining_tokens, 1198);
    let pairs = rejection.to_header_pairs();
    assert!(pairs.contains(&("retry-after", "1".to_owned())));
    assert!(pairs.contains(&("x-ratelimit-remaining-requests", "0".to_owned())));
    assert!(pairs.contains(&("x-ratelimit-reset-requests", "2s".to_owned())));

    clock.advance(Duration::from_secs(1));
    let admitted = limiters.admit("acme", None, 1).expect("a cell came back");
    assert_eq!(admitted.headers().remaining_requests, 0);
}

#[test]
fn token_rate_refusal_names_the_figures() {
    let (limiters, clock) = acme(LIMITS);
    let first = limiters.admit("acme", None, 900).expect("fits");
    assert_eq!(first.headers().remaining_tokens, 300);
    let rejection = limiters.admit("acme", None, 840).unwrap_err();
    assert_eq!(rejection.reason, RejectReason::TokenRate);
    assert_eq!(
        rejection.message,
        "tenant `acme` is over its token rate: this request needs 840 tokens, 300 are \
         available; retry in 27s"
    );
    assert_eq!(rejection.retry_after, Some(Duration::from_secs(27)));
    assert_eq!(rejection.headers.remaining_tokens, 300);
    assert_eq!(rejection.headers.reset_tokens, Duration::from_secs(45));
    assert_eq!(
        rejection.headers.remaining_requests, 8,
        "the cell stays spent"
    );
    assert_eq!(
        limiters.in_flight("acme"),
        Some(1),
        "the slot was given back"
    );
    assert!(
        rejection
            .to_header_pairs()
            .contains(&("retry-after", "27".to_owned()))
    );

    clock.advance(Duration::from_secs(27));
    let second = limiters.admit("acme", None, 840).expect("tokens came back");
    assert_eq!(second.headers().remaining_tokens, 0);
    drop(first);
}

#[test]
fn a_request_larger_than_a_minute_of_tokens_never_fits() {
    let (limiters, _clock) = acme(LIMITS);
    let rejection = limiters.admit("acme", None, 1201).unwrap_err();
    assert_eq!(rejection.reason, RejectReason::TooManyTokens);
    assert_eq!(rejection.retry_after, None);
    assert_eq!(
        rejection.message,
        "this request needs 1201 tokens (prompt + max_tokens), more than tenant `acme`'s whole \
         budget of 1200 tokens per minute; lower max_tokens or shorten the prompt"
    );
    assert!(
        rejection
            .to_header_pairs()
            .iter()
            .all(|(name, _)| *name != "retry-after")
    );
    assert_eq!(limiters.in_flight("acme"), Some(0));
}

#[test]
fn concurrency_limit_and_release() {
    let (limiters, _clock) = acme(LIMITS);
    let first = limiters.admit("acme", None, 1).expect("slot 1");
    let second = limiters.admit("acme", None, 1).expect("slot 2");
    let rejection = limiters.admit("acme", None, 1).unwrap_err();
    assert_eq!(rejection.reason, RejectReason::Concurrency);
    assert_eq!(rejection.retry_after, Some(Duration::from_secs(1)));
    assert!(
        rejection
            .to_header_pairs()
            .contains(&("retry-after", "1".to_owned()))
    );
    assert_eq!(
        rejection.message,
        "tenant `acme` already has 2 requests in flight, its limit; retry when one finishes"
    );
    // The refused request spent its request cell (documented).
    assert_eq!(rejection.headers.remaining_requests, 7);
    assert_eq!(rejection.headers.remaining_tokens, 1198);
    drop(first);
    assert_eq!(limiters.in_flight("acme"), Some(1));
    let third = limiters.admit("acme", None, 1).expect("a slot was freed");
    drop((second, third));
    assert_eq!(limiters.in_flight("acme"), Some(0));
}

#[test]
fn a_disconnect_refunds_the_unused_tokens_and_frees_the_slot() {
    let (limiters, _clock) = acme(LIMITS);
    let admission = limiters.admit("acme", None, 600).expect("fits");
    // The prompt turned out to be 150 tokens: 150 + max_tokens 400.
    admission.tokens().set_reserved(550);
    admission.tokens().record_used(150);
    admission.tokens().record_used(25);
    // The client goes away; the response stream, and with it the admission,
    // is dropped.
    drop(admission);
    assert_eq!(limiters.in_flight("acme"), Some(0));
    let next = limiters.admit("acme", None, 1).expect("fits");
    assert_eq!(next.headers().remaining_tokens, 1200 - 175 - 1);
}

#[test]
fn subjects_get_their_own_request_rate_but_share_tokens_and_slots() {
    let (limiters, _clock) = acme(Limits {
        per_sub: true,
        burst: 2,
        max_concurrent: 3,
        ..LIMITS
    });
    let a1 = limiters.admit("acme", Some("alice"), 100).expect("alice 1");
    let a2 = limiters.admit("acme", Some("alice"), 100).expect("alice 2");
    let rejection = limiters.admit("acme", Some("alice"), 100).unwrap_err();
    assert_eq!(rejection.reason, RejectReason::RequestRate);
    assert!(
        rejection
            .message
            .starts_with("subject `alice` of tenant `acme` is over its request rate"),
        "{}",
        rejection.message
    );
    let b1 = limiters
        .admit("acme", Some("bob"), 100)
        .expect("bob has his own bucket");
    assert_eq!(b1.headers().remaining_requests, 1);
    assert_eq!(b1.headers().remaining_tokens, 900, "tokens are per tenant");
    let rejection = limiters.admit("acme", Some("bob"), 100).unwrap_err();
    assert_eq!(
        rejection.reason,
        RejectReason::Concurrency,
        "slots are per tenant"
    );
    drop((a1, a2, b1));
}

#[test]
fn tenants_are_isolated() {
    let (limiters, _clock) = table(&[("acme", LIMITS), ("globex", LIMITS)]);
    let _held: Vec<_> = (0..2)
        .map(|_| limiters.admit("acme", None, 600).expect("acme"))
        .collect();
    assert!(limiters.admit("acme", None, 1).is_err());
    let globex = limiters.admit("globex", None, 1).expect("untouched");
    assert_eq!(globex.headers().remaining_requests, 9);
    assert_eq!(globex.headers().remaining_tokens, 1199);
}

#[test]
fn unknown_tenant_is_refused_without_rate_headers() {
    let (limiters, _clock) = acme(LIMITS);
    let rejection = limiters.admit("initech", None, 1).unwrap_err();
    assert_eq!(rejection.reason, RejectReason::UnknownTenant);
    assert!(rejection.to_header_pairs().is_empty());
    assert_eq!(limiters.in_flight("initech"), None);
}

#[test]
fn reconcile_keeps_unchanged_state_resets_changed_and_drops_removed() {
    let (old, _clock) = table(&[("acme", LIMITS), ("globex", LIMITS), ("initech", LIMITS)]);
    let acme_held = old.admit("acme", None, 500).expect("acme");
    let globex_held = old.admit("globex", None, 500).expect("globex");
    let initech_held = old.admit("initech", None, 500).expect("initech");

    // acme: only max_tokens changed (no limiter enforces it); globex: a new
    // request rate and token budget; initech: removed.
    let acme = Limits {
        max_tokens: 100,
        ..LIMITS
    };
    let globex = Limits {
        requests_per_s: 6,
        tokens_per_min: 6000,
        max_concurrent: 1,
        ..LIMITS
    };
    let new = old.reconcile([("acme", &acme), ("globex", &globex)]);

    let acme_next = new.admit("acme", None, 100).expect("acme");
    assert_eq!(acme_next.headers().remaining_requests, 8, "rate state kept");
    assert_eq!(
        acme_next.headers().remaining_tokens,
        600,
        "token state kept"
    );
    assert_eq!(new.in_flight("acme"), Some(2), "in-flight count kept");
    drop(acme_held);
    assert_eq!(
        new.in_flight("acme"),
        Some(1),
        "old admission released into the new table"
    );

    // globex's in-flight request still counts against its new limit of 1.
    let refused = new.admit("globex", None, 100).unwrap_err();
    assert_eq!(refused.reason, RejectReason::Concurrency);
    assert_eq!(
        refused.headers.remaining_requests, 9,
        "fresh bucket less this request's cell"
    );
    assert_eq!(refused.headers.limit_tokens, 6000);
    assert_eq!(refused.headers.remaining_tokens, 6000, "fresh token bucket");
    drop(globex_held);
    let globex_next = new.admit("globex", None, 100).expect("slot freed");
    assert_eq!(globex_next.headers().remaining_requests, 8);
    assert_eq!(globex_next.headers().remaining_tokens, 5900);

    assert_eq!(
        new.admit("initech", None, 1).unwrap_err().reason,
        RejectReason::UnknownTenant
    );
    drop(initech_held); // releases into the dropped tenant's counters, harmlessly
    assert!(
        old.admit("initech", None, 1).is_ok(),
        "the old table still works"
    );
}

#[test]
fn reconcile_with_identical_limits_changes_nothing() {
    let (old, clock) = acme(LIMITS);
    let held = old.admit("acme", None, 1000).expect("fits");
    let new = old.reconcile([("acme", &LIMITS)]);
    let refused = new.admit("acme", None, 300).unwrap_err();
    assert_eq!(refused.reason, RejectReason::TokenRate);
    assert_eq!(refused.retry_after, Some(Duration::from_secs(5)));
    clock.advance(Duration::from_secs(5));
    assert!(new.admit("acme", None, 300).is_ok());
    drop(held);
}

#[test]
fn builds_from_a_policy() {
    let jwt: JwtFile = toml::from_str(
        "issuer = \"https://login.acme.test\"\naudience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]",
    )
    .expect("jwt table");
    let tenant = TenantPolicy {
        id: "acme".to_owned(),
        models: BTreeSet::new(),
        jwt,
        limits: LIMITS,
        plugins: Default::default(),
        gpu: Default::default(),
        parse_special: false,
        record_content: false,
        source: Arc::new(SourceFile::new("tenants/acme.toml", "")),
    };
    let mut policy = Policy {
        dir: "policies".into(),
        operator: crate::policy::OperatorPolicy {
            issuers: Vec::new(),
            source: Arc::new(SourceFile::new("gateway.toml", "")),
        },
        gateway: GatewaySettings {
            listen: crate::policy::DEFAULT_LISTEN.parse().expect("address"),
            admin_listen: crate::policy::ListenAddr::Tcp(
                crate::policy::DEFAULT_ADMIN_LISTEN
                    .parse()
                    .expect("address"),
            ),
            connections: crate::policy::ConnectionLimits::DEFAULT,
            limit_store: crate::limits::LimitStore::Memory,
            max_body_bytes: 1 << 20,
            request_timeout: Duration::from_secs(60),
            jwt_leeway: Duration::from_secs(30),
            upstream: UpstreamSettings::Local(LocalGpuHost {
                binary: None,
                threads: None,
                workers: 1,
                queue_capacity: 1,
                restart_backoff_max: Duration::from_secs(1),
                scrub_bytes_per_s: None,
                scrub_min_bytes_per_s: None,
                device: bulkhead_partition::Device::mi325x(),
                model_reservation_bytes: 0,
            }),
            plugins: Default::default(),
            audit: None,
            state: None,
            models_registry: None,
            usage_dir: None,
        },
        tenants: BTreeMap::from([("acme".to_owned(), tenant)]),
        files: Vec::new(),
        partitions: None,
        trust: Default::default(),
        models: Vec::new(),
    };
    let fake = FakeRelativeClock::default();
    let limiters = Limiters::new(policy.limits(), LimitClock::fake(fake));
    let held = limiters.admit("acme", None, 1).expect("acme");
    assert_eq!(held.headers().remaining_requests, 9);

    policy.tenants.clear();
    let reloaded = limiters.reconcile(policy.limits());
    assert_eq!(
        reloaded.admit("acme", None, 1).unwrap_err().reason,
        RejectReason::UnknownTenant
    );
}

#[test]
fn admissions_can_move_into_response_streams() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync_static::<Admission>();
    send_sync_static::<Limiters>();
    send_sync_static::<Rejection>();
}
