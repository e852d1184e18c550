//! Bulkhead's GPU host: loads GGUF models and runs them (CPU backend today).

// Unsafe is denied everywhere; the one exception is mapping model files
// (`gguf::map_file`), which carries its SAFETY argument.
#![deny(unsafe_code)]

pub mod gguf;
