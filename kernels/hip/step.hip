// The glue of a forward pass that stays on the device: writing a step's
// keys and values into the paged pool, adding a bias to every row,
// copying a pool into its grown allocation, and picking the rows whose
// logits are wanted. Pure data movement (and one
// f32 add), so bit-identical to the host code they replace.
#include "common.h"

// One thread per (row, element); grid.y = rows. The block table entry is
// read per element: the table is tiny and cached, and the kernel stays one
// line of arithmetic.
BH_KERNEL void bh_kv_store(BhKvStoreArgs a) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t r = blockIdx.y;
    if (i >= a.kv_dim || r >= a.n_rows) return;
    const uint32_t pos = a.row_pos[r];
    const uint32_t block = a.tables[a.row_table[r] + pos / a.block_tokens];
    const uint64_t at = (uint64_t(block) * a.block_tokens + pos % a.block_tokens) * a.kv_dim + i;
    const uint64_t from = uint64_t(r) * a.kv_dim + i;
    a.k_pool[at] = a.k[from];
    a.v_pool[at] = a.v[from];
}

// a[i] += b[i % width], a grid-stride loop as bh_add.
BH_KERNEL void bh_add_rows(BhAddRowsArgs a) {
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
         i += uint64_t(gridDim.x) * blockDim.x) {
        a.a[i] += a.b[i % a.width];
    }
}

// a[i] = b[i] (BhBinaryArgs): a KV pool's blocks into its grown allocation.
BH_KERNEL void bh_copy(BhBinaryArgs a) {
    for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
         i += uint64_t(gridDim.x) * blockDim.x) {
        a.a[i] = a.b[i];
    }
}

// One thread per element; grid.y = output rows.
BH_KERNEL void bh_gather_rows(BhGatherArgs a) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    const uint32_t j = blockIdx.y;
    if (i >= a.width || j >= a.n_rows) return;
    a.out[uint64_t(j) * a.width + i] = a.x[uint64_t(a.rows[j]) * a.width + i];
}
