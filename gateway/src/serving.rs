//! The HTTP listener: accept on the main runtime, hand each connection to
//! its tenant's connection lane ([`crate::lanes`]) or serve it here, and
//! on shutdown stop accepting and let every connection, on any runtime,
//! finish its requests in flight. HTTP/1 and h2c (prior knowledge), as
//! `axum::serve` served them before lanes.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};

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
pub async fn serve_connection(tcp: TcpStream, router: Router, watcher: Watcher) {
    let builder = Builder::new(TokioExecutor::new());
    let service = TowerToHyperService::new(router);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
    if let Err(e) = watcher.watch(connection).await {
        tracing::trace!("a connection ended with an error: {e}");
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
