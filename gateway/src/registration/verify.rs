//! Turning a claim (a name, a model folder, the file to serve and a
//! signature bundle) into a [`Registration`]: the bundle verified with a
//! trusted publisher's key and the file found in the signed manifest. No
//! file is read here: the gpu-host hashes the weights when it loads them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bulkhead_protocol::digest::to_hex;
use bulkhead_protocol::v1;

use super::{Publisher, RegistrationError, Trust, valid_model_name};
use crate::signing::{ModelError, SignedFile, VerifiedManifest, verify_bundle};

/// Largest signature bundle a registration takes. The audit entry that
/// records a registration holds its bundle and is limited to 1 MiB; real
/// bundles are a few KiB (a manifest of a few dozen files).
pub const MAX_REGISTRATION_BUNDLE_BYTES: usize = 512 << 10;

/// Longest model folder path, in bytes (Linux's PATH_MAX).
pub const MAX_DIR_BYTES: usize = 4096;

/// Names listed in one error message before the rest are counted.
const NAMES_SHOWN: usize = 10;

/// What a registration claims, before anything is checked.
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    /// The name tenants will ask for.
    pub name: &'a str,
    /// The signed model folder, as a path on the gpu-host's machine.
    pub dir: &'a Path,
    /// The weights file inside `dir` as the manifest names it; `None`: the
    /// only `.gguf` the manifest lists.
    pub file: Option<&'a str>,
    /// The signature bundle's bytes.
    pub bundle: &'a [u8],
}

/// Where a registration came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `[[local_gpu_host.models]]` or `[[upstream.models]]` in gateway.toml.
    Policy,
    /// `POST /admin/v1/models`, kept in the registry folder.
    Api {
        /// RFC 3339.
        registered_at: String,
        /// The admin token's `sub`, when it had one.
        registered_by: Option<String>,
    },
}

/// A model whose signature verified with a trusted publisher's key. The
/// gateway asks a gpu-host to load nothing else.
#[derive(Clone, Debug)]
pub struct Registration {
    pub name: String,
    /// The model folder (absolute).
    pub dir: PathBuf,
    /// The weights file as signed (name relative to `dir`, digests, size).
    pub file: SignedFile,
    /// The `trust.toml` publisher whose key verified the signature.
    pub publisher: String,
    /// `sha256:HEX` of the manifest's subject: what names the model's
    /// weights in responses and audit entries.
    pub digest: String,
    /// The signature bundle as JSON (what the audit log records).
    pub manifest: Arc<serde_json::Value>,
    pub source: Source,
}

impl Registration {
    /// The weights file's path on the gpu-host's machine.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.file.name)
    }

    /// The `LoadModel` request that has the gpu-host check every byte of
    /// the file against the signed digests. Manifests signed by the
    /// reference tool record no size; the file's own size is used then
    /// (the SHA-256 still pins its bytes), which needs the file readable
    /// here.
    pub fn load_request(&self) -> Result<v1::LoadModelRequest, RegistrationError> {
        let path = self.path();
        let size = match self.file.size {
            Some(size) => size,
            None => std::fs::metadata(&path)
                .map_err(|e| {
                    RegistrationError::File(format!(
                        "the manifest records no size for `{}` (it was not signed by \
                         `bulkhead model sign`) and the gateway cannot read {} to learn it: {e}",
                        self.file.name,
                        path.display()
                    ))
                })?
                .len(),
        };
        Ok(v1::LoadModelRequest {
            name: self.name.clone(),
            path: path.to_string_lossy().into_owned(),
            size,
            chunk_root: self.file.chunk_root.map(Vec::from).unwrap_or_default(),
            sha256: self.file.sha256.to_vec(),
            digest: self.digest.clone(),
        })
    }
}

/// Checks `claim` against the publishers in `trust`.
pub fn verify(
    trust: &Trust,
    claim: &Claim<'_>,
    source: Source,
) -> Result<Registration, RegistrationError> {
    if !valid_model_name(claim.name) {
        return Err(RegistrationError::InvalidName(
            claim.name.chars().take(200).collect(),
        ));
    }
    check_dir(claim.dir)?;
    if claim.bundle.len() > MAX_REGISTRATION_BUNDLE_BYTES {
        return Err(RegistrationError::BundleTooLarge {
            size: claim.bundle.len(),
            limit: MAX_REGISTRATION_BUNDLE_BYTES,
        });
    }
    // Parsed once as plain JSON for the audit entry (and so that a bundle
    // that is not even JSON is called malformed, not untrusted).
    let manifest: serde_json::Value = serde_json::from_slice(claim.bundle).map_err(|e| {
        RegistrationError::InvalidBundle(ModelError::MalformedBundle(format!("not JSON: {e}")))
    })?;
    let (publisher, verified) = verify_with_trust(trust, claim.bundle, &manifest)?;
    let file = pick_file(&verified, claim.file)?;
    Ok(Registration {
        name: claim.name.to_string(),
        dir: claim.dir.to_path_buf(),
        file,
        publisher: publisher.name.clone(),
        digest: format!("sha256:{}", to_hex(&verified.subject_digest)),
        manifest: Arc::new(manifest),
        source,
    })
}

/// The first publisher whose key verifies `bundle`.
fn verify_with_trust<'t>(
    trust: &'t Trust,
    bundle: &[u8],
    json: &serde_json::Value,
) -> Result<(&'t Publisher, VerifiedManifest), RegistrationError> {
    for publisher in &trust.publishers {
        match verify_bundle(bundle, &publisher.key) {
            Ok(verified) => return Ok((publisher, verified)),
            // Another key's signature: try the next publisher.
            Err(ModelError::KeyMismatch { .. } | ModelError::BadSignature) => {}
            // The bundle itself is wrong (every key would say so), or a
            // trusted key signed a statement we refuse.
            Err(e) => return Err(RegistrationError::InvalidBundle(e)),
        }
    }
    let signer = json
        .pointer("/verificationMaterial/publicKey/hint")
        .and_then(serde_json::Value::as_str)
        .filter(|hint| !hint.is_empty() && hint.len() <= 128)
        .map(|hint| format!(" (it was signed by key sha256:{})", hint.escape_debug()))
        .unwrap_or_default();
    let trusted = if trust.publishers.is_empty() {
        "trust.toml lists no publishers".to_string()
    } else {
        let names: Vec<&str> = trust.publishers.iter().map(|p| p.name.as_str()).collect();
        format!("trust.toml trusts {}", quoted(&names))
    };
    Err(RegistrationError::Untrusted(format!(
        "no trusted publisher's key verifies the signature{signer}; {trusted}"
    )))
}

/// The signed file to serve: `file` when given, else the only `.gguf`.
fn pick_file(
    verified: &VerifiedManifest,
    file: Option<&str>,
) -> Result<SignedFile, RegistrationError> {
    let names =
        |files: &[&SignedFile]| quoted(&files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>());
    let all: Vec<&SignedFile> = verified.files.iter().collect();
    if let Some(wanted) = file {
        return verified
            .files
            .iter()
            .find(|f| f.name == wanted)
            .cloned()
            .ok_or_else(|| {
                RegistrationError::File(format!(
                    "`file` \"{}\" is not in the signed manifest, which lists {}",
                    wanted.chars().take(200).collect::<String>().escape_debug(),
                    names(&all)
                ))
            });
    }
    let ggufs: Vec<&SignedFile> = verified
        .files
        .iter()
        .filter(|f| {
            Path::new(&f.name)
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    match ggufs.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(RegistrationError::File(format!(
            "the signed manifest lists no .gguf file ({}); name the weights with `file`",
            names(&all)
        ))),
        several => Err(RegistrationError::File(format!(
            "the signed manifest lists {} .gguf files ({}); name the one to serve with `file`",
            several.len(),
            names(several)
        ))),
    }
}

/// A folder path a gpu-host can be handed: absolute, UTF-8, no `.` or
/// `..` (the path is resolved on another machine, maybe, so it must mean
/// the same there), bounded.
fn check_dir(dir: &Path) -> Result<(), RegistrationError> {
    let invalid = |why: &str| Err(RegistrationError::InvalidDir(why.to_string()));
    let Some(text) = dir.to_str() else {
        return invalid("the path is not UTF-8");
    };
    if text.len() > MAX_DIR_BYTES {
        return invalid("the path is longer than 4096 bytes");
    }
    if text.contains('\0') {
        return invalid("the path contains a NUL byte");
    }
    if !dir.is_absolute() {
        return invalid("must be an absolute path (a folder on the gpu-host's machine)");
    }
    if text.split('/').any(|part| part == "." || part == "..") {
        return invalid("must not contain `.` or `..` components");
    }
    Ok(())
}

/// "`a`, `b`" with at most [`NAMES_SHOWN`] names, the rest counted.
fn quoted(names: &[&str]) -> String {
    if names.is_empty() {
        return "no files".to_string();
    }
    let mut list = names
        .iter()
        .take(NAMES_SHOWN)
        .map(|n| format!("`{}`", n.escape_debug()))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMES_SHOWN {
        list.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::{DirOptions, KeyKind, Manifest, SigningKey};

    /// A folder with `files`, signed by a fresh key; the trust that lists
    /// that key, and the bundle.
    fn signed(files: &[&str]) -> (Trust, Vec<u8>, PathBuf) {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "bulkhead-registration-verify-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in files {
            std::fs::write(dir.join(name), name.as_bytes()).unwrap();
        }
        let key = SigningKey::generate(KeyKind::Ed25519);
        let bundle = Manifest::of_dir(&dir, &DirOptions::default())
            .unwrap()
            .sign(&key);
        let trust = Trust {
            publishers: vec![Publisher {
                name: "p".into(),
                key: key.public_key(),
            }],
        };
        (trust, bundle, dir)
    }

    fn claim<'a>(dir: &'a Path, file: Option<&'a str>, bundle: &'a [u8]) -> Claim<'a> {
        Claim {
            name: "m",
            dir,
            file,
            bundle,
        }
    }

    #[test]
    fn a_trusted_bundle_becomes_a_registration_of_its_only_gguf() {
        let (trust, bundle, dir) = signed(&["config.json", "m.gguf"]);
        let r = verify(&trust, &claim(&dir, None, &bundle), Source::Policy).unwrap();
        assert_eq!(
            (r.publisher.as_str(), r.file.name.as_str()),
            ("p", "m.gguf")
        );
        assert_eq!(r.file.size, Some(6));
        assert!(r.digest.starts_with("sha256:") && r.digest.len() == 7 + 64);
        let load = r.load_request().unwrap();
        assert_eq!(load.path, dir.join("m.gguf").to_string_lossy());
        assert_eq!((load.size, load.sha256.len()), (6, 32));
        assert_eq!(load.chunk_root.len(), 32);
        assert_eq!(load.digest, r.digest);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn claims_are_refused_naming_what_is_wrong() {
        let (trust, bundle, dir) = signed(&["a.gguf", "b.gguf"]);
        let refuse = |claim: Claim<'_>| {
            verify(&trust, &claim, Source::Policy)
                .unwrap_err()
                .to_string()
        };
        assert!(refuse(claim(&dir, None, &bundle)).contains("lists 2 .gguf files"));
        assert!(refuse(claim(&dir, Some("c.gguf"), &bundle)).contains("is not in the signed"));
        assert!(
            verify(
                &trust,
                &claim(&dir, Some("b.gguf"), &bundle),
                Source::Policy
            )
            .is_ok()
        );
        assert!(refuse(claim(Path::new("rel/dir"), None, &bundle)).contains("absolute"));
        assert!(refuse(claim(Path::new("/a/../b"), None, &bundle)).contains("`..`"));
        assert!(refuse(claim(&dir, None, b"{")).contains("not JSON"));
        let huge = vec![b' '; MAX_REGISTRATION_BUNDLE_BYTES + 1];
        assert!(refuse(claim(&dir, None, &huge)).contains("limited to"));
        let mut bad_name = claim(&dir, None, &bundle);
        bad_name.name = "a/b";
        assert!(refuse(bad_name).contains("is not valid"));
        // Another key: untrusted, naming the signing key and the publishers.
        let (_, other_bundle, other_dir) = signed(&["a.gguf"]);
        let why = refuse(claim(&other_dir, None, &other_bundle));
        assert!(
            why.starts_with(
                "no trusted publisher's key verifies the signature (it was signed by key sha256:"
            ) && why.ends_with("trust.toml trusts `p`"),
            "{why}"
        );
        let why = verify(
            &Trust::default(),
            &claim(&dir, Some("a.gguf"), &bundle),
            Source::Policy,
        )
        .unwrap_err()
        .to_string();
        assert!(why.ends_with("trust.toml lists no publishers"), "{why}");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&other_dir);
    }
}
