//! The generation loop: prefill, then decode token by token with sampling,
//! streaming complete UTF-8 text and honouring stop strings and max tokens.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::backend::Backend;
use super::model::{ForwardError, Logits, Model};
use super::sampling::{Sampler, SamplingError, SamplingParams};
use crate::Tokenizer;

/// Largest number of stop strings and their length, as OpenAI allows (4) with room.
pub const MAX_STOP_STRINGS: usize = 16;
/// Longest stop string in bytes.
pub const MAX_STOP_BYTES: usize = 256;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// The prompt, already tokenized (special tokens included).
    pub prompt_tokens: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// How to pick each token.
    pub sampling: SamplingParams,
    /// Generation stops before any of these strings; they are not part of the output.
    pub stop: Vec<String>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

impl FinishReason {
    /// OpenAI's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    /// Generated tokens (an end-of-generation token is not included).
    pub tokens: Vec<u32>,
    /// Generated text, cut before a stop string.
    pub text: String,
    pub finish_reason: FinishReason,
    pub prompt_time: Duration,
    pub decode_time: Duration,
}

/// Why generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "prompt of {prompt} tokens plus max_tokens {max_tokens} exceeds the context length {context}"
    )]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error("at most {MAX_STOP_STRINGS} stop strings of 1..={MAX_STOP_BYTES} bytes each")]
    BadStop,
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// The caller's callback asked to stop (e.g. its client went away).
    #[error("generation was cancelled")]
    Cancelled,
}

/// A piece of streamed output: text that is final, and the tokens generated
/// since the previous piece. Concatenated, the pieces give `Generation::text`
/// and `Generation::tokens`; the last piece may carry tokens and no text.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    pub text: &'a str,
    pub tokens: &'a [u32],
}

/// Runs `req` on `model`, calling `on_text` with each piece of text as soon as
/// it is complete UTF-8 and cannot be the start of a stop string.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    backend: &dyn Backend,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, GenerateError> {
    generate_streaming(model, tokenizer, backend, req, &mut |piece| {
        if !piece.text.is_empty() {
            on_text(piece.text);
        }
        ControlFlow::Continue(())
    })
}

/// Like [`generate`], but each [`Piece`] also carries its tokens, and the
/// callback may return `ControlFlow::Break` to stop generating
/// ([`GenerateError::Cancelled`]), checked after every token.
pub fn generate_streaming(
    model: &Model,
    tokenizer: &Tokenizer,
    backend: &dyn Backend,
    req: &GenerateRequest,
    on_piece: &mut dyn FnMut(Piece<'_>) -> ControlFlow<()>,
) -> Result<Generation, GenerateError> {
    if req.prompt_tokens.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if req.stop.len() > MAX_STOP_STRINGS
        || req
            .stop
            .iter()
            .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(GenerateError::BadStop);
    }
    let context = model.config().context_length;
    let prompt_len = req.prompt_tokens.len();
    if prompt_len + req.max_tokens > context {
        return Err(GenerateError::TooLong {
            prompt: prompt_len,
            max_tokens: req.max_tokens,
            context,
        });
    }
    let mut sampler = Sampler::new(req.sampling.clone())?;
    let mut cache = model.new_cache(prompt_len + req.max_tokens);

    let started = Instant::now();
    let mut logits = model.forward(backend, &mut cache, &req.prompt_tokens, Logits::Last)?;
    let prompt_time = started.elapsed();

    let decode_started = Instant::now();
    let mut history = req.prompt_tokens.clone();
    let mut tokens = Vec::new();
    let mut decoder = tokenizer.stream_decoder();
    let mut stops = StopScanner::new(&req.stop);
    let mut finish_reason = FinishReason::Length;
    let mut out = PieceSink {
        on_piece,
        unsent: Vec::new(),
        cancelled: false,
    };
    while tokens.len() < req.max_tokens {
        let next = sampler.sample(&mut logits, &history);
        if tokenizer.is_end_of_generation(next) {
            finish_reason = FinishReason::Stop;
            break;
        }
        tokens.push(next);
        history.push(next);
        out.unsent.push(next);
        let piece = decoder.push(next);
        let stopped = stops.push(&piece, &mut |text| out.send(text));
        if out.cancelled {
            return Err(GenerateError::Cancelled);
        }
        if stopped {
            finish_reason = FinishReason::Stop;
            break;
        }
        if tokens.len() == req.max_tokens {
            break;
        }
        logits = model.forward(backend, &mut cache, &[next], Logits::Last)?;
    }
    if !stops.stopped {
        let tail = decoder.finish();
        if !stops.push(&tail, &mut |text| out.send(text)) {
            stops.flush(&mut |text| out.send(text));
        }
    }
    if !out.unsent.is_empty() {
        out.send("");
    }
    if out.cancelled {
        return Err(GenerateError::Cancelled);
    }
    Ok(Generation {
        prompt_tokens: req.prompt_tokens.clone(),
        tokens,
        text: stops.emitted,
        finish_reason,
        prompt_time,
        decode_time: decode_started.elapsed(),
    })
}

/// Hands text to the caller together with the tokens generated since the last piece.
struct PieceSink<'f> {
    on_piece: &'f mut dyn FnMut(Piece<'_>) -> ControlFlow<()>,
    unsent: Vec<u32>,
    cancelled: bool,
}

impl PieceSink<'_> {
    fn send(&mut self, text: &str) {
        let tokens = std::mem::take(&mut self.unsent);
        let flow = (self.on_piece)(Piece {
            text,
            tokens: &tokens,
        });
        self.cancelled |= flow.is_break();
    }
}

/// Holds back text that might be the beginning of a stop string.
#[derive(Debug)]
struct StopScanner<'s> {
    stops: &'s [String],
    pending: String,
    emitted: String,
    stopped: bool,
}

impl<'s> StopScanner<'s> {
    fn new(stops: &'s [String]) -> Self {
        StopScanner {
            stops,
            pending: String::new(),
            emitted: String::new(),
            stopped: false,
        }
    }

    /// Adds text; returns true when a stop string was found (text before it is emitted).
    fn push(&mut self, text: &str, on_text: &mut dyn FnMut(&str)) -> bool {
        self.pending.push_str(text);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = found {
            let before = self.pending[..at].to_string();
            self.emit(&before, on_text);
            self.pending.clear();
            self.stopped = true;
            return true;
        }
        // Keep the longest suffix of `pending` that is a proper prefix of a stop string.
        let mut keep = 0;
        for s in self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.pending.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let cut = self.pending.len() - keep;
        let ready = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        self.emit(&ready, on_text);
        false
    }

    fn flush(&mut self, on_text: &mut dyn FnMut(&str)) {
        let rest = std::mem::take(&mut self.pending);
        self.emit(&rest, on_text);
    }

    fn emit(&mut self, text: &str, on_text: &mut dyn FnMut(&str)) {
        if !text.is_empty() {
            self.emitted.push_str(text);
            on_text(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(stops: &[&str], pieces: &[&str]) -> (String, bool, Vec<String>) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopScanner::new(&stops);
        let mut seen = Vec::new();
        let mut stopped = false;
        for p in pieces {
            if s.push(p, &mut |t| seen.push(t.to_string())) {
                stopped = true;
                break;
            }
        }
        if !stopped {
            s.flush(&mut |t| seen.push(t.to_string()));
        }
        (s.emitted, stopped, seen)
    }

    #[test]
    fn stop_string_split_across_pieces_is_never_emitted() {
        let (text, stopped, seen) = scan(&["END"], &["hello E", "N", "D world"]);
        assert_eq!((text.as_str(), stopped), ("hello ", true));
        assert_eq!(seen.concat(), "hello ");
    }

    #[test]
    fn held_back_prefix_is_released_when_it_does_not_match() {
        let (text, stopped, seen) = scan(&["END"], &["a E", "Nx", "b"]);
        assert_eq!((text.as_str(), stopped), ("a ENxb", false));
        assert_eq!(seen.concat(), "a ENxb");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_unicode_is_respected() {
        let (text, stopped, _) = scan(&["é!", "zz"], &["ab zz cd é!"]);
        assert_eq!((text.as_str(), stopped), ("ab ", true));
        let (text, _, _) = scan(&["éa"], &["xé", "b"]);
        assert_eq!(text, "xéb");
    }
}
