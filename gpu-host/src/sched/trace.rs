//! One generation's spans on the gpu-host, continuing the caller's trace
//! (the W3C context the gateway sent in the gRPC metadata).
//!
//! ```text
//! gpu_host.generate (server; tenant, model, tokens, finish reason, preemptions)
//!   ├─ queue          submit → joined a batch
//!   ├─ prefill        one per prompt chunk run (again after a preemption)
//!   └─ decode         first token → end (time to first token, tokens,
//!                     time per output token as attributes)
//! ```
//!
//! The scheduler runs many sequences per step on one thread, and that
//! thread's time is the product: it only notes when things happened (a
//! clock read each), and the spans are written afterwards, with those
//! times, on the export thread ([`bulkhead_telemetry::defer`]), straight
//! into the export queue ([`bulkhead_telemetry::emit`]): no SDK span is
//! made. When the caller's trace is not sampled, or export is off, nothing
//! is noted and a [`SeqTrace`] is an empty `Option`.

use std::sync::OnceLock;
use std::time::SystemTime;

use bulkhead_telemetry::emit;
use bulkhead_telemetry::spans::SpanIds;
use opentelemetry::trace::{Event, SpanKind, Status};
use opentelemetry::{Context, InstrumentationScope, KeyValue};

use super::sequence::StepRun;

/// The spans of one generation.
#[derive(Debug, Default)]
pub(crate) struct SeqTrace(Option<Box<Recording>>);

#[derive(Debug)]
struct Recording {
    /// The `gpu_host.generate` span's.
    ids: SpanIds,
    /// Its attributes known at the start.
    attributes: Vec<KeyValue>,
    queued_at: SystemTime,
    joined_at: Option<SystemTime>,
    /// Each prompt chunk run: (tokens, first position, start, end).
    prefills: Vec<(usize, usize, SystemTime, SystemTime)>,
    preempted_at: Vec<SystemTime>,
    first_token_at: Option<SystemTime>,
    last_token_at: Option<SystemTime>,
    tokens: u64,
    prompt_tokens: usize,
}

/// The instrumentation scope of the spans written here.
fn scope() -> &'static InstrumentationScope {
    static SCOPE: OnceLock<InstrumentationScope> = OnceLock::new();
    SCOPE.get_or_init(|| {
        InstrumentationScope::builder("bulkhead-gpu-host")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build()
    })
}

const GENERATE: &str = "gpu_host.generate";

impl SeqTrace {
    /// Starts the server span of a generation under `parent` (the caller's
    /// context, or an empty one: a new trace).
    pub(crate) fn start(
        parent: &Context,
        tenant: &str,
        model: &str,
        max_tokens: u32,
        prompt_tokens: usize,
    ) -> SeqTrace {
        let Some(ids) = bulkhead_telemetry::start_span(parent, GENERATE, &SpanKind::Server) else {
            return SeqTrace(None);
        };
        SeqTrace(Some(Box::new(Recording {
            ids,
            attributes: vec![
                KeyValue::new("bulkhead.tenant", tenant.to_string()),
                KeyValue::new("gen_ai.request.model", model.to_string()),
                KeyValue::new("gen_ai.request.max_tokens", i64::from(max_tokens)),
            ],
            queued_at: SystemTime::now(),
            joined_at: None,
            prefills: Vec::new(),
            preempted_at: Vec::new(),
            first_token_at: None,
            last_token_at: None,
            tokens: 0,
            prompt_tokens,
        })))
    }

    /// The sequence joined a batch: the queue wait ends.
    pub(crate) fn joined(&mut self) {
        let Some(r) = self.0.as_deref_mut() else {
            return;
        };
        r.joined_at.get_or_insert_with(SystemTime::now);
    }

    /// A step ran part of the sequence.
    pub(crate) fn ran(&mut self, run: &StepRun) {
        let Some(r) = self.0.as_deref_mut() else {
            return;
        };
        if !run.decode {
            r.prefills
                .push((run.range.len(), run.range.start, run.start, run.end));
        }
        if run.sampled {
            r.tokens += 1;
            r.first_token_at.get_or_insert(run.end);
            r.last_token_at = Some(run.end);
        }
    }

    /// The planner took the sequence's blocks back; it is recomputed.
    pub(crate) fn preempted(&mut self) {
        if let Some(r) = self.0.as_deref_mut() {
            r.preempted_at.push(SystemTime::now());
        }
    }

    /// The generation ended: `outcome` is the finish reason (`stop`,
    /// `length`) or why it failed (`failed`); `completion_tokens` is the
    /// host's count when it has one, else the tokens sampled.
    pub(crate) fn finish(
        &mut self,
        outcome: &'static str,
        failed: bool,
        completion_tokens: Option<usize>,
    ) {
        let Some(r) = self.0.take() else {
            return;
        };
        let end = Ended {
            at: SystemTime::now(),
            outcome,
            failed,
            completion_tokens: completion_tokens.unwrap_or(r.tokens as usize),
        };
        let spans = 1
            + usize::from(r.joined_at.is_some())
            + r.prefills.len()
            + usize::from(r.first_token_at.is_some());
        // Off this thread; without an export running, nothing is recorded.
        bulkhead_telemetry::defer(spans, move || r.write(end));
    }
}

impl Drop for SeqTrace {
    fn drop(&mut self) {
        // A sequence that ended without `finish` (the client left).
        self.finish("cancelled", true, None);
    }
}

/// How a generation ended.
#[derive(Debug)]
struct Ended {
    at: SystemTime,
    outcome: &'static str,
    failed: bool,
    completion_tokens: usize,
}

impl Recording {
    /// Writes the child spans and the generation's (on the export
    /// thread).
    fn write(mut self, end: Ended) {
        if let Some(joined) = self.joined_at {
            self.child("queue", self.queued_at, joined, Vec::new());
        }
        for &(tokens, first, start, stop) in &self.prefills {
            let attributes = vec![
                KeyValue::new("bulkhead.prefill.tokens", tokens as i64),
                KeyValue::new("bulkhead.prefill.start", first as i64),
            ];
            self.child("prefill", start, stop, attributes);
        }
        if let Some(first) = self.first_token_at {
            let ttft = first.duration_since(self.queued_at).unwrap_or_default();
            let mut attributes = vec![
                KeyValue::new("gen_ai.usage.output_tokens", end.completion_tokens as i64),
                KeyValue::new("bulkhead.time_to_first_token_ms", ttft.as_secs_f64() * 1e3),
            ];
            if let (Some(last), true) = (self.last_token_at, self.tokens > 1) {
                let per = last.duration_since(first).unwrap_or_default() / (self.tokens - 1) as u32;
                attributes.push(KeyValue::new(
                    "bulkhead.time_per_output_token_ms",
                    per.as_secs_f64() * 1e3,
                ));
            }
            self.child("decode", first, end.at, attributes);
        }
        let events = (self.preempted_at.iter())
            .map(|&at| Event::new("preempted", at, Vec::new(), 0))
            .collect();
        let mut attributes = std::mem::take(&mut self.attributes);
        attributes.push(KeyValue::new(
            "gen_ai.usage.input_tokens",
            self.prompt_tokens as i64,
        ));
        attributes.push(KeyValue::new(
            "gen_ai.usage.output_tokens",
            end.completion_tokens as i64,
        ));
        let status = if end.failed {
            attributes.push(KeyValue::new("error.type", end.outcome));
            Status::error(end.outcome)
        } else {
            attributes.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(
                    vec![opentelemetry::StringValue::from(end.outcome)].into(),
                ),
            ));
            Status::Unset
        };
        emit(self.ids.span(
            scope(),
            GENERATE,
            SpanKind::Server,
            self.queued_at,
            end.at,
            attributes,
            events,
            status,
        ));
    }

    fn child(
        &self,
        name: &'static str,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
    ) {
        emit(self.ids.child().span(
            scope(),
            name,
            SpanKind::Internal,
            start,
            end,
            attributes,
            Vec::new(),
            Status::Unset,
        ));
    }
}
