//! The small HTTP/1 client the CLI talks to a running gateway's admin
//! listener with (the audit proofs, model registration): a base URL
//! (`http://HOST:PORT`, or `unix:PATH` for a socket), a bearer token from
//! `--token` or `$BULKHEAD_TOKEN`, bounded responses and a timeout. One
//! connection per request.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

/// Largest response read: a page of 1,000 audit entries of up to 1 MiB each.
const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// Where the operator API is unless `--url` says: the admin listener's
/// default address.
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:8081";

/// A gateway at `base`, called with one token.
pub struct Gateway {
    target: Target,
    token: String,
    timeout: Duration,
}

/// How to reach the gateway.
enum Target {
    /// `host:port` of an `http://` URL, and that URL without a trailing `/`.
    Tcp {
        authority: String,
        base: String,
    },
    Unix(PathBuf),
}

/// A response: status and body.
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("the gateway answered {}, not with JSON", self.status))
    }

    /// The server's error message (OpenAI's `error.message`), or the body.
    pub fn error_message(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&self.body).trim().to_string())
    }
}

impl Gateway {
    /// `url` is `http://HOST:PORT` (TLS belongs in front of the gateway) or
    /// `unix:PATH`; `token` falls back to `$BULKHEAD_TOKEN`.
    pub fn new(url: &str, token: Option<&str>, timeout: Duration) -> anyhow::Result<Gateway> {
        let token = match token {
            Some(token) => token.to_string(),
            None => std::env::var("BULKHEAD_TOKEN").context(
                "pass --token or set BULKHEAD_TOKEN (an operator token: `bulkhead token issue \
                 --operator --scope ...` in development)",
            )?,
        };
        let target = if let Some(path) = url.strip_prefix("unix:") {
            if path.is_empty() {
                bail!("--url unix: needs the socket's path, e.g. unix:/run/bulkhead/admin.sock");
            }
            Target::Unix(PathBuf::from(path))
        } else if let Some(rest) = url.strip_prefix("http://") {
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') {
                bail!("--url must be http://HOST:PORT (no path), got {url:?}");
            }
            Target::Tcp {
                authority: authority.to_owned(),
                base: format!("http://{authority}"),
            }
        } else {
            bail!(
                "--url must start with http:// or unix: (put TLS in front of the gateway and use \
                 it from there)"
            );
        };
        Ok(Gateway {
            target,
            token,
            timeout,
        })
    }

    /// Sends one request; JSON when there is a body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Reply> {
        let shown = match &self.target {
            Target::Tcp { base, .. } => format!("{base}{path}"),
            Target::Unix(socket) => format!("unix:{}{path}", socket.display()),
        };
        let host = match &self.target {
            Target::Tcp { authority, .. } => authority.as_str(),
            Target::Unix(_) => "localhost",
        };
        let mut request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", host)
            .header("authorization", format!("Bearer {}", self.token));
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .context("building the request")?;
        let exchange = async {
            let response = match &self.target {
                Target::Tcp { authority, .. } => {
                    let tcp = tokio::net::TcpStream::connect(authority.as_str()).await?;
                    exchange(TokioIo::new(tcp), request).await?
                }
                Target::Unix(socket) => {
                    let unix = tokio::net::UnixStream::connect(socket).await?;
                    exchange(TokioIo::new(unix), request).await?
                }
            };
            Ok::<_, anyhow::Error>(response)
        };
        let response = tokio::time::timeout(self.timeout, exchange)
            .await
            .with_context(|| format!("the gateway did not answer in {} s", self.timeout.as_secs()))?
            .with_context(|| format!("{method} {shown}"))?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the response: {e}"))?
            .to_bytes();
        Ok(Reply {
            status,
            body: body.to_vec(),
        })
    }

    /// `GET path`, expecting 200 and JSON.
    pub async fn get_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let reply = self.send("GET", path, None).await?;
        if reply.status != 200 {
            bail!("GET {path}: {}: {}", reply.status, reply.error_message());
        }
        reply.json()
    }
}

/// One request on a fresh HTTP/1 connection over `io`.
async fn exchange<IO>(
    io: IO,
    request: axum::http::Request<Full<Bytes>>,
) -> anyhow::Result<axum::http::Response<hyper::body::Incoming>>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("the connection to the gateway ended: {e}");
        }
    });
    Ok(sender.send_request(request).await?)
}
