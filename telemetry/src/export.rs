//! Finished spans to the collector, off the request path.
//!
//! A span that ends is pushed onto a bounded queue (a short lock, no
//! wake-up): when the queue is full the span is dropped and counted, so a
//! slow or dead collector never makes a request wait. A task on the export
//! runtime (a thread of its own, `otel-export`) takes the queue every
//! [`EXPORT_INTERVAL`], or as soon as [`MAX_EXPORT_BATCH`] spans wait (the
//! one wake-up per batch), and sends it in batches of that size with the
//! exporter (tonic or hyper). Waking the exporter for every span cost more
//! than making the span (profiled: a third of the export thread's time was
//! futex and eventfd wake-ups).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc, oneshot};

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

/// The spans waiting for export, shared by the processor and its task.
#[derive(Debug)]
struct Waiting {
    spans: Mutex<Vec<SpanData>>,
    capacity: usize,
    /// A batch is ready.
    batch: Notify,
}

impl Waiting {
    fn take(&self) -> Vec<SpanData> {
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *spans, Vec::with_capacity(MAX_EXPORT_BATCH))
    }
}

/// The span processor: a bounded queue in front of the export thread.
#[derive(Debug)]
pub struct QueueProcessor {
    waiting: Arc<Waiting>,
    control: mpsc::UnboundedSender<Control>,
    counts: Arc<SpanCounts>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl QueueProcessor {
    /// Builds the exporter with `make` on `runtime` (tonic and hyper need
    /// it) and starts the queue's task there. A failure to build is
    /// returned here.
    pub fn start<E, F>(
        runtime: &Handle,
        settings: &Settings,
        resource: Resource,
        make: F,
    ) -> Result<QueueProcessor, crate::Error>
    where
        E: SpanExporter + 'static,
        F: FnOnce() -> Result<E, crate::Error>,
    {
        let waiting = Arc::new(Waiting {
            spans: Mutex::new(Vec::with_capacity(MAX_EXPORT_BATCH)),
            capacity: settings.max_queue_spans,
            batch: Notify::new(),
        });
        let (control, control_rx) = mpsc::unbounded_channel();
        let counts = Arc::new(SpanCounts::default());
        let mut exporter = {
            let _inside = runtime.enter();
            make()?
        };
        // The process's `service.name` and attributes go with every batch.
        exporter.set_resource(&resource);
        let queue = Queue {
            exporter,
            waiting: Arc::clone(&waiting),
            counts: Arc::clone(&counts),
            timeout: settings.export_timeout,
            complained: false,
        };
        let task = runtime.spawn(queue.run(control_rx));
        Ok(QueueProcessor {
            waiting,
            control,
            counts,
            task: Mutex::new(Some(task)),
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
        let mut spans = self
            .waiting
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if spans.len() >= self.waiting.capacity {
            drop(spans);
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        spans.push(span);
        let ready = spans.len() == MAX_EXPORT_BATCH;
        drop(spans);
        if ready {
            self.waiting.batch.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(10))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let stopped = self.ask(Control::Stop, timeout);
        if stopped.is_err()
            && let Some(task) = self.task.lock().ok().and_then(|mut t| t.take())
        {
            task.abort();
        }
        stopped
    }
}

/// The export thread's side of the queue.
struct Queue<E> {
    exporter: E,
    waiting: Arc<Waiting>,
    counts: Arc<SpanCounts>,
    timeout: Duration,
    /// A failure was logged already (one line, not one per batch).
    complained: bool,
}

impl<E: SpanExporter> Queue<E> {
    async fn run(mut self, mut control: mpsc::UnboundedReceiver<Control>) {
        let mut tick = tokio::time::interval(EXPORT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = tokio::select! {
                _ = self.waiting.batch.notified() => None,
                _ = tick.tick() => None,
                message = control.recv() => Some(message),
            };
            self.export_waiting().await;
            match message {
                None => {}
                Some(Some(Control::Flush(done))) => {
                    let _ = done.send(());
                }
                Some(Some(Control::Stop(done))) => {
                    let _ = self.exporter.shutdown();
                    let _ = done.send(());
                    return;
                }
                // Every sender is gone: the processor was dropped.
                Some(None) => break,
            }
        }
        let _ = self.exporter.shutdown();
    }

    /// Sends what waits, in batches of at most [`MAX_EXPORT_BATCH`].
    async fn export_waiting(&mut self) {
        let mut spans = self.waiting.take();
        while !spans.is_empty() {
            let rest = spans.split_off(spans.len().min(MAX_EXPORT_BATCH));
            self.export(spans).await;
            spans = rest;
        }
    }

    async fn export(&mut self, spans: Vec<SpanData>) {
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
