//! OpenTelemetry through the real gateway and its gpu-host, exporting to a
//! real OTLP receiver (`bulkhead_tests::otlp`): one trace across both
//! processes that continues the client's `traceparent`, with the GenAI
//! attributes and no prompt text; HTTP/protobuf export configured by the
//! standard variables, with the text of a tenant that opted in to it; and
//! a dead collector that costs requests nothing.

use std::time::Duration;

use bulkhead_testkit::wasm::example;
use bulkhead_tests::otlp::{ReceivedSpan, Receiver};
use bulkhead_tests::{Gateway, PolicyDir, gateway_toml};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const MODEL: &str = "bulkhead-demo-tiny";
/// Long enough for two export intervals and a slow CI machine.
const EXPORTED: Duration = Duration::from_secs(30);
/// Text only the prompt holds: no span may carry it.
const SECRET: &str = "zebracorn-7731";

fn policies(name: &str, telemetry: &str, plugins: &str) -> PolicyDir {
    let policies = PolicyDir::new(name);
    policies.write(
        "gateway.toml",
        &format!("{}{}", gateway_toml(telemetry), policies.state_tables()),
    );
    policies.write(
        "tenants/demo.toml",
        &format!(
            "id = \"demo\"\nclass = \"standard\"\nmodels = [\"{MODEL}\"]\n\n\
             [jwt]\nissuer = \"bulkhead-dev\"\naudience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\n\
             public_keys = [\"dev-keys/demo.pub.pem\"]\ndev_signing_key = \"dev-keys/demo.key.pem\"\n\n\
             {plugins}"
        ),
    );
    policies
}

fn chat(max_tokens: u32) -> String {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": format!("The word is {SECRET}. Mail a@b.example")}],
        "max_tokens": max_tokens,
        "temperature": 0.5,
        "seed": 7,
    })
    .to_string()
}

fn one<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.service == service && s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "{service} `{name}` spans: {spans:#?}");
    found[0]
}

fn has(spans: &[ReceivedSpan], service: &str, name: &str) -> bool {
    spans.iter().any(|s| s.service == service && s.name == name)
}

/// The HTTP server span is named `METHOD /route`.
const CHAT_SPAN: &str = "POST /v1/chat/completions";

#[test]
fn one_trace_runs_from_the_clients_traceparent_through_plugins_to_the_gpu_host() {
    let receiver = Receiver::grpc();
    // A collector's API key: spans arrive only if both processes send it.
    receiver.require_header("x-api-key", "k=1,2");
    let policies = policies(
        "otel-grpc",
        &format!("[telemetry]\nendpoint = \"{}\"\n", receiver.endpoint()),
        "[plugins]\non_request = [\"pii-redact\"]\n",
    );
    // Metrics every half second, so the test sees them soon.
    let gateway = Gateway::start_with_env(
        &policies,
        &[
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "X-Api-Key=k%3D1%2C2"),
        ],
    );
    let token = policies.token("demo", &[]);
    let uploader = policies.token("demo", &["--scope", "plugins:write"]);
    let plugin = example("pii-redact");
    let uploaded = gateway.request_bytes(
        "PUT",
        "/v1/plugins/pii-redact",
        Some(&uploader),
        "application/wasm",
        &plugin,
    );
    assert!(
        uploaded.status == 200 || uploaded.status == 201,
        "{}",
        uploaded.body
    );

    let trace_id = format!(
        "{:032x}",
        0x4bf9_2f35_77b3_4da6_u128 << 64 | u128::from(std::process::id())
    );
    let client_span = "00f067aa0ba902b7";
    let response = gateway.request_with(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        &[
            ("traceparent", &format!("00-{trace_id}-{client_span}-01")),
            ("tracestate", "client=e2e"),
        ],
        &chat(6),
    );
    assert_eq!(response.status, 200, "{}", response.body);
    let body = response.json();

    let spans = receiver.trace(&trace_id, "the request's spans", EXPORTED, |t| {
        [CHAT_SPAN, "auth", "admission", "plugin", "upstream"]
            .iter()
            .all(|n| has(t, "bulkhead", n))
            && ["gpu_host.generate", "queue", "prefill", "decode"]
                .iter()
                .all(|n| has(t, "bulkhead-gpu-host", n))
    });

    // Parentage: client → server span → auth, admission, plugin, upstream
    // → the gpu-host's generate → queue, prefill, decode.
    let server = one(&spans, "bulkhead", CHAT_SPAN);
    assert_eq!(
        server.parent_span_id, client_span,
        "the client's traceparent"
    );
    assert_eq!(server.kind, 2, "a server span");
    for child in ["auth", "admission", "plugin", "upstream"] {
        assert_eq!(
            one(&spans, "bulkhead", child).parent_span_id,
            server.span_id,
            "{child}"
        );
    }
    let upstream = one(&spans, "bulkhead", "upstream");
    assert_eq!(upstream.kind, 3, "a client span");
    let generate = one(&spans, "bulkhead-gpu-host", "gpu_host.generate");
    assert_eq!(generate.parent_span_id, upstream.span_id);
    assert_eq!(generate.kind, 2);
    for child in spans
        .iter()
        .filter(|s| s.service == "bulkhead-gpu-host" && s.name != "gpu_host.generate")
    {
        assert_eq!(child.parent_span_id, generate.span_id, "{}", child.name);
    }
    // Times nest: the host's work happened inside the upstream call.
    assert!(generate.start_unix_ns >= upstream.start_unix_ns);
    assert!(server.end_unix_ns >= upstream.end_unix_ns);

    // The GenAI attributes, with the values the client got.
    let usage = &body["usage"];
    let str_attr = |s: &ReceivedSpan, k: &str| s.attr(k).as_str().unwrap().to_string();
    assert_eq!(str_attr(server, "gen_ai.operation.name"), "chat");
    assert_eq!(str_attr(server, "gen_ai.request.model"), MODEL);
    assert_eq!(server.attr("gen_ai.request.max_tokens"), &json!(6));
    assert_eq!(server.attr("gen_ai.request.temperature"), &json!(0.5));
    assert_eq!(server.attr("gen_ai.response.id"), &body["id"]);
    assert_eq!(
        server.attr("gen_ai.response.finish_reasons"),
        &json!([body["choices"][0]["finish_reason"]])
    );
    assert_eq!(
        server.attr("gen_ai.usage.input_tokens"),
        &usage["prompt_tokens"]
    );
    assert_eq!(
        server.attr("gen_ai.usage.output_tokens"),
        &usage["completion_tokens"]
    );
    assert_eq!(str_attr(server, "bulkhead.tenant"), "demo");
    assert_eq!(server.attr("http.response.status_code"), &json!(200));
    assert_eq!(str_attr(server, "http.route"), "/v1/chat/completions");
    assert_eq!(
        generate.attr("gen_ai.usage.input_tokens"),
        &usage["prompt_tokens"]
    );
    assert_eq!(
        generate.attr("gen_ai.usage.output_tokens"),
        &usage["completion_tokens"]
    );
    assert_eq!(str_attr(generate, "bulkhead.tenant"), "demo");

    let admission = one(&spans, "bulkhead", "admission");
    assert_eq!(
        str_attr(admission, "bulkhead.admission.outcome"),
        "admitted"
    );
    let plugin_span = one(&spans, "bulkhead", "plugin");
    assert_eq!(str_attr(plugin_span, "bulkhead.plugin.name"), "pii-redact");
    let digest: String = Sha256::digest(&plugin)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(str_attr(plugin_span, "bulkhead.plugin.digest"), digest);
    assert_eq!(str_attr(plugin_span, "bulkhead.plugin.outcome"), "ok");
    assert!(
        plugin_span
            .attr("bulkhead.plugin.duration_ms")
            .as_f64()
            .unwrap()
            > 0.0
    );
    let decode = one(&spans, "bulkhead-gpu-host", "decode");
    assert!(
        decode
            .attr("bulkhead.time_to_first_token_ms")
            .as_f64()
            .unwrap()
            > 0.0
    );
    let prefilled: i64 = spans
        .iter()
        .filter(|s| s.name == "prefill")
        .map(|s| s.attr("bulkhead.prefill.tokens").as_i64().unwrap())
        .sum();
    assert!(
        prefilled >= usage["prompt_tokens"].as_i64().unwrap(),
        "{prefilled}"
    );

    // No prompt or completion text anywhere.
    let completion = body["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    for span in &spans {
        for (key, value) in &span.attributes {
            let text = value.to_string();
            assert!(
                !text.contains(SECRET),
                "{}.{key} holds the prompt",
                span.name
            );
            assert!(
                completion.len() < 4 || !text.contains(&completion),
                "{}.{key} holds the completion",
                span.name
            );
        }
    }
    // Counted once the collector's answer is back, which may be after
    // the receiver has the spans.
    gateway.eventually("the exported spans counted", || {
        gateway
            .admin
            .metric("bulkhead_trace_spans_total", &[("outcome", "exported")])
            >= 5.0
    });

    // The GenAI metrics of that one generation, with tenant and model.
    let labels = [
        ("gen_ai.operation.name", json!("chat")),
        ("gen_ai.request.model", json!(MODEL)),
        ("bulkhead.tenant", json!("demo")),
    ];
    let latest = |name: &str, extra: Option<(&str, Value)>| {
        let wait = std::time::Instant::now() + EXPORTED;
        loop {
            let found = receiver.points().into_iter().rev().find(|p| {
                p.metric == name
                    && labels.iter().all(|(k, v)| p.attributes.get(*k) == Some(v))
                    && extra
                        .as_ref()
                        .is_none_or(|(k, v)| p.attributes.get(*k) == Some(v))
            });
            if let Some(point) = found {
                assert_eq!(point.service, "bulkhead");
                return point;
            }
            assert!(
                std::time::Instant::now() < wait,
                "no {name}: {:#?}",
                receiver.points()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let input = latest(
        "gen_ai.client.token.usage",
        Some(("gen_ai.token.type", json!("input"))),
    );
    assert_eq!(
        (input.count, input.sum),
        (1, usage["prompt_tokens"].as_f64().unwrap())
    );
    let output = latest(
        "gen_ai.client.token.usage",
        Some(("gen_ai.token.type", json!("output"))),
    );
    assert_eq!(
        (output.count, output.sum),
        (1, usage["completion_tokens"].as_f64().unwrap())
    );
    let duration = latest("gen_ai.server.request.duration", None);
    let ttft = latest("gen_ai.server.time_to_first_token", None);
    assert_eq!(
        (duration.count, ttft.count, duration.unit.as_str()),
        (1, 1, "s")
    );
    assert!(
        0.0 < ttft.sum && ttft.sum <= duration.sum,
        "{ttft:?} {duration:?}"
    );
    if usage["completion_tokens"].as_u64().unwrap() > 1 {
        let per = latest("gen_ai.server.time_per_output_token", None);
        assert!(per.count == 1 && per.sum > 0.0, "{per:?}");
    }
}

#[test]
fn the_standard_variables_win_and_export_over_http_from_both_processes() {
    let receiver = Receiver::http();
    receiver.require_header("authorization", "Bearer collector-key");
    // The file names a collector nobody runs; the variables win. This
    // tenant opts in to recording its prompt and completion text.
    let policies = policies(
        "otel-http",
        "[telemetry]\nendpoint = \"http://127.0.0.1:9\"\nservice_name = \"from-file\"\n",
        "[telemetry]\nrecord_content = true\n",
    );
    let gateway = Gateway::start_with_env(
        &policies,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "gateway-under-test"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "authorization=Bearer%20collector-key",
            ),
        ],
    );
    let token = policies.token("demo", &[]);
    let response = gateway.request("POST", "/v1/chat/completions", Some(&token), Some(&chat(3)));
    assert_eq!(response.status, 200, "{}", response.body);
    let body = response.json();
    // No traceparent: the gateway starts the trace.
    let server = server_span(&receiver, &body["id"]);
    assert_eq!(server.service, "gateway-under-test");
    assert_eq!(server.parent_span_id, "", "a new trace's root");
    receiver.trace(&server.trace_id, "the gpu-host's spans", EXPORTED, |t| {
        has(t, "bulkhead-gpu-host", "gpu_host.generate") && has(t, "bulkhead-gpu-host", "decode")
    });

    // The opted-in tenant's text, in the GenAI conventions' shape.
    let messages = |span: &ReceivedSpan, key: &str| -> Value {
        serde_json::from_str(span.attr(key).as_str().unwrap()).unwrap()
    };
    let prompt = json!([{
        "role": "user",
        "parts": [{"type": "text", "content": format!("The word is {SECRET}. Mail a@b.example")}],
    }]);
    let reply = |text: &str, finish: &Value| {
        json!([{
            "role": "assistant",
            "parts": [{"type": "text", "content": text}],
            "finish_reason": finish,
        }])
    };
    assert_eq!(messages(&server, "gen_ai.input.messages"), prompt);
    let choice = &body["choices"][0];
    assert_eq!(
        messages(&server, "gen_ai.output.messages"),
        reply(
            choice["message"]["content"].as_str().unwrap(),
            &choice["finish_reason"]
        )
    );

    // Streamed: the text is gathered from the chunks the client got.
    let mut streamed: Value = serde_json::from_str(&chat(4)).unwrap();
    streamed["stream"] = json!(true);
    let response = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&token),
        Some(&streamed.to_string()),
    );
    assert_eq!(response.status, 200, "{}", response.body);
    let (mut id, mut text, mut finish) = (Value::Null, String::new(), Value::Null);
    for line in response.body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        id = chunk["id"].clone();
        text.push_str(
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or(""),
        );
        if !chunk["choices"][0]["finish_reason"].is_null() {
            finish = chunk["choices"][0]["finish_reason"].clone();
        }
    }
    assert!(!text.is_empty() && !finish.is_null(), "{}", response.body);
    let server = server_span(&receiver, &id);
    assert_eq!(messages(&server, "gen_ai.input.messages"), prompt);
    assert_eq!(
        messages(&server, "gen_ai.output.messages"),
        reply(&text, &finish)
    );
}

/// The exported server span of the response with this id.
fn server_span(receiver: &Receiver, id: &Value) -> ReceivedSpan {
    let wait = std::time::Instant::now() + EXPORTED;
    loop {
        let found = receiver
            .spans()
            .into_iter()
            .find(|s| s.name == CHAT_SPAN && s.attributes.get("gen_ai.response.id") == Some(id));
        if let Some(server) = found {
            return server;
        }
        assert!(
            std::time::Instant::now() < wait,
            "no server span for {id}: {:#?}",
            receiver.spans()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_dead_collector_costs_requests_nothing_and_json_logs_carry_the_trace() {
    // A port nothing listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let policies = policies(
        "otel-dead",
        &format!(
            "[telemetry]\nendpoint = \"http://{dead}\"\nexport_timeout_ms = 500\n\n[log]\nformat = \"json\"\n"
        ),
        "",
    );
    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    for _ in 0..3 {
        let r = gateway.request("POST", "/v1/chat/completions", Some(&token), Some(&chat(2)));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    gateway.eventually("failed exports counted", || {
        gateway
            .admin
            .metric("bulkhead_trace_spans_total", &[("outcome", "failed")])
            > 0.0
    });

    // An operator call refused inside a traced request: its warning is a
    // JSON line with the client's trace id.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let refused = gateway.admin.request_with(
        "GET",
        "/admin/v1/models",
        Some("not-a-token"),
        &[("traceparent", &format!("00-{trace_id}-b7ad6b7169203331-01"))],
        "",
    );
    assert_eq!(refused.status, 401, "{}", refused.body);
    let (_, line) = gateway.log.wait_for(trace_id, 0, EXPORTED);
    let line: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["trace_id"], trace_id, "{line}");
    assert_eq!(line["span_id"].as_str().unwrap().len(), 16, "{line}");
    assert!(
        line["message"]
            .as_str()
            .unwrap()
            .contains("operator call refused"),
        "{line}"
    );
    // Every line is JSON, the gpu-host's too.
    let text = gateway.log.text();
    assert!(text.contains("\"target\":\"bulkhead_gpu_host"), "{text}");
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        assert!(serde_json::from_str::<Value>(l).is_ok(), "not JSON: {l}");
    }
}

#[test]
fn hourly_usage_with_gpu_seconds_survives_a_restart_and_exports_as_csv() {
    let usage_dir =
        std::env::temp_dir().join(format!("bulkhead-e2e-usage-journal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&usage_dir);
    let policies = policies(
        "usage",
        &format!("[usage]\ndir = \"{}\"\n", usage_dir.display()),
        "",
    );
    let operator = policies.operator_token(&["usage:read"], &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The hour now, as the API writes it, and the range around it.
    let hour = |secs: u64| {
        let out = std::process::Command::new("date")
            .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let (from, to) = (hour(now - 3600), hour(now + 2 * 3600));
    let query = format!("/admin/v1/usage?from={from}&to={to}&tenant=demo");

    let gateway = Gateway::start(&policies);
    let token = policies.token("demo", &[]);
    let mut expected = (0u64, 0u64, 0u64);
    for max_tokens in [3, 5] {
        let r = gateway.request(
            "POST",
            "/v1/chat/completions",
            Some(&token),
            Some(&chat(max_tokens)),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let u = &r.json()["usage"];
        expected.0 += 1;
        expected.1 += u["prompt_tokens"].as_u64().unwrap();
        expected.2 += u["completion_tokens"].as_u64().unwrap();
    }
    let rows = |gateway: &Gateway| {
        let r = gateway.admin.request("GET", &query, Some(&operator), None);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["data"].as_array().unwrap().clone()
    };
    let before = rows(&gateway);
    assert_eq!(before.len(), 1, "{before:?}");
    let row = &before[0];
    assert_eq!(
        (row["tenant"].as_str(), row["model"].as_str()),
        (Some("demo"), Some(MODEL))
    );
    assert_eq!(
        (
            row["requests"].as_u64().unwrap(),
            row["prompt_tokens"].as_u64().unwrap(),
            row["completion_tokens"].as_u64().unwrap()
        ),
        expected
    );
    let gpu_seconds = row["gpu_seconds"].as_f64().unwrap();
    assert!(gpu_seconds > 0.0 && gpu_seconds < 60.0, "{row}");
    assert!(row["hour"].as_str().unwrap().ends_with(":00:00Z"), "{row}");

    // Bad ranges are named.
    for (bad, param) in [
        (format!("/admin/v1/usage?from={from}"), "to"),
        (
            "/admin/v1/usage?from=yesterday&to=2027-01-01".to_string(),
            "from",
        ),
        (format!("/admin/v1/usage?from={to}&to={from}"), "to"),
        (
            format!("/admin/v1/usage?from={from}&to={to}&days=3"),
            "days",
        ),
    ] {
        let r = gateway.admin.request("GET", &bad, Some(&operator), None);
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{bad}: {}", r.body);
    }

    // A restart reads the journal back: the same counts.
    let status = gateway.terminate();
    assert!(status.success(), "{status}");
    let gateway = Gateway::start(&policies);
    assert_eq!(rows(&gateway), before);

    // The CLI's export of the same hours.
    let admin_url = format!("http://{}", gateway.admin.addr);
    let (ok, csv) = bulkhead_tests::cli(&[
        "usage", "export", "--url", &admin_url, "--token", &operator, "--from", &from, "--to", &to,
    ]);
    assert!(ok, "{csv}");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "hour,tenant,model,requests,prompt_tokens,completion_tokens,gpu_seconds"
    );
    assert_eq!(
        lines[1],
        format!(
            "{},demo,{MODEL},{},{},{},{}",
            row["hour"].as_str().unwrap(),
            expected.0,
            expected.1,
            expected.2,
            row["gpu_seconds"]
        )
    );
    let (ok, jsonl) = bulkhead_tests::cli(&[
        "usage", "export", "--url", &admin_url, "--token", &operator, "--from", &from, "--to", &to,
        "--format", "jsonl",
    ]);
    assert!(ok, "{jsonl}");
    let line: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(line["requests"], json!(expected.0));
    drop(gateway);
    let _ = std::fs::remove_dir_all(&usage_dir);
}
