//! The usage book on disk, so billing counts survive a restart.
//!
//! A folder (`[usage] dir`, 0700, locked by one gateway) of
//! `usage-YYYY-MM-DD.jsonl` files. Every [`FLUSH_EVERY`] the gateway
//! appends one line per (hour, tenant, model) whose counters grew, holding
//! what they grew by, and fsyncs; at start it adds every line back into
//! the book. A crash loses at most the last second's counts. A torn last
//! line (a crash mid-write) is skipped with a warning naming it; any other
//! unreadable line stops the start, naming its file and line, rather than
//! silently under-billing. Files older than [`KEPT_DAYS`] are deleted.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::{Changed, Hour, KEPT_DAYS, Totals, UsageBook, day_of, day_text, hour_text, parse_hour};

/// How often what changed is written.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Longest line read back (a tenant and a model name are bounded far below).
const MAX_LINE: usize = 4096;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("usage journal {}: {action}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("usage journal {}:{line}: {why}", path.display())]
    Corrupt {
        path: PathBuf,
        line: usize,
        why: String,
    },
    #[error(
        "usage journal {}: another gateway writes it; give each replica its own `[usage] dir`",
        .0.display()
    )]
    InUse(PathBuf),
}

/// One journal line: what an hour's counters grew by.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    hour: String,
    tenant: String,
    model: String,
    requests: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    compute_us: u64,
}

type Key = (String, Hour, String);

/// The book's folder, and what of the book it holds already.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    book: UsageBook,
    /// One flush at a time (the periodic one and the last one).
    flushing: Mutex<()>,
    _lock: bulkhead_durable::DirLock,
}

impl Journal {
    /// Opens `dir` (creating it 0700), takes its lock and adds everything
    /// it holds to `book`.
    pub fn open(dir: &Path, book: &UsageBook) -> Result<Journal, JournalError> {
        let io = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| JournalError::Io {
                action,
                path,
                source,
            }
        };
        bulkhead_durable::private_dir(dir, "the usage folder").map_err(|(action, source)| {
            JournalError::Io {
                action,
                path: dir.to_path_buf(),
                source,
            }
        })?;
        let lock = bulkhead_durable::lock_dir(dir).map_err(|e| match e {
            bulkhead_durable::LockError::InUse => JournalError::InUse(dir.to_path_buf()),
            bulkhead_durable::LockError::Io {
                action,
                path,
                source,
            } => JournalError::Io {
                action,
                path,
                source,
            },
        })?;
        let oldest = day_of(SystemTime::now()).saturating_sub(KEPT_DAYS - 1);
        let mut written: HashMap<Key, Totals> = HashMap::new();
        let mut names: Vec<String> = fs::read_dir(dir)
            .map_err(io("reading", dir))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("usage-") && n.ends_with(".jsonl"))
            .collect();
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let day = name["usage-".len()..name.len() - ".jsonl".len()].to_string();
            match parse_hour(&day) {
                Some(hour) if hour / 24 < oldest => {
                    fs::remove_file(&path).map_err(io("removing", &path))?;
                    continue;
                }
                Some(_) => {}
                None => continue, // not ours
            }
            let text = fs::read(&path).map_err(io("reading", &path))?;
            read_lines(&path, &text, &mut written)?;
        }
        for ((tenant, hour, model), totals) in &written {
            book.add_journaled(tenant, model, *hour, *totals);
        }
        Ok(Journal {
            dir: dir.to_path_buf(),
            book: book.clone(),
            flushing: Mutex::new(()),
            _lock: lock,
        })
    }

    /// Appends what grew since the last flush (one fsync per day file
    /// touched). Returns how many lines were written.
    pub fn flush(&self) -> Result<usize, JournalError> {
        let _one = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        let mut by_day: HashMap<u32, Vec<Changed>> = HashMap::new();
        for changed in self.book.take_changed() {
            by_day
                .entry(changed.counts.hour / 24)
                .or_default()
                .push(changed);
        }
        let mut lines = 0;
        let mut failed = None;
        for (day, changes) in by_day {
            if failed.is_some() {
                changes.iter().for_each(|c| c.retry(&self.book));
                continue;
            }
            let path = self.dir.join(format!("usage-{}.jsonl", day_text(day)));
            let mut text = String::new();
            for Changed { counts, grew, .. } in &changes {
                let line = Line {
                    hour: hour_text(counts.hour),
                    tenant: counts.tenant.clone(),
                    model: counts.model.clone(),
                    requests: grew.requests,
                    prompt_tokens: grew.prompt_tokens,
                    completion_tokens: grew.completion_tokens,
                    compute_us: grew.compute_us,
                };
                // Serializing plain strings and numbers cannot fail.
                text.push_str(&serde_json::to_string(&line).unwrap_or_default());
                text.push('\n');
            }
            let write = || -> io::Result<()> {
                let mut file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .open(&path)?;
                file.write_all(text.as_bytes())?;
                file.sync_data()
            };
            match write() {
                Ok(()) => {
                    lines += changes.len();
                    changes.iter().for_each(Changed::journaled);
                }
                Err(source) => {
                    // A partial write leaves at most a torn last line,
                    // skipped at the next start; the counts go again.
                    changes.iter().for_each(|c| c.retry(&self.book));
                    failed = Some(JournalError::Io {
                        action: "appending",
                        path,
                        source,
                    });
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(lines),
        }
    }
}

/// Adds the lines of one file to `into`.
fn read_lines(
    path: &Path,
    text: &[u8],
    into: &mut HashMap<Key, Totals>,
) -> Result<(), JournalError> {
    let corrupt = |line: usize, why: String| JournalError::Corrupt {
        path: path.to_path_buf(),
        line,
        why,
    };
    let ends_whole = text.last().is_none_or(|&b| b == b'\n');
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    let count = lines.len();
    for (i, raw) in lines.into_iter().enumerate() {
        if raw.is_empty() {
            continue;
        }
        let last_torn = i + 1 == count && !ends_whole;
        let parsed = if raw.len() > MAX_LINE {
            Err(format!(
                "a line of {} bytes (at most {MAX_LINE})",
                raw.len()
            ))
        } else {
            serde_json::from_slice::<Line>(raw).map_err(|e| e.to_string())
        };
        let line = match parsed {
            Ok(line) => line,
            Err(why) if last_torn => {
                tracing::warn!(
                    file = %path.display(),
                    line = i + 1,
                    "usage journal: skipping a torn last line (a crash while it was written): {why}"
                );
                continue;
            }
            Err(why) => return Err(corrupt(i + 1, why)),
        };
        let hour = parse_hour(&line.hour)
            .ok_or_else(|| corrupt(i + 1, format!("`{}` is not an hour", line.hour)))?;
        into.entry((line.tenant, hour, line.model))
            .or_default()
            .add(Totals {
                requests: line.requests,
                prompt_tokens: line.prompt_tokens,
                completion_tokens: line.completion_tokens,
                compute_us: line.compute_us,
            });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::usage::hour_of;

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("bulkhead-usage-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn counts_survive_a_restart_and_only_growth_is_written() {
        let dir = temp("restart");
        let now = hour_of(SystemTime::now());
        {
            let book = UsageBook::new();
            let journal = Journal::open(&dir, &book).unwrap();
            let r = book.start("acme", "m", now);
            r.prompt(10);
            r.completion(3);
            r.compute(1500);
            assert_eq!(journal.flush().unwrap(), 1);
            assert_eq!(journal.flush().unwrap(), 0, "nothing grew");
            r.completion(2);
            book.start("beta", "m", now - 1);
            assert_eq!(journal.flush().unwrap(), 2);
        }
        let book = UsageBook::new();
        let journal = Journal::open(&dir, &book).unwrap();
        let rows = book.hours(None, 0, u32::MAX);
        assert_eq!(rows.len(), 2, "{rows:?}");
        let acme = rows.iter().find(|r| r.tenant == "acme").unwrap();
        assert_eq!(
            acme.totals,
            Totals {
                requests: 1,
                prompt_tokens: 10,
                completion_tokens: 5,
                compute_us: 1500
            }
        );
        // What was read back is not written again.
        assert_eq!(journal.flush().unwrap(), 0);
        // One gateway per folder.
        assert!(matches!(
            Journal::open(&dir, &UsageBook::new()),
            Err(JournalError::InUse(_))
        ));
        drop(journal);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_other_damage_is_named() {
        let dir = temp("torn");
        fs::create_dir_all(&dir).unwrap();
        let today = day_text(day_of(SystemTime::now()));
        let file = dir.join(format!("usage-{today}.jsonl"));
        let good = format!(
            "{{\"hour\":\"{today}T01:00:00Z\",\"tenant\":\"a\",\"model\":\"m\",\"requests\":2,\
             \"prompt_tokens\":1,\"completion_tokens\":1,\"compute_us\":7}}\n"
        );
        fs::write(&file, format!("{good}{{\"hour\":\"{today}T01")).unwrap();
        let book = UsageBook::new();
        let journal = Journal::open(&dir, &book).unwrap();
        assert_eq!(book.hours(Some("a"), 0, u32::MAX)[0].totals.requests, 2);
        drop(journal);

        fs::write(&file, format!("not json\n{good}")).unwrap();
        let err = Journal::open(&dir, &UsageBook::new()).unwrap_err();
        assert!(
            matches!(&err, JournalError::Corrupt { line: 1, .. })
                && err.to_string().contains(&format!("usage-{today}.jsonl:1")),
            "{err}"
        );
        // Files older than what is kept are removed at start.
        fs::write(&file, &good).unwrap();
        let old = dir.join("usage-2001-01-01.jsonl");
        fs::write(&old, &good).unwrap();
        drop(Journal::open(&dir, &UsageBook::new()).unwrap());
        assert!(!old.exists() && file.exists());
        let _ = fs::remove_dir_all(&dir);
    }
}
