//! The small HTTP/1 client the CLI talks to a running gateway with (the
//! audit proofs, model registration): a base URL, a bearer token from
//! `--token` or `$BULKHEAD_TOKEN`, bounded responses and a timeout.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

/// Largest response read: a page of 1,000 audit entries of up to 1 MiB each.
const MAX_RESPONSE_BYTES: usize = 1 << 30;

/// A gateway at `base`, called with one token.
pub struct Gateway {
    base: String,
    token: String,
    timeout: Duration,
    http: Client<HttpConnector, Full<Bytes>>,
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
    /// `url` must be `http://…` (TLS belongs in front of the gateway);
    /// `token` falls back to `$BULKHEAD_TOKEN`.
    pub fn new(url: &str, token: Option<&str>, timeout: Duration) -> anyhow::Result<Gateway> {
        let token = match token {
            Some(token) => token.to_string(),
            None => std::env::var("BULKHEAD_TOKEN")
                .context("pass --token or set BULKHEAD_TOKEN (a token with the `admin` scope)")?,
        };
        if !url.starts_with("http://") {
            bail!(
                "--url must start with http:// (put TLS in front of the gateway and use it from there)"
            );
        }
        let http = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Ok(Gateway {
            base: url.trim_end_matches('/').to_string(),
            token,
            timeout,
            http,
        })
    }

    /// Sends one request; JSON when there is a body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Reply> {
        let url = format!("{}{path}", self.base);
        let mut request = axum::http::Request::builder()
            .method(method)
            .uri(&url)
            .header("authorization", format!("Bearer {}", self.token));
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .context("building the request")?;
        let response = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .with_context(|| format!("the gateway did not answer in {} s", self.timeout.as_secs()))?
            .with_context(|| format!("{method} {url}"))?;
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
