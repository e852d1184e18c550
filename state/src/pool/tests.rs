//! Against the test PostgreSQL (`BULKHEAD_TEST_POSTGRES`, default
//! postgres://postgres@127.0.0.1:5432/test), each test in a schema of its
//! own that it drops when done.

use std::time::{Duration, Instant};

use super::*;
use tokio_postgres::error::SqlState;

use crate::SCHEMA_VERSION;
use crate::testing::{TestSchema, test_postgres_url};

async fn connect(settings: &PgSettings) -> Db {
    Db::connect(settings)
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

/// The schema holding relation `name` as this session resolves it.
async fn schema_of(client: &Client, name: &str) -> String {
    client
        .query_one(
            "SELECT n.nspname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::text::regclass",
            &[&name],
        )
        .await
        .expect("resolves")
        .get(0)
}

/// A port on loopback that nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[tokio::test]
async fn connect_creates_and_migrates_its_schema_and_queries_are_unqualified() {
    let (settings, schema) = TestSchema::new().await;
    let db = connect(&settings).await;
    assert_eq!(
        db.migrated(),
        Migrated {
            from_version: 0,
            to_version: SCHEMA_VERSION
        }
    );
    assert_eq!(db.schema(), schema.name());
    let client = db.client().await.expect("client");

    let current: String = client
        .query_one("SELECT current_schema()::text", &[])
        .await
        .expect("current_schema")
        .get(0);
    assert_eq!(current, schema.name());
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = $1 ORDER BY table_name",
            &[&schema.name()],
        )
        .await
        .expect("tables")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        tables,
        [
            "audit_checkpoints",
            "audit_entries",
            "audit_head",
            "plugin_blobs",
            "plugin_entries",
            "plugin_version_floors",
            "registrations",
            "schema_version",
        ]
    );
    let version: i32 = client
        .query_one("SELECT version FROM schema_version", &[])
        .await
        .expect("version")
        .get(0);
    assert_eq!(version, SCHEMA_VERSION);
    let size: i64 = client
        .query_one("SELECT size FROM audit_head FOR UPDATE", &[])
        .await
        .expect("the head row")
        .get(0);
    assert_eq!(size, 0);

    // What a session creates without a schema lands in ours, not public.
    client
        .batch_execute("CREATE TABLE scratch (x INT)")
        .await
        .expect("create");
    assert_eq!(schema_of(&client, "scratch").await, schema.name());
    assert_eq!(schema_of(&client, "audit_entries").await, schema.name());
    let in_public: bool = client
        .query_one("SELECT to_regclass('public.scratch') IS NOT NULL", &[])
        .await
        .expect("to_regclass")
        .get(0);
    assert!(!in_public);

    let timeout: String = client
        .query_one("SHOW statement_timeout", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(timeout, "10s", "statement_timeout_ms = 10000 by default");
    let short_leaf = client
        .execute(
            "INSERT INTO audit_entries (idx, entry, leaf) VALUES (0, '', $1)",
            &[&vec![0_u8; 31]],
        )
        .await
        .expect_err("a leaf is 32 bytes");
    assert_eq!(short_leaf.code(), Some(&SqlState::CHECK_VIOLATION));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_together_migrate_once() {
    let (settings, _schema) = TestSchema::new().await;
    let (a, b, c) = tokio::join!(
        Db::connect(&settings),
        Db::connect(&settings),
        Db::connect(&settings)
    );
    let mut from: Vec<i32> = [a, b, c]
        .into_iter()
        .map(|db| db.expect("every replica starts").migrated().from_version)
        .collect();
    from.sort_unstable();
    assert_eq!(
        from,
        [0, SCHEMA_VERSION, SCHEMA_VERSION],
        "one replica migrated; the others waited and found it done"
    );

    let db = connect(&settings).await;
    assert_eq!(db.migrated().from_version, SCHEMA_VERSION);
    let heads: i64 = db
        .client()
        .await
        .expect("client")
        .query_one("SELECT count(*) FROM audit_head", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(heads, 1);
}

#[tokio::test]
async fn a_schema_newer_than_this_build_is_refused() {
    let (settings, schema) = TestSchema::new().await;
    let db = connect(&settings).await;
    db.client()
        .await
        .expect("client")
        .execute("UPDATE schema_version SET version = version + 1", &[])
        .await
        .expect("bump");

    let error = Db::connect(&settings).await.expect_err("newer schema");
    assert!(
        matches!(
            &error,
            StateError::NewerSchema { schema: name, found, known }
                if name == schema.name() && *found == SCHEMA_VERSION + 1 && *known == SCHEMA_VERSION
        ),
        "{error:?}"
    );
    assert!(!error.is_unavailable());
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "is at version {}; this gateway knows up to {SCHEMA_VERSION}: upgrade the gateway",
            SCHEMA_VERSION + 1
        )),
        "{text}"
    );
}

#[tokio::test]
async fn the_pool_reuses_connections_and_bounds_the_wait_for_one() {
    let (mut settings, _schema) = TestSchema::new().await;
    settings.pool_size = 1;
    settings.connect_timeout_ms = 300;
    let db = connect(&settings).await;
    let backend = |db: Db| async move {
        let client = db.client().await.expect("client");
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        pid
    };
    let first = backend(db.clone()).await;
    assert_eq!(
        backend(db.clone()).await,
        first,
        "the same connection again"
    );

    let held = db.client().await.expect("the only connection");
    let started = Instant::now();
    let error = db.client().await.expect_err("none free");
    let waited = started.elapsed();
    assert!(error.is_unavailable(), "{error}");
    assert!(
        error
            .to_string()
            .contains("all 1 pooled connections stayed busy for 300 ms"),
        "{error}"
    );
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    drop(held);
    assert_eq!(backend(db).await, first);
}

#[tokio::test]
async fn a_closed_port_is_unavailable_and_names_the_target() {
    let port = closed_port();
    let mut settings = PgSettings::new(format!("postgres://postgres@127.0.0.1:{port}/test"));
    settings.connect_timeout_ms = 2000;
    let started = Instant::now();
    let error = Db::connect(&settings).await.expect_err("nothing listens");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(error.is_unavailable(), "{error}");
    let target = format!("127.0.0.1:{port}");
    assert!(
        matches!(&error, StateError::Unavailable { target: t, .. } if *t == target),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains(&format!("PostgreSQL at {target} is unavailable")),
        "{text}"
    );
    assert!(text.contains("refused"), "the cause is shown: {text}");
}

#[tokio::test]
async fn a_silent_server_times_out_within_connect_timeout_ms() {
    // Accepts TCP (the kernel does, into the backlog) and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = silent.local_addr().expect("addr").port();
    let mut settings = PgSettings::new(format!("postgres://postgres@127.0.0.1:{port}/test"));
    settings.connect_timeout_ms = 300;
    let started = Instant::now();
    let error = Db::connect(&settings).await.expect_err("no answer");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert!(error.is_unavailable(), "{error}");
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "127.0.0.1:{port} is unavailable: no answer within 300 ms"
        )),
        "{text}"
    );
    drop(silent);
}

#[tokio::test]
async fn a_missing_database_is_a_setting_to_fix() {
    let url = test_postgres_url();
    let (base, query) = url.split_once('?').unwrap_or((&url, ""));
    let (server, _database) = base.rsplit_once('/').expect("the URL names a database");
    let mut settings = PgSettings::new(format!("{server}/bulkhead_no_such_database?{query}"));
    settings.schema = "bulkhead_test_unused".to_string();
    let error = Db::connect(&settings).await.expect_err("no such database");
    assert!(!error.is_unavailable(), "{error}");
    match &error {
        StateError::Config { key: "url", why } => {
            assert!(
                why.contains("\"bulkhead_no_such_database\" does not exist"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_dedicated_connection_forwards_notifications_until_its_reader_falls_behind() {
    let (settings, schema) = TestSchema::new().await;
    let db = connect(&settings).await;
    let mut listener = db.dedicated().await.expect("dedicated");
    let channel = schema.name();
    listener
        .client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .expect("listen");
    let current: String = listener
        .client
        .query_one("SELECT current_schema()::text", &[])
        .await
        .expect("current_schema")
        .get(0);
    assert_eq!(current, channel);

    let notifier = db.client().await.expect("client");
    notifier
        .execute("SELECT pg_notify($1, 'hello')", &[&channel])
        .await
        .expect("notify");
    let notification = tokio::time::timeout(Duration::from_secs(5), listener.notifications.recv())
        .await
        .expect("in time")
        .expect("a notification");
    assert_eq!(notification.channel(), channel);
    assert_eq!(notification.payload(), "hello");

    // More than the buffer, unread: the connection closes. The listener's
    // own next statement is answered after every notification the server
    // sends it, so by then the buffer overflowed and the statement fails.
    let count = NOTIFICATION_BUFFER as i32 + 10;
    notifier
        .execute(
            "SELECT pg_notify($1, g::text) FROM generate_series(1, $2) AS g",
            &[&channel, &count],
        )
        .await
        .expect("notify many");
    let error = listener
        .client
        .batch_execute("SELECT 1")
        .await
        .expect_err("closed: its reader fell behind");
    assert!(StateError::from(error).is_unavailable());
    // The buffered ones are still read, in order; then the channel ends.
    let mut received = 0;
    while let Some(notification) =
        tokio::time::timeout(Duration::from_secs(5), listener.notifications.recv())
            .await
            .expect("the channel ends in time")
    {
        received += 1;
        assert_eq!(notification.payload(), received.to_string());
    }
    assert_eq!(received, NOTIFICATION_BUFFER);
}
