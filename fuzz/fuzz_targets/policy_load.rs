//! Fuzzes the policy folder parser and checks (`policy::check`, which runs
//! `policy::load` and builds the JWT verifiers). The input is split on 0xFF
//! into the files below, written into one per-process temp folder that is
//! reused; a file whose part is empty or missing is removed:
//!
//! `tenants/x.toml`, `gateway.toml`, `classes/standard.toml`,
//! `tenants/y.toml`, `keys/x.jwks.json`, `keys/x.pub.pem`, `keys/x.secret`.
//!
//! Never a panic; every error renders and points into a file that exists (or
//! the folder); an accepted policy keeps the limits validation promises.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use bulkhead_gateway::policy::{self, Policy, PolicyErrors};
use libfuzzer_sys::fuzz_target;

const SEPARATOR: u8 = 0xFF;
const FILES: [&str; 7] = [
    "tenants/x.toml",
    "gateway.toml",
    "classes/standard.toml",
    "tenants/y.toml",
    "keys/x.jwks.json",
    "keys/x.pub.pem",
    "keys/x.secret",
];

fn folder() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // tmpfs where there is one: rewriting files on a disk (ext4 flushes a
        // truncated file's data) made the target several times slower.
        let shm = Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = tmp.join(format!("bulkhead-fuzz-policy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["tenants", "classes", "keys"] {
            std::fs::create_dir_all(dir.join(sub)).expect("create the fuzz policy folder");
        }
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = folder();
    let mut parts = data.split(|b| *b == SEPARATOR);
    let mut written = Vec::new();
    for name in FILES {
        let path = dir.join(name);
        match parts.next() {
            Some(bytes) if !bytes.is_empty() => {
                std::fs::write(&path, bytes).expect("write a fuzz policy file");
                written.push((name, bytes));
            }
            _ => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => panic!("remove {name}: {e}"),
            },
        }
    }
    match policy::check(dir) {
        Ok(policy) => check_accepted(&policy, &written),
        Err(errors) => check_errors(&errors, dir, &written),
    }
});

fn check_errors(errors: &PolicyErrors, dir: &Path, written: &[(&str, &[u8])]) {
    assert!(!errors.0.is_empty(), "an error with no errors in it");
    assert!(!errors.to_string().is_empty());
    let _ = errors.in_dir(dir).to_string();
    for error in &errors.0 {
        assert!(!error.message.is_empty(), "{error:?}");
        assert!(error.line >= 1 && error.col >= 1, "{error}");
        let file = error.file.to_str().expect("error files are UTF-8");
        if file == "." || file == "tenants" || file == "classes" {
            continue;
        }
        let Some((_, bytes)) = written.iter().find(|(name, _)| *name == file) else {
            // gateway.toml errors come from defaults when it is absent; key
            // files are reported at the tenant field that names them.
            assert_eq!(
                file, "gateway.toml",
                "error in a file never written: {error}"
            );
            continue;
        };
        let text = String::from_utf8_lossy(bytes);
        let lines = text.split('\n').count();
        assert!(error.line <= lines, "{error} past the end ({lines} lines)");
    }
}

fn check_accepted(policy: &Policy, written: &[(&str, &[u8])]) {
    let gateway = &policy.gateway;
    assert!(gateway.max_body_bytes >= 1);
    assert!(gateway.request_timeout >= Duration::from_millis(1));
    assert!(gateway.jwt_leeway <= Duration::from_secs(300));
    for (id, tenant) in &policy.tenants {
        assert_eq!(id, &tenant.id);
        assert!(
            written
                .iter()
                .any(|(name, _)| *name == format!("tenants/{id}.toml")),
            "tenant `{id}` from no tenant file"
        );
        let limits = &tenant.limits;
        assert!(limits.requests_per_s >= 1 && limits.burst >= 1);
        assert!(limits.tokens_per_min >= 1 && limits.max_concurrent >= 1);
        assert!(limits.max_tokens >= 1);
        assert!((1..=gateway.max_body_bytes).contains(&limits.max_body_bytes));
        assert!(!tenant.jwt.issuer.get_ref().trim().is_empty());
    }
    assert!(policy.files.len() <= written.len());
}
