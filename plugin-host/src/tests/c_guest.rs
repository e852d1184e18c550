//! A plugin written in C: `guest-sdk/examples-c/length-guard`, built by
//! `guest-sdk/build-c` (clang for wasm32, no libc, no WASI) into the file
//! `BULKHEAD_C_PLUGIN` names (`tests/run-all` sets it). It passes the
//! upload checks every plugin does and behaves as its README says.

use super::*;

/// Where the built C plugin is.
const C_PLUGIN_ENV: &str = "BULKHEAD_C_PLUGIN";

/// The C plugin's bytes and compiled form, or `None` after skipping for
/// `wasm-guests` when `BULKHEAD_C_PLUGIN` is unset (a failure where
/// `BULKHEAD_REQUIRE` lists it, as in CI).
fn length_guard() -> Option<&'static (Vec<u8>, CompiledPlugin)> {
    static PLUGIN: OnceLock<Option<(Vec<u8>, CompiledPlugin)>> = OnceLock::new();
    let plugin = PLUGIN.get_or_init(|| {
        let path = std::env::var_os(C_PLUGIN_ENV)?;
        let bytes = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("reading {C_PLUGIN_ENV}={}: {e}", path.display()));
        let compiled = engine()
            .validate_and_compile(&bytes)
            .unwrap_or_else(|e| panic!("the C plugin was refused: {e}"));
        Some((bytes, compiled))
    });
    if plugin.is_none() {
        bulkhead_testkit::skip(
            bulkhead_testkit::Need::WasmGuests,
            format!(
                "{C_PLUGIN_ENV} is not set (build the C plugin with `guest-sdk/build-c OUT_DIR`, \
                 then set it to OUT_DIR/length-guard.wasm)"
            ),
        );
    }
    plugin.as_ref()
}

/// A fresh instance with this config, under relaxed limits.
fn guard(config: &[(&str, &str)]) -> Option<PluginCall> {
    guard_with(config, relaxed_limits())
}

fn guard_with(config: &[(&str, &str)], limits: PluginLimits) -> Option<PluginCall> {
    let (_, compiled) = length_guard()?;
    let config: PluginConfig = config
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let call = compiled
        .instantiate(CallContext {
            config: Arc::new(config),
            ..context("length-guard", limits)
        })
        .expect("instantiating the C plugin");
    Some(call)
}

fn chat(contents: &[&str]) -> Request {
    request(Prompt::Chat(
        contents
            .iter()
            .map(|content| Message {
                role: "user".to_string(),
                content: content.to_string(),
            })
            .collect(),
    ))
}

fn with_max_tokens(mut req: Request, max_tokens: Option<u32>) -> Request {
    req.sampling.max_tokens = max_tokens;
    req
}

#[test]
fn the_c_plugin_is_accepted_and_imports_only_the_abi() {
    let Some((bytes, plugin)) = length_guard() else {
        return;
    };
    eprintln!("length-guard (C): {} bytes", bytes.len());
    assert_eq!(plugin.digest(), PluginDigest::of(bytes));
    // No libc and no WASI: nothing but the ABI, every import on the list.
    let mut imports = plugin.imports().to_vec();
    imports.sort();
    assert_eq!(
        imports,
        ["bulkhead:plugin/host@0.1.0", "bulkhead:plugin/types@0.1.0"]
    );
    for import in &imports {
        assert!(
            ALLOWED_IMPORTS
                .iter()
                .any(|allowed| import.starts_with(&format!("{}@", allowed.interface))),
            "{import} is not on the allow-list"
        );
    }
    // A few KiB: far below MAX_COMPONENT_BYTES and a Rust plugin's size.
    assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
}

#[test]
fn prompts_within_the_limit_pass_unchanged() {
    let Some(mut call) = guard(&[]) else {
        return;
    };
    for req in [
        chat(&["be brief", "héllo ✓"]),
        text_request("hello"),
        text_request(&"a".repeat(8000)),
        request(Prompt::Tokens(vec![1; 100_000])),
    ] {
        assert_eq!(call.on_request(req.clone()).unwrap(), Ok(req));
    }
}

#[test]
fn a_prompt_over_max_chars_is_refused_with_the_configured_status_and_message() {
    let config = [
        ("max_chars", "10"),
        ("status", "422"),
        ("message", "Too long."),
    ];
    let Some(mut call) = guard(&config) else {
        return;
    };
    let refused = Err(Rejection {
        status: 422,
        message: "Too long.".to_string(),
    });
    // Characters, not bytes: 10 characters in 14 bytes pass, 11 do not.
    let ten = "héllo wör✓";
    assert_eq!((ten.chars().count(), ten.len()), (10, 14));
    assert_eq!(
        call.on_request(text_request(ten)).unwrap(),
        Ok(text_request(ten))
    );
    let eleven = format!("{ten}!");
    assert_eq!(call.on_request(text_request(&eleven)).unwrap(), refused);
    // Chat: every message's content counts, whatever the role.
    let within = chat(&["héllo", "wörld"]);
    assert_eq!(call.on_request(within.clone()).unwrap(), Ok(within));
    assert_eq!(
        call.on_request(chat(&["héllo", "wörld!"])).unwrap(),
        refused
    );
    assert!(call.log_stats().written_bytes > 0, "refusals are logged");
}

#[test]
fn the_default_refusal_is_413_with_the_counts() {
    let Some(mut call) = guard(&[]) else {
        return;
    };
    let out = call.on_request(text_request(&"é".repeat(8001))).unwrap();
    assert_eq!(
        out,
        Err(Rejection {
            status: 413,
            message: "The prompt is too long: 8001 characters; the limit is 8000.".to_string(),
        })
    );
}

#[test]
fn max_tokens_caps_what_a_request_may_ask_for() {
    let Some(mut call) = guard(&[("max_tokens", "8")]) else {
        return;
    };
    for (asked, sent) in [(Some(16), Some(8)), (None, Some(8)), (Some(4), Some(4))] {
        for prompt in [Prompt::Text("hi".to_string()), Prompt::Tokens(vec![7])] {
            let req = with_max_tokens(request(prompt), asked);
            let out = call.on_request(req.clone()).unwrap();
            assert_eq!(out, Ok(with_max_tokens(req, sent)), "asked {asked:?}");
        }
    }
}

#[test]
fn an_unusable_config_fails_every_request_closed() {
    for config in [
        ("max_chars", "8k"),
        ("max_chars", "0"),
        ("max_chars", "4294967296"),
        ("max_chars", " 100"),
        ("max_tokens", ""),
        ("status", "500"),
        ("status", "399"),
        ("max_char", "100"),
    ] {
        let Some(mut call) = guard(&[config]) else {
            return;
        };
        let e = call.on_request(text_request("short")).unwrap_err();
        assert!(
            matches!(&e, PluginError::Trap { plugin, hook: Hook::OnRequest, .. }
                if &**plugin == "length-guard"),
            "{config:?}: {e:?}"
        );
        assert_eq!(e.code(), "plugin_trap");
        assert!(call.log_stats().written_bytes > 0, "{config:?}: logged why");
    }
}

#[test]
fn responses_and_streams_pass_through_in_bounded_memory() {
    // 4 MiB streamed through an instance allowed 1 MiB of memory: the
    // runtime's allocator reuses the memory of each finished call.
    let limits = PluginLimits {
        max_memory_bytes: 1 << 20,
        ..relaxed_limits()
    };
    let Some(mut call) = guard_with(&[("max_chars", "1")], limits) else {
        return;
    };
    assert_eq!(
        call.on_response(response("a long answer")).unwrap(),
        Ok(response("a long answer"))
    );
    let chunk = "✓".repeat(16 << 10);
    for _ in 0..96 {
        assert_eq!(call.on_chunk(&chunk).unwrap(), Ok(chunk.clone()));
    }
    assert_eq!(call.on_chunk("").unwrap(), Ok(String::new()));
    assert_eq!(call.on_stream_end().unwrap(), Ok(String::new()));
}
