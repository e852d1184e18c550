//! An OTLP/gRPC trace receiver that counts the spans it is sent and keeps
//! none: the collector of `tests/bench/gateway_overhead` (tracing on).
//!
//!     otlp-sink [ADDR]      default 127.0.0.1:0
//!
//! Prints `listening on http://ADDR` on stdout, then `spans N` on stderr
//! every second until it is killed.
//!
//! It shares the benchmark's CPUs with the gateway it measures, so it
//! decodes only the request's outline: each span stays an undecoded byte
//! string (prost skips what the outline does not name). A collector that
//! reads every attribute runs elsewhere in production; here its cost would
//! be charged to the gateway. The end-to-end tests' receiver
//! (`bulkhead_tests::otlp`) decodes everything.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{NamedService, UnaryService};

/// `ExportTraceServiceRequest`, its spans left as bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct Outline {
    #[prost(message, repeated, tag = "1")]
    resource_spans: Vec<ResourceOutline>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ResourceOutline {
    #[prost(message, repeated, tag = "2")]
    scope_spans: Vec<ScopeOutline>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ScopeOutline {
    #[prost(bytes = "bytes", repeated, tag = "2")]
    spans: Vec<bytes::Bytes>,
}

/// `ExportTraceServiceResponse` (its fields all absent).
#[derive(Clone, PartialEq, prost::Message)]
struct Empty {}

#[derive(Clone, Debug, Default)]
struct Sink(Arc<AtomicU64>);

impl UnaryService<Outline> for Sink {
    type Response = Empty;
    type Future = BoxFuture<tonic::Response<Empty>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<Outline>) -> Self::Future {
        let n: usize = request
            .get_ref()
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        self.0.fetch_add(n as u64, Ordering::Relaxed);
        Box::pin(async { Ok(tonic::Response::new(Empty {})) })
    }
}

impl<B> Service<http::Request<B>> for Sink
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let sink = self.clone();
        Box::pin(async move {
            if request.uri().path() != "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
            {
                return Ok(tonic::Status::unimplemented("traces only").into_http());
            }
            let mut grpc =
                tonic::server::Grpc::new(tonic_prost::ProstCodec::<Empty, Outline>::default())
                    .apply_max_message_size_config(Some(64 << 20), None);
            Ok(grpc.unary(sink, request).await)
        })
    }
}

impl NamedService for Sink {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let sink = Sink::default();
    let count = Arc::clone(&sink.0);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(&addr))
        .unwrap_or_else(|e| panic!("binding {addr}: {e}"));
    println!("listening on http://{}", listener.local_addr().unwrap());
    let _ = std::io::stdout().flush();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            eprintln!("spans {}", count.load(Ordering::Relaxed));
        }
    });
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    runtime
        .block_on(
            tonic::transport::Server::builder()
                .add_service(sink)
                .serve_with_incoming(incoming),
        )
        .expect("the sink serves");
}
