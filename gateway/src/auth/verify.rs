//! Verifying one token: size, shape, issuer → tenant or operator, algorithm, key,
//! signature, then the claims, in that order. Claims are only trusted after
//! the signature over their exact bytes has been checked.

use std::collections::HashMap;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::printable;
use super::keys::VerifyKey;
use super::{AuthError, MAX_TOKEN_BYTES, Principal, Scopes};

/// Whose tokens an issuer signs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    Tenant(String),
    Operator,
}

impl Owner {
    fn principal(&self) -> Principal {
        match self {
            Owner::Tenant(_) => Principal::Tenant,
            Owner::Operator => Principal::Operator,
        }
    }
}

/// What a verified token says, its scopes already cut to those its
/// issuer's kind of principal may grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Verified {
    pub sub: Option<String>,
    pub scopes: Scopes,
    pub expires_at: u64,
}

/// One issuer's audiences, algorithms and keys, and whose tokens it signs.
#[derive(Debug)]
pub(super) struct IssuerVerifier {
    pub owner: Owner,
    pub issuer: String,
    /// `max_lifetime_s`; `None`: no limit.
    pub max_lifetime_s: Option<u64>,
    pub audiences: Vec<String>,
    pub algorithms: Vec<Algorithm>,
    pub keys: Vec<VerifyKey>,
}

/// The JOSE header members we act on.
#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
    /// Extensions the signer says we must understand; we understand none.
    crit: Option<Value>,
}

/// The registered claims we act on, plus scopes. `Value` so that a claim of
/// the wrong type is a clear error rather than a JSON one; a claim given
/// twice is a JSON error (serde rejects duplicate fields).
#[derive(Deserialize)]
struct Claims {
    iss: Option<Value>,
    sub: Option<Value>,
    aud: Option<Value>,
    exp: Option<Value>,
    nbf: Option<Value>,
    iat: Option<Value>,
    scope: Option<Value>,
    scp: Option<Value>,
}

const fn malformed(reason: &'static str) -> AuthError {
    AuthError::MalformedToken { reason }
}

/// Verifies `token` against the issuers in `by_issuer` only: a token from
/// an issuer not in it is [`AuthError::UnknownIssuer`], however valid it is
/// elsewhere. Returns the issuer that signed it and what it says.
pub(super) fn verify<'a>(
    by_issuer: &'a HashMap<String, IssuerVerifier>,
    leeway_s: u64,
    token: &str,
    now: u64,
) -> Result<(&'a IssuerVerifier, Verified), AuthError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(AuthError::TokenTooLarge {
            limit_bytes: MAX_TOKEN_BYTES,
        });
    }
    if token.is_empty() {
        return Err(malformed("the token is empty"));
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(claims_b64), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed(
            "a JWT is three base64url parts separated by dots",
        ));
    };
    if header_b64.is_empty() || claims_b64.is_empty() {
        return Err(malformed("a part of the token is empty"));
    }
    let header: Header = json_part(header_b64).ok_or(malformed(
        "the header is not base64url JSON with a string `alg`",
    ))?;
    if header.alg.eq_ignore_ascii_case("none") {
        return Err(AuthError::AlgorithmNotAllowed {
            alg: printable(&header.alg),
        });
    }
    if header.crit.is_some() {
        return Err(malformed(
            "the header has `crit` extensions, which are not supported",
        ));
    }
    // Checked after `alg`, so an unsigned (`alg: none`) token is named as such.
    if signature.is_empty() {
        return Err(malformed("the signature is empty"));
    }
    let claims: Claims =
        json_part(claims_b64).ok_or(malformed("the payload is not a base64url JSON object"))?;

    let issuer = string_claim(claims.iss.as_ref(), "iss")?
        .ok_or(AuthError::MissingClaim { claim: "iss" })?;
    let signer = by_issuer.get(issuer).ok_or(AuthError::UnknownIssuer)?;
    let alg = Algorithm::from_str(&header.alg)
        .ok()
        .filter(|alg| signer.algorithms.contains(alg))
        .ok_or_else(|| AuthError::AlgorithmNotAllowed {
            alg: printable(&header.alg),
        })?;

    let signing_input = &token[..header_b64.len() + 1 + claims_b64.len()];
    let verified = signer
        .candidate_keys(alg, header.kid.as_deref())?
        .into_iter()
        .any(|key| {
            jsonwebtoken::crypto::verify(signature, signing_input.as_bytes(), &key.key, alg)
                .unwrap_or(false)
        });
    if !verified {
        return Err(AuthError::BadSignature);
    }
    let verified = signer.claims(&claims, issuer, now, leeway_s)?;
    Ok((signer, verified))
}

impl IssuerVerifier {
    /// The keys that may have signed a token with this `alg` and `kid`. A
    /// `kid` picks one key when the tenant has named keys (a JWKS); PEM keys
    /// have no names, so for them the `kid` is only a hint and is ignored.
    fn candidate_keys(
        &self,
        alg: Algorithm,
        kid: Option<&str>,
    ) -> Result<Vec<&VerifyKey>, AuthError> {
        let has_named_keys = self.keys.iter().any(|k| k.kid.is_some());
        match kid {
            Some(kid) if has_named_keys => {
                let key = self
                    .keys
                    .iter()
                    .find(|k| k.kid.as_deref() == Some(kid))
                    .ok_or_else(|| AuthError::UnknownKid {
                        kid: printable(kid),
                    })?;
                if !key.can_verify(alg) {
                    return Err(AuthError::KeyAlgorithmMismatch {
                        kid: printable(kid),
                        alg: format!("{alg:?}"),
                    });
                }
                Ok(vec![key])
            }
            _ => Ok(self.keys.iter().filter(|k| k.can_verify(alg)).collect()),
        }
    }

    /// Checks the (signed) claims; keeps only the scopes this issuer's
    /// kind of principal may hold.
    fn claims(
        &self,
        claims: &Claims,
        issuer: &str,
        now: u64,
        leeway_s: u64,
    ) -> Result<Verified, AuthError> {
        // The issuer picked this tenant, so this holds; it stays as a guard
        // should the lookup ever become looser than equality.
        if issuer != self.issuer {
            return Err(AuthError::UnknownIssuer);
        }
        let exp = numeric_date(claims.exp.as_ref(), "exp")?
            .ok_or(AuthError::MissingClaim { claim: "exp" })?;
        if now >= exp.saturating_add(leeway_s) {
            return Err(AuthError::Expired { exp, now });
        }
        let nbf = numeric_date(claims.nbf.as_ref(), "nbf")?;
        if let Some(nbf) = nbf
            && nbf > now.saturating_add(leeway_s)
        {
            return Err(AuthError::NotYetValid { nbf, now });
        }
        let iat = numeric_date(claims.iat.as_ref(), "iat")?;
        if let Some(iat) = iat
            && iat > now.saturating_add(leeway_s)
        {
            return Err(AuthError::IssuedInFuture { iat, now });
        }
        // A token may not live longer than its issuer's maximum, from when
        // it became valid (`nbf`, else `iat`); `iat` is then required, so
        // a token cannot dodge the limit by leaving it out. (`iat` is no
        // later than now, so `exp` is at most now + leeway + the maximum.)
        if let Some(max_s) = self.max_lifetime_s {
            let iat = iat.ok_or(AuthError::MissingClaim { claim: "iat" })?;
            let lifetime_s = exp.saturating_sub(nbf.unwrap_or(iat));
            if lifetime_s > max_s {
                return Err(AuthError::LifetimeTooLong { lifetime_s, max_s });
            }
        }
        self.check_audience(claims.aud.as_ref())?;
        let sub = string_claim(claims.sub.as_ref(), "sub")?.map(str::to_owned);
        let mut scopes = Scopes::NONE;
        for (value, claim) in [(&claims.scope, "scope"), (&claims.scp, "scp")] {
            add_scopes(&mut scopes, value.as_ref(), claim)?;
        }
        Ok(Verified {
            sub,
            scopes: scopes.only(self.owner.principal()),
            expires_at: exp,
        })
    }

    /// `aud` is one string or an array of strings (RFC 7519 §4.1.3); one of
    /// them must be ours.
    fn check_audience(&self, aud: Option<&Value>) -> Result<(), AuthError> {
        const EXPECTED: &str = "a string or an array of strings";
        let ours = |a: &str| self.audiences.iter().any(|mine| mine == a);
        let matched = match aud {
            None | Some(Value::Null) => return Err(AuthError::MissingClaim { claim: "aud" }),
            Some(Value::String(a)) => ours(a),
            Some(Value::Array(items)) => {
                let mut matched = false;
                for item in items {
                    let a = item.as_str().ok_or(AuthError::InvalidClaim {
                        claim: "aud",
                        expected: EXPECTED,
                    })?;
                    matched |= ours(a);
                }
                matched
            }
            Some(_) => {
                return Err(AuthError::InvalidClaim {
                    claim: "aud",
                    expected: EXPECTED,
                });
            }
        };
        if matched {
            Ok(())
        } else {
            Err(AuthError::WrongAudience)
        }
    }
}

/// A base64url (unpadded) JSON object.
fn json_part<T: DeserializeOwned>(b64: &str) -> Option<T> {
    let bytes = URL_SAFE_NO_PAD.decode(b64).ok()?;
    // serde would also accept a JSON array for a struct; a JWT part is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    // JSON is UTF-8 (RFC 7519 §7.2), but `from_slice` skips the members we
    // ignore without checking theirs; `from_str` takes checked text.
    serde_json::from_str(std::str::from_utf8(&bytes).ok()?).ok()
}

fn string_claim<'a>(
    value: Option<&'a Value>,
    claim: &'static str,
) -> Result<Option<&'a str>, AuthError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(AuthError::InvalidClaim {
            claim,
            expected: "a string",
        }),
    }
}

/// A NumericDate: seconds since 1970, possibly fractional (RFC 7519 §2).
fn numeric_date(value: Option<&Value>, claim: &'static str) -> Result<Option<u64>, AuthError> {
    let invalid = AuthError::InvalidClaim {
        claim,
        expected: "a number of seconds since 1970",
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(secs), _) => Ok(Some(secs)),
            // Saturating: a far-future float date is "never" rather than an error.
            (None, Some(f)) if f.is_finite() && f >= 0.0 => Ok(Some(f as u64)),
            _ => Err(invalid),
        },
        Some(_) => Err(invalid),
    }
}

/// `scope` is space-separated (RFC 8693 §4.2); some issuers send `scp` as
/// an array. Either form is accepted in either claim.
fn add_scopes(
    scopes: &mut Scopes,
    value: Option<&Value>,
    claim: &'static str,
) -> Result<(), AuthError> {
    let invalid = AuthError::InvalidClaim {
        claim,
        expected: "a space-separated string or an array of strings",
    };
    match value {
        None | Some(Value::Null) => {}
        Some(Value::String(names)) => scopes.add_names(names),
        Some(Value::Array(items)) => {
            for item in items {
                scopes.add_names(item.as_str().ok_or_else(|| invalid.clone())?);
            }
        }
        Some(_) => return Err(invalid),
    }
    Ok(())
}
