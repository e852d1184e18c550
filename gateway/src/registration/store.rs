//! Where API registrations are kept: this gateway's registry folder, or
//! the state database every replica shares.

use std::path::PathBuf;

use bulkhead_state::Db;

use super::{Record, RegistrationError, RegistryDb, RegistryDir};

/// Where to open the registrations (`[models] registry` or `[state]`).
#[derive(Clone, Debug)]
pub(crate) enum RegistrySource {
    Dir(PathBuf),
    Db(Db),
}

/// The open store.
#[derive(Debug)]
pub(crate) enum RegistryStore {
    Dir(RegistryDir),
    Db(RegistryDb),
}

impl RegistryStore {
    /// Opens the store and reads every record in it.
    pub async fn open(source: RegistrySource) -> Result<(Self, Vec<Record>), RegistrationError> {
        match source {
            RegistrySource::Dir(root) => {
                let (dir, records) = tokio::task::spawn_blocking(move || RegistryDir::open(&root))
                    .await
                    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
                Ok((RegistryStore::Dir(dir), records))
            }
            RegistrySource::Db(db) => {
                let db = RegistryDb::new(db);
                let records = db.read_all().await?;
                Ok((RegistryStore::Db(db), records))
            }
        }
    }

    /// Whether another replica registered `name` already (the caller
    /// checked this gateway's own registrations).
    pub async fn taken_elsewhere(&self, name: &str) -> Result<bool, RegistrationError> {
        match self {
            RegistryStore::Dir(_) => Ok(false),
            RegistryStore::Db(db) => db.exists(name).await,
        }
    }

    /// Stores a new registration (the caller checked its name is free
    /// here; the database also checks every replica's).
    pub async fn insert(&self, record: &Record) -> Result<(), RegistrationError> {
        match self {
            RegistryStore::Dir(dir) => dir.write(record),
            RegistryStore::Db(db) => db.insert(record).await,
        }
    }

    /// Removes `name`'s registration (already gone is fine).
    pub async fn remove(&self, name: &str) -> Result<(), RegistrationError> {
        match self {
            RegistryStore::Dir(dir) => dir.remove(name),
            RegistryStore::Db(db) => db.remove(name).await,
        }
    }

    /// The shared store, whose changes other replicas make too.
    pub fn shared(&self) -> Option<&RegistryDb> {
        match self {
            RegistryStore::Dir(_) => None,
            RegistryStore::Db(db) => Some(db),
        }
    }
}
