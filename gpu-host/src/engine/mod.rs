//! The model runtime: a model's config and weights, the forward pass over a
//! [`Backend`](crate::backend::Backend), the paged KV store, sampling and
//! the generation loop of one sequence.
//!
//! May import the backend trait, `gguf`, the tokenizer; never the
//! schedulers (`sched`) or the server: it knows nothing of tenants.

mod config;
mod generate;
mod host_pass;
mod model;
mod moe;
mod paged;
mod sampling;
mod weights;
mod zeroed;

pub use config::{Arch, ConfigError, ModelConfig, MoeConfig, RopeConfig, supported_architectures};
pub use generate::{
    Completion, Decoded, Decoding, FinishReason, GenerateError, GenerateRequest, MAX_STOP_BYTES,
    MAX_STOP_STRINGS, Next, Pass, Piece, generate, generate_observed, generate_streaming,
};
pub use model::{ForwardError, KvCache, Logits, Model, PREFILL_CHUNK};
pub use paged::{BLOCK_TOKENS, BatchEntry, KvBlocks};
pub use sampling::{Sampler, SamplingError, SamplingParams, argmax};
