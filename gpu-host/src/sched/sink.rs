//! One generation's stream as the scheduler sees it: the engine's
//! [`SequenceSink`] turned into the stream's [`Event`]s (the transport
//! turns those into the wire's).
//!
//! Events go through a per-stream backlog and `try_send`, never a blocking
//! send: one scheduler thread runs every sequence of a batch, so a client
//! that stops reading must not stall the others. The backlog of a slow
//! client is bounded by its `max_tokens` (one event per token at most).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::mpsc::error::TrySendError;

use super::counters::Counted;
use super::error::SchedError;
use super::job::{Event, EventSender};
use super::sequence::{SequenceError, SequenceSink, StepRun};
use super::trace::SeqTrace;
use crate::engine::{Decoded, FinishReason, ForwardError, GenerateError, Piece};
use crate::models::LoadedModel;

type Item = Result<Event, SchedError>;

/// A stream's events not yet taken by its channel.
#[derive(Debug)]
pub(crate) struct Outbox {
    events: EventSender,
    backlog: VecDeque<Item>,
}

impl Outbox {
    pub(crate) fn new(events: EventSender) -> Rc<RefCell<Outbox>> {
        Rc::new(RefCell::new(Outbox {
            events,
            backlog: VecDeque::new(),
        }))
    }

    fn push(&mut self, item: Item) {
        self.backlog.push_back(item);
        self.flush();
    }

    /// Hands the channel what it has room for.
    pub(crate) fn flush(&mut self) {
        while let Some(item) = self.backlog.pop_front() {
            match self.events.try_send(item) {
                Ok(()) => {}
                Err(TrySendError::Full(item)) => {
                    self.backlog.push_front(item);
                    return;
                }
                Err(TrySendError::Closed(_)) => {
                    self.backlog.clear();
                    return;
                }
            }
        }
    }

    /// The client is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.events.is_closed()
    }

    /// Nothing left to deliver (or nobody to deliver it to).
    pub(crate) fn is_settled(&self) -> bool {
        self.backlog.is_empty() || self.is_closed()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Queued,
    Running,
}

/// The sink of one sequence. Dropping it (the batcher ends a sequence)
/// settles the load counters; a sequence dropped without an answer (a bug
/// that unwound a step) tells its client so.
#[derive(Debug)]
pub(crate) struct StreamSink {
    model: Arc<LoadedModel>,
    prompt_tokens: usize,
    outbox: Rc<RefCell<Outbox>>,
    counters: Counted,
    stage: Stage,
    answered: bool,
    trace: SeqTrace,
    /// Its share of the steps it ran in (usage is billed by it).
    compute: std::time::Duration,
}

impl StreamSink {
    /// The sink of an accepted request (counted as queued since `submit`).
    pub(crate) fn new(
        model: Arc<LoadedModel>,
        prompt_tokens: usize,
        outbox: Rc<RefCell<Outbox>>,
        counters: Counted,
        trace: SeqTrace,
    ) -> StreamSink {
        StreamSink {
            model,
            prompt_tokens,
            outbox,
            counters,
            stage: Stage::Queued,
            answered: false,
            trace,
            compute: std::time::Duration::ZERO,
        }
    }

    fn send(&mut self, event: Event) {
        self.outbox.borrow_mut().push(Ok(event));
    }

    /// Answers with an error before the sequence reaches a batch.
    pub(crate) fn refuse(mut self, error: SchedError) {
        self.fail(error);
    }

    fn fail(&mut self, error: SchedError) {
        self.answered = true;
        self.trace.finish(error.kind(), true, None);
        self.outbox.borrow_mut().push(Err(error));
    }
}

impl SequenceSink for StreamSink {
    fn started(&mut self) {
        if self.stage == Stage::Queued {
            self.counters.start();
            self.stage = Stage::Running;
        }
        self.trace.joined();
        let started = Event::Started {
            prompt_tokens: self.prompt_tokens,
            model: self.model.name.clone(),
            model_digest: self.model.digest.clone(),
            weights_verified_at_ms: self.model.weights.verified_at_ms(),
        };
        self.send(started);
    }

    fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()> {
        self.send(Event::Delta {
            text: piece.text.to_string(),
            token_ids: piece.tokens.to_vec(),
        });
        if self.outbox.borrow().is_closed() {
            return ControlFlow::Break(()); // client gone: stop generating
        }
        ControlFlow::Continue(())
    }

    fn check(&mut self) -> ControlFlow<()> {
        if self.outbox.borrow().is_closed() {
            self.answered = true;
            return ControlFlow::Break(());
        }
        // Out of service at once: a sequence in flight stops at the next
        // step rather than finishing on weights that no longer verify.
        if let Some(reason) = self.model.weights.unavailable_reason() {
            self.fail(SchedError::OutOfService {
                model: self.model.name.clone(),
                reason: reason.to_string(),
            });
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn finished(&mut self, result: Result<Decoded, SequenceError>) {
        match result {
            Ok(done) => {
                self.answered = true;
                let reason = match done.finish_reason {
                    FinishReason::Stop => "stop",
                    FinishReason::Length => "length",
                };
                self.trace.finish(reason, false, Some(done.tokens.len()));
                self.send(Event::Finished {
                    reason: done.finish_reason,
                    prompt_tokens: self.prompt_tokens,
                    completion_tokens: done.tokens.len(),
                    compute_us: u64::try_from(self.compute.as_micros()).unwrap_or(u64::MAX),
                });
            }
            Err(e @ (SequenceError::KvBudget { .. } | SequenceError::KvWait { .. })) => {
                self.fail(SchedError::KvBudget(e));
            }
            Err(SequenceError::Generate(GenerateError::Cancelled)) => self.answered = true,
            Err(SequenceError::Generate(GenerateError::Forward(ForwardError::Device(e)))) => {
                self.fail(SchedError::Device(e));
            }
            Err(
                e @ (SequenceError::Generate(GenerateError::Forward(_))
                | SequenceError::Accounting(_)
                | SequenceError::StepFailed(_)),
            ) => {
                self.fail(SchedError::Internal(e.to_string()));
            }
            // Validated before queueing; kept as the client's fault should it happen.
            Err(SequenceError::Generate(e)) => self.fail(SchedError::BadRequest(e)),
        }
    }

    fn ran(&mut self, run: StepRun) {
        // The step's time shared by the tokens each sequence ran in it.
        let step = run.end.duration_since(run.start).unwrap_or_default();
        let share = run.range.len() as f64 / run.step_tokens.max(1) as f64;
        self.compute += step.mul_f64(share);
        self.trace.ran(&run);
    }

    fn preempted(&mut self) {
        self.trace.preempted();
    }
}

impl Drop for StreamSink {
    fn drop(&mut self) {
        match self.stage {
            Stage::Queued => self.counters.unqueue(),
            Stage::Running => self.counters.stop(),
        }
        if !self.answered {
            self.fail(SchedError::Internal("generation failed (a bug)".into()));
        }
    }
}
