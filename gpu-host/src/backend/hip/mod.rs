//! The HIP backend: every op of [`Backend`] as a launch of the HIP kernels
//! (`kernels/hip`, loaded from `bulkhead_kernels::hip::CODE_OBJECTS`) on a
//! [`KernelDevice`] — the HIP runtime on a GPU, or the kernel emulator in
//! tests.
//!
//! **A first step, not the fast path.** The trait hands every op host f32
//! activations, so each op copies its activations (and, for attention, the
//! KV rows it reads) to the device and its result back. Only weights stay
//! on the device: each weight slice (a resident model's tensor, or a norm
//! vector) is uploaded when the model is loaded (`Model::preload`, through
//! [`Backend::preload`]) or else the first time an op sees it, and cached, keyed by
//! its host address and length, in a [`DeviceWeights`] that every
//! partition's backend on the device shares — weights are resident and
//! read-only for as long as their model is loaded. A paged attention call
//! copies the KV blocks it reads into a pair of device mirrors (K and V)
//! the backend keeps, sized to the largest pool seen. Device-resident
//! activations and KV blocks (a forward pass that stays on the device) are
//! the next step; they need a backend interface above the per-op one.
//!
//! Every op returns the device's error instead of panicking: out of memory
//! (the device's, or an allocation past the partition's budget), a failed
//! launch or copy, or a lost device. The partition's scheduler fails the
//! requests of that step and goes on; a lost device (a sticky fault, the
//! emulator gone) is out of service for every backend sharing it from then
//! on, and each op after that fails at once without touching it. A shape
//! mismatch is the caller's bug and panics, as it does on the CPU.

mod memory;
mod pass;

use std::sync::{Arc, Mutex};

use bulkhead_kernels::hip::{self, DeviceError, DeviceErrorKind, KernelArgs, KernelDevice, names};
use bulkhead_kernels::{
    Activation, AttentionShape, GgmlType, PagedSeq, PagedShape, QuantMatrix, RopeStyle, ScoreMask,
};

pub use memory::DeviceWeights;
use memory::{DeviceBuffer, FINGERPRINT_BYTES, ends, f32_bytes};
pub use pass::{DeviceKv, DevicePass, KvLayout, StepRows};

use crate::backend::{Backend, OpResult, RopeParams, WeightRef};

/// Positions per attention split: enough work per block to hide the
/// reduce pass, few enough that a 4096-position decode still spreads over
/// 16 splits × heads blocks.
const ATTENTION_SPLIT_POSITIONS: u32 = 256;

/// The HIP backend of one partition: launches (and activations, scratch
/// and its KV mirrors) on `device` — on a GPU a view whose stream is
/// limited to the partition's CUs and whose allocations are charged to the
/// partition's budget — and weights from a [`DeviceWeights`] cache that
/// every partition of the device shares.
#[derive(Debug)]
pub struct HipBackend {
    device: Arc<dyn KernelDevice>,
    weights: Arc<DeviceWeights>,
    /// The device mirrors of the K and V pools of the paged call running
    /// now, grown to the largest pool seen. Every call copies the blocks it
    /// reads into them first, so one pair serves every layer's pools (and
    /// a pool freed and replaced never leaves a mirror behind); the lock is
    /// held for the whole call.
    kv_mirrors: Mutex<[Option<DeviceBuffer>; 2]>,
    /// The buffers of resident passes ([`HipBackend::begin_pass`]), kept
    /// between steps; held for the whole pass.
    workspace: Mutex<pass::Workspace>,
}

/// `n` as a kernel's u32 argument; a size past it is a launch the kernels
/// cannot express.
fn as_u32(n: usize, what: &str) -> Result<u32, DeviceError> {
    u32::try_from(n)
        .map_err(|_| DeviceError::new("launch", format!("{what} {n} exceeds the kernels' u32")))
}

fn grid_for(n: u64, per_block: u32) -> Result<u32, DeviceError> {
    u32::try_from(n.div_ceil(u64::from(per_block))).map_err(|_| {
        DeviceError::new(
            "launch",
            format!("a grid for {n} items exceeds the kernels' u32"),
        )
    })
}

impl HipBackend {
    /// A backend launching on `device` (whose kernels must already be
    /// loaded: the HIP runtime loads the code object of its architecture),
    /// with a weight cache of its own on the same device.
    pub fn new(device: Arc<dyn KernelDevice>) -> HipBackend {
        let weights = DeviceWeights::new(Arc::clone(&device));
        HipBackend::sharing(device, weights)
    }

    /// A backend launching and allocating its scratch on `device`, reading
    /// weights from `weights` (which must be on the same device: one
    /// address space).
    pub fn sharing(device: Arc<dyn KernelDevice>, weights: Arc<DeviceWeights>) -> HipBackend {
        HipBackend {
            device,
            weights,
            kv_mirrors: Mutex::new([None, None]),
            workspace: Mutex::new(pass::Workspace::default()),
        }
    }

    /// Drops every cached weight (of every backend sharing the cache; ops
    /// running on them keep theirs until they return), this backend's KV
    /// mirrors and its pass workspace (call when models are unloaded).
    pub fn forget_weights(&self) {
        self.weights.clear();
        *self.kv_mirrors.lock().unwrap_or_else(|p| p.into_inner()) = [None, None];
        *self.workspace.lock().unwrap_or_else(|p| p.into_inner()) = pass::Workspace::default();
    }

    /// Bytes of weights cached on the device (shared with every backend
    /// using the same [`DeviceWeights`]).
    pub fn cached_weight_bytes(&self) -> usize {
        self.weights.bytes()
    }

    /// Device bytes of the pass workspace this backend keeps between steps
    /// (charged to its partition).
    pub fn workspace_bytes(&self) -> usize {
        self.workspace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bytes()
    }

    /// The weight cache this backend reads.
    pub fn weights(&self) -> &Arc<DeviceWeights> {
        &self.weights
    }

    /// The error that took this backend's device out of service, if one did.
    pub fn out_of_service(&self) -> Option<&DeviceError> {
        self.weights.lost()
    }

    /// Runs one op unless the device is out of service, and takes it out
    /// of service if the op finds it lost.
    fn guarded<T>(&self, op: impl FnOnce() -> Result<T, DeviceError>) -> Result<T, DeviceError> {
        if let Some(lost) = self.weights.lost() {
            return Err(DeviceError::lost(
                "the device is out of service",
                lost.to_string(),
            ));
        }
        let result = op();
        if let Err(e) = &result
            && e.kind == DeviceErrorKind::Lost
        {
            self.weights.mark_lost(e);
        }
        result
    }

    /// A quantized or float weight matrix's bytes on the device.
    fn weight(&self, bytes: &[u8]) -> Result<Arc<DeviceBuffer>, DeviceError> {
        let fingerprint = ends(bytes, FINGERPRINT_BYTES);
        self.weights
            .cached((bytes.as_ptr() as usize, bytes.len()), fingerprint, || {
                bytes.to_vec()
            })
    }

    /// A norm vector on the device.
    fn weight_f32(&self, v: &[f32]) -> Result<Arc<DeviceBuffer>, DeviceError> {
        let fingerprint = f32_bytes(&ends(v, FINGERPRINT_BYTES / 4));
        self.weights
            .cached((v.as_ptr() as usize, v.len() * 4), fingerprint, || {
                f32_bytes(v)
            })
    }

    fn launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        threads: u32,
        args: &dyn KernelArgs,
    ) -> OpResult {
        self.device.launch(kernel, grid, threads, &args.to_bytes())
    }

    fn rows_per_block(&self) -> u32 {
        hip::BLOCK_THREADS / self.device.wave_size()
    }

    /// A matvec's grid: a wave per weight row, a grid row per
    /// [`hip::MATVEC_TOKENS`] tokens.
    fn matvec_grid(&self, rows: usize, n_tokens: usize) -> Result<[u32; 3], DeviceError> {
        Ok([
            grid_for(rows as u64, self.rows_per_block())?,
            grid_for(n_tokens as u64, hip::MATVEC_TOKENS)?,
            1,
        ])
    }

    /// One weight row per wave against up to [`hip::MATVEC_TOKENS`]
    /// tokens: every row of the result computed exactly as a one-token
    /// call computes it.
    fn matvec(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]) -> OpResult {
        let (kernel, quant) = matvec_kernel(w.ty);
        let xd = DeviceBuffer::from_f32(&self.device, x)?;
        let acts = match quant {
            Some(q) => {
                let qd = DeviceBuffer::alloc(&self.device, q.bytes(n_tokens, w.cols))?;
                self.quantize(xd.addr, qd.addr, q, n_tokens, w.cols)?;
                Some(qd)
            }
            None => None,
        };
        let od = DeviceBuffer::alloc(&self.device, out.len() * 4)?;
        let wd = self.weight(w.data)?;
        let args = hip::MatArgs {
            w: wd.addr,
            x: acts.as_ref().unwrap_or(&xd).addr,
            out: od.addr,
            row_bytes: w.row_bytes() as u64,
            rows: as_u32(w.rows, "rows")?,
            cols: as_u32(w.cols, "cols")?,
            n_tokens: as_u32(n_tokens, "tokens")?,
            ty: w.ty.id(),
        };
        let grid = self.matvec_grid(w.rows, n_tokens)?;
        self.launch(kernel, grid, hip::BLOCK_THREADS, &args)?;
        od.read_f32(out)
    }

    /// Quantizes `n_tokens` rows of `cols` activations at `x` into
    /// `quant`'s blocks at `out` ([`Quant::bytes`] of them).
    fn quantize(&self, x: u64, out: u64, quant: Quant, n_tokens: usize, cols: usize) -> OpResult {
        let kernel = match quant {
            Quant::Q8_0 => names::QUANTIZE_Q8_0,
            Quant::Q8K => names::QUANTIZE_Q8_K,
        };
        let blocks = n_tokens * cols / quant.per_block();
        let args = hip::QuantizeArgs {
            x,
            out,
            n_tokens: as_u32(n_tokens, "tokens")?,
            cols: as_u32(cols, "cols")?,
        };
        self.launch(kernel, [grid_for(blocks as u64, 64)?, 1, 1], 64, &args)
    }

    fn matmul_tiled(
        &self,
        w: &QuantMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult {
        let xd = DeviceBuffer::from_f32(&self.device, x)?;
        let od = DeviceBuffer::alloc(&self.device, out.len() * 4)?;
        let wd = self.weight(w.data)?;
        let args = hip::MatArgs {
            w: wd.addr,
            x: xd.addr,
            out: od.addr,
            row_bytes: w.row_bytes() as u64,
            rows: as_u32(w.rows, "rows")?,
            cols: as_u32(w.cols, "cols")?,
            n_tokens: as_u32(n_tokens, "tokens")?,
            ty: w.ty.id(),
        };
        let tile = hip::MATMUL_TILE;
        let grid = [
            grid_for(w.rows as u64, tile)?,
            grid_for(n_tokens as u64, tile)?,
            1,
        ];
        self.launch(names::MATMUL_TILED, grid, hip::BLOCK_THREADS, &args)?;
        od.read_f32(out)
    }

    fn check_matmul(w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &[f32]) {
        if let Err(e) = QuantMatrix::new(w.ty, w.data, w.rows, w.cols) {
            panic!("matmul: {e}");
        }
        assert_eq!(
            x.len(),
            n_tokens * w.cols,
            "matmul: x is not n_tokens × cols"
        );
        assert_eq!(
            out.len(),
            n_tokens * w.rows,
            "matmul: out is not n_tokens × rows"
        );
    }

    /// Attention of `rows` query rows, row r at position `row_pos[r]`,
    /// reading its positions through `tables[row_table[r]..]`.
    #[allow(clippy::too_many_arguments)] // the paged call's pieces, named
    fn attend(
        &self,
        q: &[f32],
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        tables: &[u32],
        row_table: &[u32],
        row_pos: &[u32],
        shape: PagedShape,
        out: &mut [f32],
    ) -> OpResult {
        assert!(
            shape.head_dim <= hip::MAX_HEAD_DIM,
            "attention: head_dim {} exceeds the HIP kernels' {}",
            shape.head_dim,
            hip::MAX_HEAD_DIM
        );
        let rows = row_pos.len();
        if rows == 0 {
            return Ok(());
        }
        let max_pos = row_pos.iter().copied().max().unwrap_or(0);
        let n_splits = grid_for(u64::from(max_pos) + 1, ATTENTION_SPLIT_POSITIONS)?;
        let parts = rows * shape.n_heads * n_splits as usize;
        let dev = &self.device;
        let (qd, od) = (
            DeviceBuffer::from_f32(dev, q)?,
            DeviceBuffer::alloc(dev, out.len() * 4)?,
        );
        let (td, rtd, rpd) = (
            DeviceBuffer::from_u32(dev, tables)?,
            DeviceBuffer::from_u32(dev, row_table)?,
            DeviceBuffer::from_u32(dev, row_pos)?,
        );
        let po = DeviceBuffer::alloc(dev, parts * shape.head_dim * 4)?;
        let pml = DeviceBuffer::alloc(dev, parts * 2 * 4)?;
        let args = hip::AttentionArgs {
            q: qd.addr,
            k_pool: k.addr,
            v_pool: v.addr,
            tables: td.addr,
            row_table: rtd.addr,
            row_pos: rpd.addr,
            partial_o: po.addr,
            partial_ml: pml.addr,
            out: od.addr,
            n_rows: as_u32(rows, "rows")?,
            n_heads: as_u32(shape.n_heads, "heads")?,
            n_kv_heads: as_u32(shape.n_kv_heads, "kv heads")?,
            head_dim: as_u32(shape.head_dim, "head_dim")?,
            block_tokens: as_u32(shape.block_tokens, "block_tokens")?,
            split_positions: ATTENTION_SPLIT_POSITIONS,
            n_splits,
            scale: shape.scale,
        };
        let (heads, rows) = (args.n_heads, args.n_rows);
        self.launch(
            names::ATTENTION_PARTIAL,
            [n_splits, heads, rows],
            hip::BLOCK_THREADS,
            &args,
        )?;
        self.launch(
            names::ATTENTION_REDUCE,
            [heads, rows, 1],
            hip::BLOCK_THREADS,
            &args,
        )?;
        od.read_f32(out)
    }

    fn elementwise(&self, kernel: &str, a: &mut [f32], b: &[f32]) -> OpResult {
        assert_eq!(a.len(), b.len(), "{kernel}: length mismatch");
        if a.is_empty() {
            return Ok(());
        }
        let (ad, bd) = (
            DeviceBuffer::from_f32(&self.device, a)?,
            DeviceBuffer::from_f32(&self.device, b)?,
        );
        let args = hip::BinaryArgs {
            a: ad.addr,
            b: bd.addr,
            n: a.len() as u64,
        };
        // The kernels loop over the grid, so a bounded grid covers any length.
        let grid = grid_for(a.len() as u64, hip::BLOCK_THREADS)?.min(1024);
        self.launch(kernel, [grid, 1, 1], hip::BLOCK_THREADS, &args)?;
        ad.read_f32(a)
    }
}

impl Backend for HipBackend {
    fn name(&self) -> String {
        format!("hip ({})", self.device.describe())
    }

    fn resident(&self) -> Option<&HipBackend> {
        Some(self)
    }

    /// One token: the decode matvecs. Several: the tiled matmul (f32
    /// activations, dequantized weight tiles).
    fn matmul(&self, w: &QuantMatrix<'_>, x: &[f32], n_tokens: usize, out: &mut [f32]) -> OpResult {
        Self::check_matmul(w, x, n_tokens, out);
        self.guarded(|| match n_tokens {
            0 => Ok(()),
            1 => self.matvec(w, x, 1, out),
            _ => self.matmul_tiled(w, x, n_tokens, out),
        })
    }

    fn matmul_per_row(
        &self,
        w: &QuantMatrix<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult {
        Self::check_matmul(w, x, n_tokens, out);
        if n_tokens == 0 {
            return Ok(());
        }
        self.guarded(|| self.matvec(w, x, n_tokens, out))
    }

    fn embedding(&self, table: &QuantMatrix<'_>, token: u32, out: &mut [f32]) -> OpResult {
        assert!(
            (token as usize) < table.rows,
            "embedding: token {token} outside a table of {} rows",
            table.rows
        );
        assert_eq!(out.len(), table.cols, "embedding: out is not one row");
        self.guarded(|| {
            let od = DeviceBuffer::alloc(&self.device, out.len() * 4)?;
            let ids = DeviceBuffer::from_u32(&self.device, &[token])?;
            let td = self.weight(table.data)?;
            let args = hip::EmbeddingArgs {
                table: td.addr,
                tokens: ids.addr,
                out: od.addr,
                row_bytes: table.row_bytes() as u64,
                cols: as_u32(table.cols, "cols")?,
                ty: table.ty.id(),
            };
            let grid = grid_for(table.cols as u64, hip::BLOCK_THREADS)?;
            self.launch(names::EMBEDDING, [grid, 1, 1], hip::BLOCK_THREADS, &args)?;
            od.read_f32(out)
        })
    }

    fn rms_norm(&self, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> OpResult {
        let width = weight.len();
        assert!(
            x.len() == out.len() && width > 0 && x.len().is_multiple_of(width),
            "rms_norm: x and out must be whole rows of the weight's width"
        );
        self.guarded(|| {
            let (xd, od) = (
                DeviceBuffer::from_f32(&self.device, x)?,
                DeviceBuffer::alloc(&self.device, out.len() * 4)?,
            );
            let n_rows = x.len() / width;
            let wd = self.weight_f32(weight)?;
            let args = hip::RmsNormArgs {
                x: xd.addr,
                weight: wd.addr,
                out: od.addr,
                n_rows: as_u32(n_rows, "rows")?,
                width: as_u32(width, "width")?,
                eps,
                pad: 0,
            };
            self.launch(
                names::RMS_NORM,
                [args.n_rows, 1, 1],
                hip::BLOCK_THREADS,
                &args,
            )?;
            od.read_f32(out)
        })
    }

    fn rope(&self, x: &mut [f32], heads: usize, pos: usize, p: &RopeParams<'_>) -> OpResult {
        not_on_device(!p.is_plain(), "rope", "RoPE frequency factors and YaRN")?;
        assert_eq!(
            x.len(),
            heads * p.head_dim,
            "rope: x is not n_heads × head_dim"
        );
        assert!(
            p.rot_dim <= p.head_dim && p.rot_dim.is_multiple_of(2),
            "rope: rot_dim {} must be even and at most head_dim {}",
            p.rot_dim,
            p.head_dim
        );
        if p.rot_dim == 0 || heads == 0 {
            return Ok(());
        }
        self.guarded(|| {
            let xd = DeviceBuffer::from_f32(&self.device, x)?;
            let positions = DeviceBuffer::from_u32(&self.device, &[as_u32(pos, "position")?])?;
            let args = rope_args(xd.addr, positions.addr, 1, heads, p)?;
            let pairs = (heads * p.rot_dim / 2) as u64;
            self.launch(
                names::ROPE,
                [grid_for(pairs, hip::BLOCK_THREADS)?, 1, 1],
                hip::BLOCK_THREADS,
                &args,
            )?;
            xd.read_f32(x)
        })
    }

    /// The contiguous cache is the paged case with one block holding every position.
    fn attention(
        &self,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        shape: AttentionShape,
        out: &mut [f32],
    ) -> OpResult {
        let AttentionShape {
            n_tokens,
            start_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            mask,
        } = shape;
        not_on_device(
            mask != ScoreMask::default(),
            "attention",
            "a sliding window or score cap",
        )?;
        assert!(
            n_kv_heads > 0 && head_dim > 0 && n_heads.is_multiple_of(n_kv_heads),
            "attention: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}"
        );
        assert_eq!(
            q.len(),
            n_tokens * n_heads * head_dim,
            "attention: q is not n_tokens × n_heads·head_dim"
        );
        assert_eq!(out.len(), q.len(), "attention: out and q lengths differ");
        let n_ctx = start_pos + n_tokens;
        let seen = n_ctx * n_kv_heads * head_dim;
        assert!(
            k.len() >= seen && v.len() >= seen,
            "attention: KV cache shorter than {n_ctx} positions"
        );
        if n_tokens == 0 {
            return Ok(());
        }
        self.guarded(|| {
            let kd = DeviceBuffer::from_f32(&self.device, &k[..seen])?;
            let vd = DeviceBuffer::from_f32(&self.device, &v[..seen])?;
            let row_pos = (start_pos..n_ctx)
                .map(|p| as_u32(p, "position"))
                .collect::<Result<Vec<u32>, _>>()?;
            let shape = PagedShape {
                block_tokens: n_ctx,
                n_heads,
                n_kv_heads,
                head_dim,
                scale,
                mask,
            };
            self.attend(q, &kd, &vd, &[0], &vec![0; n_tokens], &row_pos, shape, out)
        })
    }

    /// The blocks the sequences' tables name are copied into the backend's
    /// K and V mirrors (grown to the pool's size) each call; the rest of a
    /// mirror is never read.
    fn attention_paged(
        &self,
        q: &[f32],
        k_pool: &[f32],
        v_pool: &[f32],
        seqs: &[PagedSeq<'_>],
        shape: PagedShape,
        out: &mut [f32],
    ) -> OpResult {
        let PagedShape {
            block_tokens,
            n_heads,
            n_kv_heads,
            head_dim,
            mask,
            ..
        } = shape;
        not_on_device(
            mask != ScoreMask::default(),
            "attention_paged",
            "a sliding window or score cap",
        )?;
        assert!(
            head_dim > 0 && block_tokens > 0,
            "attention_paged: zero size"
        );
        assert!(
            n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
            "attention_paged: n_heads {n_heads} is not a multiple of n_kv_heads {n_kv_heads}"
        );
        assert_eq!(
            k_pool.len(),
            v_pool.len(),
            "attention_paged: K and V pools differ"
        );
        let rows: usize = seqs.iter().map(|s| s.n_tokens).sum();
        assert_eq!(
            q.len(),
            rows * n_heads * head_dim,
            "attention_paged: q is not rows × width"
        );
        assert_eq!(
            out.len(),
            q.len(),
            "attention_paged: out and q lengths differ"
        );
        let block_floats = block_tokens * n_kv_heads * head_dim;
        let pool_blocks = k_pool.len() / block_floats;
        let (mut tables, mut row_table, mut row_pos) = (Vec::new(), Vec::new(), Vec::new());
        let mut used = vec![false; pool_blocks];
        for s in seqs {
            let n_ctx = s.start_pos + s.n_tokens;
            let needed = n_ctx.div_ceil(block_tokens);
            assert!(
                s.blocks.len() >= needed,
                "attention_paged: block table shorter than {n_ctx} positions"
            );
            let start = as_u32(tables.len(), "table entries")?;
            for &b in &s.blocks[..needed] {
                assert!(
                    (b as usize) < pool_blocks,
                    "attention_paged: block outside the pool"
                );
                used[b as usize] = true;
            }
            tables.extend_from_slice(s.blocks);
            for t in 0..s.n_tokens {
                row_table.push(start);
                row_pos.push(as_u32(s.start_pos + t, "position")?);
            }
        }
        if rows == 0 {
            return Ok(());
        }
        self.guarded(|| {
            let mut mirrors = self.kv_mirrors.lock().unwrap_or_else(|p| p.into_inner());
            for mirror in mirrors.iter_mut() {
                if mirror.as_ref().is_none_or(|m| m.len < k_pool.len() * 4) {
                    // The old one is freed first, so growing never needs both.
                    *mirror = None;
                    *mirror = Some(DeviceBuffer::alloc(&self.device, k_pool.len() * 4)?);
                }
            }
            let [Some(kd), Some(vd)] = &*mirrors else {
                unreachable!("both mirrors were just allocated")
            };
            for (b, _) in used.iter().enumerate().filter(|(_, u)| **u) {
                let range = b * block_floats..(b + 1) * block_floats;
                let at = (b * block_floats * 4) as u64;
                for (pool, dev) in [(k_pool, kd), (v_pool, vd)] {
                    self.device
                        .write(dev.addr + at, &f32_bytes(&pool[range.clone()]))?;
                }
            }
            self.attend(q, kd, vd, &tables, &row_table, &row_pos, shape, out)
        })
    }

    fn gated(&self, act: Activation, gate: &mut [f32], up: &[f32]) -> OpResult {
        not_on_device(act != Activation::Silu, "gated", "GELU")?;
        self.guarded(|| self.elementwise(names::SILU_MUL, gate, up))
    }

    fn scale(&self, _x: &mut [f32], _c: f32) -> OpResult {
        not_on_device(true, "scale", "scaling")
    }

    fn add(&self, a: &mut [f32], b: &[f32]) -> OpResult {
        self.guarded(|| self.elementwise(names::ADD, a, b))
    }

    /// Uploads the weight into the shared cache, as the first op to read
    /// it would (the same key, so that op finds it there).
    fn preload(&self, weight: WeightRef<'_>) -> OpResult {
        self.guarded(|| {
            match weight {
                WeightRef::Matrix(m) => drop(self.weight(m.data)?),
                WeightRef::Vector(v) => drop(self.weight_f32(v)?),
            }
            Ok(())
        })
    }
}

/// The error of an op whose `feature` the HIP kernels do not implement
/// (models that need one are refused before they reach a device:
/// `Model::check_device_support`).
pub(super) fn not_on_device(needed: bool, operation: &str, feature: &str) -> OpResult {
    if needed {
        return Err(DeviceError::new(
            operation,
            format!("{feature} is not implemented by the HIP kernels"),
        ));
    }
    Ok(())
}

/// `bh_rope`'s arguments for `n_tokens` rows of `heads` heads at `x`, row
/// `t` at the position `positions[t]`.
fn rope_args(
    x: u64,
    positions: u64,
    n_tokens: usize,
    heads: usize,
    p: &RopeParams<'_>,
) -> Result<hip::RopeArgs, DeviceError> {
    Ok(hip::RopeArgs {
        x,
        positions,
        n_tokens: as_u32(n_tokens, "tokens")?,
        n_heads: as_u32(heads, "heads")?,
        head_dim: as_u32(p.head_dim, "head_dim")?,
        rot_dim: as_u32(p.rot_dim, "rot_dim")?,
        freq_base: p.freq_base,
        freq_scale: p.freq_scale,
        style: match p.style {
            RopeStyle::Normal => hip::ROPE_NORMAL,
            RopeStyle::Neox => hip::ROPE_NEOX,
        },
        pad: 0,
    })
}

/// The matvec kernel for a weight type, and the activation blocks it
/// reads (`None`: f32 activations).
fn matvec_kernel(ty: GgmlType) -> (&'static str, Option<Quant>) {
    match ty {
        GgmlType::F16 => (names::MATVEC_F16, None),
        GgmlType::Q8_0 => (names::MATVEC_Q8_0, Some(Quant::Q8_0)),
        GgmlType::Q4_0 => (names::MATVEC_Q4_0, Some(Quant::Q8_0)),
        GgmlType::Q4K => (names::MATVEC_Q4_K, Some(Quant::Q8K)),
        GgmlType::Q6K => (names::MATVEC_Q6_K, Some(Quant::Q8K)),
        _ => (names::MATVEC_DEQUANT, None),
    }
}

/// The activation blocks a quantized weight type pairs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quant {
    Q8_0,
    Q8K,
}

impl Quant {
    /// Activations per block.
    fn per_block(self) -> usize {
        match self {
            Quant::Q8_0 => 32,
            Quant::Q8K => 256,
        }
    }

    /// Device bytes of `n_tokens` rows of `cols` activations in these blocks.
    fn bytes(self, n_tokens: usize, cols: usize) -> usize {
        let block = match self {
            Quant::Q8_0 => hip::Q8_0_DEVICE_BYTES,
            Quant::Q8K => hip::Q8_K_DEVICE_BYTES,
        };
        n_tokens * cols / self.per_block() * block
    }
}

#[cfg(test)]
mod tests;
