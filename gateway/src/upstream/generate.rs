//! One generation as the gateway asks for it and hears it back, in domain
//! terms: [`Generate`] goes out, [`Started`] and then [`Events`] (text
//! deltas, the finish) come back. The only place the gateway builds a
//! `GenerateRequest` or reads a `GenerateEvent`; the HTTP layer never sees
//! either.

use bulkhead_protocol::v1::{self, GenerateEvent, generate_event, generate_request};
use tonic::Streaming;

use super::UpstreamError;

/// What to generate from.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// (role, content) pairs, rendered with the model's chat template.
    Chat(Vec<(String, String)>),
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated, admitted request as the host takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Generate {
    pub model: String,
    pub prompt: Prompt,
    /// Stop after this many tokens; `None`: run to the context's end, but
    /// at most `max_tokens_cap`.
    pub max_tokens: Option<u32>,
    pub max_tokens_cap: Option<u32>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: u64,
    pub stop: Vec<String>,
    /// The tenant the host schedules and accounts it to.
    pub tenant: String,
    pub request_id: String,
    /// Order among the tenant's waiting requests (higher first).
    pub priority: Option<i32>,
    /// Control tokens spelled in a text prompt are control tokens.
    pub parse_special: bool,
}

impl From<Generate> for v1::GenerateRequest {
    fn from(g: Generate) -> v1::GenerateRequest {
        let prompt = match g.prompt {
            Prompt::Chat(messages) => generate_request::Prompt::Chat(v1::ChatMessages {
                messages: messages
                    .into_iter()
                    .map(|(role, content)| v1::ChatMessage { role, content })
                    .collect(),
            }),
            Prompt::Text(text) => generate_request::Prompt::Text(text),
            Prompt::Tokens(ids) => generate_request::Prompt::Tokens(v1::TokenIds { ids }),
        };
        v1::GenerateRequest {
            model: g.model,
            prompt: Some(prompt),
            max_tokens: g.max_tokens,
            max_tokens_cap: g.max_tokens_cap,
            temperature: Some(g.temperature),
            top_p: Some(g.top_p),
            top_k: g.top_k,
            min_p: g.min_p,
            repetition_penalty: g.repetition_penalty,
            seed: Some(g.seed),
            stop: g.stop,
            tenant: g.tenant,
            request_id: g.request_id,
            priority: g.priority,
            parse_special: g.parse_special,
        }
    }
}

/// The host started the generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Started {
    pub prompt_tokens: u32,
    /// The digest the served weights were verified against.
    pub model_digest: String,
    /// When every byte of the resident weights last matched, in Unix ms.
    pub weights_verified_at_unix_ms: u64,
}

impl From<v1::Started> for Started {
    fn from(s: v1::Started) -> Started {
        Started {
            prompt_tokens: s.prompt_tokens,
            model_digest: s.model_digest,
            weights_verified_at_unix_ms: s.weights_verified_at_unix_ms,
        }
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached or the context is full.
    Length,
}

/// What follows `Started`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// New text (maybe none yet) and how many tokens it took.
    Delta { text: String, tokens: u32 },
    /// The end; `usage` is the host's (prompt, completion) count when it
    /// sent one.
    Finished {
        finish: Finish,
        usage: Option<(u32, u32)>,
        /// The host's compute time for it, in microseconds (0: not said).
        compute_us: u64,
    },
}

/// The events of a started generation. Dropping it cancels the generation
/// on the host.
#[derive(Debug)]
pub struct Events {
    stream: Streaming<GenerateEvent>,
    /// Kept as long as the stream (the host pool's count of the
    /// generations each host runs).
    held: Option<Held>,
}

/// Something an [`Events`] keeps alive until it is dropped.
pub struct Held {
    _value: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

impl Events {
    pub(super) fn new(stream: Streaming<GenerateEvent>) -> Events {
        Events { stream, held: None }
    }

    /// The same events, keeping `value` alive until they are dropped.
    pub fn holding(mut self, value: impl std::any::Any + Send + Sync) -> Events {
        self.held = Some(Held {
            _value: Box::new(value),
        });
        self
    }

    /// The next event; `None` when the stream ended.
    pub async fn next(&mut self) -> Result<Option<Event>, UpstreamError> {
        let Some(GenerateEvent { event }) = self.stream.message().await? else {
            return Ok(None);
        };
        match event {
            Some(generate_event::Event::Delta(delta)) => Ok(Some(Event::Delta {
                tokens: u32::try_from(delta.token_ids.len()).unwrap_or(u32::MAX),
                text: delta.text,
            })),
            Some(generate_event::Event::Finished(finished)) => Ok(Some(Event::Finished {
                finish: match finished.finish_reason() {
                    v1::FinishReason::Length => Finish::Length,
                    _ => Finish::Stop,
                },
                usage: finished
                    .usage
                    .map(|u| (u.prompt_tokens, u.completion_tokens)),
                compute_us: finished.compute_us,
            })),
            Some(generate_event::Event::Started(_)) => {
                Err(UpstreamError::Protocol("a second Started event".into()))
            }
            None => Err(UpstreamError::Protocol("an empty event".into())),
        }
    }

    /// Reads the stream's end (the gRPC trailers, sent right after
    /// `Finished`) so it closes cleanly: dropping it first would cancel it
    /// (RST_STREAM) and leave the host's trailers to arrive for a stream
    /// the connection has to remember as reset. What it finds is ignored.
    pub async fn close(&mut self) {
        let _ = self.stream.trailers().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_keeps_every_field_on_the_wire() {
        let wire = v1::GenerateRequest::from(Generate {
            model: "m".into(),
            prompt: Prompt::Chat(vec![("user".into(), "hi".into())]),
            max_tokens: None,
            max_tokens_cap: Some(64),
            temperature: 0.5,
            top_p: 0.9,
            top_k: Some(40),
            min_p: Some(0.05),
            repetition_penalty: Some(1.1),
            seed: 7,
            stop: vec!["\n".into()],
            tenant: "acme".into(),
            request_id: "req-1".into(),
            priority: Some(2),
            parse_special: true,
        });
        let Some(generate_request::Prompt::Chat(chat)) = &wire.prompt else {
            panic!("a chat prompt: {:?}", wire.prompt);
        };
        assert_eq!(
            (
                chat.messages[0].role.as_str(),
                chat.messages[0].content.as_str()
            ),
            ("user", "hi")
        );
        assert_eq!((wire.max_tokens, wire.max_tokens_cap), (None, Some(64)));
        assert_eq!((wire.temperature, wire.top_p), (Some(0.5), Some(0.9)));
        assert_eq!((wire.top_k, wire.min_p), (Some(40), Some(0.05)));
        assert_eq!((wire.repetition_penalty, wire.seed), (Some(1.1), Some(7)));
        assert_eq!(
            (wire.tenant.as_str(), wire.request_id.as_str()),
            ("acme", "req-1")
        );
        assert_eq!((wire.priority, wire.parse_special), (Some(2), true));
        assert_eq!(wire.stop, ["\n"]);
    }
}
