//! `bulkhead policy ...`: operator tools for policy folders.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use bulkhead_gateway::policy::{self, Policy};
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(super) enum PolicyCommand {
    /// Validate a policy folder: prints every problem as FILE:LINE:COL: MESSAGE
    /// on stderr and exits 1, or a one-line summary and exits 0.
    Check {
        /// The policy folder, e.g. `policies/`.
        dir: std::path::PathBuf,
    },
}

pub(super) fn run(command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Check { dir } => {
            let valid = check(&dir, &mut io::stdout().lock(), &mut io::stderr().lock())?;
            Ok(if valid {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// Checks `dir`, writing the summary to `out` or the errors to `err`;
/// true when the folder is valid.
fn check(dir: &Path, out: &mut impl Write, err: &mut impl Write) -> io::Result<bool> {
    match policy::check(dir) {
        Ok(policy) => {
            writeln!(out, "{} is valid: {}", folder_name(dir), summary(&policy))?;
            Ok(true)
        }
        Err(errors) => {
            // Paths as the user typed the folder, so editors can jump to them.
            for error in &errors.in_dir(dir).0 {
                writeln!(err, "{error}")?;
            }
            let count = counted(errors.0.len(), "error", "errors");
            writeln!(err, "{} is invalid: {count}", folder_name(dir))?;
            Ok(false)
        }
    }
}

/// `policies/`, however it was typed.
fn folder_name(dir: &Path) -> String {
    let name = dir.display().to_string();
    if name.ends_with('/') {
        name
    } else {
        name + "/"
    }
}

/// "2 tenants, 1 class, 1 model, 1 operator issuer".
fn summary(policy: &Policy) -> String {
    let classes = policy
        .files
        .iter()
        .filter(|(name, _)| name.starts_with("classes"))
        .count();
    let models = policy.models.len();
    format!(
        "{}, {}, {}, {}",
        counted(policy.tenants.len(), "tenant", "tenants"),
        counted(classes, "class", "classes"),
        counted(models, "model", "models"),
        counted(
            policy.operator.issuers.len(),
            "operator issuer",
            "operator issuers"
        )
    )
}

fn counted(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
