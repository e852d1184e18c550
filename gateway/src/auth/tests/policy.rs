//! Policy errors from `Verifiers::build`, each at the field it comes from.
//!
//! `tenant_toml` puts `issuer` on line 4, `audience` on line 5 and the
//! extra `[jwt]` lines from line 6.

use p256::elliptic_curve::sec1::ToEncodedPoint;

use super::*;

/// The errors for one tenant `t` with these extra `[jwt]` lines.
fn errors_for(dir: &TempDir, jwt_lines: &str) -> Vec<String> {
    build_errors(
        dir,
        vec![tenant("t", &tenant_toml("t", "https://t/", jwt_lines))],
    )
}

fn ed_tenant(dir: &TempDir, key_path: &str) -> Vec<String> {
    errors_for(
        dir,
        &format!("algorithms = [\"EdDSA\"]\npublic_keys = [\"{key_path}\"]\n"),
    )
}

#[test]
fn a_missing_key_file_is_named_at_its_path() {
    let dir = TempDir::new();
    assert_eq!(
        ed_tenant(&dir, "keys/missing.pem"),
        [
            "tenants/t.toml:7:16: public key `keys/missing.pem`: cannot read it: \
          No such file or directory (os error 2)"
        ]
    );
}

#[test]
fn a_key_path_that_is_not_a_regular_file_is_refused_without_opening_it() {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("keys/sub")).unwrap();
    assert_eq!(
        ed_tenant(&dir, "keys/sub"),
        ["tenants/t.toml:7:16: public key `keys/sub`: it is not a regular file"]
    );
    // A FIFO would block a reader that opened it; it is refused the same way.
    let fifo = dir.path().join("keys/fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        assert_eq!(
            ed_tenant(&dir, "keys/fifo"),
            ["tenants/t.toml:7:16: public key `keys/fifo`: it is not a regular file"]
        );
    }
}

#[test]
fn files_that_are_not_public_keys_say_what_they_are() {
    let dir = TempDir::new();
    dir.write("keys/text.pem", "not a key\n");
    let errors = ed_tenant(&dir, "keys/text.pem");
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .starts_with("tenants/t.toml:7:16: public key `keys/text.pem`: it is not a PEM file ("),
        "{errors:?}"
    );

    dir.write(
        "keys/private.pem",
        std::fs::read(testdata("p384.key.pem")).unwrap(),
    );
    assert_eq!(
        ed_tenant(&dir, "keys/private.pem"),
        [
            "tenants/t.toml:7:16: public key `keys/private.pem`: it is a private key; \
          give the public key (`openssl pkey -pubout -in KEY`)"
        ]
    );

    let body = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
    dir.write("keys/cert.pem", body);
    assert!(ed_tenant(&dir, "keys/cert.pem")[0].contains("certificates are not accepted"));

    let garbage = "-----BEGIN PUBLIC KEY-----\nMAMCAQA=\n-----END PUBLIC KEY-----\n";
    dir.write("keys/garbage.pem", garbage);
    let errors = ed_tenant(&dir, "keys/garbage.pem");
    assert!(
        errors[0].contains("public key `keys/garbage.pem`: not a public key ("),
        "{errors:?}"
    );

    let absolute = testdata("rsa1024.pub.pem");
    let errors = ed_tenant(&dir, absolute.to_str().unwrap());
    assert!(
        errors[0].ends_with("rsa1024.pub.pem`: RSA key is 1024 bits; 2048 to 8192 are accepted"),
        "{errors:?}"
    );
}

/// Found by the `policy_load` fuzz target: an Ed25519 key of the wrong length
/// panicked jsonwebtoken's verifier (it slices `[..32]`) instead of being an error.
#[test]
fn ed25519_keys_of_the_wrong_length_are_errors_not_panics() {
    let dir = TempDir::new();
    for len in [0usize, 1, 31, 33] {
        let x = vec![7u8; len];
        dir.write(
            "keys/set.json",
            json!({ "keys": [{ "kty": "OKP", "crv": "Ed25519", "x": b64(&x) }] }).to_string(),
        );
        assert_eq!(
            errors_for(&dir, "algorithms = [\"EdDSA\"]\njwks = \"keys/set.json\"\n"),
            [format!(
                "tenants/t.toml:7:8: JWKS `keys/set.json`: key 0: an Ed25519 public key is 32 \
                 bytes, this one is {len}"
            )]
        );

        // The same bytes as an SPKI `PUBLIC KEY` (OID 1.3.101.112) in a PEM file.
        let bit_string = [&[0x03, len as u8 + 1, 0x00][..], &x].concat();
        let algorithm = [0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70];
        let body = [&algorithm[..], &bit_string].concat();
        let der = [&[0x30, body.len() as u8][..], &body].concat();
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(der)
        );
        dir.write("keys/short.pem", pem);
        assert_eq!(
            ed_tenant(&dir, "keys/short.pem"),
            [format!(
                "tenants/t.toml:7:16: public key `keys/short.pem`: an Ed25519 public key is 32 \
                 bytes, this one is {len}"
            )]
        );
    }
}

#[test]
fn every_supported_pem_form_loads() {
    let dir = TempDir::new();
    let pem = |name: &str| testdata(name).to_str().unwrap().to_owned();
    let lines = format!(
        "algorithms = [\"RS256\", \"PS256\", \"ES384\"]\npublic_keys = [\"{}\", \"{}\", \"{}\"]\n",
        pem("rsa2048.pub.pem"),
        pem("rsa2048.pkcs1.pub.pem"),
        pem("p384.pub.pem"),
    );
    let t = tenant("t", &tenant_toml("t", "https://t/", &lines));
    let verifiers = build(&policy(&dir, vec![t])).unwrap();
    assert_eq!(verifiers.tenant_for_issuer("https://t/"), Some("t"));
}

#[test]
fn hmac_needs_an_explicit_secret_and_a_secret_needs_hmac() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    assert_eq!(
        errors_for(
            &dir,
            "algorithms = [\"EdDSA\", \"HS256\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n"
        ),
        [
            "tenants/t.toml:6:24: HS256 needs `hs_secret_file`: HMAC algorithms are only allowed \
          with an explicitly configured shared secret"
        ]
    );
    Signer::hs256(&dir, "hs");
    assert_eq!(
        errors_for(
            &dir,
            "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n\
             hs_secret_file = \"keys/hs.secret\"\n"
        ),
        [
            "tenants/t.toml:8:18: `hs_secret_file` is set but `algorithms` allows no HS256, HS384 \
          or HS512; add one or remove the secret"
        ]
    );
    dir.write("keys/short.secret", "31-bytes-is-one-byte-too-short!\n");
    assert_eq!(
        errors_for(
            &dir,
            "algorithms = [\"HS256\"]\nhs_secret_file = \"keys/short.secret\"\n"
        ),
        [
            "tenants/t.toml:7:18: HMAC secret `keys/short.secret`: the secret is 31 bytes; HMAC \
          secrets must be at least 32 (e.g. `openssl rand -base64 48`)"
        ]
    );
}

#[test]
fn issuers_are_unique_across_tenants() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    let lines = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n";
    let errors = build_errors(
        &dir,
        vec![
            tenant("a", &tenant_toml("a", "https://same/", lines)),
            tenant("b", &tenant_toml("b", "https://same/", lines)),
        ],
    );
    assert_eq!(
        errors,
        [
            "tenants/b.toml:4:10: tenant `b` has issuer `https://same/`, which tenant `a` \
             (tenants/a.toml:4:10) already uses; every tenant and the operator need issuers of \
             their own (the issuer picks whose keys verify a token, so a shared one would let one \
             principal's identity provider speak for the other)"
        ]
    );
}

/// The errors of `tenants` with this `gateway.toml`, as `file:line:col: message`.
fn operator_errors(dir: &TempDir, tenants: Vec<TenantPolicy>, gateway: &str) -> Vec<String> {
    build(&policy_with_operator(dir, tenants, gateway))
        .unwrap_err()
        .iter()
        .map(PolicyError::to_string)
        .collect()
}

#[test]
fn no_tenant_may_use_the_operators_issuer() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    let lines = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n";
    let gateway = format!(
        "listen = \"127.0.0.1:8080\"\n\n[[operator.issuers]]\nissuer = \"https://ops/\"\n\
         audience = [\"admin\"]\n{lines}"
    );
    let errors = operator_errors(
        &dir,
        vec![tenant("a", &tenant_toml("a", "https://ops/", lines))],
        &gateway,
    );
    assert_eq!(
        errors,
        [
            "tenants/a.toml:4:10: tenant `a` has issuer `https://ops/`, which the operator \
             (gateway.toml:4:10) already uses; every tenant and the operator need issuers of \
             their own (the issuer picks whose keys verify a token, so a shared one would let one \
             principal's identity provider speak for the other)"
        ]
    );
}

#[test]
fn operator_issuers_are_checked_like_tenants_and_keep_their_own_tokens() {
    let dir = TempDir::new();
    let ops = Signer::ed25519(&dir, "ops");
    let tenant_signer = Signer::ed25519(&dir, "ed");
    let lines = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n";
    // An empty audience list is reported inside the operator's table.
    let broken = "[[operator.issuers]]\nissuer = \"https://ops/\"\naudience = []\n\
                  algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ops.pub.pem\"]\n";
    assert_eq!(
        operator_errors(&dir, vec![], broken),
        ["gateway.toml:3:1: `audience` must name at least one audience"]
    );

    let gateway = "[[operator.issuers]]\nissuer = \"https://ops/\"\naudience = [\"admin\"]\n\
                   algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ops.pub.pem\"]\n";
    let verifiers = build(&policy_with_operator(
        &dir,
        vec![tenant("a", &tenant_toml("a", "https://a/", lines))],
        gateway,
    ))
    .unwrap();
    let now = at(NOW);
    let claims = |iss: &str, aud: &str| {
        json!({"iss": iss, "aud": aud, "sub": "x", "iat": NOW, "exp": NOW + 60,
               "scope": "admin inference plugins:write models:read audit:read"})
    };
    // The operator's token: operator scopes only, and no tenant route takes it.
    let operator = ops.sign(&claims("https://ops/", "admin"));
    let id = verifiers.verify_operator(&operator, now).unwrap();
    assert_eq!(id.scopes.to_string(), "models:read audit:read");
    assert_eq!(id.issuer, "https://ops/");
    assert_eq!(
        verifiers.verify(&operator, now),
        Err(crate::auth::AuthError::UnknownIssuer)
    );
    // The tenant's token claiming operator scopes: tenant scopes only, and
    // no operator route takes it.
    let forged = tenant_signer.sign(&claims("https://a/", "bulkhead"));
    let id = verifiers.verify(&forged, now).unwrap();
    assert_eq!(id.scopes.to_string(), "inference plugins:write");
    assert_eq!(
        verifiers.verify_operator(&forged, now),
        Err(crate::auth::AuthError::NotOperatorIssuer)
    );
    // Signed by the tenant's key in the operator's name: a bad signature.
    let impostor = tenant_signer.sign(&claims("https://ops/", "admin"));
    assert_eq!(
        verifiers.verify_operator(&impostor, now),
        Err(crate::auth::AuthError::BadSignature)
    );
    // Without any operator issuer, nothing is an operator.
    let none = build(&policy(&dir, vec![])).unwrap();
    assert_eq!(
        none.verify_operator(&operator, now),
        Err(crate::auth::AuthError::NoOperatorIssuer)
    );
}

#[test]
fn tenants_may_not_share_an_hmac_secret() {
    let dir = TempDir::new();
    Signer::hs256(&dir, "hs");
    let lines = "algorithms = [\"HS256\"]\nhs_secret_file = \"keys/hs.secret\"\n";
    let errors = build_errors(
        &dir,
        vec![
            tenant("a", &tenant_toml("a", "https://a/", lines)),
            tenant("b", &tenant_toml("b", "https://b/", lines)),
        ],
    );
    assert_eq!(
        errors,
        [
            "tenants/b.toml:7:18: tenant `b` uses the same HMAC secret as tenant `a` \
             (tenants/a.toml:4:10); either could mint the other's tokens"
        ]
    );
}

#[test]
fn algorithm_names_are_checked() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    assert_eq!(
        errors_for(
            &dir,
            "algorithms = [\"none\", \"EdDSA\", \"RS257\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n"
        ),
        [
            "tenants/t.toml:6:15: algorithm `none` is never allowed: it would accept unsigned tokens",
            "tenants/t.toml:6:32: unknown algorithm `RS257` (known: RS256, RS384, RS512, PS256, \
             PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512)",
        ]
    );
    assert_eq!(
        errors_for(
            &dir,
            "algorithms = [\"EdDSA\", \"ES256\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n"
        ),
        [
            "tenants/t.toml:6:24: no key can verify ES256 tokens: add a P-256 key to `public_keys` \
          or `jwks`"
        ]
    );
}

#[test]
fn empty_fields_are_errors_and_all_errors_are_reported() {
    let dir = TempDir::new();
    let text = "id = \"t\"\n[jwt]\nissuer = \" \"\naudience = []\nalgorithms = []\n\
                public_keys = [\"keys/a.pem\", \"keys/b.pem\"]\n";
    let errors = build_errors(&dir, vec![tenant("t", text)]);
    assert_eq!(errors.len(), 5, "{errors:#?}");
    assert_eq!(errors[0], "tenants/t.toml:3:10: `issuer` must not be empty");
    assert_eq!(
        errors[1],
        "tenants/t.toml:4:1: `audience` must name at least one audience"
    );
    assert_eq!(
        errors[2],
        "tenants/t.toml:5:1: `algorithms` must allow at least one algorithm"
    );
    assert!(errors[3].starts_with("tenants/t.toml:6:16: public key `keys/a.pem`: cannot read"));
    assert!(errors[4].starts_with("tenants/t.toml:6:30: public key `keys/b.pem`: cannot read"));
}

#[test]
fn jwks_problems_are_reported_per_key() {
    let dir = TempDir::new();
    let errors_with = |jwks: &str| {
        dir.write("keys/set.json", jwks);
        errors_for(&dir, "algorithms = [\"EdDSA\"]\njwks = \"keys/set.json\"\n")
    };
    let ed_public = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng).verifying_key();
    let ed = json!({ "kty": "OKP", "crv": "Ed25519", "kid": "a", "x": b64(ed_public.as_bytes()) });
    let p256_point = p256::SecretKey::random(&mut rand_core::OsRng)
        .public_key()
        .to_encoded_point(false);
    let (x, y) = (b64(p256_point.x().unwrap()), b64(p256_point.y().unwrap()));
    let errors = errors_with(
        &json!({ "keys": [
            { "kty": "oct", "k": "c2VjcmV0" },
            ed,
            ed,
            { "kty": "OKP", "crv": "Ed448", "x": "AA" },
            { "kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB" },
            { "kty": "OKP", "crv": "Ed25519", "x": b64(ed_public.as_bytes()), "d": "AA" },
            { "kty": "EC", "crv": "P-256", "alg": "RS256", "x": x, "y": y },
            { "kty": "RSA", "use": "enc", "n": "AQAB", "e": "AQAB" },
        ]})
        .to_string(),
    );
    let prefix = "tenants/t.toml:7:8: JWKS `keys/set.json`: ";
    let reasons: Vec<&str> = errors
        .iter()
        .map(|e| e.strip_prefix(prefix).unwrap())
        .collect();
    assert_eq!(
        reasons,
        [
            "key 0: symmetric (`oct`) keys are not accepted in a JWKS; use `hs_secret_file`",
            "key 2 (kid `a`): another key has the same kid",
            "key 3: unsupported curve `Ed448`",
            "key 4 (kid `r`): RSA key is 17 bits; 2048 to 8192 are accepted",
            "key 5: it holds private key material (`d`); publish public keys only",
            "key 6: `alg` RS256 does not fit a P-256 key",
        ]
    );

    let many: Vec<Value> = (0..33).map(|_| json!({ "kty": "OKP" })).collect();
    assert_eq!(
        errors_with(&json!({ "keys": many }).to_string()),
        [format!("{prefix}it has 33 keys; at most 32 are accepted")]
    );
    let huge = format!("{{\"keys\": [], \"pad\": \"{}\"}}", "x".repeat(1 << 20));
    assert_eq!(
        errors_with(&huge),
        [format!("{prefix}it is larger than 1048576 bytes")]
    );
    let errors = errors_with("{\"keys\": 5}");
    assert!(
        errors[0].starts_with(&format!("{prefix}it is not a JWKS")),
        "{errors:?}"
    );
}

#[test]
fn a_token_lifetime_limit_is_at_most_a_year() {
    let dir = TempDir::new();
    let signer = Signer::ed25519(&dir, "ed");
    let lines = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n";
    assert_eq!(
        errors_for(&dir, &format!("{lines}max_lifetime_s = 99999999\n")),
        [
            "tenants/t.toml:8:18: `max_lifetime_s` is 99999999; at most 31536000 (a year), or \
             0 for no limit"
        ]
    );
    // 0 turns the limit off: `exp` alone bounds the token.
    let policy = policy(
        &dir,
        vec![tenant(
            "t",
            &tenant_toml("t", "https://t/", &format!("{lines}max_lifetime_s = 0\n")),
        )],
    );
    let verifiers = build(&policy).unwrap();
    let long = signer.sign(&claims_with(
        "https://t/",
        json!({ "iat": null, "exp": NOW + 10 * 86_400 }),
    ));
    assert!(verifiers.verify(&long, at(NOW)).is_ok());
}

/// Verifiers for tenant `t` with these `[jwt]` lines.
fn verifiers_for(dir: &TempDir, jwt_lines: &str) -> Verifiers {
    let tenants = vec![tenant("t", &tenant_toml("t", "https://t/", jwt_lines))];
    build(&policy(dir, tenants)).unwrap()
}

#[test]
fn narrowing_a_tenants_verification_is_told_from_widening_it() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "a");
    Signer::ed25519(&dir, "b");
    let both = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/a.pub.pem\", \"keys/b.pub.pem\"]\n";
    let old = verifiers_for(&dir, both);
    assert_eq!(old.narrows(&old, "t"), Ok(()));
    // Dropping a key, or a shorter lifetime, narrows.
    let one = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/a.pub.pem\"]\n";
    assert_eq!(verifiers_for(&dir, one).narrows(&old, "t"), Ok(()));
    let short = format!("{one}max_lifetime_s = 60\n");
    assert_eq!(verifiers_for(&dir, &short).narrows(&old, "t"), Ok(()));
    // A key file whose bytes changed under the same path does not.
    Signer::ed25519(&dir, "a");
    assert_eq!(
        verifiers_for(&dir, one).narrows(&old, "t"),
        Err("tenant `t`: a key was added or changed".to_string())
    );
    let unlimited = format!("{both}max_lifetime_s = 0\n");
    let old = verifiers_for(&dir, both);
    assert_eq!(
        verifiers_for(&dir, &unlimited).narrows(&old, "t"),
        Err("tenant `t`: its tokens may live longer".to_string())
    );
}
