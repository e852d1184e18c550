// Row and element-wise ops: RMSNorm, RoPE, softmax, SiLU·mul, add. Each
// follows kernels/src/scalar/ops.rs's arithmetic (f64 accumulation where the
// CPU uses it; build.rs turns off fp contraction so products round alike).
#include "common.h"

// One block per row. The sum of squares in f64, as ggml and the CPU do.
BH_KERNEL void bh_rms_norm(BhRmsNormArgs a) {
    __shared__ double scratch[32];
    const uint32_t row = blockIdx.x;
    if (row >= a.n_rows) return;
    const float* x = a.x + uint64_t(row) * a.width;
    float* out = a.out + uint64_t(row) * a.width;
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < a.width; i += blockDim.x) s += double(x[i] * x[i]);
    s = bh_block_sum_f64(s, scratch);
    const float mean = float(s / double(a.width));
    const float scale = 1.0f / sqrtf(mean + a.eps);
    for (uint32_t i = threadIdx.x; i < a.width; i += blockDim.x) out[i] = x[i] * scale * a.weight[i];
}

// One thread per (token, head, pair). The angle in f64 as the CPU computes
// it: pos · freq_scale · freq_base^(-2i / rot_dim). Each token's position
// comes from `positions`, so one launch rotates a batch of sequences.
BH_KERNEL void bh_rope(BhRopeArgs a) {
    const uint32_t half = a.rot_dim / 2;
    const uint64_t idx = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (half == 0 || idx >= uint64_t(a.n_tokens) * a.n_heads * half) return;
    const uint32_t i = idx % half;
    const uint64_t head = idx / half;  // token * n_heads + head
    const uint32_t pos = a.positions[head / a.n_heads];
    const double theta = double(pos) * double(a.freq_scale) *
                         pow(double(a.freq_base), -2.0 * double(i) / double(a.rot_dim));
    const float c = float(cos(theta)), s = float(sin(theta));
    float* h = a.x + head * a.head_dim;
    const uint32_t p0 = a.style == BH_ROPE_NEOX ? i : 2 * i;
    const uint32_t p1 = a.style == BH_ROPE_NEOX ? i + half : 2 * i + 1;
    const float x0 = h[p0], x1 = h[p1];
    h[p0] = x0 * c - x1 * s;
    h[p1] = x0 * s + x1 * c;
}

// One block per row: exp(x - max) / Σ, the sum in f64.
BH_KERNEL void bh_softmax(BhSoftmaxArgs a) {
    __shared__ float max_scratch[32];
    __shared__ double sum_scratch[32];
    const uint32_t row = blockIdx.x;
    if (row >= a.n_rows) return;
    float* x = a.x + uint64_t(row) * a.width;
    float m = -INFINITY;
    for (uint32_t i = threadIdx.x; i < a.width; i += blockDim.x) m = fmaxf(m, x[i]);
    m = bh_block_max(m, max_scratch);
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < a.width; i += blockDim.x) {
        const float e = expf(x[i] - m);
        x[i] = e;
        s += double(e);
    }
    s = bh_block_sum_f64(s, sum_scratch);
    const float inv = float(1.0 / s);
    for (uint32_t i = threadIdx.x; i < a.width; i += blockDim.x) x[i] *= inv;
}

// a = silu(a) * b, silu(g) = g / (1 + exp(-g)).
BH_KERNEL void bh_silu_mul(BhBinaryArgs a) {
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
         i += uint64_t(gridDim.x) * blockDim.x) {
        const float g = a.a[i];
        a.a[i] = g / (1.0f + expf(-g)) * a.b[i];
    }
}

// a += b.
BH_KERNEL void bh_add(BhBinaryArgs a) {
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
         i += uint64_t(gridDim.x) * blockDim.x) {
        a.a[i] += a.b[i];
    }
}
