//! Bulkhead's GPU host: loads GGUF models and runs them (CPU backend today).

#![forbid(unsafe_code)]

mod tokenizer;

pub use tokenizer::{
    MAX_MERGES, MAX_TOKEN_BYTES, MAX_VOCAB_TOKENS, StreamDecoder, TokenType, Tokenizer,
    TokenizerConfig, TokenizerError,
};
