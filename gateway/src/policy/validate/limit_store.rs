//! `[limits]` of `gateway.toml`: the limit store.

use super::secrets::{MAX_TLS_FILE_BYTES, read_capped_file, read_secret};
use super::*;
use crate::limits::{LimitStore, OnStoreError, RedisStore};
use redis::IntoConnectionInfo;

/// Longest `store_timeout_ms`: past it a dead store would stall requests.
const MAX_STORE_TIMEOUT_MS: u64 = 1000;
const LEASE_TTL_MS: std::ops::RangeInclusive<u64> = 100..=600_000;
const MAX_REPLICAS: u32 = 1000;
const MAX_KEY_PREFIX_BYTES: usize = 64;

pub(super) fn check_limit_store(
    dir: &Path,
    source: &SourceFile,
    file: Option<&LimitStoreFile>,
    errors: &mut Vec<PolicyError>,
) -> LimitStore {
    let Some(file) = file else {
        return LimitStore::Memory;
    };
    let before = errors.len();
    let url = match &file.store {
        None => None,
        Some(store) if store.get_ref() == "memory" => None,
        Some(store) => Some(store),
    };
    let Some(url) = url else {
        // The memory store takes no other key: one set means the operator
        // meant a shared store.
        let stray = [
            (
                "password_file",
                file.password_file.as_ref().map(Spanned::span),
            ),
            ("tls_ca", file.tls_ca.as_ref().map(Spanned::span)),
            ("key_prefix", file.key_prefix.as_ref().map(Spanned::span)),
            ("replicas", file.replicas.as_ref().map(Spanned::span)),
            (
                "on_store_error",
                file.on_store_error.as_ref().map(Spanned::span),
            ),
            (
                "store_timeout_ms",
                file.store_timeout_ms.as_ref().map(Spanned::span),
            ),
            (
                "lease_ttl_ms",
                file.lease_ttl_ms.as_ref().map(Spanned::span),
            ),
        ];
        for (key, span) in stray {
            if let Some(span) = span {
                errors.push(source.error_at(
                    span,
                    format!(
                        "`{key}` applies to a Redis limit store; `store` is \"memory\" \
                         (set store = \"redis://HOST:PORT/DB\" to share limits)"
                    ),
                ));
            }
        }
        return LimitStore::Memory;
    };

    let text = url.get_ref();
    let tls = text.starts_with("rediss://");
    if !tls && !text.starts_with("redis://") {
        errors.push(source.error_at(
            url.span(),
            format!(
                "`store` is `{}`: expected \"memory\", \"redis://HOST:PORT/DB\" or \
                 \"rediss://HOST:PORT/DB\"",
                printable(text)
            ),
        ));
    } else {
        match text.as_str().into_connection_info() {
            Err(e) => {
                errors.push(source.error_at(url.span(), format!("`store` is not a Redis URL: {e}")))
            }
            Ok(info) if info.redis_settings().password().is_some() => {
                errors.push(source.error_at(
                    url.span(),
                    "`store` holds a password: put it in `password_file` instead (policy \
                     files are hashed into the audit log and read by many)",
                ));
            }
            Ok(_) => {}
        }
    }
    let password = file
        .password_file
        .as_ref()
        .and_then(|f| read_secret(dir, source, f, errors));
    let tls_ca = match (&file.tls_ca, tls) {
        (None, _) => None,
        (Some(ca), false) => {
            errors.push(source.error_at(
                ca.span(),
                "`tls_ca` needs a `rediss://` store (TLS); this one is `redis://`",
            ));
            None
        }
        (Some(ca), true) => {
            let path = dir.join(ca.get_ref());
            match read_capped_file(&path, MAX_TLS_FILE_BYTES) {
                Ok(pem) if contains(&pem, b"-----BEGIN CERTIFICATE-----") => Some(pem),
                Ok(_) => {
                    errors.push(source.error_at(
                        ca.span(),
                        format!("{}: holds no PEM certificate", path.display()),
                    ));
                    None
                }
                Err(why) => {
                    errors.push(source.error_at(ca.span(), format!("{}: {why}", path.display())));
                    None
                }
            }
        }
    };
    let key_prefix = match &file.key_prefix {
        None => RedisStore::DEFAULT_KEY_PREFIX.to_string(),
        Some(prefix) => {
            let text = prefix.get_ref();
            let allowed = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
            if text.is_empty() || text.len() > MAX_KEY_PREFIX_BYTES || !text.chars().all(allowed) {
                errors.push(source.error_at(
                    prefix.span(),
                    format!(
                        "`key_prefix` is `{}`: 1 to {MAX_KEY_PREFIX_BYTES} of A-Z a-z 0-9 _ - . :",
                        printable(text)
                    ),
                ));
            }
            text.clone()
        }
    };
    let on_error = match &file.on_store_error {
        None => OnStoreError::Local,
        Some(mode) => match mode.get_ref().as_str() {
            "local" => OnStoreError::Local,
            "deny" => OnStoreError::Deny,
            other => {
                errors.push(source.error_at(
                    mode.span(),
                    format!(
                        "`on_store_error` is `{}`: expected \"local\" (fall back to this \
                         replica's share of the limits) or \"deny\" (answer 503)",
                        printable(other)
                    ),
                ));
                OnStoreError::Local
            }
        },
    };
    let replicas = match &file.replicas {
        Some(n) if (1..=MAX_REPLICAS).contains(n.get_ref()) => *n.get_ref(),
        Some(n) => {
            errors.push(source.error_at(
                n.span(),
                format!("`replicas` is {}; 1 to {MAX_REPLICAS}", n.get_ref()),
            ));
            1
        }
        None if on_error == OnStoreError::Local => {
            errors.push(source.error_at(
                url.span(),
                "a Redis store with on_store_error = \"local\" needs `replicas`: while Redis \
                 is down each replica admits 1/replicas of every tenant's limits (with an \
                 autoscaler, its maximum)",
            ));
            1
        }
        None => 1,
    };
    let timeout_ms = match &file.store_timeout_ms {
        None => RedisStore::DEFAULT_TIMEOUT.as_millis() as u64,
        Some(ms) if (1..=MAX_STORE_TIMEOUT_MS).contains(ms.get_ref()) => *ms.get_ref(),
        Some(ms) => {
            errors.push(source.error_at(
                ms.span(),
                format!(
                    "`store_timeout_ms` is {}; 1 to {MAX_STORE_TIMEOUT_MS} (every request may \
                     wait this long on a store that stopped answering)",
                    ms.get_ref()
                ),
            ));
            1
        }
    };
    let lease_ttl_ms = match &file.lease_ttl_ms {
        None => RedisStore::DEFAULT_LEASE_TTL.as_millis() as u64,
        Some(ms) if LEASE_TTL_MS.contains(ms.get_ref()) => *ms.get_ref(),
        Some(ms) => {
            errors.push(source.error_at(
                ms.span(),
                format!(
                    "`lease_ttl_ms` is {}; {} to {} (a dead replica's requests hold their \
                     slots this long)",
                    ms.get_ref(),
                    LEASE_TTL_MS.start(),
                    LEASE_TTL_MS.end()
                ),
            ));
            *LEASE_TTL_MS.start()
        }
    };
    if errors.len() > before {
        return LimitStore::Memory;
    }
    LimitStore::Redis(RedisStore {
        url: text.clone(),
        password,
        tls_ca,
        key_prefix,
        replicas,
        on_error,
        timeout: Duration::from_millis(timeout_ms),
        lease_ttl: Duration::from_millis(lease_ttl_ms),
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `text` for an error message: at most 80 characters, control characters
/// escaped.
pub(super) fn printable(text: &str) -> String {
    let mut shown: String = text.chars().take(80).flat_map(char::escape_debug).collect();
    if text.chars().count() > 80 {
        shown.push('…');
    }
    shown
}
