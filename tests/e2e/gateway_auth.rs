//! Every way a token can be wrong, over HTTP: each is a 401 or 403 with a
//! clear message, and none of them reaches the gpu-host.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bulkhead_tests::{Gateway, PolicyDir, demo_model_entry};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

const BETA_SECRET: &str = "beta-shared-secret-of-at-least-32-bytes!";

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The demo tenant plus `beta` (HS256 with a shared secret) who alone may
/// use the model `beta-only`.
fn policies() -> PolicyDir {
    let policies = PolicyDir::new("auth");
    policies.write(
        "gateway.toml",
        &format!(
            "[local_gpu_host]\nthreads = 1\n{}{}",
            demo_model_entry("bulkhead-demo-tiny"),
            demo_model_entry("beta-only")
        ),
    );
    policies.write("beta.secret", BETA_SECRET);
    // `delta` names its keys in a JWKS (the demo key as `k1`), so a `kid` matters.
    let public_pem = policies.read("dev-keys/demo.pub.pem");
    let der: String = public_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(der)
        .unwrap();
    let x = URL_SAFE_NO_PAD.encode(&der[der.len() - 32..]);
    policies.write(
        "delta.jwks.json",
        &json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "kid": "k1", "x": x}]})
            .to_string(),
    );
    policies.write(
        "tenants/delta.toml",
        "id = \"delta\"\nmodels = [\"bulkhead-demo-tiny\"]\n\n[jwt]\nissuer = \"delta-idp\"\n\
         audience = [\"bulkhead\"]\nalgorithms = [\"EdDSA\"]\njwks = \"delta.jwks.json\"\n",
    );
    policies.write(
        "tenants/beta.toml",
        "id = \"beta\"\nmodels = [\"beta-only\"]\n\n[jwt]\nissuer = \"beta-idp\"\n\
         audience = [\"bulkhead\"]\nalgorithms = [\"HS256\"]\nhs_secret_file = \"beta.secret\"\n",
    );
    policies
}

fn demo_claims() -> Value {
    json!({
        "iss": "bulkhead-dev",
        "aud": "bulkhead",
        "sub": "tester",
        "scope": "inference",
        "iat": now(),
        "exp": now() + 600,
    })
}

fn with(mut claims: Value, changes: Value) -> Value {
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

fn demo_token(policies: &PolicyDir, claims: &Value, kid: Option<&str>) -> String {
    let pem = policies.read("dev-keys/demo.key.pem");
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = kid.map(str::to_string);
    encode(
        &header,
        claims,
        &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn hs256(secret: &[u8], claims: &Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

fn unsigned(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    format!("{header}.{payload}.")
}

fn chat(model: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        .to_string()
}

#[test]
fn every_bad_token_is_refused_with_a_clear_message_and_no_work() {
    let policies = policies();
    let gateway = Gateway::start(&policies);
    let claims = demo_claims();
    let public_pem = policies.read("dev-keys/demo.pub.pem");

    // (what, token, model, status, code, what the message must say)
    type Case<'a> = (&'a str, Option<String>, &'a str, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            "no Authorization header",
            None,
            "bulkhead-demo-tiny",
            401,
            "missing_authorization",
            "Authorization: Bearer",
        ),
        (
            "garbage",
            Some("not-a-jwt".into()),
            "bulkhead-demo-tiny",
            401,
            "invalid_token",
            "three base64url parts",
        ),
        (
            "three garbage parts",
            Some("a.b.c".into()),
            "bulkhead-demo-tiny",
            401,
            "invalid_token",
            "the header is not base64url JSON",
        ),
        (
            "alg none",
            Some(unsigned(&claims)),
            "bulkhead-demo-tiny",
            401,
            "algorithm_not_allowed",
            "algorithm `none`",
        ),
        (
            "HS256 keyed with the tenant's public key (alg confusion)",
            Some(hs256(public_pem.as_bytes(), &claims)),
            "bulkhead-demo-tiny",
            401,
            "algorithm_not_allowed",
            "algorithm `HS256`",
        ),
        (
            "wrong audience",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"aud": "someone-else"})),
                None,
            )),
            "bulkhead-demo-tiny",
            401,
            "invalid_audience",
            "audience",
        ),
        (
            "unknown issuer",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"iss": "mallory"})),
                None,
            )),
            "bulkhead-demo-tiny",
            401,
            "unknown_issuer",
            "issuer is not configured",
        ),
        (
            "beta's issuer, demo's key",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"iss": "beta-idp"})),
                None,
            )),
            "beta-only",
            401,
            "algorithm_not_allowed",
            "algorithm `EdDSA`",
        ),
        (
            "expired",
            Some(demo_token(
                &policies,
                &with(
                    claims.clone(),
                    json!({"exp": now() - 3600, "iat": now() - 7200}),
                ),
                None,
            )),
            "bulkhead-demo-tiny",
            401,
            "token_expired",
            "token expired at",
        ),
        (
            "not yet valid",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"nbf": now() + 3600})),
                None,
            )),
            "bulkhead-demo-tiny",
            401,
            "token_not_yet_valid",
            "not valid before",
        ),
        (
            "no exp",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"exp": null})),
                None,
            )),
            "bulkhead-demo-tiny",
            401,
            "missing_claim",
            "`exp`",
        ),
        (
            "unknown kid",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"iss": "delta-idp"})),
                Some("no-such-key"),
            )),
            "bulkhead-demo-tiny",
            401,
            "unknown_kid",
            "`no-such-key`",
        ),
        (
            "oversized",
            Some("e".repeat(64 * 1024)),
            "bulkhead-demo-tiny",
            401,
            "invalid_token",
            "larger than 8192 bytes",
        ),
        (
            "no inference scope",
            Some(demo_token(
                &policies,
                &with(claims.clone(), json!({"scope": "plugins:write"})),
                None,
            )),
            "bulkhead-demo-tiny",
            403,
            "insufficient_scope",
            "`inference` scope",
        ),
        (
            "demo's valid token for beta's model",
            Some(demo_token(&policies, &claims, None)),
            "beta-only",
            403,
            "model_not_allowed",
            "may not use model `beta-only`",
        ),
        (
            "beta's valid token for demo's model",
            Some(hs256(
                BETA_SECRET.as_bytes(),
                &with(claims.clone(), json!({"iss": "beta-idp"})),
            )),
            "bulkhead-demo-tiny",
            403,
            "model_not_allowed",
            "may not use model `bulkhead-demo-tiny`",
        ),
    ];
    for (what, token, model, status, code, says) in &cases {
        let r = gateway.request(
            "POST",
            "/v1/chat/completions",
            token.as_deref(),
            Some(&chat(model)),
        );
        assert_eq!(r.status, *status, "{what}: {}", r.body);
        let error = &r.json()["error"];
        let message = error["message"].as_str().unwrap();
        assert_eq!(error["code"], *code, "{what}: {message}");
        assert!(
            message.contains(says),
            "{what}: {message:?} does not say {says:?}"
        );
        if let Some(token) = token
            && token.len() > 20
        {
            assert!(
                !r.body.contains(token.as_str()),
                "{what}: the token is echoed"
            );
        }
    }
    // None of them cost a token of GPU work.
    assert_eq!(gateway.metric("bulkhead_tokens_total", &[]), 0.0);
    assert_eq!(
        gateway.metric("bulkhead_rejections_total", &[]),
        cases.len() as f64
    );

    // The same keys do work when the token is right.
    let ok = demo_token(&policies, &claims, None);
    let r = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&ok),
        Some(&chat("bulkhead-demo-tiny")),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let beta = hs256(
        BETA_SECRET.as_bytes(),
        &with(claims, json!({"iss": "beta-idp"})),
    );
    let r = gateway.request(
        "POST",
        "/v1/chat/completions",
        Some(&beta),
        Some(&chat("beta-only")),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Each tenant sees only its own models.
    let models = gateway
        .request("GET", "/v1/models", Some(&beta), None)
        .json();
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["id"], "beta-only");
}
