//! `http` mode: OpenAI `POST /v1/completions` over HTTP/1.1, one keep-alive
//! connection per worker.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::driver::{Failure, Worker};

#[derive(Debug, Args)]
pub struct HttpArgs {
    /// Endpoint, e.g. `http://127.0.0.1:8080/v1/completions` (plain HTTP only).
    #[arg(long)]
    url: Uri,
    /// `model` in the request body.
    #[arg(long)]
    model: String,
    /// The whole `Authorization` header value, e.g. `Bearer eyJ...`.
    #[arg(long)]
    authorization: String,
}

/// What every request of a run shares.
#[derive(Debug, Clone)]
struct Endpoint {
    addr: SocketAddr,
    host: HeaderValue,
    path: Uri,
    authorization: HeaderValue,
    body: Bytes,
}

/// `concurrency` workers, each with its own connection opened now.
pub async fn workers(
    args: &HttpArgs,
    prompt: &str,
    concurrency: usize,
) -> anyhow::Result<Vec<HttpWorker>> {
    anyhow::ensure!(
        args.url.scheme_str() == Some("http"),
        "--url must be http://HOST:PORT/PATH"
    );
    let authority = args.url.authority().context("--url has no host")?;
    let addr = tokio::net::lookup_host(authority.as_str())
        .await
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to nothing"))?;
    let path = args
        .url
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .parse()?;
    let body = serde_json::json!({
        "model": args.model,
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0,
    });
    let endpoint = Endpoint {
        addr,
        host: HeaderValue::from_str(authority.as_str())?,
        path,
        authorization: HeaderValue::from_str(&args.authorization)
            .context("--authorization is not a valid header value")?,
        body: Bytes::from(body.to_string()),
    };
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let sender = open(endpoint.addr)
            .await
            .map_err(|f| anyhow::anyhow!("connecting to {}: {}", endpoint.addr, f.detail))?;
        workers.push(HttpWorker {
            endpoint: endpoint.clone(),
            sender: Some(sender),
        });
    }
    Ok(workers)
}

#[derive(Debug)]
pub struct HttpWorker {
    endpoint: Endpoint,
    /// `None` after the connection broke; the next request reconnects (and
    /// its latency includes the reconnect).
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Worker for HttpWorker {
    async fn request(&mut self) -> Result<Instant, Failure> {
        let result = self.exchange().await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }
}

impl HttpWorker {
    async fn exchange(&mut self) -> Result<Instant, Failure> {
        let sender = match &mut self.sender {
            Some(sender) if !sender.is_closed() => sender,
            slot => slot.insert(open(self.endpoint.addr).await?),
        };
        sender.ready().await.map_err(io_failure)?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.endpoint.path.clone())
            .header(HOST, self.endpoint.host.clone())
            .header(AUTHORIZATION, self.endpoint.authorization.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(Full::new(self.endpoint.body.clone()))
            .map_err(|e| Failure {
                kind: "request".to_string(),
                detail: e.to_string(),
            })?;
        let response = sender.send_request(request).await.map_err(io_failure)?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(io_failure)?
            .to_bytes();
        let done = Instant::now();
        if status != StatusCode::OK {
            return Err(Failure {
                kind: status.as_str().to_string(),
                detail: String::from_utf8_lossy(&body[..body.len().min(500)]).into_owned(),
            });
        }
        Ok(done)
    }
}

/// Opens one HTTP/1.1 connection (Nagle off: requests are one small write).
async fn open(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>, Failure> {
    let stream = TcpStream::connect(addr).await.map_err(io_failure)?;
    stream.set_nodelay(true).map_err(io_failure)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(io_failure)?;
    tokio::spawn(async move {
        // Ends when the server closes or the worker drops its sender; a broken
        // connection shows up as the next request's error.
        let _ = connection.await;
    });
    Ok(sender)
}

fn io_failure(e: impl std::fmt::Display) -> Failure {
    Failure {
        kind: "io".to_string(),
        detail: e.to_string(),
    }
}
