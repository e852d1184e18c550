//! `bulkhead audit verify --state URL`: the offline check of the audit log
//! kept in PostgreSQL, reading it as an auditor would, trusting nothing the
//! database says: every row's bytes are hashed here (the stored leaf is
//! only compared, to name an edited row), each entry must carry its own
//! index and the indexes must run on from 0, and the tree of all of them
//! must extend the signed checkpoint. Reads only, in one snapshot; never
//! migrates.

use bulkhead_audit::merkle::{Tree, leaf_hash};
use bulkhead_audit::note::{Checkpoint, NoteVerifier};
use bulkhead_audit::verify::{VerifyError, check_entry, check_tree};

use crate::pool;
use crate::{PgSettings, StateError};

/// Rows read per query.
const PAGE: i64 = 1024;

/// A log in the database that passed.
#[derive(Clone, Debug)]
pub struct DbVerified {
    /// Entries in the log.
    pub entries: u64,
    /// The checkpoint it was checked against.
    pub checkpoint: Checkpoint,
    /// Whether that checkpoint came from the database itself (which then
    /// only shows the log agrees with itself).
    pub checkpoint_from_db: bool,
}

/// Verifies the log in the schema `settings` name against `checkpoint` (a
/// signed note an auditor kept; `None`: the latest one in the database),
/// with the verifier `key` makes for the checkpoint's origin.
pub async fn verify_db(
    settings: &PgSettings,
    checkpoint: Option<&str>,
    key: &dyn Fn(&str) -> Result<NoteVerifier, String>,
) -> Result<DbVerified, VerifyError> {
    let log = |e: StateError| VerifyError::Log(e.to_string());
    let resolved = settings.resolve().map_err(log)?;
    let mut client = pool::session(&resolved, settings.statement_timeout_ms.max(60_000))
        .await
        .map_err(log)?;
    let query = |e: tokio_postgres::Error| VerifyError::Log(StateError::from(e).to_string());
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(query)?;
    let head = tx
        .query_opt("SELECT size FROM audit_head", &[])
        .await
        .map_err(|e| {
            VerifyError::Log(format!(
                "schema `{}` holds no audit log ({})",
                settings.schema,
                StateError::from(e)
            ))
        })?
        .ok_or_else(|| VerifyError::Log("the audit log's head row is missing".into()))?;
    let size = u64::try_from(head.get::<_, i64>(0)).unwrap_or(0);

    let mut tree = Tree::new();
    while tree.size() < size {
        let next = tree.size();
        let rows = tx
            .query(
                "SELECT idx, entry, leaf FROM audit_entries WHERE idx >= $1 \
                 ORDER BY idx LIMIT $2",
                &[&i64::try_from(next).unwrap_or(i64::MAX), &PAGE],
            )
            .await
            .map_err(query)?;
        if rows.is_empty() {
            return Err(VerifyError::Entry {
                index: next,
                why: format!(
                    "missing: the log's head says it holds {size} entries and the rows end \
                     here (rows were deleted)"
                ),
            });
        }
        for row in rows {
            let index = tree.size();
            if index == size {
                break;
            }
            let idx: i64 = row.get(0);
            if u64::try_from(idx).ok() != Some(index) {
                return Err(VerifyError::Entry {
                    index,
                    why: format!(
                        "missing: the next row is {idx} (a row was deleted or renumbered)"
                    ),
                });
            }
            let entry: Vec<u8> = row.get(1);
            let stored: Vec<u8> = row.get(2);
            let leaf = leaf_hash(&entry);
            check_entry(index, &entry)?;
            if stored.as_slice() != leaf.as_slice() {
                return Err(VerifyError::Entry {
                    index,
                    why: "its bytes do not hash to its stored leaf: the row was edited".into(),
                });
            }
            tree.push(leaf);
        }
    }
    let (note, from_db) = match checkpoint {
        Some(note) => (note.to_string(), false),
        None => {
            let row = tx
                .query_opt(
                    "SELECT note FROM audit_checkpoints ORDER BY size DESC LIMIT 1",
                    &[],
                )
                .await
                .map_err(query)?
                .ok_or_else(|| VerifyError::Log("the database holds no checkpoint".into()))?;
            (row.get(0), true)
        }
    };
    tx.commit().await.map_err(query)?;
    let claimed = bulkhead_audit::note::unverified_checkpoint(&note)
        .map_err(|e| VerifyError::Log(format!("the checkpoint: {e}")))?;
    let verifier = key(&claimed.origin).map_err(VerifyError::Log)?;
    let place = if from_db {
        "(the database's latest)"
    } else {
        "(given)"
    };
    let checkpoint = check_tree(&tree, &note, place, &verifier, "the given key")?;
    Ok(DbVerified {
        entries: tree.size(),
        checkpoint,
        checkpoint_from_db: from_db,
    })
}
