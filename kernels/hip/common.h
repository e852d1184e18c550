// Helpers shared by the kernels: little-endian field loads, wave and block
// reductions written over `warpSize`, and the per-element dequantization of
// every weight type (the device twin of kernels/src/dequant.rs).
//
// Build with -ffp-contract=off (kernels/build.rs does): the dequantization
// below then rounds exactly as the CPU's scalar oracle, and the kernels fuse
// multiply-adds only where they call fmaf themselves.
#pragma once

#include "compat.h"
#include "args.h"

// ---- loads -----------------------------------------------------------------

// GGUF blocks are only 2-byte aligned (Q8_0 is 34 bytes, Q6_K 210), so wider
// fields are assembled from 16-bit loads.
BH_DEVICE uint16_t bh_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
BH_DEVICE uint32_t bh_u32(const uint8_t* p) {
    return uint32_t(bh_u16(p)) | (uint32_t(bh_u16(p + 2)) << 16);
}
BH_DEVICE float bh_f16(const uint8_t* p) { return bh_half_bits_to_float(bh_u16(p)); }
BH_DEVICE float bh_bf16_bits(uint16_t bits) { return __uint_as_float(uint32_t(bits) << 16); }

// ---- reductions ------------------------------------------------------------

BH_DEVICE int bh_lane() { return threadIdx.x % warpSize; }
BH_DEVICE int bh_wave() { return threadIdx.x / warpSize; }
BH_DEVICE int bh_waves() { return blockDim.x / warpSize; }

// Sum over the wave; the result is valid in lane 0.
BH_DEVICE float bh_wave_sum(float v) {
    for (int off = warpSize / 2; off > 0; off >>= 1) v += bh_shfl_down(v, off);
    return v;
}

// Sum over the wave; every lane gets the result.
BH_DEVICE float bh_wave_allsum(float v) {
    for (int off = warpSize / 2; off > 0; off >>= 1) v += bh_shfl_xor(v, off);
    return v;
}

BH_DEVICE float bh_wave_allmax(float v) {
    for (int off = warpSize / 2; off > 0; off >>= 1) v = fmaxf(v, bh_shfl_xor(v, off));
    return v;
}

// Block-wide sum in f64 (RMSNorm and softmax accumulate in f64, as the CPU
// does). `scratch` holds one double per wave; every thread gets the result.
BH_DEVICE double bh_block_sum_f64(double v, double* scratch) {
    // Shuffles move 32-bit values: split the double into its halves.
    for (int off = warpSize / 2; off > 0; off >>= 1) {
        int lo = __double2loint(v), hi = __double2hiint(v);
        lo = bh_shfl_down_int(lo, off);
        hi = bh_shfl_down_int(hi, off);
        v += __hiloint2double(hi, lo);
    }
    if (bh_lane() == 0) scratch[bh_wave()] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < bh_waves(); ++w) total += scratch[w];
    __syncthreads();
    return total;
}

BH_DEVICE float bh_block_max(float v, float* scratch) {
    v = bh_wave_allmax(v);
    if (bh_lane() == 0) scratch[bh_wave()] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < bh_waves(); ++w) m = fmaxf(m, scratch[w]);
    __syncthreads();
    return m;
}

// ---- block geometry --------------------------------------------------------

BH_DEVICE uint32_t bh_block_elems(uint32_t ty) {
    switch (ty) {
        case BH_Q4_0: case BH_Q4_1: case BH_Q5_0: case BH_Q5_1: case BH_Q8_0: case BH_IQ4_NL: return 32;
        case BH_Q4_K: case BH_Q5_K: case BH_Q6_K: case BH_IQ4_XS: return 256;
        default: return 1;
    }
}

BH_DEVICE uint32_t bh_block_bytes(uint32_t ty) {
    switch (ty) {
        case BH_F32: return 4;
        case BH_F16: case BH_BF16: return 2;
        case BH_Q4_0: return 18;
        case BH_Q4_1: return 20;
        case BH_Q5_0: return 22;
        case BH_Q5_1: return 24;
        case BH_Q8_0: return 34;
        case BH_Q4_K: return 144;
        case BH_Q5_K: return 176;
        case BH_Q6_K: return 210;
        case BH_IQ4_NL: return 18;
        case BH_IQ4_XS: return 136;
        default: return 0;
    }
}

// Scale j (0..8) and min j of a Q4_K/Q5_K block's 12-byte packing
// (ggml's get_scale_min_k4; blocks.rs scales_mins_k4).
BH_DEVICE void bh_scale_min_k4(const uint8_t* q, int j, uint32_t* sc, uint32_t* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Entry k (0..16) of IQ4_NL/IQ4_XS's non-linear table (ggml's kvalues_iq4nl:
// -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113; blocks.rs
// KVALUES_IQ4NL), unpacked from two constants so that no array has to live
// in device memory.
BH_DEVICE int bh_iq4nl_value(uint32_t k) {
    const uint64_t packed = k < 8 ? 0xF6EADDCFBFAD9881ull : 0x7159453526190D01ull;
    return int(int8_t(uint8_t(packed >> (8 * (k % 8)))));
}

// ---- dequantization --------------------------------------------------------

// Element i (0..block elements) of one block, rounded exactly as
// kernels/src/dequant.rs rounds it.
BH_DEVICE float bh_dequant_in_block(uint32_t ty, const uint8_t* b, uint32_t i) {
    switch (ty) {
        case BH_F32: return __uint_as_float(bh_u32(b));
        case BH_F16: return bh_f16(b);
        case BH_BF16: return bh_bf16_bits(bh_u16(b));
        case BH_Q4_0: {
            const uint32_t j = i % 16;
            const uint32_t q = i < 16 ? (b[2 + j] & 0x0F) : (b[2 + j] >> 4);
            return float(int(q) - 8) * bh_f16(b);
        }
        case BH_Q4_1: {
            const uint32_t j = i % 16;
            const uint32_t q = i < 16 ? (b[4 + j] & 0x0F) : (b[4 + j] >> 4);
            return float(q) * bh_f16(b) + bh_f16(b + 2);
        }
        case BH_Q5_0: {
            const uint32_t j = i % 16, qh = bh_u32(b + 2);
            const uint32_t h = i < 16 ? ((qh >> j) << 4) & 0x10 : (qh >> (j + 12)) & 0x10;
            const uint32_t q = (i < 16 ? (b[6 + j] & 0x0F) : (b[6 + j] >> 4)) | h;
            return float(int(q) - 16) * bh_f16(b);
        }
        case BH_Q5_1: {
            const uint32_t j = i % 16, qh = bh_u32(b + 4);
            const uint32_t h = i < 16 ? ((qh >> j) << 4) & 0x10 : (qh >> (j + 12)) & 0x10;
            const uint32_t q = (i < 16 ? (b[8 + j] & 0x0F) : (b[8 + j] >> 4)) | h;
            return float(q) * bh_f16(b) + bh_f16(b + 2);
        }
        case BH_Q8_0: return float(int8_t(b[2 + i])) * bh_f16(b);
        case BH_Q4_K: case BH_Q5_K: {
            // 64-element groups j: low nibbles are sub-block 2j, high 2j+1.
            const uint32_t j = i / 64, l = i % 32, hi = (i % 64) / 32;
            uint32_t sc, m;
            bh_scale_min_k4(b + 4, 2 * j + hi, &sc, &m);
            const float d = bh_f16(b) * float(sc), mn = bh_f16(b + 2) * float(m);
            if (ty == BH_Q4_K) {
                const uint8_t q = b[16 + 32 * j + l];
                return d * float(hi ? q >> 4 : q & 0x0F) - mn;
            }
            const uint8_t q = b[48 + 32 * j + l];
            const uint32_t hbit = (b[16 + l] >> (2 * j + hi)) & 1;
            return d * float((hi ? q >> 4 : q & 0x0F) + 16 * hbit) - mn;
        }
        case BH_Q6_K: {
            // Halves n of 128; within one, l in 0..32 and quarter k in 0..4.
            const uint32_t n = i / 128, r = i % 128, k = r / 32, l = r % 32;
            const uint8_t* ql = b + 64 * n;
            const uint8_t* qh = b + 128 + 32 * n;
            const int8_t sc = int8_t(b[192 + 8 * n + l / 16 + 2 * k]);
            const uint32_t lo = (k & 1) ? ql[l + 32] : ql[l];
            const uint32_t nib = (k < 2) ? (lo & 0x0F) : (lo >> 4);
            const int q = int(nib | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            return (bh_f16(b + 208) * float(sc)) * float(q);
        }
        case BH_IQ4_NL: {
            const uint32_t j = i % 16;
            const uint32_t q = i < 16 ? (b[2 + j] & 0x0F) : (b[2 + j] >> 4);
            return bh_f16(b) * float(bh_iq4nl_value(q));
        }
        case BH_IQ4_XS: {
            // Sub-block ib of 32: a 6-bit scale (low nibble from scales_l,
            // two high bits from scales_h) minus 32, then as IQ4_NL.
            const uint32_t ib = i / 32, r = i % 32, j = r % 16;
            const uint32_t lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
            const uint32_t hi = (bh_u16(b + 2) >> (2 * ib)) & 3;
            const float dl = bh_f16(b) * float(int(lo | (hi << 4)) - 32);
            const uint8_t qb = b[8 + 16 * ib + j];
            return dl * float(bh_iq4nl_value(r < 16 ? qb & 0x0F : qb >> 4));
        }
        default: return 0.0f;
    }
}

// Element `col` of a row of type `ty`.
BH_DEVICE float bh_dequant(uint32_t ty, const uint8_t* row, uint32_t col) {
    const uint32_t be = bh_block_elems(ty);
    return bh_dequant_in_block(ty, row + uint64_t(col / be) * bh_block_bytes(ty), col % be);
}
