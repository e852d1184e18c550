//! W3C trace context (`traceparent`, `tracestate`) in and out of HTTP
//! headers and gRPC metadata (which are HTTP/2 headers).

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::SpanContext;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The trace context `headers` carry; an empty context (a new trace
/// starts) when they carry none or a malformed one.
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// Writes `cx`'s trace context into `headers` (nothing when `cx` has no
/// valid span).
pub fn inject(cx: &Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeadersMut(headers));
}

/// Writes the trace context of `span` (a `tracing` span) into `headers`:
/// nothing when the span is not exported.
pub fn inject_span(span: &tracing::Span, headers: &mut HeaderMap) {
    if let Some(sc) = crate::spans::span_context(span) {
        inject_span_context(&sc, headers);
    }
}

/// Writes `sc` as `traceparent` (and `tracestate` when it has entries).
pub fn inject_span_context(sc: &SpanContext, headers: &mut HeaderMap) {
    let parent = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    );
    if let Ok(value) = HeaderValue::from_str(&parent) {
        headers.insert(HeaderName::from_static("traceparent"), value);
    }
    let state = sc.trace_state().header();
    if !state.is_empty()
        && let Ok(value) = HeaderValue::from_str(&state)
    {
        headers.insert(HeaderName::from_static("tracestate"), value);
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    #[test]
    fn a_traceparent_goes_through_and_garbage_starts_a_new_trace() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        headers.insert("tracestate", "vendor=x".parse().unwrap());
        let cx = extract(&headers);
        let span = cx.span().span_context().clone();
        assert_eq!(
            span.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert!(span.is_remote() && span.is_sampled());
        let mut out = HeaderMap::new();
        inject(&cx, &mut out);
        assert_eq!(out["traceparent"], headers["traceparent"]);
        assert_eq!(out["tracestate"], "vendor=x");
        // Our own writer says the same as the SDK's propagator.
        let mut ours = HeaderMap::new();
        inject_span_context(&span, &mut ours);
        assert_eq!(ours, out);

        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert("traceparent", bad.parse().unwrap());
            assert!(!extract(&headers).span().span_context().is_valid(), "{bad}");
        }
    }
}
