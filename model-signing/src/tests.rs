//! Signing and verification end to end on scratch folders, the reference
//! tool's own signature (`tests/model-signing/`, made by `make.sh`),
//! tampering, malformed bundles and keys as OpenSSL writes them.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bulkhead_protocol::digest::{CHUNK_BYTES, FileDigest, to_hex};
use serde_json::{Value, json};

use super::*;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/model-signing")
        .join(path)
}

fn key_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixture("keys").join(name)).unwrap()
}

/// A scratch folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("bulkhead-models-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A small model: a weight file of three chunks, a nested file, a
    /// hidden file, and git files model-signing leaves out.
    fn model(name: &str) -> Scratch {
        let scratch = Scratch::new(name);
        let weights: Vec<u8> = (0..2 * CHUNK_BYTES + 777)
            .map(|i| (i * 13 % 251) as u8)
            .collect();
        scratch.write("model/weights.gguf", &weights);
        scratch.write("model/config.json", b"{\"layers\": 2}\n");
        scratch.write("model/tokenizer/vocab.txt", b"a\nb\n");
        scratch.write("model/.hidden", b"hidden\n");
        scratch.write("model/.git/HEAD", b"ref: refs/heads/main\n");
        scratch.write("model/.gitignore", b"*.tmp\n");
        scratch
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    fn write(&self, rel: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Signs `scratch/model` with a fresh key of `kind`, the signature inside
/// the folder as `model.sig`. The folder, signature path and public key.
fn signed(scratch: &Scratch, kind: KeyKind) -> (PathBuf, PathBuf, PublicKey) {
    let key = SigningKey::generate(kind);
    let dir = scratch.path("model");
    let sig = dir.join("model.sig");
    let manifest = Manifest::of_dir(&dir, &DirOptions::with_signature(&sig)).unwrap();
    std::fs::write(&sig, manifest.sign(&key)).unwrap();
    (dir, sig, key.public_key())
}

fn verify(dir: &Path, sig: &Path, key: &PublicKey) -> Result<VerifiedManifest, ModelError> {
    verify_dir(
        dir,
        &read_bundle_file(sig).unwrap(),
        key,
        &DirOptions::with_signature(sig),
    )
}

fn mismatch(result: Result<VerifiedManifest, ModelError>) -> FolderDiff {
    match result {
        Err(ModelError::Mismatch(diff)) => diff,
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn a_signed_folder_verifies_with_both_key_kinds() {
    for kind in [KeyKind::P256, KeyKind::Ed25519] {
        let scratch = Scratch::model(&format!("roundtrip-{kind:?}"));
        let (dir, sig, public) = signed(&scratch, kind);
        let verified = verify(&dir, &sig, &public).unwrap();
        let names: Vec<&str> = verified.files.iter().map(|f| f.name.as_str()).collect();
        // Sorted by component; git files and the signature left out.
        assert_eq!(
            names,
            [
                ".hidden",
                "config.json",
                "tokenizer/vocab.txt",
                "weights.gguf"
            ]
        );
        assert_eq!(verified.model_name, "model");
        for path in [
            ".git",
            ".gitattributes",
            ".github",
            ".gitignore",
            "model.sig",
        ] {
            assert!(verified.ignore_paths.iter().any(|p| p == path), "{path}");
        }
        let weights = std::fs::read(dir.join("weights.gguf")).unwrap();
        let expected = FileDigest::of(&weights);
        let file = &verified.files[3];
        assert_eq!(file.sha256, expected.sha256);
        assert_eq!(file.size, Some(expected.size));
        assert_eq!(file.chunk_root, Some(expected.chunk_root));
        assert!(verified.files.iter().all(|f| f.chunk_root.is_some()));
        // The subject digest is independent of where the folder lives.
        let bundle = read_bundle_file(&sig).unwrap();
        assert_eq!(
            verify_bundle(&bundle, &public).unwrap().subject_digest,
            verified.subject_digest
        );
    }
}

#[test]
fn a_folder_signed_by_model_signing_verifies() {
    let dir = fixture("reference/model");
    let public = PublicKey::from_pem(&key_fixture("p256.pub.pem")).unwrap();
    let verified = verify(&dir, &dir.join("model.sig"), &public).unwrap();
    let names: Vec<&str> = verified.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [".hidden", "config.json", "sub/tokenizer.txt", "weights.bin"]
    );
    // model-signing records no sizes or chunk roots.
    assert!(
        verified
            .files
            .iter()
            .all(|f| f.chunk_root.is_none() && f.size.is_none())
    );
    // Our manifest of the same folder has the same subject digest.
    let ours = Manifest::of_dir(&dir, &DirOptions::with_signature(&dir.join("model.sig"))).unwrap();
    assert_eq!(ours.subject_digest(), verified.subject_digest);
    // model-signing recorded `model.sig` among the ignore paths, so it is
    // left out even when the verifier is not told where the signature is.
    let other = fixture("reference/model/model.sig");
    assert!(
        verify_dir(
            &dir,
            &std::fs::read(&other).unwrap(),
            &public,
            &DirOptions::default()
        )
        .is_ok()
    );
}

#[test]
fn public_key_pem_and_hint_match_openssl_and_model_signing() {
    for name in ["p256.pub.pem", "ed25519.pub.pem", "p256.sec1.pub.pem"] {
        let pem = key_fixture(name);
        let key = PublicKey::from_pem(&pem).unwrap();
        assert_eq!(key.to_spki_pem().as_bytes(), &pem[..], "{name}");
    }
    let bundle: Value =
        serde_json::from_slice(&std::fs::read(fixture("reference/model/model.sig")).unwrap())
            .unwrap();
    let key = PublicKey::from_pem(&key_fixture("p256.pub.pem")).unwrap();
    assert_eq!(
        bundle["verificationMaterial"]["publicKey"]["hint"],
        json!(key.hint())
    );
}

#[test]
fn a_changed_byte_names_the_file() {
    let scratch = Scratch::model("tamper-byte");
    let (dir, sig, public) = signed(&scratch, KeyKind::P256);
    let path = dir.join("weights.gguf");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[CHUNK_BYTES + 5] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let diff = mismatch(verify(&dir, &sig, &public));
    assert_eq!(diff.changed, ["weights.gguf"]);
    assert!(diff.missing.is_empty() && diff.unexpected.is_empty());
    let message = ModelError::Mismatch(diff).to_string();
    assert_eq!(
        message,
        "the folder does not match the signature: content changed: \"weights.gguf\""
    );
}

#[test]
fn renamed_added_and_removed_files_are_named() {
    let scratch = Scratch::model("tamper-files");
    let (dir, sig, public) = signed(&scratch, KeyKind::Ed25519);
    std::fs::rename(dir.join("config.json"), dir.join("config2.json")).unwrap();
    std::fs::write(dir.join("tokenizer/extra.bin"), b"x").unwrap();
    std::fs::remove_file(dir.join(".hidden")).unwrap();
    // Not ignored: only the top-level .gitignore is.
    std::fs::write(dir.join("tokenizer/.gitignore"), b"x").unwrap();
    let diff = mismatch(verify(&dir, &sig, &public));
    assert_eq!(diff.missing, [".hidden", "config.json"]);
    assert_eq!(
        diff.unexpected,
        [
            "config2.json",
            "tokenizer/.gitignore",
            "tokenizer/extra.bin"
        ]
    );
    let message = ModelError::Mismatch(diff).to_string();
    assert!(
        message.contains("missing: \".hidden\", \"config.json\""),
        "{message}"
    );
    assert!(
        message.contains("unexpected: \"config2.json\""),
        "{message}"
    );
    // Changes under ignored paths do not matter.
    std::fs::write(dir.join(".git/config"), b"x").unwrap();
}

#[test]
fn another_key_does_not_verify() {
    let scratch = Scratch::model("wrong-key");
    let (dir, sig, _) = signed(&scratch, KeyKind::P256);
    for kind in [KeyKind::P256, KeyKind::Ed25519] {
        let other = SigningKey::generate(kind).public_key();
        let err = verify(&dir, &sig, &other).unwrap_err();
        assert!(matches!(err, ModelError::KeyMismatch { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("signature does not verify with the given key"),
            "{err}"
        );
    }
    // Without the hint, the signature check itself refuses the key.
    let mut bundle: Value = serde_json::from_slice(&std::fs::read(&sig).unwrap()).unwrap();
    bundle["verificationMaterial"]["publicKey"]["hint"] = json!("");
    let other = SigningKey::generate(KeyKind::P256).public_key();
    let err = verify_bundle(&serde_json::to_vec(&bundle).unwrap(), &other).unwrap_err();
    assert!(matches!(err, ModelError::BadSignature), "{err:?}");
    assert_eq!(
        err.to_string(),
        "signature does not verify with the given key"
    );
}

#[test]
fn symlinks_and_non_folders_are_refused() {
    let scratch = Scratch::model("symlink");
    let dir = scratch.path("model");
    std::os::unix::fs::symlink(dir.join("config.json"), dir.join("link.json")).unwrap();
    let err = Manifest::of_dir(&dir, &DirOptions::default()).unwrap_err();
    assert!(err.to_string().contains("link.json: a symlink"), "{err}");
    let err = Manifest::of_dir(&dir.join("config.json"), &DirOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not a folder"), "{err}");
}

// ---- malformed bundles -------------------------------------------------

/// A valid bundle (P-256) and its key, to break in one place at a time.
fn good_bundle() -> (Vec<u8>, SigningKey) {
    let key = SigningKey::generate(KeyKind::P256);
    let manifest = Manifest {
        model_name: "m".into(),
        files: ["a.gguf", "b/c.json"]
            .iter()
            .map(|name| ManifestFile {
                name: name.to_string(),
                digest: FileDigest::of(name.as_bytes()),
            })
            .collect(),
        ignore_paths: vec![".git".into()],
    };
    (manifest.sign(&key), key)
}

/// `bundle`'s statement edited by `edit`, signed again with `key`.
fn resigned(bundle: &[u8], key: &SigningKey, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let outer: Value = serde_json::from_slice(bundle).unwrap();
    let payload = STANDARD
        .decode(outer["dsseEnvelope"]["payload"].as_str().unwrap())
        .unwrap();
    let mut statement: Value = serde_json::from_slice(&payload).unwrap();
    edit(&mut statement);
    bundle::seal(&serde_json::to_vec(&statement).unwrap(), key)
}

/// `bundle`'s outer JSON edited by `edit` (the signature left as it was).
fn edited(bundle: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut outer: Value = serde_json::from_slice(bundle).unwrap();
    edit(&mut outer);
    serde_json::to_vec(&outer).unwrap()
}

fn refused(bundle: &[u8], key: &SigningKey) -> String {
    match verify_bundle(bundle, &key.public_key()) {
        Ok(m) => panic!("accepted: {m:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn malformed_bundles_are_refused_with_the_reason() {
    let (good, key) = good_bundle();
    assert!(verify_bundle(&good, &key.public_key()).is_ok());

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            good[..good.len() / 2].to_vec(),
            "malformed signature bundle: not a Sigstore bundle",
        ),
        ("empty", Vec::new(), "not a Sigstore bundle"),
        (
            "payload type",
            edited(&good, |b| {
                b["dsseEnvelope"]["payloadType"] = json!("application/json")
            }),
            "`payloadType` is \"application/json\"",
        ),
        (
            "media type",
            edited(&good, |b| {
                b["mediaType"] = json!("application/vnd.dev.sigstore.bundle+json;version=0.2")
            }),
            "`mediaType` is",
        ),
        (
            "payload base64",
            edited(&good, |b| b["dsseEnvelope"]["payload"] = json!("%%%")),
            "`dsseEnvelope.payload` is not base64",
        ),
        (
            "signature base64",
            edited(&good, |b| {
                b["dsseEnvelope"]["signatures"][0]["sig"] = json!("***")
            }),
            "`dsseEnvelope.signatures[0].sig` is not base64",
        ),
        (
            "two signatures",
            edited(&good, |b| {
                let sig = b["dsseEnvelope"]["signatures"][0].clone();
                b["dsseEnvelope"]["signatures"] = json!([sig.clone(), sig]);
            }),
            "2 signatures in the envelope",
        ),
        (
            "no envelope",
            edited(&good, |b| {
                b.as_object_mut().unwrap().remove("dsseEnvelope");
            }),
            "no `dsseEnvelope`",
        ),
        (
            "certificate",
            edited(&good, |b| {
                b["verificationMaterial"]["certificate"] = json!({"rawBytes": "AA=="})
            }),
            "signed with a certificate",
        ),
        (
            "payload changed after signing",
            edited(&good, |b| {
                b["dsseEnvelope"]["payload"] = json!(STANDARD.encode(b"{}"))
            }),
            "signature does not verify with the given key",
        ),
        (
            "predicate type",
            resigned(&good, &key, |s| {
                s["predicateType"] = json!("https://example.com/other")
            }),
            "`predicateType` is \"https://example.com/other\"",
        ),
        (
            "statement type",
            resigned(&good, &key, |s| {
                s["_type"] = json!("https://in-toto.io/Statement/v0.1")
            }),
            "`_type` is",
        ),
        (
            "subject digest",
            resigned(&good, &key, |s| {
                s["predicate"]["resources"][0]["digest"] = json!(to_hex(&[7; 32]))
            }),
            "the subject digest is sha256:",
        ),
        (
            "resources reordered",
            resigned(&good, &key, |s| {
                let r = s["predicate"]["resources"].as_array_mut().unwrap();
                r.reverse();
            }),
            "the listed files hash to",
        ),
        (
            "two subjects",
            resigned(&good, &key, |s| {
                let subject = s["subject"][0].clone();
                s["subject"] = json!([subject.clone(), subject]);
            }),
            "2 subjects",
        ),
        (
            "shards",
            resigned(&good, &key, |s| {
                s["predicate"]["serialization"]["method"] = json!("shards")
            }),
            "serialization method \"shards\" is not supported",
        ),
        (
            "blake3",
            resigned(&good, &key, |s| {
                s["predicate"]["resources"][1]["algorithm"] = json!("blake3")
            }),
            "\"b/c.json\" is hashed with \"blake3\"",
        ),
        (
            "escaping name",
            resigned(&good, &key, |s| {
                s["predicate"]["resources"][1]["name"] = json!("../etc/passwd")
            }),
            "not a normalized relative path",
        ),
        (
            "duplicate name",
            resigned(&good, &key, |s| {
                s["predicate"]["resources"][1]["name"] = json!("a.gguf")
            }),
            "\"a.gguf\" is listed twice",
        ),
        (
            "absolute ignore path",
            resigned(&good, &key, |s| {
                s["predicate"]["serialization"]["ignore_paths"] = json!(["/etc"])
            }),
            "ignore path:",
        ),
        (
            "chunk size",
            resigned(&good, &key, |s| {
                s["predicate"]["bulkhead_chunks"]["chunk_size"] = json!(1024)
            }),
            "`bulkhead_chunks.chunk_size` is 1024",
        ),
        (
            "chunk roots for other files",
            resigned(&good, &key, |s| {
                s["predicate"]["bulkhead_chunks"]["files"][0]["name"] = json!("z")
            }),
            "`bulkhead_chunks` lists \"z\", which is not a resource",
        ),
        (
            "chunk roots missing a file",
            resigned(&good, &key, |s| {
                s["predicate"]["bulkhead_chunks"]["files"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            }),
            "`bulkhead_chunks` lists 1 files, the resources 2",
        ),
        (
            "bundle not UTF-8",
            edited(&good, |b| b["x"] = json!("\u{e9}"))
                .iter()
                .flat_map(|&c| if c == 0xc3 { vec![0xff] } else { vec![c] })
                .collect(),
            "not UTF-8 text",
        ),
        (
            "statement not UTF-8",
            bundle::seal(b"{\"x\": \"\xff\"}", &key),
            "the statement is not UTF-8",
        ),
        (
            "statement not JSON",
            bundle::seal(b"not json", &key),
            "signed statement: not a model-signing statement",
        ),
    ];
    for (case, bundle, expected) in cases {
        let message = refused(&bundle, &key);
        assert!(message.contains(expected), "{case}: {message}");
    }
}

#[test]
fn unknown_fields_are_ignored_as_model_signing_ignores_them() {
    let (good, key) = good_bundle();
    let extended = resigned(&good, &key, |s| {
        s["predicate"]["model_card"] = json!({"license": "apache-2.0"});
        s["predicate"]["resources"][0]["annotations"] = json!({"x": 1});
        s["subject"][0]["digest"]["sha512"] = json!("00");
    });
    let extended = edited(&extended, |b| {
        b["verificationMaterial"]["timestampVerificationData"] = json!({});
    });
    assert!(verify_bundle(&extended, &key.public_key()).is_ok());
    // Without our extension the files simply have no chunk roots.
    let plain = resigned(&good, &key, |s| {
        s["predicate"]
            .as_object_mut()
            .unwrap()
            .remove("bulkhead_chunks");
    });
    let verified = verify_bundle(&plain, &key.public_key()).unwrap();
    assert!(verified.files.iter().all(|f| f.chunk_root.is_none()));
}

#[test]
fn oversized_and_deeply_nested_bundles_are_refused() {
    let (good, key) = good_bundle();
    let mut big = good.clone();
    big.resize(MAX_BUNDLE_BYTES + 1, b' ');
    let message = refused(&big, &key);
    assert!(message.contains("the limit is 16777216"), "{message}");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let message = refused(deep.as_bytes(), &key);
    assert!(message.contains("malformed signature bundle"), "{message}");
}

// ---- keys --------------------------------------------------------------

#[test]
fn keys_written_by_openssl_load() {
    let pkcs8 = SigningKey::from_pem(&key_fixture("p256.pkcs8.pem")).unwrap();
    assert_eq!(pkcs8.kind(), KeyKind::P256);
    assert_eq!(
        pkcs8.public_key(),
        PublicKey::from_pem(&key_fixture("p256.pub.pem")).unwrap()
    );
    // `openssl ecparam -genkey`: an EC PARAMETERS block, then SEC1.
    let sec1_pem = key_fixture("p256.sec1.pem");
    assert!(String::from_utf8_lossy(&sec1_pem).contains("BEGIN EC PARAMETERS"));
    let sec1 = SigningKey::from_pem(&sec1_pem).unwrap();
    assert_eq!(
        sec1.public_key(),
        PublicKey::from_pem(&key_fixture("p256.sec1.pub.pem")).unwrap()
    );
    let ed = SigningKey::from_pem(&key_fixture("ed25519.pem")).unwrap();
    assert_eq!(ed.kind(), KeyKind::Ed25519);
    assert_eq!(
        ed.public_key(),
        PublicKey::from_pem(&key_fixture("ed25519.pub.pem")).unwrap()
    );
}

#[test]
fn generated_keys_round_trip_through_pem() {
    for kind in [KeyKind::P256, KeyKind::Ed25519] {
        let key = SigningKey::generate(kind);
        let pem = key.to_pkcs8_pem().unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let again = SigningKey::from_pem(pem.as_bytes()).unwrap();
        assert_eq!(again.public_key(), key.public_key());
        let public = PublicKey::from_pem(key.public_key().to_spki_pem().as_bytes()).unwrap();
        assert_eq!(public, key.public_key());
        assert!(!format!("{key:?}").contains(pem.lines().nth(1).unwrap()));
    }
}

#[test]
fn other_keys_are_named() {
    let private = |name: &str| {
        SigningKey::from_pem(&key_fixture(name))
            .unwrap_err()
            .to_string()
    };
    let public = |name: &str| {
        PublicKey::from_pem(&key_fixture(name))
            .unwrap_err()
            .to_string()
    };
    let takes = "model signing takes ECDSA P-256 or Ed25519 keys";
    assert_eq!(private("rsa.pem"), format!("an RSA key; {takes}"));
    assert_eq!(
        private("p384.pkcs8.pem"),
        format!("an ECDSA P-384 key; {takes}")
    );
    assert_eq!(
        private("p384.sec1.pem"),
        format!("an ECDSA P-384 key; {takes}")
    );
    assert_eq!(public("rsa.pub.pem"), format!("an RSA key; {takes}"));
    assert_eq!(
        public("p384.pub.pem"),
        format!("an ECDSA P-384 key; {takes}")
    );
    assert!(private("p256.encrypted.pem").contains("an encrypted private key"));
    assert!(private("p256.pub.pem").contains("a public key; signing needs the private key"));
    assert!(public("p256.pkcs8.pem").contains("a private key; verification takes the public key"));
    for garbage in [
        &b"hello"[..],
        b"",
        b"\xff\xfe",
        b"-----BEGIN PRIVATE KEY-----\nAAAA",
    ] {
        let err = SigningKey::from_pem(garbage).unwrap_err().to_string();
        assert!(err.contains("PEM"), "{err}");
    }
    let damaged = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
    let err = SigningKey::from_pem(damaged).unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
}
