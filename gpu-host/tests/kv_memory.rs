//! A KV pool in host memory costs resident memory only for the pages its
//! passes write, also when it takes the place of a pool just dropped (what
//! a new partition layout does), under the allocator the gpu-host binary
//! runs with: mimalloc zeroes memory it reuses by writing all of it.
//! Alone in its test binary, so no other test moves the resident size.

use std::path::PathBuf;

use bulkhead_gpu_host::backend::CpuBackend;
use bulkhead_gpu_host::engine::{BLOCK_TOKENS, BatchEntry, KvBlocks, Model};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// This process's resident memory, bytes (`VmRSS`).
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn a_pool_in_place_of_a_dropped_one_costs_only_the_pages_it_writes() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/models/llama-q8_0.gguf");
    let model = Model::open(path).unwrap();
    let cpu = CpuBackend::new(1).unwrap();
    let c = model.config();
    let block_bytes = 2 * c.layers * BLOCK_TOKENS * c.kv_dim() * size_of::<f32>();
    let pool_bytes: usize = 512 << 20;
    let blocks = u32::try_from(pool_bytes / block_bytes).unwrap();
    // A three-token prefill in block 0: places the pool, writes one block.
    let run = |kv: &mut KvBlocks| {
        let entry = BatchEntry {
            tokens: &[1, 2, 3],
            start_pos: 0,
            blocks: &[0],
            logits: true,
        };
        model.forward_batch(&cpu, kv, &[entry]).unwrap();
    };
    let mut old = model.new_kv_blocks(blocks);
    run(&mut old);
    drop(old);
    let before = rss();
    let mut new = model.new_kv_blocks(blocks);
    run(&mut new);
    let grew = rss().saturating_sub(before);
    assert!(
        grew < pool_bytes / 16,
        "a {} MiB pool that holds one block raised the resident size by {} MiB",
        pool_bytes >> 20,
        grew >> 20
    );
}
