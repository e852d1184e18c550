//! Which reloads only take something away from tenants.
//!
//! A reload is applied only once the audit log holds it, with one
//! exception: when the log cannot take the entry (a full disk), a reload
//! that only restricts tenants is applied anyway, so an operator can always
//! revoke a tenant that misbehaves. **Restricts** means, against the policy
//! in force: the files other than `tenants/*.toml` and `classes/*.toml` are
//! unchanged (or removed); no tenant is added; and for every tenant kept,
//! its models are a subset of the old, each limit is at most the old
//! (`per_sub` unchanged), its plugins and `[gpu]` are unchanged, and
//! neither `parse_special` nor `[telemetry] record_content` is turned on.
//! Its token verification must narrow too
//! ([`crate::auth::Verifiers::narrows`]), which the caller checks.

use std::path::Path;

use super::{Limits, Policy, TenantPolicy};

/// `Ok` when `new` only restricts `old`; `Err` names the first change
/// that does not.
pub fn only_restricts(old: &Policy, new: &Policy) -> Result<(), String> {
    for (path, digest) in &new.files {
        if is_tenant_or_class(path) {
            continue;
        }
        match old.files.iter().find(|(p, _)| p == path) {
            Some((_, was)) if was == digest => {}
            Some(_) => return Err(format!("`{}` changed", path.display())),
            None => return Err(format!("`{}` was added", path.display())),
        }
    }
    for (id, tenant) in &new.tenants {
        let Some(was) = old.tenants.get(id) else {
            return Err(format!("tenant `{id}` was added"));
        };
        tenant_restricts(was, tenant).map_err(|what| format!("tenant `{id}`: {what}"))?;
    }
    Ok(())
}

fn is_tenant_or_class(path: &Path) -> bool {
    path.starts_with("tenants") || path.starts_with("classes")
}

fn tenant_restricts(old: &TenantPolicy, new: &TenantPolicy) -> Result<(), String> {
    if !new.models.is_subset(&old.models) {
        return Err("a model was added".to_string());
    }
    limits_restrict(&old.limits, &new.limits)?;
    if new.plugins != old.plugins {
        return Err("its plugins changed".to_string());
    }
    if new.gpu != old.gpu {
        return Err("its `[gpu]` changed".to_string());
    }
    if new.parse_special && !old.parse_special {
        return Err("`parse_special` was turned on".to_string());
    }
    if new.record_content && !old.record_content {
        return Err("`[telemetry] record_content` was turned on".to_string());
    }
    Ok(())
}

fn limits_restrict(old: &Limits, new: &Limits) -> Result<(), String> {
    let raised = [
        ("requests_per_s", new.requests_per_s > old.requests_per_s),
        ("burst", new.burst > old.burst),
        ("tokens_per_min", new.tokens_per_min > old.tokens_per_min),
        ("max_concurrent", new.max_concurrent > old.max_concurrent),
        ("max_body_bytes", new.max_body_bytes > old.max_body_bytes),
        ("max_tokens", new.max_tokens > old.max_tokens),
        ("per_sub", new.per_sub != old.per_sub),
    ];
    match raised.iter().find(|(_, up)| *up) {
        Some((name, _)) => Err(format!("`{name}` was raised or changed")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
