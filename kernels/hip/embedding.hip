// Embedding lookup: rows of a (possibly quantized) table to f32.
#include "common.h"

// One thread per element, one grid row per token; bit-identical to
// kernels/src/dequant.rs.
BH_KERNEL void bh_embedding(BhEmbeddingArgs a) {
    const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= a.cols) return;
    const uint8_t* row = a.table + uint64_t(a.tokens[blockIdx.y]) * a.row_bytes;
    a.out[uint64_t(blockIdx.y) * a.cols + c] = bh_dequant(a.ty, row, c);
}
