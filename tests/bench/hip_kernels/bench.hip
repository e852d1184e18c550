// Device figures for the HIP kernels (run by ./run; needs a HIP device).
//
// Each memory-bound kernel is timed with hipEvents (median of REPEATS after a
// warm-up) and its achieved bandwidth — the bytes it must move at least once,
// over the median time — is printed as a fraction of two ceilings measured or
// read in the same run: a device-to-device hipMemcpy of 1 GiB (the practical
// peak, read + write) and the peak from the device's properties (or
// --peak-gbps). Then a kernels-only decode step of a Llama-3-8B-shaped Q4_K
// model (every layer's weights separate, so no cache holds them) gives
// decode tokens/s: what the kernels allow before any host work.
#include "../../../kernels/hip/bulkhead.hip"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        hipError_t err_ = (call);                                                            \
        if (err_ != hipSuccess) {                                                            \
            std::fprintf(stderr, "%s failed: %s\n", #call, hipGetErrorString(err_));         \
            std::exit(1);                                                                    \
        }                                                                                    \
    } while (0)

static const int REPEATS = 20;

static void* dev_alloc(size_t bytes, unsigned seed) {
    void* p = nullptr;
    CHECK(hipMalloc(&p, bytes));
    // Small f16-safe bytes: every quant pattern, scales that stay finite.
    std::vector<uint8_t> host(std::min<size_t>(bytes, 64 << 20));
    for (size_t i = 0; i < host.size(); ++i) host[i] = uint8_t((i * 2654435761u + seed) >> 13) & 0x3B;
    for (size_t at = 0; at < bytes; at += host.size())
        CHECK(hipMemcpy(static_cast<uint8_t*>(p) + at, host.data(), std::min(host.size(), bytes - at),
                        hipMemcpyHostToDevice));
    return p;
}

// Median milliseconds of `launch` over REPEATS runs.
template <class F>
static double median_ms(F launch) {
    hipEvent_t start, stop;
    CHECK(hipEventCreate(&start));
    CHECK(hipEventCreate(&stop));
    launch();  // warm-up (code object load, caches)
    CHECK(hipDeviceSynchronize());
    std::vector<double> ms;
    for (int i = 0; i < REPEATS; ++i) {
        CHECK(hipEventRecord(start, 0));
        launch();
        CHECK(hipEventRecord(stop, 0));
        CHECK(hipEventSynchronize(stop));
        float t = 0;
        CHECK(hipEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    CHECK(hipEventDestroy(start));
    CHECK(hipEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

struct Weight {
    uint32_t ty, block_elems, block_bytes;
    const char* name;
    const void* kernel;
};

static double copy_gbps, spec_gbps;
static int wave_size = 64;  // set from the device in main

static void report(const char* what, double bytes, double ms) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    std::printf("%-34s %9.3f ms %9.1f GB/s %6.1f%% of copy %6.1f%% of spec\n", what, ms, gbps,
                100 * gbps / copy_gbps, 100 * gbps / spec_gbps);
}

static void matvec(uint32_t ty, const char* kname, void (*kernel)(BhMatArgs), uint32_t rows, uint32_t cols,
                   uint32_t be, uint32_t bb, const void* x, float* out, const uint8_t* w, hipStream_t s) {
    BhMatArgs a{w, x, out, uint64_t(cols / be) * bb, rows, cols, 1, ty};
    const uint32_t waves = BH_BLOCK / wave_size;
    hipLaunchKernelGGL(kernel, dim3((rows + waves - 1) / waves, 1, 1), dim3(BH_BLOCK), 0, s, a);
    (void)kname;
}

int main(int argc, char** argv) {
    spec_gbps = 0;
    for (int i = 1; i + 1 < argc; ++i)
        if (!std::strcmp(argv[i], "--peak-gbps")) spec_gbps = std::atof(argv[i + 1]);
    int count = 0;
    const hipError_t err = hipGetDeviceCount(&count);
    if (err != hipSuccess || count == 0) {
        std::printf("needs a HIP device: %s\n", err != hipSuccess ? hipGetErrorString(err) : "0 devices visible");
        return 2;
    }
    hipDeviceProp_t p;
    CHECK(hipGetDeviceProperties(&p, 0));
    wave_size = p.warpSize;
    if (spec_gbps == 0) spec_gbps = 2.0 * p.memoryClockRate * 1e3 * (p.memoryBusWidth / 8) / 1e9;
    std::printf("device: %s (%s), %d CUs, wave %d, %.0f GiB; spec peak %.0f GB/s\n", p.name, p.gcnArchName,
                p.multiProcessorCount, p.warpSize, p.totalGlobalMem / 1073741824.0, spec_gbps);

    // The practical ceiling: a 1 GiB device-to-device copy moves 2 GiB.
    const size_t gib = size_t(1) << 30;
    void* a = dev_alloc(gib, 1);
    void* b = dev_alloc(gib, 2);
    copy_gbps = 1;  // report() divides by it below; set for real next
    const double copy_ms = median_ms([&] { CHECK(hipMemcpyAsync(b, a, gib, hipMemcpyDeviceToDevice, 0)); });
    copy_gbps = 2.0 * gib / (copy_ms * 1e-3) / 1e9;
    std::printf("%-34s %9.3f ms %9.1f GB/s (read + write)\n", "hipMemcpy D2D 1 GiB", copy_ms, copy_gbps);

    // Decode matvecs: 4096 x 14336 (an 8B model's FFN down projection shape, transposed).
    const uint32_t rows = 4096, cols = 14336;
    float* x = static_cast<float*>(dev_alloc(cols * 4, 3));
    float* out = static_cast<float*>(dev_alloc(rows * 4 * 8, 4));
    void* q8_0 = dev_alloc(cols / 32 * sizeof(BhQ8_0), 5);
    void* q8_k = dev_alloc(cols / 256 * sizeof(BhQ8K), 6);
    // Finite activations for the quantizers.
    CHECK(hipMemset(x, 0, cols * 4));
    struct { uint32_t ty, be, bb; const char* name; void (*k)(BhMatArgs); const void* act; } types[] = {
        {BH_F16, 1, 2, "matvec F16", bh_matvec_f16, x},
        {BH_Q8_0, 32, 34, "matvec Q8_0", bh_matvec_q8_0, q8_0},
        {BH_Q4_0, 32, 18, "matvec Q4_0", bh_matvec_q4_0, q8_0},
        {BH_Q4_K, 256, 144, "matvec Q4_K", bh_matvec_q4k, q8_k},
        {BH_Q6_K, 256, 210, "matvec Q6_K", bh_matvec_q6k, q8_k},
    };
    for (auto& t : types) {
        const size_t wbytes = size_t(rows) * (cols / t.be) * t.bb;
        uint8_t* w = static_cast<uint8_t*>(dev_alloc(wbytes, 7));
        const double ms = median_ms([&] { matvec(t.ty, t.name, t.k, rows, cols, t.be, t.bb, t.act, out, w, 0); });
        char label[64];
        std::snprintf(label, sizeof label, "%s %ux%u", t.name, rows, cols);
        report(label, double(wbytes), ms);
        CHECK(hipFree(w));
    }

    // Decode attention: 32 query heads, 8 KV heads of 128, 4096 positions in 16-token blocks.
    {
        const uint32_t heads = 32, kv_heads = 8, hd = 128, pos = 4096, bt = 16, split = 256;
        const uint32_t nblocks = pos / bt, splits = pos / split;
        const size_t kv_bytes = size_t(pos) * kv_heads * hd * 4;
        float* k = static_cast<float*>(dev_alloc(kv_bytes, 8));
        float* v = static_cast<float*>(dev_alloc(kv_bytes, 9));
        CHECK(hipMemset(k, 0, kv_bytes));
        CHECK(hipMemset(v, 0, kv_bytes));
        std::vector<uint32_t> table(nblocks);
        for (uint32_t i = 0; i < nblocks; ++i) table[i] = (i * 37) % nblocks;  // scattered blocks
        uint32_t *tables, *row_table, *row_pos;
        CHECK(hipMalloc(&tables, nblocks * 4));
        CHECK(hipMemcpy(tables, table.data(), nblocks * 4, hipMemcpyHostToDevice));
        const uint32_t zero = 0, last = pos - 1;
        CHECK(hipMalloc(&row_table, 4));
        CHECK(hipMalloc(&row_pos, 4));
        CHECK(hipMemcpy(row_table, &zero, 4, hipMemcpyHostToDevice));
        CHECK(hipMemcpy(row_pos, &last, 4, hipMemcpyHostToDevice));
        float *q, *po, *pml, *o;
        CHECK(hipMalloc(&q, heads * hd * 4));
        CHECK(hipMemset(q, 0, heads * hd * 4));
        CHECK(hipMalloc(&po, size_t(heads) * splits * hd * 4));
        CHECK(hipMalloc(&pml, size_t(heads) * splits * 8));
        CHECK(hipMalloc(&o, heads * hd * 4));
        BhAttentionArgs at{q, k, v, tables, row_table, row_pos, po, pml, o, 1, heads, kv_heads, hd, bt, split, splits,
                           0.088f};
        const double ms = median_ms([&] {
            hipLaunchKernelGGL(bh_attention_partial, dim3(splits, heads, 1), dim3(BH_BLOCK), 0, 0, at);
            hipLaunchKernelGGL(bh_attention_reduce, dim3(heads, 1, 1), dim3(BH_BLOCK), 0, 0, at);
        });
        report("attention decode 4096 pos (K+V)", 2.0 * kv_bytes, ms);
    }

    // SHA-256 of 1 GiB in 4 MiB chunks (the scrub's chunking).
    {
        uint8_t* hashes;
        CHECK(hipMalloc(&hashes, 32 * 256));
        BhSha256Args s{static_cast<const uint8_t*>(a), hashes, gib, 4 << 20};
        const double ms = median_ms(
            [&] { hipLaunchKernelGGL(bh_sha256_leaves, dim3(256), dim3(64), 0, 0, s); });
        report("sha256 leaves 1 GiB / 4 MiB", double(gib), ms);
    }
    CHECK(hipFree(a));
    CHECK(hipFree(b));

    // Kernels-only decode step, Llama-3-8B shapes in Q4_K (32 layers, d 4096,
    // 32/8 heads of 128, FFN 14336, context 1024), output 128256 x 4096 Q6_K.
    {
        const uint32_t d = 4096, ffn = 14336, layers = 32, vocab = 128256, kvd = 1024;
        auto q4k = [](uint32_t r, uint32_t c) { return size_t(r) * (c / 256) * 144; };
        struct Layer { uint8_t *wq, *wk, *wv, *wo, *wg, *wu, *wd; };
        std::vector<Layer> ls(layers);
        size_t total = 0;
        for (auto& l : ls) {
            l.wq = static_cast<uint8_t*>(dev_alloc(q4k(d, d), 10));
            l.wk = static_cast<uint8_t*>(dev_alloc(q4k(kvd, d), 11));
            l.wv = static_cast<uint8_t*>(dev_alloc(q4k(kvd, d), 12));
            l.wo = static_cast<uint8_t*>(dev_alloc(q4k(d, d), 13));
            l.wg = static_cast<uint8_t*>(dev_alloc(q4k(ffn, d), 14));
            l.wu = static_cast<uint8_t*>(dev_alloc(q4k(ffn, d), 15));
            l.wd = static_cast<uint8_t*>(dev_alloc(q4k(d, ffn), 16));
            total += 2 * q4k(d, d) + 2 * q4k(kvd, d) + 2 * q4k(ffn, d) + q4k(d, ffn);
        }
        const size_t out_bytes = size_t(vocab) * (d / 256) * 210;
        uint8_t* wout = static_cast<uint8_t*>(dev_alloc(out_bytes, 17));
        total += out_bytes;
        float *h, *hn, *g, *u, *logits, *wn;
        CHECK(hipMalloc(&h, ffn * 4));
        CHECK(hipMalloc(&hn, ffn * 4));
        CHECK(hipMalloc(&g, ffn * 4));
        CHECK(hipMalloc(&u, ffn * 4));
        CHECK(hipMalloc(&wn, d * 4));
        CHECK(hipMalloc(&logits, size_t(vocab) * 4));
        for (float* f : {h, hn, g, u}) CHECK(hipMemset(f, 0, ffn * 4));
        CHECK(hipMemset(wn, 0, d * 4));
        void* qk;
        CHECK(hipMalloc(&qk, ffn / 256 * sizeof(BhQ8K)));
        const int wave = wave_size;
        auto mv = [&](const uint8_t* w, uint32_t r, uint32_t c, uint32_t ty, uint32_t bb, float* o) {
            BhQuantizeArgs qa{hn, qk, 1, c};
            hipLaunchKernelGGL(bh_quantize_q8_k, dim3((c / 256 + 63) / 64), dim3(64), 0, 0, qa);
            BhMatArgs ma{w, qk, o, uint64_t(c / 256) * bb, r, c, 1, ty};
            const uint32_t waves = BH_BLOCK / wave;
            if (ty == BH_Q6_K)
                hipLaunchKernelGGL(bh_matvec_q6k, dim3((r + waves - 1) / waves), dim3(BH_BLOCK), 0, 0, ma);
            else
                hipLaunchKernelGGL(bh_matvec_q4k, dim3((r + waves - 1) / waves), dim3(BH_BLOCK), 0, 0, ma);
        };
        const double ms = median_ms([&] {
            for (auto& l : ls) {
                BhRmsNormArgs rn{h, wn, hn, 1, d, 1e-5f, 0};
                hipLaunchKernelGGL(bh_rms_norm, dim3(1), dim3(BH_BLOCK), 0, 0, rn);
                mv(l.wq, d, d, BH_Q4_K, 144, g);
                mv(l.wk, kvd, d, BH_Q4_K, 144, u);
                mv(l.wv, kvd, d, BH_Q4_K, 144, u);
                BhRopeArgs ra{g, 1, 32, 128, 128, 1023, 500000.0f, 1.0f, BH_ROPE_NORMAL};
                hipLaunchKernelGGL(bh_rope, dim3(8), dim3(BH_BLOCK), 0, 0, ra);
                mv(l.wo, d, d, BH_Q4_K, 144, u);
                BhBinaryArgs add{h, u, d};
                hipLaunchKernelGGL(bh_add, dim3(16), dim3(BH_BLOCK), 0, 0, add);
                mv(l.wg, ffn, d, BH_Q4_K, 144, g);
                mv(l.wu, ffn, d, BH_Q4_K, 144, u);
                BhBinaryArgs sm{g, u, ffn};
                hipLaunchKernelGGL(bh_silu_mul, dim3(56), dim3(BH_BLOCK), 0, 0, sm);
                mv(l.wd, d, ffn, BH_Q4_K, 144, u);
                hipLaunchKernelGGL(bh_add, dim3(16), dim3(BH_BLOCK), 0, 0, add);
            }
            mv(wout, vocab, d, BH_Q6_K, 210, logits);
        });
        std::printf("%-34s %9.3f ms %9.1f tokens/s (weights %.2f GB: %.1f%% of copy bandwidth; "
                    "attention excluded)\n",
                    "decode step, 8B-shaped Q4_K", ms, 1e3 / ms, total / 1e9,
                    100 * (total / (ms * 1e-3) / 1e9) / copy_gbps);
    }
    return 0;
}
