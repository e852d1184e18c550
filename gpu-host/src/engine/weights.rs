//! The model's weights as views into the mapped GGUF file, checked against the config.

use std::ops::Range;
use std::sync::OnceLock;

use bulkhead_kernels::{GgmlType, PackedMatrix, QuantMatrix, dequantize_row};

use super::config::{Arch, ConfigError, ModelConfig};
use crate::backend::{Experts, MoeFfn};
use crate::gguf::{Gguf, TensorInfo};

/// A matrix stored in the file: `rows` rows of `cols` elements of type `ty`
/// (a whole tensor, or consecutive rows of a fused one), and the form a
/// backend repacked it into, once it has.
#[derive(Clone, Debug)]
pub struct MatrixRef {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
    packed: OnceLock<PackedMatrix>,
}

impl MatrixRef {
    /// A kernel view of this matrix inside `gguf`'s mapping, with its packed
    /// form when it has one.
    pub fn view<'g>(&'g self, gguf: &'g Gguf) -> QuantMatrix<'g> {
        let bytes = &gguf.mapped_bytes()[self.range.clone()];
        let m = QuantMatrix::new(self.ty, bytes, self.rows, self.cols)
            .expect("shape and length were checked when the model was loaded");
        match self.packed.get() {
            Some(p) => m.with_packed(p),
            None => m,
        }
    }

    /// Keeps `packed` (this matrix, repacked by a backend) for every later
    /// view; false if it already had one.
    pub fn set_packed(&self, packed: PackedMatrix) -> bool {
        self.packed.set(packed).is_ok()
    }

    /// The form a backend repacked this matrix into, if it did.
    pub fn packed(&self) -> Option<&PackedMatrix> {
        self.packed.get()
    }

    /// The file's bytes of this matrix.
    pub fn file_range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Rows `at..at + rows` of this matrix (a part of a fused projection:
    /// each row is its own run of blocks, so a part is a matrix too).
    fn rows(&self, at: usize, rows: usize) -> MatrixRef {
        let row_bytes = (self.range.end - self.range.start) / self.rows;
        let start = self.range.start + at * row_bytes;
        MatrixRef {
            ty: self.ty,
            rows,
            cols: self.cols,
            range: start..start + rows * row_bytes,
            packed: OnceLock::new(),
        }
    }
}

/// One transformer block's weights.
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: MatrixRef,
    pub wk: MatrixRef,
    pub wv: MatrixRef,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    /// RMSNorm of each query and key head (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub wo: MatrixRef,
    /// RMSNorm of the attention output before the residual add (Gemma).
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    /// RMSNorm of the feed-forward output before the residual add (Gemma).
    pub ffn_post_norm: Option<Vec<f32>>,
}

impl LayerWeights {
    /// The layer's matrices as a pass reads them: the attention
    /// projections and a dense feed-forward's three (not a mixture's
    /// router and experts).
    pub fn matrices(&self) -> Vec<&MatrixRef> {
        let mut m = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        if let Ffn::Dense { gate, up, down } = &self.ffn {
            m.extend([gate, up, down]);
        }
        m
    }

    /// Every vector of the layer (norms and biases).
    pub fn vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        [&self.attn_norm, &self.ffn_norm].into_iter().chain(
            [
                &self.bq,
                &self.bk,
                &self.bv,
                &self.q_norm,
                &self.k_norm,
                &self.attn_post_norm,
                &self.ffn_post_norm,
            ]
            .into_iter()
            .flatten(),
        )
    }
}

/// A layer's feed-forward network.
#[derive(Debug)]
pub enum Ffn {
    /// SwiGLU: `down(silu(gate x) * up x)`.
    Dense {
        gate: MatrixRef,
        up: MatrixRef,
        down: MatrixRef,
    },
    /// A mixture of SwiGLU experts.
    Moe(MoeWeights),
}

/// A mixture-of-experts FFN's tensors: `ffn_gate_inp` (the router) and the
/// stacked experts `ffn_{gate,up,down}_exps`.
#[derive(Debug)]
pub struct MoeWeights {
    pub router: MatrixRef,
    pub gate: ExpertsRef,
    pub up: ExpertsRef,
    pub down: ExpertsRef,
}

impl MoeWeights {
    /// The pass's view of these weights inside `gguf`'s mapping.
    pub fn view<'g>(&'g self, gguf: &'g Gguf, experts_used: usize) -> MoeFfn<'g> {
        MoeFfn {
            router: self.router.view(gguf),
            gate: self.gate.view(gguf),
            up: self.up.view(gguf),
            down: self.down.view(gguf),
            experts_used,
        }
    }
}

/// A 3-D tensor of `count` matrices of `rows × cols` (GGUF dims
/// `[cols, rows, count]`).
#[derive(Clone, Debug)]
pub struct ExpertsRef {
    pub ty: GgmlType,
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    range: Range<usize>,
}

impl ExpertsRef {
    /// A view of the stack inside `gguf`'s mapping.
    pub fn view<'g>(&self, gguf: &'g Gguf) -> Experts<'g> {
        Experts {
            ty: self.ty,
            data: &gguf.mapped_bytes()[self.range.clone()],
            count: self.count,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// All weights of a model.
#[derive(Debug)]
pub struct Weights {
    pub token_embd: MatrixRef,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The output projection; `token_embd` itself when the embeddings are tied.
    pub output: MatrixRef,
    /// `rope_freqs.weight`: a divisor of each rotated pair's angle (Llama
    /// 3.1-style scaling, converted).
    pub rope_factors: Option<Vec<f32>>,
}

impl Weights {
    /// Finds and shape-checks every tensor the forward pass needs.
    pub fn load(gguf: &Gguf, cfg: &ModelConfig) -> Result<Weights, ConfigError> {
        for long_rope in ["rope_factors_long.weight", "rope_factors_short.weight"] {
            if gguf.tensor(long_rope).is_some() {
                return Err(ConfigError::Tensor {
                    tensor: long_rope.into(),
                    reason: "LongRoPE (Phi-3 128k) scaling is not supported".into(),
                });
            }
        }
        let d = cfg.embedding_dim;
        let token_embd = matrix(gguf, "token_embd.weight", cfg.vocab_size, d)?;
        // Gemma 2 always ties them (llama.cpp ignores an output.weight).
        let output = match gguf.tensor("output.weight") {
            Some(_) if cfg.arch != Arch::Gemma2 => {
                matrix(gguf, "output.weight", cfg.vocab_size, d)?
            }
            _ => token_embd.clone(),
        };
        let rope_factors = match gguf.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(gguf, "rope_freqs.weight", cfg.rope.dim / 2)?),
            None => None,
        };
        let layers = (0..cfg.layers)
            .map(|i| layer(gguf, cfg, i))
            .collect::<Result<_, _>>()?;
        Ok(Weights {
            token_embd,
            layers,
            output_norm: vector(gguf, "output_norm.weight", d)?,
            output,
            rope_factors,
        })
    }
}

fn layer(gguf: &Gguf, cfg: &ModelConfig, i: usize) -> Result<LayerWeights, ConfigError> {
    let d = cfg.embedding_dim;
    let (q_dim, kv) = (cfg.q_dim(), cfg.kv_dim());
    let name = |t: &str| format!("blk.{i}.{t}");
    let optional = |t: &str, len| -> Result<Option<Vec<f32>>, ConfigError> {
        match gguf.tensor(&name(t)) {
            Some(_) => vector(gguf, &name(t), len).map(Some),
            None => Ok(None),
        }
    };
    let required = |t: &str, len| vector(gguf, &name(t), len).map(Some);
    let gemma = matches!(cfg.arch, Arch::Gemma2 | Arch::Gemma3);

    // Q, K and V: three tensors, or one fused tensor of their rows in
    // that order (Phi-3).
    let (wq, wk, wv, fused_bias) = match gguf.tensor(&name("attn_qkv.weight")) {
        Some(_) => {
            let qkv = matrix(gguf, &name("attn_qkv.weight"), q_dim + 2 * kv, d)?;
            let bias = optional("attn_qkv.bias", q_dim + 2 * kv)?;
            (
                qkv.rows(0, q_dim),
                qkv.rows(q_dim, kv),
                qkv.rows(q_dim + kv, kv),
                bias,
            )
        }
        None => (
            matrix(gguf, &name("attn_q.weight"), q_dim, d)?,
            matrix(gguf, &name("attn_k.weight"), kv, d)?,
            matrix(gguf, &name("attn_v.weight"), kv, d)?,
            None,
        ),
    };
    let (bq, bk, bv) = match fused_bias {
        Some(b) => (
            Some(b[..q_dim].to_vec()),
            Some(b[q_dim..q_dim + kv].to_vec()),
            Some(b[q_dim + kv..].to_vec()),
        ),
        None if cfg.arch == Arch::Qwen2 => (
            required("attn_q.bias", q_dim)?,
            required("attn_k.bias", kv)?,
            required("attn_v.bias", kv)?,
        ),
        None => (
            optional("attn_q.bias", q_dim)?,
            optional("attn_k.bias", kv)?,
            optional("attn_v.bias", kv)?,
        ),
    };
    let (q_norm, k_norm) = match cfg.arch {
        Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => (
            required("attn_q_norm.weight", cfg.head_dim)?,
            required("attn_k_norm.weight", cfg.head_dim)?,
        ),
        _ => (None, None),
    };
    // Gate and up: two tensors, or (Phi-3) one `ffn_up` of twice the rows,
    // the gate's first; or a mixture of experts (Mixtral).
    let ffn = match cfg.moe {
        Some(moe) => {
            let (n, ff) = (moe.experts, moe.expert_ffn_dim);
            Ffn::Moe(MoeWeights {
                router: matrix(gguf, &name("ffn_gate_inp.weight"), n, d)?,
                gate: experts(gguf, &name("ffn_gate_exps.weight"), n, ff, d)?,
                up: experts(gguf, &name("ffn_up_exps.weight"), n, ff, d)?,
                down: experts(gguf, &name("ffn_down_exps.weight"), n, d, ff)?,
            })
        }
        None => dense_ffn(gguf, cfg, i)?,
    };
    Ok(LayerWeights {
        attn_norm: vector(gguf, &name("attn_norm.weight"), d)?,
        wq,
        wk,
        wv,
        bq,
        bk,
        bv,
        q_norm,
        k_norm,
        wo: matrix(gguf, &name("attn_output.weight"), d, q_dim)?,
        attn_post_norm: if gemma {
            required("post_attention_norm.weight", d)?
        } else {
            None
        },
        ffn_norm: vector(gguf, &name("ffn_norm.weight"), d)?,
        ffn,
        ffn_post_norm: if gemma {
            required("post_ffw_norm.weight", d)?
        } else {
            None
        },
    })
}

/// Layer `i`'s dense feed-forward: gate and up as two tensors, or (Phi-3)
/// one `ffn_up` of twice the rows, the gate's first; then down.
fn dense_ffn(gguf: &Gguf, cfg: &ModelConfig, i: usize) -> Result<Ffn, ConfigError> {
    let d = cfg.embedding_dim;
    let name = |t: &str| format!("blk.{i}.{t}");
    let (w_gate, w_up) = match cfg.arch {
        Arch::Phi3 if gguf.tensor(&name("ffn_gate.weight")).is_none() => {
            let fused = matrix(gguf, &name("ffn_up.weight"), 2 * cfg.ffn_dim, d)?;
            (
                fused.rows(0, cfg.ffn_dim),
                fused.rows(cfg.ffn_dim, cfg.ffn_dim),
            )
        }
        _ => (
            matrix(gguf, &name("ffn_gate.weight"), cfg.ffn_dim, d)?,
            matrix(gguf, &name("ffn_up.weight"), cfg.ffn_dim, d)?,
        ),
    };
    Ok(Ffn::Dense {
        gate: w_gate,
        up: w_up,
        down: matrix(gguf, &name("ffn_down.weight"), d, cfg.ffn_dim)?,
    })
}

fn missing(name: &str) -> ConfigError {
    ConfigError::Tensor {
        tensor: name.to_string(),
        reason: "missing".into(),
    }
}

fn find<'g>(gguf: &'g Gguf, name: &str) -> Result<&'g TensorInfo, ConfigError> {
    gguf.tensor(name).ok_or_else(|| missing(name))
}

fn matrix(gguf: &Gguf, name: &str, rows: usize, cols: usize) -> Result<MatrixRef, ConfigError> {
    let t = find(gguf, name)?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(ConfigError::Tensor {
            tensor: name.to_string(),
            reason: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
        });
    }
    Ok(MatrixRef {
        ty: t.ty,
        rows,
        cols,
        range: t.file_range(),
        packed: OnceLock::new(),
    })
}

/// A stack of `count` matrices of `rows × cols`, one per expert.
fn experts(
    gguf: &Gguf,
    name: &str,
    count: usize,
    rows: usize,
    cols: usize,
) -> Result<ExpertsRef, ConfigError> {
    let t = find(gguf, name)?;
    if t.dims != [cols as u64, rows as u64, count as u64] {
        return Err(ConfigError::Tensor {
            tensor: name.to_string(),
            reason: format!("shape {:?}, expected [{cols}, {rows}, {count}]", t.dims),
        });
    }
    // Each expert a whole matrix of its type: `count · rows` rows of
    // whole blocks.
    if let Err(e) = QuantMatrix::new(t.ty, gguf.tensor_data(t), count * rows, cols) {
        return Err(ConfigError::Tensor {
            tensor: name.to_string(),
            reason: e.to_string(),
        });
    }
    let range = t.file_range();
    Ok(ExpertsRef {
        ty: t.ty,
        count,
        rows,
        cols,
        range,
    })
}

/// A 1-D tensor (norm weights, biases) dequantized to f32; these are small.
fn vector(gguf: &Gguf, name: &str, len: usize) -> Result<Vec<f32>, ConfigError> {
    let t = find(gguf, name)?;
    if t.dims != [len as u64] {
        return Err(ConfigError::Tensor {
            tensor: name.to_string(),
            reason: format!("shape {:?}, expected [{len}]", t.dims),
        });
    }
    let mut out = vec![0.0; len];
    dequantize_row(t.ty, gguf.tensor_data(t), &mut out);
    Ok(out)
}
