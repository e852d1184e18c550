//! The bearer secret clients present on TCP, checked in a tonic interceptor
//! with a constant-time comparison (`subtle`), and never printed.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use bulkhead_protocol::AUTHORIZATION;
use subtle::ConstantTimeEq;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Shortest secret accepted: anything shorter is guessable.
pub const MIN_SECRET_BYTES: usize = 16;
/// Longest secret file read.
const MAX_SECRET_FILE_BYTES: u64 = 4096;

/// A shared bearer secret. `Debug` shows only its length.
#[derive(Clone)]
pub struct AuthSecret(Arc<[u8]>);

impl fmt::Debug for AuthSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthSecret(<{} bytes>)", self.0.len())
    }
}

/// Why a secret file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: the secret must be {MIN_SECRET_BYTES}..{MAX_SECRET_FILE_BYTES} bytes of printable ASCII (one line)"
    )]
    Malformed { path: String },
}

impl AuthSecret {
    /// Reads a secret file: one line of printable ASCII, surrounding whitespace ignored.
    pub fn from_file(path: &Path) -> Result<AuthSecret, SecretError> {
        let shown = path.display().to_string();
        let read = |source| SecretError::Read {
            path: shown.clone(),
            source,
        };
        let len = std::fs::metadata(path).map_err(read)?.len();
        if len > MAX_SECRET_FILE_BYTES {
            return Err(SecretError::Malformed { path: shown });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        let secret = text.trim();
        if secret.len() < MIN_SECRET_BYTES || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SecretError::Malformed { path: shown });
        }
        Ok(AuthSecret(secret.as_bytes().into()))
    }
}

/// Requires `authorization: Bearer <secret>` when a secret is configured.
#[derive(Clone, Debug)]
pub(crate) struct BearerAuth {
    secret: Option<AuthSecret>,
}

impl BearerAuth {
    pub(crate) fn new(secret: Option<AuthSecret>) -> BearerAuth {
        BearerAuth { secret }
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(secret) = &self.secret else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            // `ct_eq` on slices takes time independent of the contents (it
            // returns early only on a length mismatch, which reveals the length).
            Some(token) if bool::from(token.as_bytes().ct_eq(&secret.0)) => Ok(request),
            Some(_) => Err(Status::unauthenticated("the bearer secret is wrong")),
            None => Err(Status::unauthenticated(
                "missing `authorization: Bearer <secret>` metadata",
            )),
        }
    }
}
