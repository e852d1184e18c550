//! The HTTP listeners. The public one: accept on the main runtime, hand
//! each connection to its tenant's connection lane ([`lanes`]) or
//! serve it here. The admin one ([`AdminListener`]): TCP or a Unix socket,
//! always on the main runtime. On shutdown both stop accepting and let
//! every connection, on any runtime, finish its requests in flight. HTTP/1
//! and h2c (prior knowledge), as `axum::serve` served them before lanes.

pub(crate) mod lanes;

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use crate::metrics::{ConnectionRefusalLabels, Metrics};
use crate::policy::ConnectionLimits;
pub(crate) use lanes::Lanes;

/// HTTP/2 pings an idle connection's peer this often, and closes the
/// connection when one goes unanswered for [`H2_KEEP_ALIVE_TIMEOUT`]: a
/// dead peer does not hold a connection (and its streams) forever.
const H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const H2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who may hold a client connection open: at most `max_connections` at
/// once, `max_connections_per_ip` of them from one address. Each admitted
/// connection holds a [`ConnectionSlot`] until it closes, on whichever
/// runtime serves it.
#[derive(Debug)]
pub struct ConnectionGate {
    limits: ConnectionLimits,
    /// Open connections in all, and per peer address.
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    metrics: Arc<Metrics>,
    listener: &'static str,
}

/// One admitted connection; gives its place back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    gate: Arc<ConnectionGate>,
    ip: Option<IpAddr>,
}

impl ConnectionGate {
    pub fn new(
        limits: ConnectionLimits,
        metrics: Arc<Metrics>,
        listener: &'static str,
    ) -> Arc<Self> {
        Arc::new(ConnectionGate {
            limits,
            open: Mutex::new((0, HashMap::new())),
            metrics,
            listener,
        })
    }

    /// A slot for a connection from `ip` (`None`: a Unix socket, counted in
    /// the total only), or `None` when a cap is reached (counted by reason).
    pub fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Option<ConnectionSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, per_ip) = &mut *open;
        let refused = if *total >= self.limits.max_connections {
            Some("max_connections")
        } else if ip.is_some_and(|ip| {
            per_ip.get(&ip).copied().unwrap_or(0) >= self.limits.max_connections_per_ip
        }) {
            Some("max_connections_per_ip")
        } else {
            None
        };
        if let Some(reason) = refused {
            drop(open);
            self.metrics
                .connections_refused
                .get_or_create(&ConnectionRefusalLabels {
                    listener: self.listener,
                    reason,
                })
                .inc();
            return None;
        }
        *total += 1;
        if let Some(ip) = ip {
            *per_ip.entry(ip).or_insert(0) += 1;
        }
        Some(ConnectionSlot {
            gate: Arc::clone(self),
            ip,
        })
    }

    /// Connections open now (all, and from `ip`).
    #[cfg(test)]
    fn open(&self, ip: IpAddr) -> (usize, usize) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        (open.0, open.1.get(&ip).copied().unwrap_or(0))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self
            .gate
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (total, per_ip) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(ip) = self.ip
            && let Some(n) = per_ip.get_mut(&ip)
        {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&ip);
            }
        }
    }
}

/// How long accepting pauses after an error that is not the peer's
/// (out of file descriptors): retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` resolves, then waits for
/// the open connections to finish their requests (streams included).
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    lanes: Option<Lanes>,
    gate: Arc<ConnectionGate>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, slot) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => match gate.admit(Some(peer.ip())) {
                    Some(slot) => (tcp, slot),
                    // Over a cap: closed at once, before a byte is read.
                    None => continue,
                },
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        tune_connection(&tcp);
        // Taken here, before shutdown can start, so shutdown waits for it
        // wherever the connection ends up.
        let watcher = graceful.watcher();
        let router = router.clone();
        let lanes = lanes.clone();
        tokio::spawn(async move {
            let (tcp, watcher, slot) = match &lanes {
                Some(lanes) => match lanes.hand_off(tcp, watcher, slot).await {
                    Some(back) => back,
                    None => return,
                },
                None => (tcp, watcher, slot),
            };
            serve_connection(tcp, router, watcher, slot).await;
        });
    }
    drop(listener);
    tracing::debug!(
        connections = graceful.count(),
        "stopped accepting; waiting for open connections"
    );
    graceful.shutdown().await;
}

/// Serves one connection on the runtime this runs on until it closes, or
/// after its requests in flight once shutdown starts. Its slot is given
/// back when it ends. A connection that sends nothing, or not enough to
/// tell HTTP/1 from HTTP/2, within the gate's `header_read_timeout` is
/// closed; after that hyper holds every HTTP/1 request head (the first and
/// each later one on a keep-alive connection) to the same timeout, and
/// HTTP/2 connections take at most `http2_max_concurrent_streams`
/// requests at once and are pinged.
pub async fn serve_connection<S>(mut io: S, router: Router, watcher: Watcher, slot: ConnectionSlot)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = slot.gate.limits;
    let mut start = [0u8; H2_PREFACE.len()];
    let read = tokio::time::timeout(
        limits.header_read_timeout,
        read_preface(&mut io, &mut start),
    );
    let (len, http2) = match read.await {
        Ok(Ok(Some(found))) => found,
        // Closed, failed, or silent past the timeout: nothing to serve.
        Ok(Ok(None)) | Ok(Err(_)) | Err(_) => return,
    };
    let io = Prefixed::new(start[..len].to_vec(), io);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .keep_alive_interval(H2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEP_ALIVE_TIMEOUT);
    let builder = if http2 {
        builder.http2_only()
    } else {
        builder.http1_only()
    };
    let service = TowerToHyperService::new(router);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(connection).await {
        tracing::trace!("a connection ended with an error: {e}");
    }
    drop(slot);
}

/// What an HTTP/2 client (prior knowledge) sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the connection's first bytes into `start` until they can no
/// longer be the HTTP/2 preface or are all of it: how many were read, and
/// whether it is HTTP/2; `None` when the peer closed first.
async fn read_preface<S: AsyncRead + Unpin>(
    io: &mut S,
    start: &mut [u8; H2_PREFACE.len()],
) -> std::io::Result<Option<(usize, bool)>> {
    use tokio::io::AsyncReadExt;
    let mut len = 0;
    while len < start.len() {
        let n = io.read(&mut start[len..]).await?;
        if n == 0 {
            return Ok(None);
        }
        len += n;
        if start[..len] != H2_PREFACE[..len] {
            return Ok(Some((len, false)));
        }
    }
    Ok(Some((len, true)))
}

/// A connection whose first bytes were already read: they are read again
/// before the rest.
struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    io: S,
}

impl<S> Prefixed<S> {
    fn new(prefix: Vec<u8>, io: S) -> Prefixed<S> {
        Prefixed { prefix, at: 0, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.at < this.prefix.len() {
            let n = buf.remaining().min(this.prefix.len() - this.at);
            buf.put_slice(&this.prefix[this.at..this.at + n]);
            this.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The operator API's listener: loopback TCP by default, or a Unix socket
/// only its owner may connect to.
#[derive(Debug)]
pub enum AdminListener {
    Tcp(TcpListener),
    Unix(UnixSocket),
}

/// A bound Unix socket, removed when dropped.
#[derive(Debug)]
pub struct UnixSocket {
    listener: UnixListener,
    path: std::path::PathBuf,
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl AdminListener {
    /// Binds `addr`. A socket is made mode 0600 under a temporary name and
    /// then renamed into place, so nobody else can connect to it between
    /// bind and chmod; a stale socket a dead gateway left is replaced, a
    /// live one (or any other file) is an error.
    pub async fn bind(addr: &crate::policy::ListenAddr) -> std::io::Result<AdminListener> {
        use crate::policy::ListenAddr;
        match addr {
            ListenAddr::Tcp(addr) => TcpListener::bind(addr).await.map(AdminListener::Tcp),
            ListenAddr::Unix(path) => bind_unix(path).await.map(AdminListener::Unix),
        }
    }

    /// Where it listens, with the real port for `:0`.
    pub fn local_addr(&self) -> std::io::Result<crate::policy::ListenAddr> {
        use crate::policy::ListenAddr;
        match self {
            AdminListener::Tcp(tcp) => tcp.local_addr().map(ListenAddr::Tcp),
            AdminListener::Unix(unix) => Ok(ListenAddr::Unix(unix.path.clone())),
        }
    }
}

async fn bind_unix(path: &std::path::Path) -> std::io::Result<UnixSocket> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(Error::new(
                    ErrorKind::AddrInUse,
                    "another process is listening on this socket",
                ));
            }
            std::fs::remove_file(path)?;
        }
        Ok(_) => {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            ));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".{}.tmp", std::process::id()));
    let temp = std::path::PathBuf::from(temp);
    let _ = std::fs::remove_file(&temp);
    let listener = UnixListener::bind(&temp)?;
    let placed = std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    Ok(UnixSocket {
        listener,
        path: path.to_path_buf(),
    })
}

/// Serves `router` on the admin listener until `shutdown` resolves, then
/// waits for its open connections to finish their requests.
pub async fn serve_admin(
    listener: AdminListener,
    router: Router,
    gate: Arc<ConnectionGate>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = accept_admin(&listener) => accepted,
            () = &mut shutdown => break,
        };
        let watcher = graceful.watcher();
        let router = router.clone();
        match accepted {
            Ok(Accepted::Tcp(tcp)) => {
                let Some(slot) = gate.admit(tcp.peer_addr().ok().map(|a| a.ip())) else {
                    continue;
                };
                tune_connection(&tcp);
                tokio::spawn(serve_connection(tcp, router, watcher, slot));
            }
            Ok(Accepted::Unix(unix)) => {
                let Some(slot) = gate.admit(None) else {
                    continue;
                };
                tokio::spawn(serve_connection(unix, router, watcher, slot));
            }
            Err(e) => accept_failed(e).await,
        }
    }
    drop(listener);
    graceful.shutdown().await;
}

enum Accepted {
    Tcp(TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept_admin(listener: &AdminListener) -> std::io::Result<Accepted> {
    match listener {
        AdminListener::Tcp(tcp) => tcp.accept().await.map(|(s, _)| Accepted::Tcp(s)),
        AdminListener::Unix(unix) => unix.listener.accept().await.map(|(s, _)| Accepted::Unix(s)),
    }
}

/// Every accepted connection: TCP_NODELAY, so each streamed SSE chunk
/// leaves at once. With Nagle on, a small write waits for the client's ACK
/// of the previous one, which a delayed-ACK client holds ~40 ms: streams
/// stalled for 40–48 ms at a time (tests/bench/isolation).
fn tune_connection(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("could not set TCP_NODELAY on a connection: {e}");
    }
}

/// A failed accept: the peer's doing (reset before accept) is ignored;
/// anything else is logged and accepting pauses (as `axum::serve` did).
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!("accepting a connection: {e}");
    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
}

/// Raises this process's soft open-file limit to its hard limit: every
/// connection is a file descriptor, and the usual soft limit (1,024) is
/// below what the connection caps allow. Returns the limit now in force.
pub fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!("could not raise the open-file limit: {e}");
        }
    }
    getrlimit(Resource::Nofile).current
}

#[cfg(test)]
mod tests {
    use super::tune_connection;
    use super::*;

    #[test]
    fn the_gate_caps_connections_in_all_and_per_address_and_frees_on_close() {
        let limits = ConnectionLimits {
            max_connections: 3,
            max_connections_per_ip: 2,
            ..ConnectionLimits::DEFAULT
        };
        let gate = ConnectionGate::new(limits, Arc::new(Metrics::new()), "public");
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let a1 = gate.admit(Some(a)).expect("first from a");
        let a2 = gate.admit(Some(a)).expect("second from a");
        assert!(
            gate.admit(Some(a)).is_none(),
            "a third from a is over its cap"
        );
        let b1 = gate.admit(Some(b)).expect("b has its own cap");
        assert!(gate.admit(Some(b)).is_none(), "the total is reached");
        assert!(gate.admit(None).is_none());
        assert_eq!(gate.open(a), (3, 2));
        drop(a1);
        assert_eq!(gate.open(a), (2, 1));
        let a3 = gate.admit(Some(a)).expect("a closed one frees its place");
        drop((a2, a3, b1));
        assert_eq!(gate.open(a), (0, 0));
        assert!(
            gate.open.lock().unwrap().1.is_empty(),
            "no address is kept once closed"
        );
    }

    /// A gateway-like server on loopback: every connection through
    /// `serve_connection` with `timeout` for heads.
    async fn server(timeout: Duration) -> std::net::SocketAddr {
        let limits = ConnectionLimits {
            header_read_timeout: timeout,
            ..ConnectionLimits::DEFAULT
        };
        let gate = ConnectionGate::new(limits, Arc::new(Metrics::new()), "public");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let graceful = Box::leak(Box::new(GracefulShutdown::new()));
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = listener.accept().await.unwrap();
                let slot = gate.admit(Some(peer.ip())).unwrap();
                let router = Router::new().fallback(|| async { "hello" });
                tokio::spawn(serve_connection(tcp, router, graceful.watcher(), slot));
            }
        });
        addr
    }

    /// Reads until the server closes; what it sent.
    async fn until_closed(tcp: &mut TcpStream) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut got))
            .await
            .expect("the server closes the connection")
            .ok();
        got
    }

    #[tokio::test]
    async fn silent_and_slow_heads_are_closed_and_whole_ones_served() {
        use tokio::io::AsyncWriteExt;
        let addr = server(Duration::from_millis(200)).await;
        // Nothing at all; part of a head; part of the HTTP/2 preface.
        for sent in [
            &b""[..],
            b"GET / HTTP/1.1\r\nhost: x\r\n",
            b"PRI * HTTP/2.0\r\n",
        ] {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(sent).await.unwrap();
            let answer = until_closed(&mut tcp).await;
            assert!(!answer.starts_with(b"HTTP/1.1 200"), "{sent:?} was served");
        }
        // A whole head, even one byte at a time, is served.
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        for byte in b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n" {
            tcp.write_all(&[*byte]).await.unwrap();
        }
        let answer = until_closed(&mut tcp).await;
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(answer.ends_with(b"hello"));
    }

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let now = raise_open_file_limit();
        let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        assert_eq!(now, hard);
    }

    #[tokio::test]
    async fn accepted_connections_send_small_writes_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let client = tokio::net::TcpStream::connect(listener.local_addr().expect("addr"));
        let (accepted, _client) = tokio::join!(listener.accept(), client);
        let (tcp, _) = accepted.expect("accepted");
        assert!(!tcp.nodelay().expect("read"), "Nagle is on by default");
        tune_connection(&tcp);
        assert!(tcp.nodelay().expect("read"));
    }
}
