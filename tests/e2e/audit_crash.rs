//! The audit log under `kill -9`: a writer process appends entries from
//! several threads (group commit) and prints each index as soon as its
//! append returns; each trial SIGKILLs it at a random point (after a random
//! number of acknowledgements, or after a random delay), then checks that
//! every acknowledged entry is present and intact, that a torn tail is cut
//! (and reported) when the log is opened again, and that `verify_log`
//! passes — and, once per log folder, that `bulkhead audit verify` does.
//!
//! Seeded: set `BULKHEAD_CRASH_SEED` to replay a run (the seed is printed).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bulkhead_gateway::audit::verify::{VerifyError, VerifyOptions, verify_log};
use bulkhead_gateway::audit::{AuditLog, AuditSettings, CHECKPOINT_FILE, Entry, Event};

const TRIALS: u64 = 200;
/// Trials that share one log folder (reopening a log with history) before a
/// fresh one: bounds the file every open scans.
const TRIALS_PER_FOLDER: u64 = 25;
const THREADS: &str = "3";

/// Held while this process holds a log folder's lock, and by the other
/// test around each process start. A child being started holds a copy of
/// every descriptor, the lock's included, until it execs; on a loaded
/// machine that can outlast a reopen here, and the next writer would then
/// find its folder locked and exit.
static LOCK_OR_SPAWN: Mutex<()> = Mutex::new(());

fn lock_or_spawn() -> std::sync::MutexGuard<'static, ()> {
    LOCK_OR_SPAWN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// xorshift64*: enough randomness for kill points, reproducible by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Lines the writer printed, shared with the thread that reads them.
#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
}

impl Lines {
    /// Waits until `n` acknowledgements were printed (or `limit` passed).
    fn wait_for_acks(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut lines = self.lines.lock().unwrap();
        while lines.iter().filter(|l| l.starts_with("ack ")).count() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            lines = self.changed.wait_timeout(lines, left).unwrap().0;
        }
    }
}

#[derive(Debug, Default)]
struct Tally {
    acknowledged: usize,
    torn_tails_cut: usize,
    torn_bytes: u64,
    killed_before_open: usize,
}

#[test]
fn every_acknowledged_entry_survives_sigkill_and_torn_tails_are_cut() {
    let seed = std::env::var("BULKHEAD_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("audit crash test: seed {seed} (BULKHEAD_CRASH_SEED={seed} replays it)");
    let mut rng = Rng(seed);
    let root = std::env::temp_dir().join(format!("bulkhead-audit-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut dir = PathBuf::new();
    for trial in 0..TRIALS {
        if trial % TRIALS_PER_FOLDER == 0 {
            if trial > 0 {
                verify_with_cli(&dir);
            }
            dir = root.join(format!("log-{}", trial / TRIALS_PER_FOLDER));
        }
        run_trial(&dir, &mut rng, &mut tally)
            .unwrap_or_else(|e| panic!("trial {trial} (seed {seed}): {e}"));
    }
    verify_with_cli(&dir);
    assert!(
        tally.torn_tails_cut > 0,
        "no kill tore a record in {TRIALS} trials: the torn-tail path went untested ({tally:?})"
    );
    eprintln!(
        "{TRIALS} trials in {:.1?}: {} acknowledged entries all present; {} torn tails cut \
         ({} bytes); {} kills before the writer had opened the log",
        started.elapsed(),
        tally.acknowledged,
        tally.torn_tails_cut,
        tally.torn_bytes,
        tally.killed_before_open
    );
    let _ = std::fs::remove_dir_all(&root);
}

fn run_trial(dir: &Path, rng: &mut Rng, tally: &mut Tally) -> Result<(), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_audit-crash-writer"))
        .arg(dir)
        .arg(THREADS)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the writer: {e}"))?;
    let lines = Arc::new(Lines::default());
    let reader = {
        let lines = Arc::clone(&lines);
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines.lines.lock().unwrap().push(line);
                lines.changed.notify_all();
            }
        })
    };
    // The kill point: after a random number of acknowledgements, or after a
    // random delay (which may fall before, during or after the open).
    if rng.below(2) == 0 {
        let acks = rng.below(25) as usize;
        lines.wait_for_acks(acks, Duration::from_secs(10));
    } else {
        std::thread::sleep(Duration::from_micros(rng.below(40_000)));
    }
    child
        .kill()
        .map_err(|e| format!("killing the writer: {e}"))?;
    let status = child.wait().map_err(|e| e.to_string())?;
    reader.join().unwrap();
    if status.code().is_some() {
        return Err(format!(
            "the writer exited by itself ({status}) instead of being killed"
        ));
    }

    let lines = lines.lines.lock().unwrap().clone();
    if !lines.iter().any(|l| l.starts_with("open ")) {
        tally.killed_before_open += 1;
    }
    let acked: Vec<(u64, String)> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("ack "))
        .map(|rest| {
            let (index, tag) = rest.split_once(' ').expect("ack INDEX TAG");
            (index.parse().expect("an index"), tag.to_string())
        })
        .collect();
    tally.acknowledged += acked.len();

    // The offline check sees the log as the kill left it (once the folder
    // has a checkpoint): it must fail on a torn tail, naming the entry the
    // torn record would have been, and pass otherwise.
    let before = dir
        .join(CHECKPOINT_FILE)
        .exists()
        .then(|| verify_log(dir, &VerifyOptions::default()));

    // Reopen as the gateway would: a torn tail is cut and reported.
    let held = lock_or_spawn();
    let (log, report) =
        AuditLog::open(&AuditSettings::new(dir)).map_err(|e| format!("reopening: {e}"))?;
    let size = log.size();
    match (&report.torn_tail, before) {
        (Some((bytes, _)), Some(Err(VerifyError::Entry { index, .. }))) if index == size => {
            tally.torn_tails_cut += 1;
            tally.torn_bytes += bytes;
        }
        (Some((bytes, _)), None) => {
            tally.torn_tails_cut += 1;
            tally.torn_bytes += bytes;
        }
        (None, Some(Ok(_)) | None) => {}
        (torn, before) => {
            return Err(format!(
                "open and verify disagree: open cut {torn:?}, verify said {before:?}"
            ));
        }
    }
    for (index, tag) in &acked {
        if *index >= size {
            return Err(format!(
                "acknowledged entry {index} is gone: the log has {size}"
            ));
        }
        let bytes = log
            .entries(*index, index + 1)
            .map_err(|e| format!("reading entry {index}: {e}"))?;
        let entry = Entry::from_bytes(&bytes[0]).map_err(|e| format!("entry {index}: {e}"))?;
        let Event::AdminAction { target, .. } = &entry.event else {
            return Err(format!("entry {index} is not the one acknowledged"));
        };
        if target != tag {
            return Err(format!(
                "entry {index} holds {target} but {tag} was acknowledged at that index"
            ));
        }
    }
    drop(log);
    drop(held);
    // The cut file passes the full offline check.
    verify_log(dir, &VerifyOptions::default()).map_err(|e| format!("verify: {e}"))?;
    Ok(())
}

/// `bulkhead audit verify DIR` exits 0 on the folder.
fn verify_with_cli(dir: &Path) {
    let out = Command::new(bulkhead_tests::bin("bulkhead"))
        .args(["audit", "verify"])
        .arg(dir)
        .output()
        .expect("bulkhead runs");
    assert!(
        out.status.success(),
        "bulkhead audit verify {} failed:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok: "));
}

/// Trials of the PostgreSQL log: fewer, each a process start and a reopen.
const PG_TRIALS: u64 = 100;

/// The same for a log in the state database that two replicas append to:
/// replica B appends throughout while each trial starts replica A and
/// SIGKILLs it at a random point, often inside its append transaction.
/// Afterwards every entry either acknowledged is there with its content,
/// the log reopens (checkpoints consistent), and `bulkhead audit verify
/// --state` passes.
#[test]
fn no_acknowledged_entry_is_lost_when_a_replica_writing_to_postgres_is_killed() {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("postgres audit crash test: seed {seed}");
    let mut rng = Rng(seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (settings, schema) = runtime.block_on(bulkhead_state::testing::TestSchema::new());
    let scratch = std::env::temp_dir().join(format!("bulkhead-audit-pg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    // A file log generates a key: the one both replicas sign with.
    drop(AuditLog::open(&AuditSettings::new(&scratch)).expect("a key"));
    let key = scratch.join(bulkhead_gateway::audit::KEY_FILE);
    let writer = |threads: &str| {
        let spawning = lock_or_spawn();
        let mut child = Command::new(env!("CARGO_BIN_EXE_audit-crash-writer"))
            .args(["--postgres", &settings.url, &settings.schema])
            .arg(&key)
            .arg(threads)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the writer starts");
        drop(spawning);
        let lines = Arc::new(Lines::default());
        let stdout = child.stdout.take().unwrap();
        let reader = {
            let lines = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    lines.lines.lock().unwrap().push(line);
                    lines.changed.notify_all();
                }
            })
        };
        (child, lines, reader)
    };
    let (mut replica_b, b_lines, b_reader) = writer("1");
    b_lines.wait_for_acks(1, Duration::from_secs(30));

    let started = Instant::now();
    let mut acked = Vec::new();
    for trial in 0..PG_TRIALS {
        let (mut replica_a, lines, reader) = writer("2");
        if rng.below(2) == 0 {
            lines.wait_for_acks(rng.below(20) as usize, Duration::from_secs(10));
        } else {
            std::thread::sleep(Duration::from_micros(rng.below(60_000)));
        }
        replica_a.kill().unwrap();
        let status = replica_a.wait().unwrap();
        reader.join().unwrap();
        assert!(
            status.code().is_none(),
            "trial {trial}: replica A exited by itself ({status})"
        );
        acked.extend(acks(&lines));
        check_acked(&settings, &key, &acked)
            .unwrap_or_else(|e| panic!("trial {trial} (seed {seed}): {e}"));
    }
    replica_b.kill().unwrap();
    replica_b.wait().unwrap();
    b_reader.join().unwrap();
    let from_b = acks(&b_lines);
    assert!(!from_b.is_empty(), "replica B never appended");
    acked.extend(from_b);
    let size = check_acked(&settings, &key, &acked).unwrap_or_else(|e| panic!("at the end: {e}"));

    let public = scratch.join(bulkhead_gateway::audit::PUBLIC_KEY_FILE);
    let spawning = lock_or_spawn();
    let out = Command::new(bulkhead_tests::bin("bulkhead"))
        .args([
            "audit",
            "verify",
            "--state",
            &settings.url,
            "--schema",
            &settings.schema,
        ])
        .arg("--key")
        .arg(&public)
        .output()
        .expect("bulkhead runs");
    drop(spawning);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("ok: "),
        "bulkhead audit verify --state failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{PG_TRIALS} trials in {:.1?}: {} acknowledged entries (both replicas) all present in a \
         log of {size}",
        started.elapsed(),
        acked.len()
    );
    drop(schema);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// `ack INDEX TAG` lines.
fn acks(lines: &Lines) -> Vec<(u64, String)> {
    lines
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| l.strip_prefix("ack "))
        .map(|rest| {
            let (index, tag) = rest.split_once(' ').expect("ack INDEX TAG");
            (index.parse().expect("an index"), tag.to_string())
        })
        .collect()
}

/// Opens the PostgreSQL log as a gateway would and checks every
/// acknowledged entry is at its index with its tag; the log's size.
fn check_acked(
    settings: &bulkhead_state::PgSettings,
    key: &Path,
    acked: &[(u64, String)],
) -> Result<u64, String> {
    let store = bulkhead_state::PgAuditStore::open(settings).map_err(|e| e.to_string())?;
    let key = bulkhead_gateway::audit::read_signing_key(key).map_err(|e| e.to_string())?;
    let (log, _) = AuditLog::open_store(
        Box::new(store),
        key,
        bulkhead_gateway::audit::DEFAULT_ORIGIN,
    )
    .map_err(|e| format!("reopening: {e}"))?;
    let size = log.size();
    for (index, tag) in acked {
        if *index >= size {
            return Err(format!(
                "acknowledged entry {index} is gone: the log has {size}"
            ));
        }
        let bytes = log
            .entries(*index, index + 1)
            .map_err(|e| format!("reading entry {index}: {e}"))?;
        let entry = Entry::from_bytes(&bytes[0]).map_err(|e| format!("entry {index}: {e}"))?;
        match &entry.event {
            Event::AdminAction { target, .. } if target == tag => {}
            other => {
                return Err(format!(
                    "entry {index} holds {other:?} but {tag} was acknowledged at that index"
                ));
            }
        }
    }
    Ok(size)
}
