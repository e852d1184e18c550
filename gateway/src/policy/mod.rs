//! Policy: the operator's TOML files (`gateway.toml`, `trust.toml`,
//! `classes/*.toml`, `tenants/*.toml`), parsed and validated as a whole into
//! one immutable [`Policy`] ([`load`]). Every error carries `file:line:col`.
//! [`watch`] rebuilds on change and publishes only snapshots that built.

mod files;
mod gpu;
mod load;
mod models;
mod names;
mod plugins;
mod restrict;

#[cfg(test)]
mod test_folder;
mod trust;
mod validate;
mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bulkhead_partition::{GpuRequest, Layout};
use bulkhead_protocol::Target;

use crate::auth::{self, JwtFile};
use crate::plugins::{PluginConfig, PluginLimits};

pub use crate::limits::Limits;
pub use crate::registration::{Publisher, Trust};
pub use crate::source::{PolicyError, PolicyErrors, SourceFile};
pub use crate::upstream::LocalGpuHost;
pub use files::{
    AdminFile, AuditGatewayFile, ClassFile, ConnectionsFile, GatewayFile, GpuFile, IsolationFile,
    LimitsFile, LocalGpuHostFile, ModelFile, ModelsGatewayFile, OperatorFile, PluginLimitsFile,
    PluginsGatewayFile, PublisherFile, TenantFile, TenantPluginsFile, TrustFile, UpstreamFile,
};
pub use load::{MAX_CLASS_FILES, MAX_FILE_BYTES, MAX_TENANT_FILES, file_digests, load};
pub use models::MAX_CONFIGURED_MODELS;
pub use plugins::{
    MAX_CHAIN_PLUGINS, MAX_CONFIG_ENTRIES, MAX_CONFIG_KEY_BYTES, MAX_CONFIG_VALUE_BYTES,
    MAX_PLUGIN_DEADLINE, MAX_PLUGIN_LOG_BYTES, MAX_PLUGIN_OUTPUT_BYTES,
};
pub use restrict::only_restricts;
pub use trust::MAX_PUBLISHERS;
pub use watch::{PolicyWatcher, RELOAD_DEBOUNCE, RELOAD_MAX_DELAY, ReloadStats, watch};

/// Where the HTTP API listens when neither `gateway.toml` nor `--listen` says.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Where the operator API and `/metrics` listen when neither `[admin]
/// listen` nor `--admin-listen` says: loopback, a port of its own.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";

/// An address a listener binds: TCP, or a Unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl ListenAddr {
    /// `HOST:PORT` (an IP address), or `unix:PATH`.
    pub fn parse(text: &str) -> Result<ListenAddr, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(
                    "`unix:` needs a socket path, e.g. unix:/run/bulkhead/admin.sock".into(),
                );
            }
            return Ok(ListenAddr::Unix(PathBuf::from(path)));
        }
        text.parse().map(ListenAddr::Tcp).map_err(|_| {
            format!(
                "`{text}` is not a listen address: expected IP:PORT (e.g. {DEFAULT_ADMIN_LISTEN}) \
                 or unix:PATH"
            )
        })
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<ListenAddr, String> {
        ListenAddr::parse(text)
    }
}

/// `[connections]` with defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A request head must arrive within this, or the connection closes.
    pub header_read_timeout: Duration,
    /// A request body must arrive within this of its head, or 408.
    pub body_read_timeout: Duration,
    /// Open client connections on the tenants' listener.
    pub max_connections: usize,
    /// Open client connections from one IP address.
    pub max_connections_per_ip: usize,
    /// Requests at once on one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
}

impl ConnectionLimits {
    /// A slowloris client holds a connection at most this long without a
    /// whole request head; real clients send theirs in one packet.
    pub const DEFAULT: ConnectionLimits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
        max_connections: 8192,
        max_connections_per_ip: 512,
        http2_max_concurrent_streams: 64,
    };
}

/// `[operator]` of `gateway.toml`: the issuers whose tokens the operator
/// API accepts.
#[derive(Clone, Debug)]
pub struct OperatorPolicy {
    /// `[[operator.issuers]]`, in file order; empty: no operator token
    /// verifies.
    pub issuers: Vec<JwtFile>,
    /// `gateway.toml`, for error locations.
    pub source: Arc<SourceFile>,
}

/// Everything `bulkhead policy check` verifies about the folder `dir`.
pub fn check(dir: &Path) -> Result<Policy, PolicyErrors> {
    let policy = load(dir)?;
    // Key files are read and checked by the module that uses them.
    crate::auth::Verifiers::build(&policy.auth()).map_err(PolicyErrors)?;
    Ok(policy)
}

/// A validated policy folder. Immutable: a reload builds a new one.
#[derive(Debug)]
pub struct Policy {
    /// The folder it was read from (relative paths in it are resolved against it).
    pub dir: PathBuf,
    pub gateway: GatewaySettings,
    /// Who may call the operator API.
    pub operator: OperatorPolicy,
    /// Tenants by id.
    pub tenants: BTreeMap<String, TenantPolicy>,
    /// Every policy file read (relative to `dir`, sorted as read), with the
    /// SHA-256 of its bytes (for the audit log and to tell a real change from
    /// a touch). The upstream secret file is not listed: a digest of a short
    /// secret would help guess it.
    pub files: Vec<(PathBuf, [u8; 32])>,
    /// The partitions the tenants' `[gpu]` tables give the local gpu-host's
    /// device (`None` with a remote upstream, whose device is not known
    /// here). The gpu-host plans the same tenant set itself, against its own
    /// cores and KV memory (`reconcile`).
    pub partitions: Option<Arc<Layout>>,
    /// `trust.toml`: the publishers whose keys may sign served models.
    pub trust: Trust,
    /// The models gateway.toml configures, each verified with `trust`, in
    /// file order.
    pub models: Vec<Arc<crate::registration::Registration>>,
}

impl Policy {
    /// What `auth` builds its verifiers from: the operator's issuers, then
    /// every tenant's `[jwt]`, each with the file it is written in.
    pub fn auth(&self) -> auth::Config<'_> {
        let operator = self.operator.issuers.iter().map(|jwt| auth::Issuer {
            jwt,
            owner: auth::Owner::Operator,
            source: &self.operator.source,
        });
        let tenants = self.tenants.values().map(|t| auth::Issuer {
            jwt: &t.jwt,
            owner: auth::Owner::Tenant(t.id.clone()),
            source: &t.source,
        });
        auth::Config {
            dir: &self.dir,
            leeway: self.gateway.jwt_leeway,
            issuers: operator.chain(tenants).collect(),
        }
    }

    /// What `limits` builds its limiters from: every tenant's limits.
    pub fn limits(&self) -> impl Iterator<Item = (&str, &Limits)> {
        self.tenants.values().map(|t| (t.id.as_str(), &t.limits))
    }

    /// Tenants with a plugin chain: they share the plugin instance pool.
    pub fn tenants_with_plugins(&self) -> usize {
        self.tenants
            .values()
            .filter(|t| !t.plugins.is_empty())
            .count()
    }
}

/// `gateway.toml`, with defaults applied.
#[derive(Clone, Debug)]
pub struct GatewaySettings {
    pub listen: SocketAddr,
    /// `[admin] listen`: the operator API and `/metrics`.
    pub admin_listen: ListenAddr,
    /// `[connections]`.
    pub connections: ConnectionLimits,
    /// `[limits]`: where tenants' limits are kept.
    pub limit_store: crate::limits::LimitStore,
    pub max_body_bytes: u64,
    pub request_timeout: Duration,
    pub jwt_leeway: Duration,
    pub upstream: UpstreamSettings,
    pub plugins: GatewayPlugins,
    /// `[audit]`, paths resolved; `None`: no audit log.
    pub audit: Option<crate::audit::AuditSettings>,
    /// `[state]`: the PostgreSQL store replicas share; `None`: files.
    pub state: Option<bulkhead_state::PgSettings>,
    /// `[models] registry` (absolute): where API registrations are kept;
    /// `None`: registering through the API is off.
    pub models_registry: Option<PathBuf>,
    /// `[usage] dir` (absolute): the usage journal; `None`: in memory.
    pub usage_dir: Option<PathBuf>,
}

/// `[plugins]` of `gateway.toml`, with paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayPlugins {
    /// The plugin store folder (absolute); `None`: uploads are off.
    pub store: Option<PathBuf>,
    /// The most any tenant may give one plugin; the defaults are clamped to
    /// these too.
    pub maximums: PluginLimits,
    /// Most hook runs at once, gateway-wide (`plugins::HookGate`).
    pub max_concurrent_calls: usize,
}

impl Default for GatewayPlugins {
    fn default() -> Self {
        GatewayPlugins {
            store: None,
            maximums: plugins::ceilings(),
            max_concurrent_calls: crate::plugins::default_gate_slots(),
        }
    }
}

/// How the gateway reaches its gpu-hosts.
#[derive(Clone, Debug)]
pub enum UpstreamSettings {
    /// gpu-hosts someone else runs: `[upstream]` (one, named `upstream`)
    /// or `[[gpu_hosts]]`.
    Remote(Vec<RemoteHost>),
    /// A child process the gateway starts and restarts.
    Local(LocalGpuHost),
}

/// One remote gpu-host.
#[derive(Clone, Debug)]
pub struct RemoteHost {
    /// Its name in the admin API, logs and metrics.
    pub name: String,
    pub target: Target,
    /// The bearer secret (read from `secret_file`).
    pub secret: Option<String>,
    /// TLS to a `tcp:` host (`tls_ca`, and `tls_cert`/`tls_key` for
    /// mutual TLS); `None` on a Unix socket or with `allow_plaintext`.
    pub tls: Option<bulkhead_protocol::ClientTls>,
    /// The configured models it loads (`[[gpu_hosts.models]]`); models
    /// registered through the API go to every host.
    pub models: BTreeSet<String>,
}

/// Most `[[gpu_hosts]]` one gateway reaches.
pub const MAX_GPU_HOSTS: usize = 64;

/// One tenant, with its limits resolved (tenant over class over defaults).
#[derive(Clone, Debug)]
pub struct TenantPolicy {
    pub id: String,
    pub models: BTreeSet<String>,
    /// The `[jwt]` table as written; `auth` turns it into verifiers and points
    /// errors into `source`.
    pub jwt: JwtFile,
    pub limits: Limits,
    /// Plugin chains (empty: no plugin runs).
    pub plugins: TenantPlugins,
    /// Its `[gpu]` request (the default: shared, weight 1).
    pub gpu: GpuRequest,
    /// `[prompts] parse_special`: control tokens spelled in a raw prompt
    /// are control tokens (default: text).
    pub parse_special: bool,
    /// `[telemetry] record_content`: its prompt and completion text go
    /// into its exported request spans (default: never).
    pub record_content: bool,
    /// The tenant file, for error locations.
    pub source: Arc<SourceFile>,
}

/// A tenant's `[plugins]`: the chains, and the settings of every plugin in
/// them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantPlugins {
    /// `on-request` hooks, in the order they run.
    pub on_request: Vec<Arc<str>>,
    /// `on-response` (whole) or `on-chunk` + `on-stream-end` (streams) hooks,
    /// in the order they run.
    pub on_response: Vec<Arc<str>>,
    /// Config and limits of every plugin named in a chain.
    pub settings: BTreeMap<Arc<str>, PluginSettings>,
    /// Keys one of which must have signed an upload; empty: unsigned
    /// uploads are accepted.
    pub signing_keys: Vec<ed25519_dalek::VerifyingKey>,
    /// `changes_per_min`; `None`: [`DEFAULT_PLUGIN_CHANGES_PER_MIN`].
    pub changes_per_min: Option<u32>,
}

/// Plugin uploads and deletes a tenant may make per minute by default.
pub const DEFAULT_PLUGIN_CHANGES_PER_MIN: u32 = 10;

impl TenantPlugins {
    /// Whether any plugin runs for this tenant.
    pub fn is_empty(&self) -> bool {
        self.on_request.is_empty() && self.on_response.is_empty()
    }
}

/// One plugin's settings in a tenant's policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginSettings {
    pub config: Arc<PluginConfig>,
    pub limits: PluginLimits,
}
