//! The gateway as tenants use it: the default policy's demo tenant, the demo
//! model on a local gpu-host child, plain HTTP and the official OpenAI SDK.

use std::process::Command;

use bulkhead_tests::{Gateway, PolicyDir};
use serde_json::{Value, json};

const MODEL: &str = "bulkhead-demo-tiny";

fn chat_body(extra: Value) -> String {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about Emma."}],
        "max_tokens": 8,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body.to_string()
}

#[test]
fn chat_and_completions_answer_whole_and_streamed_with_usage() {
    let policies = PolicyDir::new("basic");
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);

    let whole = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat_body(json!({}))),
    );
    assert_eq!(whole.status, 200, "{}", whole.body);
    let body = whole.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    let text = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let usage = &body["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 8);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert!(whole.header("x-request-id").is_some());
    assert!(
        whole.header("x-ratelimit-remaining-requests").is_some(),
        "{:?}",
        whole.headers
    );

    // Streamed, greedy: the same text, then finish, usage and [DONE].
    let mut stream = gateway.stream(
        "/v1/chat/completions",
        &token,
        &chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    assert_eq!(stream.status, 200);
    assert!(
        stream
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut events = Vec::new();
    while let Some(event) = stream.next_event() {
        events.push(event);
    }
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], *usage);
    let finish = &chunks[chunks.len() - 2]["choices"][0]["finish_reason"];
    assert_eq!(*finish, body["choices"][0]["finish_reason"]);

    // Legacy completions with a stop string.
    let completion = gateway.request(
        "POST",
        "/v1/completions",
        Some(&token),
        Some(
            &json!({"model": MODEL, "prompt": "Emma was", "max_tokens": 6, "temperature": 0})
                .to_string(),
        ),
    );
    assert_eq!(completion.status, 200, "{}", completion.body);
    let c = completion.json();
    assert_eq!(c["object"], "text_completion");
    assert_eq!(c["usage"]["completion_tokens"], 6);
    assert_eq!(c["choices"][0]["finish_reason"], "length");

    // Without max_tokens: up to the tenant's max_tokens (512) or the end of
    // the model's 512-token context, whichever comes first — not a 400.
    let open_ended = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "seed": 2})
                .to_string(),
        ),
    );
    assert_eq!(open_ended.status, 200, "{}", open_ended.body);
    let u = &open_ended.json()["usage"];
    assert!(u["total_tokens"].as_u64().unwrap() <= 512, "{u}");

    // Metrics saw the tenant's requests and tokens.
    assert!(
        gateway.metric(
            "bulkhead_requests_total",
            &[("tenant", "demo"), ("status", "200")]
        ) >= 3.0
    );
    assert!(
        gateway.metric(
            "bulkhead_tokens_total",
            &[("tenant", "demo"), ("kind", "completion")]
        ) >= 6.0
    );
}

#[test]
fn bad_requests_are_400_naming_the_parameter_and_cost_nothing() {
    let policies = PolicyDir::new("bad-requests");
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    for (body, param) in [
        (chat_body(json!({"n": 2})), "n"),
        (chat_body(json!({"temperature": 9})), "temperature"),
        (
            chat_body(json!({"max_tokens": 100000})),
            "max_completion_tokens",
        ),
        (chat_body(json!({"logprobs": true})), "logprobs"),
        (chat_body(json!({"messages": "hi"})), "messages"),
    ] {
        let r = gateway.request("POST", "/v1/chat/completions", Some(&token), Some(&body));
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    let r = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some("{not json"),
    );
    assert_eq!(
        (r.status, r.error_code().as_str()),
        (400, "invalid_json"),
        "{}",
        r.body
    );
    let r = gateway.request("GET", "/v1/nope", Some(&token), None);
    assert_eq!(r.status, 404);
    // Over the tenant's cap (256 KiB in the standard class) and over the
    // gateway's (1 MiB): both 413 in OpenAI's shape.
    for size in [300 << 10, 2 << 20] {
        let big = chat_body(json!({"user": "x".repeat(size)}));
        let r = gateway.request("POST", "/v1/chat/completions", Some(&token), Some(&big));
        assert_eq!(
            (r.status, r.error_code().as_str()),
            (413, "request_too_large"),
            "{size}"
        );
    }
    // Nothing above reached the gpu-host.
    assert_eq!(gateway.metric("bulkhead_tokens_total", &[]), 0.0);
}

#[test]
fn models_health_and_readiness() {
    let policies = PolicyDir::new("models");
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let models = gateway.request("GET", "/v1/models", Some(&token), None);
    assert_eq!(models.status, 200, "{}", models.body);
    assert_eq!(models.json()["data"][0]["id"], MODEL);
    assert_eq!(gateway.request("GET", "/v1/models", None, None).status, 401);
    assert_eq!(gateway.request("GET", "/healthz", None, None).status, 200);
    assert_eq!(gateway.request("GET", "/readyz", None, None).status, 200);
    let metrics = gateway.admin.request("GET", "/metrics", None, None);
    assert!(
        metrics.body.contains("bulkhead_upstream_ready 1"),
        "{}",
        metrics.body
    );
}

#[test]
fn shutdown_drains_a_stream_in_flight() {
    let policies = PolicyDir::new("drain");
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let mut stream = gateway.stream(
        "/v1/completions",
        &token,
        &json!({"model": MODEL, "prompt": "Emma was", "max_tokens": 64, "stream": true, "temperature": 0}).to_string(),
    );
    assert_eq!(stream.status, 200);
    let first = stream.next_event().expect("a first chunk");
    assert!(first.contains("text_completion"));
    gateway.terminate_during(&mut stream);
}

/// The official `openai` Python SDK (pinned in tests/e2e/requirements.txt),
/// unchanged, against the gateway. `tests/run-all` provides the venv through
/// `BULKHEAD_TEST_PYTHON` and requires `python-sdk` so CI cannot skip it; a
/// bare `cargo test` without Python says that it skipped.
#[test]
fn the_official_openai_sdk_works_unchanged() {
    let Some(python) = std::env::var_os("BULKHEAD_TEST_PYTHON") else {
        bulkhead_testkit::skip(
            bulkhead_testkit::Need::PythonSdk,
            "set BULKHEAD_TEST_PYTHON to a Python with tests/e2e/requirements.txt",
        );
        return;
    };
    let policies = PolicyDir::new("openai-sdk");
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let out = Command::new(python)
        .arg(bulkhead_tests::repo().join("tests/e2e/openai_sdk.py"))
        .arg(format!("http://{}/v1", gateway.addr))
        .arg(&token)
        .arg(MODEL)
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "openai_sdk.py failed:\n{}\n{}\ngateway log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        gateway.log.text()
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}
