//! `bulkhead token`: mint development tokens and key pairs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use super::write_new;
use anyhow::{Context, bail};
use bulkhead_gateway::auth::{
    self, IssueOptions, MAX_DEV_TOKEN_TTL, Principal, Scope, Scopes, Verifiers,
};
use bulkhead_gateway::policy;
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a development JWT for a tenant or an operator (not for production)
    ///
    /// Signs with the tenant's (or, with --operator, the operator issuer's)
    /// `dev_signing_key`, or its `hs_secret_file` if it has no such key. A
    /// DEVELOPMENT tool: in real deployments identity providers mint tokens,
    /// and policy files have no `dev_signing_key`. Prints the token on stdout.
    Issue(IssueArgs),
    /// Write a new Ed25519 key pair for development
    ///
    /// Writes `PATH.key.pem` (PKCS#8 private key, for `dev_signing_key`) and
    /// `PATH.pub.pem` (SPKI public key, for `public_keys`); never overwrites.
    Keygen(KeygenArgs),
}

#[derive(Debug, Args)]
struct IssueArgs {
    /// The policy folder.
    #[arg(long, value_name = "DIR")]
    policies: PathBuf,
    /// The tenant id.
    #[arg(
        long,
        value_name = "ID",
        required_unless_present = "operator",
        conflicts_with = "operator"
    )]
    tenant: Option<String>,
    /// An operator token, from gateway.toml's [[operator.issuers]] (the
    /// first with a signing key, or --issuer), for the admin listener.
    #[arg(long)]
    operator: bool,
    /// With --operator: the operator issuer to sign as.
    #[arg(long, value_name = "ISSUER", requires = "operator")]
    issuer: Option<String>,
    /// Lifetime: `30s`, `15m`, `1h`, `7d` (at most 30 days).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    ttl: Duration,
    /// Scopes to grant. Tenants: inference, plugins:write (default:
    /// inference). Operators (required): models:read, models:write,
    /// audit:read, partitions:read, tenants:read, usage:read,
    /// gpu-hosts:read, gpu-hosts:write.
    #[arg(long = "scope", value_name = "SCOPE", num_args = 1..)]
    scopes: Vec<Scope>,
    /// The `sub` claim (default: dev).
    #[arg(long)]
    sub: Option<String>,
    /// The `aud` claim (default: the tenant's first audience).
    #[arg(long)]
    audience: Option<String>,
}

#[derive(Debug, Args)]
struct KeygenArgs {
    /// Path prefix: writes PATH.key.pem and PATH.pub.pem (never overwrites).
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
}

pub fn run(args: TokenArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TokenCommand::Issue(args) => issue(args),
        TokenCommand::Keygen(args) => keygen(&args.out),
    }
}

fn issue(args: IssueArgs) -> anyhow::Result<ExitCode> {
    let policy = policy::load(&args.policies)
        .with_context(|| format!("cannot load the policy folder {}", args.policies.display()))?;
    let now = SystemTime::now();
    let scopes: Scopes = args.scopes.iter().copied().collect();
    let options = |scopes| IssueOptions {
        ttl: args.ttl,
        scopes,
        sub: args.sub.clone(),
        audience: args.audience.clone(),
        now,
    };
    let token = match &args.tenant {
        Some(id) => {
            let Some(tenant) = policy.tenants.get(id) else {
                let known: Vec<&str> = policy.tenants.keys().map(String::as_str).collect();
                bail!(
                    "no tenant `{id}` in {} (tenants: {})",
                    args.policies.display(),
                    known.join(", ")
                );
            };
            let scopes = if scopes.is_empty() {
                Scopes::from(Scope::Inference)
            } else {
                scopes
            };
            auth::issue_dev_token(&tenant.id, &tenant.jwt, &policy.dir, options(scopes))?
        }
        None => {
            if scopes.is_empty() {
                let names: Vec<&str> = Scope::of(Principal::Operator).map(Scope::as_str).collect();
                bail!(
                    "an operator token needs at least one --scope (no scope grants everything): {}",
                    names.join(", ")
                );
            }
            auth::issue_operator_token(
                &policy.operator.issuers,
                &policy.dir,
                args.issuer.as_deref(),
                options(scopes),
            )?
        }
    };
    // Say so now rather than with a 401 later (e.g. a key pair mismatch).
    match Verifiers::build(&policy.auth()) {
        Ok(verifiers) => {
            let refused = if args.tenant.is_some() {
                verifiers.verify(&token, now).err()
            } else {
                verifiers.verify_operator(&token, now).err()
            };
            if let Some(e) = refused {
                eprintln!("warning: this policy will refuse the token: {e}");
            }
        }
        Err(errors) => {
            eprintln!("warning: the policy's issuers have errors, so no token verifies:");
            for e in errors {
                eprintln!("  {e}");
            }
        }
    }
    println!("{token}");
    Ok(ExitCode::SUCCESS)
}

fn keygen(out: &Path) -> anyhow::Result<ExitCode> {
    let pair = auth::dev_keypair()?;
    let with_suffix = |suffix: &str| {
        let mut path = out.as_os_str().to_owned();
        path.push(suffix);
        PathBuf::from(path)
    };
    let (private, public) = (with_suffix(".key.pem"), with_suffix(".pub.pem"));
    write_new(&private, pair.private_pem.as_bytes(), 0o600)?;
    write_new(&public, pair.public_pem.as_bytes(), 0o644)?;
    eprintln!("wrote {} and {}", private.display(), public.display());
    Ok(ExitCode::SUCCESS)
}

/// `30s`, `15m`, `1h`, `7d`: a positive whole number and a unit, at most 30 days.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let err = || format!("`{text}` is not a lifetime like 30s, 15m, 1h or 7d");
    let split = text
        .len()
        .checked_sub(1)
        .filter(|i| text.is_char_boundary(*i))
        .ok_or_else(err)?;
    let (number, unit) = text.split_at(split);
    let unit_s = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(err()),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let ttl = number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_s))
        .map(Duration::from_secs)
        .filter(|ttl| !ttl.is_zero())
        .ok_or_else(err)?;
    if ttl > MAX_DEV_TOKEN_TTL {
        return Err(format!("`{text}` is longer than 30 days"));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetimes_take_a_unit_and_stay_under_30_days() {
        assert_eq!(parse_ttl("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_ttl("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_ttl("30d"), Ok(MAX_DEV_TOKEN_TTL));
        assert_eq!(
            parse_ttl("31d"),
            Err("`31d` is longer than 30 days".to_owned())
        );
        for bad in [
            "",
            "h",
            "10",
            "0s",
            "-1h",
            "1.5h",
            "1w",
            "1 h",
            "99999999999999999999d",
            "1é",
        ] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }

    /// `bulkhead token issue --policies p ARGS...`, parsed.
    fn parse_issue(args: &[&str]) -> Result<crate::cli::Args, clap::Error> {
        use clap::Parser;
        let mut argv = vec!["bulkhead", "token", "issue", "--policies", "p"];
        argv.extend_from_slice(args);
        crate::cli::Args::try_parse_from(argv)
    }

    #[test]
    fn issue_arguments_parse() {
        let args = parse_issue(&[
            "--tenant",
            "demo",
            "--ttl",
            "15m",
            "--scope",
            "inference",
            "plugins:write",
        ])
        .unwrap();
        let text = format!("{args:?}");
        assert!(
            text.contains("ttl: 900s") && text.contains("[Inference, PluginsWrite]"),
            "{text}"
        );
        let operator =
            parse_issue(&["--operator", "--scope", "models:read", "audit:read"]).unwrap();
        let text = format!("{operator:?}");
        assert!(
            text.contains("operator: true") && text.contains("[ModelsRead, AuditRead]"),
            "{text}"
        );
        // A tenant or the operator, not both, not neither.
        assert!(parse_issue(&["--tenant", "demo", "--operator"]).is_err());
        assert!(parse_issue(&[]).is_err());
        let admin = parse_issue(&["--tenant", "demo", "--scope", "admin"]);
        assert!(admin.unwrap_err().to_string().contains("`admin` is gone"));
        let bad = parse_issue(&["--tenant", "demo", "--scope", "root"]);
        assert!(
            bad.unwrap_err()
                .to_string()
                .contains("unknown scope `root`")
        );
    }
}
