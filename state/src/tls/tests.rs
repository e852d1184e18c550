//! TLS against the test PostgreSQL. Debian's server (the CI machine's)
//! serves its snakeoil certificate, self-signed for `localhost`; a server
//! with `ssl = off` skips these tests, saying so.

use std::path::PathBuf;

use crate::testing::TestSchema;
use crate::{Db, PgSettings};

/// `url` with `param` added to its query.
fn with_param(url: &str, param: &str) -> String {
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}{param}")
}

/// Whether the test server offers TLS, and the file of its certificate.
async fn server_tls(settings: &PgSettings) -> Option<PathBuf> {
    let db = Db::connect(settings).await.expect("connect");
    let client = db.client().await.expect("client");
    let ssl: String = client.query_one("SHOW ssl", &[]).await.expect("ssl").get(0);
    if ssl != "on" {
        eprintln!("skipped: the test PostgreSQL has ssl = off");
        return None;
    }
    let cert: String = client
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .expect("ssl_cert_file")
        .get(0);
    Some(PathBuf::from(cert))
}

/// Whether `db`'s connections are encrypted (`pg_stat_ssl`).
async fn encrypted(db: &Db) -> bool {
    db.client()
        .await
        .expect("client")
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0)
}

#[tokio::test]
async fn sslmodes_disable_prefer_and_require_against_a_tls_server() {
    let (settings, _schema) = TestSchema::new().await;
    if server_tls(&settings).await.is_none() {
        return;
    }
    for (mode, expected) in [("disable", false), ("prefer", true), ("require", true)] {
        let mut settings = settings.clone();
        settings.url = with_param(&settings.url, &format!("sslmode={mode}"));
        let db = Db::connect(&settings)
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert_eq!(encrypted(&db).await, expected, "sslmode={mode}");
    }
}

#[tokio::test]
async fn verify_full_checks_the_chain_and_the_host_name() {
    let (settings, _schema) = TestSchema::new().await;
    let Some(server_cert) = server_tls(&settings).await else {
        return;
    };
    if std::fs::metadata(&server_cert).is_err() {
        eprintln!(
            "skipped: the server's certificate {} is not readable here",
            server_cert.display()
        );
        return;
    }
    let resolved = settings.resolve().expect("valid");
    let port = resolved.target.rsplit_once(':').expect("host:port").1;
    let user = resolved.user();
    let database = resolved
        .session_config(1)
        .get_dbname()
        .unwrap_or(user)
        .to_string();
    let url =
        |host: &str| format!("postgres://{user}@{host}:{port}/{database}?sslmode=verify-full");

    // The server's own (self-signed) certificate as the CA, by its name.
    let mut trusted = settings.clone();
    trusted.url = url("localhost");
    trusted.tls_ca = Some(server_cert.clone());
    let db = Db::connect(&trusted).await.expect("verified");
    assert!(encrypted(&db).await);

    // The same certificate, but the gateway asked for another name.
    let mut wrong_name = trusted.clone();
    wrong_name.url = url("127.0.0.1");
    let error = Db::connect(&wrong_name)
        .await
        .expect_err("not valid for 127.0.0.1");
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("certificate"), "{error}");

    // A CA that did not sign it.
    let mut other_ca = trusted.clone();
    other_ca.tls_ca = Some(dir_with_other_ca());
    let error = Db::connect(&other_ca).await.expect_err("unknown issuer");
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("UnknownIssuer"), "{error}");
    let _ = std::fs::remove_file(other_ca.tls_ca.as_ref().expect("set"));
}

/// A file holding a CA certificate unrelated to the server's.
fn dir_with_other_ca() -> PathBuf {
    const OTHER_CA: &str = "-----BEGIN CERTIFICATE-----
MIIBfDCCASGgAwIBAgIUTafuh/ULr0VWwWmOXz//WqAquQAwCgYIKoZIzj0EAwIw
EjEQMA4GA1UEAwwHdGVzdC1jYTAgFw0yNjEyMDYxNzAzMjhaGA8yMTI2MTExMjE3
MDMyOFowEjEQMA4GA1UEAwwHdGVzdC1jYTBZMBMGByqGSM49AgEGCCqGSM49AwEH
A0IABNSGMVOCPYOey/KC+z5DA5d6r31TF5iZzb+Vs9+XdRju7sDf2U5cg6ssEh80
vHbQf9sKr6kwcrthu3L2IrMKzKijUzBRMB0GA1UdDgQWBBSjfmlob3+NM0VqJdJU
SmjZO0eO2jAfBgNVHSMEGDAWgBSjfmlob3+NM0VqJdJUSmjZO0eO2jAPBgNVHRMB
Af8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQDlzUmlp3g5exxOC7uJsuDYthfI
fIoPyMHY956X6HLqIQIhALws9sbJC87S5MWzgxLZa+hzDFrLX57i09YriAO0EEy6
-----END CERTIFICATE-----
";
    let path = std::env::temp_dir().join(format!(
        "bulkhead-state-other-ca-{}.pem",
        crate::testing::unique_suffix()
    ));
    std::fs::write(&path, OTHER_CA).expect("write");
    path
}
