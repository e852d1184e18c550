//! Where a gpu-host listens and how a client reaches it.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The metadata key carrying `Bearer <secret>` on TCP.
pub const AUTHORIZATION: &str = "authorization";

/// A gpu-host address: `unix:PATH` or `tcp:HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

/// Why a target could not be parsed or reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("`{0}`: expected unix:PATH or tcp:HOST:PORT")]
    BadTarget(String),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    #[error("TLS is for tcp: targets; a unix: socket is reached without it")]
    TlsOnUnix,
    #[error("the TLS settings: {0}")]
    Tls(String),
}

/// How a client reaches a gpu-host over TLS: the CA its certificate must
/// chain to, the client's own certificate and key when the host asks for
/// one (mutual TLS), and the name the host's certificate must carry (the
/// target's IP address when unset; certificates then need an IP SAN).
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    pub ca_pem: Vec<u8>,
    /// Certificate chain and private key, both PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    pub server_name: Option<String>,
}

impl fmt::Debug for ClientTls {
    // Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    fn config(&self, addr: &SocketAddr) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(
                self.server_name
                    .clone()
                    .unwrap_or_else(|| addr.ip().to_string()),
            );
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }

    /// Whether the certificates and key parse, as a connection would read
    /// them (for a policy check, before any connection).
    pub fn check(&self) -> Result<(), ConnectError> {
        let addr: SocketAddr = ([127, 0, 0, 1], 1).into();
        tls_endpoint(&addr, self).map(drop)
    }
}

fn tls_endpoint(addr: &SocketAddr, tls: &ClientTls) -> Result<Endpoint, ConnectError> {
    endpoint(Endpoint::from_shared(format!("https://{addr}"))?)
        .tls_config(tls.config(addr))
        .map_err(|e| ConnectError::Tls(describe(&e)))
}

/// An error with its causes (rustls says what is wrong in the source).
fn describe(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl FromStr for Target {
    type Err = ConnectError;

    fn from_str(s: &str) -> Result<Target, ConnectError> {
        let bad = || ConnectError::BadTarget(s.to_string());
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad());
            }
            Ok(Target::Unix(PathBuf::from(path)))
        } else if let Some(addr) = s.strip_prefix("tcp:") {
            addr.parse().map(Target::Tcp).map_err(|_| bad())
        } else {
            Err(bad())
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
            Target::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

/// The `authorization` metadata value for `secret`.
pub fn bearer_value(secret: &str) -> String {
    format!("Bearer {secret}")
}

/// Streams this client remembers having reset (cancelled) while the host's
/// frames for them may still arrive. h2's default, 10, is far below the
/// streams one gateway cancels at once (client disconnects, up to every
/// stream in flight): a frame for a stream pushed out of that memory counts
/// as a protocol error, and after 1,024 of those over a connection's life
/// h2 closes it (ENHANCE_YOUR_CALM, "locally-reset streams reached limit"),
/// failing every request in flight — seen in `tests/bench/gateway_overhead`
/// at concurrency 64. Each remembered stream is a few hundred bytes.
const MAX_REMEMBERED_RESET_STREAMS: usize = 16_384;

/// How long a reset stream is remembered: the host's frames in flight for it
/// arrive within milliseconds on a local socket or a LAN.
const RESET_STREAM_MEMORY: std::time::Duration = std::time::Duration::from_secs(10);

/// Every channel's settings, for `uri`.
fn endpoint(uri: Endpoint) -> Endpoint {
    uri.http2_max_concurrent_reset_streams(MAX_REMEMBERED_RESET_STREAMS)
        .http2_reset_stream_duration(RESET_STREAM_MEMORY)
}

/// A channel to a gpu-host that connects on first use and reconnects after
/// the connection breaks (a restarted host on the same socket is found again);
/// while nothing listens, calls fail with `UNAVAILABLE`.
pub fn connect_lazy(target: &Target) -> Result<Channel, ConnectError> {
    connect_lazy_with(target, None)
}

/// [`connect_lazy`], over TLS when `tls` is given (TCP only).
pub fn connect_lazy_with(
    target: &Target,
    tls: Option<&ClientTls>,
) -> Result<Channel, ConnectError> {
    match (target, tls) {
        (Target::Tcp(addr), Some(tls)) => Ok(tls_endpoint(addr, tls)?.connect_lazy()),
        (Target::Unix(_), Some(_)) => Err(ConnectError::TlsOnUnix),
        (Target::Tcp(addr), None) => {
            Ok(endpoint(Endpoint::from_shared(format!("http://{addr}"))?).connect_lazy())
        }
        (Target::Unix(path), None) => {
            let path = path.clone();
            Ok(endpoint(Endpoint::from_static("http://gpu-host.invalid"))
                .connect_with_connector_lazy(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(stream))
                    }
                })))
        }
    }
}

/// Opens a channel to a gpu-host (one connection attempt; callers retry).
pub async fn connect(target: &Target) -> Result<Channel, ConnectError> {
    connect_with(target, None).await
}

/// [`connect`], over TLS when `tls` is given (TCP only).
pub async fn connect_with(
    target: &Target,
    tls: Option<&ClientTls>,
) -> Result<Channel, ConnectError> {
    match (target, tls) {
        (Target::Tcp(addr), Some(tls)) => Ok(tls_endpoint(addr, tls)?.connect().await?),
        (Target::Unix(_), Some(_)) => Err(ConnectError::TlsOnUnix),
        (Target::Tcp(addr), None) => Ok(endpoint(Endpoint::from_shared(format!("http://{addr}"))?)
            .connect()
            .await?),
        (Target::Unix(path), None) => {
            let path = path.clone();
            // The URI is required by the API but unused: the connector decides where to go.
            let channel = endpoint(Endpoint::from_static("http://gpu-host.invalid"))
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(path).await?;
                        Ok::<_, std::io::Error>(TokioIo::new(stream))
                    }
                }))
                .await?;
            Ok(channel)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print_back() {
        for s in [
            "unix:/run/bulkhead/gpu.sock",
            "tcp:127.0.0.1:7070",
            "tcp:[::1]:7070",
        ] {
            let target: Target = s.parse().unwrap();
            assert_eq!(target.to_string(), s);
        }
        for bad in ["unix:", "tcp:localhost", "http://x", "/tmp/sock", ""] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }
}
