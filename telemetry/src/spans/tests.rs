use std::sync::Mutex;

use opentelemetry::trace::{TraceContextExt, TraceFlags};
use opentelemetry::{Array, StringValue};
use tracing::field::Empty;
use tracing_subscriber::layer::SubscriberExt;

use super::*;

/// Runs `f` under a subscriber with our layer (sampler `sampler`) and
/// returns the spans it exported, in the order they ended.
fn exported(sampler: Sampler, f: impl FnOnce()) -> Vec<SpanData> {
    let kept: Arc<Mutex<Vec<SpanData>>> = Arc::default();
    let sink = Arc::clone(&kept);
    let layer = layer(
        sampler,
        InstrumentationScope::builder("bulkhead").build(),
        Arc::new(move |span| sink.lock().unwrap().push(span)),
    );
    tracing::subscriber::with_default(Registry::default().with(layer), f);
    std::mem::take(&mut *kept.lock().unwrap())
}

fn remote(sampled: bool) -> Context {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::NOT_SAMPLED
    };
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736),
        SpanId::from(0x00f0_67aa_0ba9_02b7),
        flags,
        true,
        "client=e2e".parse().unwrap(),
    ))
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    let found: Vec<&Value> = span
        .attributes
        .iter()
        .filter(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
        .collect();
    assert!(found.len() <= 1, "{key} set {} times", found.len());
    found.first().copied()
}

fn server_span() -> tracing::Span {
    tracing::info_span!(
        target: "bulkhead_test",
        "http.server",
        otel.name = "POST /v1/chat/completions",
        otel.kind = "server",
        otel.status_code = Empty,
        http.route = "/v1/chat/completions",
        gen_ai.usage.output_tokens = Empty,
        bulkhead.tenant = Empty,
    )
}

#[test]
fn a_request_s_spans_continue_the_client_s_trace_with_their_fields() {
    let mut propagated = None;
    let spans = exported(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)), || {
        let server = server_span();
        set_parent(&server, &remote(true));
        server.in_scope(|| {
            let upstream =
                tracing::info_span!(target: "bulkhead_test", "upstream", otel.kind = "client");
            propagated = span_context(&upstream);
            // A library's span in between is skipped, not a parent.
            let library = tracing::info_span!(target: "h2", "poll");
            library.in_scope(|| {
                let auth = tracing::info_span!(target: "bulkhead_test", "auth", outcome = Empty);
                auth.record("outcome", "ok");
            });
        });
        server.record("bulkhead.tenant", "demo");
        server.record("gen_ai.usage.output_tokens", 3_u64);
        // By key or as a field, the last value wins.
        set_attribute(&server, "gen_ai.usage.output_tokens", 2_i64);
        server.record("gen_ai.usage.output_tokens", 4_u64);
        set_attribute(&server, "bulkhead.tenant", "demo");
        server.record("otel.status_code", "ERROR");
        set_attribute(
            &server,
            "gen_ai.response.finish_reasons",
            Value::Array(Array::String(vec![StringValue::from("stop")])),
        );
    });

    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["auth", "upstream", "POST /v1/chat/completions"]);
    let (auth, upstream, server) = (&spans[0], &spans[1], &spans[2]);

    // The server span: the client's trace, its span as the remote parent,
    // sampled because the client's was (the root sampler says no).
    let client = remote(true);
    let client = client.span().span_context().clone();
    assert_eq!(server.span_context.trace_id(), client.trace_id());
    assert_eq!(server.parent_span_id, client.span_id());
    assert!(server.parent_span_is_remote);
    assert_eq!(server.span_context.trace_state().header(), "client=e2e");
    assert_eq!(server.span_kind, SpanKind::Server);
    assert_eq!(server.status, Status::error(""));
    assert!(server.start_time <= auth.start_time && server.end_time >= upstream.end_time);
    assert_eq!(
        attr(server, "http.route"),
        Some(&Value::from("/v1/chat/completions"))
    );
    assert_eq!(attr(server, "bulkhead.tenant"), Some(&Value::from("demo")));
    assert_eq!(
        attr(server, "gen_ai.usage.output_tokens"),
        Some(&Value::I64(4)),
        "the last value recorded"
    );
    assert_eq!(
        attr(server, "gen_ai.response.finish_reasons"),
        Some(&Value::Array(Array::String(vec!["stop".into()])))
    );
    for field in ["otel.name", "otel.kind", "otel.status_code"] {
        assert_eq!(
            attr(server, field),
            None,
            "{field} is the span's, not an attribute"
        );
    }

    // Children: the same trace, the server span as a local parent.
    for child in [auth, upstream] {
        assert_eq!(child.span_context.trace_id(), client.trace_id());
        assert_eq!(child.parent_span_id, server.span_context.span_id());
        assert!(!child.parent_span_is_remote);
        assert_ne!(child.span_context.span_id(), server.span_context.span_id());
    }
    assert_eq!(upstream.span_kind, SpanKind::Client);
    assert_eq!(auth.span_kind, SpanKind::Internal);
    assert_eq!(attr(auth, "outcome"), Some(&Value::from("ok")));
    assert_eq!(propagated, Some(upstream.span_context.clone()));
    assert!(upstream.span_context.is_sampled());
}

#[test]
fn unsampled_traces_export_nothing_and_still_propagate() {
    // The client's trace is not sampled: we follow it, and the gpu-host
    // is told so.
    let mut propagated = None;
    let spans = exported(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)), || {
        let server = server_span();
        set_parent(&server, &remote(false));
        set_attribute(&server, "ignored", 1_i64);
        let child = tracing::info_span!(target: "bulkhead_test", parent: &server, "upstream");
        propagated = span_context(&child);
    });
    assert!(spans.is_empty(), "{spans:?}");
    let propagated = propagated.expect("a context even when not sampled");
    assert!(!propagated.is_sampled());
    assert_eq!(
        propagated.trace_id(),
        remote(false).span().span_context().trace_id()
    );

    // No parent and a root sampler that says no.
    let spans = exported(Sampler::AlwaysOff, || {
        server_span()
            .in_scope(|| tracing::info_span!(target: "bulkhead_test", "auth").in_scope(|| ()));
    });
    assert!(spans.is_empty(), "{spans:?}");
}

#[test]
fn a_span_without_a_parent_starts_a_trace_and_garbage_parents_change_nothing() {
    let spans = exported(Sampler::AlwaysOn, || {
        let server = server_span();
        set_parent(&server, &Context::new());
        let _child = tracing::info_span!(target: "bulkhead_test", parent: &server, "auth");
    });
    let (auth, server) = (&spans[0], &spans[1]);
    assert_ne!(server.span_context.trace_id(), TraceId::INVALID);
    assert_eq!(server.parent_span_id, SpanId::INVALID);
    assert!(!server.parent_span_is_remote);
    assert_eq!(auth.parent_span_id, server.span_context.span_id());
    assert_eq!(auth.span_context.trace_id(), server.span_context.trace_id());
}

#[test]
fn our_layer_leaves_the_spans_of_libraries_disabled() {
    let spans = exported(Sampler::AlwaysOn, || {
        // No other layer wants them either, so they are never created:
        // no registry slot, no enter and exit at each poll.
        assert!(tracing::info_span!(target: "h2", "poll").is_disabled());
        assert!(!tracing::info_span!(target: "bulkhead_test", "ours").is_disabled());
    });
    assert_eq!(spans.len(), 1);
}

#[test]
fn without_our_layer_the_helpers_do_nothing() {
    let span = server_span();
    set_parent(&span, &remote(true));
    set_attribute(&span, "k", 1_i64);
    assert_eq!(span_context(&span), None);
    // A subscriber without our layer.
    tracing::subscriber::with_default(Registry::default(), || {
        let span = server_span();
        set_parent(&span, &remote(true));
        assert_eq!(span_context(&span), None);
    });
}
