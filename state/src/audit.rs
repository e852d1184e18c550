//! The audit log in PostgreSQL: one log that every gateway replica appends
//! to, kept as Trillian keeps Certificate Transparency logs (the database
//! holds the leaves; the tree is computed, never trusted).
//!
//! ```text
//! audit_entries      (idx, entry, leaf)   one row per entry, idx from 0 without gaps
//! audit_head         (size)               one row: the log's size, locked by an append
//! audit_checkpoints  (size, note)         every signed checkpoint
//! ```
//!
//! **Appends are serialized in the database**: one transaction locks the
//! head row (`FOR UPDATE`), reads what other replicas appended since this
//! one last looked, inserts the batch at the next indexes, moves the head
//! and commits; an entry is acknowledged only after the commit. Every row
//! read is checked: its leaf is the hash of its bytes, its bytes carry its
//! own index, and indexes run on without a gap; the log then checks the
//! tree against the signed checkpoints. So a row the database drops,
//! reorders or edits is refused here and caught by `bulkhead audit verify`.
//!
//! The log calls a [`Store`] from blocking threads; this store runs its
//! queries on a small runtime of its own (one worker), so it works from any
//! thread that is not itself running async code.

use std::future::Future;

use bulkhead_audit::AuditError;
use bulkhead_audit::merkle::{Hash, leaf_hash};
use bulkhead_audit::store::{Build, Store, Stored};
use tokio::runtime::Runtime;

use super::{Db, PgSettings, PooledClient, StateError};

mod import;
mod verify;

pub use import::{import_log, stored_leaves};
pub use verify::{DbVerified, verify_db};

/// Rows read per query when scanning (bounds memory at open).
const SCAN_PAGE: i64 = 1024;

/// The audit log's tables in the state database.
#[derive(Debug)]
pub struct PgAuditStore {
    /// `None` only while dropping.
    runtime: Option<Runtime>,
    db: Db,
    place: String,
}

impl PgAuditStore {
    /// Connects (migrating the schema) on the store's own runtime.
    pub fn open(settings: &PgSettings) -> Result<PgAuditStore, StateError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bulkhead-audit-db")
            .enable_all()
            .build()
            .map_err(|e| StateError::Unavailable {
                target: "the audit store's runtime".into(),
                why: e.to_string(),
            })?;
        let db = runtime.block_on(Db::connect(settings))?;
        let place = format!("PostgreSQL {} schema `{}`", db.target(), db.schema());
        Ok(PgAuditStore {
            runtime: Some(runtime),
            db,
            place,
        })
    }

    fn run<T>(&self, work: impl Future<Output = Result<T, AuditError>>) -> Result<T, AuditError> {
        self.runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(work)
    }

    async fn client(&self) -> Result<PooledClient, AuditError> {
        self.db.client().await.map_err(|e| self.error(e))
    }

    /// A database error as the log reports it: unavailability (503, retry)
    /// or anything else, which is treated the same way: nothing was
    /// written, and the next try may work.
    fn error(&self, error: impl Into<StateError>) -> AuditError {
        AuditError::Unavailable(error.into().to_string())
    }

    /// Checks one row and makes it an entry: `expected` is the index it
    /// must have.
    fn row(&self, expected: u64, row: &tokio_postgres::Row) -> Result<Stored, AuditError> {
        let damaged = |index: u64, why: String| AuditError::Damaged {
            place: self.place.clone(),
            index,
            why,
        };
        let idx: i64 = row.get(0);
        let index = u64::try_from(idx).map_err(|_| damaged(expected, format!("index {idx}")))?;
        if index != expected {
            return Err(damaged(
                expected,
                format!("it is missing (the next row is {index}): a row was deleted or renumbered"),
            ));
        }
        let entry: Vec<u8> = row.get(1);
        let stored_leaf: Vec<u8> = row.get(2);
        let leaf = leaf_hash(&entry);
        if stored_leaf.as_slice() != leaf.as_slice() {
            return Err(damaged(
                index,
                "its bytes do not hash to its stored leaf: the row was edited".into(),
            ));
        }
        match serde_json::from_slice::<IndexOf>(&entry) {
            Ok(of) if of.index == index => {}
            Ok(of) => {
                return Err(damaged(
                    index,
                    format!(
                        "the entry says it is entry {}: rows were moved or copied",
                        of.index
                    ),
                ));
            }
            Err(e) => return Err(damaged(index, format!("not an audit entry: {e}"))),
        }
        Ok(Stored { index, entry, leaf })
    }

    /// Rows `from..to` in order, checked, to `each` (in pages).
    async fn rows_between(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        from: u64,
        to: u64,
        each: &mut dyn FnMut(Stored),
    ) -> Result<(), AuditError> {
        let mut next = from;
        while next < to {
            let rows = client
                .query(
                    "SELECT idx, entry, leaf FROM audit_entries \
                     WHERE idx >= $1 AND idx < $2 ORDER BY idx LIMIT $3",
                    &[&as_i64(next), &as_i64(to), &SCAN_PAGE],
                )
                .await
                .map_err(|e| self.error(e))?;
            if rows.is_empty() {
                return Err(AuditError::Damaged {
                    place: self.place.clone(),
                    index: next,
                    why: format!(
                        "the log's head says it holds {to} entries and rows end before this \
                         one: rows were deleted"
                    ),
                });
            }
            for row in &rows {
                each(self.row(next, row)?);
                next += 1;
            }
        }
        Ok(())
    }
}

/// The part of an entry that says where it belongs.
#[derive(serde::Deserialize)]
struct IndexOf {
    index: u64,
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn head(row: &tokio_postgres::Row) -> u64 {
    u64::try_from(row.get::<_, i64>(0)).unwrap_or(0)
}

impl Store for PgAuditStore {
    fn place(&self) -> &str {
        &self.place
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn scan(&self, from: u64, each: &mut dyn FnMut(Stored)) -> Result<(), AuditError> {
        self.run(async {
            let mut client = self.client().await?;
            // One snapshot: the head and the rows it covers agree.
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(|e| self.error(e))?;
            let size = head(
                &tx.query_one("SELECT size FROM audit_head", &[])
                    .await
                    .map_err(|e| self.error(e))?,
            );
            if size < from {
                return Err(AuditError::Damaged {
                    place: self.place.clone(),
                    index: size,
                    why: format!(
                        "the log's head says it holds {size} entries, and this gateway has \
                         seen {from}: entries were removed"
                    ),
                });
            }
            self.rows_between(&tx, from, size, each).await?;
            tx.commit().await.map_err(|e| self.error(e))
        })
    }

    fn append(
        &self,
        known: u64,
        others: &mut dyn FnMut(Stored),
        build: &mut Build<'_>,
    ) -> Result<u64, AuditError> {
        self.run(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(|e| self.error(e))?;
            // Serializes appends across replicas until the commit.
            let first = head(
                &tx.query_one("SELECT size FROM audit_head FOR UPDATE", &[])
                    .await
                    .map_err(|e| self.error(e))?,
            );
            if first < known {
                return Err(AuditError::Damaged {
                    place: self.place.clone(),
                    index: first,
                    why: format!(
                        "the log's head says it holds {first} entries, and this gateway has \
                         seen {known}: entries were removed"
                    ),
                });
            }
            self.rows_between(&tx, known, first, others).await?;
            let records = build(first);
            if records.is_empty() {
                return Ok(first);
            }
            let count = records.len() as u64;
            let indexes: Vec<i64> = (first..first + count).map(as_i64).collect();
            let (entries, leaves): (Vec<Vec<u8>>, Vec<Vec<u8>>) = records
                .into_iter()
                .map(|(entry, leaf): (Vec<u8>, Hash)| (entry, leaf.to_vec()))
                .unzip();
            tx.execute(
                "INSERT INTO audit_entries (idx, entry, leaf) \
                 SELECT * FROM UNNEST($1::BIGINT[], $2::BYTEA[], $3::BYTEA[])",
                &[&indexes, &entries, &leaves],
            )
            .await
            .map_err(|e| self.error(e))?;
            tx.execute("UPDATE audit_head SET size = $1", &[&as_i64(first + count)])
                .await
                .map_err(|e| self.error(e))?;
            tx.commit().await.map_err(|e| self.error(e))?;
            Ok(first)
        })
    }

    fn read(&self, from: u64, to: u64) -> Result<Vec<Vec<u8>>, AuditError> {
        self.run(async {
            let client = self.client().await?;
            let mut out = Vec::with_capacity(to.saturating_sub(from) as usize);
            self.rows_between(&client, from, to, &mut |stored| out.push(stored.entry))
                .await?;
            Ok(out)
        })
    }

    fn latest_checkpoint(&self) -> Result<Option<String>, AuditError> {
        self.run(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT note FROM audit_checkpoints ORDER BY size DESC LIMIT 1",
                    &[],
                )
                .await
                .map_err(|e| self.error(e))?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    fn keep_checkpoint(&self, size: u64, note: &str) -> Result<(), AuditError> {
        self.run(async {
            let client = self.client().await?;
            let kept = client
                .execute(
                    "INSERT INTO audit_checkpoints (size, note) VALUES ($1, $2) \
                     ON CONFLICT (size) DO NOTHING",
                    &[&as_i64(size), &note],
                )
                .await
                .map_err(|e| self.error(e))?;
            if kept == 1 {
                return Ok(());
            }
            // Another replica signed this size first: with one key and one
            // sequence of entries it signed the same text.
            let theirs: String = client
                .query_one(
                    "SELECT note FROM audit_checkpoints WHERE size = $1",
                    &[&as_i64(size)],
                )
                .await
                .map_err(|e| self.error(e))?
                .get(0);
            if theirs == note {
                Ok(())
            } else {
                Err(AuditError::Checkpoint {
                    place: self.place.clone(),
                    why: format!(
                        "a different checkpoint of size {size} is already kept: two signers \
                         disagree about the log (different keys, or rows changed between \
                         them)"
                    ),
                })
            }
        })
    }
}

impl Drop for PgAuditStore {
    fn drop(&mut self) {
        // May run inside async code (the gateway dropping its state), where
        // a blocking shutdown would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests;
