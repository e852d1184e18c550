//! Reading the bearer token out of a connection's first request head, as
//! peeked (not consumed) from the socket, to pick the lane that serves the
//! connection. Untrusted input: bounded by [`MAX_HEAD_BYTES`], and anything
//! unexpected means "serve it on the main runtime", never an error to the
//! client (the handlers still authenticate every request).

use std::io;
use std::time::Duration;

use rustix::net::{RecvFlags, recv};
use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::auth::bearer_token;

/// The most of a request head looked at. Larger heads are served on the
/// main runtime (hyper applies its own limits there).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a new connection may take to send its first request head
/// before it is served on the main runtime anyway (a client that opens
/// connections ahead of its requests is served correctly, only not on its
/// tenant's cores).
pub const HEAD_WAIT: Duration = Duration::from_secs(1);

/// The HTTP/2 connection preface (h2c with prior knowledge): its requests
/// are served on the main runtime.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the bytes peeked so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Head<'a> {
    /// The head is not complete yet: wait for more bytes.
    Incomplete,
    /// A complete HTTP/1 head carrying `Authorization: Bearer <token>`.
    Bearer(&'a str),
    /// Nothing to route by: serve on the main runtime.
    Main(Unroutable),
}

/// Why a connection is not routed to a lane by its head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unroutable {
    /// A complete head without a usable bearer token.
    NoToken,
    /// An HTTP/2 connection.
    Http2,
    /// No end of head within [`MAX_HEAD_BYTES`].
    TooLarge,
    /// No complete head within [`HEAD_WAIT`].
    Timeout,
    /// The peer closed the connection or it failed before a head came.
    Closed,
}

/// The bearer token of the first request head on `tcp`, looked at without
/// consuming a byte (hyper then reads the request as if nobody had).
/// The bearer token of a parsed request's headers, if well formed.
pub fn bearer_of(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok();
    bearer_token(value).ok()
}

pub async fn peek_bearer(tcp: &TcpStream) -> Result<String, Unroutable> {
    let mut buf = vec![0; MAX_HEAD_BYTES];
    let mut seen = 0;
    let peeking = async {
        loop {
            let ready = tcp
                .ready(Interest::READABLE)
                .await
                .map_err(|_| Unroutable::Closed)?;
            let peeked = tcp.try_io(Interest::READABLE, || {
                let (n, _) = recv(tcp, &mut buf[..], RecvFlags::PEEK)?;
                // Nothing new since the last look: WouldBlock clears the
                // readiness tokio remembers, so `ready` waits for the next
                // bytes to arrive instead of spinning.
                if n == seen && n > 0 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match peeked {
                Ok(0) => return Err(Unroutable::Closed),
                Ok(n) => {
                    seen = n;
                    match parse(&buf[..n]) {
                        Head::Incomplete => {}
                        Head::Bearer(token) => return Ok(token.to_string()),
                        Head::Main(why) => return Err(why),
                    }
                }
                // The peer sent all it will (a closed read side stays
                // ready): what came is all there is.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && ready.is_read_closed() => {
                    return Err(Unroutable::Closed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(Unroutable::Closed),
            }
        }
    };
    tokio::time::timeout(HEAD_WAIT, peeking)
        .await
        .unwrap_or(Err(Unroutable::Timeout))
}

/// Reads `peeked`, the connection's first bytes.
pub fn parse(peeked: &[u8]) -> Head<'_> {
    if peeked.starts_with(H2_PREFACE) {
        return Head::Main(Unroutable::Http2);
    }
    if !peeked.is_empty() && H2_PREFACE.starts_with(peeked) {
        return Head::Incomplete;
    }
    let window = &peeked[..peeked.len().min(MAX_HEAD_BYTES)];
    let Some(end) = window.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if peeked.len() >= MAX_HEAD_BYTES {
            Head::Main(Unroutable::TooLarge)
        } else {
            Head::Incomplete
        };
    };
    // The request line first, then one header per line.
    let headers = window[..end].split(|&b| b == b'\n').skip(1);
    for line in headers {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon].eq_ignore_ascii_case(b"authorization") {
            continue;
        }
        // The first Authorization header is the one handlers read.
        return std::str::from_utf8(&line[colon + 1..])
            .ok()
            .and_then(|value| bearer_token(Some(value)).ok())
            .map_or(Head::Main(Unroutable::NoToken), Head::Bearer);
    }
    Head::Main(Unroutable::NoToken)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\n";

    fn head(headers: &str) -> Vec<u8> {
        let mut bytes = GET.to_vec();
        bytes.extend_from_slice(headers.as_bytes());
        bytes.extend_from_slice(b"\r\n{\"model\":");
        bytes
    }

    #[test]
    fn a_complete_head_gives_its_bearer_token_whatever_the_header_case() {
        let bytes = head("Authorization: Bearer abc.def.ghi\r\nContent-Length: 10\r\n");
        assert_eq!(parse(&bytes), Head::Bearer("abc.def.ghi"));
        let bytes = head("content-length: 10\r\nauthorization:   bearer tok\r\n");
        assert_eq!(parse(&bytes), Head::Bearer("tok"));
        let bytes = head("AUTHORIZATION: Bearer first\r\nAuthorization: Bearer second\r\n");
        assert_eq!(parse(&bytes), Head::Bearer("first"));
    }

    #[test]
    fn a_head_split_over_reads_waits_for_its_end() {
        let bytes = head("Authorization: Bearer abc\r\n");
        let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        for cut in [0, 1, 10, GET.len(), end - 1] {
            assert_eq!(parse(&bytes[..cut]), Head::Incomplete, "cut at {cut}");
        }
        assert_eq!(parse(&bytes[..end]), Head::Bearer("abc"));
    }

    #[test]
    fn heads_without_a_bearer_token_go_to_the_main_runtime() {
        for headers in [
            "Content-Length: 10\r\n",
            "Authorization: Basic dXNlcjpwYXNz\r\n",
            "Authorization: Bearer\r\n",
            "Authorization:\r\n",
            "X-Authorization: Bearer abc\r\n",
        ] {
            assert_eq!(
                parse(&head(headers)),
                Head::Main(Unroutable::NoToken),
                "{headers}"
            );
        }
        let mut bytes = GET.to_vec();
        bytes.extend_from_slice(b"Authorization: Bearer \xff\xfe\r\n\r\n");
        assert_eq!(parse(&bytes), Head::Main(Unroutable::NoToken));
    }

    #[test]
    fn http2_goes_to_the_main_runtime_once_its_preface_is_seen() {
        assert_eq!(parse(&H2_PREFACE[..5]), Head::Incomplete);
        let mut bytes = H2_PREFACE.to_vec();
        bytes.extend_from_slice(&[0, 0, 18, 4, 0]);
        assert_eq!(parse(&bytes), Head::Main(Unroutable::Http2));
    }

    #[test]
    fn a_head_past_the_limit_goes_to_the_main_runtime() {
        let padding = format!("X-Pad: {}\r\n", "a".repeat(MAX_HEAD_BYTES));
        let bytes = head(&format!("{padding}Authorization: Bearer abc\r\n"));
        assert_eq!(parse(&bytes), Head::Main(Unroutable::TooLarge));
        assert_eq!(
            parse(&bytes[..MAX_HEAD_BYTES - 1]),
            Head::Incomplete,
            "not yet at the limit"
        );
        // The limit is on the head: a small head with a large body is fine.
        let mut bytes = head("Authorization: Bearer abc\r\n");
        bytes.extend(std::iter::repeat_n(b'x', 2 * MAX_HEAD_BYTES));
        assert_eq!(parse(&bytes), Head::Bearer("abc"));
    }

    /// A listener and a connected pair: (client, accepted).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, client) = tokio::join!(listener.accept(), client);
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn peeking_waits_for_the_rest_of_a_split_head_and_consumes_nothing() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, mut served) = pair().await;
        let bytes = head("Authorization: Bearer abc\r\n");
        let (first, rest) = bytes.split_at(GET.len() + 5);
        client.write_all(first).await.unwrap();
        let peek = peek_bearer(&served);
        let write_rest = async {
            // Sent once the peek has seen the first part and waits.
            tokio::task::yield_now().await;
            client.write_all(rest).await.unwrap();
        };
        let (token, ()) = tokio::join!(peek, write_rest);
        assert_eq!(token, Ok("abc".to_string()));
        let mut read = vec![0; bytes.len()];
        served.read_exact(&mut read).await.unwrap();
        assert_eq!(read, bytes, "the server still reads the whole request");
    }

    #[tokio::test]
    async fn a_head_that_does_not_come_goes_to_the_main_runtime() {
        use tokio::io::AsyncWriteExt;
        let (mut client, served) = pair().await;
        client.write_all(&GET[..10]).await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(peek_bearer(&served).await, Err(Unroutable::Timeout));
        assert!(started.elapsed() >= HEAD_WAIT);
        // A peer that stops sending is not waited for (nor spun on).
        client.shutdown().await.unwrap();
        let started = std::time::Instant::now();
        assert_eq!(peek_bearer(&served).await, Err(Unroutable::Closed));
        assert!(started.elapsed() < HEAD_WAIT);
    }
}
