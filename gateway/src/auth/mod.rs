//! Authentication: each tenant's JWT verifiers, built from its `[jwt]`
//! policy table, and the [`Identity`] a verified token yields.
//!
//! The tenant is chosen by the token's `iss` (read unverified, only to pick
//! whose keys to use), then the token is checked with that tenant's keys,
//! algorithms and audiences alone. [`Verifiers`] is an immutable snapshot:
//! a policy reload builds a new one and publishes it behind an `Arc`.
//!
//! Tokens are never logged and never echoed in errors.

mod build;
mod error;
mod issue;
mod keys;
mod scopes;
mod verify;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::policy::{Policy, PolicyError};

pub use error::{AuthError, bearer_token};
pub use issue::{
    DevKeyPair, IssueError, IssueOptions, MAX_DEV_TOKEN_TTL, dev_keypair, issue_dev_token,
};
pub use scopes::{Scope, Scopes, UnknownScope};

/// Longest token accepted, checked before any parsing. Real access tokens
/// are well under 2 KiB; the cap bounds the work an anonymous caller causes.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Who a verified token speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The tenant whose issuer signed the token.
    pub tenant: String,
    /// The `sub` claim, if any.
    pub sub: Option<String>,
    pub scopes: Scopes,
    /// The `exp` claim, in unix seconds.
    pub expires_at: u64,
}

impl Identity {
    /// Ok if the token carries `scope`; otherwise a 403 error.
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        if self.scopes.contains(scope) {
            Ok(())
        } else {
            Err(AuthError::MissingScope { scope })
        }
    }
}

/// Every tenant's token verifier, keyed by issuer. Immutable; share it
/// through an `Arc` (or `ArcSwap`) and rebuild it on policy reload.
pub struct Verifiers {
    by_issuer: HashMap<String, verify::TenantVerifier>,
    leeway_s: u64,
    /// Tokens verified before, by SHA-256 of the token.
    verified: Mutex<HashMap<[u8; 32], Identity>>,
}

/// Verified tokens remembered per snapshot. Clients send the same token
/// with every request; checking its signature again (~45 µs for Ed25519)
/// was a fifth of the gateway's CPU per request. When full, the cache is
/// emptied rather than tracked entry by entry.
const MAX_VERIFIED_TOKENS: usize = 16_384;

impl Verifiers {
    /// Loads every tenant's keys and checks every `[jwt]` table, reporting
    /// all problems at the policy field they come from.
    pub fn build(policy: &Policy) -> Result<Verifiers, Vec<PolicyError>> {
        let by_issuer = build::tenant_verifiers(policy)?;
        Ok(Verifiers {
            by_issuer,
            leeway_s: policy.gateway.jwt_leeway.as_secs(),
            verified: Mutex::new(HashMap::new()),
        })
    }

    /// Verifies `token` (the bare JWT, see [`bearer_token`]) at time `now`.
    ///
    /// A token that verified before under this snapshot is only checked for
    /// expiry: its signature, issuer, audience, `nbf` and `iat` cannot have
    /// become wrong since (time only moves on), and a policy reload builds
    /// new verifiers with an empty cache, so changed keys take effect.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Identity, AuthError> {
        let now_s = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::TokenTooLarge {
                limit_bytes: MAX_TOKEN_BYTES,
            });
        }
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cached = self.cache().get(&key).cloned();
        if let Some(identity) = cached {
            let exp = identity.expires_at;
            if now_s >= exp.saturating_add(self.leeway_s) {
                self.cache().remove(&key);
                return Err(AuthError::Expired { exp, now: now_s });
            }
            return Ok(identity);
        }
        let identity = verify::verify(&self.by_issuer, self.leeway_s, token, now_s)?;
        let mut cache = self.cache();
        if cache.len() >= MAX_VERIFIED_TOKENS {
            cache.clear();
        }
        cache.insert(key, identity.clone());
        Ok(identity)
    }

    /// The cache; a panic while it was held cannot leave it inconsistent
    /// (each operation is one map call), so a poisoned lock is used as is.
    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Identity>> {
        self.verified.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tenant whose tokens carry `issuer`.
    pub fn tenant_for_issuer(&self, issuer: &str) -> Option<&str> {
        self.by_issuer.get(issuer).map(|t| t.tenant.as_str())
    }
}

/// Lists tenants and issuers, never key material.
impl fmt::Debug for Verifiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tenants: Vec<_> = self
            .by_issuer
            .values()
            .map(|t| (t.tenant.as_str(), t.issuer.as_str(), t.keys.len()))
            .collect();
        tenants.sort_unstable();
        f.debug_struct("Verifiers")
            .field("tenants (id, issuer, keys)", &tenants)
            .field("leeway_s", &self.leeway_s)
            .finish()
    }
}
