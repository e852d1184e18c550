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
//! Prompt and completion text are recorded only for a tenant whose policy
//! opts in (`[telemetry] record_content = true`, [`record_input`] and
//! [`OutputText`]), and the tenant is the verified one, never a claim.
//! Without export (`[telemetry]` in `gateway.toml`) these are plain
//! `tracing` spans that no layer turns into OpenTelemetry spans.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use bulkhead_telemetry::spans::set_attribute;
use http_body::Frame;
use opentelemetry::{StringValue, Value};
use tracing::Span;
use tracing::field::Empty;

use crate::upstream::Prompt;

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
    bulkhead_telemetry::spans::set_parent(
        &span,
        &bulkhead_telemetry::propagation::extract(headers),
    );
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
    tracing::record_all!(
        span,
        gen_ai.usage.input_tokens = i64::from(input_tokens),
        gen_ai.usage.output_tokens = i64::from(output_tokens),
    );
    set_attribute(
        span,
        "gen_ai.response.finish_reasons",
        Value::Array(vec![StringValue::from(finish_reason.to_string())].into()),
    );
}

/// The most bytes of text one request records in each direction; past it
/// the text is cut at a character boundary and the span carries
/// `bulkhead.content.truncated = true`.
pub const CONTENT_LIMIT: usize = 32 * 1024;

/// Records the prompt as it went to the gpu-host (after the tenant's
/// `on-request` plugins) as `gen_ai.input.messages`, in the GenAI
/// conventions' JSON form. Only for a tenant that opted in; a prompt of
/// token ids has no text and records nothing.
pub fn record_input(span: &Span, prompt: &Prompt) {
    let mut budget = Budget::new();
    let messages: Vec<serde_json::Value> = match prompt {
        Prompt::Chat(messages) => messages
            .iter()
            .map(|(role, content)| text_message(role, budget.take(content), None))
            .collect(),
        Prompt::Text(text) => vec![text_message("user", budget.take(text), None)],
        Prompt::Tokens(_) => return,
    };
    set_attribute(
        span,
        "gen_ai.input.messages",
        serde_json::Value::Array(messages).to_string(),
    );
    if budget.truncated {
        set_attribute(span, "bulkhead.content.truncated", true);
    }
}

/// The completion text as the client receives it (after the tenant's
/// response plugins), gathered chunk by chunk for a tenant that opted in.
#[derive(Debug, Default)]
pub struct OutputText {
    text: String,
    budget: Budget,
}

impl OutputText {
    pub fn push(&mut self, piece: &str) {
        let kept = self.budget.take(piece);
        self.text.push_str(kept);
    }

    /// Records it as `gen_ai.output.messages`.
    pub fn record(self, span: &Span, finish_reason: &str) {
        let message = text_message("assistant", &self.text, Some(finish_reason));
        set_attribute(
            span,
            "gen_ai.output.messages",
            serde_json::Value::Array(vec![message]).to_string(),
        );
        if self.budget.truncated {
            set_attribute(span, "bulkhead.content.truncated", true);
        }
    }
}

/// What is left of [`CONTENT_LIMIT`].
#[derive(Debug)]
struct Budget {
    left: usize,
    truncated: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new()
    }
}

impl Budget {
    fn new() -> Budget {
        Budget {
            left: CONTENT_LIMIT,
            truncated: false,
        }
    }

    /// The longest prefix of `text` that fits, on a character boundary;
    /// nothing once something was cut (no text with holes in it).
    fn take<'a>(&mut self, text: &'a str) -> &'a str {
        if self.truncated {
            return "";
        }
        if text.len() <= self.left {
            self.left -= text.len();
            return text;
        }
        let mut end = self.left;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.left -= end;
        self.truncated = true;
        &text[..end]
    }
}

fn text_message(role: &str, content: &str, finish_reason: Option<&str>) -> serde_json::Value {
    let mut message = serde_json::json!({
        "role": role,
        "parts": [{"type": "text", "content": content}],
    });
    if let Some(reason) = finish_reason {
        message["finish_reason"] = reason.into();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_cut_at_the_limit_on_a_character_boundary() {
        let mut budget = Budget::new();
        let head = "a".repeat(CONTENT_LIMIT - 1);
        assert_eq!(budget.take(&head), head);
        assert!(!budget.truncated);
        // "é" is two bytes: one byte is left, so none of it fits.
        assert_eq!(budget.take("éz"), "");
        assert!(budget.truncated);
        assert_eq!(budget.take("z"), "", "nothing after a cut");
    }

    #[test]
    fn messages_have_the_gen_ai_shape() {
        assert_eq!(
            text_message("assistant", "hi", Some("stop")),
            serde_json::json!({
                "role": "assistant",
                "parts": [{"type": "text", "content": "hi"}],
                "finish_reason": "stop",
            })
        );
    }
}
