//! The weights of a mixture-of-experts FFN as a pass takes them: the
//! router and the experts' three matrices, each a stack of one matrix per
//! expert (GGUF's 3-D `ffn_{gate,up,down}_exps`).

use bulkhead_kernels::{GgmlType, QuantMatrix};

/// `count` matrices of `rows × cols`, one after the other in `data` (the
/// expert index is a 3-D tensor's outermost dimension).
#[derive(Clone, Copy, Debug)]
pub struct Experts<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
}

impl<'a> Experts<'a> {
    /// Expert `e`'s matrix: only its own bytes.
    ///
    /// # Panics
    /// If `e` is out of range or the stack's shape does not fit `data`
    /// (checked when the model was loaded).
    pub fn expert(&self, e: usize) -> QuantMatrix<'a> {
        assert!(e < self.count, "expert {e} of a stack of {}", self.count);
        let bytes = self.data.len() / self.count;
        QuantMatrix::new(
            self.ty,
            &self.data[e * bytes..(e + 1) * bytes],
            self.rows,
            self.cols,
        )
        .expect("expert shapes were checked when the model was loaded")
    }
}

/// One layer's mixture-of-experts FFN: each row goes through the
/// `experts_used` experts the router scores highest (softmax over all
/// experts, the chosen ones' weights renormalized to sum to one, as
/// llama.cpp runs Mixtral and Qwen3-MoE), their SwiGLU outputs summed
/// with those weights.
#[derive(Clone, Copy, Debug)]
pub struct MoeFfn<'a> {
    /// `experts × embedding`: one logit per expert.
    pub router: QuantMatrix<'a>,
    /// Each `ffn × embedding`.
    pub gate: Experts<'a>,
    pub up: Experts<'a>,
    /// Each `embedding × ffn`.
    pub down: Experts<'a>,
    pub experts_used: usize,
}
