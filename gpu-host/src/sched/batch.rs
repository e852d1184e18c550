//! Iteration-level continuous batching of one model: sequences join and
//! leave between steps, and each step runs every chosen sequence's next
//! tokens as one batched forward pass over the paged KV pool.
//!
//! A step:
//! 1. **Leave**: sequences whose sink says stop (client gone, model out of
//!    service) release their blocks before anything runs.
//! 2. **Choose** work, weighted-fair across tenants on tokens, priority
//!    then age within a tenant:
//!    - *decode rows*: at most `max_rows` of the sequences that are
//!      decoding, chosen by `bulkhead-partition`'s `RowPicker` (deficit
//!      round robin where a round is a step) when more decode than that —
//!      so a tenant with many sequences gets its weight's part of the
//!      rows, not one row per sequence; a tenant's `max_rows` cap (its
//!      `cus` or `share` of the pool) holds while others have sequences
//!      left out; a tenant alone uses every row;
//!    - *prefill*: by deficit round robin (`Drr`) over the sequences
//!      still prefilling, each item its next chunk (up to
//!      [`BATCH_PREFILL_CHUNK`] of the prompt, and for a waiting sequence
//!      its first chunk, which admits it while fewer than `max_running`
//!      hold KV), at most [`BATCH_PREFILL_CHUNK`] prompt tokens per step —
//!      so a long prompt is spread over several steps instead of stalling
//!      the decodes around it.
//! 3. **Blocks**: each chosen sequence gets the blocks its chunk needs from
//!    the `KvPool`; an empty pool preempts by the pool's rule (a tenant over
//!    its guarantee first; the victim recomputes later) or the requester waits.
//! 4. **Run** one `forward_batch`, then sample every sequence whose chunk
//!    completed its input; finished sequences leave and free their blocks.
//!
//! Admission reserves prompt + `max_tokens` of the tenant's budget. How
//! tenants share the pool comes from their partition's plan
//! ([`TenantShare`]): a tenant with its own memory (`hbm`) is guaranteed
//! that many blocks and may hold no more; the others split what no `hbm`
//! claims by weight among the tenants active here (with a sequence), each
//! guaranteed its weighted part and allowed to borrow the rest while others
//! leave it idle. A tenant the plan does not list has weight 1 and no memory
//! of its own (so with no plan every active tenant gets an equal share).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use bulkhead_partition::{
    DEFAULT_QUANTUM_TOKENS, Drr, KvPool, PartitionError, RowCandidate, RowPicker, RowTerms, SeqId,
    TenantBlocks, Victim,
};

use crate::backend::Backend;
use crate::engine::{Decoded, Decoding, GenerateError, GenerateRequest, Next, Piece};
use crate::engine::{ForwardError, Model, PREFILL_CHUNK};

/// Prompt tokens one step may run, at most (one chunk).
///
/// 64, not the lone run's 256 ([`PREFILL_CHUNK`]): every running sequence
/// waits for the whole step, so the chunk is the decode stall a joining
/// prompt causes. Prefill is compute-bound on the CPU (the multi-token
/// kernels), so a smaller chunk costs little prefill speed — the weights
/// are read once per chunk, ~6 ms for the ~110M Q8_0 bench model against
/// ~150 ms of compute for 64 tokens on the 2-core dev box, where a 256-token
/// chunk stalls decodes ~0.6 s. Below ~32 the re-reads start to show.
/// And 64 divides 256: chunk boundaries, the multi-token kernels' groups of
/// four and the element-wise kernels' 8-wide lanes all fall on the same
/// positions as in a lone run, so rows stay bit-identical to `generate`.
pub const BATCH_PREFILL_CHUNK: usize = 64;

const _: () = assert!(PREFILL_CHUNK.is_multiple_of(BATCH_PREFILL_CHUNK));
use crate::Tokenizer;
use crate::engine::{BLOCK_TOKENS, BatchEntry, KvBlocks};

mod budget;
use budget::Holding;
pub use budget::PartitionKv;

/// Where one sequence's output goes; the batcher calls it from its thread.
pub trait SequenceSink {
    /// The sequence joined the batch (it holds KV blocks from now on).
    fn started(&mut self);
    /// Streamed output; `Break` when the receiver is gone.
    fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()>;
    /// Asked before every step; `Break` stops the sequence at once (the
    /// sink has told its receiver why, if anyone is listening).
    fn check(&mut self) -> ControlFlow<()>;
    /// The end of a sequence that was not stopped by `check` or `piece`.
    fn finished(&mut self, result: Result<Decoded, SequenceError>);
}

/// Why a sequence ended without output.
#[derive(Debug, thiserror::Error)]
pub enum SequenceError {
    /// Its prompt + `max_tokens` fit its tenant's budget, but its other
    /// sequences held the rest of it for longer than the tenant's KV wait.
    #[error(
        "kv_budget_exceeded: the request needs {needed_tokens} tokens of KV cache \
         (prompt + max_tokens) and tenant `{tenant}` had {available_tokens} left of its \
         budget for {waited_ms} ms (its kv_wait_ms); retry when its other requests end"
    )]
    KvWait {
        tenant: String,
        needed_tokens: u64,
        available_tokens: u64,
        waited_ms: u128,
    },
    /// Its prompt + `max_tokens` can never fit its tenant's share of the pool.
    #[error(
        "kv_budget_exceeded: the request needs {needed_tokens} tokens of KV cache \
         (prompt + max_tokens) and tenant `{tenant}` has {available_tokens} {of}"
    )]
    KvBudget {
        tenant: String,
        needed_tokens: u64,
        available_tokens: u64,
        of: &'static str,
    },
    #[error(transparent)]
    Generate(#[from] GenerateError),
    #[error("KV accounting: {0}")]
    Accounting(PartitionError),
    /// A step of its batch failed past recovery (on a device: a failed
    /// launch, or an allocation past the partition's budget) and the batch
    /// was dropped; the text is the failure's own.
    #[error("generation failed: {0}")]
    StepFailed(String),
}

/// Limits of one batcher.
#[derive(Clone, Copy, Debug)]
pub struct BatchLimits {
    /// Sequences holding KV at once. More than `max_rows` lets each step
    /// choose its rows fairly across tenants instead of running whichever
    /// sequences got in first.
    pub max_running: usize,
    /// Decode rows one step runs, at most.
    pub max_rows: usize,
    /// Blocks in the model's KV pool.
    pub kv_blocks: u32,
}

/// How one tenant shares a batcher's pool (from its partition's plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantShare {
    /// Deficit round robin weight (tokens per turn ∝ weight); at least 1.
    pub weight: u32,
    /// Blocks of its own (`hbm`): guaranteed, and the most it may hold.
    /// `None`: a weighted part of the blocks no tenant owns.
    pub own_blocks: Option<u64>,
    /// How long a request that fits the tenant's budget, but not what its
    /// other sequences leave of it, waits to be admitted before it is
    /// refused (`kv_budget_exceeded`).
    pub kv_wait: Duration,
    /// The most decode rows of a step it gets while other tenants have
    /// sequences left out (a shared tenant's `cus` or `share` of the
    /// pool); `None`: no cap.
    pub max_rows: Option<usize>,
}

/// The KV wait of a tenant that sets none: long enough to ride out a
/// burst of its own requests finishing, short enough that a client is
/// told rather than left hanging behind a stuck budget.
pub const DEFAULT_KV_WAIT: Duration = Duration::from_secs(10);

/// The longest KV wait a tenant may ask for.
pub const MAX_KV_WAIT: Duration = Duration::from_secs(120);

impl Default for TenantShare {
    /// A tenant the plan does not list.
    fn default() -> Self {
        TenantShare {
            weight: 1,
            own_blocks: None,
            kv_wait: DEFAULT_KV_WAIT,
            max_rows: None,
        }
    }
}

/// What one tenant did in a batch since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCounts {
    /// Blocks its sequences hold now.
    pub held_blocks: u64,
    /// Its sequences preempted (blocks taken back, recomputed later).
    pub preemptions: u64,
    /// Its requests refused because they could never fit its budget.
    pub kv_refusals: u64,
}

/// Per-tenant counts are kept for at most this many tenants not in the
/// plan (names come from callers); past it only the totals count them.
const MAX_UNLISTED_COUNTED: usize = 1024;

/// A sequence to add to a batch.
pub struct NewSequence {
    pub tenant: String,
    /// Higher runs first within its tenant.
    pub priority: i32,
    pub request: GenerateRequest,
    pub sink: Box<dyn SequenceSink>,
}

impl std::fmt::Debug for NewSequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewSequence")
            .field("tenant", &self.tenant)
            .field("priority", &self.priority)
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

struct Sequence {
    tenant: String,
    priority: i32,
    request: GenerateRequest,
    sink: Box<dyn SequenceSink>,
    decoding: Decoding,
    /// Its account in the pool once admitted.
    kv: Option<SeqId>,
    table: Vec<u32>,
    /// Positions of `decoding.history()` in the cache.
    cached: usize,
    /// Whether it has an item in the prefill round robin.
    queued: bool,
    /// When admission first failed for lack of the tenant's budget.
    kv_waiting_since: Option<Instant>,
    /// Arrival order across the partition's batches ([`PartitionKv`]).
    age: u64,
}

impl Sequence {
    /// The next chunk to run: the rest of the history, at most one chunk,
    /// cut at multiples of [`BATCH_PREFILL_CHUNK`] (see there why rows then
    /// compute exactly as in a lone run).
    fn next_chunk(&self) -> std::ops::Range<usize> {
        let end = self.decoding.history().len();
        let boundary = (self.cached / BATCH_PREFILL_CHUNK + 1) * BATCH_PREFILL_CHUNK;
        self.cached..end.min(boundary)
    }

    /// Holds KV and its next chunk is one token after a cached one: a
    /// decode row (the prefill round robin has every other sequence).
    fn is_decoding(&self) -> bool {
        self.kv.is_some() && self.cached > 0 && self.next_chunk().len() == 1
    }
}

/// Numbers for `Health` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Sequences waiting to join.
    pub waiting: usize,
    /// Sequences holding KV (running or preempted for recompute).
    pub running: usize,
    pub kv_blocks_used: u32,
    pub kv_blocks_total: u32,
    /// Sequences preempted (blocks taken back, recomputed later) so far.
    pub preemptions: u64,
    /// Requests refused because they could never fit their tenant's budget.
    pub kv_refusals: u64,
}

/// The continuous batch of one model.
pub struct Batcher {
    limits: BatchLimits,
    pool: KvPool,
    kv: KvBlocks,
    drr: Drr<u64>,
    rows: RowPicker,
    sequences: BTreeMap<u64, Sequence>,
    next_key: u64,
    preemptions: u64,
    kv_refusals: u64,
    /// The plan's tenants; others get [`TenantShare::default`].
    shares: BTreeMap<String, TenantShare>,
    /// Blocks the listed tenants own (`own_blocks`), whether active or not.
    owned_blocks: u64,
    counts: BTreeMap<String, TenantCounts>,
    /// The partition's memory, shared with its other models' batches.
    budget: PartitionKv,
    /// This batch's id in `budget`.
    batch_id: u32,
    block_bytes: u64,
    /// Prompt tokens each capped tenant may still prefill ahead of the
    /// others ([`Batcher::earn_prefill_credit`]).
    prefill_credit: BTreeMap<String, usize>,
    /// Capped tenants' chunks waiting for credit, outside the round robin.
    parked: Vec<u64>,
}

/// The most prompt tokens a capped tenant's credit holds: two chunks, so
/// credit that comes due while another tenant's chunk has the step's room
/// is not lost (one chunk would drop it, keeping the tenant below its
/// cap), and a tenant idle for long still bursts no more than two chunks.
const PREFILL_CREDIT_MAX: usize = 2 * BATCH_PREFILL_CHUNK;

/// What one step has chosen so far.
struct StepWork {
    chosen: Vec<(u64, std::ops::Range<usize>)>,
    deferred: Vec<u64>,
    /// Tokens the step may run, and has given out.
    budget: u64,
    spent: u64,
    /// Prompt tokens given out (at most [`BATCH_PREFILL_CHUNK`]).
    prefill: usize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("limits", &self.limits)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// An empty batch for `model` with a zeroed pool of `limits.kv_blocks`,
    /// every tenant with weight 1 and no memory of its own.
    pub fn new(model: &Model, limits: BatchLimits) -> Result<Batcher, PartitionError> {
        Self::with_shares(model, limits, BTreeMap::new())
    }

    /// An empty batch whose tenants share the pool as `shares` say. The
    /// blocks they own must fit in the pool.
    pub fn with_shares(
        model: &Model,
        limits: BatchLimits,
        shares: BTreeMap<String, TenantShare>,
    ) -> Result<Batcher, PartitionError> {
        Self::in_partition(model, limits, shares, PartitionKv::unlimited())
    }

    /// As [`Batcher::with_shares`], its blocks also charged to `budget`,
    /// the memory of a partition it shares with other models' batches.
    pub fn in_partition(
        model: &Model,
        limits: BatchLimits,
        shares: BTreeMap<String, TenantShare>,
        budget: PartitionKv,
    ) -> Result<Batcher, PartitionError> {
        let block_bytes = model.kv_geometry()?.bytes_per_block();
        let pool = KvPool::new(limits.kv_blocks, [])?;
        let owned_blocks: u64 = shares.values().filter_map(|s| s.own_blocks).sum();
        if owned_blocks > u64::from(limits.kv_blocks) {
            return Err(PartitionError::InvalidKvPool {
                reason: format!(
                    "tenants own {owned_blocks} blocks, more than the pool's {}",
                    limits.kv_blocks
                ),
            });
        }
        if let Some((tenant, _)) = shares.iter().find(|(_, s)| s.weight == 0) {
            return Err(PartitionError::InvalidKvPool {
                reason: format!("tenant {tenant}: weight 0"),
            });
        }
        let counts = shares
            .keys()
            .map(|t| (t.clone(), TenantCounts::default()))
            .collect();
        Ok(Batcher {
            limits: BatchLimits {
                max_running: limits.max_running.max(1),
                max_rows: limits.max_rows.max(1),
                ..limits
            },
            pool,
            kv: model.new_kv_blocks(limits.kv_blocks),
            drr: Drr::new(DEFAULT_QUANTUM_TOKENS),
            rows: RowPicker::new(),
            sequences: BTreeMap::new(),
            next_key: 0,
            preemptions: 0,
            kv_refusals: 0,
            shares,
            owned_blocks,
            counts,
            batch_id: budget.join(),
            budget,
            block_bytes,
            prefill_credit: BTreeMap::new(),
            parked: Vec::new(),
        })
    }

    /// Tokens one step may run: `max_rows` decode rows plus one prefill
    /// chunk.
    pub fn step_tokens(&self) -> u64 {
        (self.limits.max_rows + BATCH_PREFILL_CHUNK) as u64
    }

    /// Queues a sequence; it joins at a coming step. A request that is
    /// invalid or can never fit is answered through its sink at once.
    pub fn add(&mut self, tokenizer: &Tokenizer, new: NewSequence) {
        let NewSequence {
            tenant,
            priority,
            request,
            mut sink,
        } = new;
        let decoding = match Decoding::new(&request, tokenizer) {
            Ok(d) => d,
            Err(e) => return sink.finished(Err(e.into())),
        };
        if request.prompt_tokens.is_empty() {
            return sink.finished(Err(GenerateError::EmptyPrompt.into()));
        }
        if !self.pool.tenants().any(|t| t == tenant)
            && let Err(e) = self.join_tenant(&tenant)
        {
            return sink.finished(Err(SequenceError::Accounting(e)));
        }
        let key = self.next_key;
        self.next_key += 1;
        self.sequences.insert(
            key,
            Sequence {
                tenant,
                priority,
                request,
                sink,
                decoding,
                kv: None,
                table: Vec::new(),
                cached: 0,
                queued: false,
                kv_waiting_since: None,
                age: self.budget.next_age(),
            },
        );
        self.enqueue(key);
    }

    /// Sequences waiting or running.
    pub fn is_idle(&self) -> bool {
        self.sequences.is_empty()
    }

    pub fn stats(&self) -> BatchStats {
        let running = self.sequences.values().filter(|s| s.kv.is_some()).count();
        BatchStats {
            waiting: self.sequences.len() - running,
            running,
            kv_blocks_used: self.pool.total_blocks() - self.pool.free_blocks(),
            kv_blocks_total: self.pool.total_blocks(),
            preemptions: self.preemptions,
            kv_refusals: self.kv_refusals,
        }
    }

    /// Per tenant: blocks held now, preemptions and refusals so far (the
    /// plan's tenants always, others while counted).
    pub fn tenant_counts(&self) -> BTreeMap<String, TenantCounts> {
        let mut counts = self.counts.clone();
        for (tenant, c) in &mut counts {
            c.held_blocks = self.pool.held_blocks(tenant).unwrap_or(0);
        }
        counts
    }

    /// The count of `tenant`, created while the map has room.
    fn count_of(&mut self, tenant: &str) -> Option<&mut TenantCounts> {
        if !self.counts.contains_key(tenant) {
            let unlisted = self.counts.len().saturating_sub(self.shares.len());
            if unlisted >= MAX_UNLISTED_COUNTED {
                return None;
            }
            self.counts
                .insert(tenant.to_string(), TenantCounts::default());
        }
        self.counts.get_mut(tenant)
    }

    /// Blocks `tenant` holds now.
    pub fn held_blocks(&self, tenant: &str) -> u64 {
        self.pool.held_blocks(tenant).unwrap_or(0)
    }

    /// Runs one step; returns how many tokens went through the model
    /// (0: nothing could run).
    pub fn step(
        &mut self,
        model: &Model,
        tokenizer: &Tokenizer,
        backend: &dyn Backend,
    ) -> Result<usize, ForwardError> {
        self.drop_stopped();
        self.reclaim();
        let chosen = self.choose();
        if chosen.is_empty() {
            return Ok(0);
        }
        // Decode rows first: they form one per-row matmul (see `Model::run_layers`).
        let mut order = chosen.clone();
        order.sort_by_key(|(key, range)| (range.len() > 1, *key));
        let inputs: Vec<(u64, Vec<u32>, usize, bool)> = order
            .iter()
            .filter_map(|(key, range)| {
                let s = self.sequences.get(key)?;
                let history = s.decoding.history();
                let wants = range.end == history.len();
                Some((*key, history[range.clone()].to_vec(), range.start, wants))
            })
            .collect();
        let entries: Vec<BatchEntry<'_>> = inputs
            .iter()
            .filter_map(|(key, tokens, start_pos, logits)| {
                let s = self.sequences.get(key)?;
                Some(BatchEntry {
                    tokens,
                    start_pos: *start_pos,
                    blocks: &s.table,
                    logits: *logits,
                })
            })
            .collect();
        let ran: usize = inputs.iter().map(|i| i.1.len()).sum();
        let logits = match model.forward_batch(backend, &mut self.kv, &entries) {
            Ok(l) => l,
            Err(e) => {
                // A bug, not the clients' fault: end what was chosen, keep serving.
                for (key, ..) in &inputs {
                    self.end(*key, Some(Err(GenerateError::Forward(e.clone()).into())));
                }
                return Err(e);
            }
        };
        let vocab = model.config().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
        for (key, tokens, _, wants) in inputs {
            let Some(s) = self.sequences.get_mut(&key) else {
                continue;
            };
            s.cached += tokens.len();
            if !wants {
                continue;
            }
            let Some(row) = rows.next() else { break };
            let mut row = row.to_vec();
            let sink = &mut s.sink;
            let next = s
                .decoding
                .next(tokenizer, &mut row, &mut |piece| sink.piece(piece));
            match next {
                Next::Run(_) => {}
                Next::Done => self.end(key, None),
                Next::Cancelled => self.end(key, Some(Err(GenerateError::Cancelled.into()))),
            }
        }
        for key in order.into_iter().map(|(k, _)| k) {
            self.enqueue(key);
        }
        Ok(ran)
    }

    /// Tells every sequence, waiting or running, that its generation
    /// failed with `why`, and forgets them all: for a batch whose step
    /// panicked, which is dropped next (its pool is in an unknown state).
    pub fn fail_all(&mut self, why: &str) {
        for (_, mut s) in std::mem::take(&mut self.sequences) {
            s.sink
                .finished(Err(SequenceError::StepFailed(why.to_string())));
        }
    }

    /// Ends sequences their sinks stop (client gone, model out of service):
    /// their blocks are free before the step runs.
    fn drop_stopped(&mut self) {
        let stopped: Vec<u64> = self
            .sequences
            .iter_mut()
            .filter_map(|(key, s)| s.sink.check().is_break().then_some(*key))
            .collect();
        for key in stopped {
            self.end(key, Some(Err(GenerateError::Cancelled.into())));
        }
    }

    /// Preempts the sequences other models' batches asked for (their
    /// older sequences need the partition's memory; [`PartitionKv`]).
    fn reclaim(&mut self) {
        for age in self.budget.take_reclaims(self.batch_id) {
            let key = self
                .sequences
                .iter()
                .find(|(_, s)| s.age == age)
                .map(|(k, _)| *k);
            if let Some(key) = key {
                self.preempt(key);
                self.enqueue(key);
            }
        }
    }

    /// Picks this step's work (module docs): `(sequence, history range)`.
    fn choose(&mut self) -> Vec<(u64, std::ops::Range<usize>)> {
        let mut step = StepWork {
            chosen: Vec::new(),
            deferred: Vec::new(),
            budget: self.step_tokens(),
            spent: 0,
            prefill: 0,
        };
        self.choose_decode_rows(&mut step.chosen, &mut step.deferred);
        step.spent = step.chosen.len() as u64;
        self.earn_prefill_credit();
        while step.spent < step.budget {
            let Some(item) = self.drr.pop() else { break };
            let key = item.item;
            let Some(s) = self.sequences.get_mut(&key) else {
                continue; // ended while queued
            };
            s.queued = false;
            if s.is_decoding() {
                continue; // a decode row now: the row picker has it
            }
            self.try_run(key, &mut step);
        }
        // Room nobody else wanted: capped tenants' parked chunks may use it.
        let parked = std::mem::take(&mut self.parked);
        for key in parked {
            let Some(s) = self.sequences.get_mut(&key) else {
                continue;
            };
            s.queued = false;
            if s.is_decoding() {
                continue;
            }
            if step.spent < step.budget {
                self.try_run(key, &mut step);
            } else {
                step.deferred.push(key);
            }
        }
        for key in step.deferred {
            self.enqueue(key);
        }
        step.chosen
    }

    /// Runs sequence `key`'s next chunk this step if there is room for it
    /// (prefill tokens), a slot and budget for a waiting one, and blocks;
    /// else defers it to the next step. True when it runs.
    fn try_run(&mut self, key: u64, step: &mut StepWork) -> bool {
        let Some(s) = self.sequences.get(&key) else {
            return false;
        };
        let range = s.next_chunk();
        let is_prefill = range.len() > 1 || s.kv.is_none() || s.cached == 0;
        let waiting = s.kv.is_none();
        let s_tenant = s.tenant.clone();
        if is_prefill && step.prefill + range.len() > BATCH_PREFILL_CHUNK {
            step.deferred.push(key);
            return false;
        }
        if waiting && !self.admit(key) {
            step.deferred.push(key);
            return false;
        }
        match self.grow(key, range.end, &mut step.chosen, &mut step.deferred) {
            Grown::Yes => {}
            Grown::No => {
                step.deferred.push(key);
                return false;
            }
        }
        step.spent += range.len() as u64;
        if is_prefill {
            step.prefill += range.len();
        }
        if let Some(credit) = self.prefill_credit.get_mut(&s_tenant) {
            *credit = credit.saturating_sub(range.len());
        }
        step.chosen.push((key, range));
        true
    }

    /// Each step a capped tenant (its `max_rows` of this batch's rows)
    /// earns that fraction of [`BATCH_PREFILL_CHUNK`] in prompt tokens, up
    /// to [`PREFILL_CREDIT_MAX`]: while others have prefill work, its chunks run only
    /// out of that credit, so its cap holds for prompts as for decode rows.
    fn earn_prefill_credit(&mut self) {
        let rows = self.limits.max_rows;
        for (tenant, share) in &self.shares {
            let Some(cap) = share.max_rows else { continue };
            let per_step = (BATCH_PREFILL_CHUNK * cap.min(rows)).div_ceil(rows).max(1);
            let credit = self.prefill_credit.entry(tenant.clone()).or_insert(0);
            *credit = (*credit + per_step).min(PREFILL_CREDIT_MAX);
        }
        // Parked chunks the credit now pays for go back to the round robin.
        let mut left: BTreeMap<&str, usize> = self
            .prefill_credit
            .iter()
            .map(|(t, c)| (t.as_str(), *c))
            .collect();
        let mut still = Vec::new();
        let mut parked = std::mem::take(&mut self.parked);
        // Priority, then arrival, as within a tenant's round robin queue.
        parked.sort_by_key(|key| {
            let priority = self.sequences.get(key).map_or(0, |s| s.priority);
            (std::cmp::Reverse(priority), *key)
        });
        for key in parked {
            let Some(s) = self.sequences.get(&key) else {
                continue;
            };
            let len = s.next_chunk().len().max(1);
            match left.get_mut(s.tenant.as_str()) {
                Some(c) if *c >= len => {
                    *c -= len;
                    if self
                        .drr
                        .push(&s.tenant, s.priority, len as u64, key)
                        .is_err()
                    {
                        still.push(key);
                    }
                }
                _ => still.push(key),
            }
        }
        self.parked = still;
    }

    /// This step's decode rows: every decoding sequence when they fit in
    /// `max_rows`, else the row picker's weighted-fair choice (module docs).
    fn choose_decode_rows(
        &mut self,
        chosen: &mut Vec<(u64, std::ops::Range<usize>)>,
        deferred: &mut Vec<u64>,
    ) {
        let candidates: Vec<RowCandidate<u64>> = self
            .sequences
            .iter()
            .filter(|(_, s)| s.is_decoding())
            .map(|(key, s)| RowCandidate {
                tenant: s.tenant.clone(),
                priority: s.priority,
                age: *key,
                key: *key,
            })
            .collect();
        let shares = &self.shares;
        let picked = self.rows.pick(self.limits.max_rows, candidates, |tenant| {
            let share = shares.get(tenant).copied().unwrap_or_default();
            RowTerms {
                weight: share.weight,
                max_rows: share.max_rows,
            }
        });
        for key in picked {
            // An earlier row's growth may have preempted it.
            let Some(s) = self.sequences.get(&key) else {
                continue;
            };
            if !s.is_decoding() {
                deferred.push(key);
                continue;
            }
            let range = s.next_chunk();
            match self.grow(key, range.end, chosen, deferred) {
                Grown::Yes => chosen.push((key, range)),
                Grown::No => deferred.push(key),
            }
        }
    }

    /// Admits a waiting sequence into the pool if a slot and its tenant's
    /// budget allow; refuses it for good if it can never fit.
    fn admit(&mut self, key: u64) -> bool {
        let running = self.sequences.values().filter(|s| s.kv.is_some()).count();
        if running >= self.limits.max_running {
            return false;
        }
        let Some(s) = self.sequences.get_mut(&key) else {
            return false;
        };
        let prompt = s.request.prompt_tokens.len() as u64;
        match self
            .pool
            .admit(&s.tenant, prompt, s.request.max_tokens as u64)
        {
            Ok(seq) => {
                s.kv = Some(seq);
                s.sink.started();
                true
            }
            Err(e @ PartitionError::KvBudgetExceeded { .. }) if e.is_retryable() => {
                // Its own other sequences hold the rest of its budget.
                let since = *s.kv_waiting_since.get_or_insert_with(Instant::now);
                self.wait_for_budget(key, e, since)
            }
            Err(e) if e.is_retryable() => false,
            Err(PartitionError::KvBudgetExceeded {
                tenant,
                needed_tokens,
                available_tokens,
                of,
                ..
            }) => {
                self.kv_refusals += 1;
                if let Some(c) = self.count_of(&tenant) {
                    c.kv_refusals += 1;
                }
                let err = SequenceError::KvBudget {
                    tenant,
                    needed_tokens,
                    available_tokens,
                    of,
                };
                self.end(key, Some(Err(err)));
                false
            }
            Err(e) => {
                self.end(key, Some(Err(SequenceError::Accounting(e))));
                false
            }
        }
    }

    /// A waiting sequence whose tenant's budget is held by its other
    /// sequences: false while its KV wait lasts, then refused.
    fn wait_for_budget(&mut self, key: u64, e: PartitionError, since: Instant) -> bool {
        let PartitionError::KvBudgetExceeded {
            tenant,
            needed_tokens,
            available_tokens,
            ..
        } = e
        else {
            return false;
        };
        let wait = self
            .shares
            .get(&tenant)
            .map_or(DEFAULT_KV_WAIT, |share| share.kv_wait);
        if since.elapsed() < wait {
            return false;
        }
        self.kv_refusals += 1;
        if let Some(c) = self.count_of(&tenant) {
            c.kv_refusals += 1;
        }
        let err = SequenceError::KvWait {
            tenant,
            needed_tokens,
            available_tokens,
            waited_ms: since.elapsed().as_millis(),
        };
        self.end(key, Some(Err(err)));
        false
    }

    /// Gives `key` blocks for `positions` positions, preempting by the
    /// pool's rule when it is empty. A victim already chosen for this step
    /// is taken out of it.
    fn grow(
        &mut self,
        key: u64,
        positions: usize,
        chosen: &mut Vec<(u64, std::ops::Range<usize>)>,
        deferred: &mut Vec<u64>,
    ) -> Grown {
        let needed = positions.div_ceil(BLOCK_TOKENS);
        loop {
            let Some(s) = self.sequences.get_mut(&key) else {
                return Grown::No;
            };
            let Some(seq) = s.kv else { return Grown::No };
            if s.table.len() >= needed {
                return Grown::Yes;
            }
            let age = s.age;
            if !self
                .budget
                .try_charge(self.batch_id, key, age, self.block_bytes)
            {
                // The partition's memory is held, partly by other models.
                match self.partition_room(key, seq, age) {
                    Some(vkey) => {
                        if let Some(at) = chosen.iter().position(|(k, _)| *k == vkey) {
                            chosen.remove(at);
                        }
                        deferred.push(vkey);
                        if vkey == key {
                            return Grown::No;
                        }
                        continue;
                    }
                    None => return Grown::No,
                }
            }
            let allocated = self.pool.allocate(seq);
            if allocated.is_err() {
                self.budget.release(age, self.block_bytes);
            }
            let Some(s) = self.sequences.get_mut(&key) else {
                return Grown::No;
            };
            match allocated {
                Ok(block) => s.table.push(block.0),
                Err(PartitionError::KvPoolExhausted { .. }) => match self.pool.choose_victim(seq) {
                    Ok(Victim::Retry) => {}
                    Ok(Victim::Preempt(victim)) => {
                        let Some(vkey) = self.key_of(victim) else {
                            return Grown::No;
                        };
                        self.preempt(vkey);
                        if let Some(at) = chosen.iter().position(|(k, _)| *k == vkey) {
                            chosen.remove(at);
                        }
                        // It prefills again: back in the round robin.
                        deferred.push(vkey);
                        if vkey == key {
                            return Grown::No;
                        }
                    }
                    Ok(Victim::Wait) | Err(_) => return Grown::No,
                },
                Err(e) => {
                    self.end(key, Some(Err(SequenceError::Accounting(e))));
                    return Grown::No;
                }
            }
        }
    }

    /// Makes room in the partition's memory for `key` (module docs of
    /// [`PartitionKv`]): the sequence preempted (possibly `key` itself), or
    /// `None` when it must wait.
    fn partition_room(&mut self, key: u64, seq: SeqId, age: u64) -> Option<u64> {
        if let Ok(Victim::Preempt(victim)) = self.pool.choose_victim_ignoring_free(seq) {
            let vkey = self.key_of(victim)?;
            self.preempt(vkey);
            return Some(vkey);
        }
        match self.budget.youngest_after(age) {
            Some(Holding {
                batch, key: vkey, ..
            }) if batch == self.batch_id => {
                self.preempt(vkey);
                Some(vkey)
            }
            Some(Holding { batch, age, .. }) => {
                self.budget.ask_reclaim(batch, age);
                None
            }
            None => {
                // The youngest holder: older sequences go first.
                let holds = self
                    .sequences
                    .get(&key)
                    .is_some_and(|s| !s.table.is_empty());
                holds.then(|| {
                    self.preempt(key);
                    key
                })
            }
        }
    }

    /// Frees `key`'s blocks; it keeps its reservation and recomputes its
    /// cache (prompt and generated tokens) when it runs again.
    fn preempt(&mut self, key: u64) {
        if let Some(s) = self.sequences.get_mut(&key)
            && let Some(seq) = s.kv
        {
            let _ = self.pool.preempt(seq);
            self.budget
                .release(s.age, s.table.len() as u64 * self.block_bytes);
            self.preemptions += 1;
            s.table.clear();
            s.cached = 0;
            let tenant = s.tenant.clone();
            if let Some(c) = self.count_of(&tenant) {
                c.preemptions += 1;
            }
        }
    }

    fn key_of(&self, seq: SeqId) -> Option<u64> {
        self.sequences
            .iter()
            .find(|(_, s)| s.kv == Some(seq))
            .map(|(k, _)| *k)
    }

    /// Puts a live sequence's next prefill chunk in the round robin (once;
    /// decode rows are chosen each step from the running sequences).
    fn enqueue(&mut self, key: u64) {
        let Some(s) = self.sequences.get_mut(&key) else {
            return;
        };
        if s.queued || s.is_decoding() {
            return;
        }
        let cost = s.next_chunk().len().max(1);
        // A capped tenant's chunk its credit cannot pay for waits aside
        // (not charged to its round robin turns): it runs when credit
        // comes, or in room no other tenant wants.
        if let Some(credit) = self.prefill_credit.get(&s.tenant)
            && *credit < cost
        {
            s.queued = true;
            self.parked.push(key);
            return;
        }
        if self
            .drr
            .push(&s.tenant, s.priority, cost as u64, key)
            .is_ok()
        {
            s.queued = true;
        }
    }

    /// Removes a sequence, frees its blocks and reservation, and tells its
    /// sink: `None` finishes it normally, `Some(Err(Cancelled))` silently.
    fn end(&mut self, key: u64, outcome: Option<Result<Decoded, SequenceError>>) {
        let Some(mut s) = self.sequences.remove(&key) else {
            return;
        };
        if let Some(seq) = s.kv {
            let _ = self.pool.release(seq);
            self.budget
                .release(s.age, s.table.len() as u64 * self.block_bytes);
        }
        match outcome {
            Some(Err(SequenceError::Generate(GenerateError::Cancelled))) => {}
            Some(result) => s.sink.finished(result),
            None => {
                let sink = &mut s.sink;
                match s.decoding.finish(&mut |piece| sink.piece(piece)) {
                    Ok(done) => sink.finished(Ok(done)),
                    Err(GenerateError::Cancelled) => {}
                    Err(e) => sink.finished(Err(e.into())),
                }
            }
        }
        if !self.sequences.values().any(|o| o.tenant == s.tenant) {
            self.leave_tenant(&s.tenant);
        }
    }

    /// A tenant's first sequence: the weighted parts are divided anew
    /// (the others' shrink first, so the guarantees never exceed the pool).
    fn join_tenant(&mut self, tenant: &str) -> Result<(), PartitionError> {
        let share = self.shares.get(tenant).copied().unwrap_or_default();
        let active: Vec<String> = self.pool.tenants().map(str::to_string).collect();
        let weights = self.active_weights(active.iter().map(String::as_str).chain([tenant]));
        for t in &active {
            self.pool.set_limits(t, self.limits_of(t, weights))?;
        }
        self.pool
            .add_tenant(tenant, self.limits_of(tenant, weights))?;
        self.drr.set_tenant(tenant, share.weight)
    }

    /// A tenant's last sequence ended: the others' parts grow back.
    fn leave_tenant(&mut self, tenant: &str) {
        if self.pool.remove_tenant(tenant).is_err() {
            return;
        }
        if !self.shares.contains_key(tenant) {
            // An unlisted tenant's counts go with it (its names are the caller's).
            self.counts.remove(tenant);
        }
        let active: Vec<String> = self.pool.tenants().map(str::to_string).collect();
        let weights = self.active_weights(active.iter().map(String::as_str));
        for t in &active {
            let _ = self.pool.set_limits(t, self.limits_of(t, weights));
        }
    }

    /// Total weight of the `active` tenants without blocks of their own.
    fn active_weights<'a>(&self, active: impl Iterator<Item = &'a str>) -> u64 {
        active
            .map(|t| self.shares.get(t).copied().unwrap_or_default())
            .filter(|s| s.own_blocks.is_none())
            .map(|s| u64::from(s.weight))
            .sum()
    }

    /// `tenant`'s limits while tenants of total weight `weights` share the
    /// blocks no one owns: its own blocks, or its weighted part of those
    /// (rounded down, so the parts never add up past them) and all of them
    /// to borrow.
    fn limits_of(&self, tenant: &str, weights: u64) -> TenantBlocks {
        let share = self.shares.get(tenant).copied().unwrap_or_default();
        let total = u64::from(self.pool.total_blocks());
        match share.own_blocks {
            Some(own) => TenantBlocks {
                guaranteed: own.min(total),
                budget: own.min(total),
            },
            None => {
                let unowned = total - self.owned_blocks.min(total);
                let part =
                    u128::from(unowned) * u128::from(share.weight) / u128::from(weights.max(1));
                TenantBlocks {
                    guaranteed: u64::try_from(part).unwrap_or(unowned),
                    budget: unowned,
                }
            }
        }
    }
}

enum Grown {
    Yes,
    No,
}

impl Drop for Batcher {
    /// A batch dropped with sequences (a step panicked) gives their memory
    /// back to the partition.
    fn drop(&mut self) {
        for s in self.sequences.values() {
            self.budget
                .release(s.age, s.table.len() as u64 * self.block_bytes);
        }
    }
}

#[cfg(test)]
mod tests;
