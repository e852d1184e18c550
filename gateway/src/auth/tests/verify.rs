//! Verifying tokens: what is accepted, and claims that get a token refused.

use super::fixture::*;
use super::*;
use crate::auth::{AuthError, Scope, Scopes};

#[test]
fn valid_tokens_of_each_algorithm_name_their_tenant() {
    let f = fixture();
    let both = Scopes::from(Scope::Inference).with(Scope::PluginsWrite);
    for (signer, iss, tenant) in [
        (&f.ed, ED_ISS, "ed"),
        (&f.es, ES_ISS, "es"),
        (&f.rs, RS_ISS, "rs"),
        (&f.hs, HS_ISS, "hs"),
        (&f.rs, MIX_ISS, "mix"),
    ] {
        let token = signer.sign(&claims(iss));
        assert_eq!(f.verify(&token), Ok(identity(tenant, both)), "{tenant}");
    }
    // The same key under another tenant's issuer is a different tenant.
    assert_eq!(f.verifiers.tenant_for_issuer(ED_ISS), Some("ed"));
}

#[test]
fn scp_arrays_audience_arrays_and_fractional_dates_are_accepted() {
    let f = fixture();
    let token = f.ed.sign(&claims_with(
        ED_ISS,
        json!({ "scope": null, "scp": ["plugins:write", "other"], "aud": ["x", "bulkhead"],
                "exp": NOW as f64 + 600.5, "sub": null }),
    ));
    let id = f.verify(&token).unwrap();
    assert_eq!(id.scopes, Scopes::from(Scope::PluginsWrite));
    assert_eq!(id.sub, None);
    assert_eq!(id.expires_at, NOW + 600);
}

#[test]
fn hs256_signed_with_the_rsa_public_key_is_refused() {
    let f = fixture();
    let public_pem = std::fs::read(testdata("rsa2048.pub.pem")).unwrap();
    let forger = Signer {
        alg: Algorithm::HS256,
        key: EncodingKey::from_secret(&public_pem).unwrap(),
    };
    // RS256-only tenant: the algorithm itself is refused.
    let err = f.reject(&forger.sign(&claims(RS_ISS)));
    assert_eq!(
        err,
        AuthError::AlgorithmNotAllowed {
            alg: "HS256".to_owned()
        }
    );
    // A tenant allowing both: HS256 is checked against its secret only.
    assert_eq!(
        f.reject(&forger.sign(&claims(MIX_ISS))),
        AuthError::BadSignature
    );
    // ...and an algorithm of another family in the header fails the same way.
    let token = f.es.sign(&claims(RS_ISS));
    assert_eq!(
        f.reject(&token),
        AuthError::AlgorithmNotAllowed {
            alg: "ES256".to_owned()
        }
    );
}

#[test]
fn issuers_must_be_known_and_match_the_signing_key() {
    let f = fixture();
    let err = f.reject(&f.ed.sign(&claims("https://evil.example/")));
    assert_eq!(err, AuthError::UnknownIssuer);
    assert_eq!(
        (err.code(), err.to_string().as_str()),
        (
            "unknown_issuer",
            "token issuer is not configured for any tenant"
        )
    );
    // Tenant ed2's key claiming tenant ed's issuer, and the other way round.
    assert_eq!(
        f.reject(&f.ed2.sign(&claims(ED_ISS))),
        AuthError::BadSignature
    );
    assert_eq!(
        f.reject(&f.ed.sign(&claims(ED2_ISS))),
        AuthError::BadSignature
    );
    assert_eq!(
        AuthError::BadSignature.to_string(),
        "token signature is invalid"
    );
    let no_iss = f.ed.sign(&claims_with(ED_ISS, json!({ "iss": null })));
    assert_eq!(f.reject(&no_iss), AuthError::MissingClaim { claim: "iss" });
    let list_iss = f.ed.sign(&claims_with(ED_ISS, json!({ "iss": [ED_ISS] })));
    assert_eq!(
        f.reject(&list_iss),
        AuthError::InvalidClaim {
            claim: "iss",
            expected: "a string"
        }
    );
}

#[test]
fn audience_must_name_this_service() {
    let f = fixture();
    let err = f.reject(&f.ed.sign(&claims_with(ED_ISS, json!({ "aud": "other" }))));
    assert_eq!(err, AuthError::WrongAudience);
    assert_eq!(err.code(), "invalid_audience");
    assert_eq!(err.to_string(), "token audience does not name this service");
    let err = f.reject(
        &f.ed
            .sign(&claims_with(ED_ISS, json!({ "aud": ["a", "b"] }))),
    );
    assert_eq!(err, AuthError::WrongAudience);
    let err = f.reject(&f.ed.sign(&claims_with(ED_ISS, json!({ "aud": null }))));
    assert_eq!(err, AuthError::MissingClaim { claim: "aud" });
    assert_eq!(err.to_string(), "token lacks the required `aud` claim");
    let err = f.reject(&f.ed.sign(&claims_with(ED_ISS, json!({ "aud": 7 }))));
    assert!(
        matches!(err, AuthError::InvalidClaim { claim: "aud", .. }),
        "{err:?}"
    );
}

#[test]
fn time_claims_are_checked_with_the_leeway() {
    let f = fixture();
    let token = |changes: Value| f.ed.sign(&claims_with(ED_ISS, changes));
    let exp = NOW - LEEWAY_S;
    let err = f.reject(&token(json!({ "exp": exp })));
    assert_eq!(err, AuthError::Expired { exp, now: NOW });
    assert_eq!(err.code(), "token_expired");
    assert_eq!(
        err.to_string(),
        "token expired at 1699999970 (unix seconds; now 1700000000)"
    );
    assert!(f.verify(&token(json!({ "exp": exp + 1 }))).is_ok());

    let nbf = NOW + LEEWAY_S;
    assert!(f.verify(&token(json!({ "nbf": nbf }))).is_ok());
    let err = f.reject(&token(json!({ "nbf": nbf + 1 })));
    assert_eq!(
        err,
        AuthError::NotYetValid {
            nbf: nbf + 1,
            now: NOW
        }
    );
    assert_eq!(err.code(), "token_not_yet_valid");

    assert!(f.verify(&token(json!({ "iat": nbf }))).is_ok());
    let err = f.reject(&token(json!({ "iat": nbf + 1 })));
    assert_eq!(
        err,
        AuthError::IssuedInFuture {
            iat: nbf + 1,
            now: NOW
        }
    );
    assert_eq!(err.code(), "token_issued_in_future");
}

#[test]
fn tokens_live_at_most_a_day_by_default_and_must_say_when_they_began() {
    let f = fixture();
    let token = |changes: Value| f.ed.sign(&claims_with(ED_ISS, changes));
    // From `nbf` (here NOW - 10) to `exp`: a day is allowed, a second more is not.
    let day = 86_400;
    assert!(f.verify(&token(json!({ "exp": NOW - 10 + day }))).is_ok());
    let err = f.reject(&token(json!({ "exp": NOW - 10 + day + 1 })));
    assert_eq!(
        err,
        AuthError::LifetimeTooLong {
            lifetime_s: day + 1,
            max_s: day
        }
    );
    assert_eq!(err.code(), "token_lifetime_too_long");
    // The token from the issue: valid until 1e300.
    let err = f.reject(&token(json!({ "exp": 1e300 })));
    assert!(matches!(err, AuthError::LifetimeTooLong { .. }), "{err:?}");
    // Without `nbf`, from `iat`; without `iat`, refused.
    assert!(
        f.verify(&token(json!({ "nbf": null, "exp": NOW - 10 + day })))
            .is_ok()
    );
    let err = f.reject(&token(json!({ "iat": null })));
    assert_eq!(err, AuthError::MissingClaim { claim: "iat" });
}

#[test]
fn exp_is_required_and_must_be_a_number() {
    let f = fixture();
    let err = f.reject(&f.ed.sign(&claims_with(ED_ISS, json!({ "exp": null }))));
    assert_eq!(err, AuthError::MissingClaim { claim: "exp" });
    assert_eq!(err.code(), "missing_claim");
    for bad in [json!("1700000600"), json!(-5), json!(true)] {
        let err = f.reject(&f.ed.sign(&claims_with(ED_ISS, json!({ "exp": bad }))));
        assert_eq!(
            err.to_string(),
            "claim `exp` must be a number of seconds since 1970"
        );
        assert_eq!(err.code(), "invalid_token");
    }
}

#[test]
fn kid_picks_the_jwks_key() {
    let f = fixture();
    let c = claims(JW_ISS);
    assert_eq!(
        f.verify(&f.ed.sign_with_kid(&c, Some("ed-1")))
            .unwrap()
            .tenant,
        "jw"
    );
    assert_eq!(
        f.verify(&f.es.sign_with_kid(&c, Some("es-1")))
            .unwrap()
            .tenant,
        "jw"
    );
    assert_eq!(
        f.verify(&f.rs.sign_with_kid(&c, Some("rs-1")))
            .unwrap()
            .tenant,
        "jw"
    );
    // Without a kid every key of the right kind is tried.
    assert_eq!(f.verify(&f.es.sign(&c)).unwrap().tenant, "jw");

    let err = f.reject(&f.ed.sign_with_kid(&c, Some("ed-2")));
    assert_eq!(
        err,
        AuthError::UnknownKid {
            kid: "ed-2".to_owned()
        }
    );
    assert_eq!(
        (err.code(), err.to_string().as_str()),
        ("unknown_kid", "unknown kid `ed-2`")
    );
    let err = f.reject(&f.ed.sign_with_kid(&c, Some("rs-1")));
    assert_eq!(err.to_string(), "key `rs-1` cannot verify EdDSA tokens");
    // Another tenant's key under a known kid.
    assert_eq!(
        f.reject(&f.ed2.sign_with_kid(&c, Some("ed-1"))),
        AuthError::BadSignature
    );
    // PEM keys have no names: a kid is only a hint there.
    assert_eq!(
        f.verify(&f.ed.sign_with_kid(&claims(ED_ISS), Some("x")))
            .unwrap()
            .tenant,
        "ed"
    );
}

#[test]
fn scopes_are_required_with_a_403() {
    let f = fixture();
    let token =
        f.ed.sign(&claims_with(ED_ISS, json!({ "scope": "inference" })));
    let id = f.verify(&token).unwrap();
    assert_eq!(id.require(Scope::Inference), Ok(()));
    let err = id.require(Scope::PluginsWrite).unwrap_err();
    assert_eq!(
        err,
        AuthError::MissingScope {
            scope: Scope::PluginsWrite
        }
    );
    assert_eq!((err.status(), err.code()), (403, "insufficient_scope"));
    assert_eq!(err.to_string(), "token lacks the `plugins:write` scope");
    let bare = f.ed.sign(&claims_with(ED_ISS, json!({ "scope": null })));
    assert_eq!(f.verify(&bare).unwrap().scopes, Scopes::NONE);
    let bad = f.ed.sign(&claims_with(ED_ISS, json!({ "scope": 3 })));
    assert!(matches!(
        f.reject(&bad),
        AuthError::InvalidClaim { claim: "scope", .. }
    ));
}

#[test]
fn debug_output_holds_no_key_material() {
    let f = fixture();
    let debug = format!("{:?}", f.verifiers);
    assert!(debug.contains("https://hs.example/"), "{debug}");
    assert!(!debug.contains("0123456789abcdef"), "{debug}");
}

#[test]
fn a_remembered_token_still_expires() {
    let f = fixture();
    let token = f.ed.sign(&claims(ED_ISS));
    let at = |s: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
    let first = f.verifiers.verify(&token, at(NOW)).unwrap();
    // Served from the cache: the same identity.
    assert_eq!(f.verifiers.verify(&token, at(NOW + 1)), Ok(first.clone()));
    // Past `exp` + leeway the cached token is refused like a fresh one.
    let late = first.expires_at + LEEWAY_S;
    assert_eq!(
        f.verifiers.verify(&token, at(late)),
        Err(AuthError::Expired {
            exp: first.expires_at,
            now: late
        })
    );
    // A token that differs in one signature character is verified afresh.
    let mut forged = token.into_bytes();
    let i = forged.len() - 10;
    forged[i] = if forged[i] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    assert_eq!(
        f.verifiers.verify(&forged, at(NOW)),
        Err(AuthError::BadSignature)
    );
}
