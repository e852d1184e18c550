//! The PostgreSQL audit log against the machine's database: two replicas
//! appending to one log, and rows dropped, edited or moved with SQL caught
//! both when a gateway opens the log and by the offline check.

use bulkhead_audit::note::NoteVerifier;
use bulkhead_audit::verify::VerifyError;
use bulkhead_audit::{Actor, AuditError, AuditLog, DEFAULT_ORIGIN, Entry, Event, Outcome};
use ed25519_dalek::SigningKey;

use super::*;
use crate::testing::TestSchema;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[9; 32])
}

fn open(settings: &PgSettings) -> Result<AuditLog, AuditError> {
    let store = PgAuditStore::open(settings).map_err(|e| AuditError::Unavailable(e.to_string()))?;
    Ok(AuditLog::open_store(Box::new(store), key(), DEFAULT_ORIGIN)?.0)
}

fn action(target: &str) -> Event {
    Event::AdminAction {
        route: "test".into(),
        target: target.into(),
        outcome: Outcome::Accepted,
    }
}

fn sql(runtime: &tokio::runtime::Runtime, settings: &PgSettings, statement: &str) {
    runtime.block_on(async {
        let db = Db::connect(settings).await.unwrap();
        db.client()
            .await
            .unwrap()
            .batch_execute(statement)
            .await
            .unwrap();
    });
}

fn verify(
    runtime: &tokio::runtime::Runtime,
    settings: &PgSettings,
    note: Option<&str>,
) -> Result<DbVerified, VerifyError> {
    let public = key().verifying_key();
    let verifier = |origin: &str| NoteVerifier::new(origin, public).map_err(|e| e.to_string());
    runtime.block_on(verify_db(settings, note, &verifier))
}

#[test]
fn two_replicas_append_to_one_log_with_one_checkpoint() {
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (a, b) = (open(&settings).unwrap(), open(&settings).unwrap());
    let writers: Vec<_> = [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(t, log)| {
            std::thread::spawn(move || {
                (0..15)
                    .map(|i| {
                        let tag = format!("{t}-{i}");
                        (log.append(Actor::Gateway, action(&tag)).unwrap(), tag)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let acked: Vec<(u64, String)> = writers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let mut indexes: Vec<u64> = acked.iter().map(|(i, _)| *i).collect();
    indexes.sort_unstable();
    assert_eq!(
        indexes,
        (0..60).collect::<Vec<_>>(),
        "each index taken once"
    );

    let note = a.checkpoint().unwrap();
    assert_eq!(
        note,
        b.checkpoint().unwrap(),
        "both replicas serve one checkpoint"
    );
    for (index, tag) in &acked {
        for log in [&a, &b] {
            let bytes = log.entries(*index, index + 1).unwrap();
            match Entry::from_bytes(&bytes[0]).unwrap().event {
                Event::AdminAction { target, .. } => assert_eq!(&target, tag),
                other => panic!("{other:?}"),
            }
        }
    }
    let proof = b.consistency_proof(10, 60).unwrap();
    bulkhead_audit::merkle::verify_consistency(
        10,
        60,
        &a.root(10).unwrap(),
        &a.root(60).unwrap(),
        &proof,
    )
    .unwrap();
    drop((a, b));

    // A replica that starts later reads the whole log and agrees.
    let c = open(&settings).unwrap();
    assert_eq!(c.size(), 60);
    assert_eq!(c.checkpoint().unwrap(), note);
    let verified = verify(&runtime, &settings, Some(&note)).unwrap();
    assert_eq!((verified.entries, verified.checkpoint.size), (60, 60));
}

#[test]
fn rows_edited_dropped_or_moved_are_caught_at_open_and_by_verify() {
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let log = open(&settings).unwrap();
    for i in 0..8 {
        log.append(Actor::Gateway, action(&i.to_string())).unwrap();
    }
    let kept = log.checkpoint().unwrap();
    drop(log);
    verify(&runtime, &settings, Some(&kept)).unwrap();
    let entry_of = |runtime: &tokio::runtime::Runtime, index: i64| -> Vec<u8> {
        runtime.block_on(async {
            let db = Db::connect(&settings).await.unwrap();
            let client = db.client().await.unwrap();
            let row = client
                .query_one("SELECT entry FROM audit_entries WHERE idx = $1", &[&index])
                .await
                .unwrap();
            row.get(0)
        })
    };
    let original = entry_of(&runtime, 3);

    // The bytes edited, the stored leaf left: named at once.
    sql(
        &runtime,
        &settings,
        "UPDATE audit_entries SET entry = convert_to(replace(convert_from(entry, 'UTF8'), \
         '\"target\":\"3\"', '\"target\":\"x\"'), 'UTF8') WHERE idx = 3",
    );
    assert_ne!(entry_of(&runtime, 3), original, "the edit took");
    let error = open(&settings).unwrap_err();
    assert!(
        matches!(error, AuditError::Damaged { index: 3, .. }),
        "{error}"
    );
    match verify(&runtime, &settings, Some(&kept)) {
        Err(VerifyError::Entry { index: 3, why }) => assert!(why.contains("edited"), "{why}"),
        other => panic!("{other:?}"),
    }

    // The leaf recomputed too: only the kept checkpoint's root shows it.
    sql(
        &runtime,
        &settings,
        "UPDATE audit_entries SET leaf = sha256('\\x00'::bytea || entry) WHERE idx = 3",
    );
    let error = open(&settings).unwrap_err();
    assert!(
        matches!(error, AuditError::Diverged { size: 8, .. }),
        "{error}"
    );
    match verify(&runtime, &settings, Some(&kept)) {
        Err(VerifyError::Log(why)) => assert!(why.contains("root"), "{why}"),
        other => panic!("{other:?}"),
    }

    // Put back; then a row deleted.
    let restore = |runtime: &tokio::runtime::Runtime| {
        runtime.block_on(async {
            let db = Db::connect(&settings).await.unwrap();
            let client = db.client().await.unwrap();
            client
                .execute(
                    "UPDATE audit_entries SET entry = $1, leaf = sha256('\\x00'::bytea || $1) \
                     WHERE idx = 3",
                    &[&original],
                )
                .await
                .unwrap();
        })
    };
    restore(&runtime);
    verify(&runtime, &settings, Some(&kept)).unwrap();
    sql(
        &runtime,
        &settings,
        "DELETE FROM audit_entries WHERE idx = 5",
    );
    let error = open(&settings).unwrap_err();
    assert!(
        matches!(error, AuditError::Damaged { index: 5, .. }),
        "{error}"
    );
    match verify(&runtime, &settings, Some(&kept)) {
        Err(VerifyError::Entry { index: 5, why }) => assert!(why.contains("missing"), "{why}"),
        other => panic!("{other:?}"),
    }

    // Two rows swapped (renumbered): each carries its own index.
    sql(
        &runtime,
        &settings,
        "UPDATE audit_entries SET idx = 5 WHERE idx = 6; \
         UPDATE audit_entries SET idx = 6 WHERE idx = 7; \
         INSERT INTO audit_entries (idx, entry, leaf) SELECT 7, entry, leaf FROM audit_entries WHERE idx = 5",
    );
    assert!(matches!(
        open(&settings).unwrap_err(),
        AuditError::Damaged { index: 5, .. }
    ));
    match verify(&runtime, &settings, Some(&kept)) {
        Err(VerifyError::Entry { index: 5, why }) => assert!(why.contains("moved"), "{why}"),
        other => panic!("{other:?}"),
    }

    // The log cut back to fewer entries than the kept checkpoint covers.
    sql(
        &runtime,
        &settings,
        "DELETE FROM audit_entries WHERE idx >= 5; UPDATE audit_head SET size = 5; \
         DELETE FROM audit_checkpoints WHERE size > 5",
    );
    match verify(&runtime, &settings, Some(&kept)) {
        Err(VerifyError::Entry { index: 5, why }) => assert!(why.contains("missing"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_dead_database_is_named_and_refuses_appends() {
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let mut dead = settings.clone();
    dead.url = "postgres://postgres@127.0.0.1:1/test".into();
    dead.connect_timeout_ms = 500;
    let error = PgAuditStore::open(&dead).unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    assert!(error.to_string().contains("127.0.0.1:1"), "{error}");

    // A log whose connections are cut: appends fail as unavailable, and a
    // later one takes the next index (nothing half-written).
    // Its own application_name, so only its connections are cut (other
    // tests share the server).
    let mut named = settings.clone();
    let separator = if named.url.contains('?') { '&' } else { '?' };
    named.url = format!("{}{separator}application_name={}", named.url, named.schema);
    let log = open(&named).unwrap();
    let first = log.append(Actor::Gateway, action("before")).unwrap();
    let kill = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE pid <> pg_backend_pid() AND application_name = '{}'",
        named.schema
    );
    sql(&runtime, &settings, &kill);
    // The pooled connection is dead: the first try may fail; none may
    // succeed at a wrong index.
    let mut next = None;
    for _ in 0..3 {
        match log.append(Actor::Gateway, action("after")) {
            Ok(index) => {
                next = Some(index);
                break;
            }
            Err(e) => assert!(matches!(e, AuditError::Unavailable(_)), "{e}"),
        }
    }
    assert_eq!(next, Some(first + 1));
}
