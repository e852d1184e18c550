//! A forward pass that stays on the device. The partition's backend keeps
//! a workspace (every activation buffer of a step, the quantized
//! activations, attention's partials, the step's inputs and the logits)
//! grown to the largest step seen and reused, so a decode step allocates
//! nothing; a KV pool ([`DeviceKv`]) holds every layer's keys and values
//! and its sequences' block tables in the partition's memory. A pool holds
//! device memory for the blocks up to the highest one used so far (the
//! pool hands out low blocks first), grown by doubling when a step first
//! reaches past it: the models of a partition share its memory by the
//! blocks they use, not by the blocks they could.
//!
//! Per step the host sends one copy of the step's rows (token id,
//! position, block-table row, 12 bytes each, and the index of each row
//! that wants logits) and the block-table entries that changed, and reads
//! back the wanted rows' logits: that read is the step's one
//! synchronization. Every launch between is queued on the partition's
//! stream. Sampling stays on the host (greedy, temperature, top-k and
//! top-p all read the logits row).

use std::sync::MutexGuard;

use bulkhead_kernels::hip::{self, DeviceError, names};
use bulkhead_kernels::{Activation, QuantMatrix, ScoreMask};

use super::memory::DeviceBuffer;
use super::{
    ATTENTION_SPLIT_POSITIONS, HipBackend, Quant, as_u32, grid_for, matvec_kernel, not_on_device,
    rope_args,
};
use crate::backend::pass::{Act, ForwardPass, Heads, PassShape, Segment, matmul_spans};
use crate::backend::{MoeFfn, OpResult, RopeParams};

/// How a KV pool is laid out: per layer, `blocks` blocks of
/// `block_tokens` positions of `kv_dim` f32s, for K and for V; each
/// sequence's block table takes `table_stride` entries of the device's
/// table (a contiguous cache is one block of its whole capacity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    pub blocks: usize,
    pub block_tokens: usize,
    pub kv_dim: usize,
    /// Most blocks one sequence can hold.
    pub table_stride: usize,
}

impl KvLayout {
    fn block_floats(&self) -> usize {
        self.block_tokens * self.kv_dim
    }

    /// Bytes of K and V together, every block.
    pub fn bytes(&self) -> usize {
        2 * self.layers * self.blocks * self.block_floats() * 4
    }
}

/// Blocks a fresh pool holds memory for.
const FIRST_BLOCKS: usize = 16;

/// A KV pool in device memory (charged to the partition that allocated
/// it), with the block tables of the sequences of its last step.
#[derive(Debug)]
pub struct DeviceKv {
    layout: KvLayout,
    /// Blocks `k` and `v` hold (per layer), at most `layout.blocks`.
    capacity: usize,
    k: DeviceBuffer,
    v: DeviceBuffer,
    tables: Slot,
    /// What `tables` holds on the device, so a step uploads only the
    /// entries that changed (a sequence's new block, a batch reordered).
    shadow: Vec<u32>,
}

impl DeviceKv {
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Floats of one layer's K (or V) as allocated now.
    fn layer_floats(&self) -> usize {
        self.capacity * self.layout.block_floats()
    }

    /// Makes room for block `block`: doubles the allocation until it fits
    /// (at most the layout's blocks) and copies every layer's blocks over,
    /// on the device.
    fn reach(&mut self, hip: &HipBackend, block: usize) -> OpResult {
        if block < self.capacity {
            return Ok(());
        }
        let capacity = (block + 1).next_power_of_two().min(self.layout.blocks);
        let layer = capacity * self.layout.block_floats();
        let bytes = self.layout.layers * layer * 4;
        let (k, v) = (
            DeviceBuffer::alloc(&hip.device, bytes)?,
            DeviceBuffer::alloc(&hip.device, bytes)?,
        );
        let old = self.layer_floats();
        for l in 0..self.layout.layers {
            for (to, from) in [(&k, &self.k), (&v, &self.v)] {
                let args = hip::BinaryArgs {
                    a: to.addr + (l * layer * 4) as u64,
                    b: from.addr + (l * old * 4) as u64,
                    n: old as u64,
                };
                let grid = DevicePass::elementwise_grid(old)?;
                hip.launch(names::COPY, grid, hip::BLOCK_THREADS, &args)?;
            }
        }
        (self.k, self.v, self.capacity) = (k, v, capacity);
        Ok(())
    }
}

/// A device buffer grown on demand and reused: a workspace entry.
#[derive(Debug, Default)]
struct Slot(Option<DeviceBuffer>);

impl Slot {
    fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |b| b.len)
    }

    /// The buffer's address, reallocated first if it holds fewer than
    /// `bytes` (rounded up to a power of two, so a growing step size
    /// reallocates a few times, not every step).
    fn ensure(&mut self, hip: &HipBackend, bytes: usize) -> Result<u64, DeviceError> {
        match &self.0 {
            Some(b) if b.len >= bytes => Ok(b.addr),
            _ => {
                // The old one is freed first, so growing never needs both.
                self.0 = None;
                let b = DeviceBuffer::alloc(&hip.device, bytes.next_power_of_two().max(256))?;
                let addr = b.addr;
                self.0 = Some(b);
                Ok(addr)
            }
        }
    }
}

/// The partition's buffers for passes, kept between steps.
#[derive(Debug, Default)]
pub(super) struct Workspace {
    acts: [Slot; 9],
    quantized: Slot,
    partial_o: Slot,
    partial_ml: Slot,
    inputs: Slot,
    picked: Slot,
    normed: Slot,
    logits: Slot,
}

impl Workspace {
    /// Device bytes held.
    pub(super) fn bytes(&self) -> usize {
        let Workspace {
            acts,
            quantized,
            partial_o,
            partial_ml,
            inputs,
            picked,
            normed,
            logits,
        } = self;
        acts.iter()
            .chain([
                quantized, partial_o, partial_ml, inputs, picked, normed, logits,
            ])
            .map(Slot::bytes)
            .sum()
    }
}

/// What a step runs: `tokens` are the rows of `segments` in order (one
/// segment per sequence), `tables[i]` the block table of segment `i`, and
/// `wanted` the rows whose logits come back.
#[derive(Clone, Copy, Debug)]
pub struct StepRows<'a> {
    pub tokens: &'a [u32],
    pub segments: &'a [Segment],
    pub tables: &'a [&'a [u32]],
    pub wanted: &'a [usize],
}

impl HipBackend {
    /// A zeroed KV pool of `layout` in this backend's memory (its
    /// partition's budget).
    pub fn alloc_kv(&self, layout: KvLayout) -> Result<DeviceKv, DeviceError> {
        self.guarded(|| {
            let capacity = layout.blocks.min(FIRST_BLOCKS);
            let bytes = layout.layers * capacity * layout.block_floats() * 4;
            Ok(DeviceKv {
                layout,
                capacity,
                k: DeviceBuffer::alloc(&self.device, bytes)?,
                v: DeviceBuffer::alloc(&self.device, bytes)?,
                tables: Slot::default(),
                shadow: Vec::new(),
            })
        })
    }

    /// Starts a pass of `step` over `kv`: uploads the step's rows and the
    /// block-table entries that changed, and sizes the workspace.
    pub fn begin_pass<'a>(
        &'a self,
        shape: PassShape,
        step: StepRows<'a>,
        kv: &'a mut DeviceKv,
    ) -> Result<DevicePass<'a>, DeviceError> {
        assert_eq!(
            step.tables.len(),
            step.segments.len(),
            "a table per segment"
        );
        let rows = step.tokens.len();
        assert_eq!(
            rows,
            step.segments.iter().map(|s| s.rows).sum::<usize>(),
            "tokens are the segments' rows"
        );
        assert!(
            shape.head_dim <= hip::MAX_HEAD_DIM,
            "attention: head_dim {} exceeds the HIP kernels' {}",
            shape.head_dim,
            hip::MAX_HEAD_DIM
        );
        let layout = kv.layout;
        assert_eq!(
            (layout.layers, layout.kv_dim),
            (shape.layers, shape.kv),
            "the KV pool is another model's"
        );
        self.guarded(|| {
            let mut ws = self.workspace.lock().unwrap_or_else(|p| p.into_inner());
            // Row inputs: token id, position, where its table starts; then
            // the wanted rows. One copy.
            let mut inputs = Vec::with_capacity(3 * rows + step.wanted.len());
            inputs.extend_from_slice(step.tokens);
            let mut max_pos = 0;
            for s in step.segments {
                for p in s.start_pos..s.start_pos + s.rows {
                    inputs.push(as_u32(p, "position")?);
                    max_pos = max_pos.max(p);
                }
            }
            for (i, s) in step.segments.iter().enumerate() {
                let start = as_u32(i * layout.table_stride, "table entries")?;
                inputs.extend(std::iter::repeat_n(start, s.rows));
            }
            for &w in step.wanted {
                inputs.push(as_u32(w, "row")?);
            }
            let inputs_addr = ws.inputs.ensure(self, inputs.len() * 4)?;
            self.device.write(inputs_addr, &u32_bytes(&inputs))?;
            let tables = upload_tables(self, kv, step)?;

            let mut act = [0u64; 9];
            for a in Act::ALL {
                act[a.index()] = ws.acts[a.index()].ensure(self, rows * a.width(&shape) * 4)?;
            }
            // Partials for the longest context the model allows, so a
            // growing sequence never reallocates them mid-decode.
            let max_splits = shape.context.div_ceil(ATTENTION_SPLIT_POSITIONS as usize);
            let parts = rows * shape.heads * max_splits.max(1);
            let partial_o = ws.partial_o.ensure(self, parts * shape.head_dim * 4)?;
            let partial_ml = ws.partial_ml.ensure(self, parts * 2 * 4)?;
            // Quantized activations for the widest input, in either block
            // kind, so no quantization is reallocated (and lost) mid-pass.
            let widest = shape.embedding.max(shape.q).max(shape.ffn);
            let quantized = ws.quantized.ensure(
                self,
                Quant::Q8_0
                    .bytes(rows, widest)
                    .max(Quant::Q8K.bytes(rows, widest.next_multiple_of(256))),
            )?;
            let wanted = step.wanted.len();
            let picked = ws.picked.ensure(self, wanted * shape.embedding * 4)?;
            let normed = ws.normed.ensure(self, wanted * shape.embedding * 4)?;
            let logits = ws.logits.ensure(self, wanted * shape.vocab * 4)?;
            let at = |i: usize| inputs_addr + 4 * i as u64;
            Ok(DevicePass {
                hip: self,
                _workspace: ws,
                kv,
                shape,
                segments: step.segments,
                rows,
                wanted,
                act,
                tokens: at(0),
                positions: at(rows),
                row_table: at(2 * rows),
                wanted_rows: at(3 * rows),
                tables,
                partial_o,
                partial_ml,
                n_splits: grid_for(max_pos as u64 + 1, ATTENTION_SPLIT_POSITIONS)?,
                quantized: None,
                quantized_addr: quantized,
                picked,
                normed,
                logits,
            })
        })
    }
}

/// Writes the step's block tables (segment `i` at entry `i × stride`)
/// where they differ from what the device holds; returns their address.
fn upload_tables(
    hip: &HipBackend,
    kv: &mut DeviceKv,
    step: StepRows<'_>,
) -> Result<u64, DeviceError> {
    let layout = kv.layout;
    let stride = layout.table_stride;
    let mut full = vec![0u32; step.segments.len() * stride];
    for (i, (s, table)) in step.segments.iter().zip(step.tables).enumerate() {
        let needed = (s.start_pos + s.rows).div_ceil(layout.block_tokens);
        assert!(
            needed <= stride && needed <= table.len(),
            "a block table shorter than its sequence's {} positions",
            s.start_pos + s.rows
        );
        for &b in &table[..needed] {
            assert!((b as usize) < layout.blocks, "block {b} outside the pool");
        }
        full[i * stride..i * stride + needed].copy_from_slice(&table[..needed]);
    }
    if let Some(&highest) = full.iter().max() {
        kv.reach(hip, highest as usize)?;
    }
    let had = kv.tables.bytes();
    let addr = kv.tables.ensure(hip, full.len() * 4)?;
    if kv.tables.bytes() != had {
        kv.shadow.clear(); // a new buffer: nothing of it is known
    }
    // Each run of changed entries is one copy; runs closer than a few
    // entries merge (one copy of a few unchanged bytes beats two copies).
    const MERGE_GAP: usize = 8;
    let differs = |i: usize| kv.shadow.get(i) != Some(&full[i]);
    let mut i = 0;
    while let Some(first) = (i..full.len()).find(|&j| differs(j)) {
        let mut last = first;
        let mut j = first + 1;
        while j < full.len() && j <= last + MERGE_GAP {
            if differs(j) {
                last = j;
            }
            j += 1;
        }
        hip.device
            .write(addr + 4 * first as u64, &u32_bytes(&full[first..=last]))?;
        i = last + 1;
    }
    kv.shadow = full;
    Ok(addr)
}

fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One pass on the device ([`HipBackend::begin_pass`]): addresses of the
/// step's buffers, every op a queued launch.
pub struct DevicePass<'a> {
    hip: &'a HipBackend,
    /// Held for the pass: the workspace is the partition's, one step at a time.
    _workspace: MutexGuard<'a, Workspace>,
    kv: &'a DeviceKv,
    shape: PassShape,
    segments: &'a [Segment],
    rows: usize,
    wanted: usize,
    act: [u64; 9],
    tokens: u64,
    positions: u64,
    row_table: u64,
    wanted_rows: u64,
    tables: u64,
    partial_o: u64,
    partial_ml: u64,
    n_splits: u32,
    /// The activation whose rows the quantized buffer holds, and in which
    /// blocks: Q, K and V (gate and up) read one quantization of Xn.
    quantized: Option<(Act, Quant)>,
    quantized_addr: u64,
    picked: u64,
    normed: u64,
    logits: u64,
}

impl std::fmt::Debug for DevicePass<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePass")
            .field("rows", &self.rows)
            .field("wanted", &self.wanted)
            .finish_non_exhaustive()
    }
}

/// Where a matmul's f32 input is: an activation (whose quantization the
/// pass may reuse) or another buffer.
#[derive(Clone, Copy)]
enum Input {
    Act(Act),
    Addr(u64),
}

impl DevicePass<'_> {
    fn addr(&self, a: Act) -> u64 {
        self.act[a.index()]
    }

    /// `a` is about to change: a quantization of it is stale.
    fn writes(&mut self, a: Act) {
        if self.quantized.is_some_and(|(q, _)| q == a) {
            self.quantized = None;
        }
    }

    fn launch(&self, kernel: &str, grid: [u32; 3], args: &dyn hip::KernelArgs) -> OpResult {
        self.hip
            .guarded(|| self.hip.launch(kernel, grid, hip::BLOCK_THREADS, args))
    }

    /// An element-wise launch over `n` floats (the kernels loop over the
    /// grid, so a bounded grid covers any length).
    fn elementwise_grid(n: usize) -> Result<[u32; 3], DeviceError> {
        Ok([grid_for(n as u64, hip::BLOCK_THREADS)?.clamp(1, 1024), 1, 1])
    }

    /// `a = kernel(a, b)` over every row (`bh_add`, `bh_silu_mul`).
    fn binary(&mut self, kernel: &str, a: Act, b: Act) -> OpResult {
        self.writes(a);
        let n = self.rows * a.width(&self.shape);
        let args = hip::BinaryArgs {
            a: self.addr(a),
            b: self.addr(b),
            n: n as u64,
        };
        self.launch(kernel, Self::elementwise_grid(n)?, &args)
    }

    /// `out[at..at + len] = w · x[at..at + len]`, rows of an `n`-row input.
    /// One row (or a run of decode rows): the matvec, each row as a one-row
    /// call; several rows of one sequence: the tiled matmul.
    #[allow(clippy::too_many_arguments)] // a sub-range of a matmul, named
    fn matmul_rows(
        &mut self,
        w: &QuantMatrix<'_>,
        x: Input,
        n: usize,
        at: usize,
        len: usize,
        per_row: bool,
        out: u64,
    ) -> OpResult {
        let wd = self.hip.weight(w.data)?;
        let x_addr = match x {
            Input::Act(a) => self.addr(a),
            Input::Addr(addr) => addr,
        };
        let mut args = hip::MatArgs {
            w: wd.addr,
            x: x_addr + (at * w.cols * 4) as u64,
            out: out + (at * w.rows * 4) as u64,
            row_bytes: w.row_bytes() as u64,
            rows: as_u32(w.rows, "rows")?,
            cols: as_u32(w.cols, "cols")?,
            n_tokens: as_u32(len, "tokens")?,
            ty: w.ty.id(),
        };
        if !per_row {
            let tile = hip::MATMUL_TILE;
            let grid = [
                grid_for(w.rows as u64, tile)?,
                grid_for(len as u64, tile)?,
                1,
            ];
            return self.launch(names::MATMUL_TILED, grid, &args);
        }
        let (kernel, quant) = matvec_kernel(w.ty);
        if let Some(q) = quant {
            let fresh = match x {
                Input::Act(a) => self.quantized != Some((a, q)),
                Input::Addr(_) => true,
            };
            let qd = self.quantized_addr;
            if fresh {
                self.hip
                    .guarded(|| self.hip.quantize(x_addr, qd, q, n, w.cols))?;
                self.quantized = match x {
                    Input::Act(a) => Some((a, q)),
                    Input::Addr(_) => None,
                };
            }
            args.x = qd + q.bytes(at, w.cols) as u64;
        }
        let grid = self.hip.matvec_grid(w.rows, len)?;
        self.launch(kernel, grid, &args)
    }
}

impl ForwardPass for DevicePass<'_> {
    fn embed(&mut self, table: &QuantMatrix<'_>, out: Act) -> OpResult {
        self.writes(out);
        let td = self.hip.weight(table.data)?;
        let args = hip::EmbeddingArgs {
            table: td.addr,
            tokens: self.tokens,
            out: self.addr(out),
            row_bytes: table.row_bytes() as u64,
            cols: as_u32(table.cols, "cols")?,
            ty: table.ty.id(),
        };
        let grid = [
            grid_for(table.cols as u64, hip::BLOCK_THREADS)?,
            as_u32(self.rows, "rows")?,
            1,
        ];
        self.launch(names::EMBEDDING, grid, &args)
    }

    fn rms_norm(&mut self, x: Act, weight: &[f32], eps: f32, out: Act) -> OpResult {
        self.writes(out);
        let wd = self.hip.weight_f32(weight)?;
        let args = hip::RmsNormArgs {
            x: self.addr(x),
            weight: wd.addr,
            out: self.addr(out),
            n_rows: as_u32(self.rows, "rows")?,
            width: as_u32(weight.len(), "width")?,
            eps,
            pad: 0,
        };
        self.launch(names::RMS_NORM, [args.n_rows, 1, 1], &args)
    }

    fn matmul(&mut self, w: &QuantMatrix<'_>, x: Act, out: Act) -> OpResult {
        assert_eq!(w.cols, x.width(&self.shape), "matmul: input width");
        assert_eq!(w.rows, out.width(&self.shape), "matmul: output width");
        self.writes(out);
        let out = self.addr(out);
        for span in matmul_spans(self.segments) {
            // A lone row is a matvec either way.
            let per_row = span.per_row || span.rows == 1;
            self.matmul_rows(
                w,
                Input::Act(x),
                self.rows,
                span.at,
                span.rows,
                per_row,
                out,
            )?;
        }
        Ok(())
    }

    fn add_bias(&mut self, x: Act, bias: &[f32]) -> OpResult {
        self.writes(x);
        let bd = self.hip.weight_f32(bias)?;
        let n = self.rows * bias.len();
        let args = hip::AddRowsArgs {
            a: self.addr(x),
            b: bd.addr,
            n: n as u64,
            width: as_u32(bias.len(), "width")?,
            pad: 0,
        };
        self.launch(names::ADD_ROWS, Self::elementwise_grid(n)?, &args)
    }

    fn scale(&mut self, _x: Act, _c: f32) -> OpResult {
        not_on_device(true, "scale", "scaling")
    }

    fn head_norm(&mut self, _x: Act, _weight: &[f32], _eps: f32) -> OpResult {
        not_on_device(true, "head_norm", "query and key norms")
    }

    fn rope(&mut self, x: Act, heads: usize, params: &RopeParams<'_>) -> OpResult {
        not_on_device(
            !params.is_plain(),
            "rope",
            "RoPE frequency factors and YaRN",
        )?;
        if params.rot_dim == 0 || heads == 0 {
            return Ok(());
        }
        self.writes(x);
        let args = rope_args(self.addr(x), self.positions, self.rows, heads, params)?;
        let pairs = (self.rows * heads * params.rot_dim / 2) as u64;
        self.launch(
            names::ROPE,
            [grid_for(pairs, hip::BLOCK_THREADS)?, 1, 1],
            &args,
        )
    }

    fn store_kv(&mut self, layer: usize, k: Act, v: Act) -> OpResult {
        let layout = self.kv.layout;
        let offset = (layer * self.kv.layer_floats() * 4) as u64;
        let args = hip::KvStoreArgs {
            k: self.addr(k),
            v: self.addr(v),
            k_pool: self.kv.k.addr + offset,
            v_pool: self.kv.v.addr + offset,
            tables: self.tables,
            row_table: self.row_table,
            row_pos: self.positions,
            n_rows: as_u32(self.rows, "rows")?,
            kv_dim: as_u32(layout.kv_dim, "kv_dim")?,
            block_tokens: as_u32(layout.block_tokens, "block_tokens")?,
            pad: 0,
        };
        let grid = [
            grid_for(layout.kv_dim as u64, hip::BLOCK_THREADS)?,
            args.n_rows,
            1,
        ];
        self.launch(names::KV_STORE, grid, &args)
    }

    fn attend(&mut self, layer: usize, q: Act, heads: Heads, out: Act) -> OpResult {
        assert!(
            heads.n_kv_heads > 0 && heads.n_heads.is_multiple_of(heads.n_kv_heads),
            "attention: n_heads {} is not a multiple of n_kv_heads {}",
            heads.n_heads,
            heads.n_kv_heads
        );
        not_on_device(
            heads.mask != ScoreMask::default(),
            "attention",
            "a sliding window or score cap",
        )?;
        self.writes(out);
        let layout = self.kv.layout;
        let offset = (layer * self.kv.layer_floats() * 4) as u64;
        let args = hip::AttentionArgs {
            q: self.addr(q),
            k_pool: self.kv.k.addr + offset,
            v_pool: self.kv.v.addr + offset,
            tables: self.tables,
            row_table: self.row_table,
            row_pos: self.positions,
            partial_o: self.partial_o,
            partial_ml: self.partial_ml,
            out: self.addr(out),
            n_rows: as_u32(self.rows, "rows")?,
            n_heads: as_u32(heads.n_heads, "heads")?,
            n_kv_heads: as_u32(heads.n_kv_heads, "kv heads")?,
            head_dim: as_u32(heads.head_dim, "head_dim")?,
            block_tokens: as_u32(layout.block_tokens, "block_tokens")?,
            split_positions: ATTENTION_SPLIT_POSITIONS,
            n_splits: self.n_splits,
            scale: heads.scale,
        };
        let (h, r) = (args.n_heads, args.n_rows);
        self.launch(names::ATTENTION_PARTIAL, [self.n_splits, h, r], &args)?;
        self.launch(names::ATTENTION_REDUCE, [h, r, 1], &args)
    }

    fn add(&mut self, a: Act, b: Act) -> OpResult {
        self.binary(names::ADD, a, b)
    }

    fn gated(&mut self, act: Activation, gate: Act, up: Act) -> OpResult {
        not_on_device(act != Activation::Silu, "gated", "GELU")?;
        self.binary(names::SILU_MUL, gate, up)
    }

    /// No device kernels for it yet: a model that needs it is refused when
    /// it is loaded for a device (the engine's `Model::check_device_support`);
    /// this only backs that up.
    fn moe_ffn(&mut self, _moe: &MoeFfn<'_>, _x: Act, _out: Act) -> OpResult {
        Err(DeviceError::new(
            "moe_ffn",
            "the device backend has no mixture-of-experts FFN",
        ))
    }

    /// Gathers the wanted rows, normalizes them, projects them, and reads
    /// the logits back: the pass's one synchronization (a step that wants
    /// none waits for its queued work instead, so each step ends with
    /// exactly one).
    fn logits(
        &mut self,
        x: Act,
        norm: &[f32],
        eps: f32,
        output: &QuantMatrix<'_>,
    ) -> Result<Vec<f32>, DeviceError> {
        let wanted = self.wanted;
        if wanted == 0 {
            self.hip.guarded(|| self.hip.device.synchronize())?;
            return Ok(Vec::new());
        }
        let d = self.shape.embedding;
        let gather = hip::GatherArgs {
            x: self.addr(x),
            rows: self.wanted_rows,
            out: self.picked,
            n_rows: as_u32(wanted, "rows")?,
            width: as_u32(d, "width")?,
        };
        let grid = [grid_for(d as u64, hip::BLOCK_THREADS)?, gather.n_rows, 1];
        self.launch(names::GATHER_ROWS, grid, &gather)?;
        let nd = self.hip.weight_f32(norm)?;
        let args = hip::RmsNormArgs {
            x: self.picked,
            weight: nd.addr,
            out: self.normed,
            n_rows: gather.n_rows,
            width: gather.width,
            eps,
            pad: 0,
        };
        self.launch(names::RMS_NORM, [args.n_rows, 1, 1], &args)?;
        // One sequence's rows are one matmul (evaluation), as on the host;
        // rows of several sequences are each a one-row projection.
        let per_row = wanted == 1 || self.segments.len() > 1;
        let (normed, logits) = (self.normed, self.logits);
        self.matmul_rows(
            output,
            Input::Addr(normed),
            wanted,
            0,
            wanted,
            per_row,
            logits,
        )?;
        let mut out = vec![0.0f32; wanted * self.shape.vocab];
        let mut bytes = vec![0u8; out.len() * 4];
        self.hip
            .guarded(|| self.hip.device.read(logits, &mut bytes))?;
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(out)
    }
}
