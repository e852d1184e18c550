//! The registrations table against the machine's PostgreSQL: two replicas
//! share one namespace and one count limit, a change reaches the other's
//! listener as a notice, a row the database edited is not used, and a
//! database that cannot answer is a refusal to retry (503), not a panic.

use std::time::Duration;

use bulkhead_state::testing::TestSchema;
use bulkhead_state::{Change, PgSettings};

use super::*;

fn record(name: &str, n: u32) -> Record {
    Record::new(
        name.into(),
        format!("/models/{name}").into(),
        "model.gguf".into(),
        format!("sha256:{n:064x}"),
        serde_json::json!({"mediaType": "x", "n": n}),
        "2026-12-01T00:00:00.000Z".into(),
        Some("ops".into()),
    )
}

async fn registry(settings: &PgSettings) -> RegistryDb {
    RegistryDb::new(Db::connect(settings).await.unwrap())
}

#[tokio::test]
async fn replicas_share_names_and_see_each_others_changes() {
    let (settings, _schema) = TestSchema::new().await;
    let a = registry(&settings).await;
    let b = registry(&settings).await;
    let mut changes = bulkhead_state::listen(b.db().clone(), TOPIC, Duration::from_secs(3600));
    assert_eq!(changes.recv().await, Some(Change::Resync), "listening");

    a.insert(&record("m1", 1)).await.unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(1), changes.recv()).await;
    assert_eq!(notice.unwrap(), Some(Change::Changed("m1".into())));
    assert_eq!(b.read("m1").await.unwrap(), Some(record("m1", 1)));
    assert!(b.exists("m1").await.unwrap());
    assert!(matches!(
        b.insert(&record("m1", 2)).await,
        Err(RegistrationError::Exists(name)) if name == "m1"
    ));
    assert_eq!(
        a.read("m1").await.unwrap(),
        Some(record("m1", 1)),
        "unchanged"
    );

    b.remove("m1").await.unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(1), changes.recv()).await;
    assert_eq!(notice.unwrap(), Some(Change::Changed("m1".into())));
    assert_eq!(a.read("m1").await.unwrap(), None);
    a.remove("m1").await.unwrap(); // already gone is fine
}

#[tokio::test]
async fn the_count_limit_holds_across_replicas() {
    let (settings, _schema) = TestSchema::new().await;
    let a = registry(&settings).await;
    let b = registry(&settings).await;
    // Both replicas insert at once, up to one past the limit in all.
    let (ra, rb) = tokio::join!(
        async {
            let mut results = Vec::new();
            for i in 0..MAX_API_REGISTRATIONS as u32 / 2 + 1 {
                results.push(a.insert(&record(&format!("a{i}"), i)).await);
            }
            results
        },
        async {
            let mut results = Vec::new();
            for i in 0..MAX_API_REGISTRATIONS as u32 / 2 {
                results.push(b.insert(&record(&format!("b{i}"), i)).await);
            }
            results
        }
    );
    let refused: Vec<_> = ra.iter().chain(&rb).filter(|r| r.is_err()).collect();
    assert_eq!(refused.len(), 1, "exactly one past the limit");
    assert!(matches!(refused[0], Err(RegistrationError::TooMany(_))));
    assert_eq!(a.read_all().await.unwrap().len(), MAX_API_REGISTRATIONS);
}

#[tokio::test]
async fn rows_the_database_changed_are_not_used() {
    let (settings, _schema) = TestSchema::new().await;
    let a = registry(&settings).await;
    for (i, name) in ["good", "renamed", "garbled"].into_iter().enumerate() {
        a.insert(&record(name, i as u32)).await.unwrap();
    }
    let client = a.db().client().await.unwrap();
    client
        .batch_execute(
            "UPDATE registrations SET record = replace(record, '\"renamed\"', '\"other\"') \
             WHERE name = 'renamed'; \
             UPDATE registrations SET record = '{not json' WHERE name = 'garbled';",
        )
        .await
        .unwrap();
    let names: Vec<String> = a
        .read_all()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["good"]);
    assert_eq!(a.read("renamed").await.unwrap(), None);
}

#[tokio::test]
async fn a_database_that_cannot_answer_is_a_retryable_refusal() {
    let (settings, _schema) = TestSchema::new().await;
    let a = registry(&settings).await;
    a.insert(&record("kept", 1)).await.unwrap();
    // The tables gone from under the pool: every statement fails.
    let client = a.db().client().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", settings.schema))
        .await
        .unwrap();
    drop(client);
    for result in [
        a.insert(&record("new", 2)).await,
        a.remove("kept").await,
        a.read_all().await.map(drop),
    ] {
        match result {
            Err(RegistrationError::Unavailable(why)) => {
                assert!(why.contains("registrations"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
