//! A validated generation on its way to a partition's scheduler, the
//! events it streams back and the channel they go on.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::counters::Counted;
use super::error::SchedError;
use super::trace::SeqTrace;
use crate::engine::{FinishReason, GenerateRequest};
use crate::models::LoadedModel;

/// What a generation's stream carries, in order: `Started`, any number of
/// `Delta`s, then `Finished`, or an error in their place that ends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// The sequence joined a batch.
    Started {
        prompt_tokens: usize,
        model: String,
        model_digest: String,
        /// When the model's weights were last verified (Unix ms), read as
        /// the sequence started.
        weights_verified_at_ms: u64,
    },
    /// Text now final and the tokens generated since the previous delta
    /// (the last delta may carry tokens and no text).
    Delta { text: String, token_ids: Vec<u32> },
    /// The sequence ended with its output.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Its share of the steps it ran in, in microseconds.
        compute_us: u64,
    },
}

/// Where a generation's events go; dropped by the client side when it leaves.
pub(crate) type EventSender = mpsc::Sender<Result<Event, SchedError>>;

/// One queued generation, already validated.
#[derive(Debug)]
pub(crate) struct Job {
    pub model: Arc<LoadedModel>,
    pub request: GenerateRequest,
    pub tenant: String,
    pub priority: i32,
    pub events: EventSender,
    /// Its spans (empty when its trace is not recorded).
    pub trace: SeqTrace,
}

/// A job in a partition's queue, with the counts it settles when it starts
/// running or leaves.
#[derive(Debug)]
pub(crate) struct Queued {
    pub job: Job,
    pub counted: Counted,
}
