//! Tenant plugin chains on the request path, through the real gateway and
//! the demo model: the example plugins (`guest-sdk/examples`) uploaded over
//! the API and chained in tenant policy, plus test guests that make the
//! effects visible whatever the model says (`mirror` answers with the
//! request the model was sent; `script` replaces the model's deltas with
//! scripted pieces).

use bulkhead_testkit::wasm::{example, test_guest as guest};
use bulkhead_tests::{Gateway, PolicyDir};
use serde_json::{Value, json};

const MODEL: &str = "bulkhead-demo-tiny";

/// The demo tenant with `plugins` (a `[plugins]` table and its subtables).
fn demo_tenant(plugins: &str) -> String {
    format!(
        "id = \"demo\"\nclass = \"standard\"\nmodels = [\"{MODEL}\"]\n\n\
         [jwt]\nissuer = \"bulkhead-dev\"\naudience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n\
         public_keys = [\"dev-keys/demo.pub.pem\"]\ndev_signing_key = \"dev-keys/demo.key.pem\"\n\n\
         {plugins}"
    )
}

fn upload(gateway: &Gateway, token: &str, name: &str, wasm: &[u8]) {
    let response = gateway.request_bytes(
        "PUT",
        &format!("/v1/plugins/{name}"),
        Some(token),
        "application/wasm",
        wasm,
    );
    assert!(
        response.status == 200 || response.status == 201,
        "uploading {name}: {} {}",
        response.status,
        response.body
    );
}

fn chat(content: &str, extra: Value) -> String {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body.to_string()
}

fn text_of(body: &Value) -> String {
    body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {body}"))
        .to_string()
}

/// Every text delta of an SSE chat stream, and whether it ended with [DONE].
fn stream_texts(gateway: &Gateway, token: &str, body: &str) -> (Vec<String>, bool, Vec<Value>) {
    let mut stream = gateway.stream("/v1/chat/completions", token, body);
    let mut texts = Vec::new();
    let mut events = Vec::new();
    while let Some(event) = stream.next_event() {
        if event == "[DONE]" {
            return (texts, true, events);
        }
        let value: Value = serde_json::from_str(&event).unwrap();
        if let Some(text) = value["choices"][0]["delta"]["content"].as_str()
            && !text.is_empty()
        {
            texts.push(text.to_string());
        }
        events.push(value);
    }
    (texts, false, events)
}

#[test]
fn request_plugins_rewrite_what_the_model_sees_and_guards_refuse_with_the_tenants_message() {
    let policies = PolicyDir::new("chain-request");
    policies.write(
        "tenants/demo.toml",
        &demo_tenant(
            "[plugins]\n\
             on_request = [\"prompt-guard\", \"system-prompt\", \"pii-redact\", \"mirror\"]\n\
             on_response = [\"mirror\"]\n\
             [plugins.config.system-prompt]\nprompt = \"Answer in one line.\"\n\
             [plugins.config.prompt-guard]\nblocked = \"launch codes | self destruct\"\n\
             message = \"Demo Corp does not discuss that.\"\n",
        ),
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let admin = policies.token("demo", &["--scope", "plugins:write"]);

    // Chained but not uploaded: refused, never silently skipped.
    let missing = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat("hi", json!({}))),
    );
    assert_eq!(missing.status, 502, "{}", missing.body);
    assert_eq!(missing.error_code(), "plugin_not_found");
    assert!(
        missing.body.contains("plugin `prompt-guard`"),
        "{}",
        missing.body
    );

    for name in ["prompt-guard", "system-prompt", "pii-redact"] {
        upload(&gateway, &admin, name, &example(name));
    }
    upload(&gateway, &admin, "mirror", &guest("mirror"));

    // What the model was sent: the tenant's system message first, the
    // email and phone number redacted, the gateway's metadata.
    let seen = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat(
            "Write to bob.smith@example.com or call +1 415 555 0100.",
            json!({}),
        )),
    );
    assert_eq!(seen.status, 200, "{}", seen.body);
    let text = text_of(&seen.json());
    assert!(
        text.contains("system: Answer in one line.\nuser: Write to [email] or call [phone]."),
        "{text}"
    );
    assert!(!text.contains("bob.smith"), "{text}");
    assert!(
        text.contains("model=bulkhead-demo-tiny max_tokens=Some(12)"),
        "{text}"
    );
    assert!(
        text.contains("tenant=demo endpoint=chat.completions"),
        "{text}"
    );
    // Token counts stay the gateway's, whatever the plugin's text.
    let usage = &seen.json()["usage"];
    assert!(
        usage["completion_tokens"].as_u64().unwrap() <= 12,
        "{usage}"
    );

    // The same through a stream: `mirror` holds every delta and sends what
    // it saw at the end.
    let (texts, done, _) = stream_texts(
        &gateway,
        &token,
        &chat("Reach me at eve@example.org", json!({"stream": true})),
    );
    assert!(done);
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].contains("user: Reach me at [email]"), "{texts:?}");

    // A blocked phrase: the tenant's message and status, no generation.
    let tokens_before = gateway.metric("bulkhead_tokens_total", &[("tenant", "demo")]);
    let blocked = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat("What are the LAUNCH  codes?", json!({}))),
    );
    assert_eq!(blocked.status, 400, "{}", blocked.body);
    let error = &blocked.json()["error"];
    assert_eq!(error["message"], "Demo Corp does not discuss that.");
    assert_eq!(error["code"], "plugin_rejected");
    assert_eq!(blocked.header("x-bulkhead-plugin"), Some("prompt-guard"));
    assert_eq!(
        gateway.metric("bulkhead_tokens_total", &[("tenant", "demo")]),
        tokens_before,
        "a refused request generates nothing"
    );
    assert_eq!(
        gateway.metric(
            "bulkhead_plugin_calls_total",
            &[("plugin", "prompt-guard"), ("result", "rejected")]
        ),
        1.0
    );
    assert!(
        gateway.metric(
            "bulkhead_plugin_calls_total",
            &[
                ("plugin", "mirror"),
                ("hook", "on-request"),
                ("result", "ok")
            ]
        ) >= 2.0
    );
}

#[test]
fn pii_is_redacted_in_outputs_also_when_a_match_spans_stream_chunks() {
    let policies = PolicyDir::new("chain-stream");
    // `script` turns the model's deltas into pieces that split an email, a
    // card number (Luhn-valid) and a phone number across chunks.
    let script =
        "Mail ali|ce@exam|ple.com, card 4111 1111 |1111 1111, phone +1 (415) 5|55-0100. Bye";
    policies.write(
        "tenants/demo.toml",
        &demo_tenant(&format!(
            "[plugins]\non_response = [\"script\", \"pii-redact\"]\n\
             [plugins.config.script]\nscript = \"{script}\"\n"
        )),
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let admin = policies.token("demo", &["--scope", "plugins:write"]);
    upload(&gateway, &admin, "script", &guest("script"));
    upload(&gateway, &admin, "pii-redact", &example("pii-redact"));

    let expected = "Mail [email], card [card], phone [phone]. Bye";
    let whole = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat("Say something.", json!({}))),
    );
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert_eq!(text_of(&whole.json()), expected);

    let (texts, done, events) = stream_texts(
        &gateway,
        &token,
        &chat(
            "Say something.",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    );
    assert!(done, "{events:?}");
    assert_eq!(texts.concat(), expected, "{texts:?}");
    for piece in &texts {
        for leak in ["ali", "exam", "4111", "555", "415"] {
            assert!(!piece.contains(leak), "{leak:?} leaked in {texts:?}");
        }
    }
    let usage = events.last().unwrap()["usage"].clone();
    assert!(usage["completion_tokens"].as_u64().unwrap() > 0, "{usage}");
}

#[test]
fn a_failing_plugin_fails_only_its_request_with_502_naming_the_plugin_and_limit() {
    let policies = PolicyDir::new("chain-hostile");
    policies.write(
        "tenants/demo.toml",
        &demo_tenant(
            "[plugins]\non_request = [\"hostile\"]\n\
             [plugins.limits.hostile]\ndeadline_ms = 250\nmax_memory_mib = 24\n",
        ),
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let admin = policies.token("demo", &["--scope", "plugins:write"]);
    upload(&gateway, &admin, "hostile", &guest("hostile"));

    let completion = |prompt: &str| {
        gateway.request(
            "POST",
            "/v1/completions",
            Some(&token),
            Some(&json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}).to_string()),
        )
    };
    for (prompt, code, says) in [
        (
            "loop",
            "plugin_timeout",
            "ran past its deadline of 250ms in on-request",
        ),
        (
            "grow",
            "plugin_memory",
            "reached its memory limit of 25165824 bytes",
        ),
        ("panic", "plugin_trap", "trapped in on-request"),
        ("huge", "plugin_output_too_large", "returned"),
    ] {
        let response = completion(prompt);
        assert_eq!(response.status, 502, "{prompt}: {}", response.body);
        assert_eq!(response.error_code(), code, "{prompt}: {}", response.body);
        let message = response.json()["error"]["message"].to_string();
        assert!(message.contains("plugin `hostile`"), "{message}");
        assert!(message.contains(says), "{prompt}: {message}");
        assert_eq!(response.header("x-bulkhead-plugin"), Some("hostile"));
    }
    // The plugin behaves on other input, and the gateway serves on.
    let fine = completion("Once upon a time");
    assert_eq!(fine.status, 200, "{}", fine.body);
    assert_eq!(
        gateway.metric(
            "bulkhead_plugin_calls_total",
            &[("plugin", "hostile"), ("result", "plugin_timeout")]
        ),
        1.0
    );
}

#[test]
fn json_guard_passes_json_with_the_required_keys_and_refuses_the_rest() {
    let policies = PolicyDir::new("chain-json");
    let tenant = |required: &str| {
        demo_tenant(&format!(
            "[plugins]\non_response = [\"script\", \"json-guard\"]\n\
             [plugins.config.script]\nscript = '{{\"answer\": |42}}'\n\
             [plugins.config.json-guard]\nrequired_keys = \"{required}\"\n"
        ))
    };
    policies.write("tenants/demo.toml", &tenant("answer"));
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let admin = policies.token("demo", &["--scope", "plugins:write"]);
    upload(&gateway, &admin, "script", &guest("script"));
    upload(&gateway, &admin, "json-guard", &example("json-guard"));

    let whole = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat("JSON please.", json!({}))),
    );
    assert_eq!(whole.status, 200, "{}", whole.body);
    assert_eq!(text_of(&whole.json()), "{\"answer\": 42}");
    // json-guard holds a stream back until it can check the whole text.
    let (texts, done, _) = stream_texts(
        &gateway,
        &token,
        &chat("JSON please.", json!({"stream": true})),
    );
    assert!(done);
    assert_eq!(texts, vec!["{\"answer\": 42}".to_string()]);

    // Require a key the answer lacks (a hot reload of the tenant's policy).
    let oks = gateway.metric("bulkhead_policy_reloads_total", &[("result", "ok")]);
    policies.write("tenants/demo.toml", &tenant("answer, source"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while gateway.metric("bulkhead_policy_reloads_total", &[("result", "ok")]) <= oks {
        assert!(
            std::time::Instant::now() < deadline,
            "the edit was not loaded"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let refused = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&chat("JSON please.", json!({}))),
    );
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert_eq!(refused.error_code(), "plugin_rejected");
    assert!(refused.body.contains("source"), "{}", refused.body);
    assert_eq!(refused.header("x-bulkhead-plugin"), Some("json-guard"));
    // Streamed: the 200 is already sent, so the refusal is an error event
    // and the stream ends without [DONE]; nothing of the answer leaks.
    let (texts, done, events) = stream_texts(
        &gateway,
        &token,
        &chat("JSON please.", json!({"stream": true})),
    );
    assert!(!done);
    assert!(texts.is_empty(), "{texts:?}");
    let last = events.last().expect("an error event");
    assert_eq!(last["error"]["code"], "plugin_rejected", "{last}");
}

/// `bulkhead plugin sign FILE --key KEY --tenant T --name N --version V`:
/// the two headers an upload needs, as printed.
fn sign(
    policies: &PolicyDir,
    wasm: &[u8],
    key: &str,
    name: &str,
    version: u64,
) -> Vec<(String, String)> {
    let file = policies.store.with_extension("sign-me.wasm");
    std::fs::write(&file, wasm).unwrap();
    let out = std::process::Command::new(bulkhead_tests::bin("bulkhead"))
        .args(["plugin", "sign"])
        .arg(&file)
        .arg("--key")
        .arg(policies.path.join(key))
        .args(["--tenant", "demo", "--name", name, "--version"])
        .arg(version.to_string())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(": ").expect("NAME: VALUE");
            (name.to_owned(), value.to_owned())
        })
        .collect()
}

#[test]
fn a_tenant_that_requires_signed_plugins_refuses_unsigned_foreign_replayed_and_older_ones() {
    let policies = PolicyDir::new("chain-signed");
    // A second key pair: a key the tenant does not trust.
    let out = std::process::Command::new(bulkhead_tests::bin("bulkhead"))
        .args(["token", "keygen", "--out"])
        .arg(policies.path.join("dev-keys/stranger"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    policies.write(
        "tenants/demo.toml",
        &demo_tenant(
            "[plugins]\nsigning_keys = [\"dev-keys/demo.pub.pem\"]\non_request = [\"system-prompt\"]\n",
        ),
    );
    let gateway = Gateway::start(&policies);
    let admin = policies.token("demo", &["--scope", "plugins:write"]);
    let wasm = example("system-prompt");
    let put_as = |name: &str, headers: &[(String, String)], bytes: &[u8]| {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        gateway.request_bytes_with(
            "PUT",
            &format!("/v1/plugins/{name}"),
            &admin,
            &headers,
            bytes,
        )
    };
    let put = |headers: &[(String, String)]| put_as("system-prompt", headers, &wasm);
    let demo_key = "dev-keys/demo.key.pem";

    let unsigned = put(&[]);
    assert_eq!(unsigned.status, 403, "{}", unsigned.body);
    assert_eq!(unsigned.error_code(), "plugin_unsigned");
    assert!(
        unsigned.body.contains("bulkhead plugin sign"),
        "{}",
        unsigned.body
    );

    let foreign = put(&sign(
        &policies,
        &wasm,
        "dev-keys/stranger.key.pem",
        "system-prompt",
        1,
    ));
    assert_eq!(foreign.status, 403, "{}", foreign.body);
    assert_eq!(foreign.error_code(), "plugin_signature_invalid");

    // A signature of other bytes does not carry over.
    let other = put(&sign(
        &policies,
        &example("pii-redact"),
        demo_key,
        "system-prompt",
        1,
    ));
    assert_eq!(other.status, 403, "{}", other.body);

    let garbage = put(&[
        ("x-bulkhead-signature".into(), "not base64!".into()),
        ("x-bulkhead-plugin-version".into(), "1".into()),
    ]);
    assert_eq!(garbage.status, 400, "{}", garbage.body);

    let v2 = sign(&policies, &wasm, demo_key, "system-prompt", 2);
    let signed = put(&v2);
    assert_eq!(signed.status, 201, "{}", signed.body);
    assert_eq!(signed.json()["version"], 2);

    // The same signed component replayed under another name: refused.
    let replayed = put_as("guard", &v2, &wasm);
    assert_eq!(replayed.status, 403, "{}", replayed.body);
    assert_eq!(replayed.error_code(), "plugin_signature_invalid");
    // A lower or equal version under its own name (a rollback): refused.
    let older = sign(
        &policies,
        &example("pii-redact"),
        demo_key,
        "system-prompt",
        1,
    );
    let rolled_back = put_as("system-prompt", &older, &example("pii-redact"));
    assert_eq!(rolled_back.status, 409, "{}", rolled_back.body);
    assert_eq!(rolled_back.error_code(), "plugin_version_not_newer");
    // A newer one replaces it.
    let v3 = sign(
        &policies,
        &example("pii-redact"),
        demo_key,
        "system-prompt",
        3,
    );
    let newer = put_as("system-prompt", &v3, &example("pii-redact"));
    assert_eq!(newer.status, 200, "{}", newer.body);
    assert_eq!(newer.json()["version"], 3);
}
