// Kernel arguments. Every kernel takes exactly one of these structs by value,
// so a launch passes one pointer and the Rust side mirrors each struct once
// (`bulkhead_kernels::hip::args`, `#[repr(C)]`, the same field order). The
// static_asserts below and the const asserts there pin the same sizes, so a
// field added on one side only fails the build instead of shifting arguments.
//
// Pointers are device addresses. Fields are ordered 8-byte, then 4-byte, so
// neither compiler inserts padding between them.
#pragma once

#include <stdint.h>

// Weight element types, numbered as in GGUF (bulkhead_kernels::GgmlType::id).
enum BhType : uint32_t {
    BH_F32 = 0,
    BH_F16 = 1,
    BH_Q4_0 = 2,
    BH_Q4_1 = 3,
    BH_Q5_0 = 6,
    BH_Q5_1 = 7,
    BH_Q8_0 = 8,
    BH_Q4_K = 12,
    BH_Q5_K = 13,
    BH_Q6_K = 14,
    BH_IQ4_NL = 20,
    BH_IQ4_XS = 23,
    BH_BF16 = 30,
};

// RoPE pairing (bulkhead_kernels::RopeStyle).
enum BhRopeStyle : uint32_t {
    BH_ROPE_NORMAL = 0,  // (x[2i], x[2i+1]), llama
    BH_ROPE_NEOX = 1,    // (x[i], x[i + rot/2]), qwen2
};

// Activations quantized for the integer dot products, as the CPU's
// quantize_row_q8_0 / quantize_row_q8_k leave them (scale already rounded
// through f16 for Q8_0).
struct BhQ8_0 {
    float d;
    int8_t qs[32];
};
struct BhQ8K {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};
static_assert(sizeof(BhQ8_0) == 36, "BhQ8_0 layout");
static_assert(sizeof(BhQ8K) == 292, "BhQ8K layout");

// bh_embedding: row r of out (cols floats, r < gridDim.y) = dequantized row
// tokens[r] of `table`. Token ids are checked against the table on the host.
struct BhEmbeddingArgs {
    const uint8_t* table;
    const uint32_t* tokens;
    float* out;
    uint64_t row_bytes;
    uint32_t cols;
    uint32_t ty;
};
static_assert(sizeof(BhEmbeddingArgs) == 40, "BhEmbeddingArgs layout");

// bh_quantize_q8_0 / bh_quantize_q8_k: each of `n_tokens` rows of `cols`
// activations into cols/32 BhQ8_0 or cols/256 BhQ8K blocks.
struct BhQuantizeArgs {
    const float* x;
    void* out;
    uint32_t n_tokens;
    uint32_t cols;
};
static_assert(sizeof(BhQuantizeArgs) == 24, "BhQuantizeArgs layout");

// Every matvec and the tiled matmul: out[t * rows + r] = row r of w · token t
// of x. `x` is f32 (F16, the dequantizing matvec, matmul) or the quantized
// blocks the weight type pairs with (Q8_0 for Q8_0/Q4_0, Q8_K for Q4_K/Q6_K).
struct BhMatArgs {
    const uint8_t* w;
    const void* x;
    float* out;
    uint64_t row_bytes;
    uint32_t rows;
    uint32_t cols;
    uint32_t n_tokens;
    uint32_t ty;
};
static_assert(sizeof(BhMatArgs) == 48, "BhMatArgs layout");

// bh_rms_norm: each `width`-wide row of x, scaled by weight.
struct BhRmsNormArgs {
    const float* x;
    const float* weight;
    float* out;
    uint32_t n_rows;
    uint32_t width;
    float eps;
    uint32_t pad;
};
static_assert(sizeof(BhRmsNormArgs) == 40, "BhRmsNormArgs layout");

// bh_rope: n_tokens rows of n_heads heads each, row t at position
// positions[t], rotated in place.
struct BhRopeArgs {
    float* x;
    const uint32_t* positions;
    uint32_t n_tokens;
    uint32_t n_heads;
    uint32_t head_dim;
    uint32_t rot_dim;
    float freq_base;
    float freq_scale;
    uint32_t style;
    uint32_t pad;
};
static_assert(sizeof(BhRopeArgs) == 48, "BhRopeArgs layout");

// bh_softmax: each `width`-wide row in place.
struct BhSoftmaxArgs {
    float* x;
    uint32_t n_rows;
    uint32_t width;
};
static_assert(sizeof(BhSoftmaxArgs) == 16, "BhSoftmaxArgs layout");

// bh_add (a += b) and bh_silu_mul (a = silu(a) * b) over n elements.
struct BhBinaryArgs {
    float* a;
    const float* b;
    uint64_t n;
};
static_assert(sizeof(BhBinaryArgs) == 24, "BhBinaryArgs layout");

// Paged attention, two passes (see attention.hip). Query row r of every
// sequence in the call attends to positions 0..=row_pos[r] of its sequence,
// position p living in row p % block_tokens of pool block
// tables[row_table[r] + p / block_tokens]. Pass one writes, per (row, head,
// split), the split's running max and sum (partial_ml, 2 floats) and its
// unnormalized output (partial_o, head_dim floats); pass two combines them.
struct BhAttentionArgs {
    const float* q;
    const float* k_pool;
    const float* v_pool;
    const uint32_t* tables;
    const uint32_t* row_table;
    const uint32_t* row_pos;
    float* partial_o;
    float* partial_ml;
    float* out;
    uint32_t n_rows;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    uint32_t block_tokens;
    uint32_t split_positions;
    uint32_t n_splits;
    float scale;
};
static_assert(sizeof(BhAttentionArgs) == 104, "BhAttentionArgs layout");

// bh_kv_store: row r of k and of v (kv_dim floats each) into position
// row_pos[r] of its sequence's blocks, addressed as in BhAttentionArgs.
struct BhKvStoreArgs {
    const float* k;
    const float* v;
    float* k_pool;
    float* v_pool;
    const uint32_t* tables;
    const uint32_t* row_table;
    const uint32_t* row_pos;
    uint32_t n_rows;
    uint32_t kv_dim;
    uint32_t block_tokens;
    uint32_t pad;
};
static_assert(sizeof(BhKvStoreArgs) == 72, "BhKvStoreArgs layout");

// bh_add_rows: a[i] += b[i % width] for i < n (a bias added to every row).
struct BhAddRowsArgs {
    float* a;
    const float* b;
    uint64_t n;
    uint32_t width;
    uint32_t pad;
};
static_assert(sizeof(BhAddRowsArgs) == 32, "BhAddRowsArgs layout");

// bh_gather_rows: row j of out = row rows[j] of x, for j < n_rows.
struct BhGatherArgs {
    const float* x;
    const uint32_t* rows;
    float* out;
    uint32_t n_rows;
    uint32_t width;
};
static_assert(sizeof(BhGatherArgs) == 32, "BhGatherArgs layout");

// bh_sha256_leaves: out[32 i .. 32 i + 32] = SHA-256(0x00 ‖ chunk i of
// data[0..len]), chunks of chunk_bytes (the last may be shorter): the
// RFC 6962 leaf hashes of bulkhead_protocol::digest::chunk_leaves.
struct BhSha256Args {
    const uint8_t* data;
    uint8_t* out;
    uint64_t len;
    uint64_t chunk_bytes;
};
static_assert(sizeof(BhSha256Args) == 32, "BhSha256Args layout");

// Largest head_dim the attention kernels hold in registers per wave.
#define BH_MAX_HEAD_DIM 256
