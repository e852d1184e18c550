//! Checks on the parsed policy files, each alone and across files, and their
//! resolution into the runtime [`Policy`]: defaults applied, limits inherited
//! (tenant over class over [`Limits::DEFAULT`]), paths made absolute.
//!
//! Every check pushes its error and goes on with a stand-in value, so one run
//! reports everything; any error discards the whole result.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::fs;
use std::io::Read;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bulkhead_protocol::{ClientTls, Target};
use toml::Spanned;

use super::files::{
    AdminFile, AuditGatewayFile, ConnectionsFile, GatewayFile, LimitsFile, LocalGpuHostFile,
    ModelsGatewayFile, PluginsGatewayFile, UpstreamFile,
};
use super::load::{Folder, Parsed, io_reason};
use super::models::{HostKind, check_models};
use super::trust::{Trust, check_trust};
use super::{
    ClassFile, ConnectionLimits, DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, GatewayPlugins,
    GatewaySettings, Limits, ListenAddr, LocalGpuHost, OperatorPolicy, Policy, PolicyError,
    SourceFile, TenantFile, TenantPolicy, UpstreamSettings,
};
use crate::registration::{MODEL_NAME_RULE, Registration, valid_model_name};

const DEFAULT_MAX_BODY_BYTES: u64 = 1 << 20;
const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 300_000;
const DEFAULT_JWT_LEEWAY_S: u64 = 30;
/// A longer leeway would keep expired tokens usable for too long.
const MAX_JWT_LEEWAY_S: u64 = 300;
/// Sequences the local host decodes together in one batched step: 16 is
/// where batching's gain levels off on the CPU backend
/// (`tests/bench/batching`), and more only adds KV memory.
const DEFAULT_WORKERS: usize = 16;
const DEFAULT_QUEUE_CAPACITY: usize = 64;
const DEFAULT_RESTART_BACKOFF_MAX_MS: u64 = 5_000;
/// Shortest upstream bearer secret accepted: 128 bits if it is random.
const MIN_SECRET_BYTES: usize = 16;
/// A secret file is a line of text; anything bigger is the wrong file.
const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;
/// Names listed in one error message before the rest is summarised.
const MAX_LISTED_NAMES: usize = 20;

/// Checks `folder` (read from `dir`, which is absolute) and resolves it.
/// The result is meaningful only if `errors` stayed empty.
pub(super) fn validate(dir: &Path, folder: Folder, errors: &mut Vec<PolicyError>) -> Policy {
    let trust = check_trust(dir, folder.trust.as_ref(), errors);
    let mut gateway = check_gateway(dir, folder.gateway.as_ref(), &trust, errors);
    let models = std::mem::take(&mut gateway.models);
    let classes = check_classes(&folder.classes, &gateway, errors);
    let mut gpu = GpuChecks::default();
    let tenants = check_tenants(dir, folder.tenants, &classes, &gateway, &mut gpu, errors);
    // Planned only from values that checked, or its errors would echo theirs.
    let partitions = match &gateway.device {
        Some((device, reservation)) if gpu.all_valid => {
            super::gpu::plan_partitions(device, *reservation, &tenants, &gpu.spans, errors)
        }
        _ => None,
    };
    Policy {
        dir: dir.to_path_buf(),
        gateway: gateway.settings,
        operator: gateway.operator,
        tenants,
        files: folder.files,
        partitions,
        trust,
        models,
    }
}

/// What the tenants' `[gpu]` checks leave for planning.
struct GpuChecks {
    /// Tenant → where its `[gpu]` table is (for errors about it).
    spans: BTreeMap<String, Range<usize>>,
    /// Every `[gpu]` table's values checked.
    all_valid: bool,
}

impl Default for GpuChecks {
    fn default() -> Self {
        GpuChecks {
            spans: BTreeMap::new(),
            all_valid: true,
        }
    }
}

/// `gateway.toml` resolved, plus what the other files are checked against.
struct Gateway {
    settings: GatewaySettings,
    /// Models tenants may name; `None` when any valid name may be (models
    /// registered through the API are not known here, or gateway.toml
    /// itself is broken).
    served_models: Option<BTreeSet<String>>,
    /// The configured models that verified.
    models: Vec<Arc<Registration>>,
    /// The body size no tenant may exceed; `None` when gateway.toml is broken.
    body_cap: Option<u64>,
    /// Limits of a tenant and class that set none.
    default_limits: Limits,
    /// The local gpu-host's device and model reservation, when gateway.toml
    /// parsed and they checked; `None` with a remote upstream.
    device: Option<(bulkhead_partition::Device, u64)>,
    /// `[operator]`.
    operator: OperatorPolicy,
}

fn check_gateway(
    dir: &Path,
    parsed: Option<&Parsed<GatewayFile>>,
    trust: &Trust,
    errors: &mut Vec<PolicyError>,
) -> Gateway {
    let blank = SourceFile::new("gateway.toml", "");
    let defaults = GatewayFile::default();
    let source = parsed.map_or(&blank, |p| &p.source);
    // A broken gateway.toml was reported already; check the rest against
    // defaults but skip the cross-file checks that would only echo it.
    let known = parsed.is_none_or(|p| p.doc.is_some());
    let file = parsed.and_then(|p| p.doc.as_ref()).unwrap_or(&defaults);

    let default_listen: SocketAddr = DEFAULT_LISTEN
        .parse()
        .expect("DEFAULT_LISTEN is an address");
    let listen = file.listen.as_ref().map_or(default_listen, |listen| {
        listen.get_ref().parse().unwrap_or_else(|_| {
            errors.push(source.error_at(
                listen.span(),
                format!(
                    "`{}` is not a listen address: expected IP:PORT, e.g. {DEFAULT_LISTEN}",
                    listen.get_ref()
                ),
            ));
            default_listen
        })
    });
    let admin_listen = check_admin_listen(dir, source, file.admin.as_ref(), listen, errors);
    let connections = check_connections(source, file.connections.as_ref(), errors);
    let operator = OperatorPolicy {
        issuers: file
            .operator
            .as_ref()
            .map(|o| o.issuers.clone())
            .unwrap_or_default(),
        source: parsed.map_or_else(
            || Arc::new(SourceFile::new("gateway.toml", "")),
            |p| Arc::clone(&p.source),
        ),
    };
    let max_body_bytes = at_least_one(source, "max_body_bytes", &file.max_body_bytes, errors)
        .unwrap_or(DEFAULT_MAX_BODY_BYTES);
    let request_timeout_ms = at_least_one(
        source,
        "request_timeout_ms",
        &file.request_timeout_ms,
        errors,
    )
    .unwrap_or(DEFAULT_REQUEST_TIMEOUT_MS);
    let jwt_leeway_s = match &file.jwt_leeway_s {
        None => DEFAULT_JWT_LEEWAY_S,
        Some(leeway) if *leeway.get_ref() > MAX_JWT_LEEWAY_S => {
            errors.push(source.error_at(
                leeway.span(),
                format!(
                    "`jwt_leeway_s` is {}; at most {MAX_JWT_LEEWAY_S} is allowed \
                     (a long leeway keeps expired tokens usable)",
                    leeway.get_ref()
                ),
            ));
            DEFAULT_JWT_LEEWAY_S
        }
        Some(leeway) => *leeway.get_ref(),
    };

    let local_defaults = LocalGpuHostFile::default();
    let mut device = None;
    let (upstream, models) = match (&file.upstream, &file.local_gpu_host) {
        (Some(remote), local) => {
            if local.is_some() {
                errors.push(source.error_at(
                    remote.target.span(),
                    "`[upstream]` and `[local_gpu_host]` are both set: \
                     use a remote gpu-host or a local one, not both",
                ));
            }
            let models = check_models(dir, source, &remote.models, trust, HostKind::Remote, errors);
            (check_upstream(dir, source, remote, errors), models)
        }
        (None, local) => {
            let before = errors.len();
            let (local, models) = check_local(
                dir,
                source,
                local.as_ref().unwrap_or(&local_defaults),
                trust,
                errors,
            );
            if errors.len() == before {
                device = Some((local.device.clone(), local.model_reservation_bytes));
            }
            (UpstreamSettings::Local(local), models)
        }
    };
    let models_registry = check_registry(dir, source, file.models.as_ref(), errors);
    // With a registry, tenants may name models registered later through the
    // API; without one, only the configured models can ever be served.
    // Every configured name counts, verified or not: a model that failed
    // is reported once, where it is configured.
    let configured = match (&file.upstream, &file.local_gpu_host) {
        (Some(remote), _) => &remote.models,
        (None, Some(local)) => &local.models,
        (None, None) => &local_defaults.models,
    };
    let served_models = match models_registry {
        Some(_) => None,
        None => Some(
            configured
                .iter()
                .map(|m| m.name.get_ref().clone())
                .collect(),
        ),
    };

    let plugins = check_plugins(dir, source, file.plugins.as_ref(), errors);
    let audit = file
        .audit
        .as_ref()
        .map(|audit| check_audit(dir, source, audit, errors));

    Gateway {
        settings: GatewaySettings {
            listen,
            admin_listen,
            connections,
            max_body_bytes,
            request_timeout: Duration::from_millis(request_timeout_ms),
            jwt_leeway: Duration::from_secs(jwt_leeway_s),
            upstream,
            plugins,
            audit,
            models_registry,
        },
        served_models: served_models.filter(|_| known),
        models,
        body_cap: known.then_some(max_body_bytes),
        default_limits: Limits {
            max_body_bytes: Limits::DEFAULT.max_body_bytes.min(max_body_bytes),
            ..Limits::DEFAULT
        },
        device: device.filter(|_| known),
        operator,
    }
}

/// `[connections]`: every value at least 1, the per-IP cap at most the
/// total, the header timeout at most a minute, the body's at most five.
fn check_connections(
    source: &SourceFile,
    file: Option<&ConnectionsFile>,
    errors: &mut Vec<PolicyError>,
) -> ConnectionLimits {
    let defaults = ConnectionLimits::DEFAULT;
    let Some(file) = file else {
        return defaults;
    };
    let mut timeout_ms = |key: &str, value: &Option<Spanned<u64>>, max_ms: u64| {
        let ms = at_least_one(source, key, value, errors);
        if let (Some(ms), Some(field)) = (ms, value)
            && ms > max_ms
        {
            errors.push(source.error_at(
                field.span(),
                format!(
                    "`{key}` is {ms}; at most {max_ms} (a long one lets slow clients hold \
                     connections)"
                ),
            ));
        }
        ms.map(Duration::from_millis)
    };
    let header_read_timeout = timeout_ms(
        "header_read_timeout_ms",
        &file.header_read_timeout_ms,
        60_000,
    );
    let body_read_timeout = timeout_ms("body_read_timeout_ms", &file.body_read_timeout_ms, 300_000);
    let count =
        |key, value: &Option<Spanned<u64>>, default: usize, errors: &mut Vec<PolicyError>| {
            at_least_one(source, key, value, errors)
                .map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX))
        };
    let max_connections = count(
        "max_connections",
        &file.max_connections,
        defaults.max_connections,
        errors,
    );
    let max_connections_per_ip = count(
        "max_connections_per_ip",
        &file.max_connections_per_ip,
        defaults.max_connections_per_ip.min(max_connections),
        errors,
    );
    if let Some(field) = &file.max_connections_per_ip
        && max_connections_per_ip > max_connections
    {
        errors.push(source.error_at(
            field.span(),
            format!(
                "`max_connections_per_ip` is {max_connections_per_ip}, more than \
                 `max_connections` ({max_connections})"
            ),
        ));
    }
    let streams = at_least_one(
        source,
        "http2_max_concurrent_streams",
        &file.http2_max_concurrent_streams,
        errors,
    );
    ConnectionLimits {
        header_read_timeout: header_read_timeout.unwrap_or(defaults.header_read_timeout),
        body_read_timeout: body_read_timeout.unwrap_or(defaults.body_read_timeout),
        max_connections,
        max_connections_per_ip,
        http2_max_concurrent_streams: streams.unwrap_or(defaults.http2_max_concurrent_streams),
    }
}

/// `[admin] listen`: `HOST:PORT` or `unix:PATH` (relative to the policy
/// folder unless absolute), never the tenants' address.
fn check_admin_listen(
    dir: &Path,
    source: &SourceFile,
    admin: Option<&AdminFile>,
    public: SocketAddr,
    errors: &mut Vec<PolicyError>,
) -> ListenAddr {
    let default = ListenAddr::Tcp(
        DEFAULT_ADMIN_LISTEN
            .parse()
            .expect("DEFAULT_ADMIN_LISTEN is an address"),
    );
    let Some(listen) = admin.and_then(|a| a.listen.as_ref()) else {
        return default;
    };
    let addr = match ListenAddr::parse(listen.get_ref()) {
        Ok(ListenAddr::Unix(path)) => ListenAddr::Unix(lexically_normal(&dir.join(path))),
        Ok(addr) => addr,
        Err(reason) => {
            errors.push(source.error_at(listen.span(), reason));
            return default;
        }
    };
    if let ListenAddr::Tcp(tcp) = &addr
        && tcp.port() != 0
        && *tcp == public
    {
        errors.push(source.error_at(
            listen.span(),
            format!(
                "the admin listener `{tcp}` is the tenants' `listen` address: the operator API \
                 needs a listener of its own"
            ),
        ));
    }
    addr
}

/// `[plugins]`: the store folder, resolved against the policy folder. It
/// must lie outside it: the policy folder is watched, and every store write
/// would wake a reload.
fn check_plugins(
    dir: &Path,
    source: &SourceFile,
    plugins: Option<&PluginsGatewayFile>,
    errors: &mut Vec<PolicyError>,
) -> GatewayPlugins {
    let maximums = match plugins.and_then(|p| p.maximums.as_ref()) {
        Some(file) => super::plugins::check_maximums(source, file, errors),
        None => super::plugins::ceilings(),
    };
    let max_concurrent_calls = match plugins.and_then(|p| p.max_concurrent_calls.as_ref()) {
        None => crate::plugins::default_gate_slots(),
        Some(calls) => {
            let n = *calls.get_ref();
            match usize::try_from(n) {
                Ok(n @ 1..=crate::plugins::MAX_GATE_SLOTS) => n,
                _ => {
                    errors.push(source.error_at(
                        calls.span(),
                        format!(
                            "`max_concurrent_calls` is {n}; it must be from 1 to {} (the \
                             default, {}, leaves one of this machine's cores to the request path)",
                            crate::plugins::MAX_GATE_SLOTS,
                            crate::plugins::default_gate_slots()
                        ),
                    ));
                    crate::plugins::default_gate_slots()
                }
            }
        }
    };
    let Some(store) = plugins.and_then(|p| p.store.as_ref()) else {
        return GatewayPlugins {
            store: None,
            maximums,
            max_concurrent_calls,
        };
    };
    let path = lexically_normal(&dir.join(store.get_ref()));
    if store.get_ref().as_os_str().is_empty() {
        errors.push(source.error_at(
            store.span(),
            "`store` is empty: name a folder for the plugin store, e.g. \"../var/plugins\"",
        ));
    } else if path.starts_with(lexically_normal(dir)) {
        errors.push(source.error_at(
            store.span(),
            format!(
                "the plugin store {} is inside the policy folder, which is watched for \
                 changes: put it outside, e.g. \"../var/plugins\"",
                path.display()
            ),
        ));
    }
    GatewayPlugins {
        store: Some(path),
        maximums,
        max_concurrent_calls,
    }
}

/// `[audit]`: the log folder (required, outside the watched policy folder,
/// like the plugin store), the key path and the origin.
fn check_audit(
    dir: &Path,
    source: &SourceFile,
    audit: &AuditGatewayFile,
    errors: &mut Vec<PolicyError>,
) -> crate::audit::AuditSettings {
    let mut settings = crate::audit::AuditSettings::new(PathBuf::new());
    match &audit.dir {
        None => errors
            .push(source.error(
                "`[audit]` needs `dir`: the folder of the audit log, e.g. \"../var/audit\"",
            )),
        Some(log) if log.get_ref().as_os_str().is_empty() => errors.push(source.error_at(
            log.span(),
            "`dir` is empty: name a folder for the audit log, e.g. \"../var/audit\"",
        )),
        Some(log) => {
            let path = lexically_normal(&dir.join(log.get_ref()));
            if path.starts_with(lexically_normal(dir)) {
                errors.push(source.error_at(
                    log.span(),
                    format!(
                        "the audit log {} is inside the policy folder, which is watched for \
                         changes: put it outside, e.g. \"../var/audit\"",
                        path.display()
                    ),
                ));
            }
            settings.dir = path;
        }
    }
    if let Some(key) = &audit.key {
        settings.key = Some(lexically_normal(&dir.join(key.get_ref())));
    }
    if let Some(origin) = &audit.origin {
        if crate::audit::valid_origin(origin.get_ref()) {
            settings.origin = origin.get_ref().clone();
        } else {
            errors.push(source.error_at(
                origin.span(),
                format!(
                    "`origin` \"{}\" is not a checkpoint origin: 1 to 256 bytes, no spaces, \
                     no `+`, e.g. \"example.com/bulkhead/audit\"",
                    origin.get_ref().escape_debug()
                ),
            ));
        }
    }
    settings
}

/// `[models] registry`: the folder API registrations are kept in, outside
/// the watched policy folder (like the plugin store).
fn check_registry(
    dir: &Path,
    source: &SourceFile,
    models: Option<&ModelsGatewayFile>,
    errors: &mut Vec<PolicyError>,
) -> Option<PathBuf> {
    let registry = models?.registry.as_ref()?;
    let path = lexically_normal(&dir.join(registry.get_ref()));
    if registry.get_ref().as_os_str().is_empty() {
        errors.push(source.error_at(
            registry.span(),
            "`registry` is empty: name a folder for registered models, e.g. \"../var/models\"",
        ));
    } else if path.starts_with(lexically_normal(dir)) {
        errors.push(source.error_at(
            registry.span(),
            format!(
                "the model registry {} is inside the policy folder, which is watched for \
                 changes: put it outside, e.g. \"../var/models\"",
                path.display()
            ),
        ));
    }
    Some(path)
}

/// `path` with `.` and `..` resolved by name (symlinks are not followed).
fn lexically_normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn check_upstream(
    dir: &Path,
    source: &SourceFile,
    upstream: &UpstreamFile,
    errors: &mut Vec<PolicyError>,
) -> UpstreamSettings {
    let written = upstream.target.get_ref();
    let target = written.parse::<Target>().unwrap_or_else(|_| {
        errors.push(source.error_at(
            upstream.target.span(),
            format!("`{written}` is not an upstream target: expected unix:PATH or tcp:IP:PORT"),
        ));
        Target::Unix(PathBuf::new()) // stand-in; the error discards it
    });
    if matches!(target, Target::Tcp(_)) && upstream.secret_file.is_none() {
        errors.push(source.error_at(
            upstream.target.span(),
            "a `tcp:` upstream needs `secret_file`: the gpu-host refuses TCP clients \
             without its bearer secret",
        ));
    }
    let secret = upstream
        .secret_file
        .as_ref()
        .and_then(|file| read_secret(dir, source, file, errors));
    let tls = check_upstream_tls(dir, source, upstream, &target, errors);
    UpstreamSettings::Remote {
        target,
        secret,
        tls,
    }
}

/// `[upstream]`'s TLS: required for `tcp:` unless `allow_plaintext`; the
/// files read and parsed as a connection would (so a bad certificate is a
/// policy error, not a failed first request).
fn check_upstream_tls(
    dir: &Path,
    source: &SourceFile,
    upstream: &UpstreamFile,
    target: &Target,
    errors: &mut Vec<PolicyError>,
) -> Option<ClientTls> {
    let plaintext = upstream
        .allow_plaintext
        .as_ref()
        .is_some_and(|p| *p.get_ref());
    let tls_keys = [&upstream.tls_ca, &upstream.tls_cert, &upstream.tls_key];
    let any_tls = tls_keys.iter().any(|k| k.is_some()) || upstream.tls_server_name.is_some();
    if matches!(target, Target::Unix(_)) {
        if any_tls {
            errors.push(source.error_at(
                upstream.target.span(),
                "TLS settings are for a `tcp:` upstream; a unix: socket is reached without TLS",
            ));
        }
        return None;
    }
    if plaintext {
        if any_tls {
            errors.push(source.error_at(
                upstream.target.span(),
                "`allow_plaintext = true` and TLS settings together: choose one",
            ));
        }
        return None;
    }
    let Some(ca) = &upstream.tls_ca else {
        errors.push(source.error_at(
            upstream.target.span(),
            "a `tcp:` upstream needs TLS (`tls_ca`, and `tls_cert` + `tls_key` when the host \
             asks for a client certificate), or `allow_plaintext = true` to send the secret \
             and prompts in the clear",
        ));
        return None;
    };
    let mut read = |file: &Spanned<PathBuf>, what: &str| -> Option<Vec<u8>> {
        let path = dir.join(file.get_ref());
        match read_capped_file(&path, MAX_TLS_FILE_BYTES) {
            Ok(bytes) => Some(bytes),
            Err(why) => {
                errors.push(
                    source.error_at(file.span(), format!("{what} {}: {why}", path.display())),
                );
                None
            }
        }
    };
    let ca_pem = read(ca, "TLS CA")?;
    let identity = match (&upstream.tls_cert, &upstream.tls_key) {
        (Some(cert), Some(key)) => Some((read(cert, "TLS certificate")?, read(key, "TLS key")?)),
        (None, None) => None,
        (Some(field), None) | (None, Some(field)) => {
            errors.push(source.error_at(
                field.span(),
                "`tls_cert` and `tls_key` go together (the gateway's client certificate)",
            ));
            return None;
        }
    };
    let tls = ClientTls {
        ca_pem,
        identity,
        server_name: upstream
            .tls_server_name
            .as_ref()
            .map(|n| n.get_ref().clone()),
    };
    if let Err(e) = tls.check() {
        errors.push(source.error_at(ca.span(), format!("the upstream's TLS files: {e}")));
        return None;
    }
    Some(tls)
}

/// Largest certificate or key file read for `[upstream]` TLS.
const MAX_TLS_FILE_BYTES: u64 = 1 << 20;

/// The file's bytes, at most `max`, or why not.
fn read_capped_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let meta = fs::metadata(path).map_err(|e| io_reason(&e))?;
    if !meta.is_file() || meta.len() > max {
        return Err(format!("is not a regular file of at most {max} bytes"));
    }
    fs::read(path).map_err(|e| io_reason(&e))
}

/// The secret in `file`, without its trailing newline. Errors never show it.
fn read_secret(
    dir: &Path,
    source: &SourceFile,
    file: &Spanned<PathBuf>,
    errors: &mut Vec<PolicyError>,
) -> Option<String> {
    let path = dir.join(file.get_ref());
    read_secret_file(&path)
        .map_err(|why| {
            let message = format!("secret file {}: {why}", path.display());
            errors.push(source.error_at(file.span(), message));
        })
        .ok()
}

/// The secret, or why not (in words that do not include it).
fn read_secret_file(path: &Path) -> Result<String, String> {
    let meta = fs::metadata(path).map_err(|e| io_reason(&e))?;
    if !meta.is_file() || meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(format!(
            "is not a secret file (a regular file of at most {MAX_SECRET_FILE_BYTES} bytes)"
        ));
    }
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE_BYTES).read_to_end(&mut bytes))
        .map_err(|e| io_reason(&e))?;
    let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.len() < MIN_SECRET_BYTES {
        return Err(format!("holds fewer than {MIN_SECRET_BYTES} bytes"));
    }
    Ok(secret.to_string())
}

fn check_local(
    dir: &Path,
    source: &SourceFile,
    local: &LocalGpuHostFile,
    trust: &Trust,
    errors: &mut Vec<PolicyError>,
) -> (LocalGpuHost, Vec<Arc<Registration>>) {
    let binary = local.binary.as_ref().map(|binary| {
        let path = dir.join(binary.get_ref());
        if let Err(why) = check_readable_file(&path) {
            errors.push(source.error_at(
                binary.span(),
                format!("gpu-host binary {}: {why}", path.display()),
            ));
        }
        path
    });
    let threads = at_least_one(source, "threads", &local.threads, errors);
    let workers =
        at_least_one(source, "workers", &local.workers, errors).unwrap_or(DEFAULT_WORKERS);
    let queue_capacity = at_least_one(source, "queue_capacity", &local.queue_capacity, errors)
        .unwrap_or(DEFAULT_QUEUE_CAPACITY);
    let restart_backoff_max_ms = at_least_one(
        source,
        "restart_backoff_max_ms",
        &local.restart_backoff_max_ms,
        errors,
    )
    .unwrap_or(DEFAULT_RESTART_BACKOFF_MAX_MS);
    let models = check_models(dir, source, &local.models, trust, HostKind::Local, errors);
    // Weights are loaded once, as large as the signed files.
    let model_bytes = models
        .iter()
        .map(|m| {
            m.file
                .size
                .or_else(|| fs::metadata(m.path()).ok().map(|meta| meta.len()))
                .unwrap_or(0)
        })
        .sum();
    let (device, model_reservation_bytes) =
        super::gpu::check_device(source, local, threads, model_bytes, errors);
    let host = LocalGpuHost {
        binary,
        threads,
        workers,
        queue_capacity,
        restart_backoff_max: Duration::from_millis(restart_backoff_max_ms),
        scrub_bytes_per_s: local.scrub_bytes_per_s.as_ref().map(|v| *v.get_ref()),
        scrub_min_bytes_per_s: check_scrub_floor(source, local, errors),
        device,
        model_reservation_bytes,
    };
    (host, models)
}

/// The gpu-host's default scrub rate (`--scrub-bytes-per-s`), which a floor
/// given without a rate is checked against.
const DEFAULT_SCRUB_BYTES_PER_S: u64 = 64 << 20;

/// `scrub_min_bytes_per_s`, which may not exceed the scrub's rate (the
/// child would refuse to start).
fn check_scrub_floor(
    source: &SourceFile,
    local: &LocalGpuHostFile,
    errors: &mut Vec<PolicyError>,
) -> Option<u64> {
    let floor = local.scrub_min_bytes_per_s.as_ref()?;
    let rate = local
        .scrub_bytes_per_s
        .as_ref()
        .map_or(DEFAULT_SCRUB_BYTES_PER_S, |v| *v.get_ref());
    if *floor.get_ref() > rate {
        errors.push(source.error_at(
            floor.span(),
            format!(
                "`scrub_min_bytes_per_s` is {}, above the scrub's rate of {rate} bytes/s \
                 (`scrub_bytes_per_s`); the floor kept at normal priority cannot exceed it",
                floor.get_ref()
            ),
        ));
    }
    Some(*floor.get_ref())
}

/// Ok if `path` is a regular file (after symlinks) this process can open.
fn check_readable_file(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| io_reason(&e))?;
    if !meta.is_file() {
        return Err("is not a regular file".to_string());
    }
    fs::File::open(path).map_err(|e| io_reason(&e))?;
    Ok(())
}

/// Class names (every `classes/*.toml`, parsed or not) and resolved limits
/// (those that parsed).
struct Classes {
    names: BTreeSet<String>,
    limits: BTreeMap<String, Limits>,
}

fn check_classes(
    parsed: &[Parsed<ClassFile>],
    gateway: &Gateway,
    errors: &mut Vec<PolicyError>,
) -> Classes {
    let mut classes = Classes {
        names: BTreeSet::new(),
        limits: BTreeMap::new(),
    };
    for class in parsed {
        let name = file_stem(&class.source);
        if !is_valid_name(&name) {
            errors.push(class.source.error(format!(
                "class name `{name}` (the file name) is not valid: {NAME_RULE}"
            )));
        }
        if let Some(doc) = &class.doc {
            check_limits(&class.source, &doc.limits, gateway.body_cap, errors);
            let limits = resolve_limits(&doc.limits, &gateway.default_limits);
            classes.limits.insert(name.clone(), limits);
        }
        classes.names.insert(name);
    }
    classes
}

fn check_tenants(
    dir: &Path,
    parsed: Vec<Parsed<TenantFile>>,
    classes: &Classes,
    gateway: &Gateway,
    gpu_checks: &mut GpuChecks,
    errors: &mut Vec<PolicyError>,
) -> BTreeMap<String, TenantPolicy> {
    let mut tenants: BTreeMap<String, TenantPolicy> = BTreeMap::new();
    // Issuer → who claimed it first, and where: the operator's issuers, then
    // the tenants'. The issuer picks whose keys verify a token, so one
    // issuer for two principals would let either's identity provider
    // speak for the other.
    let mut issuers: BTreeMap<String, String> = BTreeMap::new();
    let operator = &gateway.operator;
    for jwt in &operator.issuers {
        let issuer = jwt.issuer.get_ref();
        let (line, col) = operator.source.line_col(jwt.issuer.span().start);
        let here = format!(
            "the operator ({}:{line}:{col})",
            operator.source.name.display()
        );
        match issuers.get(issuer) {
            Some(other) => errors.push(operator.source.error_at(
                jwt.issuer.span(),
                format!("operator issuer `{issuer}` is also used by {other}"),
            )),
            None => {
                issuers.insert(issuer.clone(), here);
            }
        }
    }
    for Parsed { source, doc } in parsed {
        let Some(doc) = doc else { continue };
        let id = doc.id.get_ref();
        let stem = file_stem(&source);
        if !is_valid_name(id) {
            errors.push(source.error_at(
                doc.id.span(),
                format!("tenant id `{id}` is not valid: {NAME_RULE}"),
            ));
        } else if *id != stem {
            errors.push(source.error_at(
                doc.id.span(),
                format!("tenant id `{id}` does not match the file name `{stem}.toml`"),
            ));
        }
        if let Some(other) = tenants.get(id) {
            errors.push(source.error_at(
                doc.id.span(),
                format!(
                    "tenant id `{id}` is also used by {}",
                    other.source.name.display()
                ),
            ));
            continue;
        }

        let base = match &doc.class {
            None => gateway.default_limits,
            Some(class) => match classes.limits.get(class.get_ref()) {
                Some(limits) => *limits,
                None => {
                    if !classes.names.contains(class.get_ref()) {
                        errors.push(source.error_at(
                            class.span(),
                            format!(
                                "class `{}` does not exist; {}",
                                class.get_ref(),
                                known_classes(&classes.names)
                            ),
                        ));
                    }
                    gateway.default_limits
                }
            },
        };
        check_limits(&source, &doc.limits, gateway.body_cap, errors);
        let limits = resolve_limits(&doc.limits, &base);

        let models = check_tenant_models(&source, &doc.models, gateway, errors);
        let plugins = super::plugins::check(
            dir,
            &source,
            &doc.plugins,
            &gateway.settings.plugins.maximums,
            errors,
        );

        let device = gateway.device.as_ref().map(|(device, _)| device);
        let gpu = super::gpu::check_tenant(&source, id, doc.gpu.as_ref(), device, errors);
        let kv_wait_ms = super::gpu::check_kv_wait(&source, doc.gpu.as_ref(), errors);
        gpu_checks.all_valid &= gpu.is_some();
        if let Some(table) = &doc.gpu {
            gpu_checks.spans.insert(id.clone(), table.span());
        }

        let issuer = doc.jwt.issuer.get_ref();
        match issuers.get(issuer) {
            Some(other) => errors.push(source.error_at(
                doc.jwt.issuer.span(),
                format!(
                    "issuer `{issuer}` is also used by {other}: the issuer tells tenants and \
                     the operator apart, so it must be unique"
                ),
            )),
            None => {
                let (line, col) = source.line_col(doc.jwt.issuer.span().start);
                issuers.insert(
                    issuer.clone(),
                    format!("tenant `{id}` ({}:{line}:{col})", source.name.display()),
                );
            }
        }

        let id = id.clone();
        tenants.insert(
            id.clone(),
            TenantPolicy {
                id,
                models,
                jwt: doc.jwt,
                limits,
                plugins,
                gpu: gpu.unwrap_or_default(),
                kv_wait_ms,
                parse_special: doc.prompts.parse_special.unwrap_or(false),
                source,
            },
        );
    }
    tenants
}

fn check_tenant_models(
    source: &SourceFile,
    models: &[Spanned<String>],
    gateway: &Gateway,
    errors: &mut Vec<PolicyError>,
) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for model in models {
        let name = model.get_ref();
        if !seen.insert(name.clone()) {
            errors.push(source.error_at(model.span(), format!("model `{name}` is listed twice")));
            continue;
        }
        match &gateway.served_models {
            Some(served) if !served.contains(name) => errors.push(source.error_at(
                model.span(),
                format!(
                    "model `{name}` is not served by this gateway: gateway.toml configures {} \
                     (and has no `[models] registry` for models registered through the API)",
                    quoted_list(served)
                ),
            )),
            // Registered through the API later, maybe: only the name's shape is ours.
            None if !valid_model_name(name) => errors.push(source.error_at(
                model.span(),
                format!(
                    "model name `{}` is not valid: {MODEL_NAME_RULE}",
                    name.escape_debug()
                ),
            )),
            _ => {}
        }
    }
    seen
}

/// Every numeric limit is at least 1, and bodies stay under the gateway's cap.
fn check_limits(
    source: &SourceFile,
    limits: &LimitsFile,
    body_cap: Option<u64>,
    errors: &mut Vec<PolicyError>,
) {
    at_least_one(source, "requests_per_s", &limits.requests_per_s, errors);
    at_least_one(source, "burst", &limits.burst, errors);
    at_least_one(source, "tokens_per_min", &limits.tokens_per_min, errors);
    at_least_one(source, "max_concurrent", &limits.max_concurrent, errors);
    at_least_one(source, "max_tokens", &limits.max_tokens, errors);
    if let Some(body) = at_least_one(source, "max_body_bytes", &limits.max_body_bytes, errors)
        && let Some(cap) = body_cap
        && body > cap
    {
        errors.push(source.error_at(
            limits.max_body_bytes.as_ref().map_or(0..0, Spanned::span),
            format!("`max_body_bytes` is {body}, above the gateway's max_body_bytes ({cap})"),
        ));
    }
}

/// Each limit `own` sets, else `base`'s.
fn resolve_limits(own: &LimitsFile, base: &Limits) -> Limits {
    fn pick<T: Copy>(own: &Option<Spanned<T>>, base: T) -> T {
        own.as_ref().map_or(base, |v| *v.get_ref())
    }
    Limits {
        requests_per_s: pick(&own.requests_per_s, base.requests_per_s),
        burst: pick(&own.burst, base.burst),
        tokens_per_min: pick(&own.tokens_per_min, base.tokens_per_min),
        max_concurrent: pick(&own.max_concurrent, base.max_concurrent),
        max_body_bytes: pick(&own.max_body_bytes, base.max_body_bytes),
        max_tokens: pick(&own.max_tokens, base.max_tokens),
        per_sub: own.per_sub.unwrap_or(base.per_sub),
    }
}

/// The value if set; an error at it if it is 0 (the value is still returned,
/// as the error discards the policy anyway).
fn at_least_one<T: Copy + PartialOrd + From<u8> + Display>(
    source: &SourceFile,
    key: &str,
    value: &Option<Spanned<T>>,
    errors: &mut Vec<PolicyError>,
) -> Option<T> {
    let value = value.as_ref()?;
    if *value.get_ref() < T::from(1) {
        errors.push(source.error_at(value.span(), format!("`{key}` must be at least 1")));
    }
    Some(*value.get_ref())
}

pub(super) const NAME_RULE: &str =
    "use 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit";

/// `[a-z0-9][a-z0-9_-]{0,62}`: safe in file names, URLs, metric labels.
pub(super) fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The file name without `.toml` (file names are UTF-8: `load` checked).
fn file_stem(source: &SourceFile) -> String {
    source
        .name
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn known_classes(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        "there are no classes/*.toml files".to_string()
    } else {
        format!("classes: {}", quoted_list(names))
    }
}

/// "`a`, `b`", "none", or the first few and a count.
fn quoted_list(names: &BTreeSet<String>) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    let mut list = names
        .iter()
        .take(MAX_LISTED_NAMES)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > MAX_LISTED_NAMES {
        list.push_str(&format!(" and {} more", names.len() - MAX_LISTED_NAMES));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_id_rule() {
        for good in ["a", "0", "acme", "acme-eu_1", &"a".repeat(63)] {
            assert!(is_valid_name(good), "{good}");
        }
        for bad in ["", "-a", "_a", "Acme", "a.b", "a b", "é", &"a".repeat(64)] {
            assert!(!is_valid_name(bad), "{bad}");
        }
    }
}
