//! Development tokens: `bulkhead token issue` signs with a tenant's (or an
//! operator issuer's) `dev_signing_key`, or its HMAC secret. Real
//! deployments leave that key out; their identity provider mints tokens.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{
    EncodePrivateKey, EncodePublicKey, KeypairBytes, PrivateKeyInfo, SecretDocument,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use super::build::resolve;
use super::config::JwtFile;
use super::keys::{self, KeyKind, OID_EC, OID_ED25519, OID_P256, OID_P384, OID_RSA};
use super::{Scope, Scopes};

/// Longest lifetime of a development token.
pub const MAX_DEV_TOKEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// What to put in a development token.
#[derive(Clone, Debug)]
pub struct IssueOptions {
    /// Lifetime: `exp` = `now` + `ttl` (at most [`MAX_DEV_TOKEN_TTL`]).
    pub ttl: Duration,
    pub scopes: Scopes,
    /// `sub`; default `dev`.
    pub sub: Option<String>,
    /// `aud`; default the tenant's first audience.
    pub audience: Option<String>,
    /// `iat` and `nbf`.
    pub now: SystemTime,
}

impl IssueOptions {
    /// One hour, `inference` scope, default `sub` and audience.
    pub fn new(now: SystemTime) -> IssueOptions {
        IssueOptions {
            ttl: Duration::from_secs(3600),
            scopes: Scopes::from(Scope::Inference),
            sub: None,
            audience: None,
            now,
        }
    }
}

/// Why a development token could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    #[error(
        "{who} has neither `dev_signing_key` nor `hs_secret_file`, so there is nothing to \
         sign its tokens with"
    )]
    NoSigningKey { who: String },
    #[error(
        "gateway.toml has no [[operator.issuers]]{}, so there is no operator issuer to sign with",
        .issuer.as_ref().map(|i| format!(" with issuer `{i}`")).unwrap_or_default()
    )]
    NoOperatorIssuer { issuer: Option<String> },
    #[error("{what} `{}`: {reason}", path.display())]
    Key {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{who} allows none of the algorithms {key} can sign")]
    AlgorithmNotAllowed { who: String, key: &'static str },
    #[error("{who} has no audience to put in the token")]
    NoAudience { who: String },
    #[error("{scope} is not a scope {principal} tokens carry")]
    WrongScope {
        scope: super::Scope,
        principal: super::Principal,
    },
    #[error("the token lifetime must be between 1 second and 30 days")]
    Ttl,
    #[error("cannot sign with the issuer's key: {0}")]
    Sign(String),
    #[error("cannot encode the new key pair: {0}")]
    Keygen(String),
}

#[derive(Serialize)]
struct DevClaims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    exp: u64,
    iat: u64,
    nbf: u64,
    #[serde(skip_serializing_if = "String::is_empty")]
    scope: String,
}

/// A signed token for `tenant` from its `[jwt]` table `jwt`, as its issuer
/// would mint one; key paths are relative to `policy_dir`. Only tenant
/// scopes may be asked for.
pub fn issue_dev_token(
    tenant: &str,
    jwt: &JwtFile,
    policy_dir: &Path,
    options: IssueOptions,
) -> Result<String, IssueError> {
    let who = format!("tenant `{tenant}`");
    issue(jwt, &who, super::Principal::Tenant, policy_dir, options)
}

/// A signed operator token from the operator issuer named `issuer` among
/// `issuers` (default: the first `[[operator.issuers]]` entry with a
/// signing key). Only operator scopes may be asked for.
pub fn issue_operator_token(
    issuers: &[JwtFile],
    policy_dir: &Path,
    issuer: Option<&str>,
    options: IssueOptions,
) -> Result<String, IssueError> {
    let jwt = match issuer {
        Some(name) => issuers.iter().find(|j| j.issuer.get_ref() == name),
        None => issuers
            .iter()
            .find(|j| j.dev_signing_key.is_some() || j.hs_secret_file.is_some())
            .or(issuers.first()),
    }
    .ok_or_else(|| IssueError::NoOperatorIssuer {
        issuer: issuer.map(str::to_owned),
    })?;
    let who = format!("operator issuer `{}`", jwt.issuer.get_ref());
    issue(jwt, &who, super::Principal::Operator, policy_dir, options)
}

fn issue(
    jwt: &JwtFile,
    who: &str,
    principal: super::Principal,
    policy_dir: &Path,
    options: IssueOptions,
) -> Result<String, IssueError> {
    if options.ttl < Duration::from_secs(1) || options.ttl > MAX_DEV_TOKEN_TTL {
        return Err(IssueError::Ttl);
    }
    if let Some(scope) = options.scopes.iter().find(|s| s.principal() != principal) {
        return Err(IssueError::WrongScope { scope, principal });
    }
    let (kind, key) = signing_key(jwt, who, policy_dir)?;
    let alg = jwt
        .algorithms
        .iter()
        .filter_map(|name| Algorithm::from_str(name.get_ref()).ok())
        .find(|alg| KeyKind::for_algorithm(*alg) == kind)
        .ok_or_else(|| IssueError::AlgorithmNotAllowed {
            who: who.to_owned(),
            key: kind.describe(),
        })?;
    let audience = match &options.audience {
        Some(aud) => aud.as_str(),
        None => jwt
            .audience
            .first()
            .map(|a| a.get_ref().as_str())
            .ok_or_else(|| IssueError::NoAudience {
                who: who.to_owned(),
            })?,
    };
    let now = options
        .now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let claims = DevClaims {
        iss: jwt.issuer.get_ref(),
        sub: options.sub.as_deref().unwrap_or("dev"),
        aud: audience,
        exp: now.saturating_add(options.ttl.as_secs()),
        iat: now,
        nbf: now,
        scope: options.scopes.to_string(),
    };
    jsonwebtoken::encode(&Header::new(alg), &claims, &key)
        .map_err(|e| IssueError::Sign(e.to_string()))
}

/// The issuer's `dev_signing_key`, or else its HMAC secret.
fn signing_key(jwt: &JwtFile, who: &str, dir: &Path) -> Result<(KeyKind, EncodingKey), IssueError> {
    let key_error = |what, path: &Path, reason| IssueError::Key {
        what,
        path: path.to_path_buf(),
        reason,
    };
    if let Some(path) = &jwt.dev_signing_key {
        let path = path.get_ref();
        return keys::read_capped(&resolve(dir, path), keys::MAX_KEY_FILE_BYTES)
            .and_then(|bytes| private_key_from_pem(&bytes))
            .map_err(|reason| key_error("dev_signing_key", path, reason));
    }
    if let Some(path) = &jwt.hs_secret_file {
        let path = path.get_ref();
        let secret = keys::read_capped(&resolve(dir, path), keys::MAX_KEY_FILE_BYTES)
            .and_then(keys::hs_secret)
            .map_err(|reason| key_error("hs_secret_file", path, reason))?;
        return Ok((
            KeyKind::Hmac,
            EncodingKey::from_secret(&secret).map_err(|e| IssueError::Sign(e.to_string()))?,
        ));
    }
    Err(IssueError::NoSigningKey {
        who: who.to_owned(),
    })
}

/// An unencrypted PKCS#8 private key (Ed25519, P-256, P-384, RSA), or a
/// PKCS#1 `RSA PRIVATE KEY`.
fn private_key_from_pem(bytes: &[u8]) -> Result<(KeyKind, EncodingKey), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "it is not a PEM file".to_owned())?;
    let (label, der) =
        SecretDocument::from_pem(text).map_err(|e| format!("it is not a PEM file ({e})"))?;
    let der = der.as_bytes();
    match label {
        "PRIVATE KEY" => {}
        "RSA PRIVATE KEY" => return Ok((KeyKind::Rsa, EncodingKey::from_rsa_der(der))),
        "ENCRYPTED PRIVATE KEY" => return Err("encrypted keys are not supported".to_owned()),
        "EC PRIVATE KEY" => {
            return Err("SEC1 EC keys are not supported; convert with \
                        `openssl pkcs8 -topk8 -nocrypt -in KEY`"
                .to_owned());
        }
        other => return Err(format!("expected a `PRIVATE KEY` PEM, found `{other}`")),
    }
    let info = PrivateKeyInfo::try_from(der).map_err(|e| format!("not a PKCS#8 key ({e})"))?;
    let oid = info.algorithm.oid;
    if oid == OID_ED25519 {
        Ok((KeyKind::Ed25519, EncodingKey::from_ed_der(der)))
    } else if oid == OID_RSA {
        // jsonwebtoken signs with the PKCS#1 key inside the PKCS#8 wrapper.
        Ok((KeyKind::Rsa, EncodingKey::from_rsa_der(info.private_key)))
    } else if oid == OID_EC {
        match info.algorithm.parameters_oid() {
            Ok(curve) if curve == OID_P256 => Ok((KeyKind::EcP256, EncodingKey::from_ec_der(der))),
            Ok(curve) if curve == OID_P384 => Ok((KeyKind::EcP384, EncodingKey::from_ec_der(der))),
            _ => Err("unsupported elliptic curve (P-256 and P-384 are)".to_owned()),
        }
    } else {
        Err(format!("unsupported key type (OID {oid})"))
    }
}

/// A fresh Ed25519 key pair as PEM: PKCS#8 private key, SPKI public key.
pub struct DevKeyPair {
    pub private_pem: String,
    pub public_pem: String,
}

impl std::fmt::Debug for DevKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevKeyPair")
            .field("private_pem", &"[redacted]")
            .field("public_pem", &self.public_pem)
            .finish()
    }
}

/// Generates an Ed25519 key pair for `dev_signing_key` and `public_keys`.
pub fn dev_keypair() -> Result<DevKeyPair, IssueError> {
    let key = SigningKey::generate(&mut rand_core::OsRng);
    // PKCS#8 v1 (no embedded public key), as `openssl genpkey` writes it:
    // the form every tool reads.
    let private = KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    let private_pem = private
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| IssueError::Keygen(e.to_string()))?;
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| IssueError::Keygen(e.to_string()))?;
    Ok(DevKeyPair {
        private_pem: private_pem.to_string(),
        public_pem,
    })
}
