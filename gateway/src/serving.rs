//! The HTTP listeners. The public one: accept on the main runtime, hand
//! each connection to its tenant's connection lane ([`crate::lanes`]) or
//! serve it here. The admin one ([`AdminListener`]): TCP or a Unix socket,
//! always on the main runtime. On shutdown both stop accepting and let
//! every connection, on any runtime, finish its requests in flight. HTTP/1
//! and h2c (prior knowledge), as `axum::serve` served them before lanes.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use crate::lanes::Lanes;

/// How long accepting pauses after an error that is not the peer's
/// (out of file descriptors): retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` resolves, then waits for
/// the open connections to finish their requests (streams included).
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    lanes: Option<Lanes>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
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
            let (tcp, watcher) = match &lanes {
                Some(lanes) => match lanes.hand_off(tcp, watcher).await {
                    Some(back) => back,
                    None => return,
                },
                None => (tcp, watcher),
            };
            serve_connection(tcp, router, watcher).await;
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
/// after its requests in flight once shutdown starts.
pub async fn serve_connection<S>(io: S, router: Router, watcher: Watcher)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let builder = Builder::new(TokioExecutor::new());
    let service = TowerToHyperService::new(router);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(connection).await {
        tracing::trace!("a connection ended with an error: {e}");
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
                tune_connection(&tcp);
                tokio::spawn(serve_connection(tcp, router, watcher));
            }
            Ok(Accepted::Unix(unix)) => {
                tokio::spawn(serve_connection(unix, router, watcher));
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

#[cfg(test)]
mod tests {
    use super::tune_connection;

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
