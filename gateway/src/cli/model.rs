//! `bulkhead model keygen|sign|verify`: publisher keys and model signatures
//! in the OpenSSF model-signing format (crate `bulkhead-model-signing`, `model-signing/`); `register`,
//! `unregister` and `list` call a running gateway (`model_api.rs`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::write_new;
use anyhow::{Context, bail};
use bulkhead_gateway::signing::{
    DirOptions, KeyKind, Manifest, PublicKey, SigningKey, read_bundle_file, verify_dir,
};
use bulkhead_protocol::digest::to_hex;
use clap::{Args, Subcommand, ValueEnum};

#[derive(Debug, Args)]
pub struct ModelArgs {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Write a new publisher key pair
    ///
    /// The private key as PKCS#8 PEM (mode 0600), as `openssl genpkey`
    /// writes it, and the public key as SPKI PEM beside it (KEY.pem →
    /// KEY.pub.pem). Never overwrites a file.
    Keygen {
        /// The private key file to write.
        #[arg(long, value_name = "KEY.pem")]
        out: PathBuf,
        /// p256 (ECDSA P-256: the model_signing tool verifies it too) or
        /// ed25519 (Bulkhead only).
        #[arg(long, value_enum, default_value_t = Kind::P256)]
        kind: Kind,
    },
    /// Sign a model folder
    ///
    /// Writes a Sigstore bundle in the OpenSSF model-signing v1.0 format
    /// (what `model_signing sign key` writes), listing every file's SHA-256
    /// and, as Bulkhead's extension, its 4 MiB chunk Merkle root. The
    /// signature file, `.git`, `.gitattributes`, `.github` and `.gitignore`
    /// are left out. Keys: PKCS#8 or SEC1 PEM (OpenSSL's forms).
    Sign {
        /// The model folder.
        dir: PathBuf,
        /// The private key (P-256 or Ed25519).
        #[arg(long, value_name = "KEY.pem")]
        key: PathBuf,
        /// The signature file to write (inside the folder or beside it).
        #[arg(long, value_name = "OUT.sig")]
        signature: PathBuf,
    },
    /// Verify a model folder against its signature
    ///
    /// Exits 0 when the signature verifies with the key and the folder holds
    /// exactly the signed files with the signed content; otherwise prints
    /// why (which file changed, is missing or is unexpected; or that the
    /// signature does not verify with the key) and exits 1.
    Verify {
        /// The model folder.
        dir: PathBuf,
        /// The signature file (a model-signing bundle).
        #[arg(long, value_name = "SIG")]
        signature: PathBuf,
        /// The publisher's public key (SPKI PEM).
        #[arg(long, value_name = "PUB.pem")]
        public_key: PathBuf,
    },
    /// Register a signed model folder with a running gateway
    ///
    /// The gateway verifies the signature with the publishers in its
    /// trust.toml, has its gpu-host load the weights (every byte checked
    /// against the signed digests), keeps the registration across restarts
    /// and records it in the audit log. DIR is sent as an absolute path: it
    /// must be readable by the gpu-host. Exits 0 only when registered;
    /// otherwise prints the gateway's reason.
    Register {
        /// The signed model folder.
        dir: PathBuf,
        /// Its signature bundle (from `bulkhead model sign`).
        #[arg(long, value_name = "SIG")]
        signature: PathBuf,
        /// The name tenants will ask for.
        #[arg(long)]
        name: String,
        /// The GGUF file in DIR, as the manifest names it (default: the only
        /// .gguf file it lists).
        #[arg(long)]
        file: Option<String>,
        #[command(flatten)]
        remote: super::model_api::Remote,
    },
    /// Unregister a model registered through the API
    ///
    /// The gateway stops serving it at once and its gpu-host unloads it.
    /// Models configured in gateway.toml are removed there instead.
    Unregister {
        /// The model's name.
        name: String,
        #[command(flatten)]
        remote: super::model_api::Remote,
    },
    /// List a running gateway's registered models and their state
    List {
        #[command(flatten)]
        remote: super::model_api::Remote,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Kind {
    P256,
    Ed25519,
}

pub(super) fn run(args: ModelArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ModelCommand::Keygen { out, kind } => keygen(&out, kind),
        ModelCommand::Sign {
            dir,
            key,
            signature,
        } => sign(&dir, &key, &signature),
        ModelCommand::Verify {
            dir,
            signature,
            public_key,
        } => verify(&dir, &signature, &public_key),
        ModelCommand::Register {
            dir,
            signature,
            name,
            file,
            remote,
        } => super::model_api::register(&remote, &dir, &signature, &name, file.as_deref()),
        ModelCommand::Unregister { name, remote } => super::model_api::unregister(&remote, &name),
        ModelCommand::List { remote } => super::model_api::list(&remote),
    }
}

/// KEY.pem → KEY.pub.pem; any other name gets `.pub.pem` appended.
fn public_path(private: &Path) -> PathBuf {
    let text = private.as_os_str().to_string_lossy();
    match text.strip_suffix(".pem") {
        Some(stem) if !stem.is_empty() && !stem.ends_with('/') => {
            PathBuf::from(format!("{stem}.pub.pem"))
        }
        _ => {
            let mut path = private.as_os_str().to_owned();
            path.push(".pub.pem");
            PathBuf::from(path)
        }
    }
}

fn keygen(out: &Path, kind: Kind) -> anyhow::Result<ExitCode> {
    let public = public_path(out);
    for path in [out, public.as_path()] {
        if path.symlink_metadata().is_ok() {
            bail!("{} exists; not overwriting it", path.display());
        }
    }
    let key = SigningKey::generate(match kind {
        Kind::P256 => KeyKind::P256,
        Kind::Ed25519 => KeyKind::Ed25519,
    });
    write_new(out, key.to_pkcs8_pem()?.as_bytes(), 0o600)?;
    if let Err(e) = write_new(&public, key.public_key().to_spki_pem().as_bytes(), 0o644) {
        // Leave no private key without its public half.
        let _ = std::fs::remove_file(out);
        return Err(e);
    }
    eprintln!(
        "wrote {} ({} private key) and {}",
        out.display(),
        key.kind(),
        public.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn sign(dir: &Path, key: &Path, signature: &Path) -> anyhow::Result<ExitCode> {
    let key = SigningKey::from_pem_file(key)?;
    let manifest = Manifest::of_dir(dir, &DirOptions::with_signature(signature))?;
    let bundle = manifest.sign(&key);
    // Written whole under a temporary name, then renamed: a reader never
    // sees half a signature.
    let mut tmp = signature.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, &bundle)
        .and_then(|()| std::fs::rename(&tmp, signature))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
        .with_context(|| format!("cannot write {}", signature.display()))?;
    let bytes: u64 = manifest.files.iter().map(|f| f.digest.size).sum();
    eprintln!(
        "signed {} files ({bytes} bytes) of {} ({} key): subject sha256:{}; wrote {}",
        manifest.files.len(),
        dir.display(),
        key.kind(),
        to_hex(&manifest.subject_digest()),
        signature.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn verify(dir: &Path, signature: &Path, public_key: &Path) -> anyhow::Result<ExitCode> {
    let key = PublicKey::from_pem_file(public_key)?;
    let bundle = read_bundle_file(signature)?;
    match verify_dir(dir, &bundle, &key, &DirOptions::with_signature(signature)) {
        Ok(verified) => {
            let chunked = verified
                .files
                .iter()
                .filter(|f| f.chunk_root.is_some())
                .count();
            println!(
                "verified: {} matches {} ({} files, {chunked} with chunk roots; subject sha256:{}; {} key sha256:{})",
                dir.display(),
                signature.display(),
                verified.files.len(),
                to_hex(&verified.subject_digest),
                key.kind(),
                key.hint()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{}: verification failed: {e}", dir.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_key_goes_beside_the_private_one() {
        assert_eq!(public_path(Path::new("k.pem")), Path::new("k.pub.pem"));
        assert_eq!(
            public_path(Path::new("/a/b/key.pem")),
            Path::new("/a/b/key.pub.pem")
        );
        assert_eq!(public_path(Path::new("key")), Path::new("key.pub.pem"));
        assert_eq!(
            public_path(Path::new("x/.pem")),
            Path::new("x/.pem.pub.pem")
        );
    }
}
