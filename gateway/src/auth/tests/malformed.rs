//! Tokens refused for their form: unsigned, malformed, oversized, altered,
//! or random input (which must never panic).

use proptest::prelude::*;

use super::fixture::*;
use super::*;
use crate::auth::{AuthError, MAX_TOKEN_BYTES};

#[test]
fn unsigned_tokens_are_refused_whatever_the_signature() {
    let f = fixture();
    for alg in ["none", "None", "NONE"] {
        for signature in ["", "c2ln"] {
            let token = craft(
                &json!({ "alg": alg, "typ": "JWT" }),
                &claims(ED_ISS),
                signature,
            );
            let err = f.reject(&token);
            assert_eq!(
                err,
                AuthError::AlgorithmNotAllowed {
                    alg: alg.to_owned()
                }
            );
            assert_eq!(err.code(), "algorithm_not_allowed");
            assert_eq!(
                err.to_string(),
                format!("algorithm `{alg}` is not allowed for this issuer")
            );
        }
    }
}

#[test]
fn garbage_is_a_malformed_token() {
    let f = fixture();
    let header = b64(r#"{"alg":"EdDSA"}"#);
    let payload = b64(claims(ED_ISS).to_string());
    let cases = [
        (String::new(), "the token is empty"),
        (
            "a.b".to_owned(),
            "a JWT is three base64url parts separated by dots",
        ),
        (
            "a.b.c.d.e".to_owned(),
            "a JWT is three base64url parts separated by dots",
        ),
        (
            "a.b.c".to_owned(),
            "the header is not base64url JSON with a string `alg`",
        ),
        (".b.c".to_owned(), "a part of the token is empty"),
        (
            format!("!!!.{payload}.c2ln"),
            "the header is not base64url JSON with a string `alg`",
        ),
        (
            format!("{}.{payload}.c2ln", b64("hello")),
            "the header is not base64url JSON with a string `alg`",
        ),
        (
            format!("{}.{payload}.c2ln", b64("[\"EdDSA\"]")),
            "the header is not base64url JSON with a string `alg`",
        ),
        (
            format!("{}.{payload}.c2ln", b64(r#"{"alg":5}"#)),
            "the header is not base64url JSON with a string `alg`",
        ),
        (
            format!("{header}=.{payload}.c2ln"),
            "the header is not base64url JSON with a string `alg`",
        ),
        (
            format!("{header}.{}.c2ln", b64("[1]")),
            "the payload is not a base64url JSON object",
        ),
        (
            format!("{header}.{}.c2ln", b64(r#"{"iss":"a","iss":"b"}"#)),
            "the payload is not a base64url JSON object",
        ),
        (
            format!("{header}.%%%.c2ln"),
            "the payload is not a base64url JSON object",
        ),
        (format!("{header}.{payload}."), "the signature is empty"),
        (
            format!(
                "{}.{payload}.c2ln",
                b64(r#"{"alg":"EdDSA","crit":["b64"]}"#)
            ),
            "the header has `crit` extensions, which are not supported",
        ),
    ];
    for (token, reason) in cases {
        let err = f.reject(&token);
        assert_eq!(err, AuthError::MalformedToken { reason }, "{token:?}");
        assert_eq!(err.code(), "invalid_token");
        assert_eq!(err.to_string(), format!("malformed token: {reason}"));
    }
    // Well-formed but not a signature: refused as such.
    let token = f.ed.sign(&claims(ED_ISS));
    let (signed, _) = token.rsplit_once('.').unwrap();
    assert_eq!(f.reject(&format!("{signed}.%%%")), AuthError::BadSignature);
    assert_eq!(f.reject(&format!("{signed}.c2ln")), AuthError::BadSignature);
}

/// Found by the `jwt_verify` fuzz target: serde_json skips an unknown member
/// without checking its UTF-8, so a signed header or payload that was not
/// UTF-8 (so not JSON, RFC 7519 §7.2) was accepted.
#[test]
fn parts_that_are_not_utf8_are_malformed_even_when_signed() {
    let f = fixture();
    let not_utf8 = |json: &Value| {
        let mut bytes = json.to_string().into_bytes();
        bytes.pop();
        bytes.extend_from_slice(b",\"x-note\":\"caf\xe9\"}");
        b64(bytes)
    };
    let signed = |header: String, payload: String| {
        let input = format!("{header}.{payload}");
        let signature =
            jsonwebtoken::crypto::sign(input.as_bytes(), &f.ed.key, Algorithm::EdDSA).unwrap();
        format!("{input}.{signature}")
    };
    let header = json!({ "alg": "EdDSA" });
    let valid = signed(b64(header.to_string()), b64(claims(ED_ISS).to_string()));
    assert!(f.verify(&valid).is_ok());

    let token = signed(b64(header.to_string()), not_utf8(&claims(ED_ISS)));
    assert_eq!(
        f.reject(&token),
        AuthError::MalformedToken {
            reason: "the payload is not a base64url JSON object"
        }
    );
    let token = signed(not_utf8(&header), b64(claims(ED_ISS).to_string()));
    assert_eq!(
        f.reject(&token),
        AuthError::MalformedToken {
            reason: "the header is not base64url JSON with a string `alg`"
        }
    );
}

#[test]
fn oversized_tokens_are_refused_before_parsing() {
    let f = fixture();
    let err = f.reject(&"a".repeat(9 * 1024));
    assert_eq!(
        err,
        AuthError::TokenTooLarge {
            limit_bytes: MAX_TOKEN_BYTES
        }
    );
    assert_eq!(err.to_string(), "token is larger than 8192 bytes");
    // Even a valid signature does not get a large token parsed.
    let padded =
        f.ed.sign(&claims_with(ED_ISS, json!({ "pad": "x".repeat(7 * 1024) })));
    assert!(padded.len() > MAX_TOKEN_BYTES);
    assert_eq!(f.reject(&padded), err);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_input_never_panics(token in ".{0,300}", dots in "[A-Za-z0-9_.-]{0,300}") {
        let f = shared_fixture();
        prop_assert!(f.verify(&token).is_err());
        prop_assert!(f.verify(&dots).is_err());
    }

    #[test]
    fn altered_tokens_never_verify(index in any::<prop::sample::Index>(), byte in 0x21u8..0x7f) {
        let f = shared_fixture();
        let token = f.ed.sign(&claims(ED_ISS));
        let mut bytes = token.clone().into_bytes();
        let i = index.index(bytes.len());
        prop_assume!(bytes[i] != byte);
        bytes[i] = byte;
        let altered = String::from_utf8(bytes).unwrap();
        // Base64 padding bits aside, any change must break the token.
        if let Ok(id) = f.verify(&altered) {
            prop_assert_eq!(id, f.verify(&token).unwrap());
        }
    }
}
