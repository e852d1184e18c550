//! Authentication: each tenant's JWT verifiers, built from its `[jwt]`
//! policy table, the operator's, built from `gateway.toml`'s `[operator]`,
//! and the [`Identity`] or [`OperatorIdentity`] a verified token yields.
//!
//! Tenants and operators are different principals with disjoint issuers
//! (`policy check` refuses an issuer named twice). A tenant token is checked
//! against tenant issuers only and an operator token against operator
//! issuers only, so a tenant's identity provider can never mint an operator
//! token: an operator route does not even look at tenant keys. Within a
//! kind, the token's `iss` (read unverified, only to pick whose keys to use)
//! chooses the issuer, then the token is checked with that issuer's keys,
//! algorithms and audiences alone, and keeps only the scopes its kind of
//! principal may hold. [`Verifiers`] is an immutable snapshot: a policy
//! reload builds a new one and publishes it behind an `Arc`.
//!
//! Tokens are never logged and never echoed in errors.

mod build;
mod config;
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

use crate::source::PolicyError;
use verify::{IssuerVerifier, Verified};

pub use config::{Config, Issuer, JwtFile, Owner};
pub use error::{AuthError, bearer_token};
pub use issue::{
    DevKeyPair, IssueError, IssueOptions, MAX_DEV_TOKEN_TTL, dev_keypair, issue_dev_token,
    issue_operator_token,
};
pub use scopes::{Principal, Scope, Scopes, UnknownScope};

/// Longest token accepted, checked before any parsing. Real access tokens
/// are well under 2 KiB; the cap bounds the work an anonymous caller causes.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// A tenant a verified token speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The tenant whose issuer signed the token.
    pub tenant: String,
    /// The `sub` claim, if any.
    pub sub: Option<String>,
    /// Tenant scopes only.
    pub scopes: Scopes,
    /// The `exp` claim, in unix seconds.
    pub expires_at: u64,
}

impl Identity {
    /// Ok if the token carries `scope`; otherwise a 403 error.
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        require(self.scopes, scope)
    }
}

/// An operator a verified token speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorIdentity {
    /// The operator issuer that signed the token.
    pub issuer: String,
    /// The `sub` claim, if any: who the operator is.
    pub sub: Option<String>,
    /// Operator scopes only.
    pub scopes: Scopes,
    /// The `exp` claim, in unix seconds.
    pub expires_at: u64,
}

impl OperatorIdentity {
    /// Ok if the token carries `scope`; otherwise a 403 error.
    pub fn require(&self, scope: Scope) -> Result<(), AuthError> {
        require(self.scopes, scope)
    }
}

fn require(scopes: Scopes, scope: Scope) -> Result<(), AuthError> {
    if scopes.contains(scope) {
        Ok(())
    } else {
        Err(AuthError::MissingScope { scope })
    }
}

/// Every tenant's and operator's token verifier, keyed by issuer.
/// Immutable; share it through an `Arc` (or `ArcSwap`) and rebuild it on
/// policy reload.
pub struct Verifiers {
    tenants: HashMap<String, IssuerVerifier>,
    operators: HashMap<String, IssuerVerifier>,
    leeway_s: u64,
    /// Tokens verified before, by SHA-256 of the token, for each kind.
    tenant_cache: Mutex<HashMap<[u8; 32], Identity>>,
    operator_cache: Mutex<HashMap<[u8; 32], OperatorIdentity>>,
}

/// Verified tokens remembered per snapshot. Clients send the same token
/// with every request; checking its signature again (~45 µs for Ed25519)
/// was a fifth of the gateway's CPU per request. When full, the cache is
/// emptied rather than tracked entry by entry.
const MAX_VERIFIED_TOKENS: usize = 16_384;

impl Verifiers {
    /// Loads every tenant's and operator issuer's keys and checks every
    /// `[jwt]` table and `[[operator.issuers]]`, reporting all problems at
    /// the policy field they come from.
    pub fn build(config: &Config) -> Result<Verifiers, Vec<PolicyError>> {
        let (tenants, operators) = build::verifiers(config)?;
        Ok(Verifiers {
            tenants,
            operators,
            leeway_s: config.leeway.as_secs(),
            tenant_cache: Mutex::new(HashMap::new()),
            operator_cache: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `tenant`'s tokens under `self` verify only where they did
    /// under `old`: the same issuer, and audiences, algorithms and keys
    /// (by their bytes) each a subset of the old, with a lifetime limit no
    /// longer. `Err` names the first thing that would let more tokens in.
    /// (Used to apply a reload that only takes away; see `app`.)
    pub fn narrows(&self, old: &Verifiers, tenant: &str) -> Result<(), String> {
        let (Some(new), Some(old)) = (self.of_tenant(tenant), old.of_tenant(tenant)) else {
            return Err(format!("tenant `{tenant}` has no verifier before or after"));
        };
        if new.issuer != old.issuer {
            return Err(format!("tenant `{tenant}`: its issuer changed"));
        }
        if !new.audiences.iter().all(|a| old.audiences.contains(a)) {
            return Err(format!("tenant `{tenant}`: an audience was added"));
        }
        if !new.algorithms.iter().all(|a| old.algorithms.contains(a)) {
            return Err(format!("tenant `{tenant}`: an algorithm was added"));
        }
        let same = |a: &keys::VerifyKey, b: &keys::VerifyKey| {
            (a.kind, &a.kid, a.alg, a.material) == (b.kind, &b.kid, b.alg, b.material)
        };
        if !new.keys.iter().all(|k| old.keys.iter().any(|o| same(k, o))) {
            return Err(format!("tenant `{tenant}`: a key was added or changed"));
        }
        let longer = match (new.max_lifetime_s, old.max_lifetime_s) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(new), Some(old)) => new > old,
        };
        if longer {
            return Err(format!("tenant `{tenant}`: its tokens may live longer"));
        }
        Ok(())
    }

    fn of_tenant(&self, tenant: &str) -> Option<&IssuerVerifier> {
        self.tenants
            .values()
            .find(|i| matches!(&i.owner, Owner::Tenant(t) if t == tenant))
    }

    /// Verifies a tenant's `token` (the bare JWT, see [`bearer_token`]) at
    /// time `now`. An operator's token is refused here as an unknown issuer.
    ///
    /// A token that verified before under this snapshot is only checked for
    /// expiry: its signature, issuer, audience, `nbf` and `iat` cannot have
    /// become wrong since (time only moves on), and a policy reload builds
    /// new verifiers with an empty cache, so changed keys take effect.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Identity, AuthError> {
        self.cached(
            &self.tenant_cache,
            token,
            now,
            |i| i.expires_at,
            |now_s| {
                let (signer, verified) =
                    verify::verify(&self.tenants, self.leeway_s, token, now_s)?;
                let Owner::Tenant(tenant) = &signer.owner else {
                    return Err(AuthError::UnknownIssuer);
                };
                Ok(Identity {
                    tenant: tenant.clone(),
                    sub: verified.sub,
                    scopes: verified.scopes,
                    expires_at: verified.expires_at,
                })
            },
        )
    }

    /// Verifies an operator's `token` at time `now`, against the operator
    /// issuers only: a tenant's token, whatever scopes it claims, is refused
    /// here as [`AuthError::NotOperatorIssuer`].
    pub fn verify_operator(
        &self,
        token: &str,
        now: SystemTime,
    ) -> Result<OperatorIdentity, AuthError> {
        if self.operators.is_empty() {
            return Err(AuthError::NoOperatorIssuer);
        }
        self.cached(
            &self.operator_cache,
            token,
            now,
            |i| i.expires_at,
            |now_s| {
                let (
                    signer,
                    Verified {
                        sub,
                        scopes,
                        expires_at,
                    },
                ) = verify::verify(&self.operators, self.leeway_s, token, now_s).map_err(|e| {
                    match e {
                        AuthError::UnknownIssuer => AuthError::NotOperatorIssuer,
                        other => other,
                    }
                })?;
                if signer.owner != Owner::Operator {
                    return Err(AuthError::NotOperatorIssuer);
                }
                Ok(OperatorIdentity {
                    issuer: signer.issuer.clone(),
                    sub,
                    scopes,
                    expires_at,
                })
            },
        )
    }

    /// `verify` through `cache`: a token seen before is only checked for
    /// expiry.
    fn cached<T: Clone>(
        &self,
        cache: &Mutex<HashMap<[u8; 32], T>>,
        token: &str,
        now: SystemTime,
        expires_at: impl Fn(&T) -> u64,
        verify: impl FnOnce(u64) -> Result<T, AuthError>,
    ) -> Result<T, AuthError> {
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
        let cached = lock(cache).get(&key).cloned();
        if let Some(identity) = cached {
            let exp = expires_at(&identity);
            if now_s >= exp.saturating_add(self.leeway_s) {
                lock(cache).remove(&key);
                return Err(AuthError::Expired { exp, now: now_s });
            }
            return Ok(identity);
        }
        let identity = verify(now_s)?;
        let mut cache = lock(cache);
        if cache.len() >= MAX_VERIFIED_TOKENS {
            cache.clear();
        }
        cache.insert(key, identity.clone());
        Ok(identity)
    }

    /// The tenant whose tokens carry `issuer`.
    pub fn tenant_for_issuer(&self, issuer: &str) -> Option<&str> {
        match self.tenants.get(issuer).map(|t| &t.owner) {
            Some(Owner::Tenant(tenant)) => Some(tenant),
            _ => None,
        }
    }

    /// Whether any operator issuer is configured.
    pub fn has_operators(&self) -> bool {
        !self.operators.is_empty()
    }
}

/// A cache; a panic while it was held cannot leave it inconsistent (each
/// operation is one map call), so a poisoned lock is used as is.
fn lock<T>(cache: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

/// Lists tenants and issuers, never key material.
impl fmt::Debug for Verifiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tenants: Vec<_> = self
            .tenants
            .values()
            .map(|t| (format!("{:?}", t.owner), t.issuer.as_str(), t.keys.len()))
            .collect();
        tenants.sort_unstable();
        let mut operators: Vec<_> = self
            .operators
            .values()
            .map(|t| (t.issuer.as_str(), t.keys.len()))
            .collect();
        operators.sort_unstable();
        f.debug_struct("Verifiers")
            .field("tenants (owner, issuer, keys)", &tenants)
            .field("operators (issuer, keys)", &operators)
            .field("leeway_s", &self.leeway_s)
            .finish()
    }
}
