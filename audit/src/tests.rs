//! The log on disk: creation, appends from many threads, reopening, torn
//! tails cut, damage and rollbacks refused, checkpoints that only grow
//! consistently, and `verify_log` naming the first bad entry after
//! tampering.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::frame::{HEADER_BYTES, MAGIC, TRAILER_BYTES};
use super::merkle::{leaf_hash, verify_consistency, verify_inclusion};
use super::note::open_checkpoint;
use super::verify::{VerifyError, VerifyOptions, verify_log};
use super::*;

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "bulkhead-audit-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        Scratch(path)
    }

    fn log(&self) -> PathBuf {
        self.0.join("log")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn open(dir: &Path) -> (AuditLog, OpenReport) {
    AuditLog::open(&AuditSettings::new(dir)).unwrap()
}

fn upload(n: u64) -> Event {
    Event::PluginUpload {
        tenant: "acme".into(),
        name: format!("plugin-{n}"),
        digest: entry::sha256_text(&[n as u8; 32]),
        size_bytes: n,
    }
}

fn tenant() -> Actor {
    Actor::Tenant {
        tenant: "acme".into(),
        sub: Some("ci".into()),
    }
}

/// Record offsets of the entries in `DIR/entries.log`.
fn offsets(bytes: &[u8]) -> Vec<usize> {
    let mut at = MAGIC.len();
    let mut out = Vec::new();
    while at < bytes.len() {
        out.push(at);
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += HEADER_BYTES + len + TRAILER_BYTES;
    }
    out
}

#[test]
fn a_new_log_has_its_key_entry_a_checkpoint_and_private_files() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let (log, report) = open(&dir);
    assert!(report.key_created);
    assert_eq!(report.stored_checkpoint, None);
    assert_eq!(log.size(), 1);
    let first = Entry::from_bytes(&log.entries(0, 1).unwrap()[0]).unwrap();
    assert_eq!(first.actor, Actor::Gateway);
    assert!(matches!(first.event, Event::KeyChange { ref key, .. } if key == "audit"));

    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for file in [
        ENTRIES_FILE,
        CHECKPOINT_FILE,
        KEY_FILE,
        PUBLIC_KEY_FILE,
        VKEY_FILE,
    ] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }
    let vkey = fs::read_to_string(dir.join(VKEY_FILE)).unwrap();
    let verifier = NoteVerifier::from_vkey(&vkey).unwrap();
    assert_eq!(&verifier, log.verifier());
    let stored = fs::read_to_string(dir.join(CHECKPOINT_FILE)).unwrap();
    let checkpoint = open_checkpoint(&stored, &verifier).unwrap();
    assert_eq!(checkpoint.size, 1);
    assert_eq!(checkpoint.origin, DEFAULT_ORIGIN);
    let pem = dir.join(PUBLIC_KEY_FILE);
    assert_eq!(read_verifier(&pem, DEFAULT_ORIGIN).unwrap(), verifier);
}

#[test]
fn temp_files_left_by_a_killed_writer_are_cleared_at_open() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    drop(open(&dir));
    // What a writer killed inside `write_atomic` leaves; the next start may
    // have the same PID (a container's gateway is always PID 1).
    let stale = [
        format!(
            "{}{}-0-{PUBLIC_KEY_FILE}",
            bulkhead_durable::TEMP_PREFIX,
            std::process::id()
        ),
        format!(
            "{}{}-1-{CHECKPOINT_FILE}",
            bulkhead_durable::TEMP_PREFIX,
            std::process::id()
        ),
    ];
    for name in &stale {
        fs::write(dir.join(name), b"half").unwrap();
    }
    let (log, _) = open(&dir);
    assert_eq!(log.size(), 1);
    for name in &stale {
        assert!(!dir.join(name).exists(), "{name} was left");
    }
}

#[test]
fn concurrent_appends_get_consecutive_indexes_and_survive_a_reopen() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let (log, _) = open(&dir);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..40)
                    .map(|i| log.append(tenant(), upload(t * 100 + i)).unwrap())
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut indexes: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    indexes.sort_unstable();
    assert_eq!(indexes, (1..=320).collect::<Vec<u64>>());
    assert_eq!(log.size(), 321);
    let entries = log.entries(0, 321).unwrap();
    for (i, bytes) in (0..).zip(&entries) {
        assert_eq!(Entry::from_bytes(bytes).unwrap().index, i);
        assert_eq!(log.leaf(i), Some(leaf_hash(bytes)));
    }
    let note = log.checkpoint().unwrap();
    drop(log);

    let (log, report) = open(&dir);
    assert_eq!(report.entries, 321);
    assert_eq!(report.stored_checkpoint, Some(321));
    assert_eq!(report.torn_tail, None);
    assert!(!report.key_created);
    assert_eq!(
        log.checkpoint().unwrap(),
        note,
        "nothing new: the same checkpoint"
    );
    assert_eq!(log.entries(0, 321).unwrap(), entries);
    let verified = verify_log(&dir, &VerifyOptions::default()).unwrap();
    assert_eq!(verified.entries, 321);
}

#[test]
fn checkpoints_only_grow_consistently_and_proofs_check_out() {
    let scratch = Scratch::new();
    let (log, _) = open(&scratch.log());
    let verifier = log.verifier().clone();
    let mut previous = open_checkpoint(&log.checkpoint().unwrap(), &verifier).unwrap();
    for round in 0..5 {
        for i in 0..(round * 7 + 1) {
            log.append(Actor::Gateway, upload(i)).unwrap();
        }
        let next = open_checkpoint(&log.checkpoint().unwrap(), &verifier).unwrap();
        assert!(next.size > previous.size);
        let proof = log.consistency_proof(previous.size, next.size).unwrap();
        verify_consistency(previous.size, next.size, &previous.root, &next.root, &proof).unwrap();
        for index in [0, next.size / 2, next.size - 1] {
            let leaf = leaf_hash(&log.entries(index, index + 1).unwrap()[0]);
            let proof = log.inclusion_proof(index, next.size).unwrap();
            verify_inclusion(&leaf, index, next.size, &proof, &next.root).unwrap();
        }
        previous = next;
    }
}

#[test]
fn a_torn_tail_is_cut_at_open_with_what_was_wrong() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let (log, _) = open(&dir);
    for i in 0..5 {
        log.append(tenant(), upload(i)).unwrap();
    }
    drop(log);
    let path = dir.join(ENTRIES_FILE);
    let intact = fs::read(&path).unwrap();
    // Half of a sixth record, as a crash mid-append leaves it.
    let mut record = Vec::new();
    let entry = br#"{"index":6}"#;
    frame::encode(entry, &leaf_hash(entry), &mut record);
    let mut torn = intact.clone();
    torn.extend_from_slice(&record[..record.len() / 2]);
    fs::write(&path, &torn).unwrap();

    let (log, report) = open(&dir);
    let (bytes, why) = report.torn_tail.expect("the tail is reported");
    assert_eq!(bytes as usize, record.len() / 2);
    assert!(why.contains("needs"), "{why}");
    assert_eq!(log.size(), 6);
    assert_eq!(
        fs::read(&path).unwrap(),
        intact,
        "cut back to the intact records"
    );
    // The log goes on from there.
    assert_eq!(log.append(tenant(), upload(9)).unwrap(), 6);
    drop(log);
    verify_log(&dir, &VerifyOptions::default()).unwrap();
}

#[test]
fn damage_in_the_middle_is_refused_and_left_alone() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let (log, _) = open(&dir);
    for i in 0..5 {
        log.append(tenant(), upload(i)).unwrap();
    }
    drop(log);
    let path = dir.join(ENTRIES_FILE);
    let mut bytes = fs::read(&path).unwrap();
    let at = offsets(&bytes)[2] + HEADER_BYTES + 10;
    bytes[at] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let error = AuditLog::open(&AuditSettings::new(&dir)).unwrap_err();
    assert!(
        matches!(
            error,
            AuditError::Frame {
                source: frame::FrameError::Corrupt { index: 2, .. },
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing was cut");
}

#[test]
fn a_rolled_back_or_rewritten_log_is_refused() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let (log, _) = open(&dir);
    for i in 0..5 {
        log.append(tenant(), upload(i)).unwrap();
    }
    log.checkpoint().unwrap();
    drop(log);
    let path = dir.join(ENTRIES_FILE);
    let bytes = fs::read(&path).unwrap();
    let cut = offsets(&bytes)[4];

    // Whole records removed from the end: framing is fine, the checkpoint
    // says entries are missing.
    fs::write(&path, &bytes[..cut]).unwrap();
    let error = AuditLog::open(&AuditSettings::new(&dir)).unwrap_err();
    assert!(
        matches!(
            error,
            AuditError::RolledBack {
                checkpoint_size: 6,
                log_size: 4,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("refusing to start"));

    // The last entry replaced by another, with a valid record checksum.
    let mut rewritten = bytes[..cut].to_vec();
    let forged = Entry {
        index: 5,
        time: time::Timestamp(0),
        actor: Actor::Gateway,
        event: upload(77),
    }
    .to_bytes();
    frame::encode(&forged, &leaf_hash(&forged), &mut rewritten);
    let forged_4 = Entry {
        index: 4,
        time: time::Timestamp(0),
        actor: Actor::Gateway,
        event: upload(76),
    }
    .to_bytes();
    let mut replaced = bytes[..cut].to_vec();
    frame::encode(&forged_4, &leaf_hash(&forged_4), &mut replaced);
    replaced.extend_from_slice(&rewritten[cut..]);
    fs::write(&path, &replaced).unwrap();
    let error = AuditLog::open(&AuditSettings::new(&dir)).unwrap_err();
    assert!(
        matches!(error, AuditError::Diverged { size: 6, .. }),
        "{error}"
    );
    match verify_log(&dir, &VerifyOptions::default()) {
        Err(VerifyError::Log(why)) => assert!(why.contains("root"), "{why}"),
        other => panic!("{other:?}"),
    }

    // No checkpoint at all next to entries: refused too.
    fs::write(&path, &bytes).unwrap();
    fs::remove_file(dir.join(CHECKPOINT_FILE)).unwrap();
    let error = AuditLog::open(&AuditSettings::new(&dir)).unwrap_err();
    assert!(matches!(error, AuditError::Checkpoint { .. }), "{error}");
}

#[test]
fn a_second_opener_is_refused_and_bad_settings_are_named() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let (_log, _) = open(&dir);
    assert!(matches!(
        AuditLog::open(&AuditSettings::new(&dir)),
        Err(AuditError::InUse { .. })
    ));
    let mut settings = AuditSettings::new(scratch.0.join("other"));
    settings.origin = "has space".into();
    assert!(matches!(
        AuditLog::open(&settings),
        Err(AuditError::Config(_))
    ));
    settings.origin = DEFAULT_ORIGIN.into();
    settings.key = Some(scratch.0.join("missing.pem"));
    let error = AuditLog::open(&settings).unwrap_err();
    assert!(error.to_string().contains("does not exist"), "{error}");
}

#[test]
fn an_oversized_entry_is_refused_and_the_log_goes_on() {
    let scratch = Scratch::new();
    let (log, _) = open(&scratch.log());
    let huge = Event::AdminAction {
        route: "POST /admin/v1/models".into(),
        target: "a".repeat(frame::MAX_ENTRY_BYTES),
        outcome: Outcome::Accepted,
    };
    assert!(matches!(
        log.append(Actor::Gateway, huge),
        Err(AuditError::EntryTooLarge { .. })
    ));
    assert_eq!(log.append(Actor::Gateway, upload(1)).unwrap(), 1);
}

/// A closed log of the key entry and `n` uploads; its file's bytes.
fn closed_log(dir: &Path, n: u64) -> Vec<u8> {
    let (log, _) = open(dir);
    for i in 0..n {
        log.append(tenant(), upload(i)).unwrap();
    }
    log.checkpoint().unwrap();
    drop(log);
    fs::read(dir.join(ENTRIES_FILE)).unwrap()
}

fn first_bad_entry(dir: &Path) -> u64 {
    match verify_log(dir, &VerifyOptions::default()) {
        Err(VerifyError::Entry { index, why }) => {
            assert!(!why.is_empty());
            index
        }
        other => panic!("expected an entry to be named, got {other:?}"),
    }
}

#[test]
fn tampering_is_caught_and_the_first_bad_entry_named() {
    let scratch = Scratch::new();
    let dir = scratch.log();
    let bytes = closed_log(&dir, 9);
    let path = dir.join(ENTRIES_FILE);
    let at = offsets(&bytes);
    verify_log(&dir, &VerifyOptions::default()).unwrap();

    // A flipped byte in entry 3's JSON.
    let mut flipped = bytes.clone();
    flipped[at[3] + HEADER_BYTES + 5] ^= 0x20;
    fs::write(&path, &flipped).unwrap();
    assert_eq!(first_bad_entry(&dir), 3);

    // Entry 4 deleted: entry 5 now sits in position 4.
    let mut deleted = bytes[..at[4]].to_vec();
    deleted.extend_from_slice(&bytes[at[5]..]);
    fs::write(&path, &deleted).unwrap();
    assert_eq!(first_bad_entry(&dir), 4);

    // Entries 6 and 7 swapped.
    let mut reordered = bytes[..at[6]].to_vec();
    reordered.extend_from_slice(&bytes[at[7]..at[8]]);
    reordered.extend_from_slice(&bytes[at[6]..at[7]]);
    reordered.extend_from_slice(&bytes[at[8]..]);
    fs::write(&path, &reordered).unwrap();
    assert_eq!(first_bad_entry(&dir), 6);

    // The last entry removed: the checkpoint covers it.
    fs::write(&path, &bytes[..at[9]]).unwrap();
    assert_eq!(first_bad_entry(&dir), 9);

    // Intact again, but checked against another key.
    fs::write(&path, &bytes).unwrap();
    let other = Scratch::new();
    let (other_log, _) = open(&other.log());
    drop(other_log);
    let options = VerifyOptions {
        checkpoint: None,
        key: Some(other.log().join(PUBLIC_KEY_FILE)),
    };
    match verify_log(&dir, &options) {
        Err(VerifyError::Log(why)) => assert!(why.contains("does not verify"), "{why}"),
        other => panic!("{other:?}"),
    }
    verify_log(&dir, &VerifyOptions::default()).unwrap();
}
