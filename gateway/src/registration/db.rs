//! API registrations in the state database (`[state] store =
//! "postgres://..."`), shared by every gateway replica:
//!
//! ```text
//! registrations (name, record, updated_at)   record: the JSON a registry file holds
//! ```
//!
//! A change commits with a `NOTIFY` on the `registrations` topic naming
//! the model, so every replica rereads it at once (and all of them on each
//! periodic resync). As with the folder, nothing read here is trusted:
//! each replica verifies every record's signature against its own
//! `trust.toml` before its model is loaded or served.

use bulkhead_state::{Db, StateError};

use super::disk::{MAX_RECORD_BYTES, VERSION};
use super::{MAX_API_REGISTRATIONS, Record, RegistrationError, valid_model_name};

/// The notice topic; the payload is the model's name.
pub(crate) const TOPIC: &str = "registrations";

/// The registrations table of one state database.
#[derive(Clone, Debug)]
pub(crate) struct RegistryDb {
    db: Db,
}

impl RegistryDb {
    pub fn new(db: Db) -> RegistryDb {
        RegistryDb { db }
    }

    /// The database (for its listener).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Every readable record, by name. Records that cannot be read are
    /// logged and skipped, as in the folder.
    pub async fn read_all(&self) -> Result<Vec<Record>, RegistrationError> {
        let client = self.db.client().await.map_err(unavailable)?;
        let rows = client
            .query(
                "SELECT name, record FROM registrations ORDER BY name LIMIT $1",
                &[&(MAX_API_REGISTRATIONS as i64 + 1)],
            )
            .await
            .map_err(|e| unavailable(e.into()))?;
        let mut records = Vec::new();
        for row in rows {
            let name: String = row.get(0);
            if records.len() >= MAX_API_REGISTRATIONS {
                tracing::error!(
                    model = %name.escape_debug(),
                    "more than {MAX_API_REGISTRATIONS} registrations in the database; not loaded"
                );
                break;
            }
            if let Some(record) = checked(&name, &row.get::<_, String>(1)) {
                records.push(record);
            }
        }
        Ok(records)
    }

    /// `name`'s record, `None` when there is none (or it cannot be read).
    pub async fn read(&self, name: &str) -> Result<Option<Record>, RegistrationError> {
        let client = self.db.client().await.map_err(unavailable)?;
        let row = client
            .query_opt("SELECT record FROM registrations WHERE name = $1", &[&name])
            .await
            .map_err(|e| unavailable(e.into()))?;
        Ok(row.and_then(|row| checked(name, &row.get::<_, String>(0))))
    }

    /// Whether any replica registered `name`.
    pub async fn exists(&self, name: &str) -> Result<bool, RegistrationError> {
        let client = self.db.client().await.map_err(unavailable)?;
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM registrations WHERE name = $1)",
                &[&name],
            )
            .await
            .map_err(|e| unavailable(e.into()))?;
        Ok(row.get(0))
    }

    /// Stores a new registration: refused when the name is taken (by any
    /// replica) or the table is full. One transaction, serialized with the
    /// other writers, whose commit sends the notice.
    pub async fn insert(&self, record: &Record) -> Result<(), RegistrationError> {
        let text = serde_json::to_string(record)
            .map_err(|e| RegistrationError::Unavailable(format!("encoding the record: {e}")))?;
        let mut client = self.db.client().await.map_err(unavailable)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| unavailable(e.into()))?;
        if locked_count(&tx).await? >= MAX_API_REGISTRATIONS as i64 {
            return Err(RegistrationError::TooMany(MAX_API_REGISTRATIONS));
        }
        let inserted = tx
            .execute(
                "INSERT INTO registrations (name, record) VALUES ($1, $2) \
                 ON CONFLICT (name) DO NOTHING",
                &[&record.name, &text],
            )
            .await
            .map_err(|e| unavailable(e.into()))?;
        if inserted == 0 {
            return Err(RegistrationError::Exists(record.name.clone()));
        }
        bulkhead_state::notify(&*tx, self.db.schema(), TOPIC, &record.name)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(|e| unavailable(e.into()))
    }

    /// Removes `name`'s record (already gone is fine), with its notice.
    pub async fn remove(&self, name: &str) -> Result<(), RegistrationError> {
        let mut client = self.db.client().await.map_err(unavailable)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| unavailable(e.into()))?;
        tx.execute("DELETE FROM registrations WHERE name = $1", &[&name])
            .await
            .map_err(|e| unavailable(e.into()))?;
        bulkhead_state::notify(&*tx, self.db.schema(), TOPIC, name)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(|e| unavailable(e.into()))
    }
}

/// What [`import_registry`] copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryImported {
    /// Records written.
    pub copied: usize,
    /// Records the database held already, byte for byte (a rerun).
    pub present: usize,
}

/// Copies every record of the registry folder `root` into the state
/// database (`bulkhead state migrate`), in one transaction: a name the
/// database holds with another record refuses the whole copy. The folder
/// is locked meanwhile, so a gateway using it must be stopped. Signatures
/// are not checked here: every replica verifies each record against its
/// own `trust.toml` before serving it, wherever it came from.
pub async fn import_registry(
    root: &std::path::Path,
    db: &Db,
) -> Result<RegistryImported, RegistrationError> {
    let root = root.to_path_buf();
    let (_dir, records) = tokio::task::spawn_blocking(move || super::RegistryDir::open(&root))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    let mut client = db.client().await.map_err(unavailable)?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| unavailable(e.into()))?;
    locked_count(&tx).await?;
    let mut imported = RegistryImported {
        copied: 0,
        present: 0,
    };
    for record in &records {
        let text = serde_json::to_string(record)
            .map_err(|e| RegistrationError::Unavailable(format!("encoding the record: {e}")))?;
        let held = tx
            .query_opt(
                "SELECT record FROM registrations WHERE name = $1",
                &[&record.name],
            )
            .await
            .map_err(|e| unavailable(e.into()))?;
        match held {
            Some(row)
                if checked(&record.name, &row.get::<_, String>(0)).as_ref() == Some(record) =>
            {
                imported.present += 1;
            }
            // Another registration of the name: nothing is copied.
            Some(_) => return Err(RegistrationError::Exists(record.name.clone())),
            None => {
                tx.execute(
                    "INSERT INTO registrations (name, record) VALUES ($1, $2)",
                    &[&record.name, &text],
                )
                .await
                .map_err(|e| unavailable(e.into()))?;
                imported.copied += 1;
            }
        }
    }
    let count: i64 = tx
        .query_one("SELECT count(*) FROM registrations", &[])
        .await
        .map_err(|e| unavailable(e.into()))?
        .get(0);
    if count > MAX_API_REGISTRATIONS as i64 {
        return Err(RegistrationError::TooMany(MAX_API_REGISTRATIONS));
    }
    // An empty payload: every replica rereads everything.
    bulkhead_state::notify(&*tx, db.schema(), TOPIC, "")
        .await
        .map_err(unavailable)?;
    tx.commit().await.map_err(|e| unavailable(e.into()))?;
    Ok(imported)
}

/// Locks the table against other writers until `tx` ends (so a count
/// cannot be raced past) and counts its rows.
async fn locked_count(
    tx: &bulkhead_state::tokio_postgres::Transaction<'_>,
) -> Result<i64, RegistrationError> {
    tx.batch_execute("LOCK TABLE registrations IN SHARE ROW EXCLUSIVE MODE")
        .await
        .map_err(|e| unavailable(e.into()))?;
    let row = tx
        .query_one("SELECT count(*) FROM registrations", &[])
        .await
        .map_err(|e| unavailable(e.into()))?;
    Ok(row.get(0))
}

/// A stored record, checked as a registry file is; `None` (logged) when it
/// cannot be used.
fn checked(name: &str, text: &str) -> Option<Record> {
    let why = if text.len() as u64 > MAX_RECORD_BYTES {
        format!("larger than {MAX_RECORD_BYTES} bytes")
    } else {
        match serde_json::from_str::<Record>(text) {
            Err(e) => e.to_string(),
            Ok(record) if record.version != VERSION => {
                format!("version {} (this gateway reads {VERSION})", record.version)
            }
            Ok(record) if record.name != name || !valid_model_name(&record.name) => format!(
                "it registers `{}` under the name `{}`",
                record.name.escape_debug(),
                name.escape_debug()
            ),
            Ok(record) => return Some(record),
        }
    };
    tracing::error!(
        model = %name.escape_debug(),
        "a registration in the state database cannot be read, so its model is not loaded \
         (the row is left as it is): {why}"
    );
    None
}

fn unavailable(e: StateError) -> RegistrationError {
    RegistrationError::Unavailable(e.to_string())
}

#[cfg(test)]
mod tests;
