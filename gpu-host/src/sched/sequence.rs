//! One sequence as the batch sees it from outside: what it was asked
//! ([`NewSequence`]), where its output goes ([`SequenceSink`]), and why it
//! ended without output ([`SequenceError`]).

use std::ops::ControlFlow;

use bulkhead_partition::PartitionError;

use crate::engine::{Decoded, GenerateError, GenerateRequest, Piece};

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
    /// A step ran `range` of the sequence's tokens between `start` and
    /// `end` (for its trace); `decode`: one token after cached ones;
    /// `sampled`: the step produced its next token.
    fn ran(&mut self, _run: StepRun) {}
    /// The planner took the sequence's KV blocks back (it is recomputed).
    fn preempted(&mut self) {}
}

/// One sequence's part of a step, as [`SequenceSink::ran`] hears it.
#[derive(Clone, Debug)]
pub struct StepRun {
    pub range: std::ops::Range<usize>,
    /// Tokens the whole step ran, every sequence's together.
    pub step_tokens: usize,
    pub decode: bool,
    pub sampled: bool,
    pub start: std::time::SystemTime,
    pub end: std::time::SystemTime,
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
    /// A step of its batch panicked (a bug) and the batch was dropped; the
    /// text is the panic's own.
    #[error("generation failed: {0}")]
    StepFailed(String),
}

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
