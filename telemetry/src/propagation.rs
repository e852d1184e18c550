//! W3C trace context (`traceparent`, `tracestate`) in and out of HTTP
//! headers and gRPC metadata (which are HTTP/2 headers).

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::SpanContext;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The trace context `headers` carry; an empty context (a new trace
/// starts) when they carry none or a malformed one.
pub fn extract(headers: &HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

/// Writes the trace context of `span` (a `tracing` span) into `headers`:
/// nothing when the span is not exported.
pub fn inject_span(span: &tracing::Span, headers: &mut HeaderMap) {
    if let Some(sc) = crate::spans::span_context(span) {
        inject_span_context(&sc, headers);
    }
}

/// Writes `sc` as `traceparent` (and `tracestate` when it has entries).
///
/// `traceparent` goes out marked sensitive, which HTTP/2 encodes as "never
/// indexed": its value is new on every request, so an HPACK encoder that
/// indexed it would search a growing chain of dead entries for a match,
/// insert the value, and evict the connection's useful entries to make room
/// (measured: the largest part of what tracing added to the gateway's
/// upstream header encoding). It is no secret.
pub fn inject_span_context(sc: &SpanContext, headers: &mut HeaderMap) {
    if let Ok(mut value) = HeaderValue::from_bytes(&traceparent(sc)) {
        value.set_sensitive(true);
        headers.insert(HeaderName::from_static("traceparent"), value);
    }
    let state = sc.trace_state().header();
    if !state.is_empty()
        && let Ok(value) = HeaderValue::from_str(&state)
    {
        headers.insert(HeaderName::from_static("tracestate"), value);
    }
}

/// `00-{trace id}-{span id}-{flags}` in lower-case hex.
fn traceparent(sc: &SpanContext) -> [u8; 55] {
    fn hex(out: &mut [u8], bytes: &[u8]) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 0xf)];
        }
    }
    let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
    hex(&mut out[3..35], &sc.trace_id().to_bytes());
    hex(&mut out[36..52], &sc.span_id().to_bytes());
    hex(&mut out[53..55], &[sc.trace_flags().to_u8()]);
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::propagation::Injector;
    use opentelemetry::trace::{SpanId, TraceContextExt, TraceFlags, TraceId};

    /// The SDK's propagator writes here: the reference our writer is
    /// checked against.
    fn inject(cx: &Context, headers: &mut HeaderMap) {
        TraceContextPropagator::new().inject_context(cx, &mut HeadersMut(headers));
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
        // Never indexed by HTTP/2: a value new on every request.
        assert!(ours["traceparent"].is_sensitive());
        for (trace, span, flags) in [
            (u128::MAX, u64::MAX, TraceFlags::NOT_SAMPLED),
            (1, 0xa0b1_c2d3_e4f5_0617, TraceFlags::SAMPLED),
        ] {
            let sc = SpanContext::new(
                TraceId::from(trace),
                SpanId::from(span),
                flags,
                true,
                Default::default(),
            );
            let cx = Context::new().with_remote_span_context(sc.clone());
            let (mut theirs, mut ours) = (HeaderMap::new(), HeaderMap::new());
            inject(&cx, &mut theirs);
            inject_span_context(&sc, &mut ours);
            assert_eq!(ours["traceparent"], theirs["traceparent"]);
            // The SDK writes an empty `tracestate`; W3C lets us omit it.
            assert!(!ours.contains_key("tracestate"));
        }

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
