//! The generation loop: prefill, then decode token by token with sampling,
//! streaming complete UTF-8 text and honouring stop strings and max tokens.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::model::{ForwardError, Logits, Model, PREFILL_CHUNK};
use super::sampling::{Sampler, SamplingError, SamplingParams};
use crate::Tokenizer;
use crate::backend::Backend;
use crate::tokenizer::TextStream;

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
pub struct Completion {
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
/// since the previous piece. Concatenated, the pieces give `Completion::text`
/// and `Completion::tokens`; the last piece may carry tokens and no text.
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
) -> Result<Completion, GenerateError> {
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
) -> Result<Completion, GenerateError> {
    generate_observed(model, tokenizer, backend, req, on_piece, &mut |_| {})
}

/// One forward pass of a generation, as [`generate_observed`] reports it
/// once it has run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// A chunk of the prompt ([`PREFILL_CHUNK`] tokens at most).
    Prefill { tokens: usize },
    /// One generated token.
    Decode,
}

/// Like [`generate_streaming`], calling `on_pass` after every forward pass
/// (what `generate --json` reads the device's counters between).
pub fn generate_observed(
    model: &Model,
    tokenizer: &Tokenizer,
    backend: &dyn Backend,
    req: &GenerateRequest,
    on_piece: &mut dyn FnMut(Piece<'_>) -> ControlFlow<()>,
    on_pass: &mut dyn FnMut(Pass),
) -> Result<Completion, GenerateError> {
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
    let mut decoding = Decoding::new(req, tokenizer)?;
    let mut cache = model.new_cache(prompt_len + req.max_tokens);

    let started = Instant::now();
    // Chunk by chunk, as `forward` cuts it itself: the same logits.
    let mut logits = Vec::new();
    for chunk in req.prompt_tokens.chunks(PREFILL_CHUNK) {
        logits = model.forward(backend, &mut cache, chunk, Logits::Last)?;
        on_pass(Pass::Prefill {
            tokens: chunk.len(),
        });
    }
    let prompt_time = started.elapsed();

    let decode_started = Instant::now();
    if decoding.is_done() {
        // max_tokens 0: nothing to sample.
    } else {
        loop {
            match decoding.next(tokenizer, &mut logits, on_piece) {
                Next::Run(token) => {
                    logits = model.forward(backend, &mut cache, &[token], Logits::Last)?;
                    on_pass(Pass::Decode);
                }
                Next::Done => break,
                Next::Cancelled => return Err(GenerateError::Cancelled),
            }
        }
    }
    let done = decoding.finish(on_piece)?;
    Ok(Completion {
        prompt_tokens: req.prompt_tokens.clone(),
        tokens: done.tokens,
        text: done.text,
        finish_reason: done.finish_reason,
        prompt_time,
        decode_time: decode_started.elapsed(),
    })
}

/// What a sequence does after [`Decoding::next`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run this token through the model and call `next` with its logits.
    Run(u32),
    /// Generation ended: call [`Decoding::finish`].
    Done,
    /// The caller's callback broke: stop without finishing.
    Cancelled,
}

/// A finished sequence's output.
#[derive(Clone, Debug)]
pub struct Decoded {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
}

/// One sequence's decoding state between forward passes: sampler, history,
/// text assembly, stop strings and max_tokens. [`generate_streaming`] and
/// the batch scheduler both drive it, so a sequence streams the same pieces
/// and ends the same way whether it runs alone or in a batch.
#[derive(Debug)]
pub struct Decoding {
    sampler: Sampler,
    history: Vec<u32>,
    tokens: Vec<u32>,
    max_tokens: usize,
    text: TextStream,
    stops: StopScanner,
    finish_reason: FinishReason,
    unsent: Vec<u32>,
    done: bool,
}

impl Decoding {
    /// The state before the first sampled token; checks the sampling params.
    pub fn new(req: &GenerateRequest, tokenizer: &Tokenizer) -> Result<Decoding, GenerateError> {
        Ok(Decoding {
            sampler: Sampler::new(req.sampling.clone())?,
            history: req.prompt_tokens.clone(),
            tokens: Vec::new(),
            max_tokens: req.max_tokens,
            text: tokenizer.stream_decoder().detach(),
            stops: StopScanner::new(req.stop.clone()),
            finish_reason: FinishReason::Length,
            unsent: Vec::new(),
            done: req.max_tokens == 0,
        })
    }

    /// True once nothing more is to be sampled.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Prompt and generated tokens: what the cache must hold before the
    /// next token is sampled (a preempted sequence recomputes them).
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.tokens.len()
    }

    /// Samples from the logits of the last token run, streams what became
    /// final text through `on_piece`, and says what to do next.
    pub fn next(
        &mut self,
        tokenizer: &Tokenizer,
        logits: &mut [f32],
        on_piece: &mut dyn FnMut(Piece<'_>) -> ControlFlow<()>,
    ) -> Next {
        if self.done {
            return Next::Done;
        }
        let next = self.sampler.sample(logits, &self.history);
        if tokenizer.is_end_of_generation(next) {
            self.finish_reason = FinishReason::Stop;
            self.done = true;
            return Next::Done;
        }
        self.tokens.push(next);
        self.history.push(next);
        self.unsent.push(next);
        let piece = self.text.push(tokenizer, next);
        let mut out = PieceSink {
            on_piece,
            unsent: &mut self.unsent,
            cancelled: false,
        };
        let stopped = self.stops.push(&piece, &mut |text| out.send(text));
        if out.cancelled {
            self.done = true;
            return Next::Cancelled;
        }
        if stopped {
            self.finish_reason = FinishReason::Stop;
            self.done = true;
            return Next::Done;
        }
        if self.tokens.len() == self.max_tokens {
            self.done = true;
            return Next::Done;
        }
        Next::Run(next)
    }

    /// Streams the text held back (an unfinished character, a partial stop
    /// string) and the tokens not yet sent, and returns the output.
    pub fn finish(
        self,
        on_piece: &mut dyn FnMut(Piece<'_>) -> ControlFlow<()>,
    ) -> Result<Decoded, GenerateError> {
        let Decoding {
            tokens,
            text,
            mut stops,
            finish_reason,
            mut unsent,
            ..
        } = self;
        let mut out = PieceSink {
            on_piece,
            unsent: &mut unsent,
            cancelled: false,
        };
        if !stops.stopped {
            let tail = text.finish();
            if !stops.push(&tail, &mut |t| out.send(t)) {
                stops.flush(&mut |t| out.send(t));
            }
        }
        if !out.unsent.is_empty() {
            out.send("");
        }
        if out.cancelled {
            return Err(GenerateError::Cancelled);
        }
        Ok(Decoded {
            tokens,
            text: stops.emitted,
            finish_reason,
        })
    }
}

/// Hands text to the caller together with the tokens generated since the last piece.
struct PieceSink<'f> {
    on_piece: &'f mut dyn FnMut(Piece<'_>) -> ControlFlow<()>,
    unsent: &'f mut Vec<u32>,
    cancelled: bool,
}

impl PieceSink<'_> {
    fn send(&mut self, text: &str) {
        let tokens = std::mem::take(self.unsent);
        let flow = (self.on_piece)(Piece {
            text,
            tokens: &tokens,
        });
        self.cancelled |= flow.is_break();
    }
}

/// Holds back text that might be the beginning of a stop string.
#[derive(Debug)]
struct StopScanner {
    stops: Vec<String>,
    pending: String,
    emitted: String,
    stopped: bool,
}

impl StopScanner {
    fn new(stops: Vec<String>) -> Self {
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
        for s in &self.stops {
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
        let mut s = StopScanner::new(stops);
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
