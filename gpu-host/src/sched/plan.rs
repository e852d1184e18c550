//! The step planner of one model's batch: which sequences run which
//! tokens in the coming step. State in (sequences' lengths, the KV pool,
//! the tenants' shares), a [`StepPlan`] out; no model, no tensors, and
//! deterministic (time is an argument), so the scheduling policy is tested
//! without one ([`super::Batcher`] executes plans on a model).
//!
//! A step:
//! 1. **Leave**: the executor removes sequences whose sink says stop
//!    (client gone, model out of service); their blocks are free before
//!    anything is planned.
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
//! 4. **Run** (the executor): one `forward_batch`, then it samples every
//!    sequence whose chunk completed its input and tells the planner
//!    ([`Planner::advance`]); finished sequences leave and free their blocks.
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
use std::ops::Range;
use std::time::Instant;

use bulkhead_partition::{
    DEFAULT_QUANTUM_TOKENS, Drr, KvPool, PartitionError, RowCandidate, RowPicker, RowTerms, SeqId,
};

use super::sequence::SequenceError;
use crate::engine::PREFILL_CHUNK;

mod budget;
mod memory;
mod terms;

pub use budget::PartitionKv;
use memory::Grown;
use terms::MAX_UNLISTED_COUNTED;
pub use terms::{BatchLimits, BatchStats, TenantCounts, TenantShare};

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

/// A sequence as the planner knows it: its tenant, its size, and its
/// place in the pool.
#[derive(Clone, Debug)]
pub struct Planned {
    pub tenant: String,
    /// Higher runs first within its tenant.
    pub priority: i32,
    pub prompt_tokens: u64,
    pub max_tokens: u64,
    /// Tokens of its history (prompt, then what it generated).
    pub len: usize,
}

struct Slot {
    seq: Planned,
    /// Its account in the pool once admitted.
    kv: Option<SeqId>,
    table: Vec<u32>,
    /// Positions of its history in the cache.
    cached: usize,
    /// Whether it has an item in the prefill round robin.
    queued: bool,
    /// When admission first failed for lack of the tenant's budget.
    kv_waiting_since: Option<Instant>,
    /// Arrival order across the partition's batches ([`PartitionKv`]).
    age: u64,
}

impl Slot {
    /// The next chunk to run: the rest of the history, at most one chunk,
    /// cut at multiples of [`BATCH_PREFILL_CHUNK`] (see there why rows then
    /// compute exactly as in a lone run).
    fn next_chunk(&self) -> Range<usize> {
        let boundary = (self.cached / BATCH_PREFILL_CHUNK + 1) * BATCH_PREFILL_CHUNK;
        self.cached..self.seq.len.min(boundary)
    }

    /// Holds KV and its next chunk is one token after a cached one: a
    /// decode row (the prefill round robin has every other sequence).
    fn is_decoding(&self) -> bool {
        self.kv.is_some() && self.cached > 0 && self.next_chunk().len() == 1
    }
}

/// One sequence's work in a step: the positions of its history to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub key: u64,
    pub range: Range<usize>,
    /// A decode row (one token after cached ones), else a prefill chunk.
    pub decode: bool,
}

/// What one step does.
#[derive(Debug, Default)]
pub struct StepPlan {
    /// What runs, in the order chosen (decode rows first).
    pub chunks: Vec<Chunk>,
    /// Admitted this step: they hold KV from now on.
    pub started: Vec<u64>,
    /// Preempted this step: blocks taken back, recomputed when they run again.
    pub preempted: Vec<u64>,
    /// Ended by the planner (they can never fit, or waited too long).
    pub refused: Vec<(u64, SequenceError)>,
}

/// The planner of one model's batch.
pub struct Planner {
    limits: BatchLimits,
    pool: KvPool,
    drr: Drr<u64>,
    rows: RowPicker,
    slots: BTreeMap<u64, Slot>,
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
    /// others ([`Planner::earn_prefill_credit`]).
    prefill_credit: BTreeMap<String, usize>,
    /// Capped tenants' chunks waiting for credit, outside the round robin.
    parked: Vec<u64>,
    /// What the plan being made has done besides choosing chunks.
    events: StepPlan,
}

/// The most prompt tokens a capped tenant's credit holds: two chunks, so
/// credit that comes due while another tenant's chunk has the step's room
/// is not lost (one chunk would drop it, keeping the tenant below its
/// cap), and a tenant idle for long still bursts no more than two chunks.
const PREFILL_CREDIT_MAX: usize = 2 * BATCH_PREFILL_CHUNK;

/// What one step has chosen so far.
struct StepWork {
    chosen: Vec<(u64, Range<usize>, bool)>,
    deferred: Vec<u64>,
    /// Tokens the step may run, and has given out.
    budget: u64,
    spent: u64,
    /// Prompt tokens given out (at most [`BATCH_PREFILL_CHUNK`]).
    prefill: usize,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planner")
            .field("limits", &self.limits)
            .field("sequences", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Planner {
    /// An empty plan over a zeroed pool of `limits.kv_blocks` blocks of
    /// `block_bytes` each, charged to `budget`, its tenants sharing it as
    /// `shares` say. The blocks they own must fit in the pool.
    pub fn new(
        limits: BatchLimits,
        shares: BTreeMap<String, TenantShare>,
        budget: PartitionKv,
        block_bytes: u64,
    ) -> Result<Planner, PartitionError> {
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
        Ok(Planner {
            limits: BatchLimits {
                max_running: limits.max_running.max(1),
                max_rows: limits.max_rows.max(1),
                ..limits
            },
            pool,
            drr: Drr::new(DEFAULT_QUANTUM_TOKENS),
            rows: RowPicker::new(),
            slots: BTreeMap::new(),
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
            events: StepPlan::default(),
        })
    }

    /// Tokens one step may run: `max_rows` decode rows plus one prefill
    /// chunk.
    pub fn step_tokens(&self) -> u64 {
        (self.limits.max_rows + BATCH_PREFILL_CHUNK) as u64
    }

    /// Queues a sequence; it joins at a coming step. Its key names it in
    /// plans.
    pub fn add(&mut self, seq: Planned) -> Result<u64, PartitionError> {
        if !self.pool.tenants().any(|t| t == seq.tenant) {
            self.join_tenant(&seq.tenant)?;
        }
        let key = self.next_key;
        self.next_key += 1;
        let age = self.budget.next_age();
        self.slots.insert(
            key,
            Slot {
                seq,
                kv: None,
                table: Vec::new(),
                cached: 0,
                queued: false,
                kv_waiting_since: None,
                age,
            },
        );
        self.enqueue(key);
        Ok(key)
    }

    /// Sequences waiting or running.
    pub fn is_idle(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn stats(&self) -> BatchStats {
        let running = self.slots.values().filter(|s| s.kv.is_some()).count();
        BatchStats {
            waiting: self.slots.len() - running,
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

    /// The KV blocks of sequence `key`, in position order.
    pub fn table(&self, key: u64) -> &[u32] {
        self.slots.get(&key).map_or(&[], |s| &s.table)
    }

    /// The pool, for tests of the batch.
    #[cfg(test)]
    pub(super) fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Positions cached of each of `tenant`'s sequences, for tests.
    #[cfg(test)]
    pub(super) fn cached_of(&self, tenant: &str) -> Vec<usize> {
        let slots = self.slots.values().filter(|s| s.seq.tenant == tenant);
        slots.map(|s| s.cached).collect()
    }

    /// Plans the next step at time `now` (KV waits are measured against it).
    pub fn plan(&mut self, now: Instant) -> StepPlan {
        self.reclaim();
        let chosen = self.choose(now);
        let mut plan = std::mem::take(&mut self.events);
        plan.chunks = chosen
            .into_iter()
            .map(|(key, range, decode)| Chunk { key, range, decode })
            .collect();
        plan
    }

    /// Sequence `key` ran `ran` more positions and its history is now
    /// `len` tokens long (one more when a token was sampled).
    pub fn advance(&mut self, key: u64, ran: usize, len: usize) {
        if let Some(s) = self.slots.get_mut(&key) {
            s.cached += ran;
            s.seq.len = len;
        }
    }

    /// Puts the next chunks of `keys` (the last step's) in the round robin.
    pub fn requeue(&mut self, keys: impl IntoIterator<Item = u64>) {
        for key in keys {
            self.enqueue(key);
        }
    }

    /// Removes sequence `key` (it finished, failed or was stopped) and
    /// frees its blocks and reservation.
    pub fn remove(&mut self, key: u64) {
        let Some(s) = self.slots.remove(&key) else {
            return;
        };
        if let Some(seq) = s.kv {
            let _ = self.pool.release(seq);
            self.budget
                .release(s.age, s.table.len() as u64 * self.block_bytes);
        }
        if !self.slots.values().any(|o| o.seq.tenant == s.seq.tenant) {
            self.leave_tenant(&s.seq.tenant);
        }
    }

    /// Forgets every sequence, giving their memory back to the partition:
    /// for a batch whose step failed past recovery.
    pub fn forget_all(&mut self) {
        for (_, s) in std::mem::take(&mut self.slots) {
            self.budget
                .release(s.age, s.table.len() as u64 * self.block_bytes);
        }
    }

    /// Preempts the sequences other models' batches asked for (their
    /// older sequences need the partition's memory; [`PartitionKv`]).
    fn reclaim(&mut self) {
        for age in self.budget.take_reclaims(self.batch_id) {
            let key = self
                .slots
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
    fn choose(&mut self, now: Instant) -> Vec<(u64, Range<usize>, bool)> {
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
            let Some(s) = self.slots.get_mut(&key) else {
                continue; // ended while queued
            };
            s.queued = false;
            if s.is_decoding() {
                continue; // a decode row now: the row picker has it
            }
            self.try_run(key, &mut step, now);
        }
        // Room nobody else wanted: capped tenants' parked chunks may use it.
        let parked = std::mem::take(&mut self.parked);
        for key in parked {
            let Some(s) = self.slots.get_mut(&key) else {
                continue;
            };
            s.queued = false;
            if s.is_decoding() {
                continue;
            }
            if step.spent < step.budget {
                self.try_run(key, &mut step, now);
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
    fn try_run(&mut self, key: u64, step: &mut StepWork, now: Instant) -> bool {
        let Some(s) = self.slots.get(&key) else {
            return false;
        };
        let range = s.next_chunk();
        let is_prefill = range.len() > 1 || s.kv.is_none() || s.cached == 0;
        let waiting = s.kv.is_none();
        let s_tenant = s.seq.tenant.clone();
        if is_prefill && step.prefill + range.len() > BATCH_PREFILL_CHUNK {
            step.deferred.push(key);
            return false;
        }
        if waiting && !self.admit(key, now) {
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
        step.chosen.push((key, range, false));
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
            let priority = self.slots.get(key).map_or(0, |s| s.seq.priority);
            (std::cmp::Reverse(priority), *key)
        });
        for key in parked {
            let Some(s) = self.slots.get(&key) else {
                continue;
            };
            let len = s.next_chunk().len().max(1);
            match left.get_mut(s.seq.tenant.as_str()) {
                Some(c) if *c >= len => {
                    *c -= len;
                    if self
                        .drr
                        .push(&s.seq.tenant, s.seq.priority, len as u64, key)
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
        chosen: &mut Vec<(u64, Range<usize>, bool)>,
        deferred: &mut Vec<u64>,
    ) {
        let candidates: Vec<RowCandidate<u64>> = self
            .slots
            .iter()
            .filter(|(_, s)| s.is_decoding())
            .map(|(key, s)| RowCandidate {
                tenant: s.seq.tenant.clone(),
                priority: s.seq.priority,
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
            let Some(s) = self.slots.get(&key) else {
                continue;
            };
            if !s.is_decoding() {
                deferred.push(key);
                continue;
            }
            let range = s.next_chunk();
            match self.grow(key, range.end, chosen, deferred) {
                Grown::Yes => chosen.push((key, range, true)),
                Grown::No => deferred.push(key),
            }
        }
    }

    /// Puts a live sequence's next prefill chunk in the round robin (once;
    /// decode rows are chosen each step from the running sequences).
    fn enqueue(&mut self, key: u64) {
        let Some(s) = self.slots.get_mut(&key) else {
            return;
        };
        if s.queued || s.is_decoding() {
            return;
        }
        let cost = s.next_chunk().len().max(1);
        // A capped tenant's chunk its credit cannot pay for waits aside
        // (not charged to its round robin turns): it runs when credit
        // comes, or in room no other tenant wants.
        if let Some(credit) = self.prefill_credit.get(&s.seq.tenant)
            && *credit < cost
        {
            s.queued = true;
            self.parked.push(key);
            return;
        }
        if self
            .drr
            .push(&s.seq.tenant, s.seq.priority, cost as u64, key)
            .is_ok()
        {
            s.queued = true;
        }
    }

    /// Ends sequence `key` for `why`: its blocks are freed now, its sink
    /// is told by the executor ([`StepPlan::refused`]).
    fn refuse(&mut self, key: u64, why: SequenceError) {
        self.remove(key);
        self.events.refused.push((key, why));
    }
}

impl Drop for Planner {
    /// A batch dropped with sequences (a step panicked) gives their memory
    /// back to the partition.
    fn drop(&mut self) {
        self.forget_all();
    }
}

#[cfg(test)]
mod tests;
