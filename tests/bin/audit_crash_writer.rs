//! Test-only: opens the audit log in DIR (or, with `--postgres URL SCHEMA
//! KEY`, in that schema of the state database, signed with KEY) and appends
//! entries from THREADS threads as fast as it can, printing `ack INDEX TAG`
//! on stdout as soon as each append returns (after its fsync or commit),
//! until killed. `audit_crash` SIGKILLs it at random points and checks the
//! log afterwards.
//!
//! Every sixth entry of a thread is large (64–256 KiB), and file batches
//! are written in 64-byte pieces (`AuditLog::split_writes`), so that many
//! kills land in the middle of a batch and leave a torn record behind.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::PathBuf;

use bulkhead_gateway::audit::{Actor, AuditLog, AuditSettings, Event, Outcome};

/// A runaway writer stops here (a trial kills it long before).
const MAX_APPENDS_PER_THREAD: u64 = 5_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opened = match args.as_slice() {
        [flag, url, schema, key, threads] if flag == "--postgres" => {
            open_postgres(url, schema, key).map(|opened| (opened, threads))
        }
        [dir, threads] => AuditLog::open(&AuditSettings::new(PathBuf::from(dir)))
            .map_err(|e| e.to_string())
            .map(|opened| (opened, threads)),
        _ => {
            eprintln!("usage: audit-crash-writer DIR THREADS | --postgres URL SCHEMA KEY THREADS");
            std::process::exit(2);
        }
    };
    let ((log, report), threads) = match opened {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("open failed: {e}");
            std::process::exit(3);
        }
    };
    let threads: u64 = threads.parse().expect("THREADS is a number");
    log.split_writes(64);
    // Large entries are there to tear file records; a database
    // transaction does not tear, and they would only slow each reopen.
    let torn_records_wanted = !log.is_shared();
    say(&format!(
        "open {} {}",
        report.entries,
        report.torn_tail.map_or(0, |(bytes, _)| bytes)
    ));
    let pid = std::process::id();
    let workers: Vec<_> = (0..threads)
        .map(|thread| {
            let log = log.clone();
            std::thread::spawn(move || {
                for seq in 0..MAX_APPENDS_PER_THREAD {
                    let tag = format!("{pid}-{thread}-{seq}");
                    let pad = if seq % 6 == 5 && torn_records_wanted {
                        // 64–256 KiB, varied by the tag.
                        (64 << 10) + (tag.len() * 7919 + seq as usize * 104_729) % (192 << 10)
                    } else {
                        (seq as usize * 37) % 200
                    };
                    let event = Event::AdminAction {
                        route: "crash-test".into(),
                        target: tag.clone(),
                        outcome: Outcome::Refused {
                            reason: "x".repeat(pad),
                        },
                    };
                    match log.append(Actor::Gateway, event) {
                        Ok(index) => say(&format!("ack {index} {tag}")),
                        Err(e) => {
                            eprintln!("append failed: {e}");
                            std::process::exit(4);
                        }
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
}

fn open_postgres(
    url: &str,
    schema: &str,
    key: &str,
) -> Result<(AuditLog, bulkhead_gateway::audit::OpenReport), String> {
    let mut settings = bulkhead_state::PgSettings::new(url);
    settings.schema = schema.to_string();
    let store = bulkhead_state::PgAuditStore::open(&settings).map_err(|e| e.to_string())?;
    let key = bulkhead_gateway::audit::read_signing_key(key.as_ref()).map_err(|e| e.to_string())?;
    AuditLog::open_store(
        Box::new(store),
        key,
        bulkhead_gateway::audit::DEFAULT_ORIGIN,
    )
    .map_err(|e| e.to_string())
}

/// One line, flushed at once (stdout is block-buffered into a pipe).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
