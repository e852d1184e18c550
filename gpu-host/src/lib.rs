//! Bulkhead's GPU host: loads GGUF models and runs them (CPU backend today),
//! serving them over gRPC (`server`).

// Unsafe is denied everywhere; the exceptions are mapping model files
// (`gguf::map_file`), the HIP runtime layer (`hip::runtime`, kernel
// argument packing) and the `sched_setscheduler` system call that puts the
// weight scrub at SCHED_IDLE (`verify::idle`), each block with its SAFETY
// argument.
#![deny(unsafe_code)]

mod affinity;
pub mod backend;
mod chat;
pub mod cuda;
pub mod engine;
pub mod gguf;
pub mod hip;
pub mod models;
pub mod sched;
pub mod server;
mod tokenizer;
pub mod verify;

pub use chat::{
    ChatMessage, ChatTemplate, ChatTemplateError, MAX_RENDERED_BYTES, MAX_TEMPLATE_BYTES,
    MAX_TEMPLATE_RECURSION, RENDER_FUEL,
};
pub use tokenizer::{
    LITERAL_END, LITERAL_START, MAX_MERGES, MAX_TOKEN_BYTES, MAX_VOCAB_TOKENS, StreamDecoder,
    TokenType, Tokenizer, TokenizerConfig, TokenizerError,
};
