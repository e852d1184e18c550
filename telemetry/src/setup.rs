//! Installs the process's logs and, when configured, its trace export.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{MetricExporter, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::Sampler;
use tokio::runtime::Handle;
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, Registry};

use crate::Error;
use crate::export::{QueueProcessor, SpanCounts};
use crate::logs::{JsonLines, LogFormat};
use crate::metrics::OnRuntime;
use crate::settings::{Protocol, SamplerChoice, Settings};

/// Telemetry in force; dropping it exports what is queued (waiting at
/// most [`SHUTDOWN_WAIT`]).
#[derive(Debug)]
pub struct Telemetry {
    spans: Option<QueueProcessor>,
    meters: Option<SdkMeterProvider>,
    /// Runs the exporters (`otel-export`); dropped last.
    runtime: Option<tokio::runtime::Runtime>,
    counts: Option<Arc<SpanCounts>>,
    settings: Option<Settings>,
    format: LogFormat,
}

/// Longest the last export waits at exit.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

impl Telemetry {
    /// What happened to this process's spans; `None` when not exporting.
    pub fn span_counts(&self) -> Option<Arc<SpanCounts>> {
        self.counts.clone()
    }

    /// The export settings in force; `None` when not exporting.
    pub fn settings(&self) -> Option<&Settings> {
        self.settings.as_ref()
    }

    /// How log lines are written.
    pub fn log_format(&self) -> LogFormat {
        self.format
    }

    /// Exports every finished span now (tests, and before exit).
    pub fn flush(&self) {
        if let Some(spans) = &self.spans {
            let _ = spans.force_flush();
        }
        if let Some(meters) = &self.meters {
            let _ = meters.force_flush();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(spans) = self.spans.take() {
            let _ = spans.shutdown_with_timeout(SHUTDOWN_WAIT);
        }
        if let Some(meters) = self.meters.take() {
            let _ = meters.shutdown_with_timeout(SHUTDOWN_WAIT);
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

/// Installs logs in `format` on stderr (filtered by `RUST_LOG`, default
/// `default_filter`) and, with `settings`, the OTLP trace export, and the
/// metric export when `settings` has a metrics endpoint and `metrics` asks
/// for it. Once per process, outside any Tokio runtime.
pub fn init(
    format: LogFormat,
    default_filter: &str,
    settings: Option<Settings>,
    metrics: bool,
) -> Result<Telemetry, Error> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => fmt
            .with_ansi(false)
            .event_format(JsonLines)
            .with_filter(filter)
            .boxed(),
    };
    let runtime = match &settings {
        None => None,
        Some(_) => Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("otel-export")
                .enable_all()
                .build()
                .map_err(|e| Error::Start(format!("the export runtime: {e}")))?,
        ),
    };
    let meters = match (&settings, &runtime) {
        (Some(s), Some(rt)) if metrics => match &s.metrics_endpoint {
            Some(endpoint) => {
                let provider = meter_provider(s, endpoint, rt.handle())?;
                opentelemetry::global::set_meter_provider(provider.clone());
                Some(provider)
            }
            None => None,
        },
        _ => None,
    };
    let (processor, counts, layer) = match (&settings, &runtime) {
        (Some(s), Some(rt)) => {
            let processor = processor(s, rt.handle())?;
            let counts = processor.counts();
            let scope = InstrumentationScope::builder("bulkhead")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build();
            let layer = crate::spans::layer(sampler(s.sampler), scope, processor.sink());
            (Some(processor), Some(counts), Some(layer))
        }
        _ => (None, None, None),
    };
    let subscriber = Registry::default().with(logs).with(layer);
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| Error::Start(format!("logging was set up twice: {e}")))?;
    Ok(Telemetry {
        spans: processor,
        meters,
        runtime,
        counts,
        settings,
        format,
    })
}

fn processor(s: &Settings, runtime: &Handle) -> Result<QueueProcessor, Error> {
    let start = |e: String| Error::Start(format!("the OTLP exporter for traces: {e}"));
    let (endpoint, timeout) = (s.endpoint.as_str(), s.export_timeout);
    match s.protocol {
        Protocol::Grpc => {
            QueueProcessor::start(runtime, s, sampler(s.sampler), resource(s), || {
                crate::otlp::SpanExporter::grpc(endpoint, timeout, &s.headers).map_err(start)
            })
        }
        Protocol::HttpProtobuf => {
            https_refused(endpoint)?;
            QueueProcessor::start(runtime, s, sampler(s.sampler), resource(s), || {
                crate::otlp::SpanExporter::http(endpoint, timeout, &s.headers).map_err(start)
            })
        }
    }
}

/// Metrics every `metric_interval`, cumulative, to `endpoint`.
fn meter_provider(
    s: &Settings,
    endpoint: &str,
    runtime: &Handle,
) -> Result<SdkMeterProvider, Error> {
    let built = |e: opentelemetry_otlp::ExporterBuildError| {
        Error::Start(format!("the OTLP exporter for metrics: {e}"))
    };
    let exporter = {
        let _inside = runtime.enter();
        match s.protocol {
            Protocol::Grpc => {
                let mut builder = MetricExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint)
                    .with_timeout(s.export_timeout);
                if endpoint.starts_with("https://") {
                    builder = builder.with_tls_config(
                        tonic::transport::ClientTlsConfig::new().with_native_roots(),
                    );
                }
                builder.build().map_err(built)?
            }
            Protocol::HttpProtobuf => {
                https_refused(endpoint)?;
                let client = opentelemetry_http::hyper::HyperClient::with_default_connector(
                    s.export_timeout,
                    None,
                );
                MetricExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(endpoint)
                    .with_timeout(s.export_timeout)
                    .build()
                    .map_err(built)?
            }
        }
    };
    let exporter = OnRuntime {
        inner: exporter,
        runtime: runtime.clone(),
    };
    let reader = PeriodicReader::builder(exporter)
        .with_interval(s.metric_interval)
        .build();
    Ok(SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource(s))
        .build())
}

/// HTTP/protobuf export is plain HTTP only.
fn https_refused(endpoint: &str) -> Result<(), Error> {
    if endpoint.starts_with("https://") {
        return Err(Error::Setting {
            from: "endpoint".into(),
            why: format!(
                "`{endpoint}`: HTTPS export is supported over grpc only; use protocol grpc, \
                 or a collector on http:// (a local agent)"
            ),
        });
    }
    Ok(())
}

fn sampler(choice: SamplerChoice) -> Sampler {
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::TraceIdRatio(r) => Sampler::TraceIdRatioBased(r),
        SamplerChoice::ParentBasedAlwaysOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        SamplerChoice::ParentBasedAlwaysOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        SamplerChoice::ParentBasedTraceIdRatio(r) => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r)))
        }
    }
}

fn resource(s: &Settings) -> Resource {
    Resource::builder_empty()
        .with_service_name(s.service_name.clone())
        .with_attributes(
            s.resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}
