//! The closed loop: every worker sends its next request as soon as the last
//! one finished, for the warm-up and then the measured window.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long to load before and while measuring.
#[derive(Debug)]
pub struct Plan {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Why one request failed.
#[derive(Debug)]
pub struct Failure {
    /// Tally key: an HTTP status (`"429"`), `grpc:CODE`, or a short word (`io`).
    pub kind: String,
    /// What the server or the transport said, for the first failure's message.
    pub detail: String,
}

/// One client with its own connection (or its share of one).
pub trait Worker: Send + 'static {
    /// Sends one request and reads the whole response; returns when the
    /// response was complete, which may be before the call returns (gRPC
    /// drains the trailers after `Finished`).
    fn request(&mut self) -> impl Future<Output = Result<Instant, Failure>> + Send;
}

/// Everything the measured window saw.
#[derive(Debug, Default)]
pub struct Samples {
    /// Latency of every successful request that completed in the window, in ns.
    pub latencies_ns: Vec<u64>,
    /// Failed requests that completed in the window, by `Failure::kind`.
    pub errors: BTreeMap<String, u64>,
    /// The first `Failure::detail` seen for each kind, to say what went wrong.
    pub error_details: BTreeMap<String, String>,
}

/// Runs `workers` (one request in flight each) through `plan`. One request
/// is sent first on its own: if it fails, nothing else runs and the error
/// says why, so a misconfigured target is not benchmarked as fast failures.
pub async fn run<W: Worker>(mut workers: Vec<W>, plan: &Plan) -> anyhow::Result<Samples> {
    if let Some(first) = workers.first_mut()
        && let Err(failure) = first.request().await
    {
        anyhow::bail!(
            "the first request failed ({}): {}",
            failure.kind,
            failure.detail
        );
    }
    let measure_from = Instant::now() + plan.warmup;
    let until = measure_from + plan.duration;
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|worker| tokio::spawn(work(worker, measure_from, until)))
        .collect();
    let mut all = Samples::default();
    for task in tasks {
        let samples = task.await?;
        all.latencies_ns.extend(samples.latencies_ns);
        for (kind, count) in samples.errors {
            *all.errors.entry(kind).or_default() += count;
        }
        for (kind, detail) in samples.error_details {
            all.error_details.entry(kind).or_insert(detail);
        }
    }
    Ok(all)
}

/// One worker's loop. A request counts if it completed inside
/// `[measure_from, until]`; those straddling either edge are sent but not kept.
async fn work<W: Worker>(mut worker: W, measure_from: Instant, until: Instant) -> Samples {
    let mut samples = Samples {
        // Enough for ~10 s at a few thousand requests/s without regrowing.
        latencies_ns: Vec::with_capacity(1 << 15),
        ..Samples::default()
    };
    loop {
        let start = Instant::now();
        if start >= until {
            break;
        }
        let result = worker.request().await;
        let done = match &result {
            Ok(done) => *done,
            Err(_) => Instant::now(),
        };
        if done < measure_from || done > until {
            continue;
        }
        match result {
            Ok(_) => samples
                .latencies_ns
                .push(u64::try_from((done - start).as_nanos()).unwrap_or(u64::MAX)),
            Err(failure) => {
                *samples.errors.entry(failure.kind.clone()).or_default() += 1;
                samples
                    .error_details
                    .entry(failure.kind)
                    .or_insert(failure.detail);
            }
        }
    }
    samples
}
