//! Iteration-level continuous batching of one model: sequences join and
//! leave between steps, and each step runs every chosen sequence's next
//! tokens as one batched forward pass over the paged KV pool.
//!
//! The [`Batcher`] is the executor: it owns each sequence's decoding state
//! and sink and the KV cache's memory, asks its [`Planner`] what the step
//! runs (`super::plan`: the tenants' shares, admission, preemption), runs
//! that on the model, samples, and reports back what each sequence now
//! holds.

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use bulkhead_partition::PartitionError;

use super::plan::{
    BatchLimits, BatchStats, PartitionKv, Planned, Planner, StepPlan, TenantCounts, TenantShare,
};
use super::sequence::{NewSequence, SequenceError, SequenceSink, StepRun};
use crate::Tokenizer;
use crate::backend::Backend;
use crate::engine::{
    BatchEntry, Decoded, Decoding, ForwardError, GenerateError, KvBlocks, Model, Next,
};

/// A sequence's executor side: what the planner does not need.
struct Sequence {
    decoding: Decoding,
    sink: Box<dyn SequenceSink>,
}

/// The continuous batch of one model.
pub struct Batcher {
    planner: Planner,
    kv: KvBlocks,
    sequences: BTreeMap<u64, Sequence>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("planner", &self.planner)
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
        let planner = Planner::new(limits, shares, budget, block_bytes)?;
        Ok(Batcher {
            planner,
            kv: model.new_kv_blocks(limits.kv_blocks),
            sequences: BTreeMap::new(),
        })
    }

    /// Tokens one step may run: `max_rows` decode rows plus one prefill
    /// chunk.
    pub fn step_tokens(&self) -> u64 {
        self.planner.step_tokens()
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
        let planned = Planned {
            tenant,
            priority,
            prompt_tokens: request.prompt_tokens.len() as u64,
            max_tokens: request.max_tokens as u64,
            len: decoding.history().len(),
        };
        match self.planner.add(planned) {
            Ok(key) => {
                self.sequences.insert(key, Sequence { decoding, sink });
            }
            Err(e) => sink.finished(Err(SequenceError::Accounting(e))),
        }
    }

    /// Sequences waiting or running.
    pub fn is_idle(&self) -> bool {
        self.planner.is_idle()
    }

    pub fn stats(&self) -> BatchStats {
        self.planner.stats()
    }

    /// Per tenant: blocks held now, preemptions and refusals so far (the
    /// plan's tenants always, others while counted).
    pub fn tenant_counts(&self) -> BTreeMap<String, TenantCounts> {
        self.planner.tenant_counts()
    }

    /// Blocks `tenant` holds now.
    pub fn held_blocks(&self, tenant: &str) -> u64 {
        self.planner.held_blocks(tenant)
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
        let StepPlan {
            chunks,
            started,
            preempted,
            refused,
        } = self.planner.plan(Instant::now());
        for key in preempted {
            if let Some(s) = self.sequences.get_mut(&key) {
                s.sink.preempted();
            }
        }
        for key in started {
            if let Some(s) = self.sequences.get_mut(&key) {
                s.sink.started();
            }
        }
        for (key, why) in refused {
            if let Some(mut s) = self.sequences.remove(&key) {
                s.sink.finished(Err(why));
            }
        }
        if chunks.is_empty() {
            return Ok(0);
        }
        // Decode rows first: they form one per-row matmul (see `Model::run_layers`).
        let mut order: Vec<(u64, std::ops::Range<usize>, bool)> = chunks
            .into_iter()
            .map(|c| (c.key, c.range, c.decode))
            .collect();
        order.sort_by_key(|(key, range, _)| (range.len() > 1, *key));
        let inputs: Vec<(u64, Vec<u32>, usize, bool, bool)> = order
            .iter()
            .filter_map(|(key, range, decode)| {
                let s = self.sequences.get(key)?;
                let history = s.decoding.history();
                let wants = range.end == history.len();
                let tokens = history[range.clone()].to_vec();
                Some((*key, tokens, range.start, wants, *decode))
            })
            .collect();
        let entries: Vec<BatchEntry<'_>> = inputs
            .iter()
            .map(|(key, tokens, start_pos, logits, _)| BatchEntry {
                tokens,
                start_pos: *start_pos,
                blocks: self.planner.table(*key),
                logits: *logits,
            })
            .collect();
        let ran: usize = inputs.iter().map(|i| i.1.len()).sum();
        let step_start = SystemTime::now();
        let logits = match model.forward_batch(backend, &mut self.kv, &entries) {
            Ok(l) => l,
            Err(e) => {
                // The device failed the step (or a bug): not the clients'
                // fault. End what was chosen, keep serving the rest.
                for (key, ..) in &inputs {
                    self.end(*key, Some(Err(GenerateError::Forward(e.clone()).into())));
                }
                return Err(e);
            }
        };
        let step_end = SystemTime::now();
        let vocab = model.config().vocab_size;
        let mut rows = logits.chunks_exact(vocab);
        for (key, tokens, start_pos, wants, decode) in inputs {
            let Some(s) = self.sequences.get_mut(&key) else {
                continue;
            };
            s.sink.ran(StepRun {
                range: start_pos..start_pos + tokens.len(),
                step_tokens: ran,
                decode,
                sampled: wants,
                start: step_start,
                end: step_end,
            });
            if !wants {
                self.planner
                    .advance(key, tokens.len(), s.decoding.history().len());
                continue;
            }
            let Some(row) = rows.next() else { break };
            let mut row = row.to_vec();
            let sink = &mut s.sink;
            let next = s
                .decoding
                .next(tokenizer, &mut row, &mut |piece| sink.piece(piece));
            self.planner
                .advance(key, tokens.len(), s.decoding.history().len());
            match next {
                Next::Run(_) => {}
                Next::Done => self.end(key, None),
                Next::Cancelled => self.end(key, Some(Err(GenerateError::Cancelled.into()))),
            }
        }
        self.planner.requeue(order.into_iter().map(|(k, ..)| k));
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
        self.planner.forget_all();
    }

    /// Ends sequences their sinks stop (client gone, model out of service):
    /// their blocks are free before the step is planned.
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

    /// Removes a sequence, frees its blocks and reservation, and tells its
    /// sink: `None` finishes it normally, `Some(Err(Cancelled))` silently.
    fn end(&mut self, key: u64, outcome: Option<Result<Decoded, SequenceError>>) {
        self.planner.remove(key);
        let Some(mut s) = self.sequences.remove(&key) else {
            return;
        };
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
    }
}

#[cfg(test)]
mod tests;
