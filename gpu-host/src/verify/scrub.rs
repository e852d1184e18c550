//! The background scrub: one thread re-hashes resident chunks at a set rate
//! and compares each with the leaf verified at load.
//!
//! Its cost to inference is bounded by construction: it hashes a chunk
//! (4 MiB) in 256 KiB pieces and waits after each long enough to keep to
//! `bytes_per_s`, so it takes `bytes_per_s / hash speed` of one core
//! — 64 MiB/s is about 4% of a core — in slices of ~0.15 ms, and never
//! holds anything the request path waits on (the weights are read-only; the
//! state is atomics).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use bulkhead_protocol::digest::{CHUNK_BYTES, LeafHasher};

use super::WeightState;

/// How fast the scrub re-reads resident weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubConfig {
    /// Bytes re-hashed per second across all models; 0 turns the scrub off.
    pub bytes_per_s: u64,
}

/// One resident file the scrub can check.
pub trait Scrubbable: Send + Sync {
    /// For messages: the model's name.
    fn name(&self) -> &str;
    /// The resident bytes.
    fn bytes(&self) -> &[u8];
    fn state(&self) -> &WeightState;
}

/// The scrub thread; stops (within one chunk) when dropped.
#[derive(Debug)]
pub struct Scrubber {
    stop: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Bytes hashed between two waits: 256 KiB, ~0.15 ms of one core with
/// SHA-NI. The thread sleeps between pieces (to keep to the rate), so a
/// core it shares with a partition's decode step is taken from the step for
/// that long at a time, not for the 2–3 ms of a whole 4 MiB chunk (which
/// showed in the isolation bench's inter-token p99). Also how soon a
/// dropped scrubber stops.
const PIECE_BYTES: usize = 256 << 10;

/// Longest wait before looking again for models when none is loaded.
const IDLE_POLL: Duration = Duration::from_secs(1);

impl Scrubber {
    /// Starts scrubbing whatever `models` returns (asked again before each
    /// pass, so loaded and unloaded models are picked up); `on_mismatch` is
    /// called once per model taken out of service.
    pub fn start<M, L, F>(
        config: ScrubConfig,
        models: L,
        on_mismatch: F,
    ) -> std::io::Result<Scrubber>
    where
        M: Scrubbable + ?Sized + 'static,
        L: Fn() -> Vec<Arc<M>> + Send + 'static,
        F: Fn(&M, &str) + Send + 'static,
    {
        if config.bytes_per_s == 0 {
            return Ok(Scrubber {
                stop: None,
                thread: None,
            });
        }
        let (stop, stopped) = sync_channel(0);
        let thread = std::thread::Builder::new()
            .name("weight-scrub".into())
            .spawn(move || run(config, &stopped, &models, &on_mismatch))?;
        Ok(Scrubber {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Scrubber {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Waits until `until`; false when the scrubber was dropped meanwhile.
fn wait(stopped: &Receiver<()>, until: Instant) -> bool {
    let timeout = until.saturating_duration_since(Instant::now());
    matches!(
        stopped.recv_timeout(timeout),
        Err(RecvTimeoutError::Timeout)
    )
}

fn run<M, L, F>(config: ScrubConfig, stopped: &Receiver<()>, models: &L, on_mismatch: &F)
where
    M: Scrubbable + ?Sized,
    L: Fn() -> Vec<Arc<M>>,
    F: Fn(&M, &str),
{
    let per_byte = Duration::from_secs(1).as_secs_f64() / config.bytes_per_s as f64;
    // When the next chunk may start: spacing chunks by their size keeps the
    // average rate; never more than one chunk's worth of catch-up.
    let mut next = Instant::now();
    loop {
        let current: Vec<Arc<M>> = models()
            .into_iter()
            .filter(|m| m.state().unavailable_reason().is_none())
            .collect();
        // Nothing left to check (none loaded, or all out of service): look
        // again later rather than spin.
        if current.is_empty() && !wait(stopped, Instant::now() + IDLE_POLL) {
            return;
        }
        for model in current {
            let state = model.state();
            let bytes = model.bytes();
            let mut intact = true;
            'chunks: for (i, leaf) in state.leaves().iter().enumerate() {
                let start = i * CHUNK_BYTES;
                let chunk = &bytes[start..bytes.len().min(start + CHUNK_BYTES)];
                let mut hasher = LeafHasher::new();
                for piece in chunk.chunks(PIECE_BYTES) {
                    if !wait(stopped, next) {
                        return;
                    }
                    if state.retired() {
                        intact = false; // unloaded mid-pass: no verdict
                        break 'chunks;
                    }
                    hasher.update(piece);
                    let spacing = Duration::from_secs_f64(per_byte * piece.len() as f64);
                    let now = Instant::now();
                    let floor = now.checked_sub(spacing).unwrap_or(now);
                    next = next.max(floor) + spacing;
                }
                if hasher.finish() != *leaf {
                    let reason = format!(
                        "weights changed while resident: chunk {i} (bytes {start}..{}) no longer matches the hash verified at load",
                        start + chunk.len()
                    );
                    state.quarantine(reason.clone());
                    on_mismatch(&model, &reason);
                    intact = false;
                    break;
                }
                state.scrubbed(chunk.len() as u64);
            }
            if intact {
                state.pass_completed(SystemTime::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;

    use bulkhead_protocol::digest::chunk_leaves;

    use super::super::WeightStatus;

    use super::*;

    struct Fake {
        bytes: Vec<u8>,
        state: WeightState,
    }

    impl Scrubbable for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        fn bytes(&self) -> &[u8] {
            &self.bytes
        }
        fn state(&self) -> &WeightState {
            &self.state
        }
    }

    /// A resident file whose chunks were verified as `verified` but now hold `now`.
    fn fake(verified: &[u8], now: Vec<u8>) -> Arc<Fake> {
        let state = WeightState::from_leaves(chunk_leaves(verified), true, SystemTime::UNIX_EPOCH);
        Arc::new(Fake { bytes: now, state })
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 241) as u8).collect()
    }

    const FAST: ScrubConfig = ScrubConfig {
        bytes_per_s: u64::MAX,
    };

    #[test]
    fn a_changed_chunk_quarantines_the_model_and_names_the_chunk() {
        let verified = sample(CHUNK_BYTES * 3);
        let mut now = verified.clone();
        now[CHUNK_BYTES * 2 + 9] ^= 1;
        let model = fake(&verified, now);
        let (tx, rx) = channel();
        let listed = model.clone();
        let _scrub = Scrubber::start(
            FAST,
            move || vec![listed.clone()],
            move |m: &Fake, why: &str| {
                tx.send((m.name().to_string(), why.to_string())).unwrap();
            },
        )
        .unwrap();
        let (name, why) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(name, "fake");
        assert!(why.contains("chunk 2 (bytes 8388608..12582912)"), "{why}");
        assert_eq!(model.state.status(), WeightStatus::Quarantined(why));
        // The chunks before it were checked; no pass completed.
        assert_eq!(model.state.scrubbed_bytes(), 2 * CHUNK_BYTES as u64);
        assert_eq!(model.state.passes(), 0);
        assert_eq!(model.state.verified_at_ms(), 0);
    }

    #[test]
    fn intact_weights_complete_passes_and_refresh_the_verified_time() {
        let bytes = sample(CHUNK_BYTES + 17);
        let model = fake(&bytes, bytes.clone());
        let listed = model.clone();
        let scrub = Scrubber::start(
            FAST,
            move || vec![listed.clone()],
            |_: &Fake, why: &str| panic!("unexpected mismatch: {why}"),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while model.state.passes() < 2 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        drop(scrub);
        assert!(model.state.passes() >= 2);
        assert_eq!(model.state.status(), WeightStatus::Serving);
        assert!(model.state.verified_at_ms() > 0);
        assert!(model.state.scrubbed_bytes() >= 2 * bytes.len() as u64);
    }

    #[test]
    fn dropping_a_slow_scrub_stops_it_at_once() {
        let bytes = sample(CHUNK_BYTES * 4);
        let model = fake(&bytes, bytes.clone());
        // One byte a second: the second chunk would start in ~48 days.
        let slow = ScrubConfig { bytes_per_s: 1 };
        let scrub =
            Scrubber::start(slow, move || vec![model.clone()], |_: &Fake, _: &str| {}).unwrap();
        drop(scrub); // joins: the test hangs if the thread sleeps through it
    }

    #[test]
    fn rate_zero_means_no_thread() {
        let scrub = Scrubber::start(
            ScrubConfig { bytes_per_s: 0 },
            Vec::<Arc<Fake>>::new,
            |_: &Fake, _: &str| {},
        )
        .unwrap();
        assert!(scrub.thread.is_none());
    }
}
