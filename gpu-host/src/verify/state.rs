//! What is known about one resident model's weights, shared by the request
//! path (is it serving?), the scrub (progress, mismatch) and `ListModels`.

use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bulkhead_protocol::digest::{CHUNK_BYTES, Hash, merkle_root};

use super::ResidentFile;

/// Serving, or out of service for good (until the model is loaded again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightStatus {
    Serving,
    /// The weights no longer match what was verified; the reason names the
    /// chunk and the file.
    Quarantined(String),
}

/// A run of resident bytes the scrub re-hashes, and its leaf hash when
/// it was verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which of the model's regions holds it ([`super::Scrubbable::region`]):
    /// 0 is the file's resident copy.
    pub region: usize,
    /// Its bytes within that region.
    pub range: Range<usize>,
    pub leaf: Hash,
}

impl Piece {
    /// `len` bytes of `region` cut into `CHUNK_BYTES` pieces from `at`,
    /// with their leaves in order.
    pub fn chunks(region: usize, at: usize, len: usize, leaves: &[Hash]) -> Vec<Piece> {
        debug_assert_eq!(leaves.len(), len.div_ceil(CHUNK_BYTES));
        leaves
            .iter()
            .enumerate()
            .map(|(i, leaf)| {
                let start = at + i * CHUNK_BYTES;
                Piece {
                    region,
                    range: start..(start + CHUNK_BYTES).min(at + len),
                    leaf: *leaf,
                }
            })
            .collect()
    }
}

/// The verification state of one resident file. The request path reads it
/// with one atomic load; nothing here takes a lock.
#[derive(Debug)]
pub struct WeightState {
    /// What the scrub re-hashes: the file's chunks as verified, or, once
    /// some matrices are served from packed copies, the file's other bytes
    /// and those copies, hashed when they were made.
    pieces: Vec<Piece>,
    chunk_root: Hash,
    registered: bool,
    quarantine: OnceLock<String>,
    verified_at_ms: AtomicU64,
    scrubbed_bytes: AtomicU64,
    floor_bytes: AtomicU64,
    passes: AtomicU64,
    retired: AtomicBool,
}

impl WeightState {
    /// The state of a file just loaded (verified now): the scrub re-hashes
    /// its chunks.
    pub fn new(resident: &ResidentFile) -> WeightState {
        WeightState::from_leaves(
            &resident.leaves,
            resident.map.len(),
            resident.registered,
            resident.verified_at,
        )
    }

    /// The state of `len` bytes whose chunks hashed to `leaves` at
    /// `verified_at`.
    pub fn from_leaves(
        leaves: &[Hash],
        len: usize,
        registered: bool,
        verified_at: SystemTime,
    ) -> WeightState {
        WeightState {
            pieces: Piece::chunks(0, 0, len, leaves),
            chunk_root: merkle_root(leaves),
            registered,
            quarantine: OnceLock::new(),
            verified_at_ms: AtomicU64::new(unix_ms(verified_at)),
            scrubbed_bytes: AtomicU64::new(0),
            floor_bytes: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            retired: AtomicBool::new(false),
        }
    }

    /// This state with the scrub re-hashing `pieces` instead (the file
    /// verified as before: [`Self::chunk_root`] is unchanged).
    pub fn scrubbing(self, pieces: Vec<Piece>) -> WeightState {
        WeightState { pieces, ..self }
    }

    /// What the scrub re-hashes.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The Merkle root over the file's chunks, as verified at load.
    pub fn chunk_root(&self) -> &Hash {
        &self.chunk_root
    }

    /// Whether the bytes were checked against a registration at load.
    pub fn registered(&self) -> bool {
        self.registered
    }

    pub fn status(&self) -> WeightStatus {
        match self.quarantine.get() {
            None => WeightStatus::Serving,
            Some(reason) => WeightStatus::Quarantined(reason.clone()),
        }
    }

    /// The reason the model is out of service, if it is.
    pub fn unavailable_reason(&self) -> Option<&str> {
        self.quarantine.get().map(String::as_str)
    }

    /// Takes the model out of service; the first reason sticks. True when
    /// this call took it out (false: it already was).
    pub fn quarantine(&self, reason: String) -> bool {
        self.quarantine.set(reason).is_ok()
    }

    /// Marks the model unloaded: the scrub stops checking it so its memory
    /// is released as soon as the last request using it ends.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    pub(super) fn retired(&self) -> bool {
        self.retired.load(Ordering::Relaxed)
    }

    /// Milliseconds since the Unix epoch when every byte last matched.
    pub fn verified_at_ms(&self) -> u64 {
        self.verified_at_ms.load(Ordering::Relaxed)
    }

    pub(super) fn pass_completed(&self, at: SystemTime) {
        self.verified_at_ms.store(unix_ms(at), Ordering::Relaxed);
        self.passes.fetch_add(1, Ordering::Relaxed);
    }

    /// `bytes` matched; `at_floor`: hashed at normal priority to keep the
    /// floor, not on idle time.
    pub(super) fn scrubbed(&self, bytes: u64, at_floor: bool) {
        self.scrubbed_bytes.fetch_add(bytes, Ordering::Relaxed);
        if at_floor {
            self.floor_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Bytes re-hashed by the scrub since load.
    pub fn scrubbed_bytes(&self) -> u64 {
        self.scrubbed_bytes.load(Ordering::Relaxed)
    }

    /// Of [`Self::scrubbed_bytes`], those the floor hashed at normal
    /// priority because idle time was scarce.
    pub fn floor_bytes(&self) -> u64 {
        self.floor_bytes.load(Ordering::Relaxed)
    }

    /// Complete scrub passes since load.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
