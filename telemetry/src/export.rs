//! Finished spans to the collector, off the request path.
//!
//! A span that ends ([`crate::spans`]) is pushed onto a bounded queue (a
//! short lock, no wake-up): when the queue is full the span is dropped and counted, so a
//! slow or dead collector never makes a request wait. A task on the export
//! runtime (a thread of its own, `otel-export`) takes the queue every
//! [`EXPORT_INTERVAL`], or as soon as [`MAX_EXPORT_BATCH`] spans wait (the
//! one wake-up per batch), and sends it in batches of that size with the
//! exporter (tonic or hyper). Waking the exporter for every span cost more
//! than making the span (profiled: a third of the export thread's time was
//! futex and eventfd wake-ups).
//!
//! A thread whose time is the product's (the gpu-host's scheduler) need not
//! make its spans at all: it hands the times it noted to [`defer`], and the
//! export thread makes and ends the spans just before it exports them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Sampler, SpanData, SpanExporter};
use tokio::runtime::Handle;
use tokio::sync::{Notify, mpsc, oneshot};

use crate::settings::{MAX_EXPORT_BATCH, Settings};
use crate::spans::{Sink, SpanIds};

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

/// Work that makes spans, run on the export thread (see [`defer`]).
type Job = Box<dyn FnOnce() + Send>;

/// What waits for the export thread.
#[derive(Default)]
struct Pending {
    spans: Vec<SpanData>,
    jobs: Vec<Job>,
    /// The spans `jobs` will make.
    job_spans: usize,
}

impl Pending {
    fn len(&self) -> usize {
        self.spans.len() + self.job_spans
    }
}

/// The spans waiting for export, shared by the processor and its task.
struct Waiting {
    pending: Mutex<Pending>,
    capacity: usize,
    /// The process's, for [`start_span`].
    sampler: Sampler,
    counts: Arc<SpanCounts>,
    /// A batch is ready.
    batch: Notify,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_spans(&self) -> Vec<SpanData> {
        std::mem::replace(&mut self.lock().spans, Vec::with_capacity(MAX_EXPORT_BATCH))
    }

    fn take_jobs(&self) -> Vec<Job> {
        let mut pending = self.lock();
        pending.job_spans = 0;
        std::mem::take(&mut pending.jobs)
    }

    /// Queues one finished span (see [`Waiting::admit`]).
    fn push(&self, span: SpanData) -> bool {
        let mut span = Some(span);
        self.admit(1, |pending| {
            pending.spans.push(span.take().expect("pushed once"));
        })
    }

    /// Queues `n` spans' worth with `push`, or counts them dropped when the
    /// queue is full; wakes the export task when a batch is ready.
    fn admit(&self, n: usize, push: impl FnOnce(&mut Pending)) -> bool {
        let mut pending = self.lock();
        let before = pending.len();
        if before + n > self.capacity {
            drop(pending);
            self.counts.dropped.fetch_add(n as u64, Ordering::Relaxed);
            return false;
        }
        push(&mut pending);
        let ready = before < MAX_EXPORT_BATCH && before + n >= MAX_EXPORT_BATCH;
        drop(pending);
        if ready {
            self.batch.notify_one();
        }
        true
    }
}

/// The running export's queue, for [`defer`], [`emit`] and
/// [`start_span`].
static ACTIVE: RwLock<Option<Weak<Waiting>>> = RwLock::new(None);

fn active() -> Option<Arc<Waiting>> {
    ACTIVE
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(Weak::upgrade)
}

/// The ids of a new span under `parent` (a new trace when it holds none),
/// when spans are exported and the sampler keeps this one; `None`
/// otherwise, and then nothing about it need be noted.
pub fn start_span(parent: &Context, name: &str, kind: &SpanKind) -> Option<SpanIds> {
    let ids = SpanIds::start(&active()?.sampler, parent, name, kind);
    ids.sampled.then_some(ids)
}

/// Queues a finished span for export (from a [`defer`] job, or any
/// thread); `false` when no export is running or the queue is full (it is
/// counted as dropped).
pub fn emit(span: SpanData) -> bool {
    match active() {
        Some(waiting) => waiting.push(span),
        None => false,
    }
}

/// Runs `job`, which makes and ends `spans` spans, on the export thread
/// just before its next export, so the calling thread spends nothing on
/// them. `false` (and `job` dropped) when no export is running or its
/// queue is full (the spans are counted as dropped).
pub fn defer(spans: usize, job: impl FnOnce() + Send + 'static) -> bool {
    let Some(waiting) = active() else {
        return false;
    };
    let mut job = Some(job);
    waiting.admit(spans, |pending| {
        pending
            .jobs
            .push(Box::new(job.take().expect("pushed once")));
        pending.job_spans += spans;
    })
}

/// A bounded queue in front of the export thread.
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
        sampler: Sampler,
        resource: Resource,
        make: F,
    ) -> Result<QueueProcessor, crate::Error>
    where
        E: SpanExporter + 'static,
        F: FnOnce() -> Result<E, crate::Error>,
    {
        let counts = Arc::new(SpanCounts::default());
        let waiting = Arc::new(Waiting {
            pending: Mutex::new(Pending::default()),
            capacity: settings.max_queue_spans,
            sampler,
            counts: Arc::clone(&counts),
            batch: Notify::new(),
        });
        let (control, control_rx) = mpsc::unbounded_channel();
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
        *ACTIVE.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::downgrade(&waiting));
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

    /// Where finished spans go: this queue.
    pub(crate) fn sink(&self) -> Sink {
        let waiting = Arc::clone(&self.waiting);
        Arc::new(move |span| {
            waiting.push(span);
        })
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

impl QueueProcessor {
    /// Exports every queued span now (tests, and before exit).
    pub fn force_flush(&self) -> OTelSdkResult {
        self.ask(Control::Flush, Duration::from_secs(10))
    }

    /// Exports what is queued and stops, waiting at most `timeout`.
    pub fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
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

    /// Runs the deferred jobs (their spans join the queue), then sends
    /// what waits, in batches of at most [`MAX_EXPORT_BATCH`].
    async fn export_waiting(&mut self) {
        for job in self.waiting.take_jobs() {
            job();
            // Room for the next job's spans without dropping any.
            if self.waiting.lock().spans.len() >= MAX_EXPORT_BATCH {
                let spans = self.waiting.take_spans();
                self.export_batches(spans).await;
            }
        }
        let spans = self.waiting.take_spans();
        self.export_batches(spans).await;
    }

    async fn export_batches(&mut self, mut spans: Vec<SpanData>) {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::settings::{Protocol, SamplerChoice};

    /// A span's name and the thread that exported it.
    type Sent = (String, Option<String>);

    /// Keeps what it is sent.
    #[derive(Debug, Default, Clone)]
    struct Keep(Arc<Mutex<Vec<Sent>>>);

    impl SpanExporter for Keep {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            let thread = std::thread::current().name().map(str::to_string);
            let mut kept = self.0.lock().unwrap();
            kept.extend(
                batch
                    .into_iter()
                    .map(|s| (s.name.to_string(), thread.clone())),
            );
            Ok(())
        }
    }

    fn settings(max_queue_spans: usize) -> Settings {
        Settings {
            endpoint: "http://127.0.0.1:9".into(),
            metrics_endpoint: None,
            protocol: Protocol::Grpc,
            service_name: "test".into(),
            sampler: SamplerChoice::AlwaysOn,
            resource: BTreeMap::new(),
            max_queue_spans,
            export_timeout: Duration::from_secs(5),
            metric_interval: Duration::from_secs(60),
            headers: Default::default(),
        }
    }

    fn span(name: &'static str) -> SpanData {
        let ids = SpanIds::start(
            &Sampler::AlwaysOn,
            &Context::new(),
            name,
            &SpanKind::Internal,
        );
        let now = std::time::SystemTime::now();
        ids.span(
            &opentelemetry::InstrumentationScope::builder("t").build(),
            name,
            SpanKind::Internal,
            now,
            now,
            Vec::new(),
            Vec::new(),
            opentelemetry::trace::Status::Unset,
        )
    }

    #[test]
    fn deferred_spans_are_made_on_the_export_thread_and_a_full_queue_drops_them() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otel-export")
            .enable_all()
            .build()
            .unwrap();
        let kept = Keep::default();
        let exporter = kept.clone();
        let processor = QueueProcessor::start(
            runtime.handle(),
            &settings(8),
            Sampler::AlwaysOn,
            Resource::builder_empty().build(),
            || Ok(exporter),
        )
        .unwrap();
        let counts = processor.counts();

        let made_on = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&made_on);
        let here = std::thread::current().id();
        assert!(defer(2, move || {
            *seen.lock().unwrap() = Some(std::thread::current().id());
            assert!(emit(span("one")));
            assert!(emit(span("two")));
        }));
        // 2 promised + 7 more is past the queue's 8: refused and counted.
        assert!(!defer(7, || panic!("a refused job never runs")));
        assert_eq!(counts.dropped(), 7);
        (processor.sink())(span("direct"));
        let started = start_span(&Context::new(), "root", &SpanKind::Server).expect("sampled");
        assert_ne!(started.trace_id, opentelemetry::trace::TraceId::INVALID);

        processor.force_flush().unwrap();
        let mut names: Vec<String> = kept.0.lock().unwrap().iter().map(|k| k.0.clone()).collect();
        names.sort();
        assert_eq!(names, ["direct", "one", "two"]);
        let thread = made_on.lock().unwrap().expect("the job ran");
        assert_ne!(thread, here, "the job ran on the caller's thread");
        assert!(
            kept.0
                .lock()
                .unwrap()
                .iter()
                .all(|k| k.1.as_deref() == Some("otel-export"))
        );
        assert_eq!(counts.exported(), 3);
        processor
            .shutdown_with_timeout(Duration::from_secs(5))
            .unwrap();
        drop(processor);
        // The task that held the queue is dropped with its runtime (it
        // answers the stop before it is dropped).
        runtime.shutdown_timeout(Duration::from_secs(5));
        assert!(
            !emit(span("late")),
            "no export runs after the queue is gone"
        );
    }
}
