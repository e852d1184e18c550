//! Every error the HTTP API returns, in OpenAI's shape
//! `{"error":{"message","type","param","code"}}`, with an honest status and a
//! stable `code`. Messages say what was wrong and never carry secrets.

use axum::Json;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::AuthError;
use crate::limits::{RejectReason, Rejection};
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

impl From<UpstreamError> for ApiError {
    fn from(e: UpstreamError) -> ApiError {
        match e {
            UpstreamError::Unavailable(_) => {
                ApiError::unavailable("upstream_unavailable", e.to_string())
            }
            UpstreamError::Overloaded(_) => ApiError::unavailable("overloaded", e.to_string()),
            UpstreamError::KvBudgetExceeded(m) => ApiError::rate_limited("kv_budget_exceeded", m),
            UpstreamError::ModelNotFound(m) => ApiError::not_found("model_not_found", m),
            UpstreamError::ModelUnavailable(m) => ApiError::unavailable("model_unavailable", m),
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
        let error = if r.reason == RejectReason::UnknownTenant {
            ApiError::forbidden(code, r.message.clone())
        } else {
            ApiError::rate_limited(code, r.message.clone())
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
        response
    }
}
