//! `bulkhead plugin run`: one plugin's hooks over an OpenAI request body
//! (and optionally a response body) on this machine, with the same mapping
//! and checks the gateway applies, for plugin authors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::openai::{Endpoint, InferenceRequest, Prompt};
use crate::pipeline::{TenantRules, apply, to_plugin};
use crate::plugins::{
    self, CallContext, CompiledPlugin, Hook, LogStats, PluginCall, PluginConfig, PluginError,
    PluginLimits, Rejection,
};

/// What to run.
#[derive(Debug)]
pub struct LocalRun<'a> {
    pub plugin: &'a CompiledPlugin,
    /// The plugin's name in errors and logs.
    pub name: &'a str,
    /// An OpenAI `/v1/chat/completions` or `/v1/completions` body (chosen by
    /// whether it has `messages`).
    pub request: &'a [u8],
    /// An OpenAI response body to run `on-response` (or the stream hooks)
    /// over.
    pub response: Option<&'a [u8]>,
    /// Split the response text into pieces of this many characters and run
    /// `on-chunk` per piece and `on-stream-end`, as for a stream.
    pub chunk_chars: Option<usize>,
    pub config: PluginConfig,
    pub limits: PluginLimits,
}

/// What happened.
#[derive(Debug)]
pub struct LocalReport {
    /// `{"request": …}` plus `"response"` when one was given, or
    /// `"rejected"` with the hook, status and message.
    pub output: Value,
    /// Whether a hook rejected.
    pub rejected: bool,
    /// Each hook called, with its time (instantiation included in the first).
    pub timings: Vec<(Hook, Duration)>,
    pub peak_memory_bytes: usize,
    pub log: LogStats,
}

/// Why a local run could not finish.
#[derive(Debug, thiserror::Error)]
pub enum LocalRunError {
    #[error("the request file: {0}")]
    Request(String),
    #[error("the response file: {0}")]
    Response(String),
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("plugin `{plugin}` {reason}")]
    Invalid { plugin: String, reason: String },
}

/// Runs `run.plugin`'s hooks once, in a fresh instance, as the gateway
/// would for one request.
pub fn run_locally(run: LocalRun<'_>) -> Result<LocalReport, LocalRunError> {
    let endpoint = endpoint_of(run.request)?;
    let mut request = InferenceRequest::parse(endpoint, run.request)
        .map_err(|e| LocalRunError::Request(e.message))?;
    let response = run
        .response
        .map(|body| ParsedResponse::parse(body, endpoint))
        .transpose()?;

    let started = Instant::now();
    let mut call = run.plugin.instantiate(CallContext {
        tenant: Arc::from("local"),
        plugin: Arc::from(run.name),
        config: Arc::new(run.config),
        limits: run.limits,
    })?;
    let mut timings = Timings {
        started,
        calls: Vec::new(),
    };
    let report = |output: Value, rejected, timings: Timings, call: &PluginCall| LocalReport {
        output,
        rejected,
        timings: timings.calls,
        peak_memory_bytes: call.peak_memory_bytes(),
        log: call.log_stats(),
    };

    // on-request.
    let view = to_plugin(&request, vec![("tenant".into(), "local".into())]);
    match timings.time(Hook::OnRequest, || call.on_request(view))? {
        Ok(rewritten) => {
            let rules = TenantRules {
                models: None,
                max_tokens: u32::MAX,
            };
            apply(&mut request, rewritten, &rules).map_err(|reason| LocalRunError::Invalid {
                plugin: run.name.to_string(),
                reason,
            })?;
        }
        Err(rejection) => {
            let output = rejected_json(Hook::OnRequest, &rejection);
            return Ok(report(output, true, timings, &call));
        }
    }
    let mut output = json!({ "request": request_json(&request) });
    let Some(response) = response else {
        return Ok(report(output, false, timings, &call));
    };

    // on-response, or the stream hooks.
    let (text, finish_reason) = match run.chunk_chars {
        None => {
            let view = plugins::Response {
                model: request.model.clone(),
                text: response.text.clone(),
                finish_reason: response.finish_reason.clone(),
                prompt_tokens: response.prompt_tokens,
                completion_tokens: response.completion_tokens,
            };
            match timings.time(Hook::OnResponse, || call.on_response(view))? {
                Ok(r) => (r.text, r.finish_reason),
                Err(rejection) => {
                    output["rejected"] =
                        rejected_json(Hook::OnResponse, &rejection)["rejected"].take();
                    return Ok(report(output, true, timings, &call));
                }
            }
        }
        Some(n) => {
            let mut text = String::new();
            let chars: Vec<char> = response.text.chars().collect();
            for piece in chars.chunks(n.max(1)) {
                let piece: String = piece.iter().collect();
                match timings.time(Hook::OnChunk, || call.on_chunk(&piece))? {
                    Ok(t) => text.push_str(&t),
                    Err(rejection) => {
                        output["rejected"] =
                            rejected_json(Hook::OnChunk, &rejection)["rejected"].take();
                        return Ok(report(output, true, timings, &call));
                    }
                }
            }
            match timings.time(Hook::OnStreamEnd, || call.on_stream_end())? {
                Ok(t) => text.push_str(&t),
                Err(rejection) => {
                    output["rejected"] =
                        rejected_json(Hook::OnStreamEnd, &rejection)["rejected"].take();
                    return Ok(report(output, true, timings, &call));
                }
            }
            (text, response.finish_reason.clone())
        }
    };
    output["response"] = response.with(&text, &finish_reason);
    Ok(report(output, false, timings, &call))
}

/// Each hook's time; the first includes instantiation.
struct Timings {
    started: Instant,
    calls: Vec<(Hook, Duration)>,
}

impl Timings {
    fn time<T>(&mut self, hook: Hook, f: impl FnOnce() -> T) -> T {
        let since = if self.calls.is_empty() {
            self.started
        } else {
            Instant::now()
        };
        let out = f();
        self.calls.push((hook, since.elapsed()));
        out
    }
}

fn endpoint_of(body: &[u8]) -> Result<Endpoint, LocalRunError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| LocalRunError::Request(format!("not valid JSON: {e}")))?;
    match (value.get("messages"), value.get("prompt")) {
        (Some(_), None) => Ok(Endpoint::Chat),
        (None, Some(_)) => Ok(Endpoint::Completion),
        _ => Err(LocalRunError::Request(
            "a chat request has `messages`, a completion request `prompt` (exactly one)".into(),
        )),
    }
}

fn rejected_json(hook: Hook, rejection: &Rejection) -> Value {
    json!({
        "request": null,
        "rejected": {
            "hook": hook.to_string(),
            "status": rejection.status,
            "message": rejection.message,
        }
    })
}

/// The request as an OpenAI body again.
pub fn request_json(request: &InferenceRequest) -> Value {
    let mut body = json!({ "model": request.model });
    match &request.prompt {
        Prompt::Chat(messages) => {
            body["messages"] = messages
                .iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect();
        }
        Prompt::Text(text) => body["prompt"] = json!(text),
        Prompt::Tokens(ids) => body["prompt"] = json!(ids),
    }
    let fields: [(&str, Option<Value>); 10] = [
        (
            match request.endpoint {
                Endpoint::Chat => "max_completion_tokens",
                Endpoint::Completion => "max_tokens",
            },
            request.max_tokens.map(Value::from),
        ),
        ("temperature", Some(json!(request.temperature))),
        ("top_p", Some(json!(request.top_p))),
        ("top_k", request.top_k.map(Value::from)),
        ("min_p", request.min_p.map(|v| json!(v))),
        (
            "repetition_penalty",
            request.repetition_penalty.map(|v| json!(v)),
        ),
        ("seed", request.seed.map(Value::from)),
        (
            "stop",
            (!request.stop.is_empty()).then(|| json!(request.stop)),
        ),
        ("stream", request.stream.then_some(Value::Bool(true))),
        (
            "stream_options",
            request
                .include_usage
                .then(|| json!({"include_usage": true})),
        ),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            body[name] = value;
        }
    }
    body
}

/// The parts of an OpenAI response body the hooks see.
struct ParsedResponse {
    body: Value,
    endpoint: Endpoint,
    text: String,
    finish_reason: String,
    prompt_tokens: u32,
    completion_tokens: u32,
}

impl ParsedResponse {
    fn parse(body: &[u8], endpoint: Endpoint) -> Result<ParsedResponse, LocalRunError> {
        let bad = |what: &str| LocalRunError::Response(what.to_string());
        let body: Value =
            serde_json::from_slice(body).map_err(|e| bad(&format!("not valid JSON: {e}")))?;
        let choice = body
            .pointer("/choices/0")
            .ok_or_else(|| bad("it has no `choices[0]`"))?;
        let text = match endpoint {
            Endpoint::Chat => choice.pointer("/message/content"),
            Endpoint::Completion => choice.get("text"),
        }
        .and_then(Value::as_str)
        .ok_or_else(|| {
            bad(match endpoint {
                Endpoint::Chat => {
                    "`choices[0].message.content` must be a string (the request is a chat request)"
                }
                Endpoint::Completion => {
                    "`choices[0].text` must be a string (the request is a completion request)"
                }
            })
        })?
        .to_string();
        let finish_reason = choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .unwrap_or("stop")
            .to_string();
        let count = |name: &str| {
            body.pointer(&format!("/usage/{name}"))
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0)
        };
        Ok(ParsedResponse {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
            body,
            endpoint,
            text,
            finish_reason,
        })
    }

    /// The body with the text and finish reason replaced.
    fn with(mut self, text: &str, finish_reason: &str) -> Value {
        let pointer = match self.endpoint {
            Endpoint::Chat => "/choices/0/message/content",
            Endpoint::Completion => "/choices/0/text",
        };
        if let Some(slot) = self.body.pointer_mut(pointer) {
            *slot = json!(text);
        }
        if let Some(slot) = self.body.pointer_mut("/choices/0/finish_reason") {
            *slot = json!(finish_reason);
        }
        self.body
    }
}
