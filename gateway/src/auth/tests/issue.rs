//! Development tokens: each key kind signs tokens the verifier accepts.

use p256::pkcs8::EncodePrivateKey;

use super::*;
use crate::auth::{
    AuthError, Identity, IssueError, IssueOptions, MAX_DEV_TOKEN_TTL, Scope, Scopes, dev_keypair,
    issue_dev_token,
};

const ISS: &str = "https://t.example/";

/// A tenant `t` verifying with `keys/{key}.pub.pem` and signing with
/// `keys/{key}.key.pem`.
fn dev_tenant(algorithms: &str, key: &str) -> TenantPolicy {
    let lines = format!(
        "algorithms = [{algorithms}]\npublic_keys = [\"keys/{key}.pub.pem\"]\n\
         dev_signing_key = \"keys/{key}.key.pem\"\n"
    );
    tenant("t", &tenant_toml("t", ISS, &lines))
}

fn options() -> IssueOptions {
    IssueOptions {
        scopes: Scopes::from(Scope::Inference).with(Scope::PluginsWrite),
        sub: Some("bob".to_owned()),
        ..IssueOptions::new(at(NOW))
    }
}

/// Issues with `options`, checks the header's `alg`, verifies at [`NOW`].
fn issue_and_verify(
    dir: &TempDir,
    t: TenantPolicy,
    options: IssueOptions,
    alg: Algorithm,
) -> Result<Identity, AuthError> {
    let token = issue_dev_token(&t.id, &t.jwt, dir.path(), options).unwrap();
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!((header.alg, header.kid), (alg, None));
    let verifiers = build(&policy(dir, vec![t])).unwrap();
    verifiers.verify(&token, at(NOW))
}

#[test]
fn each_key_kind_issues_tokens_the_tenant_accepts() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    Signer::p256(&dir, "es");
    Signer::rsa(&dir, "rs");
    dir.write(
        "keys/p384.key.pem",
        std::fs::read(testdata("p384.key.pem")).unwrap(),
    );
    dir.write(
        "keys/p384.pub.pem",
        std::fs::read(testdata("p384.pub.pem")).unwrap(),
    );
    // PKCS#8 v2, with the public key inside, as ed25519-dalek writes it.
    let v2 = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng);
    dir.write(
        "keys/v2.key.pem",
        v2.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
    );
    dir.write(
        "keys/v2.pub.pem",
        v2.verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap(),
    );

    let expected = Identity {
        tenant: "t".to_owned(),
        sub: Some("bob".to_owned()),
        scopes: Scopes::from(Scope::Inference).with(Scope::PluginsWrite),
        expires_at: NOW + 3600,
    };
    for (algorithms, key, alg) in [
        ("\"EdDSA\"", "ed", Algorithm::EdDSA),
        ("\"EdDSA\"", "v2", Algorithm::EdDSA),
        ("\"ES256\"", "es", Algorithm::ES256),
        ("\"ES384\"", "p384", Algorithm::ES384),
        ("\"RS256\"", "rs", Algorithm::RS256),
        // The first allowed algorithm the key can make.
        ("\"PS384\", \"RS256\"", "rs", Algorithm::PS384),
    ] {
        let identity = issue_and_verify(&dir, dev_tenant(algorithms, key), options(), alg);
        assert_eq!(identity, Ok(expected.clone()), "{key}");
    }
}

#[test]
fn the_hmac_secret_signs_when_there_is_no_dev_key() {
    let dir = TempDir::new();
    Signer::hs256(&dir, "hs");
    let lines = "algorithms = [\"HS384\"]\nhs_secret_file = \"keys/hs.secret\"\n";
    let t = tenant("t", &tenant_toml("t", ISS, lines));
    let identity = issue_and_verify(&dir, t, IssueOptions::new(at(NOW)), Algorithm::HS384);
    // The defaults: sub `dev`, the first audience, `inference`, one hour.
    let expected = Identity {
        tenant: "t".to_owned(),
        sub: Some("dev".to_owned()),
        scopes: Scopes::from(Scope::Inference),
        expires_at: NOW + 3600,
    };
    assert_eq!(identity, Ok(expected));
}

#[test]
fn options_reach_the_claims() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    let other_audience = IssueOptions {
        audience: Some("elsewhere".to_owned()),
        ..options()
    };
    let result = issue_and_verify(
        &dir,
        dev_tenant("\"EdDSA\"", "ed"),
        other_audience,
        Algorithm::EdDSA,
    );
    assert_eq!(result, Err(AuthError::WrongAudience));

    let longest = IssueOptions {
        ttl: MAX_DEV_TOKEN_TTL,
        ..options()
    };
    // (A tenant that allows tokens that long: the default is a day.)
    let unlimited = tenant(
        "t",
        &tenant_toml(
            "t",
            ISS,
            "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n\
             dev_signing_key = \"keys/ed.key.pem\"\nmax_lifetime_s = 0\n",
        ),
    );
    let identity = issue_and_verify(&dir, unlimited, longest.clone(), Algorithm::EdDSA);
    assert_eq!(identity.unwrap().expires_at, NOW + 30 * 24 * 3600);
    let refused = issue_and_verify(
        &dir,
        dev_tenant("\"EdDSA\"", "ed"),
        longest,
        Algorithm::EdDSA,
    );
    assert!(
        matches!(refused, Err(AuthError::LifetimeTooLong { .. })),
        "{refused:?}"
    );

    for ttl in [Duration::ZERO, MAX_DEV_TOKEN_TTL + Duration::from_secs(1)] {
        let t = dev_tenant("\"EdDSA\"", "ed");
        let err = issue_dev_token(&t.id, &t.jwt, dir.path(), IssueOptions { ttl, ..options() });
        assert!(matches!(err, Err(IssueError::Ttl)), "{ttl:?}");
    }
}

#[test]
fn missing_or_unusable_keys_are_explained() {
    let dir = TempDir::new();
    Signer::ed25519(&dir, "ed");
    let message = |t: TenantPolicy| {
        issue_dev_token(&t.id, &t.jwt, dir.path(), options())
            .unwrap_err()
            .to_string()
    };

    let no_key = "algorithms = [\"EdDSA\"]\npublic_keys = [\"keys/ed.pub.pem\"]\n";
    assert_eq!(
        message(tenant("t", &tenant_toml("t", ISS, no_key))),
        "tenant `t` has neither `dev_signing_key` nor `hs_secret_file`, so there is nothing to \
         sign its tokens with"
    );
    assert_eq!(
        message(dev_tenant("\"ES256\"", "ed")),
        "tenant `t` allows none of the algorithms an Ed25519 key can sign"
    );
    // A tenant token never carries an operator scope, however asked.
    let t = dev_tenant("\"EdDSA\"", "ed");
    let err = issue_dev_token(
        &t.id,
        &t.jwt,
        dir.path(),
        IssueOptions {
            scopes: Scopes::from(Scope::AuditRead),
            ..options()
        },
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "audit:read is not a scope tenant tokens carry"
    );
    assert_eq!(
        message(dev_tenant("\"EdDSA\"", "missing")),
        "dev_signing_key `keys/missing.key.pem`: cannot read it: No such file or directory \
         (os error 2)"
    );
    dir.write(
        "keys/pub.key.pem",
        std::fs::read(dir.path().join("keys/ed.pub.pem")).unwrap(),
    );
    assert_eq!(
        message(dev_tenant("\"EdDSA\"", "pub")),
        "dev_signing_key `keys/pub.key.pem`: expected a `PRIVATE KEY` PEM, found `PUBLIC KEY`"
    );
}

#[test]
fn generated_key_pairs_are_pem_and_debug_hides_the_private_half() {
    let pair = dev_keypair().unwrap();
    assert!(
        pair.private_pem
            .starts_with("-----BEGIN PRIVATE KEY-----\n")
    );
    assert!(pair.public_pem.starts_with("-----BEGIN PUBLIC KEY-----\n"));
    let debug = format!("{pair:?}");
    assert!(
        debug.contains("[redacted]") && !debug.contains("PRIVATE"),
        "{debug}"
    );
    assert_ne!(dev_keypair().unwrap().public_pem, pair.public_pem);
}

#[test]
fn the_committed_demo_keys_are_a_pair() {
    let dir = TempDir::new();
    let keys = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/dev-keys");
    let lines = format!(
        "algorithms = [\"EdDSA\"]\npublic_keys = [\"{}\"]\ndev_signing_key = \"{}\"\n",
        keys.join("demo.pub.pem").display(),
        keys.join("demo.key.pem").display(),
    );
    let demo = tenant("demo", &tenant_toml("demo", ISS, &lines));
    let identity = issue_and_verify(&dir, demo, options(), Algorithm::EdDSA);
    assert_eq!(identity.unwrap().tenant, "demo");
}
