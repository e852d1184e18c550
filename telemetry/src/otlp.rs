//! Finished spans as an OTLP `ExportTraceServiceRequest`, written straight
//! from the SDK's `SpanData` into one reused buffer: no intermediate
//! protobuf structs, no string copies, one pass.
//!
//! Each nested message reserves one byte for its length and is written; the
//! rare one of 128 bytes or more then moves forward to make room for a
//! longer length.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::SpanData;

use crate::settings::Headers;

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

/// The longest length of a nested message (a `u32` varint).
const LEN_ROOM: usize = 5;

/// A protobuf writer over a growing buffer.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        &self.buf
    }

    #[cfg(test)]
    fn clear(&mut self) {
        self.buf.clear();
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.buf.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u32) {
        self.varint(u64::from((field << 3) | wire));
    }

    /// A length-delimited field, written even when empty.
    fn raw(&mut self, field: u32, bytes: &[u8]) {
        self.key(field, LEN);
        self.varint(bytes.len() as u64);
        self.buf.extend_from_slice(bytes);
    }

    /// A proto3 string or bytes field: nothing when empty.
    fn text(&mut self, field: u32, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.raw(field, bytes);
        }
    }

    fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, VARINT);
            self.varint(v);
        }
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, FIXED64);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn fixed32(&mut self, field: u32, v: u32) {
        if v != 0 {
            self.key(field, FIXED32);
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// A nested message written by `body` (present even when empty).
    fn message(&mut self, field: u32, body: impl FnOnce(&mut Writer)) {
        self.key(field, LEN);
        let at = self.buf.len();
        self.buf.push(0);
        body(self);
        let len = self.buf.len() - at - 1;
        if len < 0x80 {
            // Most messages (an attribute, its value, a status): one byte,
            // nothing moves.
            self.buf[at] = len as u8;
            return;
        }
        let mut prefix = [0u8; LEN_ROOM];
        let mut n = 0;
        let mut v = len as u64;
        while v >= 0x80 {
            prefix[n] = (v as u8) | 0x80;
            v >>= 7;
            n += 1;
        }
        prefix[n] = v as u8;
        n += 1;
        // Open room for the length's extra bytes behind the body.
        let end = self.buf.len();
        self.buf.resize(end + n - 1, 0);
        self.buf.copy_within(at + 1..end, at + n);
        self.buf[at..at + n].copy_from_slice(&prefix[..n]);
    }

    fn key_values(&mut self, field: u32, attributes: &[KeyValue]) {
        for kv in attributes {
            self.message(field, |w| {
                w.text(1, kv.key.as_str().as_bytes());
                w.message(2, |w| w.any_value(&kv.value));
            });
        }
    }

    /// `AnyValue`'s oneof: the chosen field is written even at its default.
    fn any_value(&mut self, value: &Value) {
        match value {
            Value::Bool(b) => {
                self.key(2, VARINT);
                self.varint(u64::from(*b));
            }
            Value::I64(i) => {
                self.key(3, VARINT);
                self.varint(*i as u64);
            }
            Value::F64(f) => {
                self.key(4, FIXED64);
                self.buf.extend_from_slice(&f.to_bits().to_le_bytes());
            }
            Value::String(s) => self.raw(1, s.as_str().as_bytes()),
            Value::Array(array) => self.message(5, |w| w.array(array)),
            other => self.raw(1, other.as_str().as_bytes()),
        }
    }

    fn array(&mut self, array: &Array) {
        let each = |w: &mut Writer, v: Value| w.message(1, |w| w.any_value(&v));
        match array {
            Array::Bool(v) => v.iter().for_each(|b| each(self, Value::Bool(*b))),
            Array::I64(v) => v.iter().for_each(|i| each(self, Value::I64(*i))),
            Array::F64(v) => v.iter().for_each(|f| each(self, Value::F64(*f))),
            Array::String(v) => {
                for s in v {
                    self.message(1, |w| w.raw(1, s.as_str().as_bytes()));
                }
            }
            other => {
                let text = other.to_string();
                self.message(1, |w| w.raw(1, text.as_bytes()));
            }
        }
    }

    fn scope(&mut self, scope: &InstrumentationScope) {
        self.text(1, scope.name().as_bytes());
        self.text(2, scope.version().unwrap_or_default().as_bytes());
        let attributes: Vec<KeyValue> = scope.attributes().cloned().collect();
        self.key_values(3, &attributes);
    }

    fn span(&mut self, span: &SpanData) {
        let cx = &span.span_context;
        self.text(1, &cx.trace_id().to_bytes());
        self.text(2, &cx.span_id().to_bytes());
        self.text(3, cx.trace_state().header().as_bytes());
        if span.parent_span_id != opentelemetry::trace::SpanId::INVALID {
            self.text(4, &span.parent_span_id.to_bytes());
        }
        self.text(5, span.name.as_bytes());
        self.uint(6, kind(&span.span_kind));
        self.fixed64(7, nanos(span.start_time));
        self.fixed64(8, nanos(span.end_time));
        self.key_values(9, &span.attributes);
        self.uint(10, u64::from(span.dropped_attributes_count));
        for event in span.events.iter() {
            self.message(11, |w| {
                w.fixed64(1, nanos(event.timestamp));
                w.text(2, event.name.as_bytes());
                w.key_values(3, &event.attributes);
                w.uint(4, u64::from(event.dropped_attributes_count));
            });
        }
        self.uint(12, u64::from(span.events.dropped_count));
        for link in span.links.iter() {
            self.message(13, |w| {
                let cx = &link.span_context;
                w.text(1, &cx.trace_id().to_bytes());
                w.text(2, &cx.span_id().to_bytes());
                w.text(3, cx.trace_state().header().as_bytes());
                w.key_values(4, &link.attributes);
                w.uint(5, u64::from(link.dropped_attributes_count));
                w.fixed32(6, flags(cx.is_remote(), cx.trace_flags().to_u8()));
            });
        }
        self.uint(14, u64::from(span.links.dropped_count));
        self.message(15, |w| match &span.status {
            Status::Unset => {}
            Status::Ok => w.uint(3, 1),
            Status::Error { description } => {
                w.text(2, description.as_bytes());
                w.uint(3, 2);
            }
        });
        self.fixed32(
            16,
            flags(span.parent_span_is_remote, cx.trace_flags().to_u8()),
        );
    }
}

/// OTLP span flags: the W3C trace flags, and whether the parent was remote.
fn flags(parent_is_remote: bool, trace_flags: u8) -> u32 {
    const HAS_IS_REMOTE: u32 = 0x100;
    const IS_REMOTE: u32 = 0x200;
    let mut flags = u32::from(trace_flags) | HAS_IS_REMOTE;
    if parent_is_remote {
        flags |= IS_REMOTE;
    }
    flags
}

fn kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Writes the request that exports `spans` under `resource`: one
/// `ResourceSpans`, one `ScopeSpans` per instrumentation scope (in the
/// order they first appear).
pub(crate) fn encode_request(resource: &Resource, spans: &[SpanData], w: &mut Writer) {
    w.message(1, |w| {
        w.message(1, |w| {
            for (key, value) in resource.iter() {
                w.message(1, |w| {
                    w.text(1, key.as_str().as_bytes());
                    w.message(2, |w| w.any_value(value));
                });
            }
        });
        let mut scopes: Vec<&InstrumentationScope> = Vec::new();
        for span in spans {
            if !scopes
                .iter()
                .any(|s| same_scope(s, &span.instrumentation_scope))
            {
                scopes.push(&span.instrumentation_scope);
            }
        }
        for scope in scopes {
            w.message(2, |w| {
                w.message(1, |w| w.scope(scope));
                for span in spans
                    .iter()
                    .filter(|s| same_scope(&s.instrumentation_scope, scope))
                {
                    w.message(2, |w| w.span(span));
                }
                w.text(3, scope.schema_url().unwrap_or_default().as_bytes());
            });
        }
        w.text(3, resource.schema_url().unwrap_or_default().as_bytes());
    });
}

/// Whether two spans' scopes are written as one. `InstrumentationScope`'s
/// own `==` sorts copies of both attribute lists on every call; every span
/// of a process shares one scope, so comparing in order is exact for them
/// (two equal scopes whose attributes differ in order would only get a
/// `ScopeSpans` each).
fn same_scope(a: &InstrumentationScope, b: &InstrumentationScope) -> bool {
    a.name() == b.name()
        && a.version() == b.version()
        && a.schema_url() == b.schema_url()
        && a.attributes().eq(b.attributes())
}

/// OTLP span export (gRPC `TraceService.Export` or an HTTP/protobuf POST)
/// of the request [`encode_request`] writes.
#[derive(Debug, Clone)]
pub(crate) struct SpanExporter {
    transport: Transport,
    headers: http::HeaderMap,
    resource: Resource,
    timeout: Duration,
    /// Size of the last request: the next buffer starts there.
    last_len: Arc<AtomicUsize>,
}

#[derive(Debug, Clone)]
enum Transport {
    Grpc(tonic::transport::Channel),
    Http {
        client: Arc<opentelemetry_http::hyper::HyperClient>,
        url: http::Uri,
    },
}

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

impl SpanExporter {
    /// A lazily connecting gRPC client of `endpoint` (`http://`, or
    /// `https://` with TLS and the system's roots). Call on a Tokio runtime.
    pub(crate) fn grpc(
        endpoint: &str,
        timeout: Duration,
        headers: &Headers,
    ) -> Result<SpanExporter, String> {
        let bad = |e: &dyn std::fmt::Display| format!("the OTLP endpoint `{endpoint}`: {e}");
        let mut builder = tonic::transport::Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| bad(&e))?
            .timeout(timeout);
        if endpoint.starts_with("https://") {
            builder = builder
                .tls_config(tonic::transport::ClientTlsConfig::new().with_native_roots())
                .map_err(|e| bad(&e))?;
        }
        Ok(SpanExporter::with(
            Transport::Grpc(builder.connect_lazy()),
            timeout,
            headers,
        ))
    }

    /// POSTs to `url` (plain HTTP) as `application/x-protobuf`.
    pub(crate) fn http(
        url: &str,
        timeout: Duration,
        headers: &Headers,
    ) -> Result<SpanExporter, String> {
        let url = url
            .parse()
            .map_err(|e| format!("the OTLP endpoint `{url}`: {e}"))?;
        let client = opentelemetry_http::hyper::HyperClient::with_default_connector(timeout, None);
        Ok(SpanExporter::with(
            Transport::Http {
                client: Arc::new(client),
                url,
            },
            timeout,
            headers,
        ))
    }

    fn with(transport: Transport, timeout: Duration, headers: &Headers) -> SpanExporter {
        SpanExporter {
            transport,
            headers: headers.0.iter().cloned().collect(),
            resource: Resource::builder_empty().build(),
            timeout,
            last_len: Arc::default(),
        }
    }
}

impl opentelemetry_sdk::trace::SpanExporter for SpanExporter {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        let mut w = Writer {
            buf: Vec::with_capacity(self.last_len.load(Ordering::Relaxed) + 1024),
        };
        encode_request(&self.resource, &batch, &mut w);
        drop(batch);
        self.last_len.store(w.buf.len(), Ordering::Relaxed);
        let (transport, timeout) = (self.transport.clone(), self.timeout);
        let headers = self.headers.clone();
        async move {
            let fail = OTelSdkError::InternalFailure;
            match transport {
                Transport::Grpc(channel) => {
                    let mut client = tonic::client::Grpc::new(channel);
                    client.ready().await.map_err(|e| fail(e.to_string()))?;
                    let mut request = tonic::Request::new(w.buf);
                    *request.metadata_mut() = tonic::metadata::MetadataMap::from_headers(headers);
                    request.set_timeout(timeout);
                    client
                        .unary::<Vec<u8>, (), RawCodec>(
                            request,
                            http::uri::PathAndQuery::from_static(EXPORT_PATH),
                            RawCodec,
                        )
                        .await
                        .map(drop)
                        .map_err(|s| fail(format!("{:?}: {}", s.code(), s.message())))
                }
                Transport::Http { client, url } => {
                    let mut request = http::Request::post(url)
                        .body(bytes::Bytes::from(w.buf))
                        .map_err(|e| fail(e.to_string()))?;
                    *request.headers_mut() = headers;
                    request.headers_mut().insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static("application/x-protobuf"),
                    );
                    let response = opentelemetry_http::HttpClient::send_bytes(&*client, request)
                        .await
                        .map_err(|e| fail(e.to_string()))?;
                    if response.status().is_success() {
                        Ok(())
                    } else {
                        Err(fail(format!(
                            "the collector answered {}",
                            response.status()
                        )))
                    }
                }
            }
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = resource.clone();
    }
}

/// Sends pre-encoded bytes; reads (and ignores) the response message.
#[derive(Debug, Clone, Copy)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = ();
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<()>, tonic::Status> {
        let n = bytes::Buf::remaining(src);
        bytes::Buf::advance(src, n);
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::{Event, Link, SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use opentelemetry::{InstrumentationScope, KeyValue, StringValue};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use prost::Message;

    use super::*;

    fn span(n: u8, scope: &InstrumentationScope, status: Status, remote: bool) -> SpanData {
        let at = UNIX_EPOCH + Duration::from_nanos(1_765_000_000_123_456_789 + u64::from(n));
        let mut events = SpanEvents::default();
        events.events.push(Event::new(
            "first_token",
            at + Duration::from_micros(300),
            vec![KeyValue::new("gen_ai.usage.output_tokens", 1_i64)],
            0,
        ));
        events.dropped_count = u32::from(n);
        let mut links = SpanLinks::default();
        if !n.is_multiple_of(2) {
            links.links.push(Link::new(
                SpanContext::new(
                    TraceId::from(0xfeed_u128),
                    SpanId::from(0xbeef_u64),
                    TraceFlags::SAMPLED,
                    true,
                    TraceState::from_key_value([("vendor", "x")]).unwrap(),
                ),
                vec![KeyValue::new("why", "retry")],
                1,
            ));
        }
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c_u128),
                SpanId::from(0xb7ad_6b71_6920_3331_u64 + u64::from(n)),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: if n == 0 {
                SpanId::INVALID
            } else {
                SpanId::from(0x1234_u64)
            },
            parent_span_is_remote: remote,
            span_kind: [SpanKind::Server, SpanKind::Internal, SpanKind::Client][n as usize % 3]
                .clone(),
            name: format!("span {n}").into(),
            start_time: at,
            end_time: at + Duration::from_millis(u64::from(n) + 1),
            attributes: vec![
                KeyValue::new("bulkhead.tenant", "acme"),
                KeyValue::new("gen_ai.request.max_tokens", -7_i64 + i64::from(n)),
                KeyValue::new("gen_ai.request.temperature", 0.0),
                KeyValue::new("ok", n.is_multiple_of(2)),
                KeyValue::new("empty", ""),
                KeyValue::new(
                    "gen_ai.response.finish_reasons",
                    Value::Array(vec![StringValue::from("stop"), StringValue::from("")].into()),
                ),
                KeyValue::new("ints", Value::Array(vec![0_i64, 300, -1].into())),
                KeyValue::new("floats", Value::Array(vec![1.5_f64].into())),
                KeyValue::new("bools", Value::Array(vec![true, false].into())),
            ],
            dropped_attributes_count: u32::from(n) * 2,
            events,
            links,
            status,
            instrumentation_scope: scope.clone(),
        }
    }

    /// What we write decodes to exactly what `opentelemetry-proto`'s own
    /// conversion (the one `opentelemetry-otlp` sends) builds.
    #[test]
    fn the_request_decodes_to_what_the_reference_conversion_builds() {
        let ours = InstrumentationScope::builder("bulkhead").build();
        let other = InstrumentationScope::builder("bulkhead-gpu-host")
            .with_version("0.1.0")
            .with_schema_url("https://opentelemetry.io/schemas/1.30.0")
            .with_attributes([KeyValue::new("scope.attr", 3_i64)])
            .build();
        let spans = vec![
            span(0, &ours, Status::Unset, false),
            span(1, &other, Status::Ok, true),
            span(2, &ours, Status::error("upstream failed"), false),
            span(3, &other, Status::Unset, false),
        ];
        let resource = Resource::builder_empty()
            .with_service_name("bulkhead")
            .with_attribute(KeyValue::new("deployment.environment.name", "test"))
            .with_attribute(KeyValue::new("service.instance.port", 8080_i64))
            .build();

        let mut w = Writer::default();
        encode_request(&resource, &spans, &mut w);
        let decoded = ExportTraceServiceRequest::decode(w.bytes()).expect("a valid request");
        let expected = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans.clone(),
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        assert_eq!(decoded, expected);
        // Prost writes the same message no shorter: ours is canonical too.
        assert_eq!(w.bytes().len(), expected.encoded_len());

        // The buffer is reused: a second batch starts clean.
        w.clear();
        encode_request(&resource, &spans[..1], &mut w);
        let one = ExportTraceServiceRequest::decode(w.bytes()).unwrap();
        assert_eq!(one.resource_spans[0].scope_spans[0].spans.len(), 1);
    }

    /// Every nested message's length crosses 127/128 and 16383/16384
    /// bytes somewhere in these: where the one byte kept for it no longer
    /// fits.
    #[test]
    fn lengths_around_the_varint_boundaries_decode_and_stay_canonical() {
        let scope = InstrumentationScope::builder("bulkhead").build();
        let resource = Resource::builder_empty().build();
        let mut w = Writer::default();
        for n in (100..140).chain(16_340..16_400) {
            let mut one = span(0, &scope, Status::Unset, false);
            one.attributes = vec![KeyValue::new("k", "x".repeat(n))];
            w.clear();
            encode_request(&resource, std::slice::from_ref(&one), &mut w);
            let expected = ExportTraceServiceRequest {
                resource_spans: group_spans_by_resource_and_scope(
                    vec![one],
                    &ResourceAttributesWithSchema::from(&resource),
                ),
            };
            let decoded = ExportTraceServiceRequest::decode(w.bytes()).expect("valid");
            assert_eq!(decoded, expected, "{n}");
            assert_eq!(w.bytes().len(), expected.encoded_len(), "{n}");
        }
    }

    #[test]
    fn a_long_attribute_gets_a_multi_byte_length_at_every_level() {
        let scope = InstrumentationScope::builder("bulkhead").build();
        let mut big = span(0, &scope, Status::Unset, false);
        big.attributes
            .push(KeyValue::new("gen_ai.input.messages", "x".repeat(300_000)));
        let resource = Resource::builder_empty().build();
        let mut w = Writer::default();
        encode_request(&resource, std::slice::from_ref(&big), &mut w);
        let decoded = ExportTraceServiceRequest::decode(w.bytes()).unwrap();
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.attributes.len(), big.attributes.len());
        assert_eq!(
            w.bytes().len(),
            ExportTraceServiceRequest {
                resource_spans: group_spans_by_resource_and_scope(
                    vec![big],
                    &ResourceAttributesWithSchema::from(&resource),
                ),
            }
            .encoded_len()
        );
    }
}
