//! TLS to PostgreSQL on rustls with the `ring` provider (the one the rest
//! of the tree uses): `verify-full` checks the chain and the host name;
//! `prefer` and `require`, as in libpq, encrypt without checking who
//! answers.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::StateError;
use crate::settings::SslMode;

/// The TLS connector for `mode`; `tls_ca` (for `verify-full`) replaces the
/// system's roots.
pub(crate) fn connector(
    mode: SslMode,
    tls_ca: Option<Vec<CertificateDer<'static>>>,
) -> Result<MakeRustlsConnect, StateError> {
    // An explicit provider: the process-wide default may be unset, or
    // ambiguous if another crate enables a second one.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StateError::Config {
            key: "url",
            why: format!("TLS cannot be set up: {e}"),
        })?;
    let config = match mode {
        SslMode::VerifyFull => builder
            .with_root_certificates(roots(tls_ca)?)
            .with_no_client_auth(),
        // `disable` never uses the connector; it still needs one of the type.
        SslMode::Disable | SslMode::Prefer | SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

/// `tls_ca`'s certificates, or the system's trusted roots.
fn roots(tls_ca: Option<Vec<CertificateDer<'static>>>) -> Result<RootCertStore, StateError> {
    let mut roots = RootCertStore::empty();
    if let Some(certs) = tls_ca {
        for cert in certs {
            roots.add(cert).map_err(|e| StateError::Config {
                key: "tls_ca",
                why: format!("holds a certificate rustls cannot use as a root: {e}"),
            })?;
        }
        return Ok(roots);
    }
    let native = rustls_native_certs::load_native_certs();
    let (added, _unusable) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        let errors: Vec<String> = native.errors.iter().map(ToString::to_string).collect();
        return Err(StateError::Config {
            key: "tls_ca",
            why: format!(
                "is unset and the system has no trusted roots for sslmode=verify-full ({}): \
                 set `tls_ca` to the CA that signs the server's certificate",
                if errors.is_empty() {
                    "none found".to_string()
                } else {
                    errors.join("; ")
                }
            ),
        });
    }
    Ok(roots)
}

/// Accepts any certificate but still checks the handshake's signatures
/// (so the session key belongs to whoever holds that certificate): what
/// `sslmode=prefer` and `require` promise, no more.
#[derive(Debug)]
struct EncryptOnly(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
