//! The `url` setting: tokio-postgres's own URL parser, with `sslmode`
//! (which it knows only up to `require`) taken out first, and the libpq
//! environment filling in what the URL leaves out.

use super::SslMode;
use crate::StateError;
use crate::error::error_text;

const SCHEMES: [&str; 2] = ["postgres://", "postgresql://"];

/// The URL's connection config (no password: one is refused) and its `sslmode`.
pub(super) fn parse(url: &str) -> Result<(tokio_postgres::Config, SslMode), StateError> {
    let bad = |why: String| StateError::Config { key: "url", why };
    if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
        return Err(bad(format!(
            "`{}` is not a PostgreSQL URL: write postgres://USER@HOST:PORT/DATABASE",
            redact(url).escape_debug()
        )));
    }
    let (rest, ssl_mode) = take_sslmode(url)?;
    let config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| bad(format!("is not a valid PostgreSQL URL: {}", error_text(&e))))?;
    if config.get_password().is_some() {
        return Err(bad(
            "holds a password: put it in `password_file` instead (config files are read by \
             many; the password file can be a mounted secret)"
                .to_string(),
        ));
    }
    if config.get_connect_timeout().is_some() {
        return Err(bad(
            "sets connect_timeout: set `connect_timeout_ms` instead".to_string(),
        ));
    }
    Ok((config, ssl_mode))
}

/// `url` without its `sslmode` parameter, and that mode (`prefer`, as in
/// libpq, when absent).
fn take_sslmode(url: &str) -> Result<(String, SslMode), StateError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), SslMode::Prefer));
    };
    let mut mode = None;
    let mut kept = Vec::new();
    for param in query.split('&') {
        let Some(value) = param.strip_prefix("sslmode=") else {
            kept.push(param);
            continue;
        };
        if mode.is_some() {
            return Err(StateError::Config {
                key: "url",
                why: "sets sslmode twice: keep one".to_string(),
            });
        }
        mode = Some(ssl_mode(value)?);
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, mode.unwrap_or(SslMode::Prefer)))
}

fn ssl_mode(value: &str) -> Result<SslMode, StateError> {
    let why = match value {
        "disable" => return Ok(SslMode::Disable),
        "prefer" => return Ok(SslMode::Prefer),
        "require" => return Ok(SslMode::Require),
        "verify-full" => return Ok(SslMode::VerifyFull),
        "allow" => "sslmode=allow is not supported: use prefer (TLS when offered)".to_string(),
        "verify-ca" => "sslmode=verify-ca is not supported: use verify-full (it also checks \
                        the host name)"
            .to_string(),
        other => format!(
            "sslmode=`{}` is not one of disable, prefer, require, verify-full",
            other.escape_debug()
        ),
    };
    Err(StateError::Config { key: "url", why })
}

/// `PGHOST`, `PGPORT`, `PGUSER` and `PGDATABASE` where the URL is silent
/// (see the module docs of `settings` for the order).
pub(super) fn fill_from_env(
    config: &mut tokio_postgres::Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), StateError> {
    if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
        let Some(hosts) = env("PGHOST") else {
            return Err(StateError::Config {
                key: "url",
                why: "names no host and PGHOST is unset: write postgres://USER@HOST:PORT/DATABASE"
                    .to_string(),
            });
        };
        for host in hosts.split(',') {
            config.host(host);
        }
        if config.get_ports().is_empty()
            && let Some(ports) = env("PGPORT")
        {
            for port in ports.split(',') {
                let port = port.trim().parse().map_err(|_| StateError::Config {
                    key: "PGPORT",
                    why: format!(
                        "`{}` is not a port (1 to 65535, comma-separated for several hosts)",
                        ports.escape_debug()
                    ),
                })?;
                config.port(port);
            }
        }
    }
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    let ports = config.get_ports().len();
    if ports > 1 && ports != hosts {
        return Err(StateError::Config {
            key: "url",
            why: format!("names {hosts} host(s) and {ports} ports: give one port, or one per host"),
        });
    }
    if config.get_user().is_none() {
        let Some(user) = env("PGUSER") else {
            return Err(StateError::Config {
                key: "url",
                why: "names no user and PGUSER is unset: write postgres://USER@HOST:PORT/DATABASE"
                    .to_string(),
            });
        };
        config.user(user);
    }
    if config.get_dbname().is_none() {
        // PostgreSQL's own default: the database named like the user.
        let dbname = env("PGDATABASE").or_else(|| config.get_user().map(str::to_string));
        if let Some(dbname) = dbname {
            config.dbname(dbname);
        }
    }
    Ok(())
}

/// `url` with any password in it (user info or `password=`) replaced by
/// `***`, cut where tokio-postgres's parser cuts (the first `@`).
pub(super) fn redact(url: &str) -> String {
    let Some(scheme) = SCHEMES.iter().find(|scheme| url.starts_with(*scheme)) else {
        return redact_params(url);
    };
    let rest = &url[scheme.len()..];
    let rest = match rest.split_once('@') {
        Some((credentials, tail)) if credentials.contains(':') => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{user}:***@{tail}")
        }
        _ => rest.to_string(),
    };
    redact_params(&format!("{scheme}{rest}"))
}

/// `password=...` parameters (URL query or key=value string) hidden.
fn redact_params(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("password=") {
        let value = at + "password=".len();
        out.push_str(&rest[..value]);
        out.push_str("***");
        let end = rest[value..]
            .find(['&', ' '])
            .map_or(rest.len(), |i| value + i);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
