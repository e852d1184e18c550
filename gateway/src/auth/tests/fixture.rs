//! The tenants most verification tests run against: one per algorithm,
//! a second EdDSA tenant, an RS256+HS256 tenant and a JWKS tenant.

use jsonwebtoken::jwk::Jwk;

use super::*;
use crate::auth::{AuthError, Identity, Scopes};

pub(super) const ED_ISS: &str = "https://ed.example/";
pub(super) const ED2_ISS: &str = "https://ed2.example/";
pub(super) const ES_ISS: &str = "https://es.example/";
pub(super) const RS_ISS: &str = "https://rs.example/";
pub(super) const HS_ISS: &str = "https://hs.example/";
pub(super) const MIX_ISS: &str = "https://mix.example/";
pub(super) const JW_ISS: &str = "https://jwks.example/";

/// One tenant per algorithm, plus a second EdDSA tenant, an RS256+HS256
/// tenant and a JWKS tenant.
pub(super) struct Fixture {
    pub verifiers: Verifiers,
    pub ed: Signer,
    pub ed2: Signer,
    pub es: Signer,
    pub rs: Signer,
    pub hs: Signer,
}

pub(super) fn fixture() -> Fixture {
    let dir = TempDir::new();
    let (ed, ed2) = (Signer::ed25519(&dir, "ed"), Signer::ed25519(&dir, "ed2"));
    let (es, rs) = (Signer::p256(&dir, "es"), Signer::rsa(&dir, "rs"));
    let (hs, _mix) = (Signer::hs256(&dir, "hs"), Signer::hs256(&dir, "mix"));
    let jwks = json!({ "keys": [
        jwk(&ed.key, Algorithm::EdDSA, "ed-1"),
        jwk(&es.key, Algorithm::ES256, "es-1"),
        jwk(&rs.key, Algorithm::RS256, "rs-1"),
    ]});
    dir.write("keys/jw.jwks.json", jwks.to_string());
    let pem = |name: &str, alg: &str| {
        format!("algorithms = [\"{alg}\"]\npublic_keys = [\"keys/{name}.pub.pem\"]\n")
    };
    let tenants = vec![
        tenant("ed", &tenant_toml("ed", ED_ISS, &pem("ed", "EdDSA"))),
        tenant("ed2", &tenant_toml("ed2", ED2_ISS, &pem("ed2", "EdDSA"))),
        tenant("es", &tenant_toml("es", ES_ISS, &pem("es", "ES256"))),
        tenant("rs", &tenant_toml("rs", RS_ISS, &pem("rs", "RS256"))),
        tenant(
            "hs",
            &tenant_toml(
                "hs",
                HS_ISS,
                "algorithms = [\"HS256\"]\nhs_secret_file = \"keys/hs.secret\"\n",
            ),
        ),
        tenant(
            "mix",
            &tenant_toml(
                "mix",
                MIX_ISS,
                "algorithms = [\"RS256\", \"HS256\"]\npublic_keys = [\"keys/rs.pub.pem\"]\n\
                 hs_secret_file = \"keys/mix.secret\"\n",
            ),
        ),
        tenant(
            "jw",
            &tenant_toml(
                "jw",
                JW_ISS,
                "algorithms = [\"EdDSA\", \"ES256\", \"RS256\"]\njwks = \"keys/jw.jwks.json\"\n",
            ),
        ),
    ];
    // Verifiers hold their keys; the files may go once they are built.
    let verifiers = build(&policy(&dir, tenants)).unwrap();
    Fixture {
        verifiers,
        ed,
        ed2,
        es,
        rs,
        hs,
    }
}

/// One fixture for the property tests, which run many cases.
pub(super) fn shared_fixture() -> &'static Fixture {
    static SHARED: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    SHARED.get_or_init(fixture)
}

/// The public JWK of a private key, with a `kid`.
fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Value {
    let mut jwk = serde_json::to_value(Jwk::from_encoding_key(key, alg).unwrap()).unwrap();
    jwk["kid"] = json!(kid);
    jwk
}

impl Fixture {
    pub(super) fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        self.verifiers.verify(token, at(NOW))
    }

    /// The error for `token`, checked to be a 401 that does not echo it.
    pub(super) fn reject(&self, token: &str) -> AuthError {
        let err = self.verify(token).unwrap_err();
        assert_eq!(err.status(), 401, "{err}");
        if token.len() > 8 {
            assert!(!err.to_string().contains(token), "{err}");
        }
        err
    }
}

pub(super) fn identity(tenant: &str, scopes: Scopes) -> Identity {
    Identity {
        tenant: tenant.to_owned(),
        sub: Some("alice".to_owned()),
        scopes,
        expires_at: NOW + 600,
    }
}
