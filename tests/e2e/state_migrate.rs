//! `bulkhead state migrate`: a gateway's audit log folder copied into the
//! state database by the real binary, then checked as a replica and an
//! auditor would: `bulkhead audit verify --state` against a checkpoint kept
//! before the move, every entry byte for byte, the same root, an old
//! inclusion proof against the new log, appends going on at the next
//! index; a model registry folder and a plugin store folder copied with
//! it; a rerun and a tampered folder refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bulkhead_gateway::audit::frame::{HEADER_BYTES, MAGIC, TRAILER_BYTES};
use bulkhead_gateway::audit::merkle::{leaf_hash, verify_inclusion};
use bulkhead_gateway::audit::{
    Actor, AuditLog, AuditSettings, DEFAULT_ORIGIN, ENTRIES_FILE, Event, FileDigest, KEY_FILE,
    Outcome, PUBLIC_KEY_FILE, read_signing_key,
};
use bulkhead_gateway::plugins::{
    PluginDigest, PluginEngine, PluginEngineConfig, PluginName, PluginRegistry,
};
use bulkhead_state::PgAuditStore;
use bulkhead_state::testing::TestSchema;

const ENTRIES: u64 = 300;
/// Appended after the checkpoint: copied too, not yet covered by it.
const UNCOVERED: u64 = 4;
const TAMPERED_ENTRY: u64 = 100;

fn event(i: u64) -> (Actor, Event) {
    let tenant = format!("tenant-{}", i % 7);
    match i % 4 {
        0 => (
            Actor::Tenant {
                tenant: tenant.clone(),
                sub: Some(format!("user-{i}")),
            },
            Event::PluginUpload {
                tenant,
                name: format!("plugin-{i}"),
                digest: format!("sha256:{i:064x}"),
                size_bytes: 1000 + i,
            },
        ),
        1 => (
            Actor::Tenant {
                tenant: tenant.clone(),
                sub: None,
            },
            Event::PluginDelete {
                tenant,
                name: format!("plugin-{}", i - 1),
                digest: format!("sha256:{:064x}", i - 1),
            },
        ),
        2 => (
            Actor::Operator {
                issuer: Some("ops".into()),
                tenant: None,
                sub: Some("alice".into()),
            },
            Event::PolicyReload {
                files: vec![FileDigest {
                    path: "tenants.toml".into(),
                    sha256: format!("sha256:{:064x}", i * 31),
                }],
                outcome: Outcome::Accepted,
            },
        ),
        _ => (
            Actor::Gateway,
            Event::AdminAction {
                route: "drain".into(),
                target: format!("gpu-host-{i}"),
                outcome: Outcome::Accepted,
            },
        ),
    }
}

fn bulkhead(args: &[&str]) -> Output {
    Command::new(bulkhead_tests::bin("bulkhead"))
        .args(args)
        .output()
        .expect("bulkhead runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

fn migrate(dir: &Path, url: &str, schema: &str, extra: &[&str]) -> Output {
    let from = format!("files:{}", path(dir));
    let mut args = vec!["state", "migrate", "--from", &from, "--to", url];
    args.extend(["--schema", schema]);
    args.extend(extra);
    bulkhead(&args)
}

/// A copy of `dir` with one byte of entry `index`'s bytes flipped in
/// `entries.log` (its stored hash left as it was).
fn tampered_copy(dir: &Path, to: &Path, index: u64) {
    std::fs::create_dir_all(to).unwrap();
    for file in std::fs::read_dir(dir).unwrap() {
        let file = file.unwrap();
        if file.file_type().unwrap().is_file() {
            std::fs::copy(file.path(), to.join(file.file_name())).unwrap();
        }
    }
    let log = to.join(ENTRIES_FILE);
    let mut bytes = std::fs::read(&log).unwrap();
    let mut offset = MAGIC.len();
    for _ in 0..index {
        let len = u32::from_be_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
        offset += HEADER_BYTES + len + TRAILER_BYTES;
    }
    let len = u32::from_be_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
    bytes[offset + HEADER_BYTES + len / 2] ^= 0x01;
    std::fs::write(&log, bytes).unwrap();
}

/// A plugin store folder at `root` with two example plugins for each of
/// three tenants, made by the gateway's own store: (tenant, name, digest)
/// of each, sorted; `None` (nothing made) when the guests cannot be built.
fn plugin_store(root: &Path) -> Option<Vec<(String, String, String)>> {
    if !bulkhead_testkit::wasm::available() {
        return None;
    }
    let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
    let (store, _) = PluginRegistry::open(root, engine).unwrap();
    let guard = bulkhead_testkit::wasm::example("prompt-guard");
    let redact = bulkhead_testkit::wasm::example("pii-redact");
    let mut uploaded = Vec::new();
    for tenant in ["t1", "t2", "t3"] {
        for (name, bytes) in [("guard", &guard), ("redact", &redact)] {
            let name = PluginName::parse(name).unwrap();
            let (info, _) = store.upload(tenant, &name, bytes, Some("ops")).unwrap();
            uploaded.push((
                tenant.to_string(),
                name.to_string(),
                info.digest.to_string(),
            ));
        }
    }
    Some(uploaded)
}

/// Writes record `i` of a model registry folder, as a gateway does; its
/// text.
fn registry_record(registry: &Path, i: u32) -> String {
    let name = format!("model-{i}");
    let record = serde_json::json!({
        "version": 1,
        "name": name,
        "dir": format!("/models/{name}"),
        "file": "model.gguf",
        "digest": format!("sha256:{:064x}", i),
        "signature": {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "n": i},
        "registered_at": "2026-12-01T00:00:00.000Z",
        "registered_by": "ops",
    })
    .to_string();
    std::fs::write(registry.join(format!("{name}.json")), &record).unwrap();
    record
}

#[test]
fn an_audit_log_folder_moves_into_postgres_with_its_root_and_checkpoints() {
    let scratch: PathBuf =
        std::env::temp_dir().join(format!("bulkhead-state-migrate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let dir = scratch.join("audit");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (other, _other_schema) = runtime.block_on(TestSchema::new());

    // Opening a new folder records its key's creation: entry 0.
    let (old, _) = AuditLog::open(&AuditSettings::new(&dir)).expect("a file log");
    for i in 0..ENTRIES {
        let (actor, event) = event(i);
        old.append(actor, event).unwrap();
    }
    let kept_note = old.checkpoint().unwrap();
    let covered = old.size();
    assert!(covered >= ENTRIES);
    let kept = scratch.join("kept");
    std::fs::write(&kept, &kept_note).unwrap();
    for i in ENTRIES..ENTRIES + UNCOVERED {
        let (actor, event) = event(i);
        old.append(actor, event).unwrap();
    }
    let size = old.size();
    assert_eq!(size, covered + UNCOVERED);

    // --from must name a folder as files:DIR.
    let out = bulkhead(&[
        "state",
        "migrate",
        "--from",
        path(&dir),
        "--to",
        &settings.url,
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("files:DIR"), "{}", text(&out));

    // A model registry folder of three records, copied alongside.
    let registry = scratch.join("registry");
    std::fs::create_dir_all(&registry).unwrap();
    let records: Vec<String> = (0..3).map(|i| registry_record(&registry, i)).collect();

    // A plugin store folder: three tenants, two plugins each, one bytes
    // shared by all (when the guests can be built here).
    let plugins = scratch.join("plugins");
    let uploaded = plugin_store(&plugins);

    let public = dir.join(PUBLIC_KEY_FILE);
    let mut extra = vec!["--key", path(&public), "--registry", path(&registry)];
    if uploaded.is_some() {
        extra.extend(["--plugins", path(&plugins)]);
    }
    let out = migrate(&dir, &settings.url, &settings.schema, &extra);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    if let Some(uploaded) = &uploaded {
        assert!(
            said.contains(&format!(
                "ok: 6 plugins (2 blobs, 0 version floors) copied in schema {}",
                settings.schema
            )),
            "{said}"
        );
        let stored = runtime.block_on(async {
            let db = bulkhead_state::Db::connect(&settings).await.unwrap();
            let client = db.client().await.unwrap();
            let rows = client
                .query(
                    "SELECT e.tenant, e.name, e.digest, b.bytes FROM plugin_entries e \
                     JOIN plugin_blobs b USING (digest) ORDER BY e.tenant, e.name",
                    &[],
                )
                .await
                .unwrap();
            rows.iter()
                .map(|row| {
                    let bytes: Vec<u8> = row.get(3);
                    let digest: String = row.get(2);
                    assert_eq!(PluginDigest::of(&bytes).to_string(), digest);
                    (row.get::<_, String>(0), row.get::<_, String>(1), digest)
                })
                .collect::<Vec<_>>()
        });
        assert_eq!(&stored, uploaded, "every entry, with its bytes");
    }
    assert!(
        said.contains("ok: 3 model registrations copied (0 already there)"),
        "{said}"
    );
    let stored = runtime.block_on(async {
        let db = bulkhead_state::Db::connect(&settings).await.unwrap();
        let client = db.client().await.unwrap();
        client
            .query("SELECT record FROM registrations ORDER BY name", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| serde_json::from_str::<serde_json::Value>(row.get(0)).unwrap())
            .collect::<Vec<_>>()
    });
    let expected: Vec<serde_json::Value> = records
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    assert_eq!(stored, expected, "every record, field for field");
    assert!(
        said.contains(&format!(
            "ok: {size} entries copied; checkpoint size {covered} verifies in schema {}",
            settings.schema
        )),
        "{said}"
    );

    // An auditor's check against the checkpoint kept before the move.
    let out = bulkhead(&[
        "audit",
        "verify",
        "--state",
        &settings.url,
        "--schema",
        &settings.schema,
        "--key",
        path(&public),
        "--checkpoint",
        path(&kept),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!("ok: {size} entries")),
        "{}",
        text(&out)
    );

    // A replica opens the migrated log: the same entries, root and proofs.
    let store = PgAuditStore::open(&settings).expect("the state database");
    let key = read_signing_key(&dir.join(KEY_FILE)).unwrap();
    let (new, report) = AuditLog::open_store(Box::new(store), key, DEFAULT_ORIGIN).unwrap();
    assert_eq!(report.stored_checkpoint, Some(covered));
    assert_eq!(new.size(), size);
    for i in 0..size {
        assert_eq!(
            new.entries(i, i + 1).unwrap(),
            old.entries(i, i + 1).unwrap(),
            "entry {i}"
        );
    }
    assert_eq!(new.root(size).unwrap(), old.root(size).unwrap());
    let index = 123;
    let proof = old.inclusion_proof(index, covered).unwrap();
    let leaf = leaf_hash(&old.entries(index, index + 1).unwrap()[0]);
    verify_inclusion(&leaf, index, covered, &proof, &new.root(covered).unwrap())
        .expect("an old proof verifies against the migrated log");
    let (actor, event) = event(size);
    assert_eq!(new.append(actor, event).unwrap(), size, "appends go on");
    drop(new);

    // A rerun into the same schema finds the registrations there and
    // refuses the log, naming what it holds.
    let out = migrate(
        &dir,
        &settings.url,
        &settings.schema,
        &["--registry", path(&registry)],
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("ok: 0 model registrations copied (3 already there)"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!(
            "schema `{}` already holds an audit log of {} entries",
            settings.schema,
            size + 1
        )),
        "{}",
        text(&out)
    );

    // A folder whose entry was changed is refused, naming the entry.
    let tampered = scratch.join("tampered");
    tampered_copy(&dir, &tampered, TAMPERED_ENTRY);
    let out = migrate(&tampered, &other.url, &other.schema, &[]);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!("entry {TAMPERED_ENTRY}:")) && said.contains("nothing was copied"),
        "{said}"
    );
    drop(old);
    let _ = std::fs::remove_dir_all(&scratch);
}
