// Tiled matmul for prefill: out[t * rows + r] = Σ_c W[r][c] x[t][c] for many
// tokens at once. A block computes a 64-row × 64-token tile; each 32-column
// step dequantizes the weight tile into LDS (any type, through
// bh_dequant — the same rounding as the CPU's dequantize_row) next to the
// activation tile, and every thread accumulates a 4 × 4 sub-tile with fmaf.
// Activations stay f32 (the CPU's matmul quantizes them to Q8 first), so the
// oracle is dequantized weights · f32 activations, not the CPU's matmul.
//
// Launch: blockDim exactly 256 (not tied to the wave size), grid
// (ceil(rows / 64), ceil(n_tokens / 64)). Edges (rows, tokens, columns not
// multiples of the tile) are zero-filled in LDS and not stored.
#include "common.h"

#define BH_TM 64
#define BH_TN 64
#define BH_TK 32

BH_KERNEL __launch_bounds__(256) void bh_matmul_tiled(BhMatArgs a) {
    // +1 column: consecutive threads read consecutive rows of a k-slice
    // without bank conflicts.
    __shared__ float ws[BH_TK][BH_TM + 1];
    __shared__ float xs[BH_TK][BH_TN + 1];
    const uint32_t r0 = blockIdx.x * BH_TM, t0 = blockIdx.y * BH_TN;
    const uint32_t tid = threadIdx.x, tr = tid % 16, tt = tid / 16;
    const float* x = static_cast<const float*>(a.x);
    float acc[4][4] = {};
    for (uint32_t k0 = 0; k0 < a.cols; k0 += BH_TK) {
        for (uint32_t e = tid; e < BH_TM * BH_TK; e += 256) {
            const uint32_t r = e / BH_TK, k = e % BH_TK;
            const bool in = r0 + r < a.rows && k0 + k < a.cols;
            ws[k][r] = in ? bh_dequant(a.ty, a.w + uint64_t(r0 + r) * a.row_bytes, k0 + k) : 0.0f;
        }
        for (uint32_t e = tid; e < BH_TN * BH_TK; e += 256) {
            const uint32_t t = e / BH_TK, k = e % BH_TK;
            const bool in = t0 + t < a.n_tokens && k0 + k < a.cols;
            xs[k][t] = in ? x[uint64_t(t0 + t) * a.cols + k0 + k] : 0.0f;
        }
        __syncthreads();
        for (uint32_t k = 0; k < BH_TK; ++k) {
            float wv[4], xv[4];
            for (int i = 0; i < 4; ++i) wv[i] = ws[k][tr + 16 * i];
            for (int j = 0; j < 4; ++j) xv[j] = xs[k][tt + 16 * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const uint32_t r = r0 + tr + 16 * i;
        if (r >= a.rows) continue;
        for (int j = 0; j < 4; ++j) {
            const uint32_t t = t0 + tt + 16 * j;
            if (t < a.n_tokens) a.out[uint64_t(t) * a.rows + r] = acc[i][j];
        }
    }
}
