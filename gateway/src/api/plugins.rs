//! The tenant plugin API: `PUT /v1/plugins/{name}` (body: the component's
//! bytes, e.g. `content-type: application/wasm`), `GET /v1/plugins`,
//! `GET /v1/plugins/{name}`, `DELETE /v1/plugins/{name}`.
//!
//! Every call needs the `plugins:write` scope (checked by the route table,
//! `routes.rs`), reads included: the token that manages a tenant's plugins
//! also lists them, and an inference-only token learns nothing about them.
//! The tenant is the verified token's;
//! names are per tenant, so one tenant never sees or touches another's.
//! Compilation and disk (or state database) writes run on a blocking
//! thread. With plugins in the state database, an upload or delete while
//! it is unreachable is a 503 (`plugin_store_unavailable`, retry); reads
//! answer from the replica's index, as inference does.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};

use super::App;
use super::deadline::BodyDeadline;
use super::error::ApiError;
use super::identity::TenantCall;
use crate::audit::{Actor, Event, sha256_text};
use crate::auth::Identity;
use crate::metrics::PluginUploadLabels;
use crate::plugins::{MAX_COMPONENT_BYTES, PluginError, PluginInfo, PluginName, StoreError};

/// `PUT /v1/plugins/{name}`: 201 with the plugin for a new name, 200 when
/// it replaced (or already held) these bytes.
pub async fn put(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    name: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let tenant = call.identity.tenant.clone();
    let result = upload(&app, call, name, &headers, body).await;
    let label = match &result {
        Ok((_, outcome)) => outcome.as_str(),
        Err(error) => error.code,
    };
    app.metrics
        .plugin_uploads
        .get_or_create(&PluginUploadLabels {
            tenant,
            result: label,
        })
        .inc();
    match result {
        Ok((info, outcome)) => {
            let status = if outcome == crate::plugins::UploadOutcome::Created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (status, Json(plugin_json(&info))).into_response()
        }
        Err(error) => error.into_response(),
    }
}

async fn upload(
    app: &App,
    call: TenantCall,
    name: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(PluginInfo, crate::plugins::UploadOutcome), ApiError> {
    let identity = store_enabled(app, call.clone())?;
    let tenant = identity.tenant.clone();
    let name = plugin_name(name)?;
    // Before the body is read: a tenant over its budget costs nothing more.
    take_change(app, &call)?;
    let bytes = read_body(headers, body).await?;
    let version = check_signature(app, &identity.tenant, &name, headers, &bytes)?;
    app.audit.ready().await.map_err(super::audit::unrecorded)?;
    let registry = app.plugins.clone();
    let audit = app.audit.clone();
    let uploaded = tokio::task::spawn_blocking(move || {
        let stored = registry.upload_version(
            &identity.tenant,
            &name,
            &bytes,
            identity.sub.as_deref(),
            version,
        );
        // Recorded after the store committed it: the entry says what is
        // on disk. A failed append fails the call (the log then refuses
        // every further change until the gateway restarts).
        if let Ok((info, _)) = &stored {
            let event = Event::PluginUpload {
                tenant: identity.tenant.clone(),
                name: info.name.clone(),
                digest: sha256_text(info.digest.as_bytes()),
                size_bytes: info.size_bytes,
            };
            let actor = Actor::Tenant {
                tenant: identity.tenant.clone(),
                sub: identity.sub.clone(),
            };
            audit
                .record(actor, event)
                .map_err(super::audit::unrecorded)?;
        }
        Ok::<_, ApiError>(stored)
    })
    .await
    .map_err(ApiError::internal)??;
    let (info, outcome) = uploaded.map_err(store_error)?;
    tracing::info!(
        tenant = %tenant,
        plugin = %info.name,
        digest = %info.digest,
        size_bytes = info.size_bytes,
        outcome = outcome.as_str(),
        "plugin uploaded"
    );
    Ok((info, outcome))
}

pub use crate::plugins::signature::{SIGNATURE_HEADER, VERSION_HEADER};

/// When the tenant's policy lists `signing_keys`, the upload must be signed
/// by one of them (403 otherwise) over the statement binding the tenant,
/// this plugin name, the version in [`VERSION_HEADER`] and the bytes
/// (`plugins::signature`); returns that version. Without keys, nothing is
/// needed or checked.
fn check_signature(
    app: &App,
    tenant: &str,
    name: &PluginName,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Option<u64>, ApiError> {
    use base64::Engine as _;
    let snapshot = app.snapshot.load();
    let Some(policy) = snapshot.policy.tenants.get(tenant) else {
        return Err(ApiError::internal(
            "a verified tenant is missing from the policy",
        ));
    };
    let keys = &policy.plugins.signing_keys;
    if keys.is_empty() {
        return Ok(None);
    }
    let (Some(value), Some(version)) = (headers.get(SIGNATURE_HEADER), headers.get(VERSION_HEADER))
    else {
        return Err(ApiError::forbidden(
            "plugin_unsigned",
            format!(
                "tenant `{tenant}` accepts only signed plugins: send the base64 Ed25519 \
                 signature in {SIGNATURE_HEADER} and its version in {VERSION_HEADER} \
                 (`bulkhead plugin sign FILE --key KEY.pem --tenant {tenant} --name {name} \
                 --version N` prints both)"
            ),
        ));
    };
    let version = version
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|v| *v >= 1)
        .ok_or_else(|| {
            ApiError::invalid_param(
                VERSION_HEADER,
                format!("{VERSION_HEADER} must be a whole number of at least 1"),
            )
        })?;
    let signature = value
        .to_str()
        .ok()
        .and_then(|v| {
            base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .ok()
        })
        .and_then(|raw| ed25519_dalek::Signature::from_slice(&raw).ok())
        .ok_or_else(|| {
            ApiError::invalid_param(
                SIGNATURE_HEADER,
                format!("{SIGNATURE_HEADER} must be a base64 Ed25519 signature (64 bytes)"),
            )
        })?;
    let digest = crate::plugins::PluginDigest::of(bytes);
    let statement = crate::plugins::signature::signed_statement(tenant, name, version, &digest);
    if keys
        .iter()
        .any(|key| key.verify_strict(&statement, &signature).is_ok())
    {
        Ok(Some(version))
    } else {
        Err(ApiError::forbidden(
            "plugin_signature_invalid",
            format!(
                "the signature does not verify against any of tenant `{tenant}`'s \
                 signing_keys for plugin `{name}` version {version} with these bytes \
                 (sha256:{digest}): a signature binds the tenant, the name, the version and \
                 the bytes"
            ),
        ))
    }
}

/// `GET /v1/plugins`: the tenant's plugins, sorted by name.
pub async fn list(State(app): State<App>, Extension(call): Extension<TenantCall>) -> Response {
    match store_enabled(&app, call) {
        Ok(identity) => {
            let data: Vec<Value> = app
                .plugins
                .list(&identity.tenant)
                .iter()
                .map(plugin_json)
                .collect();
            Json(json!({"object": "list", "data": data})).into_response()
        }
        Err(error) => error.into_response(),
    }
}

/// `GET /v1/plugins/{name}`.
pub async fn get(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let found = store_enabled(&app, call).and_then(|identity| {
        let name = plugin_name(name)?;
        app.plugins
            .info(&identity.tenant, name.as_str())
            .ok_or_else(|| {
                store_error(StoreError::NotFound {
                    name: name.to_string(),
                })
            })
    });
    match found {
        Ok(info) => Json(plugin_json(&info)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `DELETE /v1/plugins/{name}`.
pub async fn delete(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let deleted = async {
        let identity = store_enabled(&app, call.clone())?;
        let name = plugin_name(name)?;
        take_change(&app, &call)?;
        app.audit.ready().await.map_err(super::audit::unrecorded)?;
        let registry = app.plugins.clone();
        let audit = app.audit.clone();
        let who = identity.clone();
        let removed = name.clone();
        tokio::task::spawn_blocking(move || {
            let digest = registry
                .delete(&who.tenant, &removed)
                .map_err(store_error)?;
            let event = Event::PluginDelete {
                tenant: who.tenant.clone(),
                name: removed.to_string(),
                digest: sha256_text(digest.as_bytes()),
            };
            let actor = Actor::Tenant {
                tenant: who.tenant,
                sub: who.sub,
            };
            audit.record(actor, event).map_err(super::audit::unrecorded)
        })
        .await
        .map_err(ApiError::internal)??;
        tracing::info!(tenant = %identity.tenant, plugin = %name, "plugin deleted");
        Ok::<_, ApiError>(name)
    }
    .await;
    match deleted {
        Ok(name) => Json(json!({
            "object": "plugin.deleted",
            "name": name.as_str(),
            "deleted": true,
        }))
        .into_response(),
        Err(error) => error.into_response(),
    }
}

/// One change (upload or delete) from the caller's tenant's budget
/// (`[plugins] changes_per_min`), or 429 saying when the next is allowed.
fn take_change(app: &App, call: &TenantCall) -> Result<(), ApiError> {
    let tenant = &call.identity.tenant;
    let per_min = call
        .snapshot
        .policy
        .tenants
        .get(tenant)
        .and_then(|t| t.plugins.changes_per_min)
        .unwrap_or(crate::policy::DEFAULT_PLUGIN_CHANGES_PER_MIN);
    app.plugin_changes.take(tenant, per_min).map_err(|retry| {
        let seconds = crate::limits::retry_after_secs(retry);
        ApiError::rate_limited(
            "rate_limit_plugin_changes",
            format!(
                "tenant `{tenant}` may change its plugins {per_min} times a minute \
                 (`[plugins] changes_per_min`); retry in {seconds}s"
            ),
        )
        .with_headers(super::error::header_map(vec![(
            "retry-after",
            seconds.to_string(),
        )]))
    })
}

/// The caller (its token checked by the route), on a gateway with a store.
fn store_enabled(app: &App, call: TenantCall) -> Result<Identity, ApiError> {
    let identity = call.identity;
    if !app.plugins.enabled() {
        return Err(store_error(StoreError::Disabled));
    }
    Ok(identity)
}

fn plugin_name(name: Result<Path<String>, PathRejection>) -> Result<PluginName, ApiError> {
    let Path(name) = name.map_err(|e| {
        let mut error = ApiError::invalid_param("name", format!("the plugin name: {e}"));
        error.code = "invalid_plugin_name";
        error
    })?;
    PluginName::parse(&name).map_err(store_error)
}

/// The body, at most [`MAX_COMPONENT_BYTES`]: a declared length over it is
/// refused before reading, and reading stops as soon as it is passed.
/// (The router's body limit is the gateway's `max_body_bytes`, for JSON;
/// this route reads its body itself.)
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_COMPONENT_BYTES as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match BodyDeadline::caused(&e) {
            Some(late) => ApiError::body_timeout(late),
            None => ApiError::invalid_body(format!("the body could not be read: {e}")),
        })?;
        if bytes.len() + chunk.len() > MAX_COMPONENT_BYTES {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn too_large() -> ApiError {
    let mut error = ApiError::too_large(format!(
        "the component is larger than {MAX_COMPONENT_BYTES} bytes, the most a plugin may be"
    ));
    error.code = "plugin_too_large";
    error
}

/// The API's view of a stored plugin.
fn plugin_json(info: &PluginInfo) -> Value {
    json!({
        "object": "plugin",
        "name": info.name,
        "digest": format!("sha256:{}", info.digest),
        "size_bytes": info.size_bytes,
        "imports": info.imports,
        "created_at": info.created_at,
        "version": info.version,
    })
}

fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Disabled => ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            kind: "server_error",
            code: "plugin_uploads_disabled",
            message: e.to_string(),
            param: None,
            headers: None,
        },
        StoreError::InvalidName { .. } => {
            let mut error = ApiError::invalid_param("name", e.to_string());
            error.code = "invalid_plugin_name";
            error
        }
        StoreError::TooManyPlugins { .. } => ApiError::forbidden("too_many_plugins", e.to_string()),
        StoreError::TooManyVersionFloors { .. } => {
            ApiError::forbidden("too_many_deleted_plugins", e.to_string())
        }
        StoreError::NotFound { .. } => ApiError::not_found("plugin_not_found", e.to_string()),
        StoreError::VersionNotNewer { .. } => {
            let mut error = ApiError::invalid_param(VERSION_HEADER, e.to_string());
            error.status = StatusCode::CONFLICT;
            error.code = "plugin_version_not_newer";
            error
        }
        StoreError::Refused(e) => refused(e),
        StoreError::Unavailable(_) => {
            tracing::warn!("plugin change refused: {e}");
            let mut error = ApiError::unavailable(
                "plugin_store_unavailable",
                "the plugin store is unavailable: retry later (repeating the same change is \
                 safe)",
            );
            error
                .headers
                .get_or_insert_default()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            error
        }
        StoreError::InvalidTenant { .. } | StoreError::InUse { .. } | StoreError::Io { .. } => {
            ApiError::internal(e)
        }
    }
}

/// An upload the plugin host refused: the uploader's fault (400, naming
/// the rule), unless the gateway was busy (503, retry) or broken (500).
fn refused(e: PluginError) -> ApiError {
    match e {
        PluginError::TooLarge { .. } => too_large(),
        // The tenant's own upload in progress: its limit, not the gateway's.
        PluginError::TenantCompileBusy { .. } => ApiError::rate_limited(e.code(), e.to_string()),
        PluginError::CompileBusy { .. } => {
            let mut error = ApiError::unavailable(e.code(), e.to_string());
            error
                .headers
                .get_or_insert_default()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            error
        }
        PluginError::Engine { .. } => ApiError::internal(e),
        e => {
            let mut error = ApiError::invalid_body(e.to_string());
            error.code = e.code();
            error
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_store_is_a_503_to_retry_that_names_no_database() {
        let error = store_error(StoreError::Unavailable(
            "PostgreSQL 10.0.0.5:5432 schema `bulkhead`: PostgreSQL query failed".into(),
        ));
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.code, "plugin_store_unavailable");
        assert!(!error.message.contains("10.0.0.5"), "{}", error.message);
        let headers = error.headers.expect("Retry-After");
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "5");
    }
}
