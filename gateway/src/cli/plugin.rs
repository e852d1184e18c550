//! `bulkhead plugin ...`: tools for plugin authors.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use bulkhead_gateway::plugins::{
    CompiledPlugin, MAX_COMPONENT_BYTES, PluginConfig, PluginEngine, PluginEngineConfig,
    PluginLimits,
};
use bulkhead_gateway::{LocalRun, LocalRunError, run_locally};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct PluginArgs {
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Check a plugin component as an upload would be checked
    ///
    /// Size cap, a component (not a core module), every import allowed,
    /// every hook exported, compiled within the budget. Prints the digest,
    /// size and imports and exits 0, or the reason and exits 1.
    Check {
        /// The `.wasm` component.
        file: PathBuf,
    },
    /// Print the headers an upload to a tenant with `signing_keys` needs
    ///
    /// Signs, with a PKCS#8 PEM Ed25519 private key (`openssl genpkey
    /// -algorithm ed25519`, `bulkhead token keygen`), the statement that
    /// binds the tenant, the plugin name, the version and the file's
    /// SHA-256, and prints the two headers `PUT /v1/plugins/{name}` needs:
    /// `x-bulkhead-signature: BASE64` and `x-bulkhead-plugin-version: N`.
    /// The signature is good for that tenant and name only, and the
    /// version must be above the stored one's.
    Sign {
        /// The `.wasm` component.
        file: PathBuf,
        /// The Ed25519 private key (PKCS#8 PEM).
        #[arg(long, value_name = "KEY.pem")]
        key: PathBuf,
        /// The tenant it is uploaded to.
        #[arg(long)]
        tenant: String,
        /// The plugin name it is uploaded as.
        #[arg(long)]
        name: String,
        /// Its version: a whole number above the one stored under the name.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        version: u64,
    },
    /// Run a plugin's hooks over a request (and a response) on this machine
    ///
    /// Prints `{"request": …}` (the request after `on-request`, as an OpenAI
    /// body) plus `"response"` (after `on-response`, or the stream hooks
    /// with `--chunk-chars`) as JSON on stdout, or `"rejected"` with the
    /// hook, status and message; the time and memory used go to stderr.
    /// Exit status: 0 passed, 3 rejected, 1 the plugin failed.
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The `.wasm` component.
    file: PathBuf,
    /// An OpenAI chat (`messages`) or completion (`prompt`) request body.
    #[arg(long, value_name = "REQ.json")]
    request: PathBuf,
    /// An OpenAI response body to run `on-response` over.
    #[arg(long, value_name = "RESP.json")]
    response: Option<PathBuf>,
    /// A config value the plugin reads with `host.config` (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = key_value)]
    config: Vec<(String, String)>,
    /// Run the stream hooks instead of `on-response`: the response text in
    /// pieces of N characters through `on-chunk`, then `on-stream-end`.
    #[arg(long, value_name = "N", requires = "response")]
    chunk_chars: Option<usize>,
    /// Deadline per hook call, in milliseconds (default: the gateway's).
    #[arg(long, value_name = "MS")]
    deadline_ms: Option<u64>,
    /// Memory limit, in MiB (default: the gateway's).
    #[arg(long, value_name = "MIB")]
    max_memory_mib: Option<usize>,
}

fn key_value(arg: &str) -> Result<(String, String), String> {
    arg.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{arg}` is not KEY=VALUE"))
}

pub(super) fn run(args: PluginArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        PluginCommand::Check { file } => check(&file),
        PluginCommand::Run(args) => run_hooks(args),
        PluginCommand::Sign {
            file,
            key,
            tenant,
            name,
            version,
        } => sign(&file, &key, &tenant, &name, version),
    }
}

/// A small engine: one plugin, one call at a time.
fn engine() -> anyhow::Result<PluginEngine> {
    PluginEngine::new(PluginEngineConfig {
        max_instances: 4,
        ..PluginEngineConfig::default()
    })
    .context("starting the plugin engine")
}

fn read_component(file: &Path) -> anyhow::Result<Vec<u8>> {
    let size = std::fs::metadata(file)
        .with_context(|| format!("reading {}", file.display()))?
        .len();
    if size > MAX_COMPONENT_BYTES as u64 {
        bail!(
            "{}: the component is {size} bytes; the limit is {MAX_COMPONENT_BYTES}",
            file.display()
        );
    }
    std::fs::read(file).with_context(|| format!("reading {}", file.display()))
}

fn compile(engine: &PluginEngine, file: &Path) -> anyhow::Result<Result<CompiledPlugin, String>> {
    let bytes = read_component(file)?;
    Ok(engine
        .validate_and_compile(&bytes)
        .map_err(|e| format!("{}: {e} ({})", file.display(), e.code())))
}

fn check(file: &Path) -> anyhow::Result<ExitCode> {
    let engine = engine()?;
    let started = std::time::Instant::now();
    match compile(&engine, file)? {
        Ok(plugin) => {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{}: a valid plugin: {} bytes, sha256:{}, compiled in {:.0?}",
                file.display(),
                plugin.size_bytes(),
                plugin.digest(),
                started.elapsed()
            )?;
            for import in plugin.imports() {
                writeln!(out, "  imports {import}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(message) => {
            eprintln!("{message}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn sign(
    file: &Path,
    key: &Path,
    tenant: &str,
    name: &str,
    version: u64,
) -> anyhow::Result<ExitCode> {
    use base64::Engine as _;
    use bulkhead_gateway::plugins::signature::{
        SIGNATURE_HEADER, VERSION_HEADER, signed_statement,
    };
    use bulkhead_gateway::plugins::{PluginDigest, PluginName};
    use ed25519_dalek::Signer as _;
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    let name = PluginName::parse(name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let bytes = read_component(file)?;
    let pem = std::fs::read_to_string(key).with_context(|| format!("reading {}", key.display()))?;
    let signing = ed25519_dalek::SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
        anyhow::anyhow!(
            "{}: not an Ed25519 private key in PKCS#8 PEM ({e})",
            key.display()
        )
    })?;
    let statement = signed_statement(tenant, &name, version, &PluginDigest::of(&bytes));
    let signature = signing.sign(&statement);
    println!(
        "{SIGNATURE_HEADER}: {}",
        base64::engine::general_purpose::STANDARD.encode(signature.to_bytes())
    );
    println!("{VERSION_HEADER}: {version}");
    Ok(ExitCode::SUCCESS)
}

fn run_hooks(args: RunArgs) -> anyhow::Result<ExitCode> {
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let request = read(&args.request)?;
    let response = args.response.as_deref().map(read).transpose()?;
    let engine = engine()?;
    let plugin = match compile(&engine, &args.file)? {
        Ok(plugin) => plugin,
        Err(message) => {
            eprintln!("{message}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut limits = PluginLimits::default();
    if let Some(ms) = args.deadline_ms {
        limits.deadline = Duration::from_millis(ms);
    }
    if let Some(mib) = args.max_memory_mib {
        limits.max_memory_bytes = mib << 20;
    }
    let name = args.file.file_stem().map_or_else(
        || "plugin".to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    let max_memory = limits.max_memory_bytes;
    let report = run_locally(LocalRun {
        plugin: &plugin,
        name: &name,
        request: &request,
        response: response.as_deref(),
        chunk_chars: args.chunk_chars,
        config: args.config.into_iter().collect::<PluginConfig>(),
        limits,
    });
    let report = match report {
        Ok(report) => report,
        Err(error @ (LocalRunError::Request(_) | LocalRunError::Response(_))) => {
            bail!("{error}")
        }
        Err(error) => {
            eprintln!("{error}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &report.output)?;
    writeln!(out)?;
    let mut err = std::io::stderr().lock();
    for (hook, took) in &report.timings {
        writeln!(err, "{hook}: {:.3} ms", took.as_secs_f64() * 1e3)?;
    }
    writeln!(
        err,
        "memory: {:.1} MiB of {:.0} MiB; log: {} bytes written, {} dropped",
        report.peak_memory_bytes as f64 / f64::from(1 << 20),
        max_memory as f64 / f64::from(1 << 20),
        report.log.written_bytes,
        report.log.dropped_messages
    )?;
    Ok(if report.rejected {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}
