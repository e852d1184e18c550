//! A file's [`FileDigest`], read in [`CHUNK_BYTES`] pieces so a model file of
//! any size costs one 4 MiB buffer, never the whole file in memory (and no
//! `unsafe` mapping in the gateway).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use bulkhead_protocol::digest::{CHUNK_BYTES, FileDigest, leaf_hash, merkle_root};
use sha2::{Digest as _, Sha256};

use super::ModelError;

/// Hashes the regular file at `path` both ways in one pass: the whole-file
/// SHA-256 model-signing records, and the chunk root of our extension.
pub(crate) fn digest_file(path: &Path) -> Result<FileDigest, ModelError> {
    let mut file = File::open(path).map_err(ModelError::io(path))?;
    // Checked on the open file: what was listed as a file may have been
    // swapped for something else since.
    let meta = file.metadata().map_err(ModelError::io(path))?;
    if !meta.is_file() {
        return Err(ModelError::Folder {
            path: path.display().to_string(),
            reason: "no longer a regular file".into(),
        });
    }
    digest_reader(&mut file).map_err(ModelError::io(path))
}

/// The digest of everything `reader` yields.
pub(crate) fn digest_reader(reader: &mut impl Read) -> std::io::Result<FileDigest> {
    let mut whole = Sha256::new();
    let mut leaves = Vec::new();
    let mut size = 0u64;
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        let filled = fill(reader, &mut buffer)?;
        if filled == 0 {
            break;
        }
        let chunk = &buffer[..filled];
        whole.update(chunk);
        leaves.push(leaf_hash(chunk));
        size += filled as u64;
        if filled < CHUNK_BYTES {
            break;
        }
    }
    Ok(FileDigest {
        size,
        sha256: whole.finalize().into(),
        chunk_root: merkle_root(&leaves),
    })
}

/// Reads until `buffer` is full or the reader ends; how many bytes it holds.
fn fill(reader: &mut impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most 1000 bytes per call, as pipes do.
    struct Dribble<'a>(&'a [u8]);

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(1000).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn streaming_matches_the_protocol_digest() {
        for len in [
            0,
            1,
            CHUNK_BYTES - 1,
            CHUNK_BYTES,
            CHUNK_BYTES + 1,
            2 * CHUNK_BYTES + 4321,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
            let streamed = digest_reader(&mut Dribble(&data)).unwrap();
            assert_eq!(streamed, FileDigest::of(&data), "length {len}");
        }
    }
}
