//! Tenant plugins in PostgreSQL, one copy for every gateway replica
//! (`bulkhead_plugin_host::SharedPlugins`):
//!
//! ```text
//! plugin_blobs           (digest, bytes)                 uploaded bytes, once per SHA-256
//! plugin_entries         (tenant, name, digest, size_bytes, created_at, uploaded_by, version)
//! plugin_version_floors  (tenant, name, version)         signed versions of deleted plugins
//! ```
//!
//! **A change is one transaction, serialized per tenant across replicas**
//! by a transaction-level advisory lock on the schema and tenant: the
//! version and cap checks read what the previous change of that tenant
//! committed. The blob of a replaced or deleted entry is removed in the
//! same transaction when no entry refers to it any more (a blob another
//! tenant's change just took is kept: its foreign key refuses the removal,
//! which is rolled back to a savepoint). The transaction ends with a
//! `NOTIFY` on [`PLUGINS_TOPIC`] carrying the tenant, sent at commit;
//! [`follow_plugins`] turns notices into refreshes of the local index.
//!
//! The registry calls this store from blocking threads; it runs its
//! queries on a small runtime of its own (one worker), as the audit store
//! does. Any database error is [`StoreError::Unavailable`]: nothing was
//! changed, and a retry may work.

use std::future::Future;

use bulkhead_plugin_host::{
    Listing, LoadFailure, MAX_COMPONENT_BYTES, MAX_PLUGINS_PER_TENANT,
    MAX_VERSION_FLOORS_PER_TENANT, PluginDigest, PluginName, SharedEntry, SharedPlugins, SharedPut,
    StoreError, StoredBlob, UploadOutcome,
};
use tokio::runtime::Runtime;
use tokio_postgres::error::SqlState;

use crate::{Db, PgSettings, PooledClient, StateError};

mod follow;
mod import;

pub use follow::{PLUGIN_RESYNC, follow_plugins};
pub use import::{PluginImportError, PluginsImported, import_plugins};

/// The [`crate::listen`] topic of plugin changes; a notice's payload is the
/// tenant whose plugins changed (empty: reread every tenant).
pub const PLUGINS_TOPIC: &str = "plugins";

/// Tries of a change that PostgreSQL aborted as a deadlock or
/// serialization failure (two tenants' changes swapping blobs).
const CHANGE_TRIES: usize = 3;

/// Tenant plugins in the state database.
#[derive(Debug)]
pub struct PgPlugins {
    /// `None` only while dropping.
    runtime: Option<Runtime>,
    db: Db,
    place: String,
}

/// Why a change's transaction ended without a commit.
enum Abort {
    /// The rules refused it (a cap, a version): said to the uploader.
    Refused(StoreError),
    Db(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Abort {
    fn from(e: tokio_postgres::Error) -> Abort {
        Abort::Db(e)
    }
}

impl From<StateError> for Abort {
    fn from(e: StateError) -> Abort {
        match e {
            StateError::Query(e) => Abort::Db(e),
            other => Abort::Refused(StoreError::Unavailable(other.to_string())),
        }
    }
}

impl PgPlugins {
    /// Connects (migrating the schema) on the store's own runtime, within
    /// the settings' `connect_timeout_ms`.
    pub fn open(settings: &PgSettings) -> Result<PgPlugins, StateError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bulkhead-plugins-db")
            .enable_all()
            .build()
            .map_err(|e| StateError::Unavailable {
                target: "the plugin store's runtime".into(),
                why: e.to_string(),
            })?;
        let db = runtime.block_on(Db::connect(settings))?;
        let place = format!("PostgreSQL {} schema `{}`", db.target(), db.schema());
        Ok(PgPlugins {
            runtime: Some(runtime),
            db,
            place,
        })
    }

    /// The pool (for [`follow_plugins`]'s LISTEN).
    pub fn db(&self) -> &Db {
        &self.db
    }

    fn run<T>(&self, work: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        self.runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(work)
    }

    async fn client(&self) -> Result<PooledClient, StoreError> {
        self.db.client().await.map_err(|e| self.unavailable(e))
    }

    fn unavailable(&self, error: impl Into<StateError>) -> StoreError {
        StoreError::Unavailable(format!("{}: {}", self.place, error.into()))
    }

    /// Runs one change's transaction, again when PostgreSQL aborted it as a
    /// deadlock or serialization failure.
    async fn change<T, F>(
        &self,
        mut attempt: impl FnMut(PooledClient) -> F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, Abort>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            match attempt(self.client().await?).await {
                Ok(done) => return Ok(done),
                Err(Abort::Refused(e)) => return Err(e),
                Err(Abort::Db(e)) if tries < CHANGE_TRIES && retryable(&e) => {
                    tracing::debug!(store = %self.place, error = %e, "plugin change retried");
                }
                Err(Abort::Db(e)) => return Err(self.unavailable(e)),
            }
        }
    }

    async fn put_once(
        &self,
        mut client: PooledClient,
        put: SharedPut<'_>,
    ) -> Result<(UploadOutcome, SharedEntry), Abort> {
        let new = put.entry;
        let (tenant, name) = (new.tenant.as_str(), new.name.as_str());
        let mut tx = client.transaction().await?;
        lock_tenant(&tx, self.db.schema(), tenant).await?;
        let existing = self.entry_for_update(&tx, tenant, &new.name).await?;
        let stored_version = match &existing {
            Some(existing) => existing.version,
            None => floor(&tx, tenant, name).await?,
        };
        if let (Some(offered), Some(stored)) = (new.version, stored_version)
            && offered <= stored
        {
            return Err(Abort::Refused(StoreError::VersionNotNewer {
                name: name.to_string(),
                stored,
                offered,
            }));
        }
        if existing.is_none() {
            let held: i64 = tx
                .query_one(
                    "SELECT count(*) FROM plugin_entries WHERE tenant = $1",
                    &[&tenant],
                )
                .await?
                .get(0);
            if held >= MAX_PLUGINS_PER_TENANT as i64 {
                return Err(Abort::Refused(StoreError::TooManyPlugins {
                    max: MAX_PLUGINS_PER_TENANT,
                }));
            }
        }
        let digest = new.digest.to_string();
        // Written every time, also over the same bytes another tenant
        // stored: skipping the write would make this upload quicker, and
        // tell the tenant that someone runs them. `blob_written`: the bytes
        // were not there, or were others (the row was edited; replicas
        // refused it and now load it again).
        let blob_written: bool = tx
            .query_one(
                "WITH prior AS (SELECT bytes FROM plugin_blobs WHERE digest = $1) \
                 INSERT INTO plugin_blobs (digest, bytes) VALUES ($1, $2) \
                 ON CONFLICT (digest) DO UPDATE SET bytes = EXCLUDED.bytes \
                 RETURNING NOT EXISTS (SELECT 1 FROM prior WHERE prior.bytes = $2)",
                &[&digest, &put.bytes],
            )
            .await?
            .get(0);
        if let Some(existing) = &existing
            && existing.digest == new.digest
            && new.version.is_none()
            && !blob_written
        {
            tx.commit().await?;
            return Ok((UploadOutcome::Unchanged, existing.clone()));
        }
        tx.execute(
            "INSERT INTO plugin_entries \
             (tenant, name, digest, size_bytes, created_at, uploaded_by, version) \
             VALUES ($1, $2, $3, $4, $5, $6, $7::TEXT::NUMERIC) \
             ON CONFLICT (tenant, name) DO UPDATE SET digest = EXCLUDED.digest, \
             size_bytes = EXCLUDED.size_bytes, created_at = EXCLUDED.created_at, \
             uploaded_by = EXCLUDED.uploaded_by, version = EXCLUDED.version",
            &[
                &tenant,
                &name,
                &digest,
                &as_i64(new.size_bytes),
                &as_i64(new.created_at),
                &new.uploaded_by,
                &new.version.map(|v| v.to_string()),
            ],
        )
        .await?;
        if existing.is_none() && new.version.is_some() {
            // The entry now carries a version above the floor; an unsigned
            // one leaves the floor where it is (as the folder store does).
            tx.execute(
                "DELETE FROM plugin_version_floors WHERE tenant = $1 AND name = $2",
                &[&tenant, &name],
            )
            .await?;
        }
        if let Some(previous) = &existing
            && previous.digest != new.digest
        {
            collect(&mut tx, &previous.digest.to_string()).await?;
        }
        crate::notify(&*tx, self.db.schema(), PLUGINS_TOPIC, tenant).await?;
        tx.commit().await?;
        let outcome = if existing.is_some() {
            UploadOutcome::Replaced
        } else {
            UploadOutcome::Created
        };
        Ok((outcome, new.clone()))
    }

    async fn delete_once(
        &self,
        mut client: PooledClient,
        tenant: &str,
        name: &PluginName,
    ) -> Result<SharedEntry, Abort> {
        let mut tx = client.transaction().await?;
        lock_tenant(&tx, self.db.schema(), tenant).await?;
        let Some(existing) = self.entry_for_update(&tx, tenant, name).await? else {
            return Err(Abort::Refused(StoreError::NotFound {
                name: name.to_string(),
            }));
        };
        if let Some(version) = existing.version {
            let remembered = floor(&tx, tenant, name.as_str()).await?.is_some();
            if !remembered {
                let held: i64 = tx
                    .query_one(
                        "SELECT count(*) FROM plugin_version_floors WHERE tenant = $1",
                        &[&tenant],
                    )
                    .await?
                    .get(0);
                if held >= MAX_VERSION_FLOORS_PER_TENANT as i64 {
                    return Err(Abort::Refused(StoreError::TooManyVersionFloors {
                        max: MAX_VERSION_FLOORS_PER_TENANT,
                    }));
                }
            }
            tx.execute(
                "INSERT INTO plugin_version_floors (tenant, name, version) \
                 VALUES ($1, $2, $3::TEXT::NUMERIC) ON CONFLICT (tenant, name) \
                 DO UPDATE SET version = GREATEST(plugin_version_floors.version, EXCLUDED.version)",
                &[&tenant, &name.as_str(), &version.to_string()],
            )
            .await?;
        }
        tx.execute(
            "DELETE FROM plugin_entries WHERE tenant = $1 AND name = $2",
            &[&tenant, &name.as_str()],
        )
        .await?;
        collect(&mut tx, &existing.digest.to_string()).await?;
        crate::notify(&*tx, self.db.schema(), PLUGINS_TOPIC, tenant).await?;
        tx.commit().await?;
        Ok(existing)
    }

    /// `tenant`'s entry `name`, locked until the transaction ends.
    async fn entry_for_update(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        tenant: &str,
        name: &PluginName,
    ) -> Result<Option<SharedEntry>, Abort> {
        let row = tx
            .query_opt(
                &format!("{SELECT_ENTRIES} WHERE tenant = $1 AND name = $2 FOR UPDATE"),
                &[&tenant, &name.as_str()],
            )
            .await?;
        match row.map(|row| entry(&row)) {
            None => Ok(None),
            Some(Ok(entry)) => Ok(Some(entry)),
            Some(Err(failure)) => Err(Abort::Refused(StoreError::Unavailable(format!(
                "{}: the stored entry is not valid ({}); delete it with SQL or re-upload \
                 after fixing it",
                self.place, failure.reason
            )))),
        }
    }
}

/// The entry columns, in the order [`entry`] reads them.
const SELECT_ENTRIES: &str = "SELECT tenant, name, digest, size_bytes, created_at, uploaded_by, \
                              version::TEXT FROM plugin_entries";

impl SharedPlugins for PgPlugins {
    fn place(&self) -> &str {
        &self.place
    }

    fn entries(&self, tenant: Option<&str>) -> Result<Listing, StoreError> {
        self.run(async {
            let client = self.client().await?;
            let rows = match tenant {
                Some(tenant) => {
                    client
                        .query(
                            &format!("{SELECT_ENTRIES} WHERE tenant = $1 ORDER BY tenant, name"),
                            &[&tenant],
                        )
                        .await
                }
                None => {
                    client
                        .query(&format!("{SELECT_ENTRIES} ORDER BY tenant, name"), &[])
                        .await
                }
            }
            .map_err(|e| self.unavailable(e))?;
            let mut listing = Listing::default();
            for row in &rows {
                match entry(row) {
                    Ok(entry) => listing.entries.push(entry),
                    Err(failure) => listing.unreadable.push(failure),
                }
            }
            Ok(listing)
        })
    }

    fn blob(&self, digest: PluginDigest) -> Result<StoredBlob, StoreError> {
        self.run(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT octet_length(bytes)::BIGINT, \
                     CASE WHEN octet_length(bytes) <= $2 THEN bytes END \
                     FROM plugin_blobs WHERE digest = $1",
                    &[&digest.to_string(), &(MAX_COMPONENT_BYTES as i32)],
                )
                .await
                .map_err(|e| self.unavailable(e))?;
            Ok(match row {
                None => StoredBlob::Missing,
                Some(row) => match row.get::<_, Option<Vec<u8>>>(1) {
                    Some(bytes) => StoredBlob::Bytes(bytes),
                    None => StoredBlob::TooLarge {
                        size_bytes: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
                    },
                },
            })
        })
    }

    fn put(&self, put: SharedPut<'_>) -> Result<(UploadOutcome, SharedEntry), StoreError> {
        self.run(self.change(|client| self.put_once(client, put)))
    }

    fn delete(&self, tenant: &str, name: &PluginName) -> Result<SharedEntry, StoreError> {
        self.run(self.change(|client| self.delete_once(client, tenant, name)))
    }
}

impl Drop for PgPlugins {
    fn drop(&mut self) {
        // May run inside async code, where a blocking shutdown would panic.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Serializes `tenant`'s changes until the transaction ends (advisory
/// locks are per database: the key names the schema too).
async fn lock_tenant(
    tx: &deadpool_postgres::Transaction<'_>,
    schema: &str,
    tenant: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        &[&format!("bulkhead-plugins {schema} {tenant}")],
    )
    .await?;
    Ok(())
}

/// The floor of `tenant`'s deleted `name`, if one is kept.
async fn floor(
    tx: &deadpool_postgres::Transaction<'_>,
    tenant: &str,
    name: &str,
) -> Result<Option<u64>, Abort> {
    let row = tx
        .query_opt(
            "SELECT version::TEXT FROM plugin_version_floors WHERE tenant = $1 AND name = $2",
            &[&tenant, &name],
        )
        .await?;
    match row {
        None => Ok(None),
        Some(row) => row.get::<_, String>(0).parse().map(Some).map_err(|_| {
            Abort::Refused(StoreError::Unavailable(
                "a version floor is not a version".into(),
            ))
        }),
    }
}

/// Removes the blob `digest` if no entry refers to it. A concurrent change
/// of another tenant that just took it makes the foreign key refuse the
/// removal: then it stays, rolled back to a savepoint.
async fn collect(
    tx: &mut deadpool_postgres::Transaction<'_>,
    digest: &str,
) -> Result<(), tokio_postgres::Error> {
    let savepoint = tx.savepoint("collect_blob").await?;
    let removed = savepoint
        .execute(
            "DELETE FROM plugin_blobs WHERE digest = $1 \
             AND NOT EXISTS (SELECT 1 FROM plugin_entries WHERE digest = $1)",
            &[&digest],
        )
        .await;
    match removed {
        Ok(_) => savepoint.commit().await,
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => savepoint.rollback().await,
        Err(e) => Err(e),
    }
}

/// One row of [`SELECT_ENTRIES`], checked: the database is not trusted to
/// hold what the gateway wrote.
fn entry(row: &tokio_postgres::Row) -> Result<SharedEntry, LoadFailure> {
    let tenant: String = row.get(0);
    let name: String = row.get(1);
    let failure = |reason: String| LoadFailure {
        tenant: tenant.clone(),
        name: name.clone(),
        reason,
    };
    let digest: String = row.get(2);
    let digest = PluginDigest::from_hex(&digest).ok_or_else(|| {
        failure(format!(
            "its digest `{}` is not 64 hex digits",
            digest.escape_debug()
        ))
    })?;
    let plugin = PluginName::parse(&name).map_err(|e| failure(e.to_string()))?;
    let size_bytes =
        u64::try_from(row.get::<_, i64>(3)).map_err(|_| failure("its size is negative".into()))?;
    let created_at = u64::try_from(row.get::<_, i64>(4))
        .map_err(|_| failure("its created_at is negative".into()))?;
    let version = match row.get::<_, Option<String>>(6) {
        None => None,
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|_| failure(format!("its version `{text}` is not a version")))?,
        ),
    };
    Ok(SharedEntry {
        tenant: tenant.clone(),
        name: plugin,
        digest,
        size_bytes,
        created_at,
        uploaded_by: row.get(5),
        version,
    })
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A deadlock or serialization failure: the same change may go through now.
fn retryable(error: &tokio_postgres::Error) -> bool {
    matches!(
        error.code(),
        Some(&SqlState::T_R_DEADLOCK_DETECTED) | Some(&SqlState::T_R_SERIALIZATION_FAILURE)
    )
}

#[cfg(test)]
mod tests;
