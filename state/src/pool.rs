//! [`Db`]: the pool of connections to the state database, all in the
//! configured schema, and [`Dedicated`] connections outside it for LISTEN.

use std::fmt;
use std::sync::Arc;

use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use tokio::sync::mpsc;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Client, Connection, Notification, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StateError;
use crate::migrate::{self, Migrated};
use crate::settings::{PgSettings, Resolved};

/// Notifications a [`Dedicated`] connection buffers for a slow reader.
/// Past this the connection is closed: the reader sees its channel end,
/// exactly as when the network fails, reconnects and rereads the state it
/// caches (a missed notification is never silent).
pub const NOTIFICATION_BUFFER: usize = 1024;

/// Statement timeout of the migrating session: a migration (or waiting on
/// another replica's, which holds the lock) may outlast a control-plane
/// statement; a replica wedged while holding the lock still fails the
/// others' start after this, with an error that says so.
const MIGRATION_STATEMENT_TIMEOUT_MS: u64 = 600_000;

/// The state database: a bounded pool of connections whose `search_path`
/// is the configured schema, migrated to [`crate::SCHEMA_VERSION`].
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    shared: Arc<Shared>,
}

struct Shared {
    resolved: Resolved,
    migrated: Migrated,
}

/// A connection outside the pool, for `LISTEN`: its notifications arrive on
/// `notifications`, which ends when the connection does (then reconnect).
#[derive(Debug)]
pub struct Dedicated {
    /// The connection (`search_path` and `statement_timeout` as the pool's).
    pub client: Client,
    /// Its `NOTIFY`s, at most [`NOTIFICATION_BUFFER`] unread.
    pub notifications: mpsc::Receiver<Notification>,
}

/// A connection's I/O half (its TLS stream type is private to the crate).
type PgConnection = Connection<Socket, <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream>;

impl Db {
    /// Checks `settings`, connects once (within `connect_timeout_ms`, so a
    /// dead database is a clear [`StateError::Unavailable`] naming
    /// host:port), creates and migrates the schema (once across replicas
    /// starting together), and refuses a schema newer than this build.
    pub async fn connect(settings: &PgSettings) -> Result<Db, StateError> {
        let resolved = settings.resolve()?;
        let migrated = {
            // A session of its own: closing it frees the migration lock
            // whatever happened, and its longer statement timeout stays
            // out of the pool.
            let mut client = session(&resolved, MIGRATION_STATEMENT_TIMEOUT_MS).await?;
            migrate::run(&mut client, &resolved.schema).await?
        };
        let manager = Manager::from_config(
            resolved.session_config(resolved.statement_timeout_ms),
            resolved.tls.clone(),
            // A connection the server closed is dropped when returned; one
            // dead without notice fails its first statement, which says
            // unavailable (no probe round trip on every checkout).
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let bound = Some(resolved.connect_timeout);
        let pool = Pool::builder(manager)
            .max_size(resolved.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(bound)
            .create_timeout(bound)
            .recycle_timeout(bound)
            .build()
            .map_err(|e| StateError::Config {
                key: "pool_size",
                why: format!("the pool cannot be built: {e}"),
            })?;
        tracing::info!(
            target = %resolved.target,
            schema = %resolved.schema,
            from_version = migrated.from_version,
            to_version = migrated.to_version,
            "state database connected"
        );
        Ok(Db {
            pool,
            shared: Arc::new(Shared { resolved, migrated }),
        })
    }

    /// A pooled connection, waiting at most `connect_timeout_ms` for one
    /// to be free or made.
    pub async fn client(&self) -> Result<Object, StateError> {
        let resolved = &self.shared.resolved;
        self.pool.get().await.map_err(|e| {
            let ms = resolved.connect_timeout.as_millis();
            let why = match e {
                PoolError::Timeout(TimeoutType::Wait) => format!(
                    "all {} pooled connections stayed busy for {ms} ms (raise `pool_size`, or \
                     look for slow statements)",
                    resolved.pool_size
                ),
                PoolError::Timeout(TimeoutType::Create) => {
                    format!("no new connection within {ms} ms (connect_timeout_ms)")
                }
                PoolError::Timeout(TimeoutType::Recycle) => {
                    format!("a pooled connection did not answer within {ms} ms")
                }
                PoolError::Backend(e) => return StateError::connect(&resolved.target, &e),
                other => other.to_string(),
            };
            StateError::Unavailable {
                target: resolved.target.clone(),
                why,
            }
        })
    }

    /// A connection outside the pool (see [`Dedicated`]), within
    /// `connect_timeout_ms`.
    pub async fn dedicated(&self) -> Result<Dedicated, StateError> {
        let resolved = &self.shared.resolved;
        let (client, connection) = open(resolved, resolved.statement_timeout_ms).await?;
        let (sender, notifications) = mpsc::channel(NOTIFICATION_BUFFER);
        tokio::spawn(forward(connection, sender, resolved.target.clone()));
        Ok(Dedicated {
            client,
            notifications,
        })
    }

    /// The schema every connection uses.
    pub fn schema(&self) -> &str {
        &self.shared.resolved.schema
    }

    /// `host:port` of the database (for logs).
    pub fn target(&self) -> &str {
        &self.shared.resolved.target
    }

    /// What [`Db::connect`] found and left.
    pub fn migrated(&self) -> Migrated {
        self.shared.migrated
    }
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Db")
            .field("settings", &self.shared.resolved)
            .field("migrated", &self.shared.migrated)
            .field("pool", &self.pool.status())
            .finish()
    }
}

/// One connection with the session settings of `resolved`, within its
/// connect timeout (name resolution, TCP, TLS and login together).
async fn open(
    resolved: &Resolved,
    statement_timeout_ms: u64,
) -> Result<(Client, PgConnection), StateError> {
    let config = resolved.session_config(statement_timeout_ms);
    let connect = config.connect(resolved.tls.clone());
    match tokio::time::timeout(resolved.connect_timeout, connect).await {
        Ok(Ok(pair)) => Ok(pair),
        Ok(Err(e)) => Err(StateError::connect(&resolved.target, &e)),
        Err(_) => Err(StateError::Unavailable {
            target: resolved.target.clone(),
            why: format!(
                "no answer within {} ms (connect_timeout_ms; sslmode={}, user {})",
                resolved.connect_timeout.as_millis(),
                resolved.ssl_mode.name(),
                resolved.user()
            ),
        }),
    }
}

/// A connection of its own (not pooled), its I/O running on a task until
/// the client is dropped.
pub(crate) async fn session(
    resolved: &Resolved,
    statement_timeout_ms: u64,
) -> Result<Client, StateError> {
    let (client, connection) = open(resolved, statement_timeout_ms).await?;
    tokio::spawn(drive(connection, resolved.target.clone()));
    Ok(client)
}

/// Runs a connection that expects no notifications until it ends.
async fn drive(connection: PgConnection, target: String) {
    if let Err(e) = connection.await {
        tracing::debug!(%target, error = %crate::error::error_text(&e), "state connection ended");
    }
}

/// Runs a dedicated connection, passing its notifications on; closes it
/// when the reader is gone or [`NOTIFICATION_BUFFER`] behind.
async fn forward(mut connection: PgConnection, sender: mpsc::Sender<Notification>, target: String) {
    while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
        match message {
            Ok(AsyncMessage::Notification(notification)) => match sender.try_send(notification) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(
                        %target,
                        buffer = NOTIFICATION_BUFFER,
                        "LISTEN connection closed: its reader fell behind"
                    );
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            },
            Ok(AsyncMessage::Notice(notice)) => {
                tracing::debug!(%target, %notice, "state database notice");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(
                    %target,
                    error = %crate::error::error_text(&e),
                    "LISTEN connection lost"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
