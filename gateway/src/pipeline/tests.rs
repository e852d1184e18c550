use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::http::StatusCode;

use super::*;
use crate::ApiError;
use bulkhead_testkit::wasm;

use crate::plugins::{CompiledPlugin, PluginEngine, PluginEngineConfig};

fn chat(text: &str) -> InferenceRequest {
    InferenceRequest::parse(
        Endpoint::Chat,
        format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":{text:?}}}],"max_tokens":8}}"#
        )
        .as_bytes(),
    )
    .expect("valid request")
}

fn rules() -> TenantRules {
    TenantRules {
        models: Some(BTreeSet::from(["m".to_string(), "other".to_string()])),
        max_tokens: 64,
    }
}

fn chains(on_request: &[&str], on_response: &[&str], deadline_ms: u64) -> TenantPlugins {
    let names = |list: &[&str]| list.iter().map(|n| Arc::from(*n)).collect::<Vec<_>>();
    let mut plugins = TenantPlugins {
        on_request: names(on_request),
        on_response: names(on_response),
        ..TenantPlugins::default()
    };
    for name in on_request.iter().chain(on_response) {
        let mut settings = PluginSettings::default();
        settings.limits.deadline = std::time::Duration::from_millis(deadline_ms);
        plugins.settings.insert(Arc::from(*name), settings);
    }
    plugins
}

fn hooks(on_request: &[&str], on_response: &[&str], deadline_ms: u64) -> Hooks {
    hooks_on(
        &HookGate::new(2),
        "acme",
        on_request,
        on_response,
        deadline_ms,
    )
}

fn hooks_on(
    gate: &Arc<HookGate>,
    tenant: &str,
    on_request: &[&str],
    on_response: &[&str],
    deadline_ms: u64,
) -> Hooks {
    Hooks::resolve(
        tenant,
        &chains(on_request, on_response, deadline_ms),
        |name| Some(compiled(name)),
        &Arc::new(Metrics::new()),
        gate,
    )
    .expect("resolves")
    .expect("has plugins")
}

/// A test guest, compiled once per process on one shared engine.
fn compiled(name: &str) -> CompiledPlugin {
    static ENGINE: OnceLock<PluginEngine> = OnceLock::new();
    static CACHE: OnceLock<Mutex<HashMap<String, CompiledPlugin>>> = OnceLock::new();
    let engine = ENGINE.get_or_init(|| {
        PluginEngine::new(PluginEngineConfig {
            // Tests compile in parallel on a possibly loaded machine.
            compile_budget: Duration::from_secs(120),
            ..PluginEngineConfig::default()
        })
        .expect("plugin engine")
    });
    let mut cache = CACHE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    cache
        .entry(name.to_string())
        .or_insert_with(|| {
            engine
                .validate_and_compile(&wasm::test_guest(name))
                .unwrap_or_else(|e| panic!("compiling {name}: {e}"))
        })
        .clone()
}

fn content(request: &InferenceRequest) -> &str {
    match &request.prompt {
        Prompt::Chat(messages) => &messages[0].1,
        other => panic!("not chat: {other:?}"),
    }
}

#[tokio::test]
async fn the_request_chain_rewrites_in_order_and_rejections_name_the_plugin() {
    if !wasm::require() {
        return;
    }
    let (_, request) = hooks(&["echo", "rewrite"], &[], 10_000)
        .on_request(chat("hello"), Arc::new(rules()), "r1".into())
        .await
        .expect("passes");
    assert_eq!(content(&request), "HELLO");
    assert_eq!(request.max_tokens, Some(8));

    let error = hooks(&["rewrite"], &[], 10_000)
        .on_request(chat("a forbidden word"), Arc::new(rules()), "r2".into())
        .await
        .map_err(ApiError::from)
        .expect_err("rejected");
    assert_eq!(error.status, StatusCode::FORBIDDEN);
    assert_eq!(error.code, "plugin_rejected");
    assert_eq!(error.message, "the word \"forbidden\" is forbidden");
    let headers = error.headers.expect("headers");
    assert_eq!(headers["x-bulkhead-plugin"], "rewrite");
}

#[tokio::test]
async fn a_failing_plugin_is_a_502_naming_it_and_the_limit() {
    if !wasm::require() {
        return;
    }
    let request =
        InferenceRequest::parse(Endpoint::Completion, br#"{"model":"m","prompt":"loop"}"#)
            .expect("valid");
    let error = hooks(&["hostile"], &[], 20)
        .on_request(request, Arc::new(rules()), "r".into())
        .await
        .map_err(ApiError::from)
        .expect_err("times out");
    assert_eq!(error.status, StatusCode::BAD_GATEWAY);
    assert_eq!(error.kind, "plugin_error");
    assert_eq!(error.code, "plugin_timeout");
    assert!(
        error
            .message
            .contains("plugin `hostile` ran past its deadline of 20ms"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_hook_run_holds_its_gate_slot_until_the_guest_stops_even_if_the_request_is_gone() {
    if !wasm::require() {
        return;
    }
    let gate = HookGate::new(1);
    let hostile = hooks_on(&gate, "attacker", &["hostile"], &[], 1_000);
    let request =
        InferenceRequest::parse(Endpoint::Completion, br#"{"model":"m","prompt":"loop"}"#)
            .expect("valid");
    let attack = tokio::spawn(hostile.on_request(request, Arc::new(rules()), "r".into()));
    while gate.in_use() == 0 {
        tokio::task::yield_now().await;
    }
    // The client goes away; the guest loops on to its deadline.
    attack.abort();
    assert!(attack.await.expect_err("aborted").is_cancelled());
    assert_eq!(
        gate.in_use(),
        1,
        "the looping guest still holds the only slot"
    );

    // Another tenant's hook waits for it, then runs.
    let (_, request) = hooks_on(&gate, "acme", &["echo"], &[], 10_000)
        .on_request(chat("hi"), Arc::new(rules()), "r2".into())
        .await
        .expect("passes");
    assert_eq!(content(&request), "hi");
    // Its pass is dropped just after the hooks were sent back.
    while gate.in_use() > 0 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn responses_and_streams_pass_through_the_response_chain() {
    if !wasm::require() {
        return;
    }
    let response = plugins::Response {
        model: "m".into(),
        text: "all good".into(),
        finish_reason: "length".into(),
        prompt_tokens: 3,
        completion_tokens: 2,
    };
    let (_, (text, finish)) = hooks(&[], &["rewrite"], 10_000)
        .on_response(response)
        .await
        .expect("passes");
    assert_eq!((text.as_str(), finish), ("ALL GOOD", Finish::Length));

    // One instance per request: the chunk count restarts with new hooks.
    for _ in 0..2 {
        let mut hooks = hooks(&[], &["echo", "rewrite"], 10_000);
        let mut streamed = String::new();
        for piece in ["ab", "", "cd"] {
            let (next, text) = hooks.on_chunk(piece.to_string()).await.expect("chunk");
            hooks = next;
            streamed.push_str(&text);
        }
        let (_, tail) = hooks.on_stream_end().await.expect("end");
        // The empty delta never reached the plugins.
        assert_eq!(streamed + &tail, "ABCD[2 chunks]");
    }
}

#[test]
fn a_chained_plugin_that_was_never_uploaded_fails_closed() {
    let error = Hooks::resolve(
        "acme",
        &chains(&["guard"], &[], 50),
        |_| None,
        &Arc::new(Metrics::new()),
        &HookGate::new(2),
    )
    .map_err(ApiError::from)
    .expect_err("missing");
    assert_eq!(error.status, StatusCode::BAD_GATEWAY);
    assert_eq!(error.code, "plugin_not_found");
    assert!(
        error
            .message
            .contains("plugin `guard` is in tenant `acme`'s on_request chain")
    );
    let none = Hooks::resolve(
        "acme",
        &TenantPlugins::default(),
        |_| None,
        &Arc::new(Metrics::new()),
        &HookGate::new(2),
    );
    assert!(none.expect("no chain").is_none());
}

fn rewrite_of(request: &InferenceRequest) -> plugins::Request {
    to_plugin(request, Vec::new())
}

#[test]
fn rewrites_meet_the_rules_a_client_request_meets() {
    let original = chat("hi");
    type Change = Box<dyn Fn(&mut plugins::Request)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "chose model `secret`",
            Box::new(|r| r.model = "secret".into()),
        ),
        (
            "changed the prompt's kind",
            Box::new(|r| r.prompt = plugins::Prompt::Text("x".into())),
        ),
        (
            "returned 0 chat messages",
            Box::new(|r| r.prompt = plugins::Prompt::Chat(vec![])),
        ),
        (
            "role `tool`",
            Box::new(|r| {
                r.prompt = plugins::Prompt::Chat(vec![plugins::Message {
                    role: "tool".into(),
                    content: "x".into(),
                }])
            }),
        ),
        (
            "set max_tokens to 65",
            Box::new(|r| r.sampling.max_tokens = Some(65)),
        ),
        (
            "set max_tokens to 0",
            Box::new(|r| r.sampling.max_tokens = Some(0)),
        ),
        (
            "set temperature to 3",
            Box::new(|r| r.sampling.temperature = 3.0),
        ),
        ("set top_p to 0", Box::new(|r| r.sampling.top_p = 0.0)),
        (
            "returned 5 stop sequences",
            Box::new(|r| r.sampling.stop = vec!["s".into(); 5]),
        ),
    ];
    for (expected, change) in cases {
        let mut request = original.clone();
        let mut rewritten = rewrite_of(&request);
        change(&mut rewritten);
        let reason = apply(&mut request, rewritten, &rules()).expect_err(expected);
        assert!(reason.contains(expected), "{reason} (wanted {expected})");
        assert_eq!(request, original, "a refused rewrite changes nothing");
    }

    let mut request = original.clone();
    let mut rewritten = rewrite_of(&request);
    rewritten.model = "other".into();
    rewritten.sampling.max_tokens = None;
    rewritten.sampling.stop = vec!["END".into()];
    rewritten.metadata = vec![("k".into(), "v".into())];
    let metadata = apply(&mut request, rewritten, &rules()).expect("valid");
    assert_eq!(metadata, vec![("k".to_string(), "v".to_string())]);
    assert_eq!(request.model, "other");
    assert_eq!(request.stop, vec!["END".to_string()]);
    assert_eq!(effective_max_tokens(&request, 64), 64);
}
