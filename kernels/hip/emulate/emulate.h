// A CPU emulation of the small part of HIP the kernels use, so their source
// runs (slowly) on a machine without a GPU: each launch runs its blocks one
// after another, each block as real threads with a barrier for
// __syncthreads and per-wave exchanges for the shuffles. warpSize is chosen
// per launch (the tests run 32 and 64), which is what checks that no kernel
// assumes a wave size. compat.h includes this instead of the HIP headers
// when built with -DBH_EMULATE (kernels/tests/hip_emulated.rs does, with a
// host C++20 compiler). It is a test tool: no device timing, memory model or
// rounding of device math functions is emulated (libm stands in for them).
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct BhEmuDim3 {
    uint32_t x = 1, y = 1, z = 1;
};

// One running block: its barrier and each wave's barrier and exchange slots.
struct BhEmuBlock {
    explicit BhEmuBlock(uint32_t threads, uint32_t wave)
        : block_barrier(threads), slots(threads) {
        for (uint32_t w = 0; w < threads / wave; ++w) wave_barriers.push_back(std::make_unique<std::barrier<>>(wave));
    }
    std::barrier<> block_barrier;
    std::vector<std::unique_ptr<std::barrier<>>> wave_barriers;
    std::vector<uint64_t> slots;
};

inline thread_local BhEmuDim3 threadIdx, blockIdx;
inline BhEmuDim3 blockDim, gridDim;
inline int warpSize = 64;
inline BhEmuBlock* bh_emu_block = nullptr;

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __constant__ static const
#define __forceinline__ inline
#define __launch_bounds__(...)
using std::max;
using std::min;

inline void __syncthreads() { bh_emu_block->block_barrier.arrive_and_wait(); }

// Lane `src` of the caller's wave sees `bits` of every lane; out-of-range
// sources read the caller's own value, as HIP's shuffles do.
inline uint64_t bh_emu_shfl(uint64_t bits, int src) {
    const uint32_t t = threadIdx.x, lane = t % warpSize, base = t - lane;
    auto& barrier = *bh_emu_block->wave_barriers[t / warpSize];
    bh_emu_block->slots[t] = bits;
    barrier.arrive_and_wait();
    const uint64_t got = (src >= 0 && src < warpSize) ? bh_emu_block->slots[base + src] : bits;
    barrier.arrive_and_wait();
    return got;
}

inline float bh_emu_shfl_f(float v, int src) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b = uint32_t(bh_emu_shfl(b, src));
    std::memcpy(&v, &b, 4);
    return v;
}

inline float __uint_as_float(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
inline uint32_t bh_emu_float_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}
inline int __double2loint(double d) {
    uint64_t b;
    std::memcpy(&b, &d, 8);
    return int(uint32_t(b));
}
inline int __double2hiint(double d) {
    uint64_t b;
    std::memcpy(&b, &d, 8);
    return int(uint32_t(b >> 32));
}
inline double __hiloint2double(int hi, int lo) {
    const uint64_t b = (uint64_t(uint32_t(hi)) << 32) | uint32_t(lo);
    double d;
    std::memcpy(&d, &b, 8);
    return d;
}

// IEEE binary16 → binary32, exact.
inline float bh_emu_half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) return __uint_as_float(sign | 0x7F800000 | (man << 13));
    if (exp == 0) {
        const float v = std::ldexp(float(man), -24);  // subnormal or zero
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

// binary32 → nearest binary16 (ties to even), as F16C / half::f16::from_f32.
inline uint16_t bh_emu_float_to_half(float f) {
    const uint32_t b = bh_emu_float_bits(f);
    const uint16_t sign = uint16_t((b >> 16) & 0x8000);
    const float a = std::fabs(f);
    if (std::isnan(f)) return sign | 0x7E00;
    if (a >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
    if (a < 6.103515625e-05f) {
        // Subnormal range: multiples of 2^-24, rounded to nearest even.
        return sign | uint16_t(std::nearbyint(std::ldexp(a, 24)));
    }
    const uint32_t ab = b & 0x7FFFFFFF;
    uint32_t exp = (ab >> 23) - 112, man = ab & 0x7FFFFF;
    uint32_t h = (exp << 10) | (man >> 13);
    const uint32_t rest = man & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // may carry into the exponent: correct
    return sign | uint16_t(h);
}

// Runs `kernel(args)` over the grid, blocks in turn, each with blockDim.x threads.
template <class Args>
void bh_emu_launch(void (*kernel)(Args), const Args& args, BhEmuDim3 grid, uint32_t threads, int wave) {
    warpSize = wave;
    gridDim = grid;
    blockDim = BhEmuDim3{threads, 1, 1};
    for (uint32_t z = 0; z < grid.z; ++z)
        for (uint32_t y = 0; y < grid.y; ++y)
            for (uint32_t x = 0; x < grid.x; ++x) {
                BhEmuBlock block(threads, uint32_t(wave));
                bh_emu_block = &block;
                std::vector<std::thread> pool;
                pool.reserve(threads);
                for (uint32_t t = 0; t < threads; ++t) {
                    pool.emplace_back([&, t] {
                        threadIdx = BhEmuDim3{t, 0, 0};
                        blockIdx = BhEmuDim3{x, y, z};
                        kernel(args);
                        // A thread that has returned no longer holds the others
                        // at a barrier (as on the GPU).
                        block.wave_barriers[t / wave]->arrive_and_drop();
                        block.block_barrier.arrive_and_drop();
                    });
                }
                for (auto& th : pool) th.join();
                bh_emu_block = nullptr;
            }
}
