//! Fuzzes what `bulkhead audit verify` and `audit proof` read from files or
//! a gateway they do not trust: the log file's framing (`frame::scan`), the
//! entries inside (`Entry::from_bytes`), checkpoint notes and vkeys.
//!
//! The first byte picks the input kind:
//! - 0: a log file (the rest, after the magic line this target prepends
//!   when the input lacks it half the time) — scanning never panics, the
//!   intact records it reports lie inside the file with correct leaf
//!   hashes, and a torn tail accounts for exactly the bytes after them;
//! - anything else: a checkpoint note and a vkey (split at the first 0xFF)
//!   — parsing never panics, and a note never opens with a fixed key that
//!   did not sign it.
#![no_main]

use std::io::Cursor;
use std::sync::OnceLock;

use bulkhead_gateway::audit::frame::{self, FrameError, MAGIC};
use bulkhead_gateway::audit::merkle::leaf_hash;
use bulkhead_gateway::audit::note::{open_checkpoint, unverified_checkpoint};
use bulkhead_gateway::audit::{Entry, NoteVerifier};
use libfuzzer_sys::fuzz_target;

fn verifier() -> &'static NoteVerifier {
    static KEY: OnceLock<NoteVerifier> = OnceLock::new();
    KEY.get_or_init(|| {
        let key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]).verifying_key();
        NoteVerifier::new("bulkhead.local/audit", key).expect("a valid name")
    })
}

fn log_file(data: &[u8]) {
    let mut file = Vec::with_capacity(MAGIC.len() + data.len());
    // Most inputs should get past the magic line to reach the records.
    if data.first().is_some_and(|b| b & 1 == 0) {
        file.extend_from_slice(MAGIC);
    }
    file.extend_from_slice(data);
    let len = file.len() as u64;
    let mut intact_end = MAGIC.len() as u64;
    let scanned = frame::scan::<FrameError>(&mut Cursor::new(&file), len, |record| {
        assert_eq!(
            record.leaf,
            leaf_hash(record.entry),
            "a record whose checksum is wrong"
        );
        assert_eq!(record.offset, intact_end, "records are contiguous");
        intact_end = record.offset
            + (frame::HEADER_BYTES + record.entry.len() + frame::TRAILER_BYTES) as u64;
        let _ = Entry::from_bytes(record.entry);
        Ok(())
    });
    if let Ok(scanned) = scanned {
        assert!(scanned.end <= len);
        match scanned.torn {
            Some(torn) => assert_eq!(scanned.end + torn.bytes, len, "{}", torn.why),
            None => assert_eq!(scanned.end, len),
        }
    }
}

fn note_and_key(data: &[u8]) {
    let split = data.iter().position(|&b| b == 0xFF).unwrap_or(data.len());
    let note = String::from_utf8_lossy(&data[..split]);
    let vkey = String::from_utf8_lossy(data.get(split + 1..).unwrap_or_default());
    let _ = unverified_checkpoint(&note);
    let _ = NoteVerifier::from_vkey(&vkey);
    assert!(
        open_checkpoint(&note, verifier()).is_err(),
        "a note opened with a key that never signed anything"
    );
}

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((0, rest)) => log_file(rest),
        Some((_, rest)) => note_and_key(rest),
        None => {}
    }
});
