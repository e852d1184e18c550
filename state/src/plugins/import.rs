//! Copying a folder store's plugins into the state database (`bulkhead
//! state migrate`): every entry as it was (digest, size, upload time,
//! uploader, signed version), every blob (hashed again), every version
//! floor, in one transaction. Only into a schema that holds no plugins, or
//! one that holds exactly these (a rerun): anything else is refused rather
//! than mixed in.

use std::collections::BTreeSet;

use bulkhead_plugin_host::{FileStoreContents, PluginDigest, SharedEntry, VersionFloor};

use super::{PLUGINS_TOPIC, SELECT_ENTRIES, as_i64, entry};
use crate::{Db, StateError};

/// What [`import_plugins`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginsImported {
    /// Entries in the schema from the folder.
    pub entries: usize,
    /// Distinct blobs they name.
    pub blobs: usize,
    /// Version floors.
    pub floors: usize,
    /// The schema already held exactly these: nothing was written.
    pub already_there: bool,
}

/// Why plugins were not imported; nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum PluginImportError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("importing plugins into schema `{schema}`: {why}")]
    Refused {
        /// The schema.
        schema: String,
        /// What is wrong and what to do.
        why: String,
    },
}

impl From<tokio_postgres::Error> for PluginImportError {
    fn from(e: tokio_postgres::Error) -> PluginImportError {
        PluginImportError::State(e.into())
    }
}

/// Copies `contents` (from `bulkhead_plugin_host::read_file_store`) into
/// `db`'s plugin tables in one transaction, and tells running replicas to
/// reread everything. Checks first that every entry's blob is given and
/// hashes to its digest. Refuses a schema that already holds other
/// plugins or floors; one that holds exactly these is left as it is
/// ([`PluginsImported::already_there`]).
pub async fn import_plugins(
    db: &Db,
    contents: &FileStoreContents,
) -> Result<PluginsImported, PluginImportError> {
    let refused = |why: String| PluginImportError::Refused {
        schema: db.schema().to_string(),
        why,
    };
    let mut named = BTreeSet::new();
    for entry in &contents.entries {
        let bytes = contents.blobs.get(&entry.digest).ok_or_else(|| {
            refused(format!(
                "{}/{}: its blob sha256 {} is not given",
                entry.tenant, entry.name, entry.digest
            ))
        })?;
        if PluginDigest::of(bytes) != entry.digest {
            return Err(refused(format!(
                "the blob given for sha256 {} does not hash to it",
                entry.digest
            )));
        }
        named.insert(entry.digest);
    }
    let mut entries = contents.entries.clone();
    entries.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
    let mut floors = contents.floors.clone();
    floors.sort();
    let imported = PluginsImported {
        entries: entries.len(),
        blobs: named.len(),
        floors: floors.len(),
        already_there: false,
    };

    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    // Holds off gateways' changes (they take row locks) until the commit.
    tx.batch_execute(
        "LOCK TABLE plugin_entries, plugin_version_floors, plugin_blobs \
         IN SHARE ROW EXCLUSIVE MODE",
    )
    .await?;
    let held = stored_entries(&tx, db.schema()).await?;
    let held_floors = stored_floors(&tx, db.schema()).await?;
    if !held.is_empty() || !held_floors.is_empty() {
        if held == entries && held_floors == floors {
            return Ok(PluginsImported {
                already_there: true,
                ..imported
            });
        }
        return Err(refused(format!(
            "it already holds {} plugins and {} version floors, not the same as the folder's \
             {} and {}: refusing to mix two stores (name an empty schema with --schema)",
            held.len(),
            held_floors.len(),
            entries.len(),
            floors.len()
        )));
    }
    for digest in &named {
        tx.execute(
            "INSERT INTO plugin_blobs (digest, bytes) VALUES ($1, $2) \
             ON CONFLICT (digest) DO UPDATE SET bytes = EXCLUDED.bytes",
            &[&digest.to_string(), &contents.blobs[digest]],
        )
        .await?;
    }
    for entry in &entries {
        tx.execute(
            "INSERT INTO plugin_entries \
             (tenant, name, digest, size_bytes, created_at, uploaded_by, version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7::TEXT::NUMERIC)",
            &[
                &entry.tenant,
                &entry.name.as_str(),
                &entry.digest.to_string(),
                &as_i64(entry.size_bytes),
                &as_i64(entry.created_at),
                &entry.uploaded_by,
                &entry.version.map(|v| v.to_string()),
            ],
        )
        .await?;
    }
    for floor in &floors {
        tx.execute(
            "INSERT INTO plugin_version_floors (tenant, name, version) \
             VALUES ($1, $2, $3::TEXT::NUMERIC)",
            &[
                &floor.tenant,
                &floor.name.as_str(),
                &floor.version.to_string(),
            ],
        )
        .await?;
    }
    // Empty payload: every replica rereads every tenant.
    crate::notify(&*tx, db.schema(), PLUGINS_TOPIC, "").await?;
    tx.commit().await?;
    Ok(imported)
}

/// Every entry, sorted; rows that are not valid entries are an error here
/// (the comparison must be exact).
async fn stored_entries(
    tx: &deadpool_postgres::Transaction<'_>,
    schema: &str,
) -> Result<Vec<SharedEntry>, PluginImportError> {
    let rows = tx.query(SELECT_ENTRIES, &[]).await?;
    let mut entries = rows
        .iter()
        .map(|row| {
            entry(row).map_err(|failure| PluginImportError::Refused {
                schema: schema.to_string(),
                why: format!(
                    "it holds an entry that is not valid ({}/{}: {})",
                    failure.tenant, failure.name, failure.reason
                ),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Rust's order, not the database collation's.
    entries.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
    Ok(entries)
}

async fn stored_floors(
    tx: &deadpool_postgres::Transaction<'_>,
    schema: &str,
) -> Result<Vec<VersionFloor>, PluginImportError> {
    let rows = tx
        .query(
            "SELECT tenant, name, version::TEXT FROM plugin_version_floors",
            &[],
        )
        .await?;
    let mut floors = Vec::with_capacity(rows.len());
    for row in &rows {
        let tenant: String = row.get(0);
        let name: String = row.get(1);
        let version: String = row.get(2);
        match (
            bulkhead_plugin_host::PluginName::parse(&name),
            version.parse::<u64>(),
        ) {
            (Ok(name), Ok(version)) => floors.push(VersionFloor {
                tenant,
                name,
                version,
            }),
            _ => {
                return Err(PluginImportError::Refused {
                    schema: schema.to_string(),
                    why: format!("it holds a version floor that is not valid ({tenant}/{name})"),
                });
            }
        }
    }
    floors.sort();
    Ok(floors)
}
