//! Per-tenant limits over HTTP: request bursts, token budgets (with refunds
//! after a client disconnects), and many requests at once.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bulkhead_tests::{Gateway, PolicyDir};
use serde_json::json;

const MODEL: &str = "bulkhead-demo-tiny";

/// The demo tenant with the given `[limits]` lines.
fn demo_with_limits(name: &str, limits: &str) -> PolicyDir {
    let policies = PolicyDir::new(name);
    policies.set_demo_limits(limits);
    policies
}

fn completion(max_tokens: u32) -> String {
    json!({"model": MODEL, "prompt": "Emma was", "max_tokens": max_tokens, "temperature": 0})
        .to_string()
}

fn header_u64(r: &bulkhead_tests::Response, name: &str) -> u64 {
    r.header(name)
        .unwrap_or_else(|| panic!("no {name}: {:?}", r.headers))
        .parse()
        .unwrap()
}

#[test]
fn a_burst_gets_429_with_retry_after_and_counters_that_fall_and_reset() {
    let policies = demo_with_limits(
        "burst",
        // Tokens refill at 20 a second: a completion's reservation shows.
        "requests_per_s = 1\nburst = 3\ntokens_per_min = 1200",
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let mut remaining = Vec::new();
    let mut budget_after_ok = 0;
    for _ in 0..3 {
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(1)),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(header_u64(&r, "x-ratelimit-limit-requests"), 3);
        assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 1200);
        remaining.push(header_u64(&r, "x-ratelimit-remaining-requests"));
        assert!(r.header("x-ratelimit-reset-requests").is_some());
        budget_after_ok = header_u64(&r, "x-ratelimit-remaining-tokens");
    }
    // Requests take time, so a cell may come back between them; the count
    // still falls by one per request minus what was replenished.
    assert!(remaining.windows(2).all(|w| w[1] <= w[0]), "{remaining:?}");
    assert!(remaining[0] == 2, "{remaining:?}");
    // Drain whatever came back, then one more is refused. Before each:
    // the tokens counted, and the token budget the last success left.
    let (refused, tokens_before, budget_after_ok) = loop {
        let tokens_before = gateway.metric("bulkhead_tokens_total", &[]);
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(1)),
        );
        if r.status == 429 {
            break (r, tokens_before, budget_after_ok);
        }
        assert_eq!(r.status, 200, "{}", r.body);
        budget_after_ok = header_u64(&r, "x-ratelimit-remaining-tokens");
    };
    assert_eq!(
        refused.error_code(),
        "rate_limit_requests",
        "{}",
        refused.body
    );
    let retry_after: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(header_u64(&refused, "x-ratelimit-remaining-requests"), 0);
    // A refused request costs no tokens: none are counted for it, and the
    // budget it reports is at least what the last success left (refunds
    // and refilling only add; a reservation would take more than they
    // give back in the moment between).
    assert_eq!(
        gateway.metric("bulkhead_tokens_total", &[]),
        tokens_before,
        "tokens were counted for a refused request"
    );
    let budget_now = header_u64(&refused, "x-ratelimit-remaining-tokens");
    assert!(
        budget_now >= budget_after_ok,
        "the refusal took tokens: {budget_now} left, {budget_after_ok} before"
    );

    // GCRA with 1 request/s and a burst of 3 is full again 3 s after it was
    // empty; wait that long (the behaviour under test is time itself).
    std::thread::sleep(Duration::from_millis(3100));
    let r = gateway.request(
        "POST",
        "/v1/completions",
        Some(&token),
        Some(&completion(1)),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        header_u64(&r, "x-ratelimit-remaining-requests"),
        2,
        "{:?}",
        r.headers
    );
}

#[test]
fn a_disconnected_stream_refunds_its_unused_tokens() {
    let policies = demo_with_limits(
        "refund",
        "requests_per_s = 100\nburst = 100\ntokens_per_min = 1000\nmax_tokens = 480",
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let body = json!({"model": MODEL, "prompt": "Emma was", "max_tokens": 480, "stream": true, "temperature": 0.8, "seed": 3}).to_string();
    let mut stream = gateway.stream("/v1/completions", &token, &body);
    assert_eq!(stream.status, 200);
    let during: u64 = stream
        .header("x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap();
    // Reserved: 480 completion tokens plus the prompt (the demo model's
    // context is 512 tokens).
    assert!(during <= 520, "{during}");
    for _ in 0..3 {
        stream.next_event().expect("a chunk");
    }
    drop(stream);
    // The gateway notices the closed connection at its next write and
    // refunds what was not generated; wait for it (bounded).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut probes = 0.0;
    loop {
        probes += 1.0;
        let r = gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&completion(1)),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let after = header_u64(&r, "x-ratelimit-remaining-tokens");
        if after > during + 300 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no refund: {during} during, {after} after"
        );
    }
    // The refund came from the disconnect, not from a generation that ended
    // early by itself: far fewer than 480 tokens were delivered.
    let completion_tokens =
        gateway.metric("bulkhead_tokens_total", &[("kind", "completion")]) - probes;
    assert!(
        completion_tokens < 240.0,
        "{completion_tokens} tokens delivered"
    );
}

#[test]
fn many_requests_at_once_never_overspend_the_token_budget() {
    // Each request reserves 3 prompt tokens (token ids: the bound is exact)
    // plus 300 completion tokens; the budget holds exactly five of them.
    let policies = demo_with_limits(
        "overspend",
        "requests_per_s = 1000\nburst = 1000\ntokens_per_min = 1515\nmax_concurrent = 64\nmax_tokens = 300",
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let body = json!({"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 300, "temperature": 0})
        .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // Connect all first, then send all at once, so admissions race.
    let mut connections: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(gateway.addr).unwrap())
        .collect();
    for c in &mut connections {
        c.write_all(request.as_bytes()).unwrap();
    }
    let statuses: Vec<(u16, String)> = connections
        .into_iter()
        .map(|mut c| {
            let mut raw = String::new();
            c.read_to_string(&mut raw).unwrap();
            let status = raw[9..12].parse().unwrap();
            (status, raw)
        })
        .collect();
    let admitted = statuses.iter().filter(|(s, _)| *s == 200).count();
    let refused: Vec<_> = statuses.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(admitted + refused.len(), 16, "{statuses:?}");
    assert_eq!(
        admitted,
        5,
        "{:?}",
        statuses.iter().map(|(s, _)| s).collect::<Vec<_>>()
    );
    assert!(
        refused
            .iter()
            .all(|(_, raw)| raw.contains("rate_limit_tokens")),
        "{refused:?}"
    );
}
