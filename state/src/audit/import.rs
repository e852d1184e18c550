//! Copying a log folder's audit log into the state database (`bulkhead
//! state migrate`): the entries keep their bytes, leaves and indexes, so
//! the tree, its roots and every checkpoint signed over it stay the same.
//! Only into an empty log, in one transaction: a rerun, or a copy into a
//! schema a gateway already writes to, is refused rather than mixed in.

use bulkhead_audit::merkle::{Hash, leaf_hash};
use bulkhead_audit::store::Stored;
use tokio_postgres::Transaction;

use super::as_i64;
use crate::{Db, StateError};

/// Rows per `INSERT ... UNNEST` statement: bounds one statement's size
/// (entries are up to 1 MiB) while keeping round trips few.
const INSERT_BATCH: usize = 500;

/// Copies `entries` (indexes `0..n` in order, each leaf the hash of its
/// bytes) and the signed `checkpoints` (size, note) into `db`'s empty audit
/// log, in one transaction. Returns the entries copied. Refuses, writing
/// nothing, a schema whose log already holds entries or checkpoints.
pub async fn import_log(
    db: &Db,
    entries: &[Stored],
    checkpoints: &[(u64, String)],
) -> Result<u64, StateError> {
    let invalid = |why: String| StateError::Import {
        schema: db.schema().to_string(),
        why,
    };
    for (position, stored) in (0u64..).zip(entries) {
        if stored.index != position {
            return Err(invalid(format!(
                "entry {position} is given as entry {}: entries must run from 0 without a gap",
                stored.index
            )));
        }
        if leaf_hash(&stored.entry) != stored.leaf {
            return Err(invalid(format!(
                "entry {position}'s bytes do not hash to its leaf"
            )));
        }
    }
    let size = entries.len() as u64;
    if let Some((too_big, _)) = checkpoints.iter().find(|(at, _)| *at > size) {
        return Err(invalid(format!(
            "a checkpoint of size {too_big} covers more than the {size} entries given"
        )));
    }

    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    // Locks out appends by a gateway already using the schema until the
    // commit; the log must be empty, or this would mix two logs.
    let held: i64 = tx
        .query_one("SELECT size FROM audit_head FOR UPDATE", &[])
        .await?
        .get(0);
    let rows: i64 = tx
        .query_one("SELECT count(*) FROM audit_entries", &[])
        .await?
        .get(0);
    let kept: i64 = tx
        .query_one("SELECT count(*) FROM audit_checkpoints", &[])
        .await?
        .get(0);
    if held != 0 || rows != 0 || kept != 0 {
        return Err(invalid(format!(
            "schema `{}` already holds an audit log of {} entries ({kept} checkpoints); \
             refusing to copy another one into it (a rerun would duplicate it): name an empty \
             schema with --schema",
            db.schema(),
            held.max(rows)
        )));
    }
    for batch in entries.chunks(INSERT_BATCH) {
        insert_batch(&tx, batch).await?;
    }
    for (at, note) in checkpoints {
        tx.execute(
            "INSERT INTO audit_checkpoints (size, note) VALUES ($1, $2)",
            &[&as_i64(*at), note],
        )
        .await?;
    }
    tx.execute("UPDATE audit_head SET size = $1", &[&as_i64(size)])
        .await?;
    tx.commit().await?;
    Ok(size)
}

async fn insert_batch(tx: &Transaction<'_>, batch: &[Stored]) -> Result<(), StateError> {
    let indexes: Vec<i64> = batch.iter().map(|s| as_i64(s.index)).collect();
    let entries: Vec<&[u8]> = batch.iter().map(|s| s.entry.as_slice()).collect();
    let leaves: Vec<&[u8]> = batch.iter().map(|s| s.leaf.as_slice()).collect();
    tx.execute(
        "INSERT INTO audit_entries (idx, entry, leaf) \
         SELECT * FROM UNNEST($1::BIGINT[], $2::BYTEA[], $3::BYTEA[])",
        &[&indexes, &entries, &leaves],
    )
    .await?;
    Ok(())
}

/// Every row's leaf hash in index order, as stored (for comparing a copy
/// with its source; [`crate::verify_db`] rehashes the bytes). Reads every
/// row, also any beyond the head.
pub async fn stored_leaves(db: &Db) -> Result<Vec<(u64, Hash)>, StateError> {
    let client = db.client().await?;
    let mut leaves = Vec::new();
    let mut next: i64 = 0;
    loop {
        let rows = client
            .query(
                "SELECT idx, leaf FROM audit_entries WHERE idx >= $1 ORDER BY idx LIMIT $2",
                &[&next, &super::SCAN_PAGE],
            )
            .await?;
        let Some(last) = rows.last() else {
            return Ok(leaves);
        };
        next = last.get::<_, i64>(0) + 1;
        for row in &rows {
            let idx: i64 = row.get(0);
            let leaf: Vec<u8> = row.get(1);
            // The column's CHECK keeps leaves 32 bytes.
            let leaf = Hash::try_from(leaf.as_slice()).unwrap_or([0; 32]);
            leaves.push((u64::try_from(idx).unwrap_or(0), leaf));
        }
    }
}

#[cfg(test)]
mod tests;
