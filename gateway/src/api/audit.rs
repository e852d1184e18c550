//! The operator's audit API (scope `audit:read`, admin listener): `GET /admin/v1/audit/checkpoint` (the
//! signed note, signing a new one when the log grew),
//! `/admin/v1/audit/entries?from=&to=` (at most [`MAX_PAGE`] entries, as
//! stored), `/admin/v1/audit/proof/inclusion?index=&size=` and
//! `/admin/v1/audit/proof/consistency?from=&to=` (hashes in base64). Sizes
//! left out mean the whole log. Reads only; file I/O on blocking threads.

use std::collections::HashMap;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Extension, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::json;

use super::App;
use super::error::ApiError;
use super::identity::OperatorCall;
use crate::audit::{AuditError, AuditLog, Hash, ProofError};

/// Most entries one `entries` call returns.
pub const MAX_PAGE: u64 = 1000;

pub type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// `GET /admin/v1/audit/checkpoint`: `text/plain`, the C2SP signed note.
pub async fn checkpoint(State(app): State<App>, Extension(_): Extension<OperatorCall>) -> Response {
    let result = async {
        let log = audit_log(&app)?;
        let note = tokio::task::spawn_blocking(move || log.checkpoint())
            .await
            .map_err(ApiError::internal)?
            .map_err(audit_error)?;
        Ok::<_, ApiError>(note)
    }
    .await;
    match result {
        Ok(note) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], note).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /admin/v1/audit/entries?from=&to=`: entries `from..to` (`to`
/// excluded), each exactly as stored (canonical JSON: hash it with a 0x00
/// prefix for its leaf).
pub async fn entries(
    State(app): State<App>,
    Extension(_): Extension<OperatorCall>,
    params: Params,
) -> Response {
    let result = async {
        let log = synced_log(&app).await?;
        let params = QueryParams::new(params, &["from", "to"])?;
        let size = log.size();
        let from = params.number("from")?.unwrap_or(0);
        let to = params
            .number("to")?
            .unwrap_or_else(|| size.min(from.saturating_add(MAX_PAGE)));
        if from > to || to > size {
            return Err(range_error(
                if to > size { "to" } else { "from" },
                format!("`from` must be at most `to`, and `to` at most the log's size ({size}); got {from}..{to}"),
            ));
        }
        if to - from > MAX_PAGE {
            return Err(range_error(
                "to",
                format!("at most {MAX_PAGE} entries per call; got {}", to - from),
            ));
        }
        let read = tokio::task::spawn_blocking(move || log.entries(from, to))
            .await
            .map_err(ApiError::internal)?
            .map_err(audit_error)?;
        // The stored bytes are JSON the gateway wrote; embed them as they
        // are so nothing is re-encoded between the file and the client.
        let mut body = format!(
            "{{\"object\":\"list\",\"from\":{from},\"to\":{to},\"tree_size\":{size},\"data\":["
        )
        .into_bytes();
        for (i, entry) in read.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(entry);
        }
        body.extend_from_slice(b"]}");
        Ok::<_, ApiError>(body)
    }
    .await;
    raw_json(result)
}

/// A JSON body assembled by hand around stored entries (so their bytes
/// reach the client as they were hashed), or the error.
pub fn raw_json(result: Result<Vec<u8>, ApiError>) -> Response {
    match result {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /admin/v1/audit/proof/inclusion?index=&size=`.
pub async fn inclusion(
    State(app): State<App>,
    Extension(_): Extension<OperatorCall>,
    params: Params,
) -> Response {
    let log = match synced_log(&app).await {
        Ok(log) => log,
        Err(error) => return error.into_response(),
    };
    let result = (|| {
        let params = QueryParams::new(params, &["index", "size"])?;
        let Some(index) = params.number("index")? else {
            return Err(range_error("index", "`index` is required".into()));
        };
        let size = params.number("size")?.unwrap_or_else(|| log.size());
        let hashes = log.inclusion_proof(index, size).map_err(audit_error)?;
        let leaf = log
            .leaf(index)
            .ok_or_else(|| ApiError::internal("a proven leaf is missing"))?;
        Ok(json!({
            "object": "audit.inclusion_proof",
            "index": index,
            "tree_size": size,
            "leaf_hash": BASE64.encode(leaf),
            "hashes": encode(&hashes),
        }))
    })();
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /admin/v1/audit/proof/consistency?from=&to=`.
pub async fn consistency(
    State(app): State<App>,
    Extension(_): Extension<OperatorCall>,
    params: Params,
) -> Response {
    let log = match synced_log(&app).await {
        Ok(log) => log,
        Err(error) => return error.into_response(),
    };
    let result = (|| {
        let params = QueryParams::new(params, &["from", "to"])?;
        let Some(from) = params.number("from")? else {
            return Err(range_error("from", "`from` is required".into()));
        };
        let to = params.number("to")?.unwrap_or_else(|| log.size());
        let hashes = log.consistency_proof(from, to).map_err(|e| {
            let mut error = audit_error(e);
            if error.param.as_deref() == Some("size") {
                error.param = Some("to".into());
            }
            error
        })?;
        Ok(json!({
            "object": "audit.consistency_proof",
            "from": from,
            "to": to,
            "hashes": encode(&hashes),
        }))
    })();
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The audit log with the entries other replicas appended to a shared
/// store brought in (best effort: without the store, proofs still answer
/// for what this replica knows).
pub async fn synced_log(app: &App) -> Result<AuditLog, ApiError> {
    let log = audit_log(app)?;
    let syncing = log.clone();
    match tokio::task::spawn_blocking(move || syncing.sync()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the audit log could not catch up"),
        Err(e) => return Err(ApiError::internal(e)),
    }
    Ok(log)
}

/// The audit log, or 501 on a gateway without one.
pub fn audit_log(app: &App) -> Result<AuditLog, ApiError> {
    app.audit.log().cloned().ok_or_else(|| ApiError {
        status: StatusCode::NOT_IMPLEMENTED,
        kind: "server_error",
        code: "audit_disabled",
        message: "this gateway keeps no audit log: add `[audit] dir = \"...\"` to gateway.toml"
            .into(),
        param: None,
        headers: None,
    })
}

/// Query parameters, only the known ones allowed.
pub struct QueryParams(HashMap<String, String>);

impl QueryParams {
    pub fn new(params: Params, known: &[&str]) -> Result<QueryParams, ApiError> {
        let Query(params) = params.map_err(|e| {
            let mut error = ApiError::invalid_param("", format!("the query string: {e}"));
            error.param = None;
            error
        })?;
        if let Some(unknown) = params.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ApiError::invalid_param(
                unknown.clone(),
                format!(
                    "unknown parameter `{unknown}` (known: {})",
                    known.join(", ")
                ),
            ));
        }
        Ok(QueryParams(params))
    }

    pub fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.0
            .get(name)
            .map(|text| {
                text.parse::<u64>().map_err(|_| {
                    range_error(
                        name,
                        format!("`{name}` must be a non-negative integer, got `{text}`"),
                    )
                })
            })
            .transpose()
    }

    pub fn text(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

pub fn range_error(param: &str, message: String) -> ApiError {
    let mut error = ApiError::invalid_param(param, message);
    error.code = "invalid_audit_range";
    error
}

pub fn encode(hashes: &[Hash]) -> Vec<String> {
    hashes.iter().map(|h| BASE64.encode(h)).collect()
}

pub fn audit_error(e: AuditError) -> ApiError {
    match e {
        AuditError::Proof(proof) => {
            let param = match proof {
                ProofError::IndexOutOfRange { .. } => "index",
                ProofError::Backwards { .. } => "from",
                _ => "size",
            };
            range_error(param, proof.to_string())
        }
        AuditError::Failed(_) | AuditError::Unavailable(_) => {
            ApiError::unavailable("audit_unavailable", e.to_string())
        }
        other => ApiError::internal(other),
    }
}

/// A control-plane action could not be recorded: it is refused (503).
pub fn unrecorded(e: AuditError) -> ApiError {
    tracing::error!(error = %e, "an action could not be recorded in the audit log");
    ApiError::unavailable(
        "audit_unavailable",
        "the audit log cannot record this action, so it is refused; the gateway's log says why",
    )
}
