//! Spans, made lean: our `tracing` layer and the record behind it.
//!
//! [`SpanLayer`] turns the spans of `bulkhead*` targets into OpenTelemetry
//! spans. A span's [`Record`] (ids, start, name, kind, attributes) lives in
//! the `tracing` registry's extensions from creation to close; at close a
//! sampled one becomes a [`SpanData`] on the export queue. There is no SDK
//! span in between, no context object per span and no per-span sampler
//! call: the sampler decides once per trace root (when the span starts
//! without a parent, and again at [`set_parent`]) and children inherit the
//! decision, which is what every sampler we offer would decide for them
//! anyway (the ratio sampler looks only at the trace id).
//!
//! It replaced `tracing-opentelemetry`, at the same cost per request and
//! with one dependency fewer (`tests/bench/gateway_overhead/README.md`).
//!
//! Spans whose times are known only afterwards (the gpu-host's scheduler)
//! use [`SpanIds`] and [`SpanIds::span`] instead, and hand the result to
//! [`crate::emit`] from a deferred job.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, InstrumentationScope, Key, KeyValue, Value};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, ShouldSample, SpanData, SpanEvents,
    SpanLinks,
};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as Values};
use tracing::{Dispatch, Metadata, Subscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context as LayerContext, Layer};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

/// Where finished spans go (the export queue; a test's list).
pub(crate) type Sink = Arc<dyn Fn(SpanData) + Send + Sync>;

/// Our spans only: no library's (see [`layer`]).
fn ours(target: &str) -> bool {
    target.starts_with("bulkhead")
}

/// A span's identity in its trace, and whether the trace is sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanIds {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `SpanId::INVALID` for a root.
    pub parent_id: SpanId,
    pub parent_remote: bool,
    pub sampled: bool,
    pub trace_state: TraceState,
}

impl SpanIds {
    /// A new root (a new trace) or the child of the context `parent`
    /// holds, sampled as `sampler` decides.
    pub fn start(sampler: &Sampler, parent: &Context, name: &str, kind: &SpanKind) -> SpanIds {
        let ids = RandomIdGenerator::default();
        let span = parent.span();
        let sc = span.span_context();
        let (trace_id, parent_id, parent_remote, trace_state, parent_cx) = if sc.is_valid() {
            let state = sc.trace_state().clone();
            (
                sc.trace_id(),
                sc.span_id(),
                sc.is_remote(),
                state,
                Some(parent),
            )
        } else {
            let id = ids.new_trace_id();
            (id, SpanId::INVALID, false, TraceState::NONE, None)
        };
        let decision = sampler.should_sample(parent_cx, trace_id, name, kind, &[], &[]);
        SpanIds {
            trace_id,
            span_id: ids.new_span_id(),
            parent_id,
            parent_remote,
            sampled: decision.decision == SamplingDecision::RecordAndSample,
            trace_state,
        }
    }

    /// A child of this span: same trace and decision, a new span id.
    pub fn child(&self) -> SpanIds {
        SpanIds {
            trace_id: self.trace_id,
            span_id: RandomIdGenerator::default().new_span_id(),
            parent_id: self.span_id,
            parent_remote: false,
            sampled: self.sampled,
            trace_state: self.trace_state.clone(),
        }
    }

    /// The context a callee continues (what `traceparent` carries).
    pub fn context(&self) -> SpanContext {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::NOT_SAMPLED
        };
        SpanContext::new(
            self.trace_id,
            self.span_id,
            flags,
            false,
            self.trace_state.clone(),
        )
    }

    /// The finished span, for export.
    #[allow(clippy::too_many_arguments)]
    pub fn span(
        &self,
        scope: &InstrumentationScope,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
        events: Vec<Event>,
        status: Status,
    ) -> SpanData {
        let mut span_events = SpanEvents::default();
        span_events.events = events;
        SpanData {
            span_context: self.context(),
            parent_span_id: self.parent_id,
            parent_span_is_remote: self.parent_remote,
            span_kind: kind,
            name: name.into(),
            start_time: start,
            end_time: end,
            attributes,
            dropped_attributes_count: 0,
            events: span_events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: scope.clone(),
        }
    }
}

/// What a `tracing` span holds while it is open.
#[derive(Debug)]
struct Record {
    ids: SpanIds,
    meta: &'static Metadata<'static>,
    name: Cow<'static, str>,
    kind: SpanKind,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    /// Where each of the span's own fields is in `attributes` (by the
    /// field's index in its callsite; [`UNSET`] until it has a value):
    /// recording one is a store, with no key to compare.
    slots: [u8; MAX_FIELDS],
    status: Status,
}

/// The most fields a `tracing` macro gives a callsite.
const MAX_FIELDS: usize = 32;
const UNSET: u8 = u8::MAX;

impl Record {
    fn new(meta: &'static Metadata<'static>) -> Record {
        Record {
            ids: SpanIds {
                trace_id: TraceId::INVALID,
                span_id: SpanId::INVALID,
                parent_id: SpanId::INVALID,
                parent_remote: false,
                sampled: false,
                trace_state: TraceState::NONE,
            },
            meta,
            name: Cow::Borrowed(meta.name()),
            kind: SpanKind::Internal,
            start: SystemTime::now(),
            attributes: Vec::with_capacity(meta.fields().len()),
            slots: [UNSET; MAX_FIELDS],
            status: Status::Unset,
        }
    }

    fn field(&mut self, field: &Field, value: Value) {
        let Some(slot) = self.slots.get_mut(field.index()) else {
            // (A callsite made by hand may have more fields than macros.)
            return self.set_by_key(field.name(), value);
        };
        if *slot != UNSET {
            // Attributes are only ever added: the slot still points at it.
            self.attributes[usize::from(*slot)].value = value;
        } else if let Ok(at) = u8::try_from(self.attributes.len())
            && at != UNSET
        {
            *slot = at;
            let key = Key::from_static_str(field.name());
            self.attributes.push(KeyValue::new(key, value));
        } else {
            // Past 254 attributes, a field is found by its key.
            self.set_by_key(field.name(), value);
        }
    }

    fn set(&mut self, key: &'static str, value: Value) {
        match self.meta.fields().field(key) {
            Some(field) => self.field(&field, value),
            None => self.set_by_key(key, value),
        }
    }

    fn set_by_key(&mut self, key: &'static str, value: Value) {
        match self.attributes.iter_mut().find(|kv| kv.key.as_str() == key) {
            Some(kv) => kv.value = value,
            None => self
                .attributes
                .push(KeyValue::new(Key::from_static_str(key), value)),
        }
    }
}

/// The layer: see the module's documentation.
pub(crate) struct SpanLayer {
    sampler: Sampler,
    scope: InstrumentationScope,
    sink: Sink,
}

/// The layer, seeing only our spans. The filter matters for speed, not
/// only for what is exported: a layer without one would make `tracing`
/// create (and enter and exit at every poll) every span of every library,
/// h2's and hyper's included, which the log filter otherwise turns away
/// (measured: twice the gateway's tracing cost).
pub(crate) fn layer<S>(sampler: Sampler, scope: InstrumentationScope, sink: Sink) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let layer = SpanLayer {
        sampler,
        scope,
        sink,
    };
    layer.with_filter(filter_fn(|meta| meta.is_span() && ours(meta.target())))
}

/// The ids of the nearest span in `scope` (leaf first) that has a record.
fn nearest<'a, R: LookupSpan<'a>>(span: Option<SpanRef<'a, R>>) -> Option<SpanIds> {
    span?
        .scope()
        .find_map(|s| s.extensions().get::<Record>().map(|r| r.ids.clone()))
}

impl<S> Layer<S> for SpanLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let meta = attrs.metadata();
        let Some(span) = ctx.span(id) else {
            return;
        };
        let parent = if let Some(parent) = attrs.parent() {
            nearest(ctx.span(parent))
        } else if attrs.is_contextual() {
            nearest(ctx.lookup_current())
        } else {
            None
        };
        let mut record = Record::new(meta);
        // The fields set at creation are kept even when unsampled: a
        // parent set later may make the trace sampled.
        attrs.record(&mut Fields(&mut record));
        record.ids = match parent {
            Some(parent) => parent.child(),
            None => SpanIds::start(&self.sampler, &Context::new(), &record.name, &record.kind),
        };
        span.extensions_mut().insert(record);
    }

    fn on_record(&self, id: &Id, values: &Values<'_>, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        if let Some(record) = extensions.get_mut::<Record>()
            && record.ids.sampled
        {
            values.record(&mut Fields(record));
        }
    }

    fn on_close(&self, id: Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(record) = span.extensions_mut().remove::<Record>() else {
            return;
        };
        if !record.ids.sampled {
            return;
        }
        let data = record.ids.span(
            &self.scope,
            record.name,
            record.kind,
            record.start,
            SystemTime::now(),
            record.attributes,
            Vec::new(),
            record.status,
        );
        (self.sink)(data);
    }
}

/// Field values into the record; `otel.name`, `otel.kind` and
/// `otel.status_code` set the span's name, kind and status.
struct Fields<'a>(&'a mut Record);

impl Fields<'_> {
    fn value(&mut self, field: &Field, value: Value) {
        self.0.field(field, value);
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "otel.name" => self.0.name = Cow::Owned(value.to_string()),
            "otel.kind" => self.0.kind = kind(value),
            "otel.status_code" => {
                self.0.status = match value {
                    "ERROR" | "error" => Status::error(""),
                    "OK" | "ok" => Status::Ok,
                    _ => Status::Unset,
                }
            }
            _ => self.value(field, Value::from(value.to_string())),
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.value(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        let value = match i64::try_from(value) {
            Ok(v) => Value::I64(v),
            Err(_) => Value::from(value.to_string()),
        };
        self.value(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.value(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.value(field, Value::Bool(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.value(field, Value::from(format!("{value:?}")));
    }
}

fn kind(name: &str) -> SpanKind {
    match name {
        "server" => SpanKind::Server,
        "client" => SpanKind::Client,
        "producer" => SpanKind::Producer,
        "consumer" => SpanKind::Consumer,
        _ => SpanKind::Internal,
    }
}

/// Runs `f` on `span`'s record and the layer that made it, if it has one
/// (export on, a `bulkhead*` span, not yet closed).
fn with_record<T>(span: &tracing::Span, f: impl FnOnce(&SpanLayer, &mut Record) -> T) -> Option<T> {
    span.with_subscriber(|(id, dispatch): (&Id, &Dispatch)| {
        let layer = dispatch.downcast_ref::<SpanLayer>()?;
        let registry = dispatch.downcast_ref::<Registry>()?;
        let span = registry.span(id)?;
        let mut extensions = span.extensions_mut();
        extensions.get_mut::<Record>().map(|r| f(layer, r))
    })
    .flatten()
}

/// Makes `span` (just created, before any child) continue the trace `cx`
/// holds, sampled as the sampler decides for that parent. An empty `cx`
/// changes nothing: the span stays a root.
pub fn set_parent(span: &tracing::Span, cx: &Context) {
    if !cx.span().span_context().is_valid() {
        return;
    }
    with_record(span, |layer, record| {
        let span_id = record.ids.span_id;
        record.ids = SpanIds::start(&layer.sampler, cx, &record.name, &record.kind);
        record.ids.span_id = span_id;
    });
}

/// Sets an attribute the `tracing` fields cannot carry (an array, a value
/// computed late) on `span`; nothing when it is not exported.
pub fn set_attribute(span: &tracing::Span, key: &'static str, value: impl Into<Value>) {
    with_record(span, |_, record| {
        if record.ids.sampled {
            record.set(key, value.into());
        }
    });
}

/// The trace context of `span`, for a callee to continue (`None` when the
/// span is not exported).
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    with_record(span, |_, record| record.ids.context())
}

/// The trace and span ids of the nearest span in `scope` (leaf first)
/// that has a record, sampled or not (an unsampled span's ids are real and
/// propagated), as lower-case hex (for log lines).
pub(crate) fn log_ids<'a, R: LookupSpan<'a>>(span: SpanRef<'a, R>) -> Option<(String, String)> {
    nearest(Some(span)).map(|ids| (ids.trace_id.to_string(), ids.span_id.to_string()))
}

#[cfg(test)]
mod tests;
