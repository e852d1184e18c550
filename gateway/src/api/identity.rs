//! Who a call is: the identity a route's check extracts from the bearer
//! token before the handler runs ([`super::routes`] decides which check a
//! route gets). A handler takes a [`TenantCall`] or an [`OperatorCall`],
//! so its signature says which principal it serves.

use std::sync::Arc;
use std::time::SystemTime;

use axum::http::{HeaderMap, header};

use super::Snapshot;
use super::error::ApiError;
use crate::auth::{AuthError, Identity, OperatorIdentity, Scope, bearer_token};

/// A tenant's call that passed its route's check: who it is, and the
/// policy snapshot its token verified under (the handler reads that one).
#[derive(Clone, Debug)]
pub struct TenantCall {
    pub identity: Identity,
    pub snapshot: Arc<Snapshot>,
}

/// An operator's call that passed its route's check.
#[derive(Clone, Debug)]
pub struct OperatorCall {
    pub identity: OperatorIdentity,
}

/// The bearer token of `headers`, as `bearer_token` reads it.
fn token(headers: &HeaderMap) -> Result<&str, AuthError> {
    let header = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    bearer_token(header)
}

/// A tenant token with `scope`; on refusal, the tenant (when the token
/// verified) for the metrics, and the error.
pub(super) fn tenant_identity(
    snapshot: &Snapshot,
    headers: &HeaderMap,
    scope: Scope,
) -> Result<Identity, (String, ApiError)> {
    let identity = token(headers)
        .and_then(|token| snapshot.verifiers.verify(token, SystemTime::now()))
        .map_err(|e| (String::new(), ApiError::from(e)))?;
    identity
        .require(scope)
        .map_err(|e| (identity.tenant.clone(), ApiError::from(e)))?;
    Ok(identity)
}

/// An operator token with `scope`.
pub(super) fn operator_identity(
    snapshot: &Snapshot,
    headers: &HeaderMap,
    scope: Scope,
) -> Result<OperatorIdentity, ApiError> {
    let identity = token(headers)
        .and_then(|token| snapshot.verifiers.verify_operator(token, SystemTime::now()))?;
    identity.require(scope)?;
    Ok(identity)
}
