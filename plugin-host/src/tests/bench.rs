//! Per-call overhead, measured (not asserted).

use std::time::Instant;

use super::*;

/// Fresh instance + no-op `on-request` + `on-response` on `echo`, 10,000
/// times: prints the median and the 99th percentile.
#[test]
#[ignore = "a measurement, not a check: run with --ignored --nocapture"]
fn overhead_of_a_fresh_instance_and_two_no_op_hooks() {
    require_guests!();
    let echo = compiled("echo");
    let req = text_request("hello");
    let resp = response("world");
    let mut samples = Vec::with_capacity(10_000);
    for _ in 0..10_000 {
        let started = Instant::now();
        let mut call = echo.instantiate(context("echo", relaxed_limits())).unwrap();
        call.on_request(req.clone()).unwrap().unwrap();
        call.on_response(resp.clone()).unwrap().unwrap();
        drop(call);
        samples.push(started.elapsed());
    }
    report("fresh instance + on-request + on-response", samples);

    // The same pair on one instance: what the hooks cost without
    // instantiation.
    let mut call = echo.instantiate(context("echo", relaxed_limits())).unwrap();
    let samples = (0..10_000)
        .map(|_| {
            let started = Instant::now();
            call.on_request(req.clone()).unwrap().unwrap();
            call.on_response(resp.clone()).unwrap().unwrap();
            started.elapsed()
        })
        .collect();
    report("on-request + on-response on a live instance", samples);
}

/// `pii-redact` (the guest SDK's example) on a 2 KB chat prompt with two
/// emails and a phone number: fresh instance + `on-request` +
/// `on-response` on a 2 KB answer, 5,000 times.
#[test]
#[ignore = "a measurement, not a check: run with --ignored --nocapture"]
fn overhead_of_pii_redact_on_a_2_kb_prompt() {
    require_guests!();
    let pii = engine()
        .validate_and_compile(&guests::example("pii-redact"))
        .expect("pii-redact compiles");
    let mut text = String::new();
    while text.len() < 2048 {
        text.push_str("Please forward the invoice to ana.lopez@example.com and call ");
        text.push_str("+1 415 555 0100 if anything is unclear; thanks a lot. ");
    }
    text.truncate(2048);
    let req = text_request(&text);
    let resp = response(&text);
    let mut samples = Vec::with_capacity(5_000);
    for _ in 0..5_000 {
        let started = Instant::now();
        let mut call = pii
            .instantiate(context("pii-redact", relaxed_limits()))
            .unwrap();
        let out = call.on_request(req.clone()).unwrap().unwrap();
        call.on_response(resp.clone()).unwrap().unwrap();
        drop(call);
        samples.push(started.elapsed());
        assert!(matches!(&out.prompt, Prompt::Text(t) if t.contains("[email]")));
    }
    report(
        "pii-redact: fresh instance + on-request + on-response, 2 KB each",
        samples,
    );
}

fn report(what: &str, mut samples: Vec<std::time::Duration>) {
    samples.sort();
    eprintln!(
        "{what}: median {:?}, p99 {:?}, min {:?}",
        samples[samples.len() / 2],
        samples[samples.len() * 99 / 100],
        samples[0]
    );
}
