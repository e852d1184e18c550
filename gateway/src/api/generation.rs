//! One generation in flight: the upstream event stream plus the tenant's
//! admission (token reservation, concurrency slot), turned into either a
//! whole response or an SSE stream.
//!
//! Dropping a [`Generation`] — the response finished, failed, or the client
//! went away — drops the gRPC stream (the gpu-host cancels the sequence) and
//! the admission (unused reserved tokens go back to the tenant's budget).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::response::sse::Event;
use futures_util::{Stream, StreamExt};

use super::error::ApiError;
use super::respond::{Finish, ResponseMeta, Usage};
use crate::limits::{Admission, RequestUsage};
use crate::metrics::{GenAiCall, Metrics, OpenStream, TenantLabels, TokenLabels};
use crate::pipeline::Hooks;
use crate::upstream::{self, Events, Started, UpstreamError};

/// A piece of the generation as the HTTP layer sees it.
enum Piece {
    Text(String),
    Finished(Finish, Usage),
}

/// An admitted generation whose `Started` event has arrived.
pub struct Generation {
    events: Events,
    admission: Admission,
    deadline: tokio::time::Instant,
    max_tokens: u32,
    pub meta: ResponseMeta,
    prompt_tokens: u32,
    completion_tokens: u32,
    tenant: String,
    metrics: Arc<Metrics>,
    /// The tenant's usage book for this request's model and day.
    usage: RequestUsage,
    started_at: Instant,
    first_text_seen: bool,
    /// When the first text arrived (time per output token after it).
    first_text_at: Option<Instant>,
    /// Counted in `bulkhead_upstream_streams_open` while this lives.
    _open: OpenStream,
    spans: GenerationSpans,
}

/// The spans a generation records its end on and holds open.
#[derive(Debug)]
pub struct GenerationSpans {
    /// The request's server span (usage, finish reason).
    pub request: tracing::Span,
    /// The upstream call, held open until the stream ends.
    pub _upstream: tracing::Span,
    /// The completion text, for a tenant that records content.
    pub output_text: Option<super::trace::OutputText>,
}

impl GenerationSpans {
    fn output(&mut self, text: &str) {
        if let Some(output) = &mut self.output_text {
            output.push(text);
        }
    }

    fn record_output(&mut self, finish: Finish) {
        if let Some(output) = self.output_text.take() {
            output.record(&self.request, finish.as_str());
        }
    }
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("id", &self.meta.id)
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

/// What `Generation::start` needs besides the stream.
#[derive(Debug)]
pub struct GenerationContext {
    pub admission: Admission,
    pub deadline: tokio::time::Instant,
    pub max_tokens: u32,
    pub meta: ResponseMeta,
    pub tenant: String,
    pub metrics: Arc<Metrics>,
    pub usage: RequestUsage,
    pub started_at: Instant,
    pub spans: GenerationSpans,
}

impl Generation {
    /// Takes over an upstream stream whose `Started` has arrived and
    /// re-bases the token reservation on the real prompt size.
    pub fn start(started: Started, events: Events, context: GenerationContext) -> Generation {
        let admission = context.admission;
        let prompt_tokens = started.prompt_tokens;
        let tokens = admission.tokens();
        tokens.set_reserved(u64::from(prompt_tokens) + u64::from(context.max_tokens));
        tokens.record_used(u64::from(prompt_tokens));
        context.usage.prompt(u64::from(prompt_tokens));
        context
            .metrics
            .tokens
            .get_or_create(&TokenLabels {
                tenant: context.tenant.clone(),
                kind: "prompt",
            })
            .inc_by(u64::from(prompt_tokens));
        let open = context.metrics.open_stream(&context.tenant);
        Generation {
            events,
            admission,
            deadline: context.deadline,
            max_tokens: context.max_tokens,
            meta: context.meta,
            prompt_tokens,
            completion_tokens: 0,
            tenant: context.tenant,
            metrics: context.metrics,
            usage: context.usage,
            started_at: context.started_at,
            first_text_seen: false,
            first_text_at: None,
            _open: open,
            spans: context.spans,
        }
    }

    /// The next text, or the end; deltas without text are folded in.
    async fn next_piece(&mut self) -> Result<Piece, ApiError> {
        loop {
            match next_event(&mut self.events, self.deadline).await? {
                Some(upstream::Event::Delta { text, tokens: n }) => {
                    self.completion_tokens += n;
                    self.admission.tokens().record_used(u64::from(n));
                    self.usage.completion(u64::from(n));
                    self.metrics
                        .tokens
                        .get_or_create(&TokenLabels {
                            tenant: self.tenant.clone(),
                            kind: "completion",
                        })
                        .inc_by(u64::from(n));
                    if text.is_empty() {
                        continue;
                    }
                    if !self.first_text_seen {
                        self.first_text_seen = true;
                        self.first_text_at = Some(Instant::now());
                        let ttft = self.started_at.elapsed().as_secs_f64();
                        self.metrics
                            .time_to_first_token
                            .get_or_create(&self.tenant_labels())
                            .observe(ttft);
                        self.metrics.gen_ai.first_token(self.gen_ai_call(), ttft);
                    }
                    return Ok(Piece::Text(text));
                }
                Some(upstream::Event::Finished {
                    finish,
                    usage,
                    compute_us,
                }) => {
                    self.usage.compute(compute_us);
                    let finish = match finish {
                        upstream::Finish::Length => Finish::Length,
                        upstream::Finish::Stop => Finish::Stop,
                    };
                    let (prompt_tokens, completion_tokens) =
                        usage.unwrap_or((self.prompt_tokens, self.completion_tokens));
                    let usage = Usage {
                        prompt_tokens,
                        completion_tokens,
                    };
                    if usage.completion_tokens > self.max_tokens {
                        return Err(ApiError::from(UpstreamError::Protocol(format!(
                            "{} tokens generated for max_tokens {}",
                            usage.completion_tokens, self.max_tokens
                        ))));
                    }
                    self.metrics
                        .latency
                        .get_or_create(&self.tenant_labels())
                        .observe(self.started_at.elapsed().as_secs_f64());
                    let per_output_token = match (self.first_text_at, usage.completion_tokens) {
                        (Some(first), n) if n > 1 => {
                            Some(first.elapsed().as_secs_f64() / f64::from(n - 1))
                        }
                        _ => None,
                    };
                    self.metrics.gen_ai.finished(
                        self.gen_ai_call(),
                        (usage.prompt_tokens, usage.completion_tokens),
                        self.started_at.elapsed().as_secs_f64(),
                        per_output_token,
                    );
                    super::trace::record_finish(
                        &self.spans.request,
                        finish.as_str(),
                        usage.prompt_tokens,
                        usage.completion_tokens,
                    );
                    self.read_to_end().await;
                    return Ok(Piece::Finished(finish, usage));
                }
                None => return Err(ended_early()),
            }
        }
    }

    /// Lets the stream close cleanly (`Events::close`), bounded: the
    /// generation is already complete.
    async fn read_to_end(&mut self) {
        let until = self
            .deadline
            .min(tokio::time::Instant::now() + TRAILERS_WAIT);
        let _ = tokio::time::timeout_at(until, self.events.close()).await;
    }

    fn gen_ai_call(&self) -> GenAiCall<'_> {
        GenAiCall {
            operation: match self.meta.endpoint {
                super::openai::Endpoint::Chat => "chat",
                super::openai::Endpoint::Completion => "text_completion",
            },
            model: &self.meta.model,
            tenant: &self.tenant,
        }
    }

    fn tenant_labels(&self) -> TenantLabels {
        TenantLabels {
            tenant: self.tenant.clone(),
        }
    }

    /// Runs to the end and returns the whole response body, after the
    /// tenant's `on-response` chain if it has one.
    pub async fn collect(mut self, hooks: Option<Hooks>) -> Result<serde_json::Value, ApiError> {
        let mut text = String::new();
        let (finish, usage) = loop {
            match self.next_piece().await? {
                Piece::Text(piece) => text.push_str(&piece),
                Piece::Finished(finish, usage) => break (finish, usage),
            }
        };
        let (text, finish) = match hooks {
            Some(hooks) => {
                let response = crate::plugins::Response {
                    model: self.meta.model.clone(),
                    text,
                    finish_reason: finish.as_str().to_string(),
                    prompt_tokens: usage.prompt_tokens,
                    completion_tokens: usage.completion_tokens,
                };
                hooks.on_response(response).await?.1
            }
            None => (text, finish),
        };
        self.spans.output(&text);
        self.spans.record_output(finish);
        Ok(self.meta.complete(&text, finish, usage))
    }

    /// The SSE events: chunks, the usage chunk if asked, `[DONE]`; a failure
    /// midway becomes one `{"error":…}` event and the stream ends without
    /// `[DONE]` (the OpenAI SDKs raise it as an API error). With `hooks`,
    /// each delta goes through the tenant's `on-chunk` chain (a delta the
    /// plugins hold back sends nothing) and what they held back at the end
    /// comes out of `on-stream-end` as one last text chunk.
    pub fn into_sse(
        self,
        include_usage: bool,
        hooks: Option<Hooks>,
    ) -> impl Stream<Item = Result<Event, Infallible>> {
        use super::openai::Endpoint;
        enum State {
            First(Generation, Option<Hooks>),
            Running(Generation, Option<Hooks>),
            Done,
        }
        let json = |v: serde_json::Value| Event::default().data(v.to_string());
        let failed = move |generation: &Generation, error: ApiError| {
            generation.metrics.reject(&generation.tenant, error.code);
            Some((vec![json(error.body())], State::Done))
        };
        futures_util::stream::unfold(State::First(self, hooks), move |state| async move {
            let (mut generation, hooks) = match state {
                State::Done => return None,
                State::First(generation, hooks) if generation.meta.endpoint == Endpoint::Chat => {
                    let chunk = generation.meta.chunk("", true, None, include_usage);
                    return Some((vec![json(chunk)], State::Running(generation, hooks)));
                }
                State::First(generation, hooks) | State::Running(generation, hooks) => {
                    (generation, hooks)
                }
            };
            match generation.next_piece().await {
                Ok(Piece::Text(text)) => {
                    let (hooks, text) = match hooks {
                        Some(hooks) => match hooks.on_chunk(text).await {
                            Ok((hooks, text)) => (Some(hooks), text),
                            Err(error) => return failed(&generation, error.into()),
                        },
                        None => (None, text),
                    };
                    let events = if text.is_empty() {
                        Vec::new()
                    } else {
                        generation.spans.output(&text);
                        vec![json(generation.meta.chunk(
                            &text,
                            false,
                            None,
                            include_usage,
                        ))]
                    };
                    Some((events, State::Running(generation, hooks)))
                }
                Ok(Piece::Finished(finish, usage)) => {
                    let mut events = Vec::new();
                    if let Some(hooks) = hooks {
                        match hooks.on_stream_end().await {
                            Ok((_, tail)) if !tail.is_empty() => {
                                generation.spans.output(&tail);
                                let meta = &generation.meta;
                                events.push(json(meta.chunk(&tail, false, None, include_usage)));
                            }
                            Ok(_) => {}
                            Err(error) => return failed(&generation, error.into()),
                        }
                    }
                    generation.spans.record_output(finish);
                    let meta = &generation.meta;
                    events.push(json(meta.chunk("", false, Some(finish), include_usage)));
                    if include_usage {
                        events.push(json(meta.usage_chunk(usage)));
                    }
                    events.push(Event::default().data("[DONE]"));
                    Some((events, State::Done))
                }
                Err(error) => failed(&generation, error),
            }
        })
        .flat_map(|events| futures_util::stream::iter(events.into_iter().map(Ok)))
    }
}

/// How long a finished generation waits for the host's trailers.
const TRAILERS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

fn ended_early() -> ApiError {
    ApiError::from(UpstreamError::Unavailable(
        "the stream ended before the generation finished".into(),
    ))
}

/// The next upstream event before `deadline`; `None` when the stream ended.
async fn next_event(
    events: &mut Events,
    deadline: tokio::time::Instant,
) -> Result<Option<upstream::Event>, ApiError> {
    match tokio::time::timeout_at(deadline, events.next()).await {
        Err(_) => Err(ApiError::timeout(
            "the request took longer than the gateway's request timeout",
        )),
        Ok(result) => Ok(result?),
    }
}
