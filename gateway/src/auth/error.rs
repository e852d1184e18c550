//! Why a request was not authenticated, and the `Authorization` header.
//!
//! Messages go back to the caller, so they say what is wrong with the token
//! but never repeat it: at most a sanitized `alg` or `kid`, which are not
//! secret and help the caller find a misconfigured issuer.

use super::Scope;

/// A request without a usable token (401) or without the scope it needs (403).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("missing `Authorization: Bearer <token>` header")]
    MissingAuthorization,
    #[error("the `Authorization` header must be `Bearer <token>`")]
    MalformedAuthorization,
    #[error("token is larger than {limit_bytes} bytes")]
    TokenTooLarge { limit_bytes: usize },
    #[error("malformed token: {reason}")]
    MalformedToken { reason: &'static str },
    #[error("claim `{claim}` must be {expected}")]
    InvalidClaim {
        claim: &'static str,
        expected: &'static str,
    },
    #[error("token lacks the required `{claim}` claim")]
    MissingClaim { claim: &'static str },
    #[error("token issuer is not configured for any tenant")]
    UnknownIssuer,
    /// An operator route was called with a token from an issuer that is not
    /// an operator issuer (a tenant's, or nobody's).
    #[error("token issuer is not an operator issuer ([operator] in gateway.toml)")]
    NotOperatorIssuer,
    #[error(
        "this gateway has no operator issuer, so no operator token verifies: add \
         [[operator.issuers]] to gateway.toml"
    )]
    NoOperatorIssuer,
    #[error("algorithm `{alg}` is not allowed for this issuer")]
    AlgorithmNotAllowed { alg: String },
    #[error("unknown kid `{kid}`")]
    UnknownKid { kid: String },
    #[error("key `{kid}` cannot verify {alg} tokens")]
    KeyAlgorithmMismatch { kid: String, alg: String },
    #[error("token signature is invalid")]
    BadSignature,
    #[error("token expired at {exp} (unix seconds; now {now})")]
    Expired { exp: u64, now: u64 },
    #[error("token is not valid before {nbf} (unix seconds; now {now})")]
    NotYetValid { nbf: u64, now: u64 },
    #[error("token was issued in the future, at {iat} (unix seconds; now {now})")]
    IssuedInFuture { iat: u64, now: u64 },
    #[error(
        "token lives {lifetime_s} s (exp - nbf, or exp - iat), longer than its issuer allows \
         ({max_s} s, `max_lifetime_s`)"
    )]
    LifetimeTooLong { lifetime_s: u64, max_s: u64 },
    #[error("token audience does not name this service")]
    WrongAudience,
    #[error("token lacks the `{scope}` scope")]
    MissingScope { scope: Scope },
}

impl AuthError {
    /// The HTTP status: 403 when the token is fine but does not allow the
    /// action, 401 otherwise.
    pub fn status(&self) -> u16 {
        match self {
            AuthError::MissingScope { .. } => 403,
            _ => 401,
        }
    }

    /// A stable machine-readable code for the error JSON.
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::MissingAuthorization => "missing_authorization",
            AuthError::MalformedAuthorization => "invalid_authorization_header",
            AuthError::TokenTooLarge { .. }
            | AuthError::MalformedToken { .. }
            | AuthError::InvalidClaim { .. }
            | AuthError::KeyAlgorithmMismatch { .. } => "invalid_token",
            AuthError::MissingClaim { .. } => "missing_claim",
            AuthError::UnknownIssuer | AuthError::NotOperatorIssuer => "unknown_issuer",
            AuthError::NoOperatorIssuer => "no_operator_issuer",
            AuthError::AlgorithmNotAllowed { .. } => "algorithm_not_allowed",
            AuthError::UnknownKid { .. } => "unknown_kid",
            AuthError::BadSignature => "invalid_signature",
            AuthError::Expired { .. } => "token_expired",
            AuthError::NotYetValid { .. } => "token_not_yet_valid",
            AuthError::IssuedInFuture { .. } => "token_issued_in_future",
            AuthError::LifetimeTooLong { .. } => "token_lifetime_too_long",
            AuthError::WrongAudience => "invalid_audience",
            AuthError::MissingScope { .. } => "insufficient_scope",
        }
    }
}

/// The token in an `Authorization: Bearer <token>` header value (the scheme
/// is case-insensitive, RFC 7235 §2.1). The token itself is not checked here.
pub fn bearer_token(header_value: Option<&str>) -> Result<&str, AuthError> {
    let value = header_value.ok_or(AuthError::MissingAuthorization)?;
    let value = value.trim_matches([' ', '\t']);
    let (scheme, token) = value
        .split_once(' ')
        .ok_or(AuthError::MalformedAuthorization)?;
    let token = token.trim_start_matches(' ');
    let bad_char = |c: char| c.is_ascii_whitespace() || c.is_control();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() || token.contains(bad_char) {
        return Err(AuthError::MalformedAuthorization);
    }
    Ok(token)
}

/// A token-supplied name fit to put in an error message: at most 64
/// printable ASCII characters, anything else replaced.
pub(super) fn printable(s: &str) -> String {
    const MAX_CHARS: usize = 64;
    let mut out: String = s
        .chars()
        .take(MAX_CHARS)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect();
    if s.chars().nth(MAX_CHARS).is_some() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token(Some("Bearer abc.def.ghi")), Ok("abc.def.ghi"));
        assert_eq!(bearer_token(Some("bearer abc")), Ok("abc"));
        assert_eq!(bearer_token(Some("BEARER   abc ")), Ok("abc"));
    }

    #[test]
    fn other_headers_are_rejected() {
        assert_eq!(bearer_token(None), Err(AuthError::MissingAuthorization));
        for bad in [
            "",
            "Bearer",
            "Bearer ",
            "Basic dXNlcjpwYXNz",
            "Bearerabc",
            "Bearer a b",
            "Bearer a\tb",
            "Token abc",
        ] {
            let err = bearer_token(Some(bad)).unwrap_err();
            assert_eq!(err, AuthError::MalformedAuthorization, "{bad:?}");
            assert_eq!(err.status(), 401);
            assert_eq!(err.code(), "invalid_authorization_header");
        }
        assert_eq!(
            AuthError::MissingAuthorization.to_string(),
            "missing `Authorization: Bearer <token>` header"
        );
    }

    #[test]
    fn echoed_names_are_short_and_printable() {
        assert_eq!(printable("key-1"), "key-1");
        assert_eq!(printable("a\nb\u{1b}[31mé"), "a?b?[31m?");
        let long = "k".repeat(100);
        assert_eq!(printable(&long), format!("{}...", "k".repeat(64)));
    }

    #[test]
    fn only_missing_scope_is_forbidden() {
        let err = AuthError::MissingScope {
            scope: Scope::AuditRead,
        };
        assert_eq!(err.status(), 403);
        assert_eq!(err.code(), "insufficient_scope");
        assert_eq!(err.to_string(), "token lacks the `audit:read` scope");
        assert_eq!(AuthError::BadSignature.status(), 401);
        assert_eq!(AuthError::NotOperatorIssuer.status(), 401);
        assert_eq!(AuthError::NoOperatorIssuer.status(), 401);
    }
}
