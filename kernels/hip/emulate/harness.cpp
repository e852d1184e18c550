// The emulated device: a process that holds "device memory" and runs
// kernels on the CPU (emulate.h), driven over stdin/stdout by
// bulkhead_kernels::hip::emulator. Allocation i is mapped at the address
// BH_EMU_BASE + slot·2^32, so the addresses the Rust side writes into
// kernel arguments are real pointers here.
//
// Requests (little-endian), each answered by u8 status (0 ok, 1 error) and,
// on error, u32 length + message:
//   'A' u64 len                  → ok: u64 address (zeroed memory)
//   'F' u64 address              → ok
//   'W' u64 address, u64 len, bytes → ok
//   'R' u64 address, u64 len     → ok: bytes
//   'L' u32 name_len, name, u32 grid_x, grid_y, grid_z, threads, wave,
//       u32 args_len, args       → ok
#include "../bulkhead.hip"

#include <sys/mman.h>

#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>

static const uint64_t BH_EMU_BASE = 0x100000000000ull;  // 16 TiB: unused in a fresh process
static const uint64_t BH_EMU_SLOTS = 8192;              // · 4 GiB stays below 2^47

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
    BH_EMU_KERNEL(bh_kv_store)
    BH_EMU_KERNEL(bh_add_rows)
    BH_EMU_KERNEL(bh_copy)
    BH_EMU_KERNEL(bh_gather_rows)
    BH_EMU_KERNEL(bh_sha256_leaves)
#undef BH_EMU_KERNEL
    throw std::runtime_error("unknown kernel " + name);
}

static void read_exact(void* p, size_t n) {
    if (n && std::fread(p, 1, n, stdin) != n) throw std::runtime_error("request truncated");
}
static uint32_t u32() { uint32_t v; read_exact(&v, 4); return v; }
static uint64_t u64() { uint64_t v; read_exact(&v, 8); return v; }
static void write(const void* p, size_t n) { std::fwrite(p, 1, n, stdout); }

struct Memory {
    std::map<uint64_t, uint64_t> live;  // address → length
    std::vector<uint64_t> free_slots;
    uint64_t next_slot = 0;

    uint64_t alloc(uint64_t len) {
        if (len >= (1ull << 32)) throw std::runtime_error("allocation over 4 GiB");
        uint64_t slot;
        if (!free_slots.empty()) {
            slot = free_slots.back();
            free_slots.pop_back();
        } else if (next_slot < BH_EMU_SLOTS) {
            slot = next_slot++;
        } else {
            throw std::runtime_error("out of emulated allocations");
        }
        void* want = reinterpret_cast<void*>(BH_EMU_BASE + (slot << 32));
        void* got = mmap(want, len ? len : 1, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (got != want) throw std::runtime_error("could not map an allocation at its device address");
        live[uint64_t(want)] = len;
        return uint64_t(want);
    }
    // The allocation holding [addr, addr + len).
    uint8_t* range(uint64_t addr, uint64_t len) {
        auto it = live.upper_bound(addr);
        if (it == live.begin()) throw std::runtime_error("address outside every allocation");
        --it;
        if (addr + len > it->first + it->second) throw std::runtime_error("range past the end of its allocation");
        return reinterpret_cast<uint8_t*>(addr);
    }
    void free(uint64_t addr) {
        auto it = live.find(addr);
        if (it == live.end()) throw std::runtime_error("free of an address that is not an allocation");
        munmap(reinterpret_cast<void*>(addr), it->second ? it->second : 1);
        free_slots.push_back((addr - BH_EMU_BASE) >> 32);
        live.erase(it);
    }
};

int main() {
    Memory mem;
    for (;;) {
        int op = std::fgetc(stdin);
        if (op == EOF) return 0;
        std::vector<uint8_t> reply;
        try {
            switch (op) {
                case 'A': {
                    const uint64_t addr = mem.alloc(u64());
                    reply.resize(8);
                    std::memcpy(reply.data(), &addr, 8);
                    break;
                }
                case 'F': mem.free(u64()); break;
                case 'W': {
                    const uint64_t addr = u64(), len = u64();
                    if (len >= (1ull << 32)) throw std::runtime_error("write over 4 GiB");
                    // Consume the payload before checking the range, so an
                    // error leaves the stream at the next request.
                    std::vector<uint8_t> bytes(len);
                    read_exact(bytes.data(), len);
                    std::memcpy(mem.range(addr, len), bytes.data(), len);
                    break;
                }
                case 'R': {
                    const uint64_t addr = u64(), len = u64();
                    const uint8_t* p = mem.range(addr, len);
                    reply.assign(p, p + len);
                    break;
                }
                case 'L': {
                    const uint32_t name_len = u32();
                    if (name_len > 256) throw std::runtime_error("kernel name too long");
                    std::string name(name_len, '\0');
                    read_exact(name.data(), name_len);
                    BhEmuDim3 grid;
                    grid.x = u32();
                    grid.y = u32();
                    grid.z = u32();
                    const uint32_t threads = u32(), wave = u32(), args_len = u32();
                    if (args_len > 4096) throw std::runtime_error("args over 4096 bytes");
                    std::vector<uint8_t> args(args_len);
                    read_exact(args.data(), args_len);
                    if (wave == 0 || threads == 0 || threads % wave != 0 || threads > 1024)
                        throw std::runtime_error("threads must be a multiple of the wave size, at most 1024");
                    dispatch(name, args, grid, threads, int(wave));
                    break;
                }
                default: throw std::runtime_error("unknown request");
            }
            const uint8_t ok = 0;
            write(&ok, 1);
            write(reply.data(), reply.size());
        } catch (const std::exception& e) {
            const uint8_t bad = 1;
            const uint32_t n = uint32_t(std::strlen(e.what()));
            write(&bad, 1);
            write(&n, 4);
            write(e.what(), n);
            // A truncated request leaves the stream unusable: stop.
            if (std::feof(stdin)) return 1;
        }
        std::fflush(stdout);
    }
}
