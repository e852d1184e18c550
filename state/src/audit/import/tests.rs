//! Importing a log into an empty schema against the machine's database:
//! the copy has the same entries, root and checkpoint and goes on from
//! there; a second import, or one into a log in use, writes nothing.

use bulkhead_audit::merkle::{leaf_hash, verify_inclusion};
use bulkhead_audit::note::NoteVerifier;
use bulkhead_audit::store::Stored;
use bulkhead_audit::{Actor, AuditLog, DEFAULT_ORIGIN, Event, Outcome};
use ed25519_dalek::SigningKey;

use crate::testing::TestSchema;
use crate::{Db, PgAuditStore, PgSettings, StateError, import_log, stored_leaves, verify_db};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn open(settings: &PgSettings) -> AuditLog {
    let store = PgAuditStore::open(settings).unwrap();
    AuditLog::open_store(Box::new(store), key(), DEFAULT_ORIGIN)
        .unwrap()
        .0
}

fn action(target: &str) -> Event {
    Event::AdminAction {
        route: "import-test".into(),
        target: target.into(),
        outcome: Outcome::Accepted,
    }
}

/// A source log of `n` entries (more than one insert batch) with a
/// checkpoint over all but the last 3; its entries as stored, and the note.
fn source(settings: &PgSettings, n: u64) -> (AuditLog, Vec<Stored>, String) {
    let log = open(settings);
    for i in 0..n - 3 {
        log.append(Actor::Gateway, action(&i.to_string())).unwrap();
    }
    let note = log.checkpoint().unwrap();
    for i in n - 3..n {
        log.append(Actor::Gateway, action(&i.to_string())).unwrap();
    }
    let entries = (0..n)
        .zip(log.entries(0, n).unwrap())
        .map(|(index, entry)| Stored {
            index,
            leaf: leaf_hash(&entry),
            entry,
        })
        .collect();
    (log, entries, note)
}

#[test]
fn an_imported_log_keeps_its_root_and_checkpoint_and_goes_on() {
    let runtime = runtime();
    let (from, _from_schema) = runtime.block_on(TestSchema::new());
    let (to, _to_schema) = runtime.block_on(TestSchema::new());
    let n = 1203;
    let (old, entries, note) = source(&from, n);
    let covered = n - 3;

    let copied = runtime.block_on(async {
        let db = Db::connect(&to).await.unwrap();
        let copied = import_log(&db, &entries, &[(covered, note.clone())])
            .await
            .unwrap();
        let leaves = stored_leaves(&db).await.unwrap();
        let expected: Vec<_> = entries.iter().map(|s| (s.index, s.leaf)).collect();
        assert_eq!(leaves, expected, "every row, at its index, with its leaf");
        copied
    });
    assert_eq!(copied, n);

    let public = key().verifying_key();
    let verifier = |origin: &str| NoteVerifier::new(origin, public).map_err(|e| e.to_string());
    let verified = runtime
        .block_on(verify_db(&to, Some(&note), &verifier))
        .unwrap();
    assert_eq!((verified.entries, verified.checkpoint.size), (n, covered));

    let new = open(&to);
    assert_eq!(new.size(), n);
    assert_eq!(new.root(n).unwrap(), old.root(n).unwrap());
    assert_eq!(new.entries(0, n).unwrap(), old.entries(0, n).unwrap());
    let proof = old.inclusion_proof(17, covered).unwrap();
    verify_inclusion(
        &entries[17].leaf,
        17,
        covered,
        &proof,
        &new.root(covered).unwrap(),
    )
    .unwrap();
    assert_eq!(new.append(Actor::Gateway, action("after")).unwrap(), n);
    new.checkpoint().unwrap();

    // A rerun is refused and writes nothing.
    let error = runtime
        .block_on(async {
            let db = Db::connect(&to).await.unwrap();
            import_log(&db, &entries, &[(covered, note.clone())]).await
        })
        .unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error, StateError::Import { .. })
            && text.contains(&format!("already holds an audit log of {} entries", n + 1)),
        "{text}"
    );
    drop(new);
    assert_eq!(open(&to).size(), n + 1);
}

#[test]
fn a_log_with_only_a_checkpoint_or_entries_out_of_order_is_refused() {
    let runtime = runtime();
    let (from, _from_schema) = runtime.block_on(TestSchema::new());
    let (to, _to_schema) = runtime.block_on(TestSchema::new());
    let (_old, mut entries, note) = source(&from, 8);
    runtime.block_on(async {
        let db = Db::connect(&to).await.unwrap();
        // A checkpoint alone (a log whose entries were deleted) is not empty.
        db.client()
            .await
            .unwrap()
            .execute(
                "INSERT INTO audit_checkpoints (size, note) VALUES (5, $1)",
                &[&note],
            )
            .await
            .unwrap();
        let error = import_log(&db, &entries, &[]).await.unwrap_err();
        assert!(error.to_string().contains("1 checkpoints"), "{error}");
        db.client()
            .await
            .unwrap()
            .batch_execute("DELETE FROM audit_checkpoints")
            .await
            .unwrap();

        entries.swap(2, 3);
        let error = import_log(&db, &entries, &[]).await.unwrap_err();
        assert!(
            error.to_string().contains("entry 2 is given as entry 3"),
            "{error}"
        );
        entries.swap(2, 3);
        entries[4].entry.push(b' ');
        let error = import_log(&db, &entries, &[]).await.unwrap_err();
        assert!(error.to_string().contains("entry 4's bytes"), "{error}");
        entries[4].entry.pop();
        let error = import_log(&db, &entries, &[(9, note.clone())])
            .await
            .unwrap_err();
        assert!(error.to_string().contains("size 9"), "{error}");

        let head: i64 = db
            .client()
            .await
            .unwrap()
            .query_one("SELECT size FROM audit_head", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(head, 0, "nothing was written");
        assert_eq!(import_log(&db, &entries, &[(5, note)]).await.unwrap(), 8);
    });
}
