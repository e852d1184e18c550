//! Every error the HTTP API returns, in OpenAI's shape
//! `{"error":{"message","type","param","code"}}`, with an honest status and a
//! stable `code`. Messages say what was wrong and never carry secrets.

use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::AuthError;
use crate::limits::{RejectReason, Rejection};
use crate::pipeline::HookFailure;
use crate::upstream::UpstreamError;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI's `type`.
    pub kind: &'static str,
    /// Stable machine-readable code, e.g. `token_expired`.
    pub code: &'static str,
    pub message: String,
    /// The request parameter at fault, if one is.
    pub param: Option<String>,
    /// Extra headers (rate-limit state, `Retry-After`); boxed to keep
    /// `Result<_, ApiError>` small on the hot path.
    pub headers: Option<Box<HeaderMap>>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        ApiError {
            status,
            kind,
            code,
            message,
            param: None,
            headers: None,
        }
    }

    /// 400 about one parameter.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_parameter",
            message.into(),
        );
        e.param = Some(param.into());
        e
    }

    /// 400 for a parameter we understand but do not support (e.g. `n > 1`).
    pub fn unsupported_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::invalid_param(param, message);
        e.code = "unsupported_parameter";
        e
    }

    /// 400 for a body that is not the JSON we expect.
    pub fn invalid_body(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_json",
            message.into(),
        )
    }

    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            code,
            message.into(),
        )
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            code,
            message.into(),
        )
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            code,
            message.into(),
        )
    }

    /// 408: the client did not send its whole body in time
    /// ([`super::deadline`]). The connection is closed after it.
    pub fn body_timeout(late: &super::deadline::BodyDeadline) -> Self {
        let mut error = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "body_timeout",
            format!("{late} ([connections] body_read_timeout_ms)"),
        );
        error.headers.get_or_insert_default().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        error
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "request_too_large",
            message.into(),
        )
    }

    pub fn rate_limited(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            code,
            message.into(),
        )
    }

    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            code,
            message.into(),
        )
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "server_error",
            "timeout",
            message.into(),
        )
    }

    /// A tenant plugin refused the request or response: its status
    /// (400–499) and its message, as the tenant wrote it.
    pub fn plugin_rejected(status: u16, message: String) -> Self {
        Self::new(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            "invalid_request_error",
            "plugin_rejected",
            message,
        )
    }

    /// A tenant plugin failed (trap, deadline, memory, output size, an
    /// invalid rewrite): 502, or 503 when every instance slot was busy.
    /// `code` names the limit or fault (`plugin_timeout`, …).
    pub fn plugin_failed(code: &'static str, retryable: bool, message: String) -> Self {
        let status = if retryable {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::BAD_GATEWAY
        };
        Self::new(status, "plugin_error", code, message)
    }

    /// 500 for a bug of ours; the detail goes to the log, not the client.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!("internal error: {detail}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            "the gateway failed to handle this request; it has been logged".into(),
        )
    }

    /// Adds headers (e.g. rate-limit state).
    pub fn with_headers(mut self, headers: HeaderMap) -> Self {
        self.headers.get_or_insert_default().extend(headers);
        self
    }

    /// The JSON body, also sent as an SSE event when a stream fails midway.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// A gpu-host failure as a tenant sees it: in the gateway's words, not the
/// host's, except where the host's text is about the caller's own request
/// (its parameters, its KV budget, the model it asked for being out of
/// service). The host's own text, which can name other tenants' models or
/// its internals, goes to the gateway's log only.
impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> ApiError {
        match e {
            UpstreamError::Unavailable(m) => {
                tracing::warn!(host = %m, "the gpu-host is unavailable");
                ApiError::unavailable(
                    "upstream_unavailable",
                    "the GPU host is unavailable (restarting or unreachable); retry shortly",
                )
            }
            UpstreamError::Overloaded(m) => {
                tracing::warn!(host = %m, "the gpu-host is overloaded");
                ApiError::unavailable(
                    "overloaded",
                    "the GPU host has no room for this request now; retry shortly",
                )
            }
            // The host's two refusals (gpu-host `SequenceError`): one that
            // waited its tenant's `kv_wait_ms` for room its other requests
            // held is worth retrying once one of them ends; one that can
            // never fit the tenant's share is not a rate limit at all, and
            // a 429 would only make clients retry it.
            UpstreamError::KvBudgetExceeded(m) if m.contains("kv_wait_ms") => {
                ApiError::rate_limited("kv_budget_exceeded", m)
                    .with_headers(header_map(vec![("retry-after", "1".to_owned())]))
            }
            UpstreamError::KvBudgetExceeded(m) => {
                let mut error = ApiError::invalid_param("max_tokens", m);
                error.code = "kv_budget_exceeded";
                error
            }
            UpstreamError::ModelNotFound(m) => {
                tracing::warn!(host = %m, "the gpu-host does not serve a registered model");
                ApiError::not_found(
                    "model_not_found",
                    "the GPU host does not serve this model right now (it may be loading); \
                     retry shortly",
                )
            }
            UpstreamError::ModelUnavailable(m) => ApiError::unavailable("model_unavailable", m),
            // The host's text names partitions and device addresses: the
            // tenant gets the kind, the log the rest.
            UpstreamError::DeviceError { kind, message } => {
                tracing::warn!(host = %message, kind = %kind, "the gpu-host's device failed a step");
                let why = match kind.as_str() {
                    "out_of_memory" => "the GPU ran out of memory in this request's partition",
                    "device_lost" => "the GPU is out of service",
                    _ => "a GPU operation failed",
                };
                ApiError::unavailable(
                    "device_error",
                    format!("{why} while running this request ({kind}); retry shortly"),
                )
                .with_headers(header_map(vec![("retry-after", "1".to_owned())]))
            }
            UpstreamError::InvalidArgument(m) => {
                let mut e = ApiError::invalid_param("", m);
                e.param = None;
                e
            }
            UpstreamError::Protocol(m) => ApiError::internal(m),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        let mut error = if e.status() == 403 {
            ApiError::forbidden(e.code(), e.to_string())
        } else {
            ApiError::unauthorized(e.code(), e.to_string())
        };
        if e.status() == 401 {
            error.headers.get_or_insert_default().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        error
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> ApiError {
        let code = match r.reason {
            RejectReason::RequestRate => "rate_limit_requests",
            RejectReason::TokenRate => "rate_limit_tokens",
            RejectReason::TooManyTokens => "request_exceeds_token_budget",
            RejectReason::Concurrency => "concurrency_limit",
            RejectReason::TooManySubjects => "too_many_subjects",
            RejectReason::UnknownTenant => "unknown_tenant",
        };
        let error = match r.reason {
            RejectReason::UnknownTenant => ApiError::forbidden(code, r.message.clone()),
            // Never fits a minute's budget: retrying cannot help, so it is
            // the request's fault (400), not a rate limit (429).
            RejectReason::TooManyTokens => {
                let mut error = ApiError::invalid_param("max_tokens", r.message.clone());
                error.code = code;
                error
            }
            _ => ApiError::rate_limited(code, r.message.clone()),
        };
        error.with_headers(header_map(r.to_header_pairs()))
    }
}

/// `(name, value)` pairs as headers (names are static and valid; values are
/// numbers and durations, always valid).
pub fn header_map(pairs: Vec<(&'static str, String)>) -> HeaderMap {
    pairs
        .into_iter()
        .filter_map(|(name, value)| {
            Some((
                HeaderName::from_static(name),
                HeaderValue::from_str(&value).ok()?,
            ))
        })
        .collect()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(headers) = self.headers {
            response.headers_mut().extend(*headers);
        }
        // Every 429 says when to retry (OpenAI's SDKs wait that long). The
        // limits set their own; one that cannot know (a tenant plugin's own
        // 429) gets a second, the shortest wait the header can say.
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .entry(axum::http::header::RETRY_AFTER)
                .or_insert(HeaderValue::from_static("1"));
        }
        response
    }
}

/// Names the plugin behind a plugin error or rejection on the response.
const PLUGIN_HEADER: HeaderName = HeaderName::from_static("x-bulkhead-plugin");

/// A plugin chain's failure as the client sees it: the plugin's own
/// status and message for a rejection, 502 naming the plugin otherwise.
impl From<HookFailure> for ApiError {
    fn from(failure: HookFailure) -> ApiError {
        let (plugin, error) = match failure {
            HookFailure::Rejected { plugin, rejection } => (
                plugin,
                ApiError::plugin_rejected(rejection.status, rejection.message),
            ),
            HookFailure::Failed { plugin, error } => {
                let api =
                    ApiError::plugin_failed(error.code(), error.retryable(), error.to_string());
                (plugin, api)
            }
            HookFailure::Invalid { plugin, reason } => (
                Arc::clone(&plugin),
                ApiError::plugin_failed(
                    "plugin_invalid_output",
                    false,
                    format!("plugin `{plugin}` {reason}"),
                ),
            ),
            HookFailure::NotFound {
                plugin,
                tenant,
                hook,
            } => {
                return ApiError::plugin_failed(
                    "plugin_not_found",
                    false,
                    format!(
                        "plugin `{plugin}` is in tenant `{tenant}`'s {hook} chain but has not \
                         been uploaded (PUT /v1/plugins/{plugin})"
                    ),
                );
            }
            HookFailure::Lost => {
                return ApiError::internal("a plugin call's thread failed (see the gateway log)");
            }
        };
        let mut headers = HeaderMap::new();
        if let Ok(value) = HeaderValue::from_str(&plugin) {
            headers.insert(PLUGIN_HEADER, value);
        }
        error.with_headers(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry_after(error: ApiError) -> (u16, Option<String>) {
        let response = error.into_response();
        let value = response
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        (response.status().as_u16(), value)
    }

    #[test]
    fn every_429_says_when_to_retry() {
        // A limit's own value is kept.
        let limited = ApiError::rate_limited("rate_limit_requests", "slow down")
            .with_headers(header_map(vec![("retry-after", "7".to_owned())]));
        assert_eq!(retry_after(limited), (429, Some("7".into())));
        // A plugin's 429 cannot know: a second.
        let plugin = ApiError::plugin_rejected(429, "quota".into());
        assert_eq!(retry_after(plugin), (429, Some("1".into())));
        // The gpu-host's KV refusals: a wait is worth retrying, a request
        // that can never fit is not a 429 at all.
        let waited = UpstreamError::KvBudgetExceeded(
            "kv_budget_exceeded: the request needs 900 tokens of KV cache (prompt + \
             max_tokens) and tenant `t` had 10 left of its budget for 10000 ms (its \
             kv_wait_ms); retry when its other requests end"
                .into(),
        );
        assert_eq!(retry_after(waited.into()), (429, Some("1".into())));
        let never = UpstreamError::KvBudgetExceeded(
            "kv_budget_exceeded: the request needs 900 tokens of KV cache (prompt + \
             max_tokens) and tenant `t` has 512 in its whole share"
                .into(),
        );
        let error = ApiError::from(never);
        assert_eq!(error.code, "kv_budget_exceeded");
        assert_eq!(retry_after(error), (400, None));
        // A device failure: 503 with the kind, never the host's text
        // (partition names, device addresses).
        let device = ApiError::from(UpstreamError::DeviceError {
            kind: "out_of_memory".into(),
            message: "device_error: out_of_memory: alloc 4096 bytes: partition \
                      \"dedicated:other\" cannot allocate 4KiB"
                .into(),
        });
        assert_eq!(device.code, "device_error");
        assert!(
            device.message.contains("ran out of memory"),
            "{}",
            device.message
        );
        assert!(
            !device.message.contains("dedicated:other"),
            "{}",
            device.message
        );
        assert_eq!(retry_after(device), (503, Some("1".into())));
        // The host's words about other models never reach the tenant.
        let not_found = ApiError::from(UpstreamError::ModelNotFound(
            "model `x` is not served here (serving: acme-secret-model)".into(),
        ));
        assert!(!not_found.message.contains("acme-secret-model"));
        assert_eq!(not_found.status, StatusCode::NOT_FOUND);
        let busy = ApiError::from(UpstreamError::Overloaded(
            "the request queue is full (64 waiting)".into(),
        ));
        assert!(!busy.message.contains("64"), "{}", busy.message);
        // Other statuses get none.
        assert_eq!(
            retry_after(ApiError::unavailable("overloaded", "busy")),
            (503, None)
        );
    }
}
