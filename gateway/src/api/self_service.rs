//! What a principal may read about itself or, for operators, about every
//! tenant:
//!
//! - `GET /v1/usage` (tenant, `inference`): the caller's own requests and
//!   tokens by UTC day and model, from the book the request path fills
//!   where the token limiter is charged.
//! - `GET /v1/audit/entries` (tenant, `plugins:write`): the caller's own
//!   entries in the audit log (its plugin uploads and deletes), each with
//!   its RFC 9162 inclusion proof against the current signed checkpoint,
//!   so a tenant can check its actions are in the log without seeing
//!   anyone else's.
//! - `GET /admin/v1/usage` (operator, `usage:read`): every tenant's usage,
//!   by day, or by hour with GPU-seconds for billing (`from`, `to`).
//! - `GET /admin/v1/tenants` (operator, `tenants:read`): every tenant's
//!   effective policy (never key material).

use std::time::SystemTime;

use axum::Json;
use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bulkhead_partition::{Compute, Isolation};
use serde_json::{Value, json};

use super::App;
use super::audit::{Params, QueryParams, audit_error, audit_log, encode, range_error, raw_json};
use super::error::ApiError;
use super::identity::{OperatorCall, TenantCall};
use crate::limits::{KEPT_DAYS, Totals, day_of, day_text, hour_text, parse_hour};
use crate::policy::TenantPolicy;

/// Days of usage shown when `days` is not given.
const DEFAULT_USAGE_DAYS: u64 = 31;
/// Most entries one `GET /v1/audit/entries` returns (each with a proof).
pub const MAX_TENANT_ENTRIES: u64 = 100;

/// `GET /v1/usage?days=N`.
pub async fn usage(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    params: Params,
) -> Response {
    let result = (|| {
        let from = first_day(params, &["days"])?;
        let tenant = &call.identity.tenant;
        Ok::<_, ApiError>(json!({
            "object": "usage",
            "tenant": tenant,
            "data": usage_rows(&app, tenant, from, false),
        }))
    })();
    json_or_error(result)
}

/// `GET /admin/v1/usage?days=N&tenant=ID`, or hourly with
/// `from=TIME&to=TIME` (`[from, to)`, UTC hours).
pub async fn all_usage(
    State(app): State<App>,
    Extension(_): Extension<OperatorCall>,
    params: Params,
) -> Response {
    let result = (|| {
        let tenant = match &params {
            Ok(query) => query.0.get("tenant").cloned(),
            Err(_) => None,
        };
        let hourly = matches!(&params, Ok(q) if q.0.contains_key("from") || q.0.contains_key("to"));
        if hourly {
            let query = QueryParams::new(params, &["from", "to", "tenant"])?;
            return hourly_usage(&app, &query, tenant.as_deref());
        }
        let from = first_day(params, &["days", "tenant", "from", "to"])?;
        let tenants = match tenant {
            Some(tenant) => vec![tenant],
            None => app.usage.tenants(),
        };
        let data: Vec<Value> = tenants
            .iter()
            .flat_map(|tenant| usage_rows(&app, tenant, from, true))
            .collect();
        Ok::<_, ApiError>(json!({"object": "list", "data": data}))
    })();
    json_or_error(result)
}

/// Most hours one hourly query covers: all that is kept.
const MAX_USAGE_HOURS: u32 = KEPT_DAYS * 24;

/// The hourly rows of `[from, to)` (both required), for billing.
fn hourly_usage(app: &App, query: &QueryParams, tenant: Option<&str>) -> Result<Value, ApiError> {
    let hour = |name: &str| -> Result<u32, ApiError> {
        let text = query.text(name).ok_or_else(|| {
            usage_range(
                name,
                format!("`{name}` is required with an hourly query (`from` and `to`)"),
            )
        })?;
        parse_hour(text).ok_or_else(|| {
            usage_range(
                name,
                format!("`{name}` is `{text}`; expected a UTC date or time: YYYY-MM-DD, YYYY-MM-DDTHH or YYYY-MM-DDTHH:MM:SSZ"),
            )
        })
    };
    let (from, to) = (hour("from")?, hour("to")?);
    if to <= from || to - from > MAX_USAGE_HOURS {
        return Err(usage_range(
            "to",
            format!(
                "`to` must be after `from` and at most {KEPT_DAYS} days later (usage is kept that long)"
            ),
        ));
    }
    let data: Vec<Value> = app
        .usage
        .hours(tenant, from, to)
        .into_iter()
        .map(|row| {
            let t = row.totals;
            json!({
                "hour": hour_text(row.hour),
                "tenant": row.tenant,
                "model": row.model,
                "requests": t.requests,
                "prompt_tokens": t.prompt_tokens,
                "completion_tokens": t.completion_tokens,
                "total_tokens": t.prompt_tokens + t.completion_tokens,
                "gpu_seconds": t.compute_us as f64 / 1e6,
            })
        })
        .collect();
    Ok(json!({
        "object": "list",
        "from": hour_text(from),
        "to": hour_text(to),
        "data": data,
    }))
}

fn usage_range(param: &str, message: String) -> ApiError {
    let mut error = ApiError::invalid_param(param, message);
    error.code = "invalid_usage_range";
    error
}

/// The first day `days` (default [`DEFAULT_USAGE_DAYS`], at most
/// [`KEPT_DAYS`]) asks for, today included.
fn first_day(params: Params, known: &[&str]) -> Result<u32, ApiError> {
    let params = QueryParams::new(params, known)?;
    let days = params.number("days")?.unwrap_or(DEFAULT_USAGE_DAYS);
    if days == 0 || days > u64::from(KEPT_DAYS) {
        let mut error = ApiError::invalid_param(
            "days",
            format!("`days` must be from 1 to {KEPT_DAYS} (usage is kept that long); got {days}"),
        );
        error.code = "invalid_usage_range";
        return Err(error);
    }
    Ok(day_of(SystemTime::now()).saturating_sub(days as u32 - 1))
}

fn usage_rows(app: &App, tenant: &str, from: u32, with_tenant: bool) -> Vec<Value> {
    app.usage
        .of(tenant, from)
        .into_iter()
        .map(|(day, model, totals)| {
            let Totals {
                requests,
                prompt_tokens,
                completion_tokens,
                compute_us,
            } = totals;
            let mut row = json!({
                "date": day_text(day),
                "model": model,
                "requests": requests,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "gpu_seconds": compute_us as f64 / 1e6,
            });
            if with_tenant {
                row["tenant"] = json!(tenant);
            }
            row
        })
        .collect()
}

/// `GET /v1/audit/entries?from=INDEX&limit=N`: the caller's own entries
/// at or after log index `from`, with proofs against one checkpoint.
pub async fn audit_entries(
    State(app): State<App>,
    Extension(call): Extension<TenantCall>,
    params: Params,
) -> Response {
    let result = async {
        let log = audit_log(&app)?;
        let params = QueryParams::new(params, &["from", "limit"])?;
        let from = params.number("from")?.unwrap_or(0);
        let limit = params.number("limit")?.unwrap_or(MAX_TENANT_ENTRIES);
        if limit == 0 || limit > MAX_TENANT_ENTRIES {
            return Err(range_error(
                "limit",
                format!("`limit` must be from 1 to {MAX_TENANT_ENTRIES}; got {limit}"),
            ));
        }
        let tenant = call.identity.tenant;
        tokio::task::spawn_blocking(move || {
            // The checkpoint first: every entry shown is in the tree it signs.
            let note = log.checkpoint().map_err(audit_error)?;
            let size = checkpoint_size(&note)?;
            let (indexes, _) = log.tenant_entries(&tenant, from, limit as usize + 1);
            let mut indexes: Vec<u64> = indexes.into_iter().filter(|&i| i < size).collect();
            let next = (indexes.len() > limit as usize).then(|| indexes.pop()).flatten();
            let mut body = format!(
                "{{\"object\":\"list\",\"tenant\":{},\"tree_size\":{size},\"checkpoint\":{},\"next_from\":{},\"data\":[",
                json!(tenant),
                json!(note),
                next.map_or("null".to_owned(), |n| n.to_string()),
            )
            .into_bytes();
            for (n, index) in indexes.iter().enumerate() {
                let entry = log
                    .entries(*index, index + 1)
                    .map_err(audit_error)?
                    .pop()
                    .ok_or_else(|| ApiError::internal("an indexed audit entry is missing"))?;
                let proof = log.inclusion_proof(*index, size).map_err(audit_error)?;
                let leaf = log
                    .leaf(*index)
                    .ok_or_else(|| ApiError::internal("an indexed audit leaf is missing"))?;
                if n > 0 {
                    body.push(b',');
                }
                // The entry exactly as stored (canonical JSON), so its leaf
                // hash can be recomputed from what is served.
                body.extend_from_slice(format!("{{\"index\":{index},\"leaf_hash\":\"{}\",\"inclusion_proof\":{},\"entry\":", BASE64.encode(leaf), json!(encode(&proof))).as_bytes());
                body.extend_from_slice(&entry);
                body.push(b'}');
            }
            body.extend_from_slice(b"]}");
            Ok::<_, ApiError>(body)
        })
        .await
        .map_err(ApiError::internal)?
    }
    .await;
    raw_json(result)
}

/// The tree size a checkpoint note commits to (its second line).
fn checkpoint_size(note: &str) -> Result<u64, ApiError> {
    note.lines()
        .nth(1)
        .and_then(|line| line.parse().ok())
        .ok_or_else(|| ApiError::internal("the signed checkpoint has no tree size"))
}

/// `GET /admin/v1/tenants`: every tenant's effective policy.
pub async fn tenants(State(app): State<App>, Extension(_): Extension<OperatorCall>) -> Response {
    let snapshot = app.snapshot.load();
    let data: Vec<Value> = snapshot
        .policy
        .tenants
        .values()
        .map(|tenant| tenant_json(tenant, snapshot.limiters.in_flight(&tenant.id)))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

fn tenant_json(tenant: &TenantPolicy, in_flight: Option<u32>) -> Value {
    let limits = &tenant.limits;
    let gpu = &tenant.gpu;
    let compute = match gpu.compute {
        Compute::Unset => Value::Null,
        Compute::Cus(n) => json!({"cus": n}),
        Compute::Share(share) => json!({"share": share}),
    };
    json!({
        "object": "tenant",
        "id": tenant.id,
        "file": tenant.source.name,
        "issuer": tenant.jwt.issuer.get_ref(),
        "models": tenant.models,
        "limits": {
            "requests_per_s": limits.requests_per_s,
            "burst": limits.burst,
            "tokens_per_min": limits.tokens_per_min,
            "max_concurrent": limits.max_concurrent,
            "max_body_bytes": limits.max_body_bytes,
            "max_tokens": limits.max_tokens,
            "per_sub": limits.per_sub,
        },
        "gpu": {
            "isolation": match gpu.isolation {
                Isolation::Dedicated => "dedicated",
                Isolation::Shared => "shared",
            },
            "compute": compute,
            "hbm_bytes": gpu.hbm_bytes,
            "weight": gpu.weight,
        },
        "plugins": {
            "on_request": tenant.plugins.on_request.iter().map(|p| &**p).collect::<Vec<&str>>(),
            "on_response": tenant.plugins.on_response.iter().map(|p| &**p).collect::<Vec<&str>>(),
        },
        "prompts": {"parse_special": tenant.parse_special},
        "telemetry": {"record_content": tenant.record_content},
        "in_flight": in_flight,
    })
}

fn json_or_error(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(body) => Json(body).into_response(),
        Err(error) => error.into_response(),
    }
}
