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

use bulkhead_protocol::digest::{CHUNK_BYTES, LeafHasher};
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

/// One resident file the scrub can check.
pub trait Scrubbable: Send + Sync {
    /// For messages: the model's name.
    fn name(&self) -> &str;
    /// The resident bytes.
    fn bytes(&self) -> &[u8];
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
            eprintln!("the weight scrub hashes at normal priority: SCHED_IDLE was refused ({err})");
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
            .filter(|m| !m.state().leaves().is_empty())
            .map(|model| {
                let n = model.state().leaves().len();
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
        let bytes = entry.model.bytes();
        let start = i * CHUNK_BYTES;
        let chunk = &bytes[start..bytes.len().min(start + CHUNK_BYTES)];
        let mut hasher = LeafHasher::new();
        for piece in chunk.chunks(style.piece_bytes) {
            if !wait_for_slot(shared, style, piece.len()) {
                return false;
            }
            if state.retired() {
                continue 'chunks; // unloaded mid-pass: no verdict
            }
            hasher.update(piece);
            pass.hashed.fetch_add(piece.len() as u64, Ordering::AcqRel);
        }
        if hasher.finish() != state.leaves()[i] {
            let reason = format!(
                "weights changed while resident: chunk {i} (bytes {start}..{}) no longer matches the hash verified at load",
                start + chunk.len()
            );
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
mod tests {
    use std::sync::mpsc::channel;
    use std::sync::{Condvar, Mutex};

    use bulkhead_protocol::digest::chunk_leaves;

    use super::super::WeightStatus;

    use super::*;

    struct Fake {
        bytes: Vec<u8>,
        state: WeightState,
        /// When set, the hashing thread blocks reading the bytes until it
        /// opens: a hasher that gets no CPU, holding the chunk it claimed.
        gate: Option<Gate>,
        /// Reads of `bytes` by the hashing thread.
        hasher_reads: AtomicUsize,
        /// When the watcher read `bytes` (once per chunk it claimed).
        watcher_reads: Mutex<Vec<Instant>>,
    }

    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Gate {
        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }

        fn pass(&self) {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }
    }

    impl Scrubbable for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        fn bytes(&self) -> &[u8] {
            match std::thread::current().name() {
                Some("weight-scrub") => {
                    self.hasher_reads.fetch_add(1, Ordering::SeqCst);
                    if let Some(gate) = &self.gate {
                        gate.pass();
                    }
                }
                Some("scrub-watch") => self.watcher_reads.lock().unwrap().push(Instant::now()),
                _ => {}
            }
            &self.bytes
        }
        fn state(&self) -> &WeightState {
            &self.state
        }
    }

    /// A resident file whose chunks were verified as `verified` but now hold `now`.
    fn fake(verified: &[u8], now: Vec<u8>) -> Arc<Fake> {
        Arc::new(build(verified, now, None))
    }

    /// An intact resident file the hashing thread stalls on until the gate opens.
    fn gated(bytes: Vec<u8>) -> Arc<Fake> {
        Arc::new(build(&bytes.clone(), bytes, Some(Gate::default())))
    }

    fn build(verified: &[u8], now: Vec<u8>, gate: Option<Gate>) -> Fake {
        let state = WeightState::from_leaves(chunk_leaves(verified), true, SystemTime::UNIX_EPOCH);
        Fake {
            bytes: now,
            state,
            gate,
            hasher_reads: AtomicUsize::new(0),
            watcher_reads: Mutex::new(Vec::new()),
        }
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 241) as u8).collect()
    }

    /// Polls `done` until it holds or 30 s pass; whether it held.
    fn eventually(done: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Runs `body` on a thread of its own and fails the test if it has not
    /// returned within a minute: these tests join and wait on threads, and
    /// a regression there must fail, not hang the run.
    fn bounded(body: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            body();
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => {}
            // The body panicked: its own message is on stderr.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the test body failed"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("the test body did not finish within 60 s (a thread hangs)")
            }
        }
    }

    /// A scrub of intact `bytes` at one byte a second.
    fn slow_scrub(bytes: Vec<u8>) -> Scrubber {
        let model = fake(&bytes, bytes.clone());
        let slow = ScrubConfig {
            bytes_per_s: 1,
            min_bytes_per_s: 1,
        };
        Scrubber::start(slow, move || vec![model.clone()], |_: &Fake, _: &str| {}).unwrap()
    }

    const FAST: ScrubConfig = ScrubConfig {
        bytes_per_s: u64::MAX,
        min_bytes_per_s: u64::MAX,
    };

    #[test]
    fn a_changed_chunk_quarantines_the_model_and_names_the_chunk() {
        bounded(|| {
            // The last chunk, short, is the changed one.
            let verified = sample(CHUNK_BYTES * 2 + 1000);
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
            assert!(why.contains("chunk 2 (bytes 8388608..8389608)"), "{why}");
            assert_eq!(model.state.status(), WeightStatus::Quarantined(why));
            // The chunks before it were claimed first and are found intact (by
            // whichever thread holds them), and only they count: whole 4 MiB
            // chunks, never the short changed one. (A pass planned before the
            // verdict may hash them again.) No pass completed.
            assert!(eventually(
                || model.state.scrubbed_bytes() >= 2 * CHUNK_BYTES as u64
            ));
            assert_eq!(model.state.scrubbed_bytes() % CHUNK_BYTES as u64, 0);
            assert_eq!(model.state.passes(), 0);
            assert_eq!(model.state.verified_at_ms(), 0);
        });
    }

    /// Scrubs an intact file of `len` bytes with `config` until two passes
    /// complete, then stops; checks that each pass refreshed its state.
    fn two_intact_passes(config: ScrubConfig, len: usize) -> Arc<Fake> {
        let bytes = sample(len);
        let model = fake(&bytes, bytes.clone());
        let listed = model.clone();
        let scrub = Scrubber::start(
            config,
            move || vec![listed.clone()],
            |_: &Fake, why: &str| panic!("unexpected mismatch: {why}"),
        )
        .unwrap();
        assert!(eventually(|| model.state.passes() >= 2));
        drop(scrub);
        assert_eq!(model.state.status(), WeightStatus::Serving);
        assert!(model.state.verified_at_ms() > 0);
        assert!(model.state.scrubbed_bytes() >= 2 * len as u64);
        model
    }

    #[test]
    fn intact_weights_complete_passes_and_refresh_the_verified_time() {
        bounded(|| {
            two_intact_passes(FAST, CHUNK_BYTES + 17);
        });
    }

    #[test]
    fn dropping_a_slow_scrub_stops_it_at_once() {
        bounded(|| {
            // One byte a second: the second piece would start in ~3 days.
            let scrub = slow_scrub(sample(CHUNK_BYTES * 4));
            drop(scrub); // joins: the test hangs if the thread sleeps through it
        });
    }

    #[test]
    fn rate_zero_means_no_thread() {
        bounded(|| {
            let scrub = Scrubber::start(
                ScrubConfig {
                    bytes_per_s: 0,
                    min_bytes_per_s: 0,
                },
                Vec::<Arc<Fake>>::new,
                |_: &Fake, _: &str| {},
            )
            .unwrap();
            assert!(scrub.threads.is_none());
        });
    }

    #[test]
    fn the_hashing_thread_runs_at_sched_idle_and_its_creator_does_not() {
        bounded(|| {
            let scrub = slow_scrub(sample(CHUNK_BYTES));
            let tid = scrub.hasher_tid().unwrap();
            let comm =
                std::fs::read_to_string(format!("/proc/self/task/{}/comm", tid.as_raw_nonzero()))
                    .unwrap();
            assert_eq!(comm.trim_end(), "weight-scrub");
            assert_eq!(idle::policy_of(tid).unwrap(), libc::SCHED_IDLE);
            assert_eq!(idle::policy_of(gettid()).unwrap(), libc::SCHED_OTHER);
        });
    }

    #[test]
    fn a_stalled_hasher_keeps_one_chunk_and_the_watcher_hashes_the_rest_of_the_pass() {
        bounded(|| {
            let verified = sample(CHUNK_BYTES * 3);
            let stalled = gated(verified.clone());
            let other = fake(
                &verified[..CHUNK_BYTES * 2],
                verified[..CHUNK_BYTES * 2].to_vec(),
            );
            let listed = (stalled.clone(), other.clone());
            // 100 MiB/s, all of it kept at normal priority: a pass (5 chunks,
            // 20 MiB) is due in 0.2 s.
            let config = ScrubConfig {
                bytes_per_s: 100 << 20,
                min_bytes_per_s: 100 << 20,
            };
            let started = Instant::now();
            let scrub = Scrubber::start(
                config,
                move || vec![listed.0.clone(), listed.1.clone()],
                |_: &Fake, why: &str| panic!("unexpected mismatch: {why}"),
            )
            .unwrap();
            // The hasher claims a chunk of `stalled` (the first, unless it was
            // slow to start) and stalls on it.
            assert!(eventually(
                || stalled.hasher_reads.load(Ordering::SeqCst) == 1
            ));
            // The watcher finds each pass behind and hashes the rest of it: the
            // other model's passes go on, and the stalled model's too from the
            // next pass on.
            let passes = other.state.passes();
            assert!(eventually(|| other.state.passes() >= passes + 2));
            assert!(stalled.state.passes() >= 1);
            // What the watcher hashed is counted as the floor's.
            assert!(other.state.floor_bytes() >= 2 * CHUNK_BYTES as u64);
            assert!(stalled.state.floor_bytes() >= 2 * CHUNK_BYTES as u64);
            assert!(
                started.elapsed() >= TIMING.late,
                "the watcher only steps in once late"
            );
            assert_eq!(stalled.hasher_reads.load(Ordering::SeqCst), 1);
            // Once it runs again, it finishes its chunk and claims another: later
            // passes are given to it again. (Which chunks it gets depends on the
            // load: on a busy machine it backs off after each late wake-up and
            // the watcher takes the rest of every pass, `other` included.)
            stalled.gate.as_ref().unwrap().open();
            assert!(eventually(
                || stalled.hasher_reads.load(Ordering::SeqCst) > 1
            ));
            drop(scrub);
            assert_eq!(stalled.state.status(), WeightStatus::Serving);
        });
    }

    #[test]
    fn with_the_hasher_stalled_the_watcher_keeps_the_floor_not_the_rate() {
        bounded(|| {
            let timing = Timing {
                late: Duration::from_millis(200),
                every: Duration::from_millis(10),
            };
            // The rate allows 200 MiB/s; the floor is a quarter of it.
            let floor = 50 << 20;
            let config = ScrubConfig {
                bytes_per_s: 200 << 20,
                min_bytes_per_s: floor,
            };
            let model = gated(sample(CHUNK_BYTES * 12));
            let listed = model.clone();
            let started = Instant::now();
            let scrub = Scrubber::start_timed(
                config,
                timing,
                Box::new(move || vec![listed.clone()]),
                Box::new(|_: &Fake, why: &str| panic!("unexpected mismatch: {why}")),
            )
            .unwrap();
            // The hasher stalls on the first chunk it claims, before hashing
            // any of it; the watcher hashes the other 11 of the pass.
            assert!(eventually(
                || model.watcher_reads.lock().unwrap().len() >= 11
            ));
            let reads = model.watcher_reads.lock().unwrap()[..11].to_vec();
            model.gate.as_ref().unwrap().open();
            drop(scrub);
            // It claims a chunk only while the pass is behind the floor: before
            // its k-th chunk it had hashed k chunks, less than the floor's due.
            for (k, at) in reads.iter().enumerate() {
                let due = floor as f64 * (*at - started).as_secs_f64();
                let hashed = (k * CHUNK_BYTES) as f64;
                assert!(
                    hashed < due,
                    "chunk {k} claimed at {:?}: {hashed} bytes hashed, {due} due",
                    *at - started
                );
            }
            // And it waited to be late by `late` before the first.
            assert!(reads[0] - started >= timing.late);
            // Its chunks matched and count as the floor's: at least the first
            // 10 of the 11 above (the drop may cut the one it is hashing
            // short), at most every chunk it claimed; what the hasher did after
            // the gate opened does not.
            let floor = model.state.floor_bytes();
            let claimed = model.watcher_reads.lock().unwrap().len() as u64;
            assert!(floor >= 10 * CHUNK_BYTES as u64, "{floor}");
            assert!(
                floor <= claimed * CHUNK_BYTES as u64,
                "{floor} of {claimed} chunks"
            );
        });
    }

    #[test]
    fn without_a_floor_the_idle_thread_hashes_everything_and_none_counts_as_floor() {
        bounded(|| {
            let no_floor = ScrubConfig {
                bytes_per_s: u64::MAX,
                min_bytes_per_s: 0,
            };
            let model = two_intact_passes(no_floor, CHUNK_BYTES * 2 + 5);
            assert_eq!(model.state.floor_bytes(), 0);
            assert!(model.watcher_reads.lock().unwrap().is_empty());
        });
    }

    #[test]
    fn the_floor_is_late_after_its_slack_and_behind_until_caught_up() {
        bounded(|| {
            let floor = Floor {
                bytes_per_s: 8 << 20,
                late: Duration::from_secs(1),
            };
            let s = Duration::from_secs;
            // 3 s in, 8 MiB hashed: 2 s behind.
            assert!(floor.late(s(3), 8 << 20));
            assert!(floor.behind(s(3), 8 << 20));
            // 3 s in, 20 MiB hashed: 0.5 s behind, inside the slack.
            assert!(!floor.late(s(3), 20 << 20));
            assert!(floor.behind(s(3), 20 << 20));
            // On or ahead of the floor.
            assert!(!floor.behind(s(3), 24 << 20));
            assert!(!floor.behind(s(3), 1 << 30));
            // No floor: never late, whatever the pass did.
            let none = Floor {
                bytes_per_s: 0,
                late: Duration::from_secs(1),
            };
            assert!(!none.late(s(1_000), 0));
            assert!(!none.behind(s(1_000), 0));
        });
    }

    #[test]
    fn the_pace_spaces_pieces_by_their_size_and_allows_one_piece_of_catch_up() {
        bounded(|| {
            let t0 = Instant::now();
            let ms = Duration::from_millis;
            // 1 MiB/s: 256 KiB is due every 250 ms.
            let pace = Pace::new(1 << 20, t0);
            assert_eq!(pace.book(256 << 10, t0), t0);
            assert_eq!(pace.book(256 << 10, t0), t0 + ms(250));
            assert_eq!(pace.book(256 << 10, t0), t0 + ms(500));
            // Nobody booked the slot due at 750 ms until 5 s: a late booking
            // starts at once, with one piece of catch-up, not 17.
            assert_eq!(pace.book(256 << 10, t0 + ms(5_000)), t0 + ms(4_750));
            assert_eq!(pace.book(256 << 10, t0 + ms(5_000)), t0 + ms(5_000));
            assert_eq!(pace.book(256 << 10, t0 + ms(5_000)), t0 + ms(5_250));
        });
    }
}
