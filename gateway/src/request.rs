//! A completion request as the gateway handles it, whatever carried it:
//! the HTTP layer parses OpenAI bodies into an [`InferenceRequest`]
//! (`api/openai.rs`), the plugin pipeline rewrites it, and it leaves as an
//! `upstream::Generate`.

pub use crate::upstream::Prompt;

/// Which endpoint a request came in on (decides the response shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    /// The label used in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completions",
            Endpoint::Completion => "completions",
        }
    }
}

/// A validated completion request.
#[derive(Clone, Debug, PartialEq)]
pub struct InferenceRequest {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompt: Prompt,
    /// As asked; `None` takes the endpoint's default (capped by the tenant).
    pub max_tokens: Option<u32>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Order among this tenant's waiting requests (higher first; default 0).
    pub priority: Option<i32>,
}

/// OpenAI's default `max_tokens` for the legacy completions endpoint.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;
/// OpenAI allows up to four stop sequences.
pub const MAX_STOP: usize = 4;
/// A stop sequence longer than this cannot be meant seriously and costs
/// matching time on every token.
pub const MAX_STOP_BYTES: usize = 256;
/// `priority` range: wide enough to order a tenant's traffic classes,
/// small enough that nobody mistakes it for a deadline.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = -100..=100;
/// Messages per chat request (the body limit bounds their size).
pub const MAX_MESSAGES: usize = 4096;

impl InferenceRequest {
    /// An upper bound on the prompt's tokens before the host has tokenized
    /// it: no tokenizer we load makes more than one token per byte, plus
    /// BOS/EOS and the chat template's few tokens around each message.
    pub fn prompt_token_bound(&self) -> u64 {
        const PER_MESSAGE: u64 = 16;
        const FIXED: u64 = 32;
        match &self.prompt {
            Prompt::Chat(messages) => {
                messages
                    .iter()
                    .map(|(role, content)| (role.len() + content.len()) as u64 + PER_MESSAGE)
                    .sum::<u64>()
                    + FIXED
            }
            Prompt::Text(text) => text.len() as u64 + FIXED,
            Prompt::Tokens(ids) => ids.len() as u64,
        }
    }
}

/// How a generation ended, in OpenAI's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    /// A tenant plugin withheld or cut the text.
    ContentFilter,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ContentFilter => "content_filter",
        }
    }
}
