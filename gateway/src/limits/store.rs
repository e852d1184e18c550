//! Where tenants' limit state lives (`[limits]` of `gateway.toml`): in this
//! process (the default), or in Redis shared by every gateway replica.

use std::fmt;
use std::time::Duration;

/// `[limits] store`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LimitStore {
    /// Each gateway process keeps its own limits (one replica).
    #[default]
    Memory,
    /// Replicas share limits through Redis.
    Redis(RedisStore),
}

impl LimitStore {
    /// The share of each tenant's limits the in-memory limiters enforce:
    /// all of it with the memory store, 1/`replicas` of it as Redis's
    /// fallback, so that N replicas falling back at once still admit no
    /// more than the tenant's limits together.
    pub fn local_share(&self) -> u32 {
        match self {
            LimitStore::Memory => 1,
            LimitStore::Redis(redis) => redis.replicas,
        }
    }
}

/// A Redis limit store, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisStore {
    /// `redis://` or `rediss://` URL as written (it holds no password).
    pub url: String,
    /// From `password_file`.
    pub password: Option<String>,
    /// `tls_ca`: PEM roots to trust instead of the system's.
    pub tls_ca: Option<Vec<u8>>,
    /// Every key starts with it (`key_prefix`).
    pub key_prefix: String,
    /// Gateway replicas sharing the store (`replicas`).
    pub replicas: u32,
    /// What admission does while Redis does not answer.
    pub on_error: OnStoreError,
    /// Longest a request waits on Redis (`store_timeout_ms`).
    pub timeout: Duration,
    /// A concurrency lease not renewed for this long is dropped
    /// (`lease_ttl_ms`), freeing the slots of a replica that died.
    pub lease_ttl: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls_ca", &self.tls_ca.as_ref().map(Vec::len))
            .field("key_prefix", &self.key_prefix)
            .field("replicas", &self.replicas)
            .field("on_error", &self.on_error)
            .field("timeout", &self.timeout)
            .field("lease_ttl", &self.lease_ttl)
            .finish()
    }
}

/// `[limits] on_store_error`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStoreError {
    /// Admit with this replica's own limiters at 1/`replicas` of the rates.
    #[default]
    Local,
    /// Refuse with 503 until the store answers again.
    Deny,
}

impl RedisStore {
    /// Defaults of the optional keys.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(20);
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
    pub const DEFAULT_KEY_PREFIX: &str = "bulkhead";
}
