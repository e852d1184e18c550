//! The settings without a database: URLs, the environment, the files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokio_postgres::config::Host;

use super::*;

/// A CA certificate (self-signed, P-256), only parsed here.
const TEST_CA_PEM: &str = "-----BEGIN CERTIFICATE-----
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

/// A folder of its own under the system temp folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let name = format!(
            "bulkhead-state-test-{}-{}",
            std::process::id(),
            crate::testing::unique_suffix()
        );
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn resolve(settings: &PgSettings) -> Result<Resolved, StateError> {
    settings.resolve_with(&no_env)
}

fn resolve_url(url: &str) -> Result<Resolved, StateError> {
    resolve(&PgSettings::new(url))
}

fn resolve_env(url: &str, env: &[(&str, &str)]) -> Result<Resolved, StateError> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    PgSettings::new(url).resolve_with(&|name| env.get(name).cloned())
}

/// The key and message of a config error (panics on anything else).
fn config_error(result: Result<Resolved, StateError>) -> (&'static str, String) {
    match result {
        Err(StateError::Config { key, why }) => (key, why),
        other => panic!("expected a config error, got {other:?}"),
    }
}

fn tcp_hosts(resolved: &Resolved) -> Vec<String> {
    resolved
        .config
        .get_hosts()
        .iter()
        .map(|host| match host {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect()
}

#[test]
fn a_good_url_resolves_with_defaults() {
    let resolved = resolve_url("postgres://bulkhead@db.internal:6543/control").expect("valid");
    assert_eq!(tcp_hosts(&resolved), ["db.internal"]);
    assert_eq!(resolved.config.get_ports(), [6543]);
    assert_eq!(resolved.config.get_user(), Some("bulkhead"));
    assert_eq!(resolved.config.get_dbname(), Some("control"));
    assert_eq!(resolved.config.get_password(), None);
    assert_eq!(resolved.config.get_application_name(), Some("bulkhead"));
    assert_eq!(resolved.ssl_mode, SslMode::Prefer);
    assert_eq!(resolved.schema, DEFAULT_SCHEMA);
    assert_eq!(resolved.target, "db.internal:6543");
    assert_eq!(resolved.pool_size, 8);
    assert_eq!(resolved.connect_timeout, Duration::from_millis(5000));

    let session = resolved.session_config(1234);
    assert_eq!(
        session.get_options(),
        Some("-c search_path=bulkhead -c statement_timeout=1234")
    );
    assert_eq!(
        session.get_ssl_mode(),
        tokio_postgres::config::SslMode::Prefer
    );
}

#[test]
fn postgresql_scheme_options_and_several_hosts() {
    let resolved =
        resolve_url("postgresql://u@a:1,b:2/db?options=-c%20work_mem%3D4MB&application_name=mine")
            .expect("valid");
    assert_eq!(resolved.target, "a:1,b:2");
    assert_eq!(resolved.config.get_application_name(), Some("mine"));
    assert_eq!(
        resolved.session_config(10).get_options(),
        Some("-c work_mem=4MB -c search_path=bulkhead -c statement_timeout=10"),
        "ours come after the URL's, so they win"
    );
    assert_eq!(
        resolve_url("postgres://u@[::1]:5433/db")
            .expect("v6")
            .target,
        "[::1]:5433"
    );
}

#[test]
fn sslmode_is_read_before_tokio_postgres_sees_the_url() {
    for (text, mode, wire) in [
        (
            "disable",
            SslMode::Disable,
            tokio_postgres::config::SslMode::Disable,
        ),
        (
            "prefer",
            SslMode::Prefer,
            tokio_postgres::config::SslMode::Prefer,
        ),
        (
            "require",
            SslMode::Require,
            tokio_postgres::config::SslMode::Require,
        ),
        (
            "verify-full",
            SslMode::VerifyFull,
            tokio_postgres::config::SslMode::Require,
        ),
    ] {
        let url = format!("postgres://u@h/db?application_name=x&sslmode={text}");
        let resolved = match resolve_url(&url) {
            Ok(resolved) => resolved,
            // verify-full with no system roots on this machine is a clear
            // error naming `tls_ca`; the mode itself parsed.
            Err(StateError::Config { key: "tls_ca", .. }) if mode == SslMode::VerifyFull => {
                continue;
            }
            Err(e) => panic!("{text}: {e}"),
        };
        assert_eq!(resolved.ssl_mode, mode, "{text}");
        assert_eq!(resolved.session_config(1).get_ssl_mode(), wire, "{text}");
        assert_eq!(resolved.config.get_application_name(), Some("x"));
    }
}

#[test]
fn unsupported_sslmodes_are_refused_with_the_alternative() {
    for (mode, hint) in [
        ("verify-ca", "use verify-full"),
        ("allow", "use prefer"),
        ("bogus", "not one of disable, prefer, require, verify-full"),
        ("", "not one of"),
    ] {
        let (key, why) = config_error(resolve_url(&format!("postgres://u@h/db?sslmode={mode}")));
        assert_eq!(key, "url");
        assert!(why.contains(hint), "{mode}: {why}");
    }
    let (_, why) = config_error(resolve_url(
        "postgres://u@h/db?sslmode=require&sslmode=disable",
    ));
    assert!(why.contains("twice"), "{why}");
}

#[test]
fn a_password_in_the_url_is_refused_without_showing_it() {
    for url in [
        "postgres://u:hunter2@h/db",
        "postgresql://u:hunter2@h:5432/db?sslmode=require",
        "postgres://u@h/db?password=hunter2",
    ] {
        let (key, why) = config_error(resolve_url(url));
        assert_eq!(key, "url");
        assert!(why.contains("password_file"), "{why}");
        assert!(!why.contains("hunter2"), "{why}");
        let settings = PgSettings::new(url);
        let debug = format!("{settings:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(debug.contains("***"), "{debug}");
    }
}

#[test]
fn other_bad_urls_name_the_problem() {
    for (url, hint) in [
        ("mysql://u@h/db", "not a PostgreSQL URL"),
        ("host=h user=u", "not a PostgreSQL URL"),
        ("postgres://u@h:notaport/db", "not a valid PostgreSQL URL"),
        ("postgres://u@h/db?connect_timeout=3", "connect_timeout_ms"),
        ("postgres://u@h/db?nonsense=1", "not a valid PostgreSQL URL"),
        ("postgres://u@/db", "names no host"),
        ("postgres://h/db", "names no user"),
        ("postgres://u@a:1,b:2/db?port=3", "2 host(s) and 3 ports"),
    ] {
        let (key, why) = config_error(resolve_url(url));
        assert_eq!(key, "url", "{url}");
        assert!(why.contains(hint), "{url}: {why}");
    }
}

#[test]
fn the_environment_fills_only_what_the_url_leaves_out() {
    let env = [
        ("PGHOST", "envhost"),
        ("PGPORT", "7777"),
        ("PGUSER", "envuser"),
        ("PGDATABASE", "envdb"),
        ("PGPASSWORD", "envpass"),
    ];
    let resolved = resolve_env("postgres:///", &env).expect("from env");
    assert_eq!(resolved.target, "envhost:7777");
    assert_eq!(resolved.config.get_user(), Some("envuser"));
    assert_eq!(resolved.config.get_dbname(), Some("envdb"));
    assert_eq!(resolved.config.get_password(), Some(&b"envpass"[..]));

    let resolved = resolve_env("postgres://u@h/db", &env).expect("url wins");
    // A URL host without a port means 5432, not PGPORT.
    assert_eq!(resolved.target, "h:5432");
    assert_eq!(resolved.config.get_user(), Some("u"));
    assert_eq!(resolved.config.get_dbname(), Some("db"));

    // No database anywhere: the user's name, as PostgreSQL does.
    let resolved = resolve_env("postgres://u@h", &[]).expect("valid");
    assert_eq!(resolved.config.get_dbname(), Some("u"));
    // Empty variables count as unset.
    let (key, _) = config_error(resolve_env(
        "postgres:///db",
        &[("PGHOST", ""), ("PGUSER", "u")],
    ));
    assert_eq!(key, "url");
    let (key, why) = config_error(resolve_env(
        "postgres:///db",
        &[("PGHOST", "h"), ("PGUSER", "u"), ("PGPORT", "http")],
    ));
    assert_eq!(key, "PGPORT");
    assert!(why.contains("`http` is not a port"), "{why}");
}

#[test]
fn the_password_file_wins_over_pgpassword_and_loses_one_newline() {
    let dir = TempDir::new();
    let mut settings = PgSettings::new("postgres://u@h/db");
    for (contents, expected) in [
        (&b"s3cret\n"[..], &b"s3cret"[..]),
        (b"s3cret\r\n", b"s3cret"),
        (b"s3cret", b"s3cret"),
        (b" spaced ", b" spaced "),
    ] {
        settings.password_file = Some(dir.file("password", contents));
        let resolved = settings
            .resolve_with(&|name| (name == "PGPASSWORD").then(|| "env".to_string()))
            .expect("valid");
        assert_eq!(resolved.config.get_password(), Some(expected));
        let debug = format!("{resolved:?} {settings:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("spaced"),
            "{debug}"
        );
        assert!(debug.contains("<redacted>"), "{debug}");
    }
}

#[test]
fn bad_password_files_are_refused() {
    let dir = TempDir::new();
    let cases: [(PathBuf, &str); 6] = [
        (dir.file("empty", b""), "is empty"),
        (dir.file("newline", b"\n"), "is empty"),
        (
            dir.file("two-lines", b"user\npassword\n"),
            "more than one line",
        ),
        (
            dir.file("two-newlines", b"password\n\n"),
            "more than one line",
        ),
        (dir.file("big", &[b'x'; 4097]), "larger than 4096 bytes"),
        (dir.0.join("missing"), "cannot be read"),
    ];
    for (path, hint) in cases.iter().chain([&(dir.0.clone(), "not a regular file")]) {
        let mut settings = PgSettings::new("postgres://u@h/db");
        settings.password_file = Some(path.clone());
        let (key, why) = config_error(resolve(&settings));
        assert_eq!(key, "password_file");
        assert!(why.contains(hint), "{}: {why}", path.display());
        assert!(why.contains(&path.display().to_string()), "{why}");
        assert!(!why.contains("password\n"), "{why}");
    }
}

#[test]
fn tls_ca_goes_with_verify_full_only() {
    let dir = TempDir::new();
    let ca = dir.file("ca.pem", TEST_CA_PEM.as_bytes());
    let mut settings = PgSettings::new("postgres://u@h/db?sslmode=verify-full");
    settings.tls_ca = Some(ca.clone());
    let resolved = resolve(&settings).expect("verify-full with a CA");
    assert_eq!(resolved.ssl_mode, SslMode::VerifyFull);

    settings.url = "postgres://u@h/db?sslmode=require".to_string();
    let (key, why) = config_error(resolve(&settings));
    assert_eq!(key, "tls_ca");
    assert!(why.contains("sslmode=require"), "{why}");

    settings.url = "postgres://u@h/db?sslmode=verify-full".to_string();
    for (path, hint) in [
        (
            dir.file("garbage.pem", b"not a certificate"),
            "no PEM certificate",
        ),
        (dir.0.join("missing.pem"), "cannot be read"),
    ] {
        settings.tls_ca = Some(path);
        let (key, why) = config_error(resolve(&settings));
        assert_eq!(key, "tls_ca");
        assert!(why.contains(hint), "{why}");
    }
}

#[test]
fn schema_names_are_checked() {
    for good in ["bulkhead", "_x", "a1_b2", &"s".repeat(63)] {
        let mut settings = PgSettings::new("postgres://u@h/db");
        settings.schema = good.to_string();
        let resolved = resolve(&settings).unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(resolved.schema, good);
    }
    for (bad, hint) in [
        ("", "1 to 63"),
        ("Bulkhead", "1 to 63"),
        ("1abc", "not starting with a digit"),
        ("a-b", "1 to 63"),
        ("a b", "1 to 63"),
        ("x;drop", "1 to 63"),
        (&"s".repeat(64), "1 to 63"),
        ("pg_state", "reserved"),
        ("information_schema", "reserved"),
    ] {
        let mut settings = PgSettings::new("postgres://u@h/db");
        settings.schema = bad.to_string();
        let (key, why) = config_error(resolve(&settings));
        assert_eq!(key, "schema", "{bad}");
        assert!(why.contains(hint), "{bad}: {why}");
    }
}

#[test]
fn numbers_out_of_range_are_refused() {
    type Set = fn(&mut PgSettings);
    let cases: [(&str, Set); 5] = [
        ("pool_size", |s| s.pool_size = 0),
        ("pool_size", |s| s.pool_size = 10_000),
        ("connect_timeout_ms", |s| s.connect_timeout_ms = 0),
        ("statement_timeout_ms", |s| s.statement_timeout_ms = 0),
        ("statement_timeout_ms", |s| {
            s.statement_timeout_ms = u64::MAX
        }),
    ];
    for (expected, set) in cases {
        let mut settings = PgSettings::new("postgres://u@h/db");
        set(&mut settings);
        let (key, why) = config_error(resolve(&settings));
        assert_eq!(key, expected);
        assert!(why.contains("it must be from"), "{why}");
    }
}

#[test]
fn settings_read_from_toml_take_defaults_and_refuse_unknown_keys() {
    let settings: PgSettings =
        toml::from_str("url = \"postgres://u@h/db\"\npassword_file = \"secrets/pg\"\n")
            .expect("valid toml");
    assert_eq!(
        settings.password_file.as_deref(),
        Some(Path::new("secrets/pg"))
    );
    assert_eq!(
        settings,
        PgSettings {
            password_file: Some("secrets/pg".into()),
            ..PgSettings::new("postgres://u@h/db")
        }
    );
    let error = toml::from_str::<PgSettings>("url = \"postgres://u@h/db\"\npassword = \"x\"\n")
        .expect_err("unknown key");
    assert!(
        error.to_string().contains("unknown field `password`"),
        "{error}"
    );
}
