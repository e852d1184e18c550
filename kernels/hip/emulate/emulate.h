// A CPU emulation of the small part of HIP the kernels use, so their source
// runs on a machine without a GPU: each launch runs its blocks one after
// another on the calling thread, each block's threads as cooperative fibers
// that switch only at barriers — __syncthreads, and the per-wave exchanges
// the shuffles make. A barrier that can never complete (every live thread
// waits, some at another barrier) fails the launch instead of hanging.
// warpSize is chosen per launch (the tests run 32 and 64), which is what
// checks that no kernel assumes a wave size. compat.h includes this instead
// of the HIP headers when built with -DBH_EMULATE (kernels/tests/hip_emulated.rs
// does, with a host C++20 compiler). It is a test tool: no device timing,
// memory model or rounding of device math functions is emulated (libm
// stands in for them).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

// x86-64 switches stacks with a few instructions of its own; other targets
// (or -DBH_EMU_UCONTEXT, to test that path on x86-64) use <ucontext.h>,
// whose swapcontext also saves the signal mask: a system call per switch.
#if defined(__x86_64__) && !defined(BH_EMU_UCONTEXT)
#define BH_EMU_X86_64_SWITCH 1
#else
#include <ucontext.h>
#endif

struct BhEmuDim3 {
    uint32_t x = 1, y = 1, z = 1;
};

// Plain globals, not thread_local: one OS thread runs every fiber, and the
// scheduler sets threadIdx before it resumes each.
inline BhEmuDim3 threadIdx, blockIdx;
inline BhEmuDim3 blockDim, gridDim;
inline int warpSize = 64;

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __constant__ static const
#define __forceinline__ inline
#define __launch_bounds__(...)
using std::max;
using std::min;

// ---- execution contexts ----------------------------------------------------

#if defined(BH_EMU_X86_64_SWITCH)
// A suspended context is its stack pointer: everything else it needs lies on
// that stack.
struct BhEmuContext {
    void* sp = nullptr;
};

// Pushes the System V callee-saved registers (rbx, rbp, r12–r15) on the
// running stack, stores rsp in *save, moves to `load` and pops what was
// pushed there, so `ret` resumes that context where it last switched away
// (or enters it, see bh_emu_context_init). The caller-saved registers are
// already saved by the compiler around this call. MXCSR and the x87 control
// word are callee-saved too, but no kernel changes them, so every fiber runs
// with the launching thread's and they need no copy. (Nor is there a CET
// shadow stack to switch: Linux enables those only on request.)
//
// noipa: GCC's interprocedural register allocation would otherwise let
// callers keep values in the caller-saved registers this body never names,
// though other fibers run (and clobber them) before it returns.
#if __has_attribute(noipa)
#define BH_EMU_NOIPA noipa
#else
#define BH_EMU_NOIPA noinline
#endif
__attribute__((naked, BH_EMU_NOIPA)) inline void bh_emu_swap(void** /*save*/, void* /*load*/) {
    asm("pushq %rbp\n\t"
        "pushq %rbx\n\t"
        "pushq %r12\n\t"
        "pushq %r13\n\t"
        "pushq %r14\n\t"
        "pushq %r15\n\t"
        "movq %rsp, (%rdi)\n\t"
        "movq %rsi, %rsp\n\t"
        "popq %r15\n\t"
        "popq %r14\n\t"
        "popq %r13\n\t"
        "popq %r12\n\t"
        "popq %rbx\n\t"
        "popq %rbp\n\t"
        "ret\n\t");
}

// A context that enters `entry` (which must never return) on the stack
// [lo, lo + size): the frame bh_emu_swap pops — six zeroed registers (a null
// rbp ends the frame chain for debuggers), `entry` as the return address —
// above which a null return address leaves rsp at 8 mod 16, as a call does.
inline void bh_emu_context_init(BhEmuContext& c, char* lo, size_t size, void (*entry)()) {
    void** top = reinterpret_cast<void**>(lo + size);  // 16-aligned: lo and size are whole pages
    top[-1] = nullptr;
    top[-2] = reinterpret_cast<void*>(entry);
    for (int i = 3; i <= 8; ++i) top[-i] = nullptr;
    c.sp = top - 8;
}

inline void bh_emu_context_switch(BhEmuContext& from, BhEmuContext& to) { bh_emu_swap(&from.sp, to.sp); }
#else
struct BhEmuContext {
    ucontext_t uc;
};

inline void bh_emu_context_init(BhEmuContext& c, char* lo, size_t size, void (*entry)()) {
    if (getcontext(&c.uc) != 0) throw std::runtime_error("emulator: getcontext failed");
    c.uc.uc_stack.ss_sp = lo;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;  // entry never returns
    makecontext(&c.uc, entry, 0);
}

// Cannot fail here: the one error POSIX allows is a stack too small for it.
inline void bh_emu_context_switch(BhEmuContext& from, BhEmuContext& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- fibers ----------------------------------------------------------------

// The most threads a block may have (HIP's limit, and the harness's).
inline constexpr uint32_t BH_EMU_MAX_THREADS = 1024;
// Each fiber's stack. A GPU thread lives in registers (the largest local
// array is attention's 8 floats), so the kernels need little: under 4 KiB
// at -O2 or -O0 over kernels/tests/hip_cases, libm included. The rest is
// headroom for kernels to come; pages no fiber touches are never committed,
// so it costs address space only.
inline constexpr size_t BH_EMU_STACK_BYTES = 256 << 10;

// Runs one block at a time: a fiber per thread, a queue of those ready to
// run, and per barrier the count of live threads and of those waiting there.
// A thread that has returned no longer holds the others at a barrier (as on
// the GPU), so a barrier completes when every live thread it spans waits at
// it: all of the block's for __syncthreads, all of the wave's for the
// shuffle exchange.
class BhEmuScheduler {
public:
    // Runs `body(arg)` as each of `threads` threads (a multiple of `wave`) of
    // the block blockIdx, until every one has returned.
    void run_block(uint32_t threads, uint32_t wave, void (*body)(const void*), const void* arg);
    void sync_block() { wait(Where::Block); }
    void sync_wave() { wait(Where::Wave); }
    // The shuffles' exchange: a slot per thread of the block.
    std::vector<uint64_t> slots;

private:
    enum class Where : uint8_t { Ready, Block, Wave, Returned };
    struct Fiber {
        BhEmuContext context;
        Where where;
    };
    struct Barrier {
        uint32_t live, waiting;
    };

    static void fiber_main() noexcept;
    void wait(Where where) {
        fibers_[current_].where = where;
        bh_emu_context_switch(fibers_[current_].context, scheduler_);
    }
    void reserve_stacks();
    void make_ready(uint32_t t);
    // Readies the fibers in [first, last) waiting at `where` if `b` is complete.
    void release_if_complete(Barrier& b, Where where, uint32_t first, uint32_t last);
    [[noreturn]] void deadlock() const;

    char* stacks_ = nullptr;  // BH_EMU_MAX_THREADS of them, each above a guard page
    size_t stack_stride_ = 0;
    std::vector<Fiber> fibers_;
    std::vector<uint32_t> ready_;  // a ring: each fiber is in it at most once
    uint32_t ready_head_ = 0, ready_count_ = 0;
    Barrier block_{};
    std::vector<Barrier> waves_;
    uint32_t current_ = 0;
    BhEmuContext scheduler_;  // the launching thread, while a fiber runs
    void (*body_)(const void*) = nullptr;
    const void* arg_ = nullptr;
};

inline BhEmuScheduler bh_emu;

inline void BhEmuScheduler::fiber_main() noexcept {
    bh_emu.body_(bh_emu.arg_);
    bh_emu.wait(Where::Returned);  // never resumed
    __builtin_unreachable();
}

// Reserved once and reused by every block of every launch: the pages a fiber
// has touched stay committed, so later blocks take no page faults.
inline void BhEmuScheduler::reserve_stacks() {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    stack_stride_ = page + BH_EMU_STACK_BYTES;
    void* p = mmap(nullptr, stack_stride_ * BH_EMU_MAX_THREADS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("emulator: could not map the fiber stacks");
    stacks_ = static_cast<char*>(p);
    // Stacks grow down: a guard page below each turns an overflow into a
    // fault instead of a write into the next fiber's stack.
    for (uint32_t i = 0; i < BH_EMU_MAX_THREADS; ++i)
        if (mprotect(stacks_ + i * stack_stride_, page, PROT_NONE) != 0)
            throw std::runtime_error("emulator: could not protect a fiber stack's guard page");
}

inline void BhEmuScheduler::make_ready(uint32_t t) {
    fibers_[t].where = Where::Ready;
    ready_[(ready_head_ + ready_count_++) % ready_.size()] = t;
}

inline void BhEmuScheduler::release_if_complete(Barrier& b, Where where, uint32_t first, uint32_t last) {
    if (b.waiting == 0 || b.waiting != b.live) return;
    b.waiting = 0;
    for (uint32_t t = first; t < last; ++t)
        if (fibers_[t].where == where) make_ready(t);
}

inline void BhEmuScheduler::run_block(uint32_t threads, uint32_t wave, void (*body)(const void*), const void* arg) {
    if (threads > BH_EMU_MAX_THREADS) throw std::runtime_error("emulator: more than 1024 threads per block");
    if (!stacks_) reserve_stacks();
    body_ = body;
    arg_ = arg;
    fibers_.resize(threads);
    ready_.resize(threads);
    slots.resize(threads);
    waves_.assign(threads / wave, Barrier{wave, 0});
    block_ = Barrier{threads, 0};
    ready_head_ = ready_count_ = 0;
    for (uint32_t t = 0; t < threads; ++t) {
        bh_emu_context_init(fibers_[t].context, stacks_ + t * stack_stride_ + (stack_stride_ - BH_EMU_STACK_BYTES),
                            BH_EMU_STACK_BYTES, fiber_main);
        make_ready(t);
    }
    while (ready_count_ > 0) {
        const uint32_t t = ready_[ready_head_];
        ready_head_ = (ready_head_ + 1) % threads;
        --ready_count_;
        current_ = t;
        threadIdx = BhEmuDim3{t, 0, 0};
        bh_emu_context_switch(scheduler_, fibers_[t].context);
        // Back here: fiber t waits at a barrier or has returned.
        const uint32_t w = t / wave;
        Barrier& wb = waves_[w];
        if (fibers_[t].where == Where::Block) {
            ++block_.waiting;
        } else if (fibers_[t].where == Where::Wave) {
            ++wb.waiting;
        } else {  // returned
            --block_.live;
            --wb.live;
        }
        release_if_complete(wb, Where::Wave, w * wave, (w + 1) * wave);
        release_if_complete(block_, Where::Block, 0, threads);
    }
    if (block_.live > 0) deadlock();
}

// Nothing is ready and some thread has not returned: every live thread
// waits, and no barrier has all of its live threads. On a GPU this hangs.
inline void BhEmuScheduler::deadlock() const {
    uint32_t at_block = 0, at_wave = 0, first_block = 0, first_wave = 0;
    for (uint32_t t = uint32_t(fibers_.size()); t-- > 0;) {
        if (fibers_[t].where == Where::Block) {
            ++at_block;
            first_block = t;
        } else if (fibers_[t].where == Where::Wave) {
            ++at_wave;
            first_wave = t;
        }
    }
    const size_t returned = fibers_.size() - block_.live;
    std::string msg = "kernel deadlock in block (" + std::to_string(blockIdx.x) + ", " + std::to_string(blockIdx.y) +
                      ", " + std::to_string(blockIdx.z) + "): ";
    msg += std::to_string(at_block) + " threads wait at __syncthreads";
    if (at_block) msg += " (lowest thread " + std::to_string(first_block) + ")";
    msg += ", " + std::to_string(at_wave) + " at a wave shuffle";
    if (at_wave) msg += " (lowest thread " + std::to_string(first_wave) + ")";
    msg += ", " + std::to_string(returned) + " have returned: no barrier can complete";
    throw std::runtime_error(msg);
}

inline void __syncthreads() { bh_emu.sync_block(); }

// Lane `src` of the caller's wave sees `bits` of every lane; out-of-range
// sources read the caller's own value, as HIP's shuffles do. Every lane
// writes its slot and waits for the wave, reads, and waits again so that no
// lane's next shuffle overwrites a slot another has yet to read.
inline uint64_t bh_emu_shfl(uint64_t bits, int src) {
    const uint32_t t = threadIdx.x, lane = t % warpSize, base = t - lane;
    bh_emu.slots[t] = bits;
    bh_emu.sync_wave();
    const uint64_t got = (src >= 0 && src < warpSize) ? bh_emu.slots[base + src] : bits;
    bh_emu.sync_wave();
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

// Runs `kernel(args)` over the grid, blocks in turn, each with `threads`
// threads (a multiple of `wave`).
template <class Args>
void bh_emu_launch(void (*kernel)(Args), const Args& args, BhEmuDim3 grid, uint32_t threads, int wave) {
    warpSize = wave;
    gridDim = grid;
    blockDim = BhEmuDim3{threads, 1, 1};
    struct Launch {
        void (*kernel)(Args);
        const Args* args;
    } launch{kernel, &args};
    const auto body = [](const void* p) {
        const Launch* l = static_cast<const Launch*>(p);
        l->kernel(*l->args);
    };
    for (uint32_t z = 0; z < grid.z; ++z)
        for (uint32_t y = 0; y < grid.y; ++y)
            for (uint32_t x = 0; x < grid.x; ++x) {
                blockIdx = BhEmuDim3{x, y, z};
                bh_emu.run_block(threads, uint32_t(wave), body, &launch);
            }
}
