//! Per-request limits that need no state: body size and `max_tokens`.

use axum::http::StatusCode;

use super::Limits;

/// A request the tenant's limits forbid whatever the rate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Larger than `max_body_bytes` (413).
    #[error("request body is {actual} bytes, above this tenant's limit of {max} bytes")]
    BodyTooLarge { actual: u64, max: u64 },
    /// `max_tokens` above the tenant's `max_tokens` (400).
    #[error("`max_tokens` is {requested}, above this tenant's maximum of {max}")]
    MaxTokensTooLarge { requested: u32, max: u32 },
    /// `max_tokens: 0` (400).
    #[error("`max_tokens` must be at least 1")]
    MaxTokensZero,
}

impl ShapeError {
    /// The HTTP status to answer with.
    pub fn status(&self) -> StatusCode {
        match self {
            ShapeError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ShapeError::MaxTokensTooLarge { .. } | ShapeError::MaxTokensZero => {
                StatusCode::BAD_REQUEST
            }
        }
    }

    /// The request field at fault, for OpenAI's error `param`.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            ShapeError::BodyTooLarge { .. } => None,
            ShapeError::MaxTokensTooLarge { .. } | ShapeError::MaxTokensZero => Some("max_tokens"),
        }
    }
}

/// Checks a request's body size and `max_tokens` against the tenant's
/// limits, returning the `max_tokens` to generate with (the tenant's maximum
/// when the request names none).
pub fn check_request_shape(
    limits: &Limits,
    max_tokens: Option<u32>,
    body_bytes: u64,
) -> Result<u32, ShapeError> {
    if body_bytes > limits.max_body_bytes {
        return Err(ShapeError::BodyTooLarge {
            actual: body_bytes,
            max: limits.max_body_bytes,
        });
    }
    match max_tokens {
        None => Ok(limits.max_tokens),
        Some(0) => Err(ShapeError::MaxTokensZero),
        Some(requested) if requested > limits.max_tokens => Err(ShapeError::MaxTokensTooLarge {
            requested,
            max: limits.max_tokens,
        }),
        Some(requested) => Ok(requested),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_body_bytes: 1000,
        max_tokens: 512,
        ..Limits::DEFAULT
    };

    #[test]
    fn effective_max_tokens() {
        assert_eq!(check_request_shape(&LIMITS, None, 10), Ok(512));
        assert_eq!(check_request_shape(&LIMITS, Some(100), 10), Ok(100));
        assert_eq!(check_request_shape(&LIMITS, Some(512), 1000), Ok(512));
    }

    #[test]
    fn max_tokens_above_the_tenant_max_is_a_400_naming_it() {
        let err = check_request_shape(&LIMITS, Some(513), 10).unwrap_err();
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(err.param(), Some("max_tokens"));
        assert_eq!(
            err.to_string(),
            "`max_tokens` is 513, above this tenant's maximum of 512"
        );
        let zero = check_request_shape(&LIMITS, Some(0), 10).unwrap_err();
        assert_eq!(zero.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn oversized_body_is_a_413() {
        let err = check_request_shape(&LIMITS, Some(1), 1001).unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            err.to_string(),
            "request body is 1001 bytes, above this tenant's limit of 1000 bytes"
        );
    }
}
