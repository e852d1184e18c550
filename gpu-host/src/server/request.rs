//! Turning a `GenerateRequest` from the wire into the engine's, checked up
//! front so a bad request is refused before it takes a place in the queue.
//! Every refusal is INVALID_ARGUMENT naming the field.

use bulkhead_protocol::v1::{self, generate_request::Prompt};
use tonic::Status;

use crate::ChatMessage;
use crate::engine::{GenerateRequest, MAX_STOP_BYTES, MAX_STOP_STRINGS, SamplingParams};
use crate::models::LoadedModel;

pub(crate) fn to_engine(
    model: &LoadedModel,
    req: &v1::GenerateRequest,
) -> Result<GenerateRequest, Status> {
    let specials = if req.parse_special {
        Specials::Parse
    } else {
        Specials::AsText
    };
    let prompt_tokens = prompt_tokens(model, req.prompt.as_ref(), specials)?;
    let defaults = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: req.temperature.unwrap_or(defaults.temperature),
        top_k: req.top_k.map_or(defaults.top_k, |k| k as usize),
        top_p: req.top_p.unwrap_or(defaults.top_p),
        min_p: req.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: req
            .repetition_penalty
            .unwrap_or(defaults.repetition_penalty),
        seed: req.seed.unwrap_or(defaults.seed),
        ..defaults
    };
    // The engine's message names the parameter, e.g. "top_p must be in (0, 1], got 1.5".
    sampling
        .validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    if req.stop.len() > MAX_STOP_STRINGS
        || req
            .stop
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(Status::invalid_argument(format!(
            "stop: at most {MAX_STOP_STRINGS} strings of 1..={MAX_STOP_BYTES} bytes each"
        )));
    }
    let context = model.model.config().context_length;
    let prompt_len = prompt_tokens.len();
    if prompt_len >= context {
        return Err(Status::invalid_argument(format!(
            "prompt: {prompt_len} tokens do not fit the context length {context} of model `{}`",
            model.name
        )));
    }
    let max_tokens = match req.max_tokens {
        None => match req.max_tokens_cap {
            Some(0) => {
                return Err(Status::invalid_argument(
                    "max_tokens_cap must be at least 1",
                ));
            }
            Some(cap) => (context - prompt_len).min(cap as usize),
            None => context - prompt_len,
        },
        Some(0) => return Err(Status::invalid_argument("max_tokens must be at least 1")),
        Some(n) if prompt_len + n as usize > context => {
            return Err(Status::invalid_argument(format!(
                "max_tokens: the prompt's {prompt_len} tokens plus max_tokens {n} exceed \
                 the context length {context} of model `{}`",
                model.name
            )));
        }
        Some(n) => n as usize,
    };
    Ok(GenerateRequest {
        prompt_tokens,
        max_tokens,
        sampling,
        stop: req.stop.clone(),
    })
}

/// Whether a text prompt's control-token spellings are control tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Specials {
    Parse,
    AsText,
}

fn prompt_tokens(
    model: &LoadedModel,
    prompt: Option<&Prompt>,
    specials: Specials,
) -> Result<Vec<u32>, Status> {
    let tokens = match prompt {
        None => {
            return Err(Status::invalid_argument(
                "prompt: give one of text, chat or tokens",
            ));
        }
        Some(Prompt::Text(text)) => match specials {
            Specials::Parse => model.tokenizer.encode(text, true),
            Specials::AsText => model.tokenizer.encode_literal(text, true),
        },
        Some(Prompt::Chat(chat)) => {
            if chat.messages.is_empty() {
                return Err(Status::invalid_argument("prompt.chat: no messages"));
            }
            let template = model.chat_template.as_ref().map_err(|e| {
                Status::failed_precondition(format!(
                    "model `{}` has no usable chat template: {e}",
                    model.name
                ))
            })?;
            let messages: Vec<ChatMessage> = chat
                .messages
                .iter()
                .map(|m| ChatMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect();
            let rendered = template
                .render_marked(&messages, true)
                .map_err(|e| Status::invalid_argument(format!("prompt.chat: {e}")))?;
            model.tokenizer.encode_marked(&rendered, false)
        }
        Some(Prompt::Tokens(ids)) => {
            let vocab = model.tokenizer.vocab_size();
            if let Some(bad) = ids.ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(Status::invalid_argument(format!(
                    "prompt.tokens: id {bad} is outside the vocabulary of {vocab} of model `{}`",
                    model.name
                )));
            }
            ids.ids.clone()
        }
    };
    if tokens.is_empty() {
        return Err(Status::invalid_argument("prompt: it is empty"));
    }
    Ok(tokens)
}
