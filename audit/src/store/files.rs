//! The audit log in a folder: `entries.log` (records as `frame.rs` lays
//! them out, appended and fsync'd) and `checkpoint` (the latest signed
//! note, replaced atomically). One process writes it: the folder's `lock`
//! is held while it is open.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use bulkhead_durable::DirLock;

use super::super::AuditError;
use super::super::files::{read_small, write_atomic};
use super::super::frame::{self, MAGIC};
use super::super::note::MAX_NOTE_BYTES;
use super::{Build, Store, Stored};
use crate::{CHECKPOINT_FILE, ENTRIES_FILE};

/// A torn last record found at open and cut off: its bytes and why.
pub type TornTail = (u64, String);

/// The log's folder, open for appends.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    place: String,
    writer: Mutex<Writer>,
    /// Where each acknowledged record starts, and where the last one ends.
    spans: RwLock<Spans>,
    /// For reads of stored entries (`pread`, never moves a cursor).
    reader: File,
    /// A copy of `Writer::failed`, readable without waiting for a batch's
    /// fsync (the writer lock is held across it).
    failure: Mutex<Option<String>>,
    /// Holds the folder's `flock` while open.
    _lock: DirLock,
}

#[derive(Debug)]
struct Writer {
    file: File,
    /// Set by a failed write or fsync whose cut back failed too: the
    /// file's tail is unknown.
    failed: Option<String>,
    /// Test hook ([`Store::split_writes`]): write batches in pieces of
    /// this many bytes, one syscall each.
    split_writes: Option<usize>,
}

#[derive(Debug, Default)]
struct Spans {
    offsets: Vec<u64>,
    end: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent before anything
    // that could panic, so a poisoned lock holds usable data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FileStore {
    /// Opens `dir/entries.log` (creating it), hands every intact record to
    /// `each` and cuts a torn tail, with a warning. `lock` is the folder's
    /// lock, already taken.
    pub fn open(
        dir: &Path,
        lock: DirLock,
        each: &mut dyn FnMut(Stored),
    ) -> Result<(FileStore, Option<TornTail>), AuditError> {
        let path = dir.join(ENTRIES_FILE);
        if !path.exists() {
            write_atomic(&path, MAGIC)?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&path)
            .map_err(AuditError::io("opening", &path))?;
        let len = file
            .metadata()
            .map_err(AuditError::io("reading", &path))?
            .len();
        let mut spans = Spans::default();
        let scanned = frame::scan::<frame::FrameError>(
            &mut BufReader::with_capacity(1 << 20, &mut file),
            len,
            |record| {
                spans.offsets.push(record.offset);
                each(Stored {
                    index: record.index,
                    entry: record.entry.to_vec(),
                    leaf: record.leaf,
                });
                Ok(())
            },
        )
        .map_err(|source| match source {
            frame::FrameError::Io(e) => AuditError::io("reading", &path)(e),
            source => AuditError::Frame {
                path: path.clone(),
                source,
            },
        })?;
        spans.end = scanned.end;

        let mut torn_tail = None;
        if let Some(torn) = &scanned.torn {
            tracing::warn!(
                log = %path.display(),
                bytes = torn.bytes,
                entries = scanned.count,
                why = %torn.why,
                "the audit log ends in a torn record (a crash during an append that was never \
                 acknowledged); cutting it off"
            );
            file.set_len(scanned.end)
                .and_then(|()| file.sync_all())
                .map_err(AuditError::io("truncating", &path))?;
            if scanned.end == 0 {
                file.write_all(MAGIC)
                    .and_then(|()| file.sync_all())
                    .map_err(AuditError::io("writing", &path))?;
                spans.end = MAGIC.len() as u64;
            }
            torn_tail = Some((torn.bytes, torn.why.clone()));
        }
        let reader = File::open(&path).map_err(AuditError::io("opening", &path))?;
        let store = FileStore {
            dir: dir.to_path_buf(),
            place: dir.display().to_string(),
            writer: Mutex::new(Writer {
                file,
                failed: None,
                split_writes: None,
            }),
            spans: RwLock::new(spans),
            reader,
            failure: Mutex::new(None),
            _lock: lock,
        };
        Ok((store, torn_tail))
    }

    fn spans(&self) -> std::sync::RwLockReadGuard<'_, Spans> {
        self.spans.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The bytes of record `index` (whole, header and trailer included).
    fn record(&self, spans: &Spans, index: u64) -> Result<Vec<u8>, AuditError> {
        let start = spans.offsets[index as usize];
        let end = spans
            .offsets
            .get(index as usize + 1)
            .copied()
            .unwrap_or(spans.end);
        let mut record = vec![0; (end - start) as usize];
        self.reader
            .read_exact_at(&mut record, start)
            .map_err(AuditError::io("reading", &self.dir.join(ENTRIES_FILE)))?;
        Ok(record)
    }
}

impl Store for FileStore {
    fn place(&self) -> &str {
        &self.place
    }

    /// Everything was handed over at open and only this process appends:
    /// records past `from` are reread from the file.
    fn scan(&self, from: u64, each: &mut dyn FnMut(Stored)) -> Result<(), AuditError> {
        let spans = self.spans();
        for index in from..spans.offsets.len() as u64 {
            let record = self.record(&spans, index)?;
            let entry = record[frame::HEADER_BYTES..record.len() - frame::TRAILER_BYTES].to_vec();
            let leaf = record[record.len() - frame::TRAILER_BYTES..]
                .try_into()
                .expect("32 bytes");
            each(Stored { index, entry, leaf });
        }
        Ok(())
    }

    fn append(
        &self,
        known: u64,
        _others: &mut dyn FnMut(Stored),
        build: &mut Build<'_>,
    ) -> Result<u64, AuditError> {
        let mut writer = lock(&self.writer);
        if let Some(why) = &writer.failed {
            return Err(AuditError::Failed(why.clone()));
        }
        let (first, start) = {
            let spans = self.spans();
            (spans.offsets.len() as u64, spans.end)
        };
        debug_assert_eq!(known, first, "one writer: the log knows every entry");
        let records = build(first);
        if records.is_empty() {
            return Ok(first);
        }
        let mut buffer = Vec::new();
        let mut offsets = Vec::with_capacity(records.len());
        for (entry, leaf) in &records {
            offsets.push(start + buffer.len() as u64);
            frame::encode(entry, leaf, &mut buffer);
        }
        let written = match writer.split_writes {
            None => writer.file.write_all(&buffer),
            Some(piece) => buffer
                .chunks(piece)
                .try_for_each(|chunk| writer.file.write_all(chunk)),
        }
        .and_then(|()| writer.file.sync_data());
        if let Err(e) = written {
            let why = format!("{}: {e}", self.dir.join(ENTRIES_FILE).display());
            // Cut the file back to its last acknowledged record, so what
            // follows is known again and later appends may succeed (a
            // disk that was full gets room). Only if that fails too does
            // the log stop taking entries.
            match writer
                .file
                .set_len(start)
                .and_then(|()| writer.file.sync_data())
            {
                Ok(()) => {
                    tracing::error!(error = %why, "audit append failed; its entries were not written");
                }
                Err(cut) => {
                    tracing::error!(
                        error = %why,
                        cut_back = %cut,
                        "audit append failed and the file could not be cut back to its last \
                         entry; the log takes no more entries"
                    );
                    writer.failed = Some(why.clone());
                    *lock(&self.failure) = Some(why.clone());
                }
            }
            return Err(AuditError::Failed(why));
        }
        let mut spans = self.spans.write().unwrap_or_else(PoisonError::into_inner);
        spans.offsets.extend(offsets);
        spans.end = start + buffer.len() as u64;
        Ok(first)
    }

    fn read(&self, from: u64, to: u64) -> Result<Vec<Vec<u8>>, AuditError> {
        let spans = self.spans();
        (from..to)
            .map(|index| {
                let record = self.record(&spans, index)?;
                Ok(record[frame::HEADER_BYTES..record.len() - frame::TRAILER_BYTES].to_vec())
            })
            .collect()
    }

    fn latest_checkpoint(&self) -> Result<Option<String>, AuditError> {
        let path = self.dir.join(CHECKPOINT_FILE);
        let Some(bytes) = read_small(&path, MAX_NOTE_BYTES as u64)? else {
            return Ok(None);
        };
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| AuditError::Checkpoint {
                place: path.display().to_string(),
                why: "not UTF-8 text".into(),
            })
    }

    fn keep_checkpoint(&self, _size: u64, note: &str) -> Result<(), AuditError> {
        write_atomic(&self.dir.join(CHECKPOINT_FILE), note.as_bytes())
    }

    fn bytes(&self) -> Option<u64> {
        Some(self.spans().end)
    }

    fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

    fn split_writes(&self, bytes: usize) {
        lock(&self.writer).split_writes = Some(bytes.max(1));
    }
}
