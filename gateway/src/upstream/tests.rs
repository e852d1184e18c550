//! How gpu-host failures are classified: statuses the host sends, and
//! statuses tonic makes when the connection fails (reproduced on the wire
//! with a hand-written HTTP/2 peer).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

#[test]
fn resource_exhausted_is_the_queue_unless_it_names_the_kv_budget() {
    let kv = Status::resource_exhausted(
        "kv_budget_exceeded: the request needs 900 tokens of KV cache, the tenant's share is 512",
    );
    assert!(
        matches!(UpstreamError::from(kv), UpstreamError::KvBudgetExceeded(m) if m.contains("needs 900"))
    );
    let full = Status::resource_exhausted("the request queue is full (64 waiting); retry later");
    assert!(matches!(
        UpstreamError::from(full),
        UpstreamError::Overloaded(_)
    ));
    let out = Status::failed_precondition("model `m` is out of service: chunk 3");
    assert!(matches!(
        UpstreamError::from(out),
        UpstreamError::ModelUnavailable(_)
    ));
}

#[test]
fn unavailable_is_the_device_when_the_host_says_device_error() {
    let oom = Status::unavailable(
        "device_error: out_of_memory: alloc 4096 bytes: partition \"shared\" cannot allocate 4KiB",
    );
    match UpstreamError::from(oom) {
        UpstreamError::DeviceError { kind, message } => {
            assert_eq!(kind, "out_of_memory");
            assert!(message.contains("cannot allocate"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // A stopping host is not a device error (and is retried).
    let stopping = Status::unavailable("the host is shutting down");
    assert!(matches!(
        UpstreamError::from(stopping),
        UpstreamError::Unavailable(_)
    ));
}

#[test]
fn an_h2_failure_is_the_connection_whatever_code_tonic_gives_it() {
    // As tonic's `from_h2_error` / `from_hyper_error` build them: the code
    // from the h2 reason, the message "h2 protocol error: {error}".
    for (code, reason) in [
        (Code::ResourceExhausted, "ENHANCE_YOUR_CALM"),
        (Code::PermissionDenied, "INADEQUATE_SECURITY"),
        (Code::Unavailable, "REFUSED_STREAM"),
        (Code::Internal, "PROTOCOL_ERROR"),
        (Code::Cancelled, "CANCEL"),
        (Code::Unknown, "a broken pipe"),
    ] {
        let status = Status::new(
            code,
            "h2 protocol error: error reading a body from connection",
        );
        match UpstreamError::from(status) {
            UpstreamError::Unavailable(m) => assert!(m.contains("reading a body"), "{m}"),
            other => panic!("{reason}: {other:?}"),
        }
    }
    // The host's own RESOURCE_EXHAUSTED stays its queue or the KV budget.
    let full = Status::resource_exhausted("the request queue is full (64 waiting); retry later");
    assert!(matches!(
        UpstreamError::from(full),
        UpstreamError::Overloaded(_)
    ));
    let kv = Status::resource_exhausted("kv_budget_exceeded: needs 900 tokens, the share is 512");
    assert!(matches!(
        UpstreamError::from(kv),
        UpstreamError::KvBudgetExceeded(_)
    ));
}

/// HTTP/2 frame types and flags (RFC 9113, section 6) the fake host uses.
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// RFC 9113, section 7.
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).expect("a small frame");
    let mut bytes = length.to_be_bytes()[1..].to_vec();
    bytes.extend([kind, flags]);
    bytes.extend(stream.to_be_bytes());
    bytes.extend(payload);
    bytes
}

/// A gpu-host's end of one HTTP/2 connection, by hand: it answers the
/// first call's headers as a gRPC server does, then closes the connection
/// with GOAWAY(ENHANCE_YOUR_CALM), as h2 does past its reset limits (with
/// a last stream id of 0, so the call in flight fails with that reason).
async fn host_that_calms_down(listener: TcpListener) {
    let (mut socket, _) = listener.accept().await.expect("the gateway connects");
    let mut preface = [0_u8; 24];
    socket.read_exact(&mut preface).await.expect("the preface");
    assert_eq!(&preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    socket.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    let stream = loop {
        let mut header = [0_u8; 9];
        socket.read_exact(&mut header).await.expect("a frame");
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]);
        let mut payload = vec![0_u8; length as usize];
        socket.read_exact(&mut payload).await.expect("its payload");
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        match header[3] {
            SETTINGS if header[4] & ACK == 0 => {
                socket
                    .write_all(&frame(SETTINGS, ACK, 0, &[]))
                    .await
                    .unwrap();
            }
            HEADERS => break stream,
            _ => {}
        }
    };
    // HPACK: `:status: 200` (static index 8), then `content-type` (static
    // index 31, literal value, not indexed): application/grpc.
    let mut block = vec![0x88, 0x0f, 31 - 15, 16];
    block.extend(b"application/grpc");
    socket
        .write_all(&frame(HEADERS, END_HEADERS, stream, &block))
        .await
        .unwrap();
    let mut goaway = 0_u32.to_be_bytes().to_vec();
    goaway.extend(ENHANCE_YOUR_CALM.to_be_bytes());
    goaway.extend(b"too_many_internal_resets");
    socket
        .write_all(&frame(GOAWAY, 0, 0, &goaway))
        .await
        .unwrap();
    // Open until the gateway hangs up.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut rest)).await;
}

fn a_generation() -> Generate {
    Generate {
        model: "m".into(),
        prompt: Prompt::Text("hello".into()),
        max_tokens: Some(4),
        max_tokens_cap: None,
        temperature: 1.0,
        top_p: 1.0,
        top_k: None,
        min_p: None,
        repetition_penalty: None,
        seed: 1,
        stop: Vec::new(),
        tenant: "acme".into(),
        request_id: "r1".into(),
        priority: None,
        parse_special: false,
    }
}

#[tokio::test]
async fn a_connection_closed_with_enhance_your_calm_is_unavailable_not_overloaded() {
    // The soak's "the gpu-host is overloaded: h2 protocol error: error
    // reading a body from connection", made by the real client stack.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let host = tokio::spawn(host_that_calms_down(listener));
    let (_ready, state) = watch::channel(UpstreamState::Ready);
    let upstream = Upstream::new(
        &Target::Tcp(addr),
        None,
        None,
        state,
        Duration::from_secs(1),
        Supervised::No,
    )
    .expect("a client");
    let failed = tokio::time::timeout(Duration::from_secs(10), upstream.generate(a_generation()))
        .await
        .expect("the call ends")
        .expect_err("the connection was closed");
    match failed {
        UpstreamError::Unavailable(m) => {
            assert!(m.starts_with("h2 protocol error"), "{m}");
            // The cause says the host closed it, and why.
            assert!(m.contains("connection error received"), "{m}");
            assert!(m.contains("too_many_internal_resets"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    drop(upstream);
    host.await.expect("the fake host");
}
