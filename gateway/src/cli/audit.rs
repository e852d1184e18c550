//! `bulkhead audit ...`: check an audit log offline, or check proofs
//! fetched from a running gateway against signed checkpoints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bulkhead_gateway::audit::merkle::{leaf_hash, verify_consistency, verify_inclusion};
use bulkhead_gateway::audit::note::{open_checkpoint, unverified_checkpoint};
use bulkhead_gateway::audit::verify::{VerifyOptions, verify_log};
use bulkhead_gateway::audit::{Checkpoint, Entry, Hash, read_verifier};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Re-check a whole audit log offline
    ///
    /// Every record's framing and checksum, every entry's schema and index
    /// (consecutive from 0), the tree head against the checkpoint, and the
    /// checkpoint's signature. Names the first bad entry; exit 0 only when
    /// everything holds. Reads only: safe on a running gateway's folder or
    /// database.
    Verify {
        /// The log folder (`[audit] dir`); or --state for a log in PostgreSQL.
        #[arg(required_unless_present = "state", conflicts_with = "state")]
        logdir: Option<PathBuf>,
        /// The state database holding the log (`[state] store`,
        /// postgres://USER@HOST:PORT/DATABASE, no password: --password-file
        /// or PGPASSWORD). Every row is rehashed here; nothing the database
        /// says is trusted. Needs --key.
        #[arg(long, value_name = "URL", requires = "key")]
        state: Option<String>,
        /// The schema of the log's tables (`[state] schema`).
        #[arg(long, default_value = bulkhead_state::DEFAULT_SCHEMA, requires = "state")]
        schema: String,
        /// The database password, in a file.
        #[arg(long, value_name = "FILE", requires = "state")]
        password_file: Option<PathBuf>,
        /// A signed checkpoint to check against (default: LOGDIR/checkpoint,
        /// or the database's latest, which only shows the log agrees with
        /// itself: pass one you kept).
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
        /// The audit public key, SPKI PEM or vkey (default: LOGDIR/audit.vkey,
        /// which only shows the folder agrees with itself: pass a copy kept
        /// elsewhere).
        #[arg(long, value_name = "PUB")]
        key: Option<PathBuf>,
    },
    /// Check proofs served by a running gateway (operator token, `audit:read`)
    #[command(subcommand)]
    Proof(ProofCommand),
    /// As a tenant: check that your own actions are in the log
    ///
    /// Fetches your tenant's entries (`GET /v1/audit/entries`, a tenant
    /// token with `plugins:write`), checks the checkpoint they come with
    /// against --key, and each entry's inclusion proof against it. Prints
    /// each entry; exit 0 only when every proof holds.
    Mine {
        /// The gateway's tenant listener.
        #[arg(long, default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Your tenant token (default: $BULKHEAD_TOKEN).
        #[arg(long)]
        token: Option<String>,
        /// The audit public key the operator published (SPKI PEM or vkey).
        #[arg(long, value_name = "PUB")]
        key: PathBuf,
        /// Save the checkpoint the entries were proven against here.
        #[arg(long, value_name = "FILE")]
        save: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ProofCommand {
    /// Check that entry INDEX is in the log a signed checkpoint commits to
    ///
    /// Fetches the entry, hashes it, fetches its inclusion proof for the
    /// checkpoint's size and checks it leads to the checkpoint's root.
    /// Prints the entry on success.
    Inclusion {
        #[command(flatten)]
        remote: Remote,
        /// The entry.
        #[arg(long)]
        index: u64,
        /// The signed checkpoint (default: the gateway's current one,
        /// checked with --key).
        #[arg(long, value_name = "FILE")]
        checkpoint: Option<PathBuf>,
    },
    /// Check that a newer checkpoint extends an older one
    ///
    /// Fetches the consistency proof between their sizes: success means
    /// every entry the old one covered is unchanged in the new one.
    Consistency {
        #[command(flatten)]
        remote: Remote,
        /// The older signed checkpoint.
        #[arg(long, value_name = "FILE")]
        old: PathBuf,
        /// The newer signed checkpoint (default: the gateway's current one).
        #[arg(long, value_name = "FILE")]
        new: Option<PathBuf>,
        /// Write the newer checkpoint here once it checks out (to pass as
        /// --old next time).
        #[arg(long, value_name = "FILE")]
        save: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
struct Remote {
    /// The gateway's admin listener: http://HOST:PORT or unix:PATH.
    #[arg(long, default_value = super::http::DEFAULT_ADMIN_URL)]
    url: String,
    /// An operator token with the command's scope (default: $BULKHEAD_TOKEN).
    #[arg(long)]
    token: Option<String>,
    /// The audit public key, SPKI PEM (`audit.pub.pem`) or vkey (`audit.vkey`).
    #[arg(long, value_name = "PUB")]
    key: PathBuf,
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        AuditCommand::Verify {
            logdir: Some(logdir),
            checkpoint,
            key,
            ..
        } => verify(&logdir, VerifyOptions { checkpoint, key }),
        AuditCommand::Verify {
            state: Some(url),
            schema,
            password_file,
            checkpoint,
            key: Some(key),
            ..
        } => {
            let mut settings = bulkhead_state::PgSettings::new(url);
            settings.schema = schema;
            settings.password_file = password_file;
            runtime()?.block_on(verify_db(&settings, checkpoint.as_deref(), &key))
        }
        AuditCommand::Verify { .. } => bail!("give a log folder, or --state with --key"),
        AuditCommand::Proof(command) => runtime()?.block_on(proof(command)),
        AuditCommand::Mine {
            url,
            token,
            key,
            save,
        } => runtime()?.block_on(mine(&url, token.as_deref(), &key, save.as_deref())),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `audit mine`: every page of the tenant's own entries, each proven
/// against the signed checkpoint its page came with.
async fn mine(
    url: &str,
    token: Option<&str>,
    key: &Path,
    save: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let gateway = super::http::Gateway::new(url, token, Duration::from_secs(30))?;
    let mut from = 0;
    let mut checked = 0;
    let last_note;
    loop {
        let page = gateway
            .get_json(&format!("/v1/audit/entries?from={from}"))
            .await?;
        let note = page["checkpoint"]
            .as_str()
            .context("the page has no checkpoint")?;
        let claimed =
            unverified_checkpoint(note).context("the page's checkpoint is not a checkpoint")?;
        let verifier = read_verifier(key, &claimed.origin)?;
        let checkpoint = open_checkpoint(note, &verifier)
            .with_context(|| format!("the checkpoint does not verify with {}", key.display()))?;
        for item in page["data"].as_array().context("the page has no data")? {
            let entry: Entry = serde_json::from_value(item["entry"].clone())
                .context("the gateway's entry is not a valid one")?;
            let index = item["index"]
                .as_u64()
                .context("an entry without an index")?;
            if entry.index != index {
                bail!("the gateway returned entry {} as {index}", entry.index);
            }
            let bytes = entry.to_bytes();
            let proof = hashes(&item["inclusion_proof"])?;
            if let Err(e) = verify_inclusion(
                &leaf_hash(&bytes),
                index,
                checkpoint.size,
                &proof,
                &checkpoint.root,
            ) {
                eprintln!("inclusion proof for entry {index} FAILED: {e}");
                return Ok(ExitCode::FAILURE);
            }
            println!("{}", String::from_utf8_lossy(&bytes));
            checked += 1;
        }
        match page["next_from"].as_u64() {
            Some(next) if next > from => from = next,
            _ => {
                last_note = (note.to_owned(), checkpoint);
                break;
            }
        }
    }
    let (note, checkpoint) = last_note;
    println!(
        "ok: {checked} of your entries are in the log at checkpoint size {} (root {})",
        checkpoint.size,
        BASE64.encode(checkpoint.root)
    );
    if let Some(save) = save {
        std::fs::write(save, note).with_context(|| format!("writing {}", save.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn verify(dir: &Path, options: VerifyOptions) -> anyhow::Result<ExitCode> {
    match verify_log(dir, &options) {
        Ok(verified) => {
            report_ok(verified.entries, &verified.checkpoint, &verified.key);
            if verified.key_from_log_dir {
                println!(
                    "note: the key came from the log folder itself; pass --key with a copy kept \
                     elsewhere to rule out a replaced folder"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("audit log {} FAILED: {error}", dir.display());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `audit verify --state`: the log in PostgreSQL, rehashed row by row.
async fn verify_db(
    settings: &bulkhead_state::PgSettings,
    checkpoint: Option<&Path>,
    key: &Path,
) -> anyhow::Result<ExitCode> {
    let note = match checkpoint {
        Some(path) => Some(bulkhead_gateway::audit::verify::read_text(path)?),
        None => None,
    };
    let verifier = |origin: &str| read_verifier(key, origin).map_err(|e| e.to_string());
    match bulkhead_state::verify_db(settings, note.as_deref(), &verifier).await {
        Ok(verified) => {
            report_ok(verified.entries, &verified.checkpoint, key);
            if verified.checkpoint_from_db {
                println!(
                    "note: the checkpoint came from the database itself; pass --checkpoint \
                     with one kept elsewhere to rule out a replaced log"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("audit log in schema `{}` FAILED: {error}", settings.schema);
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The first lines of a log that verified.
fn report_ok(entries: u64, c: &Checkpoint, key: &Path) {
    println!(
        "ok: {entries} entries; checkpoint `{}` size {} root {} verifies with {}",
        c.origin,
        c.size,
        BASE64.encode(c.root),
        key.display()
    );
    if entries > c.size {
        println!(
            "note: the last {} entries are not yet covered by this checkpoint",
            entries - c.size
        );
    }
}

async fn proof(command: ProofCommand) -> anyhow::Result<ExitCode> {
    match command {
        ProofCommand::Inclusion {
            remote,
            index,
            checkpoint,
        } => {
            let client = Client::new(&remote)?;
            let checkpoint = client.checkpoint(checkpoint.as_deref()).await?;
            if index >= checkpoint.size {
                bail!(
                    "entry {index} is not covered by the checkpoint (size {}): fetch a newer one",
                    checkpoint.size
                );
            }
            let page = client
                .get_json(&format!(
                    "/admin/v1/audit/entries?from={index}&to={}",
                    index + 1
                ))
                .await?;
            let value = page["data"]
                .get(0)
                .cloned()
                .context("the gateway returned no entry")?;
            let entry: Entry =
                serde_json::from_value(value).context("the gateway's entry is not a valid one")?;
            if entry.index != index {
                bail!("the gateway returned entry {} for {index}", entry.index);
            }
            // Entries are canonical: serializing the parsed entry gives back
            // the bytes that were hashed.
            let bytes = entry.to_bytes();
            let proof = client
                .get_json(&format!(
                    "/admin/v1/audit/proof/inclusion?index={index}&size={}",
                    checkpoint.size
                ))
                .await?;
            let hashes = hashes(&proof["hashes"])?;
            match verify_inclusion(
                &leaf_hash(&bytes),
                index,
                checkpoint.size,
                &hashes,
                &checkpoint.root,
            ) {
                Ok(()) => {
                    println!(
                        "ok: entry {index} is in the log at checkpoint size {} (root {})",
                        checkpoint.size,
                        BASE64.encode(checkpoint.root)
                    );
                    println!("{}", String::from_utf8_lossy(&bytes));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("inclusion proof for entry {index} FAILED: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        ProofCommand::Consistency {
            remote,
            old,
            new,
            save,
        } => {
            let client = Client::new(&remote)?;
            let older = client.checkpoint(Some(&old)).await?;
            let (newer, note) = client.checkpoint_note(new.as_deref()).await?;
            let proof = client
                .get_json(&format!(
                    "/admin/v1/audit/proof/consistency?from={}&to={}",
                    older.size, newer.size
                ))
                .await?;
            let hashes = hashes(&proof["hashes"])?;
            match verify_consistency(older.size, newer.size, &older.root, &newer.root, &hashes) {
                Ok(()) => {
                    println!(
                        "ok: the checkpoint of size {} extends the one of size {}",
                        newer.size, older.size
                    );
                    if let Some(save) = save {
                        std::fs::write(&save, note)
                            .with_context(|| format!("writing {}", save.display()))?;
                    }
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!(
                        "consistency proof {} → {} FAILED: {e}: the log was rewritten",
                        older.size, newer.size
                    );
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

fn hashes(value: &serde_json::Value) -> anyhow::Result<Vec<Hash>> {
    value
        .as_array()
        .context("the proof has no `hashes` array")?
        .iter()
        .map(|h| {
            h.as_str()
                .and_then(|h| BASE64.decode(h).ok())
                .and_then(|h| Hash::try_from(h).ok())
                .context("a proof hash is not base64 of 32 bytes")
        })
        .collect()
}

struct Client {
    gateway: super::http::Gateway,
    key: PathBuf,
}

impl Client {
    fn new(remote: &Remote) -> anyhow::Result<Client> {
        Ok(Client {
            gateway: super::http::Gateway::new(
                &remote.url,
                remote.token.as_deref(),
                Duration::from_secs(30),
            )?,
            key: remote.key.clone(),
        })
    }

    async fn get_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        self.gateway.get_json(path).await
    }

    async fn checkpoint(&self, file: Option<&Path>) -> anyhow::Result<Checkpoint> {
        Ok(self.checkpoint_note(file).await?.0)
    }

    /// A checkpoint from `file` or the gateway, its signature checked.
    async fn checkpoint_note(&self, file: Option<&Path>) -> anyhow::Result<(Checkpoint, String)> {
        let (note, from) = match file {
            Some(file) => (
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading {}", file.display()))?,
                file.display().to_string(),
            ),
            None => {
                let reply = self
                    .gateway
                    .send("GET", "/admin/v1/audit/checkpoint", None)
                    .await?;
                let text = String::from_utf8_lossy(&reply.body).into_owned();
                if reply.status != 200 {
                    bail!("GET /admin/v1/audit/checkpoint: {}: {text}", reply.status);
                }
                (text, "the gateway's checkpoint".to_string())
            }
        };
        let claimed =
            unverified_checkpoint(&note).with_context(|| format!("{from} is not a checkpoint"))?;
        let verifier = read_verifier(&self.key, &claimed.origin)?;
        let checkpoint = open_checkpoint(&note, &verifier)
            .with_context(|| format!("{from} does not verify with {}", self.key.display()))?;
        Ok((checkpoint, note))
    }
}
