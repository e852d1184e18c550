//! A real OTLP trace receiver for the tests: the collector's
//! `TraceService` over gRPC, or `POST /v1/traces` with a protobuf body over
//! HTTP, both from the `opentelemetry-proto` definitions. It keeps every
//! span it is sent, flattened with its resource's `service.name`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric;
use prost::Message;
use serde_json::Value;
use tokio::sync::oneshot;

/// One span as received.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    /// Hex, as in `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `SpanKind` as its number (2: server, 3: client).
    pub kind: i32,
    pub attributes: BTreeMap<String, Value>,
    pub events: Vec<String>,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    /// The status code (2: error).
    pub status: i32,
}

impl ReceivedSpan {
    pub fn attr(&self, key: &str) -> &Value {
        self.attributes
            .get(key)
            .unwrap_or_else(|| panic!("span `{}` has no `{key}`: {:?}", self.name, self.attributes))
    }
}

/// What the receiver keeps: every span (tests), or a count (benches,
/// where keeping millions of spans would cost more than the gateway).
#[derive(Debug, Default)]
struct Kept {
    spans: Mutex<Vec<ReceivedSpan>>,
    points: Mutex<Vec<ReceivedPoint>>,
    count_only: bool,
    count: std::sync::atomic::AtomicU64,
    /// A header every span export must carry, else it is refused.
    required: Mutex<Option<(String, String)>>,
}

impl Kept {
    /// Whether an export with `get`'s headers may pass.
    fn admits(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        match &*self.required.lock().unwrap() {
            None => true,
            Some((name, value)) => get(name).as_deref() == Some(value.as_str()),
        }
    }
}

type Spans = Arc<Kept>;

/// One histogram data point as received (the latest export of it wins:
/// the gateway exports cumulative values).
#[derive(Clone, Debug)]
pub struct ReceivedPoint {
    pub service: String,
    pub metric: String,
    pub unit: String,
    pub attributes: BTreeMap<String, Value>,
    pub count: u64,
    pub sum: f64,
}

/// A running receiver; stops when dropped.
#[derive(Debug)]
pub struct Receiver {
    pub addr: SocketAddr,
    spans: Spans,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`) on a free loopback port.
    pub fn grpc() -> Receiver {
        Receiver::grpc_on("127.0.0.1:0", false)
    }

    /// gRPC on `addr`; with `count_only` it counts spans and keeps none.
    pub fn grpc_on(addr: &str, count_only: bool) -> Receiver {
        Receiver::start(addr, count_only, |listener, spans, stop| {
            Box::pin(async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(Collector(Arc::clone(&spans))))
                    .add_service(MetricsServiceServer::new(Collector(spans)))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stop.await;
                    })
                    .await;
            })
        })
    }

    /// HTTP/protobuf (`http/protobuf`) on a free loopback port.
    pub fn http() -> Receiver {
        Receiver::start("127.0.0.1:0", false, |listener, spans, stop| {
            Box::pin(async move {
                let app = axum::Router::new().route(
                    "/v1/traces",
                    axum::routing::post(
                        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                            let spans = Arc::clone(&spans);
                            async move {
                                let header = |name: &str| {
                                    headers
                                        .get(name)
                                        .and_then(|v| v.to_str().ok())
                                        .map(String::from)
                                };
                                if !spans.admits(header) {
                                    return (
                                        axum::http::StatusCode::UNAUTHORIZED,
                                        [("content-type", "text/plain")],
                                        b"the required header is missing".to_vec(),
                                    );
                                }
                                match ExportTraceServiceRequest::decode(body) {
                                    Ok(request) => {
                                        keep(&spans, request);
                                        let reply =
                                            ExportTraceServiceResponse::default().encode_to_vec();
                                        (
                                            axum::http::StatusCode::OK,
                                            [("content-type", "application/x-protobuf")],
                                            reply,
                                        )
                                    }
                                    Err(_) => (
                                        axum::http::StatusCode::BAD_REQUEST,
                                        [("content-type", "text/plain")],
                                        b"not an ExportTraceServiceRequest".to_vec(),
                                    ),
                                }
                            }
                        },
                    ),
                );
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stop.await;
                    })
                    .await;
            })
        })
    }

    fn start(
        addr: &str,
        count_only: bool,
        serve: impl FnOnce(
            tokio::net::TcpListener,
            Spans,
            oneshot::Receiver<()>,
        ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + 'static,
    ) -> Receiver {
        let spans: Spans = Arc::new(Kept {
            count_only,
            ..Kept::default()
        });
        let addr = addr.to_string();
        let (stop, stopped) = oneshot::channel();
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let kept = Arc::clone(&spans);
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind(&addr)
                    .await
                    .unwrap_or_else(|e| panic!("binding {addr}: {e}"));
                bound_tx.send(listener.local_addr().unwrap()).unwrap();
                serve(listener, kept, stopped).await;
            });
        });
        let addr = bound_rx.recv().expect("the receiver binds");
        Receiver {
            addr,
            spans,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The endpoint to configure (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.spans.lock().unwrap().clone()
    }

    /// Every histogram point received so far (gRPC only), latest last.
    pub fn points(&self) -> Vec<ReceivedPoint> {
        self.spans.points.lock().unwrap().clone()
    }

    /// Refuses from now on every span export without header `name` set
    /// to `value` (a collector's API key).
    pub fn require_header(&self, name: &str, value: &str) {
        *self.spans.required.lock().unwrap() = Some((name.into(), value.into()));
    }

    /// How many spans arrived.
    pub fn count(&self) -> u64 {
        self.spans.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The spans of trace `trace_id` once `done` says they are all there,
    /// or a panic naming `what` after `timeout`.
    pub fn trace(
        &self,
        trace_id: &str,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let until = Instant::now() + timeout;
        loop {
            let trace: Vec<ReceivedSpan> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            if done(&trace) {
                return trace;
            }
            if Instant::now() > until {
                let names: Vec<(&str, &str)> = trace
                    .iter()
                    .map(|s| (s.service.as_str(), s.name.as_str()))
                    .collect();
                panic!("{what}: not received within {timeout:?}; have {names:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Collector(Spans);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let metadata = request.metadata();
        let header = |name: &str| {
            metadata
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(String::from)
        };
        if !self.0.admits(header) {
            return Err(tonic::Status::unauthenticated(
                "the required header is missing",
            ));
        }
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let mut points = self.0.points.lock().unwrap();
        for resource in request.into_inner().resource_metrics {
            let service = service_name(resource.resource.iter().flat_map(|r| &r.attributes));
            for scope in resource.scope_metrics {
                for m in scope.metrics {
                    let Some(metric::Data::Histogram(h)) = m.data else {
                        continue;
                    };
                    for p in h.data_points {
                        points.push(ReceivedPoint {
                            service: service.clone(),
                            metric: m.name.clone(),
                            unit: m.unit.clone(),
                            attributes: attributes(&p.attributes),
                            count: p.count,
                            sum: p.sum.unwrap_or(0.0),
                        });
                    }
                }
            }
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

fn service_name<'a>(attributes: impl Iterator<Item = &'a KeyValue>) -> String {
    attributes
        .into_iter()
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref())
        .map(json)
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), kv.value.as_ref().map_or(Value::Null, json)))
        .collect()
}

fn keep(spans: &Spans, request: ExportTraceServiceRequest) {
    let n: usize = request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .map(|s| s.spans.len())
        .sum();
    spans
        .count
        .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    if spans.count_only {
        return;
    }
    let mut kept = spans.spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let service = service_name(resource_spans.resource.iter().flat_map(|r| &r.attributes));
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                kept.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    events: span.events.iter().map(|e| e.name.clone()).collect(),
                    start_unix_ns: span.start_time_unix_nano,
                    end_unix_ns: span.end_time_unix_nano,
                    status: span.status.map_or(0, |s| s.code),
                });
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json(value: &AnyValue) -> Value {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => Value::String(s.clone()),
        Some(any_value::Value::BoolValue(b)) => Value::Bool(*b),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(any_value::Value::ArrayValue(a)) => Value::Array(a.values.iter().map(json).collect()),
        Some(other) => Value::String(format!("{other:?}")),
        None => Value::Null,
    }
}
