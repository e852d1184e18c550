//! The gateway's connection to PostgreSQL, where gateway replicas share
//! their control-plane state (audit log, plugins, model registrations).
//!
//! - [`PgSettings`]: the `[state]` settings, validated (URL without a
//!   password, `password_file`, libpq environment, `sslmode`, schema).
//! - [`Db`]: a bounded pool whose connections all use one schema
//!   (`search_path`), so every query is unqualified; connecting migrates
//!   the schema once across replicas and refuses a newer one.
//! - [`Dedicated`]: a connection outside the pool for `LISTEN`;
//!   [`listen`] and [`notify`]: change notices between replicas.
//! - [`PgAuditStore`]: the audit log's tables, one log for all replicas;
//!   [`verify_db`]: the offline check of it; [`import_log`]: a log
//!   folder's entries copied in (`bulkhead state migrate`).
//! - [`PgPlugins`]: tenant plugins for all replicas (blobs by SHA-256,
//!   per-tenant entries, version floors); [`follow_plugins`]: a replica's
//!   index kept in step; [`import_plugins`]: a plugin store folder copied
//!   in (`bulkhead state migrate`).
//!
//! Why tokio-postgres and deadpool-postgres rather than sqlx: no macros and
//! no database at build time, a small dependency tree, and a plain
//! connection whose `NOTIFY`s we read ourselves (LISTEN must stay on one
//! connection, which a pool does not give).

#![forbid(unsafe_code)]

mod audit;
mod error;
mod listen;
mod migrate;
mod plugins;
mod pool;
mod settings;
mod tls;

#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;

pub use audit::{DbVerified, PgAuditStore, import_log, stored_leaves, verify_db};
pub use error::StateError;
pub use listen::{Change, MAX_PAYLOAD_BYTES, channel, listen, notify};
pub use migrate::{Migrated, SCHEMA_VERSION};
pub use plugins::{
    PLUGIN_RESYNC, PLUGINS_TOPIC, PgPlugins, PluginImportError, PluginsImported, follow_plugins,
    import_plugins,
};
pub use pool::{Db, Dedicated, NOTIFICATION_BUFFER};
pub use settings::{DEFAULT_SCHEMA, PgSettings};

/// The pool's handle on a connection ([`Db::client`]).
pub use deadpool_postgres::Object as PooledClient;
/// The tokio-postgres the pool hands out (its `Client`, `Row`, types).
pub use deadpool_postgres::tokio_postgres;
