//! The files the settings name: the password (`password_file`) and the
//! CA certificates (`tls_ca`). Size-capped; errors never show the password.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::StateError;

/// A password file holds one password; anything bigger is the wrong file.
const MAX_PASSWORD_FILE_BYTES: u64 = 4096;
/// A CA bundle the size of a system one at most.
const MAX_TLS_CA_BYTES: u64 = 1 << 20;

/// The password in `path`, without one trailing newline.
pub(super) fn read_password(path: &Path) -> Result<Vec<u8>, StateError> {
    let bad = |why: &str| StateError::Config {
        key: "password_file",
        why: format!("{}: {why}", path.display()),
    };
    let mut bytes = read_capped(path, MAX_PASSWORD_FILE_BYTES).map_err(|why| bad(&why))?;
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    if bytes.is_empty() {
        return Err(bad("is empty: write the database user's password into it"));
    }
    if bytes.iter().any(|b| matches!(b, b'\n' | b'\r' | 0)) {
        return Err(bad(
            "holds more than one line (or a NUL byte): write only the password (one \
             trailing newline is fine)",
        ));
    }
    Ok(bytes)
}

/// The certificates in the PEM file `path` (at least one).
pub(super) fn read_tls_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, StateError> {
    let bad = |why: String| StateError::Config {
        key: "tls_ca",
        why: format!("{}: {why}", path.display()),
    };
    let pem = read_capped(path, MAX_TLS_CA_BYTES).map_err(bad)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_string(),
        ));
    }
    Ok(certs)
}

/// The bytes of the regular file `path` if it has at most `max`, or why not.
fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let meta = fs::metadata(path).map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".to_string());
    }
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|file| file.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("is larger than {max} bytes"));
    }
    Ok(bytes)
}
