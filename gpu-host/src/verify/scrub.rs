//! The background scrub: re-hashes resident chunks at a set rate and
//! compares each with the leaf verified at load.
//!
//! Its cost to inference is bounded by construction: it hashes a chunk
//! (4 MiB) in 256 KiB pieces and waits after each long enough to keep to
//! `bytes_per_s`, so it takes `bytes_per_s / hash speed` of one core
//! — 64 MiB/s is about 4% of a core — in slices of ~0.15 ms, and never
//! holds anything the request path waits on (the weights are read-only; the
//! state is atomics).
//!
//! Whose core pays for it: the hashing runs on the thread `weight-scrub` at
//! `SCHED_IDLE`, so it takes only CPU time nothing else wants, and a
//! partition's thread waking on its core preempts it at once. (At normal
//! priority, once a flooding tenant's cores were busy, the kernel ran it on
//! a dedicated tenant's core, where the isolation bench saw it in that
//! tenant's inter-token p99.) With no idle time, that thread gets next to
//! nothing and changed weights would go unnoticed for as long, so a second
//! thread, `scrub-watch`, at normal priority, plans each pass and keeps it
//! at no less than `min_bytes_per_s`: whenever the pass is more than a
//! second's worth of that floor behind, the watcher claims chunks itself
//! (at up to `bytes_per_s`, the rate both threads share) until it is back
//! on the floor. The idle thread keeps the one chunk it holds and finishes
//! it when it next runs.
//!
//! ```text
//! scrub-watch (normal) ─ pass: chunks of every serving model ─▶ weight-scrub (SCHED_IDLE)
//!      │ every 250 ms: hashed < floor × time − 1 s of floor?   │ claims chunk i, hashes it
//!      └─yes─▶ claims chunks itself until back on the floor ───┴─▶ leaf i again == leaf i? ─no─▶ quarantine
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant, SystemTime};

use bulkhead_protocol::digest::LeafHasher;
use rustix::thread::{Pid, gettid};

use super::WeightState;
use super::idle;

/// How fast the scrub re-reads resident weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubConfig {
    /// Bytes re-hashed per second across all models, on idle CPU time; 0
    /// turns the scrub off.
    pub bytes_per_s: u64,
    /// The rate kept at normal priority when idle time does not give it
    /// (at most `bytes_per_s`; 0: idle time only).
    pub min_bytes_per_s: u64,
}

/// One resident model the scrub can check: the pieces its state lists,
/// in the regions that hold them.
pub trait Scrubbable: Send + Sync {
    /// For messages: the model's name.
    fn name(&self) -> &str;
    /// Resident bytes by region: 0 is the file's resident copy, 1 and on
    /// any packed copies of its matrices.
    fn region(&self, index: usize) -> &[u8];
    fn state(&self) -> &WeightState;
}

/// The scrub's two threads; they stop (within one piece) when it is dropped.
#[derive(Debug)]
pub struct Scrubber {
    threads: Option<Threads>,
}

#[derive(Debug)]
struct Threads {
    stop: Arc<AtomicBool>,
    watch: JoinHandle<()>,
    hasher: JoinHandle<()>,
    /// The hashing thread's kernel id.
    #[cfg_attr(not(test), allow(dead_code))]
    hasher_tid: Pid,
}

/// How each thread hashes: bytes between two waits (the thread sleeps
/// between pieces to keep to the rate, so a piece is how long it holds a
/// core at a time; also how soon a dropped scrubber stops), and what it
/// does when it finds its CPU busy.
#[derive(Clone, Copy, Debug)]
struct Style {
    piece_bytes: usize,
    /// Hashing at normal priority to keep the floor (counted apart).
    at_floor: bool,
    /// How long to give way after being woken late.
    back_off: Option<Duration>,
}

/// The idle thread: 256 KiB pieces, ~0.15–0.2 ms of one core with SHA-NI,
/// few wake-ups on idle time. An idle-policy thread still gets a small
/// share of a busy CPU, taken from whatever runs there, so once it is
/// woken late (its CPU was busy) it sleeps 250 ms before trying again and
/// leaves the floor to the watcher; without this it took 2.6 ms/s of a
/// dedicated tenant's core in the isolation bench.
const IDLE: Style = Style {
    piece_bytes: 256 << 10,
    at_floor: false,
    back_off: Some(Duration::from_millis(250)),
};

/// The watcher, at normal priority, keeping the floor: 32 KiB pieces
/// (~25 µs), so when it shares a partition's core it delays a step by that
/// much at a time, not by a 256 KiB piece.
const FLOOR: Style = Style {
    piece_bytes: 32 << 10,
    at_floor: true,
    back_off: None,
};

/// Woken later than this after its slot, the idle thread takes its CPU to
/// be busy (timer slack is 50 µs).
const WOKEN_LATE: Duration = Duration::from_millis(1);

/// Longest wait before looking again for models when none is loaded.
const IDLE_POLL: Duration = Duration::from_secs(1);

/// When the watcher steps in.
#[derive(Clone, Copy, Debug)]
struct Timing {
    /// How far behind the floor rate a pass may fall before the watcher
    /// hashes at normal priority: what the idle priority may add to the
    /// time changed weights go unnoticed, beyond the floor's pass time.
    late: Duration,
    /// How often the watcher looks at a running pass.
    every: Duration,
}

const TIMING: Timing = Timing {
    late: Duration::from_secs(1),
    every: Duration::from_millis(250),
};

impl Scrubber {
    /// Starts scrubbing whatever `models` returns (asked again before each
    /// pass, so loaded and unloaded models are picked up); `on_mismatch` is
    /// called once per model taken out of service. When the hashing thread
    /// cannot be given `SCHED_IDLE` (a seccomp filter, say), it says so on
    /// stderr and hashes at normal priority.
    pub fn start<M, L, F>(
        config: ScrubConfig,
        models: L,
        on_mismatch: F,
    ) -> std::io::Result<Scrubber>
    where
        M: Scrubbable + ?Sized + 'static,
        L: Fn() -> Vec<Arc<M>> + Send + 'static,
        F: Fn(&M, &str) + Send + Sync + 'static,
    {
        Scrubber::start_timed(config, TIMING, Box::new(models), Box::new(on_mismatch))
    }

    fn start_timed<M: Scrubbable + ?Sized + 'static>(
        config: ScrubConfig,
        timing: Timing,
        models: Models<M>,
        on_mismatch: OnMismatch<M>,
    ) -> std::io::Result<Scrubber> {
        if config.bytes_per_s == 0 {
            return Ok(Scrubber { threads: None });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            pace: Pace::new(config.bytes_per_s, Instant::now()),
            stop: Arc::clone(&stop),
            on_mismatch,
        });
        // The hasher gets its passes through a one-slot channel, so a starved
        // hasher keeps at most two passes (and their models) alive.
        let (passes, planned) = sync_channel::<Arc<Pass<M>>>(1);
        let (told_tid, tid) = sync_channel(1);
        let hasher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("weight-scrub".into())
                .spawn(move || {
                    let _ = told_tid.send(gettid());
                    while let Ok(pass) = planned.recv() {
                        if !work(&pass, &shared, IDLE, || true) {
                            return;
                        }
                    }
                })?
        };
        // It waits for its first pass, which comes after this.
        let hasher_tid = tid
            .recv()
            .map_err(|_| std::io::Error::other("the scrub's hashing thread ended at start"))?;
        if let Err(err) = idle::set_idle(hasher_tid) {
            tracing::warn!(
                "the weight scrub hashes at normal priority: SCHED_IDLE was refused ({err})"
            );
        }
        let floor = Floor {
            bytes_per_s: config.min_bytes_per_s.min(config.bytes_per_s),
            late: timing.late,
        };
        let watch = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("scrub-watch".into())
                .spawn(move || watch(&models, &passes, &shared, floor, timing.every))?
        };
        Ok(Scrubber {
            threads: Some(Threads {
                stop,
                watch,
                hasher,
                hasher_tid,
            }),
        })
    }

    /// The hashing thread's kernel id (tests look up its policy).
    #[cfg(test)]
    fn hasher_tid(&self) -> Option<Pid> {
        self.threads.as_ref().map(|t| t.hasher_tid)
    }
}
impl Drop for Scrubber {
    fn drop(&mut self) {
        if let Some(threads) = self.threads.take() {
            threads.stop.store(true, Ordering::Release);
            threads.watch.thread().unpark();
            threads.hasher.thread().unpark();
            // The watcher's end drops the pass channel, which ends the
            // hasher's wait for a pass.
            let _ = threads.watch.join();
            let _ = threads.hasher.join();
        }
    }
}

/// Told once per model taken out of service, with the reason.
type OnMismatch<M> = Box<dyn Fn(&M, &str) + Send + Sync>;

/// The models to scrub, asked before each pass.
type Models<M> = Box<dyn Fn() -> Vec<Arc<M>> + Send>;

/// What both threads use.
struct Shared<M: ?Sized> {
    pace: Pace,
    /// Set when the scrubber is dropped; each thread is unparked after.
    stop: Arc<AtomicBool>,
    on_mismatch: OnMismatch<M>,
}

impl<M: ?Sized> Shared<M> {
    /// Sleeps until `until`, or less when unparked (by the last claim of
    /// a pass, so that the watcher plans the next at once, by the drop, or
    /// spuriously); false once the scrubber is being dropped.
    fn sleep_until(&self, until: Instant) -> bool {
        if !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(until.saturating_duration_since(Instant::now()));
        }
        !self.stop.load(Ordering::Acquire)
    }
}

/// The rate, shared by both threads: each piece books its slot before it is
/// hashed. Slots are spaced by their size, which keeps the average rate; a
/// thread that comes late starts at once but gets at most one piece of
/// catch-up, so nobody ever hashes faster than the rate.
#[derive(Debug)]
struct Pace {
    origin: Instant,
    ns_per_byte: f64,
    /// Nanoseconds after `origin` when the next slot starts.
    next_ns: AtomicU64,
}

impl Pace {
    fn new(bytes_per_s: u64, now: Instant) -> Pace {
        Pace {
            origin: now,
            ns_per_byte: 1e9 / bytes_per_s as f64,
            next_ns: AtomicU64::new(0),
        }
    }

    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Books `bytes` of hashing; returns when it may start.
    fn book(&self, bytes: usize, now: Instant) -> Instant {
        let spacing = (self.ns_per_byte * bytes as f64) as u64;
        let floor = self.ns(now).saturating_sub(spacing);
        let booked = self
            .next_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |next| {
                Some(next.max(floor).saturating_add(spacing))
            })
            .unwrap_or_else(|next| next);
        self.origin + Duration::from_nanos(booked.max(floor))
    }
}

/// The rate the watcher keeps a pass at.
#[derive(Clone, Copy, Debug)]
struct Floor {
    /// 0: none (idle time only).
    bytes_per_s: u64,
    /// How far behind it a pass may fall before the watcher steps in.
    late: Duration,
}

impl Floor {
    /// How far a pass `age` old that has hashed `hashed` bytes is behind the
    /// floor, in seconds of its age (negative while ahead).
    fn behind_s(&self, age: Duration, hashed: u64) -> f64 {
        age.as_secs_f64() - hashed as f64 / self.bytes_per_s as f64
    }

    /// Whether the watcher steps in.
    fn late(&self, age: Duration, hashed: u64) -> bool {
        self.bytes_per_s > 0 && self.behind_s(age, hashed) > self.late.as_secs_f64()
    }

    /// Whether the watcher, having stepped in, goes on.
    fn behind(&self, age: Duration, hashed: u64) -> bool {
        self.bytes_per_s > 0 && self.behind_s(age, hashed) > 0.0
    }
}

/// One pass over the models serving when it was planned. Its chunks are
/// claimed in order, across the models, by whichever thread is hashing.
struct Pass<M: ?Sized> {
    models: Vec<PassModel<M>>,
    chunks: usize,
    claimed: AtomicUsize,
    /// Bytes hashed so far, by both threads (what the floor is kept on).
    hashed: AtomicU64,
    planned_at: Instant,
    /// The watcher, unparked by the last claim so that it plans the next
    /// pass while the last chunk is hashed.
    planner: Thread,
}

struct PassModel<M: ?Sized> {
    model: Arc<M>,
    /// The pass's index of this model's chunk 0.
    first: usize,
    /// Chunks not yet found intact; the pass is complete for the model
    /// when this reaches 0.
    left: AtomicUsize,
}

impl<M: Scrubbable + ?Sized> Pass<M> {
    fn plan(models: Vec<Arc<M>>) -> Pass<M> {
        let mut chunks = 0;
        let models = models
            .into_iter()
            .filter(|m| m.state().unavailable_reason().is_none())
            .filter(|m| !m.state().pieces().is_empty())
            .map(|model| {
                let n = model.state().pieces().len();
                let first = chunks;
                chunks += n;
                PassModel {
                    model,
                    first,
                    left: AtomicUsize::new(n),
                }
            })
            .collect();
        Pass {
            models,
            chunks,
            claimed: AtomicUsize::new(0),
            hashed: AtomicU64::new(0),
            planned_at: Instant::now(),
            planner: std::thread::current(),
        }
    }

    /// The next chunk nobody has claimed: its model and index.
    fn claim(&self) -> Option<(&PassModel<M>, usize)> {
        let at = self.claimed.fetch_add(1, Ordering::AcqRel);
        if at >= self.chunks {
            return None;
        }
        if at + 1 == self.chunks {
            self.planner.unpark();
        }
        let entry = self.models.iter().rev().find(|m| m.first <= at)?;
        Some((entry, at - entry.first))
    }

    fn all_claimed(&self) -> bool {
        self.claimed.load(Ordering::Acquire) >= self.chunks
    }

    fn hashed(&self) -> u64 {
        self.hashed.load(Ordering::Acquire)
    }
}

/// The watcher: plans each pass, hands it to the hashing thread, and
/// claims its chunks whenever it falls behind the floor.
fn watch<M>(
    models: &Models<M>,
    passes: &SyncSender<Arc<Pass<M>>>,
    shared: &Shared<M>,
    floor: Floor,
    every: Duration,
) where
    M: Scrubbable + ?Sized,
{
    loop {
        let pass = Arc::new(Pass::plan(models()));
        // Nothing to check (none loaded, or all out of service): look again
        // later rather than spin.
        if pass.chunks == 0 {
            if !shared.sleep_until(Instant::now() + IDLE_POLL) {
                return;
            }
            continue;
        }
        match passes.try_send(Arc::clone(&pass)) {
            // Full: the hasher has not taken the last pass yet (it is
            // starved), so it gets no new one; this pass falls behind and
            // is hashed here.
            Ok(()) | Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => {} // hasher gone: all here
        }
        while !pass.all_claimed() {
            if floor.late(pass.planned_at.elapsed(), pass.hashed()) {
                let behind = || floor.behind(pass.planned_at.elapsed(), pass.hashed());
                if !work(&pass, shared, FLOOR, behind) {
                    return;
                }
                continue;
            }
            if !shared.sleep_until(Instant::now() + every) {
                return;
            }
        }
    }
}

/// Books a slot for `bytes` and sleeps until it; with a back-off, gives
/// way while woken late. False when the scrubber is being dropped.
fn wait_for_slot<M: ?Sized>(shared: &Shared<M>, style: Style, bytes: usize) -> bool {
    loop {
        let slot = shared.pace.book(bytes, Instant::now());
        // When it means to run: its slot, or now when that has passed.
        let due = slot.max(Instant::now());
        while Instant::now() < slot {
            if !shared.sleep_until(slot) {
                return false;
            }
        }
        if shared.stop.load(Ordering::Acquire) {
            return false;
        }
        match style.back_off {
            Some(back_off) if due.elapsed() > WOKEN_LATE => {
                if !shared.sleep_until(Instant::now() + back_off) {
                    return false;
                }
            }
            _ => return true,
        }
    }
}

/// Hashes the pass's chunks while `go_on` holds and some are left to
/// claim; false when the scrubber is being dropped.
fn work<M>(pass: &Pass<M>, shared: &Shared<M>, style: Style, go_on: impl Fn() -> bool) -> bool
where
    M: Scrubbable + ?Sized,
{
    'chunks: while go_on() {
        let Some((entry, i)) = pass.claim() else {
            return true;
        };
        let state = entry.model.state();
        if state.unavailable_reason().is_some() {
            continue; // found changed earlier in this pass
        }
        let piece = &state.pieces()[i];
        let chunk = &entry.model.region(piece.region)[piece.range.clone()];
        let mut hasher = LeafHasher::new();
        for part in chunk.chunks(style.piece_bytes) {
            if !wait_for_slot(shared, style, part.len()) {
                return false;
            }
            if state.retired() {
                continue 'chunks; // unloaded mid-pass: no verdict
            }
            hasher.update(part);
            pass.hashed.fetch_add(part.len() as u64, Ordering::AcqRel);
        }
        if hasher.finish() != piece.leaf {
            let (start, end) = (piece.range.start, piece.range.end);
            let reason = match piece.region {
                0 => format!(
                    "weights changed while resident: chunk {i} (bytes {start}..{end}) no longer matches the hash verified at load"
                ),
                r => format!(
                    "weights changed while resident: chunk {i} (bytes {start}..{end} of packed matrix {r}) no longer matches the hash taken when it was packed"
                ),
            };
            if state.quarantine(reason.clone()) {
                (shared.on_mismatch)(&entry.model, &reason);
            }
            continue;
        }
        state.scrubbed(chunk.len() as u64, style.at_floor);
        if entry.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            state.pass_completed(SystemTime::now());
        }
    }
    true
}

#[cfg(test)]
mod tests;
