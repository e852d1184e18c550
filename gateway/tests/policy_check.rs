//! `bulkhead policy check DIR`, run as operators run it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn policy_check(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bulkhead"))
        .args(["policy", "check"])
        .arg(dir)
        .output()
        .expect("run bulkhead")
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("UTF-8 output")
}

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!(
            "bulkhead-policy-check-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    fn write(&self, name: &str, text: &str) {
        let path = self.0.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_default_policies_pass_with_a_summary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let out = policy_check(&dir);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(
        text(&out.stdout),
        format!(
            "{}/ is valid: 1 tenant, 1 class, 1 model, 1 operator issuer\n",
            dir.display()
        )
    );
    assert!(out.status.success());
}

#[test]
fn every_error_is_printed_with_a_path_editors_can_open() {
    let scratch = Scratch::new("errors");
    scratch.write("gateway.toml", "listen = \"nowhere\"\n");
    scratch.write(
        "tenants/acme.toml",
        "id = \"acme\"\nclass = \"gold\"\n\n[jwt]\nissuer = \"i\"\naudience = []\nalgorithms = []\n",
    );
    scratch.write("tenants/beta.toml", "id = \"beta\"\nrps = 5\n");
    let dir = scratch.0.display();
    let out = policy_check(&scratch.0);
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!(
            "{dir}/gateway.toml:1:10: `nowhere` is not a listen address: expected IP:PORT, e.g. 127.0.0.1:8080\n\
             {dir}/tenants/acme.toml:2:9: class `gold` does not exist; there are no classes/*.toml files\n\
             {dir}/tenants/beta.toml:2:1: unknown field `rps`, expected one of `id`, `class`, `models`, `jwt`, `limits`, `plugins`, `gpu`, `prompts`, `telemetry`\n\
             {dir}/ is invalid: 3 errors\n"
        )
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn an_issuer_shared_by_the_operator_and_a_tenant_is_refused_at_both_places() {
    let scratch = Scratch::new("issuers");
    let keys = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/dev-keys");
    let jwt = |issuer: &str, key: &str| {
        format!(
            "issuer = \"{issuer}\"\naudience = [\"x\"]\nalgorithms = [\"EdDSA\"]\n\
             public_keys = [\"{}\"]\n",
            keys.join(key).display()
        )
    };
    scratch.write(
        "gateway.toml",
        &format!(
            "[[operator.issuers]]\n{}",
            jwt("https://idp.example", "operator.pub.pem")
        ),
    );
    scratch.write(
        "tenants/acme.toml",
        &format!(
            "id = \"acme\"\n\n[jwt]\n{}",
            jwt("https://idp.example", "demo.pub.pem")
        ),
    );
    let dir = scratch.0.display();
    let out = policy_check(&scratch.0);
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr),
        format!(
            "{dir}/tenants/acme.toml:4:10: issuer `https://idp.example` is also used by the \
             operator (gateway.toml:2:10): the issuer tells tenants and the operator apart, so it \
             must be unique\n\
             {dir}/ is invalid: 1 error\n"
        )
    );
    assert_eq!(out.status.code(), Some(1));
}
