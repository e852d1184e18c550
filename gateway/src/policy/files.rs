//! The policy files as they are on disk: one serde struct per file kind,
//! `deny_unknown_fields` everywhere so a typo is an error, not a silent default.
//! Fields that later checks point at are `Spanned`, so errors carry
//! `file:line:col`.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::SourceFile;
use crate::auth::JwtFile;

/// `gateway.toml`: process-wide settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayFile {
    /// Address the HTTP API listens on, `HOST:PORT` (default `127.0.0.1:8080`;
    /// `bulkhead serve --listen` overrides it).
    pub listen: Option<Spanned<String>>,
    /// Largest request body any tenant may send, in bytes (tenants may lower it).
    pub max_body_bytes: Option<Spanned<u64>>,
    /// Longest a request may take end to end before it fails with 504.
    pub request_timeout_ms: Option<Spanned<u64>>,
    /// Clock skew allowed when checking `exp`, `nbf` and `iat`, in seconds.
    pub jwt_leeway_s: Option<Spanned<u64>>,
    /// A remote gpu-host. Absent: the gateway starts a local one (`[local_gpu_host]`).
    pub upstream: Option<UpstreamFile>,
    /// Several remote gpu-hosts (`[[gpu_hosts]]`), each shaped like
    /// `[upstream]` plus a `name`; instead of `[upstream]`.
    #[serde(default)]
    pub gpu_hosts: Vec<UpstreamFile>,
    /// The local gpu-host child started when no `[upstream]` is configured.
    pub local_gpu_host: Option<LocalGpuHostFile>,
    /// Tenant plugins (`[plugins]`).
    pub plugins: Option<PluginsGatewayFile>,
    /// The audit log (`[audit]`).
    pub audit: Option<AuditGatewayFile>,
    /// Model registration (`[models]`).
    pub models: Option<ModelsGatewayFile>,
    /// The operator API's listener (`[admin]`).
    pub admin: Option<AdminFile>,
    /// Who may call the operator API (`[operator]`).
    pub operator: Option<OperatorFile>,
    /// Limits on client connections (`[connections]`).
    pub connections: Option<ConnectionsFile>,
    /// Where tenants' limits are kept (`[limits]`).
    pub limits: Option<LimitStoreFile>,
    /// Where the control-plane state shared by replicas is kept (`[state]`).
    pub state: Option<StateFile>,
    /// OpenTelemetry trace export (`[telemetry]`). Read at start, before
    /// the rest of the policy; the `OTEL_*` variables override it.
    pub telemetry: Option<Spanned<bulkhead_telemetry::TelemetryFile>>,
    /// Log lines (`[log]`). Read at start.
    pub log: Option<LogFile>,
    /// Usage kept for billing (`[usage]`).
    pub usage: Option<UsageFile>,
}

/// `[usage]` in `gateway.toml`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageFile {
    /// Folder where hourly usage is journaled so it survives a restart,
    /// relative to the policy folder unless absolute, and outside it;
    /// created (0700) if missing; one gateway each. Unset: usage counts
    /// since the process started. Read at start only.
    pub dir: Option<Spanned<PathBuf>>,
}

/// `[log]` in `gateway.toml`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFile {
    /// `text` (default) or `json`: one object per line with `trace_id` and
    /// `span_id` inside a traced request.
    pub format: Option<bulkhead_telemetry::LogFormat>,
}

/// `[state]` in `gateway.toml`: where the control-plane state lives. Read
/// at start only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    /// `"files"` (default: each store its own folder) or
    /// `postgres://USER@HOST:PORT/DATABASE?sslmode=MODE`.
    pub store: Option<Spanned<String>>,
    /// The database password, never in the URL.
    pub password_file: Option<Spanned<PathBuf>>,
    /// PEM roots for `sslmode=verify-full` instead of the system's.
    pub tls_ca: Option<Spanned<PathBuf>>,
    /// The schema holding Bulkhead's tables (default `bulkhead`).
    pub schema: Option<Spanned<String>>,
    /// Most connections of this replica (default 8).
    pub pool_size: Option<Spanned<usize>>,
    /// Longest wait for a connection (default 5000).
    pub connect_timeout_ms: Option<Spanned<u64>>,
    /// Longest a statement may run (default 10000).
    pub statement_timeout_ms: Option<Spanned<u64>>,
}

/// `[limits]` in `gateway.toml`: where tenants' limit state lives. Read at
/// start only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitStoreFile {
    /// `"memory"` (default) or `redis://HOST:PORT/DB` / `rediss://...`.
    pub store: Option<Spanned<String>>,
    /// The Redis password (or ACL user's), never in the URL.
    pub password_file: Option<Spanned<PathBuf>>,
    /// PEM roots for `rediss://` instead of the system's.
    pub tls_ca: Option<Spanned<PathBuf>>,
    /// What every key starts with (default `bulkhead`).
    pub key_prefix: Option<Spanned<String>>,
    /// Gateway replicas sharing the store: each falls back to 1/N.
    pub replicas: Option<Spanned<u32>>,
    /// `"local"` (default) or `"deny"`.
    pub on_store_error: Option<Spanned<String>>,
    /// Longest a request waits on the store (default 20).
    pub store_timeout_ms: Option<Spanned<u64>>,
    /// Concurrency leases lapse this long after their last renewal
    /// (default 15000).
    pub lease_ttl_ms: Option<Spanned<u64>>,
}

/// `[connections]` in `gateway.toml`: what one client connection may hold,
/// so no anonymous client can take the listeners from everyone else. Read
/// at start only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionsFile {
    /// Time a client has to send a whole request head, in milliseconds; a
    /// connection that has not by then is closed (default 10000).
    pub header_read_timeout_ms: Option<Spanned<u64>>,
    /// Time a client has to send a whole request body once its head is
    /// in, in milliseconds (default 30000); past it the request gets 408.
    /// Unlike the rest of the table, follows reloads.
    pub body_read_timeout_ms: Option<Spanned<u64>>,
    /// Client connections open at once on the tenants' listener (default
    /// 8192); past it new ones are closed at once.
    pub max_connections: Option<Spanned<u64>>,
    /// Client connections open at once from one IP address (default 512).
    pub max_connections_per_ip: Option<Spanned<u64>>,
    /// Requests in flight at once on one HTTP/2 connection (default 64).
    pub http2_max_concurrent_streams: Option<Spanned<u32>>,
}

/// `[admin]` in `gateway.toml`: the listener of the operator API and
/// `/metrics`, apart from the tenants' one. Read at start only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    /// `HOST:PORT`, or `unix:PATH` for a Unix socket (made 0600); default
    /// `127.0.0.1:8081`. `bulkhead serve --admin-listen` overrides it.
    pub listen: Option<Spanned<String>>,
}

/// `[operator]` in `gateway.toml`: the operators' identity providers. Their
/// tokens are accepted on the operator API only, and tenants' tokens never
/// are, whatever they claim.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorFile {
    /// `[[operator.issuers]]`: each shaped like a tenant's `[jwt]`, with an
    /// issuer no tenant uses. None: no operator token verifies.
    #[serde(default)]
    pub issuers: Vec<JwtFile>,
}

/// `[models]` in `gateway.toml`: registrations made through the admin API.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsGatewayFile {
    /// Folder where models registered through the admin API are kept (one
    /// JSON file each), relative to the policy folder unless absolute, and
    /// outside it; created (0700) if missing. Unset: `POST
    /// /admin/v1/models` answers 501. Read at start only.
    pub registry: Option<Spanned<PathBuf>>,
}

/// `[audit]` in `gateway.toml`: the tamper-evident audit log. Read at start
/// only.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditGatewayFile {
    /// The log folder, relative to the policy folder unless absolute, and
    /// outside it; created (0700) if missing. Required in `[audit]`.
    pub dir: Option<Spanned<PathBuf>>,
    /// The Ed25519 signing key (PKCS#8 PEM). Default: `DIR/audit.key.pem`,
    /// generated at first start.
    pub key: Option<Spanned<PathBuf>>,
    /// The checkpoints' origin line and key name (default
    /// `bulkhead.local/audit`): no spaces, no `+`.
    pub origin: Option<Spanned<String>>,
}

/// `[plugins]` in `gateway.toml`: gateway-wide plugin settings.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginsGatewayFile {
    /// Folder of the tenant plugin store (uploads, compiled artifacts),
    /// relative to the policy folder unless absolute; created (0700) if
    /// missing. Unset: the plugin upload API is off. Read at start only.
    pub store: Option<Spanned<PathBuf>>,
    /// `[plugins.maximums]`: the most any tenant's `[plugins.limits.NAME]`
    /// may set; unset fields are the plugin host's ceilings.
    pub maximums: Option<PluginLimitsFile>,
    /// Most plugin hook runs at once, all tenants together (each may burn
    /// a core up to its deadline). Default: the cores minus one, at least
    /// one. Read at start only.
    pub max_concurrent_calls: Option<Spanned<u64>>,
}

/// `[upstream]` (or one `[[gpu_hosts]]`) in `gateway.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// The host's name in the admin API, logs and metrics (required in
    /// `[[gpu_hosts]]`; `[upstream]`'s is `upstream`).
    pub name: Option<Spanned<String>>,
    /// `unix:PATH`, `tcp:IP:PORT` or `tcp:NAME:PORT` (looked up at every
    /// connection).
    pub target: Spanned<String>,
    /// File holding the bearer secret the gpu-host expects (required for `tcp:`).
    pub secret_file: Option<Spanned<PathBuf>>,
    /// `tcp:` over TLS: the CA (PEM) the host's certificate must chain to.
    pub tls_ca: Option<Spanned<PathBuf>>,
    /// The gateway's own certificate chain (PEM), when the host asks for
    /// one (mutual TLS); with `tls_key`.
    pub tls_cert: Option<Spanned<PathBuf>>,
    /// The private key (PEM) of `tls_cert`.
    pub tls_key: Option<Spanned<PathBuf>>,
    /// The name the host's certificate must carry (default: the target's
    /// IP address, which the certificate then holds as an IP SAN).
    pub tls_server_name: Option<Spanned<String>>,
    /// Reach a `tcp:` host without TLS: the secret and every prompt cross
    /// the network in the clear. Default false.
    pub allow_plaintext: Option<Spanned<bool>>,
    /// Models the gateway has the remote gpu-host load (`dir` is a path on
    /// that host, so it must be absolute; the signature is read here).
    #[serde(default)]
    pub models: Vec<ModelFile>,
}

/// `[local_gpu_host]` in `gateway.toml`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalGpuHostFile {
    /// Path of the `bulkhead-gpu-host` binary (default: next to `bulkhead`).
    pub binary: Option<Spanned<PathBuf>>,
    /// CPU backend threads (default: all cores).
    pub threads: Option<Spanned<usize>>,
    /// Generations that run at once: the host's batch width (`--max-batch`).
    pub workers: Option<Spanned<usize>>,
    /// Requests that may wait for a worker.
    pub queue_capacity: Option<Spanned<usize>>,
    /// Longest wait between restarts of a crashed child, in milliseconds.
    pub restart_backoff_max_ms: Option<Spanned<u64>>,
    /// Bytes per second the child re-hashes resident weights (0: off;
    /// default: the gpu-host's, 64 MiB/s).
    pub scrub_bytes_per_s: Option<Spanned<u64>>,
    /// Bytes per second the child's scrub keeps at normal priority when no
    /// CPU is idle (at most `scrub_bytes_per_s`; 0: idle time only;
    /// default: the gpu-host's, an eighth of the rate).
    pub scrub_min_bytes_per_s: Option<Spanned<u64>>,
    /// The device tenants' `[gpu]` tables are checked against: `"cpu"`
    /// (default: `threads` cores, or all) or `"mi325x"`.
    pub device: Option<Spanned<String>>,
    /// `device = "cpu"` only: host RAM for weights and KV caches, e.g.
    /// `"32GiB"`; the child gets what the model reservation leaves as its
    /// `--kv-memory` (default: the reservation plus the gpu-host's default
    /// KV memory, a quarter of the machine's memory, at most 4 GiB).
    pub memory: Option<Spanned<String>>,
    /// Device memory set aside for model weights and charged to no tenant,
    /// e.g. `"20GiB"` (default: the model files' sizes).
    pub model_reservation: Option<Spanned<String>>,
    /// Models the child serves.
    #[serde(default)]
    pub models: Vec<ModelFile>,
}

/// One `[[local_gpu_host.models]]` (or `[[upstream.models]]`) entry: a
/// signed model folder. The gateway has the gpu-host load it only when the
/// signature verifies with a publisher's key in `trust.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// The name tenants ask for (`model` in requests).
    pub name: Spanned<String>,
    /// The model folder, signed as a whole (`bulkhead model sign DIR`),
    /// relative to the policy folder unless absolute.
    pub dir: Option<Spanned<PathBuf>>,
    /// The GGUF file inside `dir`, as the manifest names it (default: the
    /// only `.gguf` file in the manifest).
    pub file: Option<Spanned<String>>,
    /// The signature bundle of `dir`, relative to the policy folder unless
    /// absolute.
    pub signature: Option<Spanned<PathBuf>>,
    /// Refused: the unsigned form of earlier versions (a bare GGUF path).
    /// Kept in the shape only to answer it with how to sign the model.
    pub path: Option<Spanned<PathBuf>>,
}

/// `tenants/ID.toml`: one tenant.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFile {
    /// The tenant id; must match the file name (`tenants/ID.toml`).
    pub id: Spanned<String>,
    /// A class in `classes/` whose limits this tenant inherits.
    pub class: Option<Spanned<String>>,
    /// Models this tenant may use.
    #[serde(default)]
    pub models: Vec<Spanned<String>>,
    /// How this tenant's tokens are verified.
    pub jwt: JwtFile,
    /// Limits; each one set here overrides the class's.
    #[serde(default)]
    pub limits: LimitsFile,
    /// The tenant's plugin chains.
    #[serde(default)]
    pub plugins: TenantPluginsFile,
    /// The tenant's compute and memory on the gpu-host (`[gpu]`); absent:
    /// the shared pool with weight 1.
    pub gpu: Option<Spanned<GpuFile>>,
    /// How its prompts are tokenized (`[prompts]`).
    #[serde(default)]
    pub prompts: PromptsFile,
    /// What its traces may hold (`[telemetry]`).
    #[serde(default)]
    pub telemetry: TenantTelemetryFile,
}

/// `[telemetry]` in a tenant file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTelemetryFile {
    /// Whether this tenant's prompt and completion text go into its
    /// request spans (`gen_ai.input.messages`, `gen_ai.output.messages`)
    /// when traces are exported. Default false: never.
    pub record_content: Option<bool>,
}

/// `[prompts]` in a tenant file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptsFile {
    /// Whether a control token spelled in a raw `/v1/completions` prompt
    /// (`<|eot_id|>`, `<|im_start|>`, …) becomes that control token
    /// (default false: it is text). Chat message content is always text.
    pub parse_special: Option<bool>,
}

/// `[gpu]` in a tenant file. Checked against the device (over-subscription
/// is an error) and enforced by the gpu-host, which plans the same tenant
/// set against its own cores and KV memory.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFile {
    /// Compute units (cores on the CPU): a dedicated partition's size, or a
    /// shared tenant's cap within the pool.
    pub cus: Option<Spanned<u32>>,
    /// The same as a fraction of the device's compute units, in (0, 1],
    /// rounded down; instead of `cus`.
    pub share: Option<Spanned<f64>>,
    /// KV-cache memory, e.g. `"24GiB"`: a whole number and one of B, KiB,
    /// MiB, GiB, TiB, kB, MB, GB, TB. Required when dedicated.
    pub hbm: Option<Spanned<String>>,
    /// `"dedicated"` (its own compute and memory) or `"shared"` (default).
    pub isolation: Option<Spanned<IsolationFile>>,
    /// Weight for fair sharing in the shared pool (default 1).
    pub weight: Option<Spanned<u32>>,
    /// How long a request that fits the tenant's KV budget, but not what
    /// its other requests leave of it, waits before 429
    /// `kv_budget_exceeded` (default 10000; at most 120000).
    pub kv_wait_ms: Option<Spanned<u64>>,
}

/// `isolation` in `[gpu]`.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum IsolationFile {
    Dedicated,
    Shared,
}

/// `[plugins]` in a tenant file: which uploaded plugins run on each hook, in
/// order, and each plugin's config and limits.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantPluginsFile {
    /// Plugins whose `on-request` runs, in order, before the request reaches
    /// the model.
    #[serde(default)]
    pub on_request: Vec<Spanned<String>>,
    /// Plugins whose `on-response` runs on whole responses, in order; on
    /// streams the same plugins run `on-chunk` per delta and `on-stream-end`.
    #[serde(default)]
    pub on_response: Vec<Spanned<String>>,
    /// `[plugins.config.NAME]`: the values `host.config` returns to plugin
    /// NAME (strings; numbers and booleans are passed as their TOML text).
    #[serde(default)]
    pub config: BTreeMap<String, Spanned<BTreeMap<String, Spanned<toml::Value>>>>,
    /// `[plugins.limits.NAME]`: plugin NAME's limits, each at most the
    /// gateway's maximum.
    #[serde(default)]
    pub limits: BTreeMap<String, Spanned<PluginLimitsFile>>,
    /// Ed25519 public keys (SPKI PEM files, relative to the policy folder
    /// unless absolute). When any is listed, an upload must carry a
    /// signature by one of them over its SHA-256 digest.
    #[serde(default)]
    pub signing_keys: Vec<Spanned<PathBuf>>,
    /// Plugin uploads and deletes allowed per minute (default 10, refilled
    /// continuously; at most 1000): each is compiled and fsync'd into the
    /// audit log, so a tenant cannot flood either.
    pub changes_per_min: Option<Spanned<u32>>,
}

/// `[plugins.limits.NAME]` in a tenant file; unset fields take the defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginLimitsFile {
    /// Time each hook call may run, in milliseconds.
    pub deadline_ms: Option<Spanned<u64>>,
    /// Linear memory the instance may grow to, in MiB.
    pub max_memory_mib: Option<Spanned<u64>>,
    /// Size of one hook's result, in bytes.
    pub max_output_bytes: Option<Spanned<u64>>,
    /// Log volume for one request's instance, in bytes.
    pub max_log_bytes: Option<Spanned<u64>>,
    /// Elements any one table may grow to.
    pub max_table_elements: Option<Spanned<u64>>,
}

/// `[limits]` in a tenant or class file; unset fields fall back to the
/// class, then to [`Limits::DEFAULT`](super::Limits::DEFAULT).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// Sustained requests per second (GCRA).
    pub requests_per_s: Option<Spanned<u32>>,
    /// Requests that may arrive at once above the sustained rate.
    pub burst: Option<Spanned<u32>>,
    /// Prompt + completion tokens per minute.
    pub tokens_per_min: Option<Spanned<u64>>,
    /// Requests in flight at once.
    pub max_concurrent: Option<Spanned<u32>>,
    /// Largest request body, in bytes (at most the gateway's `max_body_bytes`).
    pub max_body_bytes: Option<Spanned<u64>>,
    /// Largest `max_tokens` a request may ask for (also the default).
    pub max_tokens: Option<Spanned<u32>>,
    /// Apply the rate limits per `sub` claim instead of per tenant.
    pub per_sub: Option<bool>,
}

/// `classes/NAME.toml`: limits shared by every tenant with `class = "NAME"`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassFile {
    #[serde(default)]
    pub limits: LimitsFile,
}

/// `trust.toml`: trusted model publishers. A model is served only when one
/// of their keys verifies its signature (may be empty: then no model is).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustFile {
    #[serde(default)]
    pub publishers: Vec<PublisherFile>,
}

/// One `[[publishers]]` entry of `trust.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublisherFile {
    /// The publisher's name, shown with every model it signed.
    pub name: Spanned<String>,
    /// SPKI PEM public key (ECDSA P-256 or Ed25519), relative to the policy
    /// folder unless absolute.
    pub public_key: Spanned<PathBuf>,
}

/// One policy file: its text, and its contents when it parsed.
#[derive(Debug)]
pub(super) struct Parsed<T> {
    pub source: Arc<SourceFile>,
    /// `None` when the file has syntax or shape errors (already reported).
    pub doc: Option<T>,
}

/// Everything read from a policy folder, before cross-file checks.
#[derive(Debug, Default)]
pub(super) struct Folder {
    /// `None`: there is no `gateway.toml` (defaults apply).
    pub gateway: Option<Parsed<GatewayFile>>,
    /// `None`: there is no `trust.toml`.
    pub trust: Option<Parsed<TrustFile>>,
    /// Sorted by file name.
    pub classes: Vec<Parsed<ClassFile>>,
    /// Sorted by file name.
    pub tenants: Vec<Parsed<TenantFile>>,
    /// Every file read, relative to the folder, with the SHA-256 of its bytes.
    pub files: Vec<(PathBuf, [u8; 32])>,
}

/// An I/O error in words, without the `(os error N)` suffix.
pub(super) fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::NotFound => "no such file or folder".to_string(),
        io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => e.to_string(),
    }
}
