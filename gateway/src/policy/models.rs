//! The models gateway.toml configures (`[[local_gpu_host.models]]`,
//! `[[upstream.models]]`): each a signed model folder whose signature must
//! verify with a publisher's key in `trust.toml`. Checked with the policy,
//! so `bulkhead policy check` names a model whose signature does not
//! verify; the weights themselves are hashed by the gpu-host when it loads
//! them (hashing gigabytes at every reload would be too slow).

use std::collections::BTreeMap;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::Spanned;

use super::files::ModelFile;
use super::files::io_reason;
use super::{PolicyError, SourceFile};
use crate::registration::Trust;
use crate::registration::{
    Claim, MODEL_NAME_RULE, Registration, RegistrationError, Source, valid_model_name, verify,
};
use crate::signing::{ModelError, read_bundle_file};

/// Where the configured models' gpu-host runs, which decides what can be
/// checked here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HostKind {
    /// The local child: its folders are ours to check and resolve.
    Local,
    /// A remote gpu-host: `dir` is a path on its machine, taken as written.
    Remote,
}

/// Most configured models.
pub const MAX_CONFIGURED_MODELS: usize = 256;

/// Checks every entry and returns the registrations that verified.
pub(super) fn check_models(
    dir: &Path,
    source: &SourceFile,
    models: &[ModelFile],
    trust: &Trust,
    host: HostKind,
    errors: &mut Vec<PolicyError>,
) -> Vec<Arc<Registration>> {
    if models.len() > MAX_CONFIGURED_MODELS {
        errors.push(source.error(format!(
            "{} models are configured; at most {MAX_CONFIGURED_MODELS} may be",
            models.len()
        )));
        return Vec::new();
    }
    let mut first_seen: BTreeMap<&str, Range<usize>> = BTreeMap::new();
    let mut resolved = Vec::new();
    for model in models {
        let name = model.name.get_ref();
        if !valid_model_name(name) {
            errors.push(source.error_at(
                model.name.span(),
                format!(
                    "model name `{}` is not valid: {MODEL_NAME_RULE}",
                    name.escape_debug()
                ),
            ));
            continue;
        }
        if let Some(first) = first_seen.get(name.as_str()) {
            let (line, _) = source.line_col(first.start);
            errors.push(source.error_at(
                model.name.span(),
                format!("model `{name}` is already defined on line {line}"),
            ));
            continue;
        }
        first_seen.insert(name, model.name.span());
        if let Some(registration) = check_model(dir, source, model, trust, host, errors) {
            resolved.push(Arc::new(registration));
        }
    }
    resolved
}

fn check_model(
    dir: &Path,
    source: &SourceFile,
    model: &ModelFile,
    trust: &Trust,
    host: HostKind,
    errors: &mut Vec<PolicyError>,
) -> Option<Registration> {
    let name = model.name.get_ref();
    if let Some(path) = &model.path {
        errors.push(source.error_at(
            path.span(),
            format!(
                "model `{name}`: `path` is no longer accepted: the gateway serves only signed \
                 models. Put the GGUF in a folder of its own, sign it (`bulkhead model keygen \
                 --out KEY.pem`, then `bulkhead model sign DIR --key KEY.pem --signature \
                 DIR.sig`), list KEY.pub.pem under [[publishers]] in trust.toml, and write \
                 `dir = \"DIR\"` and `signature = \"DIR.sig\"` here"
            ),
        ));
        return None;
    }
    let (Some(model_dir), Some(signature)) = (&model.dir, &model.signature) else {
        errors.push(source.error_at(
            model.name.span(),
            format!(
                "model `{name}` needs `dir` (the signed model folder) and `signature` (its \
                 signature bundle, from `bulkhead model sign`)"
            ),
        ));
        return None;
    };
    let folder = check_folder(dir, source, name, model_dir, host, errors)?;
    let signature_path = dir.join(signature.get_ref());
    let bundle = match read_bundle_file(&signature_path) {
        Ok(bundle) => bundle,
        Err(e) => {
            let why = match &e {
                ModelError::Io { source, .. } => io_reason(source),
                other => other.to_string(),
            };
            errors.push(source.error_at(
                signature.span(),
                format!(
                    "model `{name}`: signature {}: {why}",
                    signature_path.display()
                ),
            ));
            return None;
        }
    };
    let claim = Claim {
        name,
        dir: &folder,
        file: model.file.as_ref().map(|f| f.get_ref().as_str()),
        bundle: &bundle,
    };
    let registration = match verify(trust, &claim, Source::Policy) {
        Ok(registration) => registration,
        Err(e) => {
            // A wrong `file` points at `file`; everything else is about the
            // signature.
            let span = match (&e, &model.file) {
                (RegistrationError::File(_), Some(file)) => file.span(),
                _ => signature.span(),
            };
            errors.push(source.error_at(span, format!("model `{name}`: {e}")));
            return None;
        }
    };
    if host == HostKind::Local {
        check_weights(source, &registration, model, model_dir, errors);
    }
    Some(registration)
}

/// The model folder: for the local child, an existing folder, resolved
/// (absolute, no `..`, symlinks followed) so the child reads what was
/// checked; for a remote host, an absolute path taken as written.
fn check_folder(
    dir: &Path,
    source: &SourceFile,
    name: &str,
    model_dir: &Spanned<PathBuf>,
    host: HostKind,
    errors: &mut Vec<PolicyError>,
) -> Option<PathBuf> {
    let written = model_dir.get_ref();
    if host == HostKind::Remote {
        if !written.is_absolute() {
            errors.push(source.error_at(
                model_dir.span(),
                format!(
                    "model `{name}`: `dir` must be absolute with a remote gpu-host: it is a \
                     folder on that host's machine"
                ),
            ));
            return None;
        }
        return Some(written.clone());
    }
    let path = dir.join(written);
    let fail = |why: String| {
        source.error_at(
            model_dir.span(),
            format!("model `{name}`: model folder {}: {why}", path.display()),
        )
    };
    match fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            errors.push(fail("is not a folder".to_string()));
            return None;
        }
        Err(e) => {
            errors.push(fail(io_reason(&e)));
            return None;
        }
    }
    match fs::canonicalize(&path) {
        Ok(resolved) => Some(resolved),
        Err(e) => {
            errors.push(fail(io_reason(&e)));
            None
        }
    }
}

/// The local weights file exists and has the signed size. Its bytes are
/// checked by the gpu-host as it loads them.
fn check_weights(
    source: &SourceFile,
    registration: &Registration,
    model: &ModelFile,
    model_dir: &Spanned<PathBuf>,
    errors: &mut Vec<PolicyError>,
) {
    let name = &registration.name;
    let path = registration.path();
    let span = model.file.as_ref().map_or(model_dir.span(), Spanned::span);
    let why = match fs::metadata(&path) {
        Ok(meta) if !meta.is_file() => "is not a regular file".to_string(),
        Ok(meta) => match registration.file.size {
            Some(signed) if signed != meta.len() => {
                format!("is {} bytes but was signed as {signed} bytes", meta.len())
            }
            _ => return,
        },
        Err(e) => io_reason(&e),
    };
    errors.push(source.error_at(
        span,
        format!("model `{name}`: weights file {}: {why}", path.display()),
    ));
}
