//! What authentication is configured from: each issuer's `[jwt]` table (a
//! tenant file's, or one `[[operator.issuers]]` of `gateway.toml`) as
//! written, with the file it is written in so errors point into it. Policy
//! builds a [`Config`]; this module never reads the policy.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::source::SourceFile;

pub use super::verify::Owner;

/// Every issuer the verifiers are built from.
#[derive(Debug)]
pub struct Config<'a> {
    /// The policy folder: relative key paths are read from it.
    pub dir: &'a Path,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// The operator's issuers, then the tenants'.
    pub issuers: Vec<Issuer<'a>>,
}

/// One issuer's table, whose it is, and the file it is in.
#[derive(Debug)]
pub struct Issuer<'a> {
    pub jwt: &'a JwtFile,
    pub owner: Owner,
    pub source: &'a SourceFile,
}

/// `[jwt]` in a tenant file, or one `[[operator.issuers]]` in
/// `gateway.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    /// Required `iss`; identifies the tenant, or the operator (unique across
    /// tenants and the operator).
    pub issuer: Spanned<String>,
    /// Accepted `aud` values (a token must name at least one).
    pub audience: Vec<Spanned<String>>,
    /// Accepted `alg` values, e.g. `["EdDSA"]`, `["RS256", "ES256"]`. `none` is
    /// never accepted; `HS*` only with `hs_secret_file`.
    pub algorithms: Vec<Spanned<String>>,
    /// PEM public keys (relative to the policy folder unless absolute).
    #[serde(default)]
    pub public_keys: Vec<Spanned<PathBuf>>,
    /// A JWKS file; keys are chosen by `kid`.
    pub jwks: Option<Spanned<PathBuf>>,
    /// A shared HMAC secret (at least 32 bytes) for `HS*` algorithms.
    pub hs_secret_file: Option<Spanned<PathBuf>>,
    /// Longest a token may live, in seconds: `exp` minus `nbf` (or `iat`
    /// without `nbf`); tokens must then carry `iat`. Default 86400 (a
    /// day); 0: no limit (then `exp` alone bounds a token).
    pub max_lifetime_s: Option<Spanned<u64>>,
    /// DEVELOPMENT ONLY: a private key `bulkhead token issue` signs with.
    /// Real deployments leave this out; their identity provider mints tokens.
    pub dev_signing_key: Option<Spanned<PathBuf>>,
}
