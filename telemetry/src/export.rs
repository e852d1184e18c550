//! Finished spans to the collector, off the request path.
//!
//! A span that ends goes into a bounded queue with `try_send`: when the
//! queue is full the span is dropped and counted, so a slow or dead
//! collector never makes a request wait. One thread of its own runs the
//! exporter (tonic or hyper, on a single-threaded Tokio runtime) and sends
//! batches of up to [`MAX_EXPORT_BATCH`] spans, at least every
//! [`EXPORT_INTERVAL`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, oneshot};

use crate::settings::{MAX_EXPORT_BATCH, Settings};

/// How long finished spans wait at most before an export.
pub const EXPORT_INTERVAL: Duration = Duration::from_millis(500);

/// What happened to the spans this process finished.
#[derive(Debug, Default)]
pub struct SpanCounts {
    exported: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
}

impl SpanCounts {
    /// Spans the collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }

    /// Spans dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Spans whose export failed (collector down, refused, timed out).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

enum Control {
    /// Export what is queued, then answer.
    Flush(oneshot::Sender<()>),
    /// Export what is queued, answer, and end the thread.
    Stop(oneshot::Sender<()>),
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Flush(_) => "Flush",
            Control::Stop(_) => "Stop",
        })
    }
}

/// The span processor: a bounded queue in front of the export thread.
#[derive(Debug)]
pub struct QueueProcessor {
    spans: mpsc::Sender<SpanData>,
    control: mpsc::UnboundedSender<Control>,
    counts: Arc<SpanCounts>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl QueueProcessor {
    /// Starts the export thread; `make` builds the exporter on it (tonic
    /// and hyper need its runtime). A failure to build is returned here.
    pub fn start<E, F>(
        settings: &Settings,
        resource: Resource,
        make: F,
    ) -> Result<QueueProcessor, crate::Error>
    where
        E: SpanExporter + 'static,
        F: FnOnce() -> Result<E, crate::Error> + Send + 'static,
    {
        let (spans, span_rx) = mpsc::channel(settings.max_queue_spans);
        let (control, control_rx) = mpsc::unbounded_channel();
        let counts = Arc::new(SpanCounts::default());
        let (built_tx, built_rx) = std::sync::mpsc::channel();
        let thread_counts = Arc::clone(&counts);
        let timeout = settings.export_timeout;
        let thread = std::thread::Builder::new()
            .name("otel-export".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let runtime = match runtime {
                    Ok(r) => r,
                    Err(e) => {
                        let why = format!("the export thread's runtime: {e}");
                        let _ = built_tx.send(Err(crate::Error::Start(why)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut exporter = match make() {
                        Ok(exporter) => exporter,
                        Err(e) => {
                            let _ = built_tx.send(Err(e));
                            return;
                        }
                    };
                    // The process's `service.name` and attributes go
                    // with every batch.
                    exporter.set_resource(&resource);
                    let _ = built_tx.send(Ok(()));
                    let queue = Queue {
                        exporter,
                        spans: span_rx,
                        counts: thread_counts,
                        timeout,
                        complained: false,
                    };
                    queue.run(control_rx).await;
                });
            })
            .map_err(|e| crate::Error::Start(format!("the export thread: {e}")))?;
        match built_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(crate::Error::Start("the export thread died".into())),
        }
        Ok(QueueProcessor {
            spans,
            control,
            counts,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn counts(&self) -> Arc<SpanCounts> {
        Arc::clone(&self.counts)
    }

    /// Sends `message` and waits up to `limit` for its answer. Blocking:
    /// called at shutdown or from a test, never on the request path.
    fn ask(&self, message: fn(oneshot::Sender<()>) -> Control, limit: Duration) -> OTelSdkResult {
        let (done, wait) = oneshot::channel();
        if self.control.send(message(done)).is_err() {
            return Err(OTelSdkError::AlreadyShutdown);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        // `blocking_recv` panics on a runtime's thread; a helper thread
        // waits instead, so any caller may flush.
        std::thread::spawn(move || {
            let _ = tx.send(wait.blocking_recv());
        });
        match rx.recv_timeout(limit) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(OTelSdkError::AlreadyShutdown),
            Err(_) => Err(OTelSdkError::Timeout(limit)),
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(10))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let stopped = self.ask(Control::Stop, timeout);
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let (Ok(()), Some(thread)) = (&stopped, thread) {
            let _ = thread.join();
        }
        stopped
    }
}

/// The export thread's side of the queue.
struct Queue<E> {
    exporter: E,
    spans: mpsc::Receiver<SpanData>,
    counts: Arc<SpanCounts>,
    timeout: Duration,
    /// A failure was logged already (one line, not one per batch).
    complained: bool,
}

impl<E: SpanExporter> Queue<E> {
    async fn run(mut self, mut control: mpsc::UnboundedReceiver<Control>) {
        let mut batch = Vec::with_capacity(MAX_EXPORT_BATCH);
        let mut tick = tokio::time::interval(EXPORT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                span = self.spans.recv() => match span {
                    Some(span) => {
                        batch.push(span);
                        if batch.len() >= MAX_EXPORT_BATCH {
                            self.export(&mut batch).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    if !batch.is_empty() {
                        self.export(&mut batch).await;
                    }
                }
                message = control.recv() => {
                    while let Ok(span) = self.spans.try_recv() {
                        batch.push(span);
                        if batch.len() >= MAX_EXPORT_BATCH {
                            self.export(&mut batch).await;
                        }
                    }
                    self.export(&mut batch).await;
                    match message {
                        Some(Control::Flush(done)) => {
                            let _ = done.send(());
                        }
                        Some(Control::Stop(done)) => {
                            let _ = self.exporter.shutdown();
                            let _ = done.send(());
                            return;
                        }
                        None => break,
                    }
                }
            }
        }
        self.export(&mut batch).await;
        let _ = self.exporter.shutdown();
    }

    async fn export(&mut self, batch: &mut Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let spans = std::mem::take(batch);
        let n = spans.len() as u64;
        let result = tokio::time::timeout(self.timeout, self.exporter.export(spans)).await;
        let failure = match result {
            Ok(Ok(())) => {
                self.counts.exported.fetch_add(n, Ordering::Relaxed);
                if self.complained {
                    self.complained = false;
                    tracing::info!(target: "bulkhead_telemetry", "span export works again");
                }
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        self.counts.failed.fetch_add(n, Ordering::Relaxed);
        if !self.complained {
            self.complained = true;
            tracing::warn!(
                target: "bulkhead_telemetry",
                spans = n,
                "span export failed (counted; later failures are not logged until one \
                 succeeds): {failure}"
            );
        }
    }
}
