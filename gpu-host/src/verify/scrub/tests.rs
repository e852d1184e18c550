use std::sync::mpsc::channel;
use std::sync::{Condvar, Mutex};

use bulkhead_protocol::digest::{CHUNK_BYTES, chunk_leaves, leaf_hash};

use super::super::Piece;

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
    fn region(&self, index: usize) -> &[u8] {
        assert_eq!(index, 0, "a fake has one region");
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
    let state = WeightState::from_leaves(
        &chunk_leaves(verified),
        verified.len(),
        true,
        SystemTime::UNIX_EPOCH,
    );
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

/// A model served partly from a packed copy: the file with a hole (its
/// packed matrix's pages, freed) and the copy, each hashed in pieces.
struct Packed {
    file: Vec<u8>,
    copy: Vec<u8>,
    state: WeightState,
}

impl Scrubbable for Packed {
    fn name(&self) -> &str {
        "packed"
    }
    fn region(&self, index: usize) -> &[u8] {
        [&self.file, &self.copy][index]
    }
    fn state(&self) -> &WeightState {
        &self.state
    }
}

/// `file` with bytes `hole` no longer scrubbed and `copy` scrubbed instead,
/// as verified; then `change` applied to what is resident.
fn packed(
    file: Vec<u8>,
    hole: std::ops::Range<usize>,
    copy: Vec<u8>,
    change: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>),
) -> Arc<Packed> {
    let piece = |region, range: std::ops::Range<usize>, bytes: &[u8]| Piece {
        region,
        leaf: leaf_hash(&bytes[range.clone()]),
        range,
    };
    let mut pieces = vec![
        piece(0, 0..hole.start, &file),
        piece(0, hole.end..file.len(), &file),
    ];
    for start in (0..copy.len()).step_by(CHUNK_BYTES) {
        pieces.push(piece(1, start..copy.len().min(start + CHUNK_BYTES), &copy));
    }
    let state = WeightState::from_leaves(
        &chunk_leaves(&file),
        file.len(),
        true,
        SystemTime::UNIX_EPOCH,
    )
    .scrubbing(pieces);
    let (mut file, mut copy) = (file, copy);
    change(&mut file, &mut copy);
    Arc::new(Packed { file, copy, state })
}

#[test]
fn a_packed_copy_is_scrubbed_in_place_of_the_bytes_it_replaced() {
    bounded(|| {
        let file = sample(CHUNK_BYTES + 5000);
        let copy = sample(CHUNK_BYTES + 77);
        let root = *WeightState::from_leaves(
            &chunk_leaves(&file),
            file.len(),
            true,
            SystemTime::UNIX_EPOCH,
        )
        .chunk_root();
        // The hole's bytes are freed (zero) and no longer checked: passes
        // complete, over the rest of the file and the whole copy.
        let intact = packed(file.clone(), 1000..CHUNK_BYTES, copy.clone(), |f, _| {
            f[1000..CHUNK_BYTES].fill(0)
        });
        assert_eq!(
            intact.state.chunk_root(),
            &root,
            "the file's digest is kept"
        );
        let listed = intact.clone();
        let scrub = Scrubber::start(
            FAST,
            move || vec![listed.clone()],
            |_: &Packed, why: &str| panic!("quarantined an intact model: {why}"),
        )
        .unwrap();
        assert!(eventually(|| intact.state.passes() >= 2));
        drop(scrub);
        let per_pass = (file.len() - (CHUNK_BYTES - 1000) + copy.len()) as u64;
        let listed: usize = intact.state.pieces().iter().map(|p| p.range.len()).sum();
        assert_eq!(listed as u64, per_pass);
        assert!(intact.state.scrubbed_bytes() >= 2 * per_pass);
        assert_eq!(intact.state.status(), WeightStatus::Serving);

        // One bit of the copy's last piece changes: named as the copy's.
        let changed = packed(file, 1000..CHUNK_BYTES, copy, |_, c| {
            c[CHUNK_BYTES + 3] ^= 4
        });
        let (tx, rx) = channel();
        let listed = changed.clone();
        let _scrub = Scrubber::start(
            FAST,
            move || vec![listed.clone()],
            move |_: &Packed, why: &str| {
                tx.send(why.to_string()).unwrap();
            },
        )
        .unwrap();
        let why = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        let want = format!(
            "chunk 3 (bytes {CHUNK_BYTES}..{} of packed matrix 1)",
            CHUNK_BYTES + 77
        );
        assert!(why.contains(&want), "{why}");
        assert_eq!(changed.state.status(), WeightStatus::Quarantined(why));
    });
}

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
