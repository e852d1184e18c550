//! The gateway's spans. Every authenticated route runs inside an HTTP
//! server span that continues the client's W3C `traceparent` (or starts a
//! trace); inference adds the GenAI attributes to it and children for
//! auth, admission, each plugin call and the upstream call, whose context
//! goes to the gpu-host in the gRPC metadata.
//!
//! ```text
//! POST /v1/chat/completions (server span: bulkhead.tenant, gen_ai.*)
//!   ├─ auth
//!   ├─ admission      (bulkhead.admission.limit: what refused it)
//!   ├─ plugin         one per hook call (name, digest, time, outcome)
//!   └─ upstream       the gRPC Generate → gpu-host's spans below it
//! ```
//!
//! Nothing here records prompt or completion text, and the tenant is the
//! verified one, never a claim. Without export (`[telemetry]`) these are
//! plain `tracing` spans that no layer turns into OpenTelemetry spans.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use http_body::Frame;
use opentelemetry::{StringValue, Value};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use crate::metrics::TRACE_TARGET as TARGET;

/// The server span of one request on `route` (`METHOD /path/{param}`),
/// continuing the trace `headers` carry.
pub fn server_span(
    route: &str,
    method: &'static str,
    path: &'static str,
    headers: &HeaderMap,
) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "http.server",
        otel.name = route,
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = method,
        http.route = path,
        http.response.status_code = Empty,
        bulkhead.tenant = Empty,
        gen_ai.operation.name = Empty,
        gen_ai.request.model = Empty,
        gen_ai.request.max_tokens = Empty,
        gen_ai.request.temperature = Empty,
        gen_ai.response.id = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        error.type = Empty,
    );
    // A malformed or absent traceparent gives an empty context: a new trace.
    let _ = span.set_parent(bulkhead_telemetry::propagation::extract(headers));
    span
}

/// Runs the request inside `span` and keeps the span open until the
/// response body (an SSE stream, say) has been sent or dropped.
pub async fn in_server_span(span: Span, request: Request, next: Next) -> Response {
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response.map(|body| Body::new(SpanBody { body, _span: span }))
}

/// A response body that holds its request's span.
struct SpanBody {
    body: Body,
    _span: Span,
}

impl http_body::Body for SpanBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Records why the request failed (`error.type`, the error's code).
pub fn record_error(span: &Span, code: &str) {
    span.record("error.type", code);
}

/// Records the end of a generation on its server span.
pub fn record_finish(span: &Span, finish_reason: &str, input_tokens: u32, output_tokens: u32) {
    span.record("gen_ai.usage.input_tokens", i64::from(input_tokens));
    span.record("gen_ai.usage.output_tokens", i64::from(output_tokens));
    span.set_attribute(
        "gen_ai.response.finish_reasons",
        Value::Array(vec![StringValue::from(finish_reason.to_string())].into()),
    );
}
