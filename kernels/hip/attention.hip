// Causal attention over the paged KV cache, the device twin of
// CpuKernels::attention_paged: query row r (of any sequence in the call)
// attends to positions 0..=row_pos[r] of its own sequence; position p is row
// p % block_tokens of pool block tables[row_table[r] + p / block_tokens];
// query head h reads KV head h / (n_heads / n_kv_heads) (GQA).
//
// Split-K over the sequence, two passes:
//   bh_attention_partial  grid (n_splits, n_heads, n_rows), blockDim BH_BLOCK.
//     Split s covers positions [s·split_positions, (s+1)·split_positions).
//     Each wave takes every waves-th position of the split: a wave-wide dot
//     q·k (lanes over head_dim), then an online softmax update of its running
//     max m, sum l and unnormalized output o (lanes over head_dim). The
//     block's waves are merged in LDS and written as (m, l) and o.
//   bh_attention_reduce   grid (n_heads, n_rows), blockDim BH_BLOCK.
//     out = Σ_s o_s e^(m_s - M) / Σ_s l_s e^(m_s - M), M = max_s m_s.
// A split past a row's last position writes m = -inf, l = 0, o = 0 and
// weighs nothing in the reduce. The contiguous cache of
// CpuKernels::attention is the same call with one block of all positions.
// The CPU normalizes first and sums p·v after; this sums e^(s-m)·v and
// divides at the end: the same value up to f32 rounding (tests state the
// tolerance).
#include "common.h"

// head_dim / warpSize values per lane, up to BH_MAX_HEAD_DIM on wave 32.
#define BH_ATT_PER_LANE (BH_MAX_HEAD_DIM / 32)
// Waves per block at BH_BLOCK threads on wave 32 (the most waves).
#define BH_ATT_MAX_WAVES (BH_BLOCK / 32)

BH_DEVICE uint64_t bh_kv_offset(const BhAttentionArgs& a, uint32_t row, uint32_t p, uint32_t kv_head) {
    const uint32_t block = a.tables[a.row_table[row] + p / a.block_tokens];
    const uint64_t kv_row = uint64_t(block) * a.block_tokens + p % a.block_tokens;
    return kv_row * (uint64_t(a.n_kv_heads) * a.head_dim) + uint64_t(kv_head) * a.head_dim;
}

BH_KERNEL __launch_bounds__(BH_BLOCK) void bh_attention_partial(BhAttentionArgs a) {
    __shared__ float q_s[BH_MAX_HEAD_DIM];
    __shared__ float wave_m[BH_ATT_MAX_WAVES];
    __shared__ float wave_l[BH_ATT_MAX_WAVES];
    __shared__ float wave_o[BH_ATT_MAX_WAVES][BH_MAX_HEAD_DIM];
    const uint32_t split = blockIdx.x, h = blockIdx.y, row = blockIdx.z;
    const uint32_t d = a.head_dim, lane = bh_lane(), wave = bh_wave(), waves = bh_waves();
    const uint32_t kv_head = h / (a.n_heads / a.n_kv_heads);
    const float* q = a.q + (uint64_t(row) * a.n_heads + h) * d;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) q_s[i] = q[i];
    __syncthreads();

    const uint32_t n_pos = a.row_pos[row] + 1;
    const uint32_t begin = split * a.split_positions;
    const uint32_t end = min(n_pos, begin + a.split_positions);
    float m = -INFINITY, l = 0.0f, o[BH_ATT_PER_LANE];
    for (int i = 0; i < BH_ATT_PER_LANE; ++i) o[i] = 0.0f;
    for (uint32_t p = begin + wave; p < end; p += waves) {
        const uint64_t off = bh_kv_offset(a, row, p, kv_head);
        const float* k = a.k_pool + off;
        const float* v = a.v_pool + off;
        float dot = 0.0f;
        for (uint32_t i = lane; i < d; i += warpSize) dot = fmaf(q_s[i], k[i], dot);
        const float s = bh_wave_allsum(dot) * a.scale;
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new);  // 0 on the first position (m = -inf)
        const float e = expf(s - m_new);
        l = l * corr + e;
        int slot = 0;
        for (uint32_t i = lane; i < d; i += warpSize, ++slot) o[slot] = fmaf(e, v[i], o[slot] * corr);
        m = m_new;
    }
    if (lane == 0) {
        wave_m[wave] = m;
        wave_l[wave] = l;
    }
    {
        int slot = 0;
        for (uint32_t i = lane; i < d; i += warpSize, ++slot) wave_o[wave][i] = o[slot];
    }
    __syncthreads();

    float bm = -INFINITY;
    for (uint32_t w = 0; w < waves; ++w) bm = fmaxf(bm, wave_m[w]);
    const uint64_t part = (uint64_t(row) * a.n_heads + h) * a.n_splits + split;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t w = 0; w < waves; ++w)
            if (wave_m[w] != -INFINITY) acc = fmaf(wave_o[w][i], expf(wave_m[w] - bm), acc);
        a.partial_o[part * d + i] = acc;
    }
    if (threadIdx.x == 0) {
        float bl = 0.0f;
        for (uint32_t w = 0; w < waves; ++w)
            if (wave_m[w] != -INFINITY) bl = fmaf(wave_l[w], expf(wave_m[w] - bm), bl);
        a.partial_ml[2 * part] = bm;
        a.partial_ml[2 * part + 1] = bl;
    }
}

BH_KERNEL __launch_bounds__(BH_BLOCK) void bh_attention_reduce(BhAttentionArgs a) {
    const uint32_t h = blockIdx.x, row = blockIdx.y, d = a.head_dim;
    const uint64_t first = (uint64_t(row) * a.n_heads + h) * a.n_splits;
    float big_m = -INFINITY;
    for (uint32_t s = 0; s < a.n_splits; ++s) big_m = fmaxf(big_m, a.partial_ml[2 * (first + s)]);
    float big_l = 0.0f;
    for (uint32_t s = 0; s < a.n_splits; ++s) {
        const float ms = a.partial_ml[2 * (first + s)];
        if (ms != -INFINITY) big_l = fmaf(a.partial_ml[2 * (first + s) + 1], expf(ms - big_m), big_l);
    }
    float* out = a.out + (uint64_t(row) * a.n_heads + h) * d;
    for (uint32_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t s = 0; s < a.n_splits; ++s) {
            const float ms = a.partial_ml[2 * (first + s)];
            if (ms != -INFINITY) acc = fmaf(a.partial_o[(first + s) * d + i], expf(ms - big_m), acc);
        }
        out[i] = acc / big_l;
    }
}
