//! Model hyperparameters, read from GGUF metadata (never guessed): the
//! shape every architecture shares, and what each one changes in the one
//! forward pass (an activation, norms, attention windows and caps, an
//! embedding scale, RoPE scaling).

use bulkhead_kernels::Activation;

use crate::gguf::{Array, Gguf, GgufError, Metadata, Value};

mod rope;

pub use rope::RopeConfig;

/// The architectures the engine runs (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3/3.x, Mistral, TinyLlama, SmolLM: RMSNorm, SwiGLU,
    /// interleaved RoPE (Llama 3.1's scaling as per-pair factors).
    Llama,
    /// Qwen2 / Qwen2.5: like Llama with q/k/v biases and NeoX-style RoPE
    /// (YaRN for long context).
    Qwen2,
    /// Qwen3: Qwen2 without the biases, with an RMSNorm of each query and
    /// key head.
    Qwen3,
    /// Qwen3-MoE: Qwen3's attention, and a mixture of experts in every
    /// layer (top-k of a softmax router, the chosen weights renormalized).
    Qwen3Moe,
    /// Phi-3: NeoX RoPE, fused q/k/v and gate/up projections.
    Phi3,
    /// Gemma 2: GeGLU, √width embedding scale, norms after attention and
    /// the feed-forward too, soft-capped scores and logits, sliding-window
    /// attention every other layer.
    Gemma2,
    /// Gemma 3 (text): Gemma 2 with query/key norms instead of score
    /// capping, five sliding-window layers to one global, and a RoPE base
    /// of its own for the sliding layers.
    Gemma3,
}

impl Arch {
    /// Every architecture, in the order errors list them.
    pub const ALL: [Arch; 7] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Phi3,
        Arch::Gemma2,
        Arch::Gemma3,
    ];

    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Phi3 => "phi3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
        }
    }

    fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    fn is_gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }
}

/// The `general.architecture` values [`ModelConfig::from_gguf`] accepts.
pub fn supported_architectures() -> String {
    Arch::ALL.map(Arch::name).join(", ")
}

/// Why a model's metadata (or its tensors, as [`super::weights`] checks
/// them) was refused. Each names the key or tensor that is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture {0:?} (supported: {list})", list = supported_architectures())]
    UnsupportedArch(String),
    #[error("metadata {key}: {reason}")]
    Invalid { key: String, reason: String },
    #[error("tensor {tensor}: {reason}")]
    Tensor { tensor: String, reason: String },
    #[error(
        "metadata {key}: unsupported rope scaling type {kind:?} (supported: none, linear, yarn)"
    )]
    UnsupportedRopeScaling { key: String, kind: String },
    /// The model runs on the CPU, but needs ops the device kernels lack.
    #[error(
        "this {arch} model needs {ops}, which the GPU kernels do not implement; run it with the CPU backend"
    )]
    NotOnDevice { arch: &'static str, ops: String },
}

/// Hyperparameters of a model, whatever its architecture.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub embedding_dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// Width of each query, key and value head (`attention.key_length`;
    /// the embedding width over the heads when absent).
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope: RopeConfig,
    /// The feed-forward's gate activation.
    pub activation: Activation,
    /// Multiplier of the token embeddings (Gemma: √width).
    pub embedding_scale: Option<f32>,
    /// Scale of the attention scores (1/√head_dim, save Gemma's 27B models).
    pub attention_scale: f32,
    /// Soft cap of the attention scores (Gemma 2).
    pub attn_softcap: Option<f32>,
    /// Soft cap of the output logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The sliding window of the layers that have one, and which do.
    pub sliding_window: Option<usize>,
    pub sliding_layers: Vec<bool>,
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
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch(arch_name.to_string()))?;
        let key = |suffix: &str| format!("{arch_name}.{suffix}");
        let bounded = |suffix: &str, max: u64| -> Result<usize, ConfigError> {
            let k = key(suffix);
            let v = m.require_u64(&k)?;
            in_range(&k, v, max)
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
        let head_dim = head_dim(m, arch_name, embedding_dim, heads)?;
        let rms_eps = positive(m, &key("attention.layer_norm_rms_epsilon"), 1e-5)?;
        let vocab_size = vocab_size(gguf, arch_name)?;
        let (sliding_window, sliding_layers) = match sliding_window(m, arch, layers)? {
            Some((window, flags)) => (Some(window), flags),
            None => (None, vec![false; layers]),
        };
        let rope = RopeConfig::from_metadata(m, arch, head_dim)?;
        let gemma = arch.is_gemma();
        // Gemma's 27B models scale scores by the width per head rather
        // than the head size (gemma_pytorch's query_pre_attn_scalar);
        // llama.cpp tells them by their layer count.
        let big_gemma = matches!((arch, layers), (Arch::Gemma2, 46) | (Arch::Gemma3, 62));
        let attention_scale = if big_gemma {
            1.0 / ((embedding_dim / heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let (attn_softcap, final_softcap) = match arch {
            Arch::Gemma2 => (
                Some(positive(m, &key("attn_logit_softcapping"), 50.0)?),
                Some(positive(m, &key("final_logit_softcapping"), 30.0)?),
            ),
            Arch::Gemma3 => (
                None,
                m.get_f32(&key("final_logit_softcapping"))?
                    .filter(|&c| c != 0.0)
                    .map(|_| positive(m, &key("final_logit_softcapping"), 0.0))
                    .transpose()?,
            ),
            _ => (None, None),
        };
        // Mixtral-style experts ride on the llama architecture; a qwen3moe
        // file must have them.
        let moe = match arch {
            Arch::Llama => moe_config(m, arch_name, ffn_dim)?,
            Arch::Qwen3Moe => match moe_config(m, arch_name, ffn_dim)? {
                Some(moe) => Some(moe),
                None => {
                    return Err(ConfigError::Invalid {
                        key: key("expert_count"),
                        reason: "a qwen3moe model needs experts".to_string(),
                    });
                }
            },
            _ => None,
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
            rope,
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            embedding_scale: gemma.then(|| (embedding_dim as f32).sqrt()),
            attention_scale,
            attn_softcap,
            final_softcap,
            sliding_window,
            sliding_layers,
            moe,
        })
    }

    /// Width of the query projection.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// The attention window of layer `layer` (`None`: every position).
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| self.sliding_layers.get(layer) == Some(&true))
    }
}

fn in_range(key: &str, v: u64, max: u64) -> Result<usize, ConfigError> {
    if v == 0 || v > max {
        return Err(ConfigError::Invalid {
            key: key.to_string(),
            reason: format!("{v} not in 1..={max}"),
        });
    }
    Ok(v as usize)
}

/// The head size: `attention.key_length` (Gemma, Qwen3), which the value
/// heads must share, else the width over the heads.
fn head_dim(m: &Metadata, arch: &str, width: usize, heads: usize) -> Result<usize, ConfigError> {
    let key_len = format!("{arch}.attention.key_length");
    let value_len = format!("{arch}.attention.value_length");
    let k = match m.get_u64(&key_len)? {
        Some(v) => in_range(&key_len, v, MAX_DIM)?,
        None => {
            if !width.is_multiple_of(heads) {
                return Err(ConfigError::Invalid {
                    key: format!("{arch}.attention.head_count"),
                    reason: format!("{heads} heads do not divide the embedding width {width}"),
                });
            }
            width / heads
        }
    };
    if let Some(v) = m.get_u64(&value_len)?
        && v as usize != k
    {
        return Err(ConfigError::Invalid {
            key: value_len,
            reason: format!("value heads of {v} differ from key heads of {k}; not supported"),
        });
    }
    Ok(k)
}

/// The sliding window and which layers use it: Gemma 2 every other layer
/// from the first, Gemma 3 five in six, unless
/// `attention.sliding_window_pattern` says otherwise (a period, or a flag
/// per layer), as llama.cpp reads them. Phi-3's window applies to every
/// layer, as in transformers (llama.cpp ignores it). Llama and Qwen
/// files have none (their converters write none; llama.cpp ignores one).
fn sliding_window(
    m: &Metadata,
    arch: Arch,
    layers: usize,
) -> Result<Option<(usize, Vec<bool>)>, ConfigError> {
    let default_period = match arch {
        Arch::Llama | Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe => return Ok(None),
        Arch::Gemma2 => 2,
        Arch::Gemma3 => 6,
        Arch::Phi3 => 1,
    };
    let key = format!("{}.attention.sliding_window", arch.name());
    let window = match (arch, m.get_u64(&key)?) {
        (_, Some(0)) | (Arch::Phi3 | Arch::Gemma3, None) => return Ok(None),
        (_, None) => 4096, // Gemma 2's, as llama.cpp assumes
        (_, Some(w)) => in_range(&key, w, MAX_CONTEXT)?,
    };
    let pattern_key = format!("{}.attention.sliding_window_pattern", arch.name());
    let flags = match m.get(&pattern_key) {
        None => period_flags(default_period, layers),
        Some(Value::Array(Array::Bool(flags))) if flags.len() == layers => flags.clone(),
        Some(value) => match value.as_u64() {
            Some(period) => period_flags(in_range(&pattern_key, period, MAX_LAYERS)?, layers),
            None => {
                return Err(ConfigError::Invalid {
                    key: pattern_key,
                    reason: format!("neither a period nor a flag for each of the {layers} layers"),
                });
            }
        },
    };
    Ok(Some((window, flags)))
}

/// llama.cpp's `set_swa_pattern`: in each run of `period` layers all but
/// the last slide (a period of 1: every layer slides).
fn period_flags(period: usize, layers: usize) -> Vec<bool> {
    (0..layers)
        .map(|l| period == 1 || l % period < period - 1)
        .collect()
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

#[cfg(test)]
mod tests;
