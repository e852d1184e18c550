//! Reading the secret and certificate files policy names: size-capped,
//! and errors that never show a secret.

use super::*;

/// Largest certificate or key file read (`[upstream]` TLS, `[limits] tls_ca`).
pub(super) const MAX_TLS_FILE_BYTES: u64 = 1 << 20;

/// The file's bytes, at most `max`, or why not.
pub(super) fn read_capped_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let meta = fs::metadata(path).map_err(|e| io_reason(&e))?;
    if !meta.is_file() || meta.len() > max {
        return Err(format!("is not a regular file of at most {max} bytes"));
    }
    fs::read(path).map_err(|e| io_reason(&e))
}

/// The secret in `file`, without its trailing newline. Errors never show it.
pub(super) fn read_secret(
    dir: &Path,
    source: &SourceFile,
    file: &Spanned<PathBuf>,
    errors: &mut Vec<PolicyError>,
) -> Option<String> {
    let path = dir.join(file.get_ref());
    read_secret_file(&path)
        .map_err(|why| {
            let message = format!("secret file {}: {why}", path.display());
            errors.push(source.error_at(file.span(), message));
        })
        .ok()
}

/// The secret, or why not (in words that do not include it).
fn read_secret_file(path: &Path) -> Result<String, String> {
    let meta = fs::metadata(path).map_err(|e| io_reason(&e))?;
    if !meta.is_file() || meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(format!(
            "is not a secret file (a regular file of at most {MAX_SECRET_FILE_BYTES} bytes)"
        ));
    }
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(MAX_SECRET_FILE_BYTES).read_to_end(&mut bytes))
        .map_err(|e| io_reason(&e))?;
    let text = String::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.len() < MIN_SECRET_BYTES {
        return Err(format!("holds fewer than {MIN_SECRET_BYTES} bytes"));
    }
    Ok(secret.to_string())
}
