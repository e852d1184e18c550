//! What hooks see and return, as plain Rust types: the HTTP layer builds
//! and reads these and never sees generated bindings. Conversions to and
//! from the bindings live here, at the boundary.

use super::bindings::bulkhead::plugin::types as wit;
use super::limits::OUTPUT_ITEM_OVERHEAD_BYTES;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

/// What the model is asked to continue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// `/v1/chat/completions`.
    Chat(Vec<Message>),
    /// `/v1/completions` with a text prompt.
    Text(String),
    /// `/v1/completions` with token ids.
    Tokens(Vec<u32>),
}

/// Sampling parameters as the client sent them (after defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub max_tokens: Option<u32>,
    pub temperature: f32,
    pub top_p: f32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
}

/// An inference request on its way to the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub model: String,
    pub prompt: Prompt,
    pub sampling: Sampling,
    /// Labels plugins may read and add to (logged, never sent to the model).
    pub metadata: Vec<(String, String)>,
}

/// A complete (non-streamed) response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub model: String,
    pub text: String,
    /// `stop` or `length`.
    pub finish_reason: String,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// A plugin's refusal of a request or response: the client gets `status` and
/// `message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Always 400–499: the ABI sends any other status a plugin returns as 400.
    pub status: u16,
    pub message: String,
}

impl Rejection {
    /// The status a plugin may set; anything else becomes this.
    pub const FALLBACK_STATUS: u16 = 400;
}

/// Bytes a hook's result counts toward `max_output_bytes`: its text plus
/// [`OUTPUT_ITEM_OVERHEAD_BYTES`] per string or list element.
pub(crate) trait OutputSize {
    fn output_bytes(&self) -> usize;
}

fn text_bytes(text: &str) -> usize {
    text.len() + OUTPUT_ITEM_OVERHEAD_BYTES
}

impl OutputSize for String {
    fn output_bytes(&self) -> usize {
        text_bytes(self)
    }
}

impl OutputSize for Message {
    fn output_bytes(&self) -> usize {
        text_bytes(&self.role) + text_bytes(&self.content)
    }
}

impl OutputSize for Prompt {
    fn output_bytes(&self) -> usize {
        match self {
            Prompt::Chat(messages) => messages.iter().map(Message::output_bytes).sum(),
            Prompt::Text(text) => text_bytes(text),
            Prompt::Tokens(tokens) => tokens.len() * std::mem::size_of::<u32>(),
        }
    }
}

impl OutputSize for Request {
    fn output_bytes(&self) -> usize {
        let stop: usize = self.sampling.stop.iter().map(|s| text_bytes(s)).sum();
        let metadata: usize = self
            .metadata
            .iter()
            .map(|(key, value)| text_bytes(key) + text_bytes(value))
            .sum();
        text_bytes(&self.model) + self.prompt.output_bytes() + stop + metadata
    }
}

impl OutputSize for Response {
    fn output_bytes(&self) -> usize {
        text_bytes(&self.model) + text_bytes(&self.text) + text_bytes(&self.finish_reason)
    }
}

impl OutputSize for Rejection {
    fn output_bytes(&self) -> usize {
        text_bytes(&self.message)
    }
}

impl<T: OutputSize> OutputSize for Result<T, Rejection> {
    fn output_bytes(&self) -> usize {
        match self {
            Ok(value) => value.output_bytes(),
            Err(rejection) => rejection.output_bytes(),
        }
    }
}

// Conversions at the boundary. Moves only: strings and lists are handed over,
// not copied.

impl From<Message> for wit::Message {
    fn from(m: Message) -> Self {
        wit::Message {
            role: m.role,
            content: m.content,
        }
    }
}

impl From<wit::Message> for Message {
    fn from(m: wit::Message) -> Self {
        Message {
            role: m.role,
            content: m.content,
        }
    }
}

impl From<Prompt> for wit::Prompt {
    fn from(p: Prompt) -> Self {
        match p {
            Prompt::Chat(messages) => {
                wit::Prompt::Chat(messages.into_iter().map(Into::into).collect())
            }
            Prompt::Text(text) => wit::Prompt::Text(text),
            Prompt::Tokens(tokens) => wit::Prompt::Tokens(tokens),
        }
    }
}

impl From<wit::Prompt> for Prompt {
    fn from(p: wit::Prompt) -> Self {
        match p {
            wit::Prompt::Chat(messages) => {
                Prompt::Chat(messages.into_iter().map(Into::into).collect())
            }
            wit::Prompt::Text(text) => Prompt::Text(text),
            wit::Prompt::Tokens(tokens) => Prompt::Tokens(tokens),
        }
    }
}

impl From<Sampling> for wit::Sampling {
    fn from(s: Sampling) -> Self {
        wit::Sampling {
            max_tokens: s.max_tokens,
            temperature: s.temperature,
            top_p: s.top_p,
            seed: s.seed,
            stop: s.stop,
        }
    }
}

impl From<wit::Sampling> for Sampling {
    fn from(s: wit::Sampling) -> Self {
        Sampling {
            max_tokens: s.max_tokens,
            temperature: s.temperature,
            top_p: s.top_p,
            seed: s.seed,
            stop: s.stop,
        }
    }
}

impl From<Request> for wit::Request {
    fn from(r: Request) -> Self {
        wit::Request {
            model: r.model,
            prompt: r.prompt.into(),
            sampling: r.sampling.into(),
            metadata: r.metadata,
        }
    }
}

impl From<wit::Request> for Request {
    fn from(r: wit::Request) -> Self {
        Request {
            model: r.model,
            prompt: r.prompt.into(),
            sampling: r.sampling.into(),
            metadata: r.metadata,
        }
    }
}

impl From<Response> for wit::Response {
    fn from(r: Response) -> Self {
        wit::Response {
            model: r.model,
            text: r.text,
            finish_reason: r.finish_reason,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
        }
    }
}

impl From<wit::Response> for Response {
    fn from(r: wit::Response) -> Self {
        Response {
            model: r.model,
            text: r.text,
            finish_reason: r.finish_reason,
            prompt_tokens: r.prompt_tokens,
            completion_tokens: r.completion_tokens,
        }
    }
}

impl From<wit::Rejection> for Rejection {
    /// Applies the ABI's rule: a status outside 400–499 is sent as 400.
    fn from(r: wit::Rejection) -> Self {
        let status = if (400..=499).contains(&r.status) {
            r.status
        } else {
            Rejection::FALLBACK_STATUS
        };
        Rejection {
            status,
            message: r.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejection_status_outside_4xx_becomes_400() {
        for (sent, got) in [
            (403, 403),
            (400, 400),
            (499, 499),
            (500, 400),
            (200, 400),
            (0, 400),
        ] {
            let rejection = Rejection::from(wit::Rejection {
                status: sent,
                message: String::new(),
            });
            assert_eq!(rejection.status, got, "status {sent}");
        }
    }

    #[test]
    fn output_size_counts_every_string_and_element() {
        let empty = Request {
            model: String::new(),
            prompt: Prompt::Tokens(vec![1, 2]),
            sampling: Sampling {
                max_tokens: None,
                temperature: 1.0,
                top_p: 1.0,
                seed: None,
                stop: vec![String::new()],
            },
            metadata: vec![(String::new(), String::new()); 3],
        };
        // model + 2 tokens + 1 stop + 3 pairs.
        let overhead = OUTPUT_ITEM_OVERHEAD_BYTES;
        assert_eq!(empty.output_bytes(), overhead + 8 + overhead + 6 * overhead);
        let text = Prompt::Text("abc".into());
        assert_eq!(text.output_bytes(), 3 + overhead);
    }
}
