//! Model hyperparameters, read from GGUF metadata (never guessed).

use bulkhead_kernels::RopeStyle;

use crate::gguf::{Gguf, GgufError, Metadata};

/// The architectures the engine runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, TinyLlama, SmolLM: RMSNorm, SwiGLU, interleaved RoPE.
    Llama,
    /// Qwen2: like Llama with q/k/v biases and NeoX-style RoPE.
    Qwen2,
}

impl Arch {
    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// Why a model's metadata was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (supported: llama, qwen2)")]
    UnsupportedArch(String),
    #[error("metadata {key}: {reason}")]
    Invalid { key: String, reason: String },
    #[error("unsupported rope scaling type {0:?} (supported: none, linear)")]
    UnsupportedRopeScaling(String),
}

/// Hyperparameters of a llama-family model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub embedding_dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Position scale (1 / linear scaling factor).
    pub rope_scale: f32,
    /// Dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// A mixture of experts in every layer's FFN (Mixtral); `None`: dense.
    pub moe: Option<MoeConfig>,
}

/// A mixture-of-experts FFN's shape: each token goes through
/// `experts_used` of `experts` SwiGLU experts of width `expert_ffn_dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub experts: usize,
    pub experts_used: usize,
    pub expert_ffn_dim: usize,
}

/// Upper bounds that keep a hostile header from sizing huge allocations.
const MAX_LAYERS: u64 = 1024;
const MAX_DIM: u64 = 1 << 16;
const MAX_HEADS: u64 = 1024;
const MAX_CONTEXT: u64 = 1 << 24;
const MAX_EXPERTS: u64 = 512;

impl ModelConfig {
    /// Reads the hyperparameters of the model in `gguf`.
    pub fn from_gguf(gguf: &Gguf) -> Result<ModelConfig, ConfigError> {
        let m = gguf.metadata();
        let arch_name = m.require_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ConfigError::UnsupportedArch(other.to_string())),
        };
        let key = |suffix: &str| format!("{arch_name}.{suffix}");
        let bounded = |suffix: &str, max: u64| -> Result<usize, ConfigError> {
            let k = key(suffix);
            let v = m.require_u64(&k)?;
            if v == 0 || v > max {
                return Err(ConfigError::Invalid {
                    key: k,
                    reason: format!("{v} not in 1..={max}"),
                });
            }
            Ok(v as usize)
        };
        let embedding_dim = bounded("embedding_length", MAX_DIM)?;
        let layers = bounded("block_count", MAX_LAYERS)?;
        let heads = bounded("attention.head_count", MAX_HEADS)?;
        let ffn_dim = bounded("feed_forward_length", MAX_DIM * 4)?;
        let context_length = bounded("context_length", MAX_CONTEXT)?;
        let kv_heads = match m.get_u64(&key("attention.head_count_kv"))? {
            None => heads,
            Some(v) => v as usize,
        };
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(ConfigError::Invalid {
                key: key("attention.head_count_kv"),
                reason: format!("{kv_heads} does not divide the head count {heads}"),
            });
        }
        if embedding_dim % heads != 0 {
            return Err(ConfigError::Invalid {
                key: key("attention.head_count"),
                reason: format!("{heads} heads do not divide the embedding width {embedding_dim}"),
            });
        }
        let head_dim = embedding_dim / heads;
        let rope_dim = match m.get_u64(&key("rope.dimension_count"))? {
            None => head_dim,
            Some(v) if v as usize <= head_dim && v % 2 == 0 && v > 0 => v as usize,
            Some(v) => {
                return Err(ConfigError::Invalid {
                    key: key("rope.dimension_count"),
                    reason: format!("{v} must be even and at most the head size {head_dim}"),
                });
            }
        };
        let rms_eps = positive(m, &key("attention.layer_norm_rms_epsilon"), 1e-5)?;
        let rope_base = positive(m, &key("rope.freq_base"), 10_000.0)?;
        let rope_scale = rope_scale(m, arch_name)?;
        let vocab_size = vocab_size(gguf, arch_name)?;
        let rope_style = match arch {
            Arch::Llama => RopeStyle::Normal,
            Arch::Qwen2 => RopeStyle::Neox,
        };
        let moe = match arch {
            Arch::Llama => moe_config(m, arch_name, ffn_dim)?,
            Arch::Qwen2 => None,
        };
        Ok(ModelConfig {
            arch,
            vocab_size,
            embedding_dim,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn_dim,
            context_length,
            rms_eps,
            rope_base,
            rope_scale,
            rope_dim,
            rope_style,
            moe,
        })
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

fn positive(m: &Metadata, key: &str, default: f32) -> Result<f32, ConfigError> {
    let v = m.get_f32(key)?.unwrap_or(default);
    if !(v.is_finite() && v > 0.0) {
        return Err(ConfigError::Invalid {
            key: key.to_string(),
            reason: format!("{v} is not a positive number"),
        });
    }
    Ok(v)
}

fn rope_scale(m: &Metadata, arch: &str) -> Result<f32, ConfigError> {
    let kind = m
        .get_str(&format!("{arch}.rope.scaling.type"))?
        .unwrap_or("none");
    match kind {
        "none" => Ok(1.0),
        "linear" => {
            let key = format!("{arch}.rope.scaling.factor");
            let factor = positive(m, &key, 1.0)?;
            Ok(1.0 / factor)
        }
        other => Err(ConfigError::UnsupportedRopeScaling(other.to_string())),
    }
}

fn vocab_size(gguf: &Gguf, arch: &str) -> Result<usize, ConfigError> {
    let m = gguf.metadata();
    if let Some(n) = m.get_u64(&format!("{arch}.vocab_size"))? {
        return Ok(n as usize);
    }
    if let Some(tokens) = m.get_array("tokenizer.ggml.tokens")? {
        return Ok(tokens.len());
    }
    match gguf.tensor("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => Ok(t.dims[1] as usize),
        _ => Err(ConfigError::Invalid {
            key: "tokenizer.ggml.tokens".into(),
            reason: "no vocabulary size in metadata or token_embd.weight".into(),
        }),
    }
}

/// `{arch}.expert_count` and `{arch}.expert_used_count` (both needed when
/// there are experts; a count of 0 is a dense model), and the experts'
/// width: `{arch}.expert_feed_forward_length`, else the FFN width (as
/// Mixtral's files give it).
fn moe_config(m: &Metadata, arch: &str, ffn_dim: usize) -> Result<Option<MoeConfig>, ConfigError> {
    let count_key = format!("{arch}.expert_count");
    let experts = match m.get_u64(&count_key)? {
        None | Some(0) => return Ok(None),
        Some(n) if n <= MAX_EXPERTS => n as usize,
        Some(n) => {
            return Err(ConfigError::Invalid {
                key: count_key,
                reason: format!("{n} experts, at most {MAX_EXPERTS} supported"),
            });
        }
    };
    let used_key = format!("{arch}.expert_used_count");
    let experts_used = match m.get_u64(&used_key)? {
        Some(n) if (1..=experts as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ConfigError::Invalid {
                key: used_key,
                reason: format!("{n} not in 1..={experts} (the expert count)"),
            });
        }
        None => {
            return Err(ConfigError::Invalid {
                key: used_key,
                reason: format!("missing, and {count_key} is {experts}"),
            });
        }
    };
    let width_key = format!("{arch}.expert_feed_forward_length");
    let expert_ffn_dim = match m.get_u64(&width_key)? {
        None => ffn_dim,
        Some(n) if (1..=MAX_DIM * 4).contains(&n) => n as usize,
        Some(n) => {
            return Err(ConfigError::Invalid {
                key: width_key,
                reason: format!("{n} not in 1..={}", MAX_DIM * 4),
            });
        }
    };
    Ok(Some(MoeConfig {
        experts,
        experts_used,
        expert_ffn_dim,
    }))
}
