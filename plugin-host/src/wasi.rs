//! The WASI a plugin gets: the interfaces Rust's `wasm32-wasip2` std imports
//! (see `validate::ALLOWED_IMPORTS`), each made capability-free so a plugin
//! observes nothing outside its call: no arguments, environment, files or
//! network; stdin is empty; stdout and stderr go, bounded, to the gateway
//! log; both clocks read 0; randomness is a fixed sequence.
//!
//! Calls are synchronous and must never block or need a tokio runtime
//! (they may run on any thread). wasmtime-wasi's synchronous `wasi:io`
//! bindings run their blocking operations through a tokio runtime, so
//! `wasi:io/streams` and `wasi:io/poll` are ours ([`SyncIo`]): blocking
//! operations are polled once — our streams are always ready — and `poll`
//! reports every pollable ready, since nothing in the sandbox ever becomes
//! ready later (time does not pass). The other interfaces are
//! wasmtime-wasi's own, linked one by one.

use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream, WasiCli, WasiCliView as _};
use wasmtime_wasi::clocks::{WasiClocks, WasiClocksView as _};
use wasmtime_wasi::p2::bindings::sync::io::{error, poll, streams};
use wasmtime_wasi::p2::bindings::{cli, clocks, random};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::random::WasiRandom;
use wasmtime_wasi::runtime::poll_noop;
use wasmtime_wasi::{Deterministic, HostMonotonicClock, HostWallClock, WasiCtx, WasiView};
use wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable as AsyncHostPollable;
use wasmtime_wasi_io::bindings::wasi::io::streams::{
    HostInputStream as AsyncHostInputStream, HostOutputStream as AsyncHostOutputStream,
};

use super::limits::MAX_RANDOM_BYTES;

/// Bytes a guest may write per `check-write` permit on a captured stream.
const CAPTURE_PERMIT_BYTES: usize = 64 << 10;

/// The seed of `wasi:random/insecure-seed`: fixed, so a plugin's `HashMap`
/// iteration order is the same on every call.
const INSECURE_SEED: u128 = 0x6275_6c6b_6865_6164_2d70_6c75_6769_6e73;

/// Adds every WASI interface on the allow-list, and nothing else, to
/// `linker`.
pub(crate) fn add_to_linker<T: WasiView + 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    let l = linker;
    cli::environment::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::exit::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::stdin::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::stdout::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::stderr::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::terminal_input::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::terminal_output::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::terminal_stdin::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::terminal_stdout::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    cli::terminal_stderr::add_to_linker::<T, WasiCli>(l, |t| t.cli())?;
    clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, |t| t.clocks())?;
    clocks::monotonic_clock::add_to_linker::<T, WasiClocks>(l, |t| t.clocks())?;
    random::random::add_to_linker::<T, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    random::insecure::add_to_linker::<T, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    random::insecure_seed::add_to_linker::<T, WasiRandom>(l, |t| t.ctx().ctx.random())?;
    error::add_to_linker::<T, Table>(l, |t| t.ctx().table)?;
    streams::add_to_linker::<T, SyncIoData>(l, |t| SyncIo(t.ctx().table))?;
    poll::add_to_linker::<T, SyncIoData>(l, |t| SyncIo(t.ctx().table))?;
    Ok(())
}

/// A fresh WASI context for one call, writing stdout and stderr into the
/// given captures. Everything else is the builder's empty default (no args,
/// env, preopens, network; empty stdin) or fixed here.
pub(crate) fn wasi_ctx(stdout: &Captured, stderr: &Captured) -> WasiCtx {
    WasiCtx::builder()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .wall_clock(ZeroClock)
        .monotonic_clock(ZeroClock)
        .secure_random(Deterministic::new(random_bytes(RandomKind::Secure)))
        .insecure_random(Deterministic::new(random_bytes(RandomKind::Insecure)))
        .insecure_random_seed(INSECURE_SEED)
        .max_random_size(MAX_RANDOM_BYTES)
        .build()
}

/// Both clocks: always 0, so a plugin cannot measure time (or time the host).
struct ZeroClock;

impl HostWallClock for ZeroClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for ZeroClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        0
    }
}

#[derive(Clone, Copy)]
enum RandomKind {
    Secure,
    Insecure,
}

/// The bytes `wasi:random` cycles through: 1 KiB expanded with SHA-256 from
/// a fixed label, computed once. The same on every call and every gateway.
fn random_bytes(kind: RandomKind) -> Vec<u8> {
    static SECURE: OnceLock<Vec<u8>> = OnceLock::new();
    static INSECURE: OnceLock<Vec<u8>> = OnceLock::new();
    let (cell, label) = match kind {
        RandomKind::Secure => (&SECURE, "bulkhead plugin wasi:random/random"),
        RandomKind::Insecure => (&INSECURE, "bulkhead plugin wasi:random/insecure"),
    };
    cell.get_or_init(|| {
        (0u32..32)
            .flat_map(|block| {
                let mut hash = Sha256::new();
                hash.update(label.as_bytes());
                hash.update(block.to_le_bytes());
                hash.finalize()
            })
            .collect()
    })
    .clone()
}

/// A bounded capture of stdout or stderr: keeps the first `capacity` bytes
/// not yet taken, counts and drops the rest. Writing never fails or blocks,
/// so a plugin that prints too much loses output, not its call.
#[derive(Clone, Debug)]
pub(crate) struct Captured {
    inner: Arc<Mutex<CapturedBytes>>,
}

#[derive(Debug)]
struct CapturedBytes {
    kept: Vec<u8>,
    /// Bytes this call may still write: taking what was kept frees none.
    remaining: usize,
    dropped: usize,
}

impl Captured {
    pub(crate) fn new(capacity: usize) -> Self {
        Captured {
            inner: Arc::new(Mutex::new(CapturedBytes {
                kept: Vec::new(),
                remaining: capacity,
                dropped: 0,
            })),
        }
    }

    fn append(&self, bytes: &[u8]) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = bytes.len().min(inner.remaining);
        inner.kept.extend_from_slice(&bytes[..kept]);
        inner.dropped += bytes.len() - kept;
        inner.remaining -= kept;
    }

    /// Takes what was written since the last take, and how many bytes were
    /// dropped for lack of room.
    pub(crate) fn take(&self) -> (Vec<u8>, usize) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let dropped = std::mem::take(&mut inner.dropped);
        (std::mem::take(&mut inner.kept), dropped)
    }
}

impl IsTerminal for Captured {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Captured {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for Captured {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(CAPTURE_PERMIT_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Captured {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Captured {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// `wasi:io/error` straight on the resource table (wasmtime-wasi's
/// implementation, which is synchronous).
struct Table;

impl HasData for Table {
    type Data<'a> = &'a mut ResourceTable;
}

/// `wasi:io/streams` and `wasi:io/poll` without a runtime: non-blocking
/// operations are wasmtime-wasi's; blocking ones run its implementation
/// polled once, and what would have to wait fails (a stream) or is reported
/// ready (a pollable).
pub(crate) struct SyncIo<'a>(&'a mut ResourceTable);

/// Links [`SyncIo`] into the linker.
struct SyncIoData;

impl HasData for SyncIoData {
    type Data<'a> = SyncIo<'a>;
}

/// Polls `future` once: our streams never wait, so a pending future means
/// one that would wait forever here.
fn at_once<T>(future: impl Future<Output = StreamResult<T>>) -> StreamResult<T> {
    let future = pin!(future);
    poll_noop(future).unwrap_or(Err(StreamError::Closed))
}

impl streams::Host for SyncIo<'_> {
    fn convert_stream_error(&mut self, err: StreamError) -> wasmtime::Result<streams::StreamError> {
        streams::Host::convert_stream_error(self.0, err)
    }
}

impl streams::HostOutputStream for SyncIo<'_> {
    fn drop(&mut self, stream: Resource<streams::OutputStream>) -> wasmtime::Result<()> {
        let dropped = pin!(AsyncHostOutputStream::drop(self.0, stream));
        // Deleted from the table either way; what is left is cancelling
        // pending work, and our streams have none.
        poll_noop(dropped).unwrap_or(Ok(()))
    }

    fn check_write(&mut self, stream: Resource<streams::OutputStream>) -> StreamResult<u64> {
        streams::HostOutputStream::check_write(self.0, stream)
    }

    fn write(
        &mut self,
        stream: Resource<streams::OutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        streams::HostOutputStream::write(self.0, stream, bytes)
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<streams::OutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        at_once(AsyncHostOutputStream::blocking_write_and_flush(
            self.0, stream, bytes,
        ))
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<streams::OutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        at_once(AsyncHostOutputStream::blocking_write_zeroes_and_flush(
            self.0, stream, len,
        ))
    }

    fn subscribe(
        &mut self,
        stream: Resource<streams::OutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostOutputStream::subscribe(self.0, stream)
    }

    fn write_zeroes(
        &mut self,
        stream: Resource<streams::OutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        streams::HostOutputStream::write_zeroes(self.0, stream, len)
    }

    fn flush(&mut self, stream: Resource<streams::OutputStream>) -> StreamResult<()> {
        streams::HostOutputStream::flush(self.0, stream)
    }

    fn blocking_flush(&mut self, stream: Resource<streams::OutputStream>) -> StreamResult<()> {
        at_once(AsyncHostOutputStream::blocking_flush(self.0, stream))
    }

    fn splice(
        &mut self,
        dst: Resource<streams::OutputStream>,
        src: Resource<streams::InputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        streams::HostOutputStream::splice(self.0, dst, src, len)
    }

    fn blocking_splice(
        &mut self,
        dst: Resource<streams::OutputStream>,
        src: Resource<streams::InputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        at_once(AsyncHostOutputStream::blocking_splice(
            self.0, dst, src, len,
        ))
    }
}

impl streams::HostInputStream for SyncIo<'_> {
    fn drop(&mut self, stream: Resource<streams::InputStream>) -> wasmtime::Result<()> {
        let dropped = pin!(AsyncHostInputStream::drop(self.0, stream));
        poll_noop(dropped).unwrap_or(Ok(()))
    }

    fn read(&mut self, stream: Resource<streams::InputStream>, len: u64) -> StreamResult<Vec<u8>> {
        streams::HostInputStream::read(self.0, stream, len)
    }

    fn blocking_read(
        &mut self,
        stream: Resource<streams::InputStream>,
        len: u64,
    ) -> StreamResult<Vec<u8>> {
        at_once(AsyncHostInputStream::blocking_read(self.0, stream, len))
    }

    fn skip(&mut self, stream: Resource<streams::InputStream>, len: u64) -> StreamResult<u64> {
        streams::HostInputStream::skip(self.0, stream, len)
    }

    fn blocking_skip(
        &mut self,
        stream: Resource<streams::InputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        at_once(AsyncHostInputStream::blocking_skip(self.0, stream, len))
    }

    fn subscribe(
        &mut self,
        stream: Resource<streams::InputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        streams::HostInputStream::subscribe(self.0, stream)
    }
}

impl poll::Host for SyncIo<'_> {
    fn poll(&mut self, pollables: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        if pollables.is_empty() {
            return Err(wasmtime::format_err!("empty poll list"));
        }
        let count = u32::try_from(pollables.len())?;
        Ok((0..count).collect())
    }
}

impl poll::HostPollable for SyncIo<'_> {
    fn ready(&mut self, _pollable: Resource<DynPollable>) -> wasmtime::Result<bool> {
        Ok(true)
    }

    fn block(&mut self, _pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        Ok(())
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        AsyncHostPollable::drop(self.0, pollable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_up_to_its_capacity_for_the_whole_call() {
        let captured = Captured::new(10);
        captured.append(b"hel");
        captured.append(b"lo ");
        assert_eq!(captured.take(), (b"hello ".to_vec(), 0));
        captured.append(b"world, again");
        // Taking freed nothing: 4 bytes were left.
        assert_eq!(captured.take(), (b"worl".to_vec(), 8));
        captured.append(b"more");
        assert_eq!(captured.take(), (Vec::new(), 4));
    }

    #[test]
    fn randomness_is_fixed_and_differs_by_kind() {
        let secure = random_bytes(RandomKind::Secure);
        assert_eq!(secure.len(), 1024);
        assert_eq!(secure, random_bytes(RandomKind::Secure));
        assert_ne!(secure, random_bytes(RandomKind::Insecure));
    }
}
