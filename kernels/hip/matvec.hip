// Matrix · vector for decode: memory-bound, so each wave streams one weight
// row with adjacent lanes on adjacent bytes, and the row's sum is a wave
// reduction. A wave takes its row against up to BH_MV_TOKENS tokens at once:
// each weight block is loaded once and dotted with every token's
// activations, so a batch of decode rows reads the weights once per group
// of BH_MV_TOKENS, not once per row. Launch: blockDim BH_BLOCK, grid
// (ceil(rows / waves per block), ceil(n_tokens / BH_MV_TOKENS));
// out[t * rows + r]. Every token's sum runs through the same blocks, lanes
// and wave tree whatever tokens share the wave, so each result is
// bit-identical to a one-token call (batched decode).
//
// The quantized kernels take activations already quantized by quantize.hip
// (Q8_0 for Q8_0/Q4_0 weights, Q8_K for Q4_K/Q6_K) and form the same integer
// block sums as kernels/src/scalar/dot.rs; only the order in which blocks'
// float products are added differs (lanes, then the wave tree).
//
// Lanes per weight block: 4 for the 32-element types, 16 for the 256-element
// ones, so a wave covers warpSize / 4 or warpSize / 16 blocks per step
// (wave 32 or 64 alike; warpSize must be at least 16, true of every GPU).
#include "common.h"

// Tokens per wave (MATVEC_TOKENS on the Rust side): their sums live in
// registers.
#define BH_MV_TOKENS 8

struct BhRowCtx {
    uint32_t row;
    uint32_t t0;  // first token of the wave
    uint32_t nt;  // tokens it takes, 1..=BH_MV_TOKENS
    bool live;
};

BH_DEVICE BhRowCtx bh_row_ctx(const BhMatArgs& a) {
    BhRowCtx c;
    c.row = blockIdx.x * bh_waves() + bh_wave();
    c.t0 = blockIdx.y * BH_MV_TOKENS;
    c.live = c.row < a.rows && c.t0 < a.n_tokens;
    c.nt = c.live ? min(uint32_t(BH_MV_TOKENS), a.n_tokens - c.t0) : 0;
    return c;
}

// The wave's sums (uniform in the wave: one row, one token group).
BH_DEVICE void bh_store_rows(const BhMatArgs& a, const BhRowCtx& c, const float* sum) {
    for (uint32_t t = 0; t < c.nt; ++t) {
        const float s = bh_wave_sum(sum[t]);
        if (bh_lane() == 0) a.out[uint64_t(c.t0 + t) * a.rows + c.row] = s;
    }
}

// F16 weights · f32 activations. Even rows are 4-byte aligned: two halves
// per 32-bit load.
BH_KERNEL void bh_matvec_f16(BhMatArgs a) {
    const BhRowCtx c = bh_row_ctx(a);
    if (!c.live) return;
    const uint8_t* w = a.w + uint64_t(c.row) * a.row_bytes;
    const float* x = static_cast<const float*>(a.x) + uint64_t(c.t0) * a.cols;
    float sum[BH_MV_TOKENS] = {};
    if (a.cols % 2 == 0) {
        const uint32_t* w2 = reinterpret_cast<const uint32_t*>(w);
        for (uint32_t p = bh_lane(); p < a.cols / 2; p += warpSize) {
            const uint32_t bits = w2[p];
            const float w0 = bh_half_bits_to_float(uint16_t(bits));
            const float w1 = bh_half_bits_to_float(uint16_t(bits >> 16));
            for (uint32_t t = 0; t < c.nt; ++t) {
                const float* xt = x + uint64_t(t) * a.cols;
                sum[t] = fmaf(w1, xt[2 * p + 1], fmaf(w0, xt[2 * p], sum[t]));
            }
        }
    } else {
        for (uint32_t i = bh_lane(); i < a.cols; i += warpSize) {
            const float wi = bh_f16(w + 2 * i);
            for (uint32_t t = 0; t < c.nt; ++t) sum[t] = fmaf(wi, x[uint64_t(t) * a.cols + i], sum[t]);
        }
    }
    bh_store_rows(a, c, sum);
}

// Any weight type · f32 activations, dequantizing element by element: the
// path for the types without an integer kernel (F32, BF16, Q4_1, Q5_0, Q5_1,
// Q5_K, IQ4_NL, IQ4_XS). Correct everywhere, tuned nowhere.
BH_KERNEL void bh_matvec_dequant(BhMatArgs a) {
    const BhRowCtx c = bh_row_ctx(a);
    if (!c.live) return;
    const uint8_t* w = a.w + uint64_t(c.row) * a.row_bytes;
    const float* x = static_cast<const float*>(a.x) + uint64_t(c.t0) * a.cols;
    float sum[BH_MV_TOKENS] = {};
    for (uint32_t i = bh_lane(); i < a.cols; i += warpSize) {
        const float wi = bh_dequant(a.ty, w, i);
        for (uint32_t t = 0; t < c.nt; ++t) sum[t] = fmaf(wi, x[uint64_t(t) * a.cols + i], sum[t]);
    }
    bh_store_rows(a, c, sum);
}

// Q8_0 · Q8_0: 4 lanes per 34-byte block, 8 quants each (four 16-bit loads).
BH_KERNEL void bh_matvec_q8_0(BhMatArgs a) {
    const BhRowCtx c = bh_row_ctx(a);
    if (!c.live) return;
    const uint32_t nb = a.cols / 32;
    const uint8_t* w = a.w + uint64_t(c.row) * a.row_bytes;
    const BhQ8_0* x = static_cast<const BhQ8_0*>(a.x) + uint64_t(c.t0) * nb;
    const uint32_t sub = bh_lane() % 4;
    float sum[BH_MV_TOKENS] = {};
    for (uint32_t b = bh_lane() / 4; b < nb; b += warpSize / 4) {
        const uint8_t* blk = w + uint64_t(b) * 34;
        const uint8_t* qs = blk + 2 + 8 * sub;
        int q[8];
        for (int k = 0; k < 8; k += 2) {
            const uint16_t q2 = bh_u16(qs + k);
            q[k] = int(int8_t(q2 & 0xFF));
            q[k + 1] = int(int8_t(q2 >> 8));
        }
        const float d = bh_f16(blk);
        for (uint32_t t = 0; t < c.nt; ++t) {
            const BhQ8_0& xb = x[uint64_t(t) * nb + b];
            const int8_t* ys = xb.qs + 8 * sub;
            int isum = 0;
            for (int k = 0; k < 8; ++k) isum += q[k] * ys[k];
            sum[t] += float(isum) * (d * xb.d);
        }
    }
    bh_store_rows(a, c, sum);
}

// Q4_0 · Q8_0: 4 lanes per 18-byte block; lane s takes bytes 4s..4s+4, whose
// low nibbles are elements 4s.. and high nibbles elements 16+4s...
BH_KERNEL void bh_matvec_q4_0(BhMatArgs a) {
    const BhRowCtx c = bh_row_ctx(a);
    if (!c.live) return;
    const uint32_t nb = a.cols / 32;
    const uint8_t* w = a.w + uint64_t(c.row) * a.row_bytes;
    const BhQ8_0* x = static_cast<const BhQ8_0*>(a.x) + uint64_t(c.t0) * nb;
    const uint32_t sub = bh_lane() % 4;
    float sum[BH_MV_TOKENS] = {};
    for (uint32_t b = bh_lane() / 4; b < nb; b += warpSize / 4) {
        const uint8_t* blk = w + uint64_t(b) * 18;
        const uint32_t q4 = bh_u32(blk + 2 + 4 * sub);
        int lo[4], hi[4];
        for (int k = 0; k < 4; ++k) {
            const uint32_t q = (q4 >> (8 * k)) & 0xFF;
            lo[k] = int(q & 0x0F) - 8;
            hi[k] = int(q >> 4) - 8;
        }
        const float d = bh_f16(blk);
        for (uint32_t t = 0; t < c.nt; ++t) {
            const BhQ8_0& xb = x[uint64_t(t) * nb + b];
            const int8_t* ys = xb.qs + 4 * sub;
            int isum = 0;
            for (int k = 0; k < 4; ++k) isum += lo[k] * ys[k] + hi[k] * ys[k + 16];
            sum[t] += float(isum) * (d * xb.d);
        }
    }
    bh_store_rows(a, c, sum);
}

// Q4_K · Q8_K: 16 lanes per 144-byte block. Lane s takes 8 bytes of 64-element
// group j = s / 4; its low nibbles pair with activations 64j + l, its high
// ones with 64j + 32 + l. The min term (through the activations' bsums) is
// added once per block, by lane s = 0.
BH_KERNEL void bh_matvec_q4k(BhMatArgs a) {
    const BhRowCtx c = bh_row_ctx(a);
    if (!c.live) return;
    const uint32_t nb = a.cols / 256;
    const uint8_t* w = a.w + uint64_t(c.row) * a.row_bytes;
    const BhQ8K* x = static_cast<const BhQ8K*>(a.x) + uint64_t(c.t0) * nb;
    const uint32_t sub = bh_lane() % 16, j = sub / 4, l0 = (sub % 4) * 8;
    float sum[BH_MV_TOKENS] = {};
    for (uint32_t b = bh_lane() / 16; b < nb; b += warpSize / 16) {
        const uint8_t* blk = w + uint64_t(b) * 144;
        const uint8_t* qs = blk + 16 + 32 * j + l0;
        int lo_q[8], hi_q[8];
        for (int k = 0; k < 8; k += 2) {
            const uint16_t q2 = bh_u16(qs + k);
            for (int h = 0; h < 2; ++h) {
                const uint32_t q = (q2 >> (8 * h)) & 0xFF;
                lo_q[k + h] = int(q & 0x0F);
                hi_q[k + h] = int(q >> 4);
            }
        }
        uint32_t sc_lo, sc_hi, m;
        bh_scale_min_k4(blk + 4, 2 * j, &sc_lo, &m);
        bh_scale_min_k4(blk + 4, 2 * j + 1, &sc_hi, &m);
        int mins[16];
        if (sub == 0) {
            for (int g = 0; g < 16; ++g) {
                uint32_t sc, mg;
                bh_scale_min_k4(blk + 4, g / 2, &sc, &mg);
                mins[g] = int(mg);
            }
        }
        const float d = bh_f16(blk), dmin = bh_f16(blk + 2);
        for (uint32_t t = 0; t < c.nt; ++t) {
            const BhQ8K& xb = x[uint64_t(t) * nb + b];
            const int8_t* ys = xb.qs + 64 * j + l0;
            int lo = 0, hi = 0;
            for (int k = 0; k < 8; ++k) {
                lo += lo_q[k] * ys[k];
                hi += hi_q[k] * ys[k + 32];
            }
            const int isum = int(sc_lo) * lo + int(sc_hi) * hi;
            const float dy = xb.d;
            sum[t] += d * dy * float(isum);
            if (sub == 0) {
                int msum = 0;
                for (int g = 0; g < 16; ++g) msum += int(xb.bsums[g]) * mins[g];
                sum[t] -= dmin * dy * float(msum);
            }
        }
    }
    bh_store_rows(a, c, sum);
}

// Q6_K · Q8_K: 16 lanes per 210-byte block. Lane s takes half n = s / 8 and
// positions l = 4 (s % 8) .. +4 of it: four 6-bit quants per position (the
// quarters 0, 32, 64, 96 of the half), each with its own signed scale.
BH_KERNEL void bh_matvec_q6k(BhMatArgs a) {
    const BhRowCtx c = bh_row_ctx(a);
    if (!c.live) return;
    const uint32_t nb = a.cols / 256;
    const uint8_t* w = a.w + uint64_t(c.row) * a.row_bytes;
    const BhQ8K* x = static_cast<const BhQ8K*>(a.x) + uint64_t(c.t0) * nb;
    const uint32_t sub = bh_lane() % 16, n = sub / 8, l0 = (sub % 8) * 4, is = l0 / 16;
    float sum[BH_MV_TOKENS] = {};
    for (uint32_t b = bh_lane() / 16; b < nb; b += warpSize / 16) {
        const uint8_t* blk = w + uint64_t(b) * 210;
        const uint8_t* ql = blk + 64 * n;
        const uint8_t* qh = blk + 128 + 32 * n;
        const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * n);
        // Per position: the four quants times their scales.
        int q[4][4];
        for (uint32_t i = 0; i < 4; ++i) {
            const uint32_t l = l0 + i;
            q[i][0] = sc[is] * (int((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32);
            q[i][1] = sc[is + 2] * (int((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[i][2] = sc[is + 4] * (int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[i][3] = sc[is + 6] * (int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
        const float d = bh_f16(blk + 208);
        for (uint32_t t = 0; t < c.nt; ++t) {
            const BhQ8K& xb = x[uint64_t(t) * nb + b];
            const int8_t* ys = xb.qs + 128 * n;
            int isum = 0;
            for (uint32_t i = 0; i < 4; ++i) {
                const uint32_t l = l0 + i;
                isum += q[i][0] * ys[l] + q[i][1] * ys[l + 32] + q[i][2] * ys[l + 64] + q[i][3] * ys[l + 96];
            }
            sum[t] += d * xb.d * float(isum);
        }
    }
    bh_store_rows(a, c, sum);
}
