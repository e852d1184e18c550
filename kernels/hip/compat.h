// Portability layer: the kernels are plain HIP C++; this header lets the same
// sources build with hipcc (AMD, the target) and with nvcc (NVIDIA, for
// running the parity tests on whatever device a machine has).
//
// Rules the kernels follow so both compile:
//   - wave size is never a constant: `warpSize` (64 on CDNA, 32 on RDNA and
//     NVIDIA) is read at run time and loops are written over it;
//   - shuffles go through bh_shfl_down / bh_shfl_xor (nvcc needs a mask);
//   - half precision goes through bh_half_bits_to_float (no __half in args).
#pragma once

#if defined(BH_EMULATE)
// Host C++ running the kernels on CPU threads, for tests (emulate/emulate.h).
#include "emulate/emulate.h"
#elif defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_NVIDIA__)
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#define BH_HIP 1
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define BH_CUDA 1
#else
#error "kernels/hip: compile with hipcc or nvcc"
#endif

#include <stdint.h>

// Every kernel is extern "C" so the Rust side finds it by its plain name.
#define BH_KERNEL extern "C" __global__
#define BH_DEVICE static __device__ __forceinline__

// Threads per block of every kernel that does not say otherwise: 4 waves of
// 64 on CDNA, 8 of 32 elsewhere. The kernels work with any multiple of
// warpSize up to 1024; launches use this one.
#define BH_BLOCK 256

#if defined(BH_EMULATE)
BH_DEVICE float bh_shfl_down(float v, int delta) { return bh_emu_shfl_f(v, int(threadIdx.x % warpSize) + delta); }
BH_DEVICE float bh_shfl_xor(float v, int mask) { return bh_emu_shfl_f(v, int(threadIdx.x % warpSize) ^ mask); }
BH_DEVICE int bh_shfl_down_int(int v, int delta) {
    return int(uint32_t(bh_emu_shfl(uint32_t(v), int(threadIdx.x % warpSize) + delta)));
}
#elif defined(BH_CUDA)
// HIP's names for the few runtime calls device code uses.
#define BH_FULL_MASK 0xffffffffu
BH_DEVICE float bh_shfl_down(float v, int delta) { return __shfl_down_sync(BH_FULL_MASK, v, delta); }
BH_DEVICE float bh_shfl_xor(float v, int mask) { return __shfl_xor_sync(BH_FULL_MASK, v, mask); }
BH_DEVICE int bh_shfl_down_int(int v, int delta) { return __shfl_down_sync(BH_FULL_MASK, v, delta); }
#else
BH_DEVICE float bh_shfl_down(float v, int delta) { return __shfl_down(v, delta); }
BH_DEVICE float bh_shfl_xor(float v, int mask) { return __shfl_xor(v, mask); }
BH_DEVICE int bh_shfl_down_int(int v, int delta) { return __shfl_down(v, delta); }
#endif

// IEEE binary16 bits to f32, exact (every f16 is an f32).
BH_DEVICE float bh_half_bits_to_float(uint16_t bits) {
#if defined(BH_EMULATE)
    return bh_emu_half_to_float(bits);
#elif defined(BH_CUDA)
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
#else
    __half_raw raw;
    raw.data = bits;
    return __half2float(__half(raw));
#endif
}

// f32 to the nearest f16 (ties to even) and back: what the CPU's
// `half::f16::from_f32(v).to_f32()` computes.
BH_DEVICE float bh_round_through_half(float v) {
#if defined(BH_EMULATE)
    return bh_emu_half_to_float(bh_emu_float_to_half(v));
#else
    return __half2float(__float2half_rn(v));
#endif
}
