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
    AdminFile, AuditGatewayFile, ConnectionsFile, Folder, GatewayFile, LimitStoreFile, LimitsFile,
    LocalGpuHostFile, ModelFile, ModelsGatewayFile, Parsed, PluginsGatewayFile, StateFile,
    UpstreamFile, io_reason,
};
use super::models::{HostKind, check_models};
use super::names::{NAME_RULE, is_valid_name};
use super::trust::check_trust;
use super::{
    ClassFile, ConnectionLimits, DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, GatewayPlugins,
    GatewaySettings, Limits, ListenAddr, LocalGpuHost, MAX_GPU_HOSTS, OperatorPolicy, Policy,
    PolicyError, RemoteHost, SourceFile, TenantFile, TenantPolicy, UpstreamSettings,
};
use crate::registration::Trust;
use crate::registration::{MODEL_NAME_RULE, Registration, valid_model_name};

mod gateway;
mod limit_store;
mod secrets;
mod state;
use gateway::{Gateway, check_gateway};

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
                parse_special: doc.prompts.parse_special.unwrap_or(false),
                record_content: doc.telemetry.record_content.unwrap_or(false),
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
