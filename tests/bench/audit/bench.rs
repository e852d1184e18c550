//! Audit log figures (a measurement, not a check; run with
//! `tests/bench/audit/run`):
//!
//! 1. append throughput with fsync: one appender, then 8 and 32 concurrent
//!    appenders sharing fsyncs (group commit); entries/s and the median and
//!    p99 time an append waits for its acknowledgement;
//! 2. a log of 1,000,000 entries: how long opening it takes (scan, hash,
//!    rebuild the tree), then inclusion and consistency proof times
//!    (generation as the API does it, and verification), median and p99
//!    over random indexes and sizes.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkhead_gateway::audit::frame;
use bulkhead_gateway::audit::merkle::{leaf_hash, verify_consistency, verify_inclusion};
use bulkhead_gateway::audit::time::Timestamp;
use bulkhead_gateway::audit::{Actor, AuditLog, AuditSettings, ENTRIES_FILE, Entry, Event};

const BIG_LOG: u64 = 1_000_000;
const PROOF_SAMPLES: usize = 20_000;

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let path = std::env::temp_dir().join(format!(
        "bulkhead-audit-bench-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&path);
    Scratch(path)
}

/// A typical entry: a plugin upload.
fn upload(n: u64) -> Event {
    Event::PluginUpload {
        tenant: "acme".into(),
        name: format!("plugin-{}", n % 64),
        digest: bulkhead_gateway::audit::sha256_text(&[(n % 251) as u8; 32]),
        size_bytes: 100_000 + n,
    }
}

fn actor() -> Actor {
    Actor::Tenant {
        tenant: "acme".into(),
        sub: Some("ci-bot".into()),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    println!(
        "{what:<44} median {:>9.1?}  p99 {:>9.1?}  ({} samples)",
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples.len()
    );
}

/// Load average, for the record.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

#[test]
#[ignore = "a measurement, not a check: run tests/bench/audit/run"]
fn append_throughput_with_fsync() {
    println!("load average at start: {}", load());
    for (threads, total) in [(1usize, 1_000u64), (8, 4_000), (32, 8_000)] {
        let dir = scratch(&format!("append-{threads}"));
        let (log, _) = AuditLog::open(&AuditSettings::new(&dir.0)).unwrap();
        let started = Instant::now();
        let per_thread = total / threads as u64;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let log = log.clone();
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|i| {
                            let at = Instant::now();
                            log.append(actor(), upload(t as u64 * per_thread + i))
                                .unwrap();
                            at.elapsed()
                        })
                        .collect::<Vec<Duration>>()
                })
            })
            .collect();
        let waits: Vec<Duration> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        let elapsed = started.elapsed();
        println!(
            "append, {threads:>2} appender(s): {:>8.0} entries/s ({} entries in {elapsed:.2?})",
            waits.len() as f64 / elapsed.as_secs_f64(),
            waits.len()
        );
        report(
            &format!("  time to acknowledgement, {threads} appender(s)"),
            waits,
        );
    }
    println!("load average at end: {}", load());
}

/// Writes `n` more entries straight into a closed log's file (framing as
/// the log writes it, no fsync per entry): a big log in seconds.
fn grow(dir: &Path, from: u64, n: u64) {
    let file = OpenOptions::new()
        .append(true)
        .open(dir.join(ENTRIES_FILE))
        .unwrap();
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut record = Vec::new();
    for index in from..from + n {
        let bytes = Entry {
            index,
            time: Timestamp(1_700_000_000_000 + index),
            actor: actor(),
            event: upload(index),
        }
        .to_bytes();
        record.clear();
        frame::encode(&bytes, &leaf_hash(&bytes), &mut record);
        out.write_all(&record).unwrap();
    }
    out.into_inner().unwrap().sync_all().unwrap();
}

#[test]
#[ignore = "a measurement, not a check: run tests/bench/audit/run"]
fn proofs_at_one_million_entries() {
    println!("load average at start: {}", load());
    let dir = scratch("million");
    let settings = AuditSettings::new(&dir.0);
    let (log, _) = AuditLog::open(&settings).unwrap();
    let first = log.size();
    drop(log);
    let started = Instant::now();
    grow(&dir.0, first, BIG_LOG - first);
    println!("wrote {BIG_LOG} entries in {:.2?}", started.elapsed());
    let bytes = std::fs::metadata(dir.0.join(ENTRIES_FILE)).unwrap().len();

    let started = Instant::now();
    let (log, report_) = AuditLog::open(&settings).unwrap();
    println!(
        "open (scan {} MB, hash, rebuild the tree) of {} entries: {:.2?}",
        bytes >> 20,
        report_.entries,
        started.elapsed()
    );
    let log = Arc::new(log);
    let size = log.size();
    assert_eq!(size, BIG_LOG);
    let root = log.root(size).unwrap();

    // xorshift: fixed seed, so runs sample the same positions.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };

    let leaves: Vec<(u64, [u8; 32])> = (0..PROOF_SAMPLES)
        .map(|_| {
            let index = next(size);
            (index, log.leaf(index).unwrap())
        })
        .collect();
    let mut generate = Vec::with_capacity(PROOF_SAMPLES);
    let mut check = Vec::with_capacity(PROOF_SAMPLES);
    for (index, leaf) in &leaves {
        let at = Instant::now();
        let proof = log.inclusion_proof(*index, size).unwrap();
        generate.push(at.elapsed());
        let at = Instant::now();
        verify_inclusion(leaf, *index, size, &proof, &root).unwrap();
        check.push(at.elapsed());
    }
    report("inclusion proof, generate (size 1,000,000)", generate);
    report("inclusion proof, verify", check);

    // Older sizes too: a proof against an earlier checkpoint.
    let mut generate = Vec::with_capacity(PROOF_SAMPLES);
    for _ in 0..PROOF_SAMPLES {
        let at_size = 1 + next(size);
        let index = next(at_size);
        let at = Instant::now();
        log.inclusion_proof(index, at_size).unwrap();
        generate.push(at.elapsed());
    }
    report("inclusion proof, generate (random size)", generate);

    let mut generate = Vec::with_capacity(PROOF_SAMPLES);
    let mut check = Vec::with_capacity(PROOF_SAMPLES);
    let samples: Vec<(u64, [u8; 32])> = (0..PROOF_SAMPLES / 10)
        .map(|_| {
            let from = 1 + next(size - 1);
            (from, log.root(from).unwrap())
        })
        .collect();
    for _ in 0..10 {
        for (from, old_root) in &samples {
            let at = Instant::now();
            let proof = log.consistency_proof(*from, size).unwrap();
            generate.push(at.elapsed());
            let at = Instant::now();
            verify_consistency(*from, size, old_root, &root, &proof).unwrap();
            check.push(at.elapsed());
        }
    }
    report("consistency proof, generate (m → 1,000,000)", generate);
    report("consistency proof, verify", check);

    // Open signed the current size already: grow by one for a new one.
    log.append(actor(), upload(0)).unwrap();
    let at = Instant::now();
    let note = log.checkpoint().unwrap();
    println!(
        "new checkpoint at 1,000,001 (check, tree head, sign, fsync'd store): {:.2?}",
        at.elapsed()
    );
    assert!(note.contains("\n1000001\n"));
    println!("load average at end: {}", load());
}
