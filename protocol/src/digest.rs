//! Weight digests: what a model manifest records for each file and what the
//! gpu-host re-checks while the weights are resident.
//!
//! A file is cut into [`CHUNK_BYTES`] chunks (the last one may be shorter).
//! Each chunk's hash is an RFC 6962 leaf, `SHA-256(0x00 ‖ chunk)`, and the
//! file's *chunk root* is the RFC 6962 Merkle tree hash over those leaves
//! (`node = SHA-256(0x01 ‖ left ‖ right)`, split at the largest power of two
//! below the count). Chunks hash independently, so loading verifies on every
//! core at once, and a resident model can be re-checked one chunk at a time
//! against the leaves kept from load. The whole-file SHA-256 (what the
//! OpenSSF model-signing format records) is computed only when signing.

use sha2::{Digest as _, Sha256};

/// Bytes per chunk: 4 MiB. Big enough that hashing a chunk costs far more
/// than scheduling it, small enough that a file's chunks spread over every
/// core. (The background re-check hashes a chunk in shorter pieces.)
pub const CHUNK_BYTES: usize = 4 << 20;

/// A SHA-256 output.
pub type Hash = [u8; 32];

/// The RFC 6962 tree hash of no leaves: SHA-256 of the empty string.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// `SHA-256(0x00 ‖ data)`: the leaf hash of one chunk.
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut h = LeafHasher::new();
    h.update(data);
    h.finish()
}

/// A chunk's leaf hash fed piece by piece (the background scrub hashes a
/// chunk in short pieces so it never holds a core for long): the pieces'
/// leaf hash equals [`leaf_hash`] of the pieces joined.
#[derive(Clone, Debug)]
pub struct LeafHasher(Sha256);

impl LeafHasher {
    pub fn new() -> LeafHasher {
        let mut h = Sha256::new();
        h.update([0x00]);
        LeafHasher(h)
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finish(self) -> Hash {
        self.0.finalize().into()
    }
}

impl Default for LeafHasher {
    fn default() -> LeafHasher {
        LeafHasher::new()
    }
}

/// `SHA-256(0x01 ‖ left ‖ right)`: an interior node.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([0x01]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The RFC 6962 Merkle tree hash over `leaves` (already leaf-hashed).
pub fn merkle_root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            // Largest power of two strictly below n.
            let split = 1 << (usize::BITS - 1 - (n - 1).leading_zeros());
            node_hash(
                &merkle_root(&leaves[..split]),
                &merkle_root(&leaves[split..]),
            )
        }
    }
}

/// How many chunks a file of `len` bytes has (0 for an empty file).
pub fn chunk_count(len: u64) -> u64 {
    len.div_ceil(CHUNK_BYTES as u64)
}

/// The leaf hash of every chunk of `bytes`, in order, hashed on all cores.
pub fn chunk_leaves(bytes: &[u8]) -> Vec<Hash> {
    use rayon::prelude::*;
    bytes.par_chunks(CHUNK_BYTES).map(leaf_hash).collect()
}

/// The chunk root of `bytes`.
pub fn chunk_root(bytes: &[u8]) -> Hash {
    merkle_root(&chunk_leaves(bytes))
}

/// Everything a manifest records about one file's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileDigest {
    /// Length in bytes.
    pub size: u64,
    /// SHA-256 of the whole file.
    pub sha256: Hash,
    /// The Merkle root over its [`CHUNK_BYTES`] chunks.
    pub chunk_root: Hash,
}

impl FileDigest {
    /// Hashes `bytes` both ways at once (the whole-file hash is sequential,
    /// the chunks run on the other cores meanwhile).
    pub fn of(bytes: &[u8]) -> FileDigest {
        let (sha256, chunk_root) =
            rayon::join(|| Sha256::digest(bytes).into(), || chunk_root(bytes));
        FileDigest {
            size: bytes.len() as u64,
            sha256,
            chunk_root,
        }
    }
}

/// Lower-case hex of a hash, as manifests and logs print it.
pub fn to_hex(hash: &Hash) -> String {
    use std::fmt::Write as _;
    hash.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Parses 64 hex digits (either case).
pub fn from_hex(text: &str) -> Option<Hash> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(data: &[u8]) -> Hash {
        Sha256::digest(data).into()
    }

    #[test]
    fn tree_hash_follows_rfc6962_shape() {
        let l: Vec<Hash> = (0u8..5).map(|i| leaf_hash(&[i])).collect();
        // Five leaves split 4 | 1, the four split 2 | 2.
        let left = node_hash(&node_hash(&l[0], &l[1]), &node_hash(&l[2], &l[3]));
        assert_eq!(merkle_root(&l), node_hash(&left, &l[4]));
        assert_eq!(merkle_root(&l[..1]), l[0]);
        assert_eq!(merkle_root(&[]), sha(b""));
        // Three leaves split 2 | 1.
        assert_eq!(
            merkle_root(&l[..3]),
            node_hash(&node_hash(&l[0], &l[1]), &l[2])
        );
    }

    #[test]
    fn a_leaf_hashed_in_pieces_equals_the_whole_and_the_definition() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut joined = vec![0x00];
        joined.extend_from_slice(&data);
        assert_eq!(leaf_hash(&data), sha(&joined));
        for piece in [1, 64, 999, 4096, 10_000] {
            let mut h = LeafHasher::new();
            data.chunks(piece).for_each(|p| h.update(p));
            assert_eq!(h.finish(), leaf_hash(&data), "pieces of {piece}");
        }
        assert_ne!(leaf_hash(&data[1..]), leaf_hash(&data));
    }

    #[test]
    fn rfc6962_empty_and_single_leaf_vectors() {
        // RFC 6962 test vectors (as used by Certificate Transparency): the
        // empty tree, and the one-leaf tree over the empty leaf.
        assert_eq!(
            to_hex(&empty_root()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            to_hex(&leaf_hash(b"")),
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
        );
    }

    #[test]
    fn chunks_cover_the_file_and_a_flipped_byte_changes_one_leaf() {
        let mut data: Vec<u8> = (0..CHUNK_BYTES * 2 + 123)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        assert_eq!(chunk_count(data.len() as u64), 3);
        assert_eq!(chunk_count(0), 0);
        assert_eq!(chunk_count(CHUNK_BYTES as u64), 1);
        let before = chunk_leaves(&data);
        assert_eq!(before.len(), 3);
        assert_eq!(before[2], leaf_hash(&data[2 * CHUNK_BYTES..]));
        let digest = FileDigest::of(&data);
        assert_eq!(digest.sha256, sha(&data));
        assert_eq!(digest.chunk_root, merkle_root(&before));
        assert_eq!(digest.size, data.len() as u64);

        data[CHUNK_BYTES + 7] ^= 1;
        let after = chunk_leaves(&data);
        let changed: Vec<usize> = (0..3).filter(|&i| before[i] != after[i]).collect();
        assert_eq!(changed, [1]);
        assert_ne!(chunk_root(&data), digest.chunk_root);
    }

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let h = leaf_hash(b"x");
        assert_eq!(from_hex(&to_hex(&h)), Some(h));
        assert_eq!(from_hex(&to_hex(&h).to_uppercase()), Some(h));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex(&"g".repeat(64)), None);
    }
}
