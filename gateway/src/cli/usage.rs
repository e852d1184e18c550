//! `bulkhead usage export`: hourly usage for billing, from a running
//! gateway's admin API (an operator token with `usage:read`).

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

use super::http::Gateway;
use super::model_api::Remote;

#[derive(Debug, Args)]
pub struct UsageArgs {
    #[command(subcommand)]
    command: UsageCommand,
}

#[derive(Debug, Subcommand)]
enum UsageCommand {
    /// Print requests, prompt and completion tokens and GPU-seconds per
    /// tenant, model and UTC hour in [FROM, TO), as CSV or JSON lines
    Export {
        /// The first hour: YYYY-MM-DD, YYYY-MM-DDTHH or YYYY-MM-DDTHH:MM:SSZ (UTC).
        #[arg(long)]
        from: String,
        /// The end, not included (same forms).
        #[arg(long)]
        to: String,
        /// One tenant only.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Csv)]
        format: Format,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Csv,
    Jsonl,
}

/// The columns, in order (CSV header and each line's fields).
const COLUMNS: [&str; 7] = [
    "hour",
    "tenant",
    "model",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "gpu_seconds",
];

pub fn run(args: UsageArgs) -> anyhow::Result<ExitCode> {
    let UsageCommand::Export {
        from,
        to,
        tenant,
        format,
        remote,
    } = args.command;
    let mut path = format!(
        "/admin/v1/usage?from={}&to={}",
        super::model_api::url_segment(&from),
        super::model_api::url_segment(&to)
    );
    if let Some(tenant) = &tenant {
        path.push_str(&format!(
            "&tenant={}",
            super::model_api::url_segment(tenant)
        ));
    }
    let gateway = Gateway::new(remote.url(), remote.token(), Duration::from_secs(60))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let reply = runtime.block_on(gateway.get_json(&path))?;
    let rows = reply["data"]
        .as_array()
        .context("the gateway's answer has no `data` list")?;
    let mut out = std::io::stdout().lock();
    match format {
        Format::Csv => {
            writeln!(out, "{}", COLUMNS.join(","))?;
            for row in rows {
                let fields: Vec<String> = COLUMNS.iter().map(|c| csv_field(&row[*c])).collect();
                writeln!(out, "{}", fields.join(","))?;
            }
        }
        Format::Jsonl => {
            for row in rows {
                let line: serde_json::Map<String, Value> = COLUMNS
                    .iter()
                    .map(|c| (c.to_string(), row[*c].clone()))
                    .collect();
                writeln!(out, "{}", Value::Object(line))?;
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// One CSV field (RFC 4180: quoted when it holds a comma, quote or line
/// break; a leading `=`, `+`, `-` or `@` is quoted too, so a spreadsheet
/// never runs a tenant-chosen name as a formula).
fn csv_field(value: &Value) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let risky = text.starts_with(['=', '+', '-', '@']) && !value.is_number();
    if risky || text.contains([',', '"', '\n', '\r']) {
        let prefix = if risky { "'" } else { "" };
        format!("\"{prefix}{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn csv_fields_are_quoted_when_they_must_be() {
        assert_eq!(csv_field(&json!("demo")), "demo");
        assert_eq!(csv_field(&json!(12)), "12");
        assert_eq!(csv_field(&json!(0.25)), "0.25");
        assert_eq!(csv_field(&json!("a,b")), "\"a,b\"");
        assert_eq!(csv_field(&json!("say \"hi\"")), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field(&json!("=SUM(A1)")), "\"'=SUM(A1)\"");
    }
}
