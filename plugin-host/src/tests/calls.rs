//! Well-behaved guests: hooks, rejections, config, logging, and that
//! nothing leaks between instances or in from outside.

use super::*;

#[test]
fn echo_returns_every_hook_input_unchanged() {
    require_guests!();
    let mut call = start("echo");
    let chat = request(Prompt::Chat(vec![
        Message {
            role: "system".to_string(),
            content: "be brief".to_string(),
        },
        Message {
            role: "user".to_string(),
            content: "héllo ✓".to_string(),
        },
    ]));
    assert_eq!(call.on_request(chat.clone()).unwrap(), Ok(chat));
    let tokens = request(Prompt::Tokens(vec![1, 2, 3, u32::MAX]));
    assert_eq!(call.on_request(tokens.clone()).unwrap(), Ok(tokens));
    assert_eq!(
        call.on_response(response("done")).unwrap(),
        Ok(response("done"))
    );
    assert_eq!(call.on_chunk("del").unwrap(), Ok("del".to_string()));
    assert_eq!(call.on_stream_end().unwrap(), Ok(String::new()));
}

#[test]
fn rewrite_uppercases_and_rejects_forbidden_words() {
    require_guests!();
    let mut call = start("rewrite");
    let out = call.on_request(text_request("hello")).unwrap().unwrap();
    assert_eq!(out.prompt, Prompt::Text("HELLO".to_string()));
    assert_eq!(meta(&out, "rewritten-by"), Some("rewrite"));
    let rejection = call
        .on_request(text_request("this is forbidden"))
        .unwrap()
        .unwrap_err();
    assert_eq!(rejection.status, 403);
    assert!(rejection.message.contains("forbidden"), "{rejection:?}");
    // A rejection is an answer, not a failure: the instance goes on.
    let out = call.on_response(response("ok then")).unwrap().unwrap();
    assert_eq!(out.text, "OK THEN");
    assert!(call.log_stats().written_bytes > 0, "the refusal was logged");
}

#[test]
fn stream_state_lives_exactly_one_instance() {
    require_guests!();
    let mut call = start("rewrite");
    assert_eq!(call.on_chunk("a").unwrap(), Ok("A".to_string()));
    assert_eq!(call.on_chunk("b").unwrap(), Ok("B".to_string()));
    assert_eq!(call.on_stream_end().unwrap(), Ok("[2 chunks]".to_string()));
    let rejected = call.on_chunk("forbidden").unwrap().unwrap_err();
    assert_eq!(rejected.status, 403);

    let mut fresh = start("rewrite");
    assert_eq!(fresh.on_stream_end().unwrap(), Ok("[0 chunks]".to_string()));
}

#[test]
fn statics_do_not_leak_between_instances() {
    require_guests!();
    let mut first = start("hostile");
    let out = first.on_request(text_request("state")).unwrap().unwrap();
    assert_eq!(meta(&out, "calls"), Some("1"));
    let out = first.on_request(text_request("state")).unwrap().unwrap();
    assert_eq!(
        meta(&out, "calls"),
        Some("2"),
        "state lives within an instance"
    );

    // Another request (or tenant) gets a fresh instance: fresh statics.
    let mut second = start("hostile");
    let out = second.on_request(text_request("state")).unwrap().unwrap();
    assert_eq!(meta(&out, "calls"), Some("1"));
}

#[test]
fn a_status_outside_4xx_is_sent_as_400() {
    require_guests!();
    let mut call = start("hostile");
    let rejection = call
        .on_request(text_request("reject-500"))
        .unwrap()
        .unwrap_err();
    assert_eq!(
        rejection,
        Rejection {
            status: 400,
            message: "not a 4xx".to_string()
        }
    );
}

#[test]
fn config_comes_from_the_call_context_sorted() {
    require_guests!();
    let config: PluginConfig = [
        ("zeta", "last"),
        ("greeting", "bonjour"),
        ("alpha", "first"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut call = compiled("hostile")
        .instantiate(CallContext {
            config: Arc::new(config),
            ..context("hostile", relaxed_limits())
        })
        .unwrap();
    let out = call.on_request(text_request("config")).unwrap().unwrap();
    assert_eq!(meta(&out, "greeting"), Some("bonjour"));
    assert_eq!(meta(&out, "missing-is-none"), Some("true"));
    let entries: Vec<_> = out
        .metadata
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("entry:")?, v.as_str())))
        .collect();
    assert_eq!(
        entries,
        [
            ("alpha", "first"),
            ("greeting", "bonjour"),
            ("zeta", "last")
        ]
    );
}

#[test]
fn log_volume_is_bounded_and_the_call_still_succeeds() {
    require_guests!();
    let limits = PluginLimits {
        max_log_bytes: 4096,
        ..relaxed_limits()
    };
    for flood in ["log-flood", "print-flood"] {
        let mut call = compiled("hostile")
            .instantiate(context("hostile", limits.clone()))
            .unwrap();
        let out = call.on_request(text_request(flood)).unwrap();
        assert!(out.is_ok(), "{flood}: {out:?}");
        let stats = call.log_stats();
        assert!(stats.written_bytes <= 4096, "{flood}: {stats:?}");
        assert!(stats.written_bytes >= 1024, "{flood}: {stats:?}");
        assert!(stats.dropped_messages > 0, "{flood}: {stats:?}");
    }
}

#[test]
fn the_sandbox_shows_nothing_from_outside_and_the_same_every_call() {
    require_guests!();
    let observe = || {
        let mut call = start("observer");
        let out = call.on_request(text_request("look")).unwrap().unwrap();
        assert!(
            call.log_stats().written_bytes > 0,
            "stdout/stderr reach the log"
        );
        out.metadata
    };
    let seen = observe();
    let get = |key: &str| {
        seen.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{key} not reported: {seen:?}"))
    };
    assert_eq!(get("env"), "0");
    assert_eq!(get("args"), "0");
    assert_eq!(get("wall-ns"), "0");
    assert_eq!(get("monotonic-ns"), "0");
    // HashMap seeds come from wasi:random/insecure-seed: fixed.
    assert_eq!(observe(), seen);
}

#[test]
fn calls_that_print_work_inside_an_async_runtime() {
    require_guests!();
    // wasmtime-wasi's own synchronous stdio would enter a tokio runtime
    // here and panic; ours never blocks or needs one.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut call = start("observer");
        assert!(call.on_request(text_request("look")).unwrap().is_ok());
        assert!(call.log_stats().written_bytes > 0);
    });
}
