//! `bulkhead model sign|verify` against the reference implementation of the
//! OpenSSF model-signing format, the `model_signing` CLI (PyPI
//! `model-signing`, pinned in tests/e2e/requirements.txt): each verifies
//! what the other signed, both refuse a tampered folder or another key, and
//! keys written by `openssl` work with `bulkhead`.
//!
//! Needs `BULKHEAD_TEST_PYTHON` (a venv with the requirements) and
//! `openssl`. `tests/run-all` provides both and sets
//! `BULKHEAD_REQUIRE` listing `python-sdk`, so CI fails rather than skips; a bare
//! `cargo test` without the venv says that it skipped.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bulkhead_tests::bin;

/// The venv's Python with `model_signing` importable; `None` (skip) only
/// when no venv is configured and the test is not required.
fn reference_python() -> Option<PathBuf> {
    let Some(python) = std::env::var_os("BULKHEAD_TEST_PYTHON") else {
        bulkhead_testkit::skip(
            bulkhead_testkit::Need::PythonSdk,
            "set BULKHEAD_TEST_PYTHON to a Python with tests/e2e/requirements.txt",
        );
        return None;
    };
    let python = PathBuf::from(python);
    let out = Command::new(&python)
        .args(["-m", "model_signing", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        out.status.success(),
        "`{} -m model_signing` does not run; install tests/e2e/requirements.txt in that venv:\n{}",
        python.display(),
        text(&out.stderr)
    );
    Some(python)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn run(program: impl AsRef<OsStr>, args: &[&OsStr]) -> Output {
    let program = program.as_ref();
    Command::new(program)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.to_string_lossy()))
}

fn bulkhead(args: &[&OsStr]) -> Output {
    run(bin("bulkhead"), args)
}

fn openssl(args: &[&str]) -> Output {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("openssl is needed on PATH (Debian: apt-get install openssl): {e}")
        });
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        text(&out.stderr)
    );
    out
}

/// A scratch folder with a small model in `model/`, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "bulkhead-model-signing-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let scratch = Scratch(dir);
        // Over 4 MiB, so the weights span two chunks.
        let weights: Vec<u8> = (0..(4 << 20) + 123_457u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        scratch.write("model/model.gguf", &weights);
        scratch.write("model/config.json", b"{\"n_layer\": 2}\n");
        scratch.write("model/tokenizer/vocab.txt", b"<s>\n</s>\nhello\n");
        scratch.write("model/.git/HEAD", b"ref: refs/heads/main\n");
        scratch.write("model/.gitattributes", b"*.gguf filter=lfs\n");
        scratch
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    fn write(&self, rel: &str, bytes: &[u8]) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    fn model(&self) -> PathBuf {
        self.path("model")
    }

    /// A P-256 key pair written by openssl: (private PKCS#8, public SPKI).
    fn openssl_p256(&self, name: &str) -> (PathBuf, PathBuf) {
        let key = self.path(&format!("{name}.pem"));
        let public = self.path(&format!("{name}.pub.pem"));
        let key_s = key.to_str().unwrap();
        openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            key_s,
        ]);
        openssl(&[
            "pkey",
            "-in",
            key_s,
            "-pubout",
            "-out",
            public.to_str().unwrap(),
        ]);
        (key, public)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn reference_sign(python: &Path, dir: &Path, key: &Path, signature: &Path) {
    let out = run(
        python,
        &[
            "-m".as_ref(),
            "model_signing".as_ref(),
            "sign".as_ref(),
            "key".as_ref(),
            dir.as_os_str(),
            "--private_key".as_ref(),
            key.as_os_str(),
            "--signature".as_ref(),
            signature.as_os_str(),
        ],
    );
    assert!(
        out.status.success(),
        "model_signing sign failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn reference_verify(python: &Path, dir: &Path, signature: &Path, public: &Path) -> Output {
    run(
        python,
        &[
            "-m".as_ref(),
            "model_signing".as_ref(),
            "verify".as_ref(),
            "key".as_ref(),
            dir.as_os_str(),
            "--signature".as_ref(),
            signature.as_os_str(),
            "--public_key".as_ref(),
            public.as_os_str(),
        ],
    )
}

fn bulkhead_sign(dir: &Path, key: &Path, signature: &Path) {
    let out = bulkhead(&[
        "model".as_ref(),
        "sign".as_ref(),
        dir.as_os_str(),
        "--key".as_ref(),
        key.as_os_str(),
        "--signature".as_ref(),
        signature.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "bulkhead model sign failed: {}",
        text(&out.stderr)
    );
}

fn bulkhead_verify(dir: &Path, signature: &Path, public: &Path) -> Output {
    bulkhead(&[
        "model".as_ref(),
        "verify".as_ref(),
        dir.as_os_str(),
        "--signature".as_ref(),
        signature.as_os_str(),
        "--public-key".as_ref(),
        public.as_os_str(),
    ])
}

fn assert_verifies(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} refused a valid signature:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// `bulkhead model verify` exited 1 with `expected` in its message.
fn assert_refused(out: &Output, expected: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected {expected:?} in: {stderr}"
    );
}

#[test]
fn a_model_signed_by_model_signing_verifies_with_bulkhead() {
    let Some(python) = reference_python() else {
        return;
    };
    let scratch = Scratch::new("reference-signed");
    let (key, public) = scratch.openssl_p256("publisher");
    let model = scratch.model();
    // Its default place, inside the folder, and beside it.
    let inside = model.join("model.sig");
    reference_sign(&python, &model, &key, &inside);
    let out = bulkhead_verify(&model, &inside, &public);
    assert_verifies("bulkhead model verify", &out);
    assert!(
        text(&out.stdout).contains("3 files, 0 with chunk roots"),
        "{}",
        text(&out.stdout)
    );
    std::fs::remove_file(&inside).unwrap();
    let beside = scratch.path("model.sig");
    reference_sign(&python, &model, &key, &beside);
    assert_verifies(
        "bulkhead model verify",
        &bulkhead_verify(&model, &beside, &public),
    );
}

#[test]
fn a_model_signed_by_bulkhead_verifies_with_model_signing() {
    let Some(python) = reference_python() else {
        return;
    };
    let scratch = Scratch::new("bulkhead-signed");
    let key = scratch.path("publisher.pem");
    let out = bulkhead(&[
        "model".as_ref(),
        "keygen".as_ref(),
        "--out".as_ref(),
        key.as_os_str(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let public = scratch.path("publisher.pub.pem");
    let model = scratch.model();
    for signature in [scratch.path("model.sig"), model.join("model.sig")] {
        bulkhead_sign(&model, &key, &signature);
        // The statement carries our chunk-root extension; model_signing
        // ignores it.
        assert_verifies(
            "model_signing verify key",
            &reference_verify(&python, &model, &signature, &public),
        );
        let out = bulkhead_verify(&model, &signature, &public);
        assert_verifies("bulkhead model verify", &out);
        assert!(
            text(&out.stdout).contains("3 files, 3 with chunk roots"),
            "{}",
            text(&out.stdout)
        );
    }
}

/// One way of breaking a signed folder, and what `bulkhead` must say.
struct Tamper {
    name: &'static str,
    apply: fn(&Path),
    message: &'static str,
}

const TAMPERS: [Tamper; 3] = [
    Tamper {
        name: "one byte of the weights",
        apply: |model| {
            let path = model.join("model.gguf");
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[(4 << 20) + 99] ^= 0x01;
            std::fs::write(&path, bytes).unwrap();
        },
        message: "content changed: \"model.gguf\"",
    },
    Tamper {
        name: "a renamed file",
        apply: |model| {
            std::fs::rename(model.join("config.json"), model.join("config.old.json")).unwrap();
        },
        message: "missing: \"config.json\"; unexpected: \"config.old.json\"",
    },
    Tamper {
        name: "an added file",
        apply: |model| std::fs::write(model.join("tokenizer/merges.txt"), b"a b\n").unwrap(),
        message: "unexpected: \"tokenizer/merges.txt\"",
    },
];

#[test]
fn tampering_or_another_key_fails_both_verifiers() {
    let Some(python) = reference_python() else {
        return;
    };
    for signer in ["model_signing", "bulkhead"] {
        for tamper in &TAMPERS {
            let scratch = Scratch::new("tamper");
            let (key, public) = scratch.openssl_p256("publisher");
            let model = scratch.model();
            let signature = scratch.path("model.sig");
            match signer {
                "bulkhead" => bulkhead_sign(&model, &key, &signature),
                _ => reference_sign(&python, &model, &key, &signature),
            }
            (tamper.apply)(&model);
            let context = format!("signed by {signer}, then {}", tamper.name);
            let out = bulkhead_verify(&model, &signature, &public);
            assert_refused(&out, tamper.message);
            eprintln!("{context}: bulkhead says {}", text(&out.stderr).trim());
            let out = reference_verify(&python, &model, &signature, &public);
            assert!(
                !out.status.success(),
                "model_signing accepted it ({context})"
            );
        }
        // Another key (the folder untouched).
        let scratch = Scratch::new("other-key");
        let (key, _) = scratch.openssl_p256("publisher");
        let (_, other) = scratch.openssl_p256("other");
        let model = scratch.model();
        let signature = scratch.path("model.sig");
        match signer {
            "bulkhead" => bulkhead_sign(&model, &key, &signature),
            _ => reference_sign(&python, &model, &key, &signature),
        }
        let out = bulkhead_verify(&model, &signature, &other);
        assert_refused(&out, "signature does not verify with the given key");
        let out = reference_verify(&python, &model, &signature, &other);
        assert!(
            !out.status.success(),
            "model_signing accepted another key ({signer})"
        );
    }
}

#[test]
fn keys_written_by_openssl_sign_and_verify() {
    // Needs only openssl, but runs with the other interop tests.
    if reference_python().is_none() {
        return;
    }
    let scratch = Scratch::new("openssl-keys");
    let model = scratch.model();
    let path = |name: &str| scratch.path(name).to_str().unwrap().to_string();
    // SEC1 with its EC PARAMETERS block (`openssl ecparam -genkey`), Ed25519
    // PKCS#8 (`openssl genpkey`), and P-256 PKCS#8 converted by `openssl pkcs8`.
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-out",
        &path("sec1.pem"),
    ]);
    openssl(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        &path("ed25519.pem"),
    ]);
    openssl(&[
        "pkcs8",
        "-topk8",
        "-nocrypt",
        "-in",
        &path("sec1.pem"),
        "-out",
        &path("pkcs8.pem"),
    ]);
    for name in ["sec1", "ed25519", "pkcs8"] {
        let key = path(&format!("{name}.pem"));
        let public = path(&format!("{name}.pub.pem"));
        openssl(&["pkey", "-in", &key, "-pubout", "-out", &public]);
        let signature = scratch.path(&format!("{name}.sig"));
        bulkhead_sign(&model, key.as_ref(), &signature);
        assert_verifies(
            "bulkhead model verify",
            &bulkhead_verify(&model, &signature, public.as_ref()),
        );
    }
    // An RSA key is named as such.
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:1024",
        "-out",
        &path("rsa.pem"),
    ]);
    let out = bulkhead(&[
        "model".as_ref(),
        "sign".as_ref(),
        model.as_os_str(),
        "--key".as_ref(),
        path("rsa.pem").as_ref(),
        "--signature".as_ref(),
        path("rsa.sig").as_ref(),
    ]);
    assert_refused(
        &out,
        "an RSA key; model signing takes ECDSA P-256 or Ed25519 keys",
    );
}
