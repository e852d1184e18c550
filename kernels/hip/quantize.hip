// Activation quantization for the integer matvecs, exactly as the CPU's
// kernels/src/quantize.rs does it, so both backends feed the dot products the
// same integers.
#include "common.h"

// Rust's `f as i8` for the values these quantizers produce: NaN to 0,
// saturating at the ends (a C cast would be undefined there).
BH_DEVICE int8_t bh_sat_i8(float v) {
    if (v != v) return 0;
    return int8_t(fminf(fmaxf(v, -128.0f), 127.0f));
}

// One thread per 32-activation block: d = amax / 127, q = round(x / d) with
// ties away from zero (Rust's f32::round, C's roundf).
BH_KERNEL void bh_quantize_q8_0(BhQuantizeArgs a) {
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= uint64_t(a.n_tokens) * (a.cols / 32)) return;
    const float* x = a.x + i * 32;
    BhQ8_0* y = static_cast<BhQ8_0*>(a.out) + i;
    float amax = 0.0f;
    for (int k = 0; k < 32; ++k) amax = fmaxf(amax, fabsf(x[k]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = bh_round_through_half(d);
    for (int k = 0; k < 32; ++k) y->qs[k] = bh_sat_i8(roundf(x[k] * id));
}

// One thread per 256-activation block: the value of largest magnitude maps to
// exactly -127, rounding to nearest even (rintf), bsums per 16.
BH_KERNEL void bh_quantize_q8_k(BhQuantizeArgs a) {
    const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= uint64_t(a.n_tokens) * (a.cols / 256)) return;
    const float* x = a.x + i * 256;
    BhQ8K* y = static_cast<BhQ8K*>(a.out) + i;
    float amax = 0.0f, max = 0.0f;
    for (int k = 0; k < 256; ++k) {
        if (fabsf(x[k]) > amax) {
            amax = fabsf(x[k]);
            max = x[k];
        }
    }
    if (amax == 0.0f) {
        y->d = 0.0f;
        for (int k = 0; k < 256; ++k) y->qs[k] = 0;
        for (int g = 0; g < 16; ++g) y->bsums[g] = 0;
        return;
    }
    const float iscale = -127.0f / max;
    for (int k = 0; k < 256; ++k) y->qs[k] = bh_sat_i8(fminf(rintf(iscale * x[k]), 127.0f));
    for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int k = 0; k < 16; ++k) s += y->qs[16 * g + k];
        y->bsums[g] = int16_t(s);
    }
    y->d = 1.0f / iscale;
}
