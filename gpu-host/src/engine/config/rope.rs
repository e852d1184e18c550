//! RoPE's settings from GGUF metadata: base, rotated dimensions, style and
//! context-extension scaling (linear, YaRN), read as llama.cpp reads them.

use bulkhead_kernels::{RopeStyle, Yarn};

use super::{Arch, ConfigError, in_range, positive};
use crate::gguf::Metadata;

/// How a model's layers rotate queries and keys.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Dimensions of each head that RoPE rotates.
    pub dim: usize,
    pub base: f32,
    /// Position scale: 1 / the linear or YaRN factor.
    pub scale: f32,
    pub style: RopeStyle,
    pub yarn: Option<Yarn>,
    /// Base and scale of the sliding-window layers (Gemma 3 turns them by
    /// 10000, unscaled, and its global layers by `base`).
    pub swa_base: f32,
    pub swa_scale: f32,
}

impl RopeConfig {
    pub(super) fn from_metadata(
        m: &Metadata,
        arch: Arch,
        head_dim: usize,
    ) -> Result<RopeConfig, ConfigError> {
        let name = arch.name();
        let key = |suffix: &str| format!("{name}.{suffix}");
        let dim = match m.get_u64(&key("rope.dimension_count"))? {
            None => head_dim,
            Some(v) if v as usize <= head_dim && v % 2 == 0 && v > 0 => v as usize,
            Some(v) => {
                return Err(ConfigError::Invalid {
                    key: key("rope.dimension_count"),
                    reason: format!("{v} must be even and at most the head size {head_dim}"),
                });
            }
        };
        let base = positive(m, &key("rope.freq_base"), 10_000.0)?;
        let (scale, yarn) = scaling(m, name)?;
        let (swa_base, swa_scale) = match arch {
            Arch::Gemma3 => (positive(m, &key("rope.freq_base_swa"), 10_000.0)?, 1.0),
            _ => (positive(m, &key("rope.freq_base_swa"), base)?, scale),
        };
        Ok(RopeConfig {
            dim,
            base,
            scale,
            style: match arch {
                Arch::Llama => RopeStyle::Normal,
                _ => RopeStyle::Neox,
            },
            yarn,
            swa_base,
            swa_scale,
        })
    }

    /// The base and scale of a layer, by whether it has a sliding window.
    pub fn base_and_scale(&self, sliding: bool) -> (f32, f32) {
        if sliding {
            (self.swa_base, self.swa_scale)
        } else {
            (self.base, self.scale)
        }
    }
}

/// `rope.scaling.*`: the position scale, and YaRN's parameters. As in
/// llama.cpp, a file without `rope.scaling.type` is linear (by
/// `rope.scaling.factor`, or the older `rope.scale_linear`; none: 1).
fn scaling(m: &Metadata, arch: &str) -> Result<(f32, Option<Yarn>), ConfigError> {
    let key = |suffix: &str| format!("{arch}.rope.scaling.{suffix}");
    let kind_key = key("type");
    let kind = m.get_str(&kind_key)?.unwrap_or("linear");
    let factor_key = if m.get(&key("factor")).is_some() {
        key("factor")
    } else {
        format!("{arch}.rope.scale_linear")
    };
    let factor = match m.get_f32(&factor_key)? {
        None | Some(0.0) => 1.0,
        Some(_) => positive(m, &factor_key, 1.0)?,
    };
    match kind {
        "none" => Ok((1.0, None)),
        "linear" => Ok((1.0 / factor, None)),
        "yarn" => {
            if m.get_f32(&key("yarn_log_multiplier"))?
                .is_some_and(|v| v != 0.0)
            {
                return Err(ConfigError::Invalid {
                    key: key("yarn_log_multiplier"),
                    reason: "YaRN with a log multiplier (DeepSeek's mscale) is not supported"
                        .into(),
                });
            }
            let orig_key = key("original_context_length");
            let orig_ctx = m.get_u64(&orig_key)?.ok_or_else(|| ConfigError::Invalid {
                key: orig_key.clone(),
                reason: "YaRN needs the context length the model was trained on".into(),
            })?;
            let orig_ctx = in_range(&orig_key, orig_ctx, 1 << 24)?;
            let ext_factor = m.get_f32(&key("yarn_ext_factor"))?.unwrap_or(1.0);
            if !(0.0..=1.0).contains(&ext_factor) {
                return Err(ConfigError::Invalid {
                    key: key("yarn_ext_factor"),
                    reason: format!("{ext_factor} is not in 0..=1"),
                });
            }
            // transformers' attention_factor when the model sets one, else
            // its default 0.1 ln(factor) + 1 (what ggml's rope applies).
            let mscale = match m.get_f32(&key("yarn_attn_factor"))? {
                Some(_) => positive(m, &key("yarn_attn_factor"), 1.0)?,
                None if factor > 1.0 => 0.1 * factor.ln() + 1.0,
                None => 1.0,
            };
            let yarn = Yarn {
                orig_ctx,
                ext_factor,
                beta_fast: positive(m, &key("yarn_beta_fast"), 32.0)?,
                beta_slow: positive(m, &key("yarn_beta_slow"), 1.0)?,
                attn_factor: mscale * positive(m, &key("attn_factor"), 1.0)?,
            };
            Ok((1.0 / factor, Some(yarn)))
        }
        other => Err(ConfigError::UnsupportedRopeScaling {
            key: kind_key,
            kind: other.to_string(),
        }),
    }
}
