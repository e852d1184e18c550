//! `bulkhead model register|unregister|list`: model registrations on a
//! running gateway, through its admin API (`admin` scope).

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bulkhead_gateway::signing::read_bundle_file;
use clap::Args;
use serde_json::json;

use super::http::Gateway;

/// How long a registration may take: the gpu-host hashes every byte of
/// the weights before it answers.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(1800);
const OTHER_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the gateway is and how to call it.
#[derive(Debug, Args)]
pub struct Remote {
    /// The gateway's admin listener: http://HOST:PORT or unix:PATH.
    #[arg(long, default_value = super::http::DEFAULT_ADMIN_URL)]
    url: String,
    /// An operator token with the command's scope (default: $BULKHEAD_TOKEN).
    #[arg(long)]
    token: Option<String>,
}

impl Remote {
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

/// `register DIR --signature SIG --name NAME [--file F]`.
pub fn register(
    remote: &Remote,
    dir: &Path,
    signature: &Path,
    name: &str,
    file: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let bundle = read_bundle_file(signature)?;
    let signature_json: serde_json::Value = serde_json::from_slice(&bundle)
        .with_context(|| format!("{} is not a signature bundle (JSON)", signature.display()))?;
    // The gpu-host resolves the path: send it absolute, resolved here
    // when this machine has it (the local gpu-host's case).
    let dir = std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .with_context(|| format!("resolving {}", dir.display()))?;
    let mut body = json!({"name": name, "dir": dir, "signature": signature_json});
    if let Some(file) = file {
        body["file"] = json!(file);
    }
    let body = serde_json::to_vec(&body).context("encoding the request")?;
    let gateway = Gateway::new(&remote.url, remote.token.as_deref(), REGISTER_TIMEOUT)?;
    let reply = runtime()?.block_on(gateway.send("POST", "/admin/v1/models", Some(body)))?;
    if reply.status != 201 {
        eprintln!(
            "registering `{name}` FAILED ({}): {}",
            reply.status,
            reply.error_message()
        );
        return Ok(ExitCode::FAILURE);
    }
    let r = reply.json()?;
    println!(
        "registered `{}`: {} signed by `{}`, file {} ({} bytes), loaded and verified in {} ms",
        r["name"].as_str().unwrap_or(name),
        r["digest"].as_str().unwrap_or("?"),
        r["publisher"].as_str().unwrap_or("?"),
        r["file"].as_str().unwrap_or("?"),
        r["size_bytes"],
        r["load_ms"]
    );
    Ok(ExitCode::SUCCESS)
}

/// `unregister NAME`.
pub fn unregister(remote: &Remote, name: &str) -> anyhow::Result<ExitCode> {
    let gateway = Gateway::new(&remote.url, remote.token.as_deref(), OTHER_TIMEOUT)?;
    let path = format!("/admin/v1/models/{}", url_segment(name));
    let reply = runtime()?.block_on(gateway.send("DELETE", &path, None))?;
    if reply.status != 200 {
        eprintln!(
            "unregistering `{name}` FAILED ({}): {}",
            reply.status,
            reply.error_message()
        );
        return Ok(ExitCode::FAILURE);
    }
    let r = reply.json()?;
    println!(
        "unregistered `{name}` ({})",
        r["digest"].as_str().unwrap_or("?")
    );
    Ok(ExitCode::SUCCESS)
}

/// `list`: one line per registration.
pub fn list(remote: &Remote) -> anyhow::Result<ExitCode> {
    let gateway = Gateway::new(&remote.url, remote.token.as_deref(), OTHER_TIMEOUT)?;
    let list = runtime()?.block_on(gateway.get_json("/admin/v1/models"))?;
    for model in list["data"].as_array().into_iter().flatten() {
        let text = |key: &str| model[key].as_str().unwrap_or("-").to_string();
        let reason = model["reason"]
            .as_str()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        println!(
            "{}\t{}\t{}\t{}\t{}{reason}",
            text("name"),
            text("source"),
            text("digest"),
            text("publisher"),
            text("state"),
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Percent-encodes everything but unreserved characters (model names are
/// those already; anything else is the server's to refuse).
pub(super) fn url_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
