//! What a tenant's plugin signing key signs: not the component's bytes
//! alone, which could be replayed under another plugin name or rolled back
//! to an older version, but a statement binding the tenant, the plugin's
//! name, a version that must grow, and the bytes' SHA-256:
//!
//! ```text
//! bulkhead-plugin-upload-v1
//! tenant acme
//! name pii-redact
//! version 7
//! sha256 3f9c…(64 hex digits)
//! ```
//!
//! (each line ends with `\n`), signed with Ed25519. The upload carries the
//! signature (base64) in `x-bulkhead-signature` and the version (decimal)
//! in `x-bulkhead-plugin-version`; `bulkhead plugin sign` makes both.

use super::{PluginDigest, PluginName};

/// The header with the base64 Ed25519 signature.
pub const SIGNATURE_HEADER: &str = "x-bulkhead-signature";
/// The header with the signed version (1 or more, decimal).
pub const VERSION_HEADER: &str = "x-bulkhead-plugin-version";

/// The statement a tenant's plugin signing key signs.
pub fn signed_statement(
    tenant: &str,
    name: &PluginName,
    version: u64,
    digest: &PluginDigest,
) -> Vec<u8> {
    format!(
        "bulkhead-plugin-upload-v1\ntenant {tenant}\nname {name}\nversion {version}\nsha256 {digest}\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_names_tenant_plugin_version_and_bytes() {
        let digest = PluginDigest::of(b"component");
        let name = PluginName::parse("guard").unwrap();
        let text = String::from_utf8(signed_statement("acme", &name, 7, &digest)).unwrap();
        assert_eq!(
            text,
            format!(
                "bulkhead-plugin-upload-v1\ntenant acme\nname guard\nversion 7\nsha256 {digest}\n"
            )
        );
        assert_eq!(digest.to_string().len(), 64);
        // Any field changed is another statement.
        let other = PluginName::parse("other").unwrap();
        assert_ne!(
            signed_statement("acme", &name, 7, &digest),
            signed_statement("acme", &other, 7, &digest)
        );
        assert_ne!(
            signed_statement("acme", &name, 7, &digest),
            signed_statement("beta", &name, 7, &digest)
        );
        assert_ne!(
            signed_statement("acme", &name, 7, &digest),
            signed_statement("acme", &name, 6, &digest)
        );
    }
}
