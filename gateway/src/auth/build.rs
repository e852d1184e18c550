//! Turning each tenant's `[jwt]` table and each `[[operator.issuers]]`
//! entry into a verifier, with every problem
//! reported at the field it comes from (`file:line:col`).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use jsonwebtoken::Algorithm;
use subtle::ConstantTimeEq;
use toml::Spanned;

use super::config::{Config, JwtFile};
use super::keys::{self, KeyKind, VerifyKey};
use super::verify::{IssuerVerifier, Owner};
use crate::source::{PolicyError, SourceFile};

const KNOWN_ALGORITHMS: &str = "RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, \
                                HS256, HS384, HS512";

/// A token's longest life unless its issuer says otherwise: a day.
pub const DEFAULT_MAX_LIFETIME_S: u64 = 86_400;
/// The most `max_lifetime_s` may say (a year).
const MAX_MAX_LIFETIME_S: u64 = 365 * 86_400;

/// `path` as written in a policy file, resolved against the policy folder.
pub(super) fn resolve(dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        dir.join(path)
    }
}

/// Verifiers keyed by issuer.
pub(super) type ByIssuer = HashMap<String, IssuerVerifier>;

/// Every issuer's verifier: tenants' and the operator's, each keyed by
/// issuer. An issuer named twice (by two tenants, or by a tenant and the
/// operator) is an error at the second, naming where the first is: the
/// issuer is what picks whose keys check a token, so it must pick one.
pub(super) fn verifiers(config: &Config) -> Result<(ByIssuer, ByIssuer), Vec<PolicyError>> {
    let mut errors = Vec::new();
    let mut tenants = ByIssuer::new();
    let mut operators = ByIssuer::new();
    // Issuer → who uses it and where, for the collision message.
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut secrets: Vec<(String, Vec<u8>)> = Vec::new();

    for issuer in &config.issuers {
        let (jwt, source, owner) = (issuer.jwt, issuer.source, issuer.owner.clone());
        let who = match &owner {
            Owner::Tenant(id) => format!("tenant `{id}`"),
            Owner::Operator => "the operator".to_owned(),
        };
        let issuer = jwt.issuer.get_ref().as_str();
        let (line, col) = source.line_col(jwt.issuer.span().start);
        let here = format!("{who} ({}:{line}:{col})", source.name.display());
        let duplicate = if let Some(first) = seen.get(issuer) {
            errors.push(source.error_at(
                jwt.issuer.span(),
                format!(
                    "{who} has issuer `{issuer}`, which {first} already uses; every tenant and \
                     the operator need issuers of their own (the issuer picks whose keys verify \
                     a token, so a shared one would let one principal's identity provider \
                     speak for the other)"
                ),
            ));
            true
        } else {
            if !issuer.trim().is_empty() {
                seen.insert(issuer.to_owned(), here.clone());
            }
            false
        };

        let header = match owner {
            Owner::Tenant(_) => "[jwt]",
            Owner::Operator => "[[operator.issuers]]",
        };
        let Some((verifier, secret)) =
            issuer_verifier(jwt, source, header, owner, config.dir, &mut errors)
        else {
            continue;
        };
        if let (Some(secret), Some(field)) = (secret, &jwt.hs_secret_file) {
            // Two principals sharing a secret could each mint the other's tokens.
            if let Some((owner, _)) = secrets.iter().find(|(_, s)| bool::from(s.ct_eq(&secret))) {
                errors.push(source.error_at(
                    field.span(),
                    format!(
                        "{who} uses the same HMAC secret as {owner}; either could mint the \
                         other's tokens"
                    ),
                ));
                continue;
            }
            secrets.push((here, secret));
        }
        if duplicate {
            continue;
        }
        let map = match verifier.owner {
            Owner::Tenant(_) => &mut tenants,
            Owner::Operator => &mut operators,
        };
        map.insert(issuer.to_owned(), verifier);
    }
    if errors.is_empty() {
        Ok((tenants, operators))
    } else {
        Err(errors)
    }
}

/// One issuer's verifier and its HMAC secret (for the cross-issuer check),
/// or `None` after pushing its errors. `header` is the TOML table the
/// fields are under, to point at a field that has no span of its own.
fn issuer_verifier(
    jwt: &JwtFile,
    source: &SourceFile,
    header: &str,
    owner: Owner,
    dir: &Path,
    errors: &mut Vec<PolicyError>,
) -> Option<(IssuerVerifier, Option<Vec<u8>>)> {
    let errors_before = errors.len();
    let at = |span: Range<usize>, message: String| source.error_at(span, message);

    if jwt.issuer.get_ref().trim().is_empty() {
        errors.push(at(jwt.issuer.span(), "`issuer` must not be empty".into()));
    }
    if jwt.audience.is_empty() {
        let span = field_span(source, header, "audience", jwt.issuer.span());
        errors.push(at(
            span,
            "`audience` must name at least one audience".into(),
        ));
    }
    for aud in &jwt.audience {
        if aud.get_ref().trim().is_empty() {
            errors.push(at(aud.span(), "an audience must not be empty".into()));
        }
    }

    let algorithms = algorithms(
        jwt.algorithms.as_slice(),
        source,
        header,
        jwt.issuer.span(),
        errors,
    );
    let wants_hs = algorithms
        .iter()
        .find(|(a, _)| KeyKind::for_algorithm(*a) == KeyKind::Hmac);
    match (wants_hs, &jwt.hs_secret_file) {
        (Some((alg, span)), None) => errors.push(at(
            span.clone(),
            format!(
                "{alg:?} needs `hs_secret_file`: HMAC algorithms are only allowed with an \
                 explicitly configured shared secret"
            ),
        )),
        (None, Some(file)) => errors.push(at(
            file.span(),
            "`hs_secret_file` is set but `algorithms` allows no HS256, HS384 or HS512; \
             add one or remove the secret"
                .into(),
        )),
        _ => {}
    }

    let key_errors_before = errors.len();
    let mut keys: Vec<VerifyKey> = Vec::new();
    for path in &jwt.public_keys {
        let loaded = keys::read_capped(&resolve(dir, path.get_ref()), keys::MAX_KEY_FILE_BYTES)
            .and_then(|bytes| keys::public_key_from_pem(&bytes));
        match loaded {
            Ok(key) => keys.push(key),
            Err(reason) => errors.push(file_error(source, path, "public key", &reason)),
        }
    }
    if let Some(path) = &jwt.jwks {
        match keys::read_capped(&resolve(dir, path.get_ref()), keys::MAX_JWKS_BYTES) {
            Ok(bytes) => match keys::jwks_keys(&bytes) {
                Ok(found) => keys.extend(found),
                Err(reasons) => {
                    for reason in reasons {
                        errors.push(file_error(source, path, "JWKS", &reason));
                    }
                }
            },
            Err(reason) => errors.push(file_error(source, path, "JWKS", &reason)),
        }
    }
    let mut secret = None;
    if let Some(path) = &jwt.hs_secret_file {
        let loaded = keys::read_capped(&resolve(dir, path.get_ref()), keys::MAX_KEY_FILE_BYTES)
            .and_then(keys::hs_secret)
            .and_then(|s| Ok((keys::hs_key(&s)?, s)));
        match loaded {
            Ok((key, s)) => {
                keys.push(key);
                secret = Some(s);
            }
            Err(reason) => errors.push(file_error(source, path, "HMAC secret", &reason)),
        }
    }

    // After a key failed to load, "no key for X" would only repeat it.
    if errors.len() == key_errors_before {
        for (alg, span) in &algorithms {
            let kind = KeyKind::for_algorithm(*alg);
            if kind != KeyKind::Hmac && !keys.iter().any(|k| k.can_verify(*alg)) {
                errors.push(at(
                    span.clone(),
                    format!(
                        "no key can verify {alg:?} tokens: add {} to `public_keys` or `jwks`",
                        kind.describe()
                    ),
                ));
            }
        }
    }

    if errors.len() != errors_before {
        return None;
    }
    let max_lifetime_s = match jwt
        .max_lifetime_s
        .as_ref()
        .map(|m| (*m.get_ref(), m.span()))
    {
        None => Some(DEFAULT_MAX_LIFETIME_S),
        Some((0, _)) => None,
        Some((s, span)) if s > MAX_MAX_LIFETIME_S => {
            errors.push(at(
                span,
                format!(
                    "`max_lifetime_s` is {s}; at most {MAX_MAX_LIFETIME_S} (a year), or 0 for \
                     no limit"
                ),
            ));
            return None;
        }
        Some((s, _)) => Some(s),
    };
    let verifier = IssuerVerifier {
        owner,
        max_lifetime_s,
        issuer: jwt.issuer.get_ref().clone(),
        audiences: jwt.audience.iter().map(|a| a.get_ref().clone()).collect(),
        algorithms: algorithms.into_iter().map(|(a, _)| a).collect(),
        keys,
    };
    Some((verifier, secret))
}

/// The allowed algorithms with their spans; `none` and unknown names are errors.
fn algorithms(
    names: &[Spanned<String>],
    source: &SourceFile,
    header: &str,
    fallback: Range<usize>,
    errors: &mut Vec<PolicyError>,
) -> Vec<(Algorithm, Range<usize>)> {
    if names.is_empty() {
        let span = field_span(source, header, "algorithms", fallback);
        errors.push(source.error_at(span, "`algorithms` must allow at least one algorithm"));
    }
    let mut out: Vec<(Algorithm, Range<usize>)> = Vec::new();
    for name in names {
        let text = name.get_ref().as_str();
        if text.trim().eq_ignore_ascii_case("none") {
            errors.push(source.error_at(
                name.span(),
                "algorithm `none` is never allowed: it would accept unsigned tokens",
            ));
            continue;
        }
        match Algorithm::from_str(text) {
            Ok(alg) if out.iter().any(|(a, _)| *a == alg) => {}
            Ok(alg) => out.push((alg, name.span())),
            Err(_) => errors.push(source.error_at(
                name.span(),
                format!("unknown algorithm `{text}` (known: {KNOWN_ALGORITHMS})"),
            )),
        }
    }
    out
}

fn file_error(
    source: &SourceFile,
    path: &Spanned<PathBuf>,
    what: &str,
    reason: &str,
) -> PolicyError {
    let shown = path.get_ref().display();
    source.error_at(path.span(), format!("{what} `{shown}`: {reason}"))
}

/// Where `key = ...` is written in `source` (after `header` if there is
/// such a header, and before `fallback` ends, which is inside the table):
/// `Spanned` fields give their own span, but a `Vec` of them has none, and
/// an empty list still needs a place to point at.
fn field_span(
    source: &SourceFile,
    header: &str,
    key: &str,
    fallback: Range<usize>,
) -> Range<usize> {
    let text = source.text.as_str();
    let start = text[..fallback.start.min(text.len())]
        .rfind(header)
        .or_else(|| text.find(header))
        .unwrap_or(0);
    let mut offset = start;
    for line in text[start..].split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            let at = offset + (line.len() - trimmed.len());
            return at..at + key.len();
        }
        offset += line.len();
    }
    fallback
}
