//! The model registration API (admin listener):
//!
//! - `POST /admin/v1/models` (scope `models:write`) with `{"name", "dir",
//!   "file"?, "signature": <bundle>}`: verified with the trusted
//!   publishers, loaded by the gpu-host (every byte hashed), stored,
//!   recorded → 201.
//! - `DELETE /admin/v1/models/{name}` (`models:write`): a model registered
//!   through the API.
//! - `GET /admin/v1/models` (`models:read`): every registration and its
//!   state on the host.
//!
//! Refusals are recorded in the audit log as well as answered, each with a
//! stable `code` (`model_signature_untrusted`, `model_digest_mismatch`, …),
//! and every call to the two changing routes writes an `admin.action`
//! entry (who, route, target, outcome) before it is answered.

use std::path::PathBuf;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::App;
use super::error::ApiError;
use super::identity::OperatorCall;
use crate::audit::{Actor, Event, Outcome};
use crate::auth::OperatorIdentity;
use crate::reconcile::{ModelState, ModelView};
use crate::registration::{MAX_REGISTRATION_BUNDLE_BYTES, RegistrationError, Source};
use crate::upstream::{LoadError, UpstreamError};

/// Largest request body: the bundle and a few short fields.
pub const MAX_REGISTER_BODY_BYTES: usize = MAX_REGISTRATION_BUNDLE_BYTES + (16 << 10);

/// The body of `POST /admin/v1/models`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    pub name: String,
    /// The model folder, a path on the gpu-host's machine.
    pub dir: PathBuf,
    /// The weights file inside it, as the manifest names it.
    #[serde(default)]
    pub file: Option<String>,
    /// The signature bundle (the `.sig` file's JSON).
    pub signature: Value,
}

impl RegisterRequest {
    /// Parses a body; the error is the client's (400 `invalid_request`).
    pub fn parse(body: &[u8]) -> Result<RegisterRequest, ApiError> {
        let request: RegisterRequest = serde_json::from_slice(body).map_err(|e| {
            invalid_request(format!(
                "the body must be JSON {{\"name\", \"dir\", \"file\"?, \"signature\"}}: {e}"
            ))
        })?;
        if !request.signature.is_object() {
            return Err(invalid_request(
                "`signature` must be the signature bundle's JSON object (the .sig file's contents)",
            ));
        }
        Ok(request)
    }
}

/// `POST /admin/v1/models`.
pub async fn register(
    State(app): State<App>,
    Extension(call): Extension<OperatorCall>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let identity = call.identity;
    let mut target = String::new();
    let result = async {
        if !app.models.enabled() {
            return Err(registration_error(RegistrationError::Disabled));
        }
        let body = read_body(&headers, body).await?;
        let request = RegisterRequest::parse(&body)?;
        target.clone_from(&request.name);
        app.audit.ready().await.map_err(super::audit::unrecorded)?;
        let registered = app
            .models
            .register(
                request.name,
                request.dir,
                request.file,
                request.signature,
                actor(&identity),
                identity.sub.clone(),
            )
            .await
            .map_err(registration_error)?;
        let r = &registered.registration;
        Ok::<_, ApiError>(json!({
            "object": "model.registration",
            "name": r.name,
            "digest": r.digest,
            "publisher": r.publisher,
            "dir": r.dir,
            "file": r.file.name,
            "size_bytes": r.file.size,
            "load_ms": registered.load_ms,
            "source": "api",
        }))
    }
    .await;
    let result = record_action(&app, &identity, "POST /admin/v1/models", target, result).await;
    match result {
        Ok(body) => (StatusCode::CREATED, Json(body)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `DELETE /admin/v1/models/{name}`.
pub async fn unregister(
    State(app): State<App>,
    Extension(call): Extension<OperatorCall>,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let identity = call.identity;
    let mut target = String::new();
    let result = async {
        let Path(name) =
            name.map_err(|e| invalid_request(format!("the model name in the path: {e}")))?;
        target.clone_from(&name);
        app.audit.ready().await.map_err(super::audit::unrecorded)?;
        let digest = app
            .models
            .unregister(&name, actor(&identity))
            .await
            .map_err(registration_error)?;
        Ok::<_, ApiError>(json!({
            "object": "model.registration.deleted",
            "name": name,
            "digest": digest,
            "deleted": true,
        }))
    }
    .await;
    let result = record_action(
        &app,
        &identity,
        "DELETE /admin/v1/models/{name}",
        target,
        result,
    )
    .await;
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

/// Writes the `admin.action` entry of an operator call that may change
/// state, before it is answered. A call the log could not take is answered
/// 503 `audit_unavailable` instead (its change, if any, is already in the
/// log as its own entry: `model.register`, `model.unregister`); a call
/// refused because the log is failing is not recorded again.
pub(super) async fn record_action(
    app: &App,
    identity: &OperatorIdentity,
    route: &str,
    target: String,
    result: Result<Value, ApiError>,
) -> Result<Value, ApiError> {
    let outcome = match &result {
        Err(error) if error.code == "audit_unavailable" => return result,
        Err(error) => Outcome::Refused {
            reason: format!("{}: {}", error.code, error.message),
        },
        Ok(_) => Outcome::Accepted,
    };
    let event = Event::AdminAction {
        route: route.to_owned(),
        target,
        outcome,
    };
    app.audit
        .record_async(actor(identity), event)
        .await
        .map_err(super::audit::unrecorded)?;
    result
}

/// `GET /admin/v1/models`.
pub async fn list(State(app): State<App>, Extension(_): Extension<OperatorCall>) -> Response {
    let data: Vec<Value> = app.models.list().await.iter().map(view_json).collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

fn actor(identity: &OperatorIdentity) -> Actor {
    Actor::Operator {
        issuer: Some(identity.issuer.clone()),
        tenant: None,
        sub: identity.sub.clone(),
    }
}

fn view_json(view: &ModelView) -> Value {
    let (source, registered_at, registered_by) = match &view.source {
        Source::Policy => ("policy", None, None),
        Source::Api {
            registered_at,
            registered_by,
        } => ("api", Some(registered_at), registered_by.as_ref()),
    };
    let (state, reason, verified_at) = state_json(&view.state);
    let hosts: Vec<Value> = view
        .hosts
        .iter()
        .map(|(host, state)| {
            let (state, reason, verified_at) = state_json(state);
            json!({
                "host": host,
                "state": state,
                "reason": reason,
                "weights_verified_at_unix_ms": verified_at,
            })
        })
        .collect();
    let registration = view.registration.as_ref();
    json!({
        "object": "model.registration",
        "name": view.name,
        "source": source,
        "digest": registration.map(|r| &r.digest),
        "publisher": registration.map(|r| &r.publisher),
        "dir": registration.map(|r| &r.dir),
        "file": registration.map(|r| &r.file.name),
        "size_bytes": registration.and_then(|r| r.file.size),
        "state": state,
        "reason": reason,
        "weights_verified_at_unix_ms": verified_at,
        "registered_at": registered_at,
        "registered_by": registered_by,
        "hosts": hosts,
    })
}

/// A state's name, reason and verification time.
fn state_json(state: &ModelState) -> (&'static str, Option<&String>, Option<u64>) {
    match state {
        ModelState::Serving {
            verified_at_unix_ms,
        } => ("serving", None, Some(*verified_at_unix_ms)),
        ModelState::OutOfService {
            reason,
            verified_at_unix_ms,
        } => ("out_of_service", Some(reason), Some(*verified_at_unix_ms)),
        ModelState::NotLoaded => ("not_loaded", None, None),
        ModelState::Failed { reason } => ("failed", Some(reason), None),
        ModelState::Refused { reason } => ("refused", Some(reason), None),
        ModelState::Unknown { reason } => ("unknown", Some(reason), None),
    }
}

/// The body, at most [`MAX_REGISTER_BODY_BYTES`] (whatever the gateway's
/// `max_body_bytes`: a registration is not a tenant's request).
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_REGISTER_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| invalid_request(format!("the body could not be read: {e}")))?;
        if bytes.len() + chunk.len() > MAX_REGISTER_BODY_BYTES {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn too_large() -> ApiError {
    ApiError::too_large(format!(
        "a registration is at most {MAX_REGISTER_BODY_BYTES} bytes (the signature bundle at \
         most {MAX_REGISTRATION_BUNDLE_BYTES})"
    ))
}

fn invalid_request(message: impl Into<String>) -> ApiError {
    let mut error = ApiError::invalid_body(message);
    error.code = "invalid_request";
    error
}

/// Each refusal with its status and stable code.
fn registration_error(e: RegistrationError) -> ApiError {
    let message = e.to_string();
    let with = |status: StatusCode, kind: &'static str, code: &'static str| ApiError {
        status,
        kind,
        code,
        message: message.clone(),
        param: None,
        headers: None,
    };
    let param = |param: &str, code: &'static str| {
        let mut error = ApiError::invalid_param(param, message.clone());
        error.code = code;
        error
    };
    match e {
        RegistrationError::InvalidName(_) => param("name", "invalid_model_name"),
        RegistrationError::InvalidDir(_) => param("dir", "invalid_model_dir"),
        RegistrationError::BundleTooLarge { .. } => too_large(),
        RegistrationError::InvalidBundle(_) => param("signature", "model_signature_invalid"),
        RegistrationError::Untrusted(_) => {
            ApiError::forbidden("model_signature_untrusted", message)
        }
        RegistrationError::File(_) => param("file", "model_file_not_signed"),
        RegistrationError::Exists(_) => with(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "model_exists",
        ),
        RegistrationError::Configured(_) => with(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "model_configured",
        ),
        RegistrationError::NotFound(_) => ApiError::not_found("model_not_found", message),
        RegistrationError::TooMany(_) => ApiError::forbidden("too_many_models", message),
        RegistrationError::Disabled => with(
            StatusCode::NOT_IMPLEMENTED,
            "server_error",
            "model_registration_disabled",
        ),
        RegistrationError::Load(load) => match load {
            LoadError::NameTaken(_) => with(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "model_exists",
            ),
            LoadError::FileNotFound(_) => ApiError::not_found("model_file_not_found", message),
            LoadError::Mismatch(_) => with(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                "model_digest_mismatch",
            ),
            LoadError::Invalid(_) => with(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request_error",
                "model_invalid",
            ),
            LoadError::Busy(_) => {
                let mut error = ApiError::unavailable("model_load_busy", message);
                error
                    .headers
                    .get_or_insert_default()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                error
            }
            LoadError::Upstream(e) => upstream_error(e),
        },
        RegistrationError::Upstream(e) => upstream_error(e),
        RegistrationError::Store { .. } => ApiError::internal(e),
        RegistrationError::Unavailable(_) => {
            let mut error = ApiError::unavailable("state_unavailable", message);
            error
                .headers
                .get_or_insert_default()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            error
        }
        RegistrationError::Audit(e) => super::audit::unrecorded(e),
        RegistrationError::OnHost(host, e) => {
            let mut error = registration_error(*e);
            error.message = format!("gpu-host `{host}`: {}", error.message);
            error
        }
    }
}

fn upstream_error(e: UpstreamError) -> ApiError {
    match e {
        UpstreamError::Unavailable(_) | UpstreamError::Overloaded(_) => {
            ApiError::unavailable("upstream_unavailable", e.to_string())
        }
        other => ApiError::internal(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_bodies_are_parsed_strictly() {
        let ok = RegisterRequest::parse(
            br#"{"name":"m","dir":"/models/m","file":"m.gguf","signature":{"mediaType":"x"}}"#,
        )
        .unwrap();
        assert_eq!(ok.name, "m");
        assert_eq!(ok.dir, PathBuf::from("/models/m"));
        assert_eq!(ok.file.as_deref(), Some("m.gguf"));
        let no_file = RegisterRequest::parse(br#"{"name":"m","dir":"/m","signature":{}}"#).unwrap();
        assert_eq!(no_file.file, None);

        for (body, needle) in [
            (&b"not json"[..], "must be JSON"),
            (br#"{"name":"m","dir":"/m"}"#, "missing field `signature`"),
            (br#"{"name":"m","signature":{}}"#, "missing field `dir`"),
            (
                br#"{"name":"m","dir":"/m","signature":{},"path":"/x"}"#,
                "unknown field `path`",
            ),
            (
                br#"{"name":"m","dir":"/m","signature":"{}"}"#,
                "JSON object",
            ),
            (
                br#"{"name":"m","name":"n","dir":"/m","signature":{}}"#,
                "duplicate field `name`",
            ),
            (br#"{"name":7,"dir":"/m","signature":{}}"#, "invalid type"),
        ] {
            let error = RegisterRequest::parse(body).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            assert_eq!(error.code, "invalid_request");
            assert!(
                error.message.contains(needle),
                "{needle}: {}",
                error.message
            );
        }
    }

    #[test]
    fn refusals_have_stable_statuses_and_codes() {
        let cases = [
            (
                RegistrationError::Untrusted("no".into()),
                403,
                "model_signature_untrusted",
            ),
            (
                RegistrationError::Load(LoadError::Mismatch("x.gguf differs".into())),
                422,
                "model_digest_mismatch",
            ),
            (RegistrationError::Exists("m".into()), 409, "model_exists"),
            (
                RegistrationError::Load(LoadError::NameTaken("m".into())),
                409,
                "model_exists",
            ),
            (
                RegistrationError::Load(LoadError::FileNotFound("x".into())),
                404,
                "model_file_not_found",
            ),
            (
                RegistrationError::Configured("m".into()),
                409,
                "model_configured",
            ),
            (
                RegistrationError::NotFound("m".into()),
                404,
                "model_not_found",
            ),
            (
                RegistrationError::File("x".into()),
                400,
                "model_file_not_signed",
            ),
            (
                RegistrationError::Disabled,
                501,
                "model_registration_disabled",
            ),
        ];
        for (error, status, code) in cases {
            let message = error.to_string();
            let api = registration_error(error);
            assert_eq!((api.status.as_u16(), api.code), (status, code));
            assert_eq!(api.message, message, "the message is passed on");
        }
    }
}
