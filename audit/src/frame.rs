//! How entries sit in `entries.log`: a magic line, then one record per
//! entry, back to back:
//!
//! ```text
//! len: u32 BE ‖ !len: u32 BE ‖ entry bytes (len) ‖ SHA-256(0x00 ‖ entry bytes)
//! ```
//!
//! The trailer is the entry's Merkle leaf hash, so checking a record is the
//! hash the tree needs anyway (no second checksum, no new crate), and a
//! stored leaf that does not match its bytes cannot enter the tree. The
//! length is written twice (once inverted) so a damaged length is caught
//! before it is used to frame anything.
//!
//! A crash can only tear the last record: each append is written and
//! fsynced before the next begins. So a bad record is a torn tail only if
//! no intact record follows it anywhere in the file; otherwise the file was
//! damaged in the middle, which is an error and is never cut.

use std::io::{self, Read};

use super::merkle::{Hash, leaf_hash};

/// The first bytes of every log file: names the format and its version.
pub const MAGIC: &[u8] = b"bulkhead audit log v1\n";
/// Length and inverted length.
pub const HEADER_BYTES: usize = 8;
/// The leaf hash after the entry.
pub const TRAILER_BYTES: usize = 32;
/// Largest entry: room for a signed model manifest, small enough that a
/// torn tail is bounded.
pub const MAX_ENTRY_BYTES: usize = 1 << 20;
/// Largest record; a torn tail is never longer.
pub const MAX_RECORD_BYTES: usize = HEADER_BYTES + MAX_ENTRY_BYTES + TRAILER_BYTES;

/// The record for `entry` (at most [`MAX_ENTRY_BYTES`], checked by the caller).
pub fn encode(entry: &[u8], leaf: &Hash, out: &mut Vec<u8>) {
    let len = u32::try_from(entry.len()).expect("entries are bounded by MAX_ENTRY_BYTES");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&(!len).to_be_bytes());
    out.extend_from_slice(entry);
    out.extend_from_slice(leaf);
}

/// One intact record found by [`scan`].
#[derive(Debug)]
pub struct Record<'a> {
    pub index: u64,
    /// Where the record starts in the file.
    pub offset: u64,
    pub entry: &'a [u8],
    pub leaf: Hash,
}

/// The end of the intact records, and what followed them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scanned {
    /// Intact records.
    pub count: u64,
    /// The offset just after the last intact record.
    pub end: u64,
    /// Bytes after `end` that are a torn last record (never an intact one).
    pub torn: Option<Torn>,
}

/// A torn tail: what is wrong with it and how long it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Torn {
    pub bytes: u64,
    pub why: String,
}

/// Why the file cannot be read as a log.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(
        "the file does not start with {:?}: not an audit log (or its first bytes were damaged)",
        String::from_utf8_lossy(MAGIC)
    )]
    Magic,
    #[error(
        "entry {index} (byte {offset}) is damaged ({why}) and intact entries follow it: \
         the file was altered in the middle, not torn by a crash"
    )]
    Corrupt {
        index: u64,
        offset: u64,
        why: String,
    },
    #[error("reading: {0}")]
    Io(#[from] io::Error),
}

/// Reads a whole log of `len` bytes from `file`, calling `each` for every
/// intact record in order. A bad record followed only by bytes holding no
/// intact record is reported as [`Scanned::torn`]; one followed by an intact
/// record is [`FrameError::Corrupt`]. `each`'s error stops the scan.
pub fn scan<E: From<FrameError>>(
    file: &mut impl Read,
    len: u64,
    mut each: impl FnMut(Record<'_>) -> Result<(), E>,
) -> Result<Scanned, E> {
    let mut magic = vec![0; MAGIC.len()];
    let got = read_up_to(file, &mut magic).map_err(FrameError::Io)?;
    if got < MAGIC.len() || magic != MAGIC {
        // A file cut inside its magic line never held an entry.
        if got < MAGIC.len() && magic[..got] == MAGIC[..got] && len == got as u64 {
            return Ok(Scanned {
                count: 0,
                end: 0,
                torn: Some(Torn {
                    bytes: got as u64,
                    why: "the file was cut inside its first line".into(),
                }),
            });
        }
        return Err(FrameError::Magic.into());
    }
    let mut offset = MAGIC.len() as u64;
    let mut index = 0;
    let mut buffer = Vec::new();
    loop {
        let left = len - offset;
        if left == 0 {
            return Ok(Scanned {
                count: index,
                end: offset,
                torn: None,
            });
        }
        let why = match read_record(file, left, &mut buffer).map_err(FrameError::Io)? {
            Ok(entry_len) => {
                let entry = &buffer[HEADER_BYTES..HEADER_BYTES + entry_len];
                let leaf = buffer[HEADER_BYTES + entry_len..]
                    .try_into()
                    .expect("32 bytes");
                each(Record {
                    index,
                    offset,
                    entry,
                    leaf,
                })?;
                offset += buffer.len() as u64;
                index += 1;
                continue;
            }
            Err(why) => why,
        };
        // Bad record: a torn tail only if nothing intact follows it.
        if left > MAX_RECORD_BYTES as u64 {
            return Err(FrameError::Corrupt {
                index,
                offset,
                why: format!("{why}; {left} bytes follow, more than one record can hold"),
            }
            .into());
        }
        // `buffer` holds what was read of the bad record; add the rest.
        let mut tail = std::mem::take(&mut buffer);
        file.read_to_end(&mut tail).map_err(FrameError::Io)?;
        if let Some(at) = (1..tail.len()).find(|&at| intact_at(&tail[at..])) {
            return Err(FrameError::Corrupt {
                index,
                offset,
                why: format!("{why}; an intact record starts {at} bytes later"),
            }
            .into());
        }
        return Ok(Scanned {
            count: index,
            end: offset,
            torn: Some(Torn { bytes: left, why }),
        });
    }
}

/// Whether an intact record starts at the beginning of `bytes`.
fn intact_at(bytes: &[u8]) -> bool {
    if bytes.len() < HEADER_BYTES + 1 + TRAILER_BYTES {
        return false;
    }
    let len = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let check = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let entry_len = len as usize;
    if check != !len || entry_len == 0 || entry_len > MAX_ENTRY_BYTES {
        return false;
    }
    let Some(record) = bytes.get(..HEADER_BYTES + entry_len + TRAILER_BYTES) else {
        return false;
    };
    let entry = &record[HEADER_BYTES..HEADER_BYTES + entry_len];
    leaf_hash(entry)[..] == record[HEADER_BYTES + entry_len..]
}

/// Reads one record into `buffer` (header, entry, trailer). `Ok(Err(why))`
/// when it is not intact; `buffer` then holds exactly the bytes consumed.
fn read_record(
    file: &mut impl Read,
    left: u64,
    buffer: &mut Vec<u8>,
) -> io::Result<Result<usize, String>> {
    buffer.clear();
    buffer.resize(HEADER_BYTES, 0);
    let got = read_up_to(file, buffer)?;
    if got < HEADER_BYTES {
        buffer.truncate(got);
        return Ok(Err(format!("only {got} bytes of a record header")));
    }
    let len = u32::from_be_bytes(buffer[0..4].try_into().expect("4 bytes"));
    let check = u32::from_be_bytes(buffer[4..8].try_into().expect("4 bytes"));
    if check != !len {
        return Ok(Err("the record header's length fields disagree".into()));
    }
    let entry_len = len as usize;
    if entry_len == 0 || entry_len > MAX_ENTRY_BYTES {
        return Ok(Err(format!(
            "a record of {entry_len} bytes (entries are 1 to {MAX_ENTRY_BYTES} bytes)"
        )));
    }
    let total = HEADER_BYTES + entry_len + TRAILER_BYTES;
    if (total as u64) > left {
        return Ok(Err(format!(
            "the record needs {total} bytes and the file has {left} left"
        )));
    }
    buffer.resize(total, 0);
    let got = read_up_to(file, &mut buffer[HEADER_BYTES..])?;
    if got < total - HEADER_BYTES {
        buffer.truncate(HEADER_BYTES + got);
        return Ok(Err("the file ended inside a record".into()));
    }
    let entry = &buffer[HEADER_BYTES..HEADER_BYTES + entry_len];
    if leaf_hash(entry)[..] != buffer[HEADER_BYTES + entry_len..] {
        return Ok(Err(
            "its checksum (leaf hash) does not match its bytes".into()
        ));
    }
    Ok(Ok(entry_len))
}

/// Like `read_exact`, but returns how much it read when the input ends early.
fn read_up_to(file: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log of `n` entries and the offset of each record.
    fn log(n: usize) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = MAGIC.to_vec();
        let mut offsets = Vec::new();
        for i in 0..n {
            offsets.push(bytes.len());
            let entry = format!("{{\"index\":{i},\"pad\":\"{}\"}}", "x".repeat(i * 3));
            encode(entry.as_bytes(), &leaf_hash(entry.as_bytes()), &mut bytes);
        }
        (bytes, offsets)
    }

    fn run(bytes: &[u8]) -> Result<(Scanned, Vec<(u64, u64)>), FrameError> {
        let mut seen = Vec::new();
        let scanned = scan::<FrameError>(&mut &bytes[..], bytes.len() as u64, |r| {
            assert_eq!(r.leaf, leaf_hash(r.entry));
            seen.push((r.index, r.offset));
            Ok(())
        })?;
        Ok((scanned, seen))
    }

    #[test]
    fn an_intact_log_reads_back_every_record() {
        let (bytes, offsets) = log(20);
        let (scanned, seen) = run(&bytes).unwrap();
        assert_eq!(scanned.count, 20);
        assert_eq!(scanned.end, bytes.len() as u64);
        assert_eq!(scanned.torn, None);
        let expected: Vec<(u64, u64)> = (0..).zip(offsets.iter().map(|&o| o as u64)).collect();
        assert_eq!(seen, expected);
        // An empty log is just the magic line.
        let (scanned, _) = run(MAGIC).unwrap();
        assert_eq!((scanned.count, scanned.torn), (0, None));
    }

    #[test]
    fn a_log_cut_anywhere_in_its_last_record_is_a_torn_tail() {
        let (bytes, offsets) = log(6);
        let last = offsets[5];
        for cut in last + 1..bytes.len() {
            let (scanned, seen) = run(&bytes[..cut]).unwrap();
            assert_eq!(seen.len(), 5, "cut at {cut}");
            assert_eq!(scanned.end, last as u64);
            let torn = scanned.torn.expect("torn");
            assert_eq!(torn.bytes, (cut - last) as u64);
        }
        // Cut inside the magic line: an empty log that was being created.
        let (scanned, _) = run(&MAGIC[..5]).unwrap();
        assert_eq!((scanned.count, scanned.end), (0, 0));
        assert!(scanned.torn.is_some());
    }

    #[test]
    fn a_damaged_last_record_or_zero_fill_is_a_torn_tail() {
        let (mut bytes, offsets) = log(4);
        let n = bytes.len();
        bytes[n - 40] ^= 1;
        let (scanned, _) = run(&bytes).unwrap();
        assert_eq!(scanned.count, 3);
        assert_eq!(scanned.end, offsets[3] as u64);
        // A crash after the size grew but before the data landed: zeros.
        let (mut bytes, _) = log(4);
        let end = bytes.len() as u64;
        bytes.extend_from_slice(&[0; 300]);
        let (scanned, _) = run(&bytes).unwrap();
        assert_eq!((scanned.count, scanned.end), (4, end));
        assert_eq!(scanned.torn.unwrap().bytes, 300);
    }

    #[test]
    fn damage_before_an_intact_record_is_corruption_naming_the_entry() {
        let (bytes, offsets) = log(8);
        // Every byte of records 0..=6: a flip in the length, the entry or
        // the checksum.
        for at in offsets[0]..offsets[7] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            let index = offsets.iter().rposition(|&o| o <= at).unwrap() as u64;
            match run(&damaged) {
                Err(FrameError::Corrupt { index: got, .. }) => assert_eq!(got, index, "byte {at}"),
                other => panic!("byte {at}: {other:?}"),
            }
        }
        // A record deleted from the middle leaves intact framing: that is
        // the entry checks' job (`verify`), not framing's.
        let mut deleted = bytes[..offsets[3]].to_vec();
        deleted.extend_from_slice(&bytes[offsets[4]..]);
        assert_eq!(run(&deleted).unwrap().0.count, 7);
    }

    #[test]
    fn a_foreign_file_is_not_a_log() {
        assert!(matches!(
            run(b"hello world, this is not it"),
            Err(FrameError::Magic)
        ));
        let (mut bytes, _) = log(2);
        bytes[0] = b'B';
        assert!(matches!(run(&bytes), Err(FrameError::Magic)));
    }
}
