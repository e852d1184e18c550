//! `bulkhead state migrate`: moving a gateway's state from its folders into
//! the state database that replicas share: the audit log (re-verified
//! entry by entry, its checkpoint kept), and optionally the model registry
//! and the plugin store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use bulkhead_gateway::audit::store::Stored;
use bulkhead_gateway::audit::verify::{VerifyOptions, read_text, verify_log_each};
use bulkhead_gateway::audit::{CHECKPOINT_FILE, read_verifier};
use bulkhead_state::{Db, PgSettings};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct StateArgs {
    #[command(subcommand)]
    command: StateCommand,
}

#[derive(Debug, Subcommand)]
enum StateCommand {
    /// Copy a gateway's audit log folder (and its model registry and plugin
    /// store) into the state database
    ///
    /// Verifies the folder first as `bulkhead audit verify` does (every
    /// record's framing and hash, every entry's schema and index, the tree
    /// against the folder's signed checkpoint) and copies nothing from a log
    /// that fails. Writes only into a schema whose audit log is empty, in one
    /// transaction: the entries with their bytes and indexes, the log's
    /// size, and the checkpoint, so the root is unchanged and kept
    /// checkpoints and proofs still verify. Then re-verifies the copy. Stop
    /// the gateway first (the folder must not grow meanwhile), and point
    /// `[state] store` at the schema afterwards, with the same `[audit] key`.
    /// With --registry and --plugins, the model registry's records and the
    /// plugin store's entries, blobs (hashed again) and version floors are
    /// copied first (each replica verifies the registrations' signatures
    /// against its own trust.toml, and re-hashes every blob, before serving
    /// them).
    Migrate {
        /// The source: `files:DIR`, the log folder (`[audit] dir`).
        #[arg(long, value_name = "files:DIR")]
        from: String,
        /// The state database (`[state] store`):
        /// postgres://USER@HOST:PORT/DATABASE, no password (--password-file
        /// or PGPASSWORD).
        #[arg(long, value_name = "URL")]
        to: String,
        /// The schema to copy into (`[state] schema`); its audit log must be
        /// empty.
        #[arg(long, default_value = bulkhead_state::DEFAULT_SCHEMA)]
        schema: String,
        /// The database password, in a file.
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// The audit public key, SPKI PEM or vkey, to check the folder's
        /// checkpoint (default: DIR/audit.vkey, which only shows the folder
        /// agrees with itself).
        #[arg(long, value_name = "PUB")]
        key: Option<PathBuf>,
        /// The model registry folder (`[models] registry`) to copy too.
        #[arg(long, value_name = "DIR")]
        registry: Option<PathBuf>,
        /// The plugin store folder (`[plugins] store`) to copy too.
        #[arg(long, value_name = "DIR")]
        plugins: Option<PathBuf>,
    },
}

pub fn run(args: StateArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        StateCommand::Migrate {
            from,
            to,
            schema,
            password_file,
            key,
            registry,
            plugins,
        } => {
            let dir = source_dir(&from)?;
            let mut settings = PgSettings::new(to);
            settings.schema = schema;
            settings.password_file = password_file;
            settings
                .validate()
                .context("checking --to, --schema and --password-file")?;
            // The registry and plugins first: copying them again is
            // harmless, copying the log again is refused, so a failed run
            // can be rerun whole.
            if let Some(registry) = registry {
                let code = migrate_registry(&registry, &settings)?;
                if code != ExitCode::SUCCESS {
                    return Ok(code);
                }
            }
            if let Some(plugins) = plugins {
                let code = migrate_plugins(&plugins, &settings)?;
                if code != ExitCode::SUCCESS {
                    return Ok(code);
                }
            }
            migrate(&dir, &settings, key)
        }
    }
}

/// The folder `--from files:DIR` names.
fn source_dir(from: &str) -> anyhow::Result<PathBuf> {
    match from.strip_prefix("files:") {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => bail!(
            "--from `{from}`: give the audit log folder as files:DIR (`[audit] dir`); it is the \
             only source `state migrate` knows"
        ),
    }
}

fn migrate(dir: &Path, settings: &PgSettings, key: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let mut entries = Vec::new();
    let options = VerifyOptions {
        checkpoint: None,
        key,
    };
    let verified = match verify_log_each(dir, &options, &mut |record| {
        entries.push(Stored {
            index: record.index,
            entry: record.entry.to_vec(),
            leaf: record.leaf,
        });
    }) {
        Ok(verified) => verified,
        Err(error) => {
            eprintln!(
                "audit log {} FAILED: {error}; nothing was copied (`bulkhead audit verify {}` \
                 says the same)",
                dir.display(),
                dir.display()
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    // The text that verified above; the one checkpoint a folder keeps.
    let note = read_text(&dir.join(CHECKPOINT_FILE))?;
    let size = verified.checkpoint.size;
    let schema = &settings.schema;

    let runtime = runtime()?;
    let copied = runtime.block_on(async {
        let db = Db::connect(settings).await?;
        let copied = bulkhead_state::import_log(&db, &entries, &[(size, note.clone())]).await?;
        Ok::<_, bulkhead_state::StateError>((copied, bulkhead_state::stored_leaves(&db).await?))
    });
    let (copied, leaves) = match copied {
        Ok(done) => done,
        Err(error) => {
            eprintln!("migrating {} FAILED: {error}", dir.display());
            return Ok(ExitCode::FAILURE);
        }
    };

    // The copy, checked as an auditor would: every row rehashed and the
    // tree against the folder's checkpoint; and row for row the folder's.
    let verifier = |origin: &str| read_verifier(&verified.key, origin).map_err(|e| e.to_string());
    let checked = runtime.block_on(bulkhead_state::verify_db(settings, Some(&note), &verifier));
    let differs = leaves.len() != entries.len()
        || leaves
            .iter()
            .zip(&entries)
            .any(|((index, leaf), stored)| *index != stored.index || *leaf != stored.leaf);
    match checked {
        Ok(db) if db.entries == verified.entries && !differs => {}
        Ok(db) => {
            eprintln!(
                "the copy in schema `{schema}` FAILED: it holds {} entries ({} rows) and the \
                 folder {}, or a row's leaf differs from the folder's",
                db.entries,
                leaves.len(),
                verified.entries
            );
            return Ok(ExitCode::FAILURE);
        }
        Err(error) => {
            eprintln!("the copy in schema `{schema}` FAILED: {error}");
            return Ok(ExitCode::FAILURE);
        }
    }
    println!("ok: {copied} entries copied; checkpoint size {size} verifies in schema {schema}");
    if verified.key_from_log_dir {
        println!(
            "note: the folder was checked with its own key; pass --key with a copy kept \
             elsewhere to rule out a replaced folder"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Copies the registry folder's records (`--registry`).
fn migrate_registry(registry: &Path, settings: &PgSettings) -> anyhow::Result<ExitCode> {
    let runtime = runtime()?;
    let copied = runtime.block_on(async {
        let db = Db::connect(settings).await.map_err(|e| e.to_string())?;
        bulkhead_gateway::registration::import_registry(registry, &db)
            .await
            .map_err(|e| e.to_string())
    });
    match copied {
        Ok(copied) => {
            println!(
                "ok: {} model registrations copied ({} already there) into schema {}",
                copied.copied, copied.present, settings.schema
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!(
                "migrating the model registry {} FAILED: {error}; no registration was copied",
                registry.display()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Copies the plugin store folder's entries, blobs and version floors
/// (`--plugins`); a folder with an entry that cannot be read is refused
/// whole, so nothing a tenant uploaded is left behind unnoticed.
fn migrate_plugins(store: &Path, settings: &PgSettings) -> anyhow::Result<ExitCode> {
    let contents = match bulkhead_gateway::plugins::read_file_store(store) {
        Ok(contents) => contents,
        Err(error) => {
            eprintln!(
                "migrating the plugin store {} FAILED: {error}; no plugin was copied",
                store.display()
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    if !contents.failed.is_empty() {
        for failure in &contents.failed {
            eprintln!(
                "plugin {}/{}: {}",
                failure.tenant, failure.name, failure.reason
            );
        }
        eprintln!(
            "migrating the plugin store {} FAILED: {} entries cannot be read (above); no plugin \
             was copied (re-upload or delete them, then run this again)",
            store.display(),
            contents.failed.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    let runtime = runtime()?;
    let copied = runtime.block_on(async {
        let db = Db::connect(settings).await.map_err(|e| e.to_string())?;
        bulkhead_state::import_plugins(&db, &contents)
            .await
            .map_err(|e| e.to_string())
    });
    match copied {
        Ok(copied) => {
            let verb = if copied.already_there {
                "already there"
            } else {
                "copied"
            };
            println!(
                "ok: {} plugins ({} blobs, {} version floors) {verb} in schema {}",
                copied.entries, copied.blobs, copied.floors, settings.schema
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!(
                "migrating the plugin store {} FAILED: {error}; no plugin was copied",
                store.display()
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}
