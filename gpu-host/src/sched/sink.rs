//! One generation's stream as the scheduler sees it: the engine's
//! [`SequenceSink`] turned into gRPC events.
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

use bulkhead_protocol::v1::{self, generate_event::Event};
use tokio::sync::mpsc::error::TrySendError;
use tonic::Status;

use super::counters::Counted;
use super::job::EventSender;
use super::sequence::{SequenceError, SequenceSink};
use crate::engine::{Decoded, FinishReason, GenerateError, Piece};
use crate::models::LoadedModel;

type Item = Result<v1::GenerateEvent, Status>;

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
}

impl StreamSink {
    /// The sink of an accepted request (counted as queued since `submit`).
    pub(crate) fn new(
        model: Arc<LoadedModel>,
        prompt_tokens: usize,
        outbox: Rc<RefCell<Outbox>>,
        counters: Counted,
    ) -> StreamSink {
        StreamSink {
            model,
            prompt_tokens,
            outbox,
            counters,
            stage: Stage::Queued,
            answered: false,
        }
    }

    fn send(&mut self, event: Event) {
        self.outbox
            .borrow_mut()
            .push(Ok(v1::GenerateEvent { event: Some(event) }));
    }

    /// Answers with an error before the sequence reaches a batch.
    pub(crate) fn refuse(mut self, status: Status) {
        self.fail(status);
    }

    fn fail(&mut self, status: Status) {
        self.answered = true;
        self.outbox.borrow_mut().push(Err(status));
    }
}

impl SequenceSink for StreamSink {
    fn started(&mut self) {
        if self.stage == Stage::Queued {
            self.counters.start();
            self.stage = Stage::Running;
        }
        let started = Event::Started(v1::Started {
            prompt_tokens: count(self.prompt_tokens),
            model: self.model.name.clone(),
            model_digest: self.model.digest.clone(),
            weights_verified_at_unix_ms: self.model.weights.verified_at_ms(),
        });
        self.send(started);
    }

    fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()> {
        self.send(Event::Delta(v1::Delta {
            text: piece.text.to_string(),
            token_ids: piece.tokens.to_vec(),
        }));
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
            self.fail(out_of_service(&self.model.name, reason));
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn finished(&mut self, result: Result<Decoded, SequenceError>) {
        match result {
            Ok(done) => {
                let reason = match done.finish_reason {
                    FinishReason::Stop => v1::FinishReason::Stop,
                    FinishReason::Length => v1::FinishReason::Length,
                };
                self.answered = true;
                self.send(Event::Finished(v1::Finished {
                    finish_reason: reason.into(),
                    usage: Some(v1::Usage {
                        prompt_tokens: count(self.prompt_tokens),
                        completion_tokens: count(done.tokens.len()),
                    }),
                }));
            }
            Err(e @ (SequenceError::KvBudget { .. } | SequenceError::KvWait { .. })) => {
                self.fail(Status::resource_exhausted(e.to_string()));
            }
            Err(SequenceError::Generate(GenerateError::Cancelled)) => self.answered = true,
            Err(
                e @ (SequenceError::Generate(GenerateError::Forward(_))
                | SequenceError::Accounting(_)
                | SequenceError::StepFailed(_)),
            ) => {
                self.fail(Status::internal(e.to_string()));
            }
            // Validated before queueing; kept as the client's fault should it happen.
            Err(e @ SequenceError::Generate(_)) => {
                self.fail(Status::invalid_argument(e.to_string()));
            }
        }
    }
}

impl Drop for StreamSink {
    fn drop(&mut self) {
        match self.stage {
            Stage::Queued => self.counters.unqueue(),
            Stage::Running => self.counters.stop(),
        }
        if !self.answered {
            self.fail(Status::internal("generation failed (a bug)"));
        }
    }
}

/// The status of a request for a model taken out of service.
pub(crate) fn out_of_service(name: &str, reason: &str) -> Status {
    Status::failed_precondition(format!("model `{name}` is out of service: {reason}"))
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
