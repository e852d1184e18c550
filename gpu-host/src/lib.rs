//! Bulkhead's GPU host: loads GGUF models and runs them (CPU backend today).

#![forbid(unsafe_code)]
