//! The model's weights as views into the mapped GGUF file, checked against the config.

use std::ops::Range;

use std::sync::OnceLock;

use bulkhead_kernels::{GgmlType, PackedMatrix, QuantMatrix, dequantize_row};

use super::config::{Arch, ConfigError, ModelConfig};
use crate::backend::{Experts, MoeFfn};
use crate::gguf::{Gguf, TensorInfo};

/// A matrix stored in the file: `rows` rows of `cols` elements of type `ty`,
/// and the form a backend repacked it into, once it has.
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

    /// Whether a backend repacked this matrix.
    pub fn is_packed(&self) -> bool {
        self.packed.get().is_some()
    }

    /// The file's bytes of this matrix.
    pub fn file_range(&self) -> Range<usize> {
        self.range.clone()
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
    pub wo: MatrixRef,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
}

impl LayerWeights {
    /// The layer's dense matrices: the attention projections and a dense
    /// FFN's three (not a mixture's experts).
    pub fn dense_matrices(&self) -> Vec<&MatrixRef> {
        let mut m = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        if let Ffn::Dense { gate, up, down } = &self.ffn {
            m.extend([gate, up, down]);
        }
        m
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
}

impl Weights {
    /// Finds and shape-checks every tensor the forward pass needs.
    pub fn load(gguf: &Gguf, cfg: &ModelConfig) -> Result<Weights, ConfigError> {
        if gguf.tensor("rope_freqs.weight").is_some() {
            return Err(ConfigError::Invalid {
                key: "rope_freqs.weight".into(),
                reason: "per-frequency RoPE factors (Llama 3.1 scaling) are not supported yet"
                    .into(),
            });
        }
        let d = cfg.embedding_dim;
        let q_dim = cfg.heads * cfg.head_dim;
        let kv = cfg.kv_dim();
        let token_embd = matrix(gguf, "token_embd.weight", cfg.vocab_size, d)?;
        let output = match gguf.tensor("output.weight") {
            Some(_) => matrix(gguf, "output.weight", cfg.vocab_size, d)?,
            None => token_embd.clone(),
        };
        let with_bias = cfg.arch == Arch::Qwen2;
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let name = |t: &str| format!("blk.{i}.{t}");
            let bias = |t: &str, len| -> Result<Option<Vec<f32>>, ConfigError> {
                match gguf.tensor(&name(t)) {
                    Some(_) => vector(gguf, &name(t), len).map(Some),
                    None if with_bias => Err(missing(&name(t))),
                    None => Ok(None),
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector(gguf, &name("attn_norm.weight"), d)?,
                wq: matrix(gguf, &name("attn_q.weight"), q_dim, d)?,
                wk: matrix(gguf, &name("attn_k.weight"), kv, d)?,
                wv: matrix(gguf, &name("attn_v.weight"), kv, d)?,
                bq: bias("attn_q.bias", q_dim)?,
                bk: bias("attn_k.bias", kv)?,
                bv: bias("attn_v.bias", kv)?,
                wo: matrix(gguf, &name("attn_output.weight"), d, q_dim)?,
                ffn_norm: vector(gguf, &name("ffn_norm.weight"), d)?,
                ffn: match cfg.moe {
                    None => Ffn::Dense {
                        gate: matrix(gguf, &name("ffn_gate.weight"), cfg.ffn_dim, d)?,
                        up: matrix(gguf, &name("ffn_up.weight"), cfg.ffn_dim, d)?,
                        down: matrix(gguf, &name("ffn_down.weight"), d, cfg.ffn_dim)?,
                    },
                    Some(moe) => {
                        let (n, ff) = (moe.experts, moe.expert_ffn_dim);
                        Ffn::Moe(MoeWeights {
                            router: matrix(gguf, &name("ffn_gate_inp.weight"), n, d)?,
                            gate: experts(gguf, &name("ffn_gate_exps.weight"), n, ff, d)?,
                            up: experts(gguf, &name("ffn_up_exps.weight"), n, ff, d)?,
                            down: experts(gguf, &name("ffn_down_exps.weight"), n, d, ff)?,
                        })
                    }
                },
            });
        }
        Ok(Weights {
            token_embd,
            layers,
            output_norm: vector(gguf, "output_norm.weight", d)?,
            output,
        })
    }
}

fn missing(name: &str) -> ConfigError {
    ConfigError::Invalid {
        key: name.to_string(),
        reason: "tensor is missing".into(),
    }
}

fn find<'g>(gguf: &'g Gguf, name: &str) -> Result<&'g TensorInfo, ConfigError> {
    gguf.tensor(name).ok_or_else(|| missing(name))
}

fn matrix(gguf: &Gguf, name: &str, rows: usize, cols: usize) -> Result<MatrixRef, ConfigError> {
    let t = find(gguf, name)?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(ConfigError::Invalid {
            key: name.to_string(),
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
        return Err(ConfigError::Invalid {
            key: name.to_string(),
            reason: format!("shape {:?}, expected [{cols}, {rows}, {count}]", t.dims),
        });
    }
    // Each expert a whole matrix of its type: `count · rows` rows of
    // whole blocks.
    if let Err(e) = QuantMatrix::new(t.ty, gguf.tensor_data(t), count * rows, cols) {
        return Err(ConfigError::Invalid {
            key: name.to_string(),
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
        return Err(ConfigError::Invalid {
            key: name.to_string(),
            reason: format!("shape {:?}, expected [{len}]", t.dims),
        });
    }
    let mut out = vec![0.0; len];
    dequantize_row(t.ty, gguf.tensor_data(t), &mut out);
    Ok(out)
}
