//! Where a gpu-host listens and how a client reaches it.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The metadata key carrying `Bearer <secret>` on TCP.
pub const AUTHORIZATION: &str = "authorization";

/// A gpu-host address: `unix:PATH`, `tcp:IP:PORT` or `tcp:NAME:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
    /// A DNS name, looked up again at every connection, so a name that
    /// follows a moving host (a Kubernetes headless Service's
    /// `POD.SERVICE.NAMESPACE.svc`) is followed too. For clients: a
    /// listener binds an address.
    Named {
        host: String,
        port: u16,
    },
}

impl Target {
    /// Whether it is reached over TCP (and so needs the bearer secret and
    /// TLS).
    pub fn is_tcp(&self) -> bool {
        matches!(self, Target::Tcp(_) | Target::Named { .. })
    }

    /// `HOST:PORT` for a URI, and the name a TLS certificate must carry
    /// unless told otherwise (a Unix socket has neither: a placeholder
    /// nobody connects to).
    fn authority(&self) -> (String, String) {
        match self {
            Target::Tcp(addr) => (addr.to_string(), addr.ip().to_string()),
            Target::Named { host, port } => (format!("{host}:{port}"), host.clone()),
            Target::Unix(_) => ("gpu-host.invalid".into(), "gpu-host.invalid".into()),
        }
    }
}

/// Longest DNS name (RFC 1035), and longest label in it.
const MAX_NAME_BYTES: usize = 253;
const MAX_LABEL_BYTES: usize = 63;

/// A DNS host name: dot-separated labels of ASCII letters, digits and
/// inner hyphens.
fn is_host_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= MAX_LABEL_BYTES
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        // All digits and dots is an IP address that did not parse.
        && !name.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Why a target could not be parsed or reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("`{0}`: expected unix:PATH, tcp:IP:PORT or tcp:NAME:PORT")]
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
    fn config(&self, default_name: &str) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .domain_name(
                self.server_name
                    .clone()
                    .unwrap_or_else(|| default_name.to_string()),
            );
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        config
    }

    /// Whether the certificates and key parse, as a connection would read
    /// them (for a policy check, before any connection).
    pub fn check(&self) -> Result<(), ConnectError> {
        tls_endpoint("127.0.0.1:1", "127.0.0.1", self).map(drop)
    }
}

fn tls_endpoint(
    authority: &str,
    default_name: &str,
    tls: &ClientTls,
) -> Result<Endpoint, ConnectError> {
    endpoint(Endpoint::from_shared(format!("https://{authority}"))?)
        .tls_config(tls.config(default_name))
        .map_err(|e| ConnectError::Tls(describe(&e)))
}

/// The endpoint of a TCP target (`authority` from [`Target::authority`]).
fn tcp_endpoint(
    (authority, default_name): (String, String),
    tls: Option<&ClientTls>,
) -> Result<Endpoint, ConnectError> {
    match tls {
        Some(tls) => tls_endpoint(&authority, &default_name, tls),
        None => Ok(endpoint(Endpoint::from_shared(format!(
            "http://{authority}"
        ))?)),
    }
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
            if let Ok(addr) = addr.parse() {
                return Ok(Target::Tcp(addr));
            }
            let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
            let port = port.parse().map_err(|_| bad())?;
            if !is_host_name(host) {
                return Err(bad());
            }
            Ok(Target::Named {
                host: host.to_ascii_lowercase(),
                port,
            })
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
            Target::Named { host, port } => write!(f, "tcp:{host}:{port}"),
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
        (Target::Tcp(_) | Target::Named { .. }, tls) => {
            Ok(tcp_endpoint(target.authority(), tls)?.connect_lazy())
        }
        (Target::Unix(_), Some(_)) => Err(ConnectError::TlsOnUnix),
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
        (Target::Tcp(_) | Target::Named { .. }, tls) => {
            Ok(tcp_endpoint(target.authority(), tls)?.connect().await?)
        }
        (Target::Unix(_), Some(_)) => Err(ConnectError::TlsOnUnix),
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
        for bad in [
            "unix:",
            "tcp:localhost",
            "tcp:gpu-host:",
            "tcp:gpu-host:70700",
            "tcp:-gpu:7070",
            "tcp:gpu_host:7070",
            "tcp:a..b:7070",
            "tcp:10.0.0.256:7070",
            "http://x",
            "/tmp/sock",
            "",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_name_is_a_tcp_target_kept_as_written() {
        let target: Target = "tcp:gpu-host-0.gpu-host.bulkhead.svc.cluster.local:7070"
            .parse()
            .unwrap();
        assert_eq!(
            target,
            Target::Named {
                host: "gpu-host-0.gpu-host.bulkhead.svc.cluster.local".into(),
                port: 7070
            }
        );
        assert!(target.is_tcp());
        assert_eq!(
            target.to_string(),
            "tcp:gpu-host-0.gpu-host.bulkhead.svc.cluster.local:7070"
        );
        assert_eq!(
            "tcp:LocalHost:1".parse::<Target>().unwrap().to_string(),
            "tcp:localhost:1"
        );
        assert!(!"unix:/x".parse::<Target>().unwrap().is_tcp());
    }

    #[tokio::test]
    async fn a_name_is_looked_up_when_connecting() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut preface = [0_u8; 14];
            conn.read_exact(&mut preface).await.unwrap();
            preface
        });
        // `localhost` resolves (to 127.0.0.1 among others) and the client's
        // HTTP/2 preface arrives at the listener.
        let channel = connect_lazy(&format!("tcp:localhost:{port}").parse().unwrap()).unwrap();
        let mut client = crate::v1::gpu_host_client::GpuHostClient::new(channel);
        let call = tokio::spawn(async move { client.health(crate::v1::HealthRequest {}).await });
        let preface = tokio::time::timeout(std::time::Duration::from_secs(10), accepted)
            .await
            .expect("a connection within 10 s")
            .unwrap();
        assert_eq!(&preface, b"PRI * HTTP/2.0");
        call.abort();

        let unknown: Target = "tcp:no-such-host.invalid:7070".parse().unwrap();
        assert!(connect(&unknown).await.is_err());
    }
}
