// The emulated device's launcher: `bh-emulate IN OUT` reads one launch from
// IN — kernel name, grid, block threads, wave size, the args struct's bytes
// and every buffer — maps buffer i at device address BH_EMU_BASE + i·2^32
// (the addresses the Rust side wrote into the args), runs the kernel and
// writes every buffer back to OUT. Format (little-endian):
//   "BHEMU1\0\0" u32 name_len, name, u32 grid_x, grid_y, grid_z, threads,
//   wave, u32 args_len, args, u32 n_buffers, then per buffer u64 len, bytes.
// OUT: u32 n_buffers, then per buffer u64 len, bytes.
#include "../bulkhead.hip"

#include <sys/mman.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

static const uint64_t BH_EMU_BASE = 0x100000000000ull;  // 16 TiB: unused in a fresh process
static const uint32_t BH_EMU_MAX_BUFFERS = 1024;  // 1024 · 4 GiB stays below 2^47

struct Reader {
    std::vector<uint8_t> bytes;
    size_t at = 0;
    const uint8_t* take(size_t n) {
        if (n > bytes.size() - at) throw std::runtime_error("launch file truncated");
        at += n;
        return bytes.data() + at - n;
    }
    uint32_t u32() { uint32_t v; std::memcpy(&v, take(4), 4); return v; }
    uint64_t u64() { uint64_t v; std::memcpy(&v, take(8), 8); return v; }
};

template <class Args>
static void run(void (*kernel)(Args), const std::vector<uint8_t>& args, BhEmuDim3 grid, uint32_t threads, int wave) {
    if (args.size() != sizeof(Args)) throw std::runtime_error("args size differs from the kernel's struct");
    Args a;
    std::memcpy(&a, args.data(), sizeof(Args));
    bh_emu_launch(kernel, a, grid, threads, wave);
}

static void dispatch(const std::string& name, const std::vector<uint8_t>& args, BhEmuDim3 grid, uint32_t threads, int wave) {
#define BH_EMU_KERNEL(fn) \
    if (name == #fn) return run(fn, args, grid, threads, wave);
    BH_EMU_KERNEL(bh_embedding)
    BH_EMU_KERNEL(bh_quantize_q8_0)
    BH_EMU_KERNEL(bh_quantize_q8_k)
    BH_EMU_KERNEL(bh_matvec_f16)
    BH_EMU_KERNEL(bh_matvec_dequant)
    BH_EMU_KERNEL(bh_matvec_q8_0)
    BH_EMU_KERNEL(bh_matvec_q4_0)
    BH_EMU_KERNEL(bh_matvec_q4k)
    BH_EMU_KERNEL(bh_matvec_q6k)
    BH_EMU_KERNEL(bh_matmul_tiled)
    BH_EMU_KERNEL(bh_rms_norm)
    BH_EMU_KERNEL(bh_rope)
    BH_EMU_KERNEL(bh_softmax)
    BH_EMU_KERNEL(bh_silu_mul)
    BH_EMU_KERNEL(bh_add)
    BH_EMU_KERNEL(bh_attention_partial)
    BH_EMU_KERNEL(bh_attention_reduce)
    BH_EMU_KERNEL(bh_sha256_leaves)
#undef BH_EMU_KERNEL
    throw std::runtime_error("unknown kernel " + name);
}

int main(int argc, char** argv) {
    try {
        if (argc != 3) throw std::runtime_error("usage: bh-emulate IN OUT");
        std::ifstream in(argv[1], std::ios::binary);
        Reader r{std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {})};
        if (std::memcmp(r.take(8), "BHEMU1\0\0", 8) != 0) throw std::runtime_error("not a launch file");
        const uint32_t name_len = r.u32();
        const std::string name(reinterpret_cast<const char*>(r.take(name_len)), name_len);
        BhEmuDim3 grid;
        grid.x = r.u32();
        grid.y = r.u32();
        grid.z = r.u32();
        const uint32_t threads = r.u32(), wave = r.u32();
        if (wave == 0 || threads == 0 || threads % wave != 0 || threads > 1024)
            throw std::runtime_error("threads must be a multiple of the wave size, at most 1024");
        const uint32_t args_len = r.u32();
        const uint8_t* args_at = r.take(args_len);
        const std::vector<uint8_t> args(args_at, args_at + args_len);
        const uint32_t n = r.u32();
        if (n > BH_EMU_MAX_BUFFERS) throw std::runtime_error("too many buffers");
        std::vector<std::pair<uint8_t*, uint64_t>> buffers;
        for (uint32_t i = 0; i < n; ++i) {
            const uint64_t len = r.u64();
            if (len >= (1ull << 32)) throw std::runtime_error("buffer over 4 GiB");
            void* want = reinterpret_cast<void*>(BH_EMU_BASE + (uint64_t(i) << 32));
            void* got = mmap(want, len ? len : 1, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (got != want) throw std::runtime_error("could not map a buffer at its device address");
            std::memcpy(got, r.take(len), len);
            buffers.emplace_back(static_cast<uint8_t*>(got), len);
        }
        dispatch(name, args, grid, threads, int(wave));
        std::ofstream out(argv[2], std::ios::binary);
        out.write(reinterpret_cast<const char*>(&n), 4);
        for (auto& [p, len] : buffers) {
            out.write(reinterpret_cast<const char*>(&len), 8);
            out.write(reinterpret_cast<const char*>(p), std::streamsize(len));
        }
        if (!out) throw std::runtime_error("writing the output file");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bh-emulate: %s\n", e.what());
        return 1;
    }
    return 0;
}
