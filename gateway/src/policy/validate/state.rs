//! `[state]` of `gateway.toml`: where the control-plane state lives.

use super::limit_store::printable;
use super::*;
use bulkhead_state::{PgSettings, StateError};

/// `None`: the file stores (the default); otherwise the PostgreSQL
/// settings, paths resolved against the policy folder and checked
/// (without connecting).
pub(super) fn check_state(
    dir: &Path,
    source: &SourceFile,
    file: Option<&StateFile>,
    errors: &mut Vec<PolicyError>,
) -> Option<PgSettings> {
    let file = file?;
    let url = match &file.store {
        None => None,
        Some(store) if store.get_ref() == "files" => None,
        Some(store) => Some(store),
    };
    let Some(url) = url else {
        let stray = [
            (
                "password_file",
                file.password_file.as_ref().map(Spanned::span),
            ),
            ("tls_ca", file.tls_ca.as_ref().map(Spanned::span)),
            ("schema", file.schema.as_ref().map(Spanned::span)),
            ("pool_size", file.pool_size.as_ref().map(Spanned::span)),
            (
                "connect_timeout_ms",
                file.connect_timeout_ms.as_ref().map(Spanned::span),
            ),
            (
                "statement_timeout_ms",
                file.statement_timeout_ms.as_ref().map(Spanned::span),
            ),
        ];
        for (key, span) in stray.into_iter().filter_map(|(k, s)| Some((k, s?))) {
            errors.push(source.error_at(
                span,
                format!(
                    "`{key}` applies to a PostgreSQL state store; `store` is \"files\" (set \
                     store = \"postgres://USER@HOST:PORT/DATABASE\" to share state)"
                ),
            ));
        }
        return None;
    };
    let text = url.get_ref();
    if !text.starts_with("postgres://") && !text.starts_with("postgresql://") {
        errors.push(source.error_at(
            url.span(),
            format!(
                "`store` is `{}`: expected \"files\" or \"postgres://USER@HOST:PORT/DATABASE\"",
                printable(text)
            ),
        ));
        return None;
    }
    let mut settings = PgSettings::new(text.clone());
    settings.password_file = file
        .password_file
        .as_ref()
        .map(|f| lexically_normal(&dir.join(f.get_ref())));
    settings.tls_ca = file
        .tls_ca
        .as_ref()
        .map(|f| lexically_normal(&dir.join(f.get_ref())));
    if let Some(schema) = &file.schema {
        settings.schema = schema.get_ref().clone();
    }
    if let Some(n) = &file.pool_size {
        settings.pool_size = *n.get_ref();
    }
    if let Some(ms) = &file.connect_timeout_ms {
        settings.connect_timeout_ms = *ms.get_ref();
    }
    if let Some(ms) = &file.statement_timeout_ms {
        settings.statement_timeout_ms = *ms.get_ref();
    }
    match settings.validate() {
        Ok(()) => Some(settings),
        Err(StateError::Config { key, why }) => {
            let span = match key {
                "password_file" => file.password_file.as_ref().map(Spanned::span),
                "tls_ca" => file.tls_ca.as_ref().map(Spanned::span),
                "schema" => file.schema.as_ref().map(Spanned::span),
                "pool_size" => file.pool_size.as_ref().map(Spanned::span),
                "connect_timeout_ms" => file.connect_timeout_ms.as_ref().map(Spanned::span),
                "statement_timeout_ms" => file.statement_timeout_ms.as_ref().map(Spanned::span),
                _ => Some(url.span()),
            };
            let message = format!("`[state]` `{key}`: {why}");
            errors.push(match span {
                Some(span) => source.error_at(span, message),
                None => source.error(message),
            });
            None
        }
        Err(other) => {
            errors.push(source.error_at(url.span(), format!("`[state]`: {other}")));
            None
        }
    }
}

/// `[audit]`: the log folder (required, outside the watched policy folder,
/// like the plugin store) unless the log is `in_database`, where the key
/// is required instead; the key path and the origin.
pub(super) fn check_audit(
    dir: &Path,
    source: &SourceFile,
    audit: &AuditGatewayFile,
    in_database: bool,
    errors: &mut Vec<PolicyError>,
) -> crate::audit::AuditSettings {
    let mut settings = crate::audit::AuditSettings::new(PathBuf::new());
    if let Some(key) = &audit.key {
        settings.key = Some(lexically_normal(&dir.join(key.get_ref())));
    }
    if in_database {
        // The log lives in the database; every replica signs it with the
        // same key, which therefore cannot be generated here.
        if let Some(log) = &audit.dir {
            errors.push(source.error_at(
                log.span(),
                "with `[state] store = \"postgres://...\"` the audit log lives in the \
                 database: remove `dir`",
            ));
        }
        if audit.key.is_none() {
            errors.push(source.error(
                "`[audit]` needs `key` with a PostgreSQL `[state]` store: the Ed25519 PEM \
                 file every replica signs checkpoints with (`openssl genpkey -algorithm \
                 ed25519 -out audit.key.pem`)",
            ));
        }
    } else {
        match &audit.dir {
            None => errors.push(source.error(
                "`[audit]` needs `dir`: the folder of the audit log, e.g. \"../var/audit\"",
            )),
            Some(log) if log.get_ref().as_os_str().is_empty() => errors.push(source.error_at(
                log.span(),
                "`dir` is empty: name a folder for the audit log, e.g. \"../var/audit\"",
            )),
            Some(log) => {
                let path = lexically_normal(&dir.join(log.get_ref()));
                if path.starts_with(lexically_normal(dir)) {
                    errors.push(source.error_at(
                        log.span(),
                        format!(
                            "the audit log {} is inside the policy folder, which is watched \
                             for changes: put it outside, e.g. \"../var/audit\"",
                            path.display()
                        ),
                    ));
                }
                settings.dir = path;
            }
        }
    }
    if let Some(origin) = &audit.origin {
        if crate::audit::valid_origin(origin.get_ref()) {
            settings.origin = origin.get_ref().clone();
        } else {
            errors.push(source.error_at(
                origin.span(),
                format!(
                    "`origin` \"{}\" is not a checkpoint origin: 1 to 256 bytes, no spaces, \
                     no `+`, e.g. \"example.com/bulkhead/audit\"",
                    origin.get_ref().escape_debug()
                ),
            ));
        }
    }
    settings
}
