// SHA-256 of resident weight chunks, in place in device memory, for the
// weight scrub: chunk i of data[0..len] (chunk_bytes each, the last possibly
// shorter) hashes to SHA-256(0x00 ‖ chunk), the RFC 6962 leaf that
// bulkhead_protocol::digest::leaf_hash computes on the CPU (4 MiB chunks
// there), so a leaf from the GPU compares directly with the leaf kept at load.
//
// SHA-256 is a chain over 64-byte blocks, so one chunk is one thread's work:
// one chunk per work-group. The group's threads stage the message (prefix
// byte, data, padding, bit length) into LDS as big-endian words with adjacent
// threads reading adjacent bytes; thread 0 runs the compression over what was
// staged. Launch: grid = number of chunks, blockDim a multiple of warpSize
// (small, e.g. 64, so many chunks are in flight per compute unit).
#include "common.h"

#define BH_SHA_STAGE_BYTES 4096

__constant__ uint32_t bh_sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

BH_DEVICE uint32_t bh_rotr(uint32_t x, uint32_t n) { return (x >> n) | (x << (32 - n)); }

// One compression. The message schedule is a rolling window of 16 words and
// the rounds are fully unrolled, so every index is a constant and the state
// stays in registers (a 64-word schedule array spills to scratch).
BH_DEVICE void bh_sha_compress(uint32_t st[8], const uint32_t* block) {
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = block[i];
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
        if (i >= 16) {
            const uint32_t w15 = w[(i - 15) & 15], w2 = w[(i - 2) & 15];
            const uint32_t s0 = bh_rotr(w15, 7) ^ bh_rotr(w15, 18) ^ (w15 >> 3);
            const uint32_t s1 = bh_rotr(w2, 17) ^ bh_rotr(w2, 19) ^ (w2 >> 10);
            w[i & 15] += s0 + w[(i - 7) & 15] + s1;
        }
        const uint32_t s1 = bh_rotr(e, 6) ^ bh_rotr(e, 11) ^ bh_rotr(e, 25);
        const uint32_t ch = (e & f) ^ (~e & g);
        const uint32_t t1 = h + s1 + ch + bh_sha_k[i] + w[i & 15];
        const uint32_t s0 = bh_rotr(a, 2) ^ bh_rotr(a, 13) ^ bh_rotr(a, 22);
        const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        const uint32_t t2 = s0 + maj;
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    st[0] += a;
    st[1] += b;
    st[2] += c;
    st[3] += d;
    st[4] += e;
    st[5] += f;
    st[6] += g;
    st[7] += h;
}

// Byte i of the padded message 0x00 ‖ data[0..len] ‖ 0x80 ‖ 0… ‖ bit length
// (64-bit big-endian), `total` bytes in all.
BH_DEVICE uint32_t bh_sha_msg_byte(const uint8_t* data, uint64_t len, uint64_t total, uint64_t i) {
    if (i == 0) return 0x00;
    if (i <= len) return data[i - 1];
    if (i == len + 1) return 0x80;
    if (i >= total - 8) {
        const uint64_t bits = (len + 1) * 8;
        return uint32_t(bits >> (8 * (total - 1 - i))) & 0xFF;
    }
    return 0;
}

BH_KERNEL void bh_sha256_leaves(BhSha256Args a) {
    __shared__ uint32_t words[BH_SHA_STAGE_BYTES / 4];
    const uint64_t start = uint64_t(blockIdx.x) * a.chunk_bytes;
    if (start >= a.len) return;  // an empty buffer has no chunks, as on the CPU
    const uint8_t* data = a.data + start;
    const uint64_t len = min(a.chunk_bytes, a.len - start);
    // Smallest multiple of 64 that holds the prefix, the data, 0x80 and 8 length bytes.
    const uint64_t total = (len + 1 + 9 + 63) / 64 * 64;
    uint32_t st[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    for (uint64_t seg = 0; seg < total; seg += BH_SHA_STAGE_BYTES) {
        const uint64_t seg_bytes = min(uint64_t(BH_SHA_STAGE_BYTES), total - seg);
        for (uint32_t wi = threadIdx.x; wi < seg_bytes / 4; wi += blockDim.x) {
            const uint64_t i = seg + 4 * uint64_t(wi);
            uint32_t word;
            if (i >= 1 && i + 3 <= len) {
                // Wholly inside the data: the common case, four plain loads.
                word = (uint32_t(data[i - 1]) << 24) | (uint32_t(data[i]) << 16) |
                       (uint32_t(data[i + 1]) << 8) | uint32_t(data[i + 2]);
            } else {
                word = 0;
                for (int k = 0; k < 4; ++k) word = (word << 8) | bh_sha_msg_byte(data, len, total, i + k);
            }
            words[wi] = word;
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (uint64_t blk = 0; blk < seg_bytes / 64; ++blk) bh_sha_compress(st, words + 16 * blk);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        uint8_t* out = a.out + 32 * uint64_t(blockIdx.x);
        for (int i = 0; i < 8; ++i) {
            out[4 * i] = uint8_t(st[i] >> 24);
            out[4 * i + 1] = uint8_t(st[i] >> 16);
            out[4 * i + 2] = uint8_t(st[i] >> 8);
            out[4 * i + 3] = uint8_t(st[i]);
        }
    }
}
