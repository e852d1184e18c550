use std::path::PathBuf;

/// Why a GGUF file was refused. Every variant names the offending part.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error(
        "unsupported GGUF version {0} (supported: 2 and 3; a huge number suggests a big-endian file)"
    )]
    UnsupportedVersion(u32),
    #[error(
        "truncated file: {what} at byte {offset} needs {needed} bytes, only {available} remain"
    )]
    Truncated {
        what: String,
        offset: usize,
        needed: u64,
        available: usize,
    },
    #[error("{what}: {count} exceeds the limit of {limit}")]
    LimitExceeded {
        what: String,
        count: u64,
        limit: u64,
    },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    BadUtf8 { what: String, offset: usize },
    #[error("metadata key {key:?}: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("general.alignment is {0}; it must be a power of two between 1 and 65536")]
    BadAlignment(u64),
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    #[error(
        "tensor {tensor:?}: tensor type {} (GGML id {type_id}) is not one the engine computes with",
        super::type_name(*type_id)
    )]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor {tensor:?}: {reason}")]
    BadShape { tensor: String, reason: String },
    #[error("tensor {tensor:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {tensor:?}: bytes {start}..{end} lie outside the file ({file_len} bytes)")]
    OutOfFile {
        tensor: String,
        start: u64,
        end: u64,
        file_len: usize,
    },
    #[error("tensors {first:?} and {second:?} overlap in the file")]
    Overlap { first: String, second: String },
}
