//! The paged KV cache: one model's keys and values as a pool of fixed-size
//! blocks ([`KV_BLOCK_TOKENS`] positions), and the batched forward pass that
//! runs several sequences in one call, each reading and writing its
//! positions through its own block table.
//!
//! Which sequence holds which block, and whose budget it is charged to, is
//! `bulkhead-partition`'s `KvPool`; this module only stores the numbers.

use bulkhead_kernels::{PagedSeq, PagedShape};
use bulkhead_partition::{KV_BLOCK_TOKENS, KvDtype, KvGeometry, PartitionError};

use super::host_pass::KvStore;
use super::model::{ForwardError, KvMemory, Model};
use super::zeroed::ZeroedFloats;
use crate::backend::{Backend, Heads, KvLayout, OpResult, Segment, StepRows};

/// Positions per block, as a `usize` for indexing.
pub const BLOCK_TOKENS: usize = KV_BLOCK_TOKENS as usize;

/// The K and V storage of a block pool: per layer, `blocks` blocks of
/// [`BLOCK_TOKENS`] rows of `kv_dim` f32s. Placed by the first batched
/// call where its backend computes: zeroed host memory (pages no block
/// touches cost no resident memory), or the partition's device memory,
/// with the block tables of the sequences it runs.
#[derive(Debug)]
pub struct KvBlocks {
    memory: KvMemory,
    layout: KvLayout,
    blocks: u32,
}

impl KvBlocks {
    /// Blocks in the pool.
    pub fn blocks(&self) -> u32 {
        self.blocks
    }
}

/// One sequence's part of a batched forward call.
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry<'a> {
    /// Tokens to run (a prefill chunk, or the one token of a decode step).
    pub tokens: &'a [u32],
    /// Positions the sequence already holds (where `tokens` start).
    pub start_pos: usize,
    /// Its block table, covering at least `start_pos + tokens.len()` positions.
    pub blocks: &'a [u32],
    /// Whether to return logits for its last token.
    pub logits: bool,
}

impl Model {
    /// How many bytes one token of KV cache takes (f32 K and V, every layer).
    pub fn kv_geometry(&self) -> Result<KvGeometry, PartitionError> {
        let c = self.config();
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        KvGeometry::new(
            small(c.layers),
            small(c.kv_heads),
            small(c.head_dim),
            KvDtype::F32,
        )
    }

    /// A zeroed pool of `blocks` KV blocks for this model.
    pub fn new_kv_blocks(&self, blocks: u32) -> KvBlocks {
        let c = self.config();
        KvBlocks {
            memory: KvMemory::Unplaced,
            layout: KvLayout {
                layers: c.layers,
                blocks: blocks as usize,
                block_tokens: BLOCK_TOKENS,
                kv_dim: c.kv_dim(),
                table_stride: (blocks as usize).min(c.context_length.div_ceil(BLOCK_TOKENS)),
            },
            blocks,
        }
    }

    /// Runs every entry's tokens in one forward pass (each matmul takes all
    /// their rows), writing their keys and values into their blocks; returns
    /// the logits of each entry that asked, in order (vocab floats each).
    /// Each entry's results are bit-identical to running it alone through
    /// [`Model::forward`] with a contiguous cache holding the same positions,
    /// as long as its tokens are one forward chunk there too.
    pub fn forward_batch(
        &self,
        backend: &dyn Backend,
        kv: &mut KvBlocks,
        entries: &[BatchEntry<'_>],
    ) -> Result<Vec<f32>, ForwardError> {
        let vocab = self.config().vocab_size;
        let context = self.config().context_length;
        let mut tokens = Vec::new();
        let mut segments = Vec::with_capacity(entries.len());
        let mut wanted = Vec::new();
        for e in entries {
            if let Some(&bad) = e.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(ForwardError::TokenOutOfRange { token: bad, vocab });
            }
            let end = e.start_pos + e.tokens.len();
            // A sequence never holds more blocks than the pool has (a
            // table that repeats blocks is no more room).
            let blocks = e.blocks.len().min(kv.blocks as usize);
            let capacity = (blocks * BLOCK_TOKENS).min(context);
            if e.tokens.is_empty() || end > capacity {
                return Err(ForwardError::ContextFull {
                    needed: end,
                    capacity,
                });
            }
            if let Some(&bad) = e.blocks.iter().find(|&&b| b >= kv.blocks) {
                return Err(ForwardError::BlockOutOfRange {
                    block: bad,
                    blocks: kv.blocks,
                });
            }
            tokens.extend_from_slice(e.tokens);
            segments.push(Segment {
                rows: e.tokens.len(),
                start_pos: e.start_pos,
            });
            if e.logits {
                wanted.push(tokens.len() - 1);
            }
        }
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let kv_dim = kv.layout.kv_dim;
        match kv.memory.place(backend, kv.layout)? {
            KvMemory::Host { k, v } => {
                let mut store = PagedStore {
                    k,
                    v,
                    kv_dim,
                    entries,
                };
                Ok(self.run_on_host(backend, &tokens, &segments, &mut store, &wanted)?)
            }
            KvMemory::Device(pool) => {
                let tables: Vec<&[u32]> = entries.iter().map(|e| e.blocks).collect();
                let step = StepRows {
                    tokens: &tokens,
                    segments: &segments,
                    tables: &tables,
                    wanted: &wanted,
                };
                Ok(self.run_on_device(backend, step, pool)?)
            }
            KvMemory::Unplaced => unreachable!("placed above"),
        }
    }
}

/// A host pool seen by one batched call.
struct PagedStore<'a> {
    k: &'a mut [ZeroedFloats],
    v: &'a mut [ZeroedFloats],
    kv_dim: usize,
    entries: &'a [BatchEntry<'a>],
}

impl KvStore for PagedStore<'_> {
    fn store(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        let kv_dim = self.kv_dim;
        let (kp, vp) = (&mut self.k[layer], &mut self.v[layer]);
        let mut row = 0;
        for e in self.entries {
            for pos in e.start_pos..e.start_pos + e.tokens.len() {
                let block = e.blocks[pos / BLOCK_TOKENS] as usize;
                let at = (block * BLOCK_TOKENS + pos % BLOCK_TOKENS) * kv_dim;
                let src = row * kv_dim..(row + 1) * kv_dim;
                kp[at..at + kv_dim].copy_from_slice(&k[src.clone()]);
                vp[at..at + kv_dim].copy_from_slice(&v[src]);
                row += 1;
            }
        }
    }

    fn attend(
        &self,
        backend: &dyn Backend,
        layer: usize,
        q: &[f32],
        h: Heads,
        out: &mut [f32],
    ) -> OpResult {
        let seqs: Vec<PagedSeq<'_>> = self
            .entries
            .iter()
            .map(|e| PagedSeq {
                n_tokens: e.tokens.len(),
                start_pos: e.start_pos,
                blocks: e.blocks,
            })
            .collect();
        let shape = PagedShape {
            block_tokens: BLOCK_TOKENS,
            n_heads: h.n_heads,
            n_kv_heads: h.n_kv_heads,
            head_dim: h.head_dim,
            scale: h.scale,
            mask: h.mask,
        };
        backend.attention_paged(q, &self.k[layer], &self.v[layer], &seqs, shape, out)
    }
}

#[cfg(test)]
mod tests;
