//! Bulkhead's telemetry, shared by the gateway and the gpu-host: logs
//! (text or JSON lines carrying `trace_id` and `span_id`) and OpenTelemetry
//! traces exported over OTLP (gRPC or HTTP/protobuf) when configured.
//!
//! [`init`] installs both once per process. Spans come from `tracing`
//! (through our own layer, [`spans`]) or, where their times are known only
//! afterwards (the gpu-host's scheduler), from [`start_span`] and [`emit`];
//! only spans whose target starts with `bulkhead` are exported, never a
//! library's, and no log line becomes a span event. [`propagation`] carries
//! W3C `traceparent`/`tracestate` across HTTP and gRPC.

mod export;
mod logs;
mod metrics;
mod otlp;
pub mod propagation;
mod settings;
mod setup;
pub mod spans;

pub use export::{EXPORT_INTERVAL, QueueProcessor, SpanCounts, defer, emit, start_span};
pub use logs::LogFormat;
pub use settings::{MAX_EXPORT_BATCH, Protocol, SamplerChoice, Settings, TelemetryFile};
pub use setup::{Telemetry, init};

/// What went wrong setting telemetry up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is wrong; `from` names where it came from (a variable or
    /// a `[telemetry]` key).
    #[error("{from}: {why}")]
    Setting { from: String, why: String },
    /// The exporter or its thread could not start.
    #[error("telemetry could not start: {0}")]
    Start(String),
}
