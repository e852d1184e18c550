//! `[state]`: where the state database is and how to reach it, validated
//! into a tokio-postgres config with its password and TLS.
//!
//! Where each connection parameter comes from, first match wins:
//! - host: the URL, then `PGHOST` (comma-separated hosts allowed);
//! - port: the URL (a URL host without a port means 5432), then `PGPORT`
//!   (read only when the URL names no host), then 5432;
//! - user: the URL, then `PGUSER`;
//! - database: the URL, then `PGDATABASE`, then the user's name;
//! - password: `password_file`, then `PGPASSWORD`, else none (trust or
//!   peer authentication). A password in the URL is refused.
//!
//! TLS comes from the URL's `sslmode` alone (no `PGSSLMODE`), so the
//! config file says how the gateway talks to its database. Other libpq
//! variables (`PGOPTIONS`, `PGPASSFILE`, ...) are not read.

mod files;
mod url;

use std::fmt;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use tokio_postgres::config::Host;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StateError;
use crate::tls;

/// The schema when the settings name none.
pub const DEFAULT_SCHEMA: &str = "bulkhead";
const DEFAULT_POOL_SIZE: usize = 8;
/// PostgreSQL's default `max_connections` is 100 for every replica
/// together; more than this per replica is a typo.
const POOL_SIZE: RangeInclusive<usize> = 1..=256;
const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
const CONNECT_TIMEOUT_MS: RangeInclusive<u64> = 100..=60_000;
const DEFAULT_STATEMENT_TIMEOUT_MS: u64 = 10_000;
/// 0 would mean no timeout in PostgreSQL; control-plane statements are small.
const STATEMENT_TIMEOUT_MS: RangeInclusive<u64> = 10..=600_000;
/// Longest schema name: PostgreSQL's identifier limit (NAMEDATALEN - 1).
const MAX_SCHEMA_BYTES: usize = 63;
/// `application_name` when the URL sets none (shows in `pg_stat_activity`).
const APPLICATION_NAME: &str = "bulkhead";

/// The state database settings (`[state]` in gateway.toml). Relative paths
/// are taken as given (the gateway joins them to its config folder first).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PgSettings {
    /// `postgres://USER@HOST:PORT/DATABASE?sslmode=MODE` (or
    /// `postgresql://`), without a password. `sslmode`: `disable`,
    /// `prefer` (the default: TLS when the server offers it, unverified),
    /// `require` (TLS, unverified: stops eavesdropping, not impostors) or
    /// `verify-full` (TLS, the certificate checked against `tls_ca` or the
    /// system's roots and the host name).
    pub url: String,
    /// A file holding the password (one line; a trailing newline is fine).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// PEM certificates of the CA(s) that sign the server's certificate;
    /// only with `sslmode=verify-full` (default: the system's roots).
    #[serde(default)]
    pub tls_ca: Option<PathBuf>,
    /// The schema holding all of Bulkhead's tables (`[a-z_][a-z0-9_]*`, at
    /// most 63 bytes, not `pg_*`); created and migrated on connect.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// Most connections this replica holds in its pool.
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Longest wait for a connection: connecting, TLS and login together,
    /// and for a free one when all `pool_size` are busy.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// The server cancels a statement that runs longer (`statement_timeout`).
    #[serde(default = "default_statement_timeout_ms")]
    pub statement_timeout_ms: u64,
}

fn default_schema() -> String {
    DEFAULT_SCHEMA.to_string()
}
fn default_pool_size() -> usize {
    DEFAULT_POOL_SIZE
}
fn default_connect_timeout_ms() -> u64 {
    DEFAULT_CONNECT_TIMEOUT_MS
}
fn default_statement_timeout_ms() -> u64 {
    DEFAULT_STATEMENT_TIMEOUT_MS
}

/// How the connection uses TLS (the URL's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it; the certificate is not checked.
    Prefer,
    /// TLS or no connection; the certificate is not checked.
    Require,
    /// TLS with the certificate chain and host name checked.
    VerifyFull,
}

/// The settings checked and read: everything a connection needs.
pub(crate) struct Resolved {
    /// Host, port, user, database, password, `sslmode` and timeouts; no
    /// session options (see [`Resolved::session_config`]).
    config: tokio_postgres::Config,
    pub(crate) ssl_mode: SslMode,
    pub(crate) tls: MakeRustlsConnect,
    pub(crate) schema: String,
    /// `host:port` for errors and logs.
    pub(crate) target: String,
    pub(crate) pool_size: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout_ms: u64,
}

impl PgSettings {
    /// Settings for `url` with every other field at its default.
    pub fn new(url: impl Into<String>) -> PgSettings {
        PgSettings {
            url: url.into(),
            password_file: None,
            tls_ca: None,
            schema: default_schema(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            statement_timeout_ms: DEFAULT_STATEMENT_TIMEOUT_MS,
        }
    }

    /// Checks everything [`crate::Db::connect`] will use without
    /// connecting: the URL, the environment, the files, the numbers.
    pub fn validate(&self) -> Result<(), StateError> {
        self.resolve().map(drop)
    }

    pub(crate) fn resolve(&self) -> Result<Resolved, StateError> {
        self.resolve_with(&|name| std::env::var(name).ok())
    }

    /// [`PgSettings::resolve`] with `env` for the environment (tests).
    pub(crate) fn resolve_with(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Resolved, StateError> {
        check_schema(&self.schema)?;
        check_range("pool_size", self.pool_size, POOL_SIZE)?;
        check_range(
            "connect_timeout_ms",
            self.connect_timeout_ms,
            CONNECT_TIMEOUT_MS,
        )?;
        check_range(
            "statement_timeout_ms",
            self.statement_timeout_ms,
            STATEMENT_TIMEOUT_MS,
        )?;
        let env = |name: &str| env(name).filter(|value| !value.is_empty());

        let (mut config, ssl_mode) = url::parse(&self.url)?;
        url::fill_from_env(&mut config, &env)?;
        if let Some(path) = &self.password_file {
            config.password(files::read_password(path)?);
        } else if let Some(password) = env("PGPASSWORD") {
            config.password(password);
        }
        let tls_ca = match (&self.tls_ca, ssl_mode) {
            (None, _) => None,
            (Some(path), SslMode::VerifyFull) => Some(files::read_tls_ca(path)?),
            (Some(_), mode) => {
                return Err(StateError::Config {
                    key: "tls_ca",
                    why: format!(
                        "is used only to verify the server (sslmode=verify-full); `url` has \
                         sslmode={}: add ?sslmode=verify-full or drop `tls_ca`",
                        mode.name()
                    ),
                });
            }
        };
        config.ssl_mode(ssl_mode.wire());
        let connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        // Per address tried; `Db` bounds the whole connect (TLS, login) too.
        config.connect_timeout(connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name(APPLICATION_NAME);
        }
        Ok(Resolved {
            target: target(&config),
            tls: tls::connector(ssl_mode, tls_ca)?,
            config,
            ssl_mode,
            schema: self.schema.clone(),
            pool_size: self.pool_size,
            connect_timeout,
            statement_timeout_ms: self.statement_timeout_ms,
        })
    }
}

/// Never shows a password, even one the URL should not hold.
impl fmt::Debug for PgSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgSettings")
            .field("url", &url::redact(&self.url))
            .field("password_file", &self.password_file)
            .field("tls_ca", &self.tls_ca)
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .finish()
    }
}

impl Resolved {
    /// The connection config for one session: every query's unqualified
    /// names resolve in the schema (`search_path`), and the server cancels
    /// statements running longer than `statement_timeout_ms`.
    pub(crate) fn session_config(&self, statement_timeout_ms: u64) -> tokio_postgres::Config {
        let mut config = self.config.clone();
        // The schema is checked to be `[a-z_][a-z0-9_]*`: no quoting or
        // escaping needed. Later `-c` options win over the URL's.
        let ours = format!(
            "-c search_path={} -c statement_timeout={statement_timeout_ms}",
            self.schema
        );
        let options = match config.get_options() {
            Some(theirs) if !theirs.trim().is_empty() => format!("{theirs} {ours}"),
            _ => ours,
        };
        config.options(options);
        config
    }

    pub(crate) fn user(&self) -> &str {
        self.config.get_user().unwrap_or_default()
    }
}

/// Shows whether a password is set, never the password.
impl fmt::Debug for Resolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("target", &self.target)
            .field("user", &self.config.get_user())
            .field("dbname", &self.config.get_dbname())
            .field(
                "password",
                &self.config.get_password().map(|_| "<redacted>"),
            )
            .field("ssl_mode", &self.ssl_mode)
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("statement_timeout_ms", &self.statement_timeout_ms)
            .finish()
    }
}

impl SslMode {
    /// What tokio-postgres does: `verify-full` is `require` with a
    /// verifying TLS connector.
    fn wire(self) -> tokio_postgres::config::SslMode {
        match self {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyFull => tokio_postgres::config::SslMode::Require,
        }
    }

    /// The `sslmode` value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

fn check_schema(schema: &str) -> Result<(), StateError> {
    let mut chars = schema.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let why = if !first_ok || !rest_ok || schema.len() > MAX_SCHEMA_BYTES {
        "must be 1 to 63 of a-z 0-9 _, not starting with a digit"
    } else if schema.starts_with("pg_") || schema == "information_schema" {
        "is reserved by PostgreSQL for its own schemas"
    } else {
        return Ok(());
    };
    Err(StateError::Config {
        key: "schema",
        why: format!(
            "`{}` {why} (the default is `{DEFAULT_SCHEMA}`)",
            schema.escape_debug()
        ),
    })
}

fn check_range<T: PartialOrd + fmt::Display>(
    key: &'static str,
    value: T,
    range: RangeInclusive<T>,
) -> Result<(), StateError> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(StateError::Config {
        key,
        why: format!(
            "is {value}; it must be from {} to {}",
            range.start(),
            range.end()
        ),
    })
}

/// `host:port` of each host (or the Unix socket), comma-separated.
fn target(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        let addrs = config.get_hostaddrs().iter();
        addrs
            .enumerate()
            .map(|(i, addr)| std::net::SocketAddr::new(*addr, port(i)).to_string())
            .collect()
    } else {
        let hosts = config.get_hosts().iter().enumerate();
        hosts
            .map(|(i, host)| match host {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", port(i)),
                Host::Tcp(name) => format!("{name}:{}", port(i)),
                Host::Unix(dir) => format!("{}/.s.PGSQL.{}", dir.display(), port(i)),
            })
            .collect()
    };
    hosts.join(",")
}

#[cfg(test)]
mod tests;
