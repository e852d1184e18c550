//! Plugins in PostgreSQL against the machine's database: replicas (each a
//! `PluginRegistry` with its own engine over its own `PgPlugins`) on one
//! schema, changes reaching the others through real notices, the cap and
//! the signed versions under concurrent uploads from two replicas, rows
//! edited with SQL, a database that goes away (through a TCP proxy), and a
//! folder store imported.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use bulkhead_plugin_host::{
    CompiledPlugin, LoadReport, PluginEngine, PluginEngineConfig, PluginInfo, PluginLimits,
    PluginName, PluginRegistry, Prompt, Request, Sampling, read_file_store,
};
use bulkhead_testkit::wasm as guests;

use super::*;
use crate::testing::TestSchema;

#[path = "../../../tests/harness/proxy.rs"]
mod proxy;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// An engine as a replica has one (settings for a loaded test machine).
fn engine() -> PluginEngine {
    PluginEngine::new(PluginEngineConfig {
        max_instances: 16,
        max_compiles_in_flight: 8,
        compile_budget: Duration::from_secs(120),
        ..PluginEngineConfig::default()
    })
    .expect("plugin engine")
}

/// A replica: its registry, what it loaded, and its pool (to follow).
fn replica(settings: &PgSettings) -> (PluginRegistry, LoadReport, Db) {
    let store = PgPlugins::open(settings).unwrap_or_else(|e| panic!("{e}"));
    let db = store.db().clone();
    let (registry, report) = PluginRegistry::open_shared(Arc::new(store), None, engine())
        .unwrap_or_else(|e| panic!("opening a replica: {e}"));
    (registry, report, db)
}

fn name(name: &str) -> PluginName {
    PluginName::parse(name).unwrap()
}

/// Whether the plugin uppercases a prompt (`rewrite` does, `echo` not).
fn uppercases(plugin: &CompiledPlugin) -> bool {
    let context = bulkhead_plugin_host::CallContext {
        tenant: Arc::from("acme"),
        plugin: Arc::from("under-test"),
        config: Arc::new(bulkhead_plugin_host::PluginConfig::new()),
        limits: PluginLimits {
            deadline: Duration::from_secs(10),
            ..PluginLimits::default()
        },
    };
    let request = Request {
        model: "m".into(),
        prompt: Prompt::Text("hello".into()),
        sampling: Sampling {
            max_tokens: Some(4),
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
            stop: Vec::new(),
        },
        metadata: Vec::new(),
    };
    let out = plugin
        .instantiate(context)
        .unwrap()
        .on_request(request)
        .unwrap()
        .unwrap();
    out.prompt == Prompt::Text("HELLO".into())
}

/// Polls `done` every 2 ms for up to `limit`; the time it took.
fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

fn sql_blob(runtime: &tokio::runtime::Runtime, settings: &PgSettings, digest: &str) -> Vec<u8> {
    runtime.block_on(async {
        let db = Db::connect(settings).await.unwrap();
        let client = db.client().await.unwrap();
        client
            .query_one(
                "SELECT bytes FROM plugin_blobs WHERE digest = $1",
                &[&digest],
            )
            .await
            .unwrap()
            .get(0)
    })
}

fn count(runtime: &tokio::runtime::Runtime, settings: &PgSettings, table: &str) -> i64 {
    runtime.block_on(async {
        let db = Db::connect(settings).await.unwrap();
        let client = db.client().await.unwrap();
        client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0)
    })
}

#[test]
fn a_change_on_one_replica_reaches_another_within_a_second() {
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (a, _, _) = replica(&settings);
    let (b, _, b_db) = replica(&settings);
    // B follows the database as a gateway does.
    let follower = {
        let _in_runtime = runtime.enter();
        follow_plugins(b_db, b.clone(), PLUGIN_RESYNC)
    };
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));

    // Once B serves this, its LISTEN is in place (it came by a notice or
    // by the first resync, which follows the LISTEN).
    a.upload("beta", &name("warm"), &echo, None).unwrap();
    wait_for(Duration::from_secs(30), || b.get("beta", "warm").is_some())
        .expect("B never caught up");

    // Bytes B already serves (for another tenant): the notice's latency.
    a.upload("acme", &name("x"), &echo, None).unwrap();
    let known = wait_for(Duration::from_secs(5), || b.get("acme", "x").is_some())
        .expect("the upload never reached B");
    // New bytes: B compiles them too, as A did.
    let compiling = Instant::now();
    a.upload("acme", &name("y"), &rewrite, None).unwrap();
    let a_upload = compiling.elapsed();
    let new = wait_for(Duration::from_secs(60), || b.get("acme", "y").is_some())
        .expect("the new plugin never reached B");
    assert!(uppercases(&b.get("acme", "y").unwrap()));
    // A delete.
    a.delete("acme", &name("x")).unwrap();
    let deleted = wait_for(Duration::from_secs(5), || b.get("acme", "x").is_none())
        .expect("the delete never reached B");
    eprintln!(
        "reached B in {known:?} (known bytes), {new:?} (new bytes; A's upload took \
         {a_upload:?}), {deleted:?} (delete)"
    );
    assert!(known < Duration::from_secs(1), "{known:?}");
    assert!(deleted < Duration::from_secs(1), "{deleted:?}");
    assert!(new < Duration::from_secs(1) + a_upload * 2, "{new:?}");
    follower.abort();
}

#[test]
fn concurrent_uploads_from_two_replicas_keep_the_cap_and_the_versions() {
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (a, _, _) = replica(&settings);
    let (b, _, _) = replica(&settings);
    let echo = guests::test_guest("echo");
    let replicas = [("a", &a), ("b", &b)];

    // 40 names from each, at once: exactly the cap gets in.
    let barrier = Barrier::new(2);
    let results: Vec<Result<PluginInfo, StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = replicas
            .iter()
            .map(|(tag, registry)| {
                let (barrier, echo) = (&barrier, &echo);
                scope.spawn(move || {
                    barrier.wait();
                    (0..40)
                        .map(|i| {
                            registry
                                .upload("acme", &name(&format!("{tag}{i}")), echo, None)
                                .map(|(info, _)| info)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let stored = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(stored, MAX_PLUGINS_PER_TENANT);
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(refused, StoreError::TooManyPlugins { max: 64 }),
            "{refused:?}"
        );
    }
    // Then, many times over, one place free and both replicas racing for
    // it: one gets it.
    let mut held: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().map(|info| info.name.clone()))
        .collect();
    for round in 0..20 {
        a.delete("acme", &name(&held.pop().unwrap())).unwrap();
        let barrier = Barrier::new(2);
        let raced: Vec<Result<PluginInfo, StoreError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = replicas
                .iter()
                .map(|(tag, registry)| {
                    let (barrier, echo) = (&barrier, &echo);
                    scope.spawn(move || {
                        barrier.wait();
                        registry
                            .upload("acme", &name(&format!("r{tag}{round}")), echo, None)
                            .map(|(info, _)| info)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<_> = raced.iter().filter_map(|r| r.as_ref().ok()).collect();
        let shown: Vec<_> = raced.iter().map(|r| r.as_ref().map(|i| &i.name)).collect();
        assert_eq!(won.len(), 1, "round {round}: {shown:?}");
        held.push(won[0].name.clone());
    }
    let (c, report, _) = replica(&settings);
    assert_eq!(report.plugins, MAX_PLUGINS_PER_TENANT);
    assert_eq!(c.list("acme").len(), MAX_PLUGINS_PER_TENANT);
    assert_eq!(count(&runtime, &settings, "plugin_blobs"), 1);

    // Signed versions 1..=25 offered by both at once: each taken once.
    let barrier = Barrier::new(2);
    let accepted: Vec<(&str, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = replicas
            .iter()
            .map(|(tag, registry)| {
                let (barrier, echo) = (&barrier, &echo);
                scope.spawn(move || {
                    barrier.wait();
                    let mut taken = Vec::new();
                    for version in 1..=25 {
                        match registry.upload_version(
                            "beta",
                            &name("signed"),
                            echo,
                            None,
                            Some(version),
                        ) {
                            Ok(_) => taken.push((*tag, version)),
                            Err(StoreError::VersionNotNewer {
                                stored, offered, ..
                            }) => assert!(stored >= offered),
                            Err(e) => panic!("{e:?}"),
                        }
                    }
                    taken
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut versions: Vec<u64> = accepted.iter().map(|(_, v)| *v).collect();
    versions.sort_unstable();
    let before = versions.len();
    versions.dedup();
    assert_eq!(
        versions.len(),
        before,
        "a version taken twice: {accepted:?}"
    );
    assert_eq!(versions.last(), Some(&25));
    c.refresh(Some("beta")).unwrap();
    assert_eq!(c.info("beta", "signed").unwrap().version, Some(25));

    // Deleted on A, the floor holds on B.
    a.delete("beta", &name("signed")).unwrap();
    let e = b
        .upload_version("beta", &name("signed"), &echo, None, Some(25))
        .unwrap_err();
    assert!(
        matches!(e, StoreError::VersionNotNewer { stored: 25, .. }),
        "{e:?}"
    );
    b.upload_version("beta", &name("signed"), &echo, None, Some(26))
        .unwrap();
    assert_eq!(count(&runtime, &settings, "plugin_version_floors"), 0);
}

#[test]
fn tenants_sharing_a_blob_never_lose_it_to_each_others_deletes() {
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (a, _, _) = replica(&settings);
    let (b, _, _) = replica(&settings);
    let echo = guests::test_guest("echo");
    let barrier = Barrier::new(2);
    std::thread::scope(|scope| {
        for (tenant, registry) in [("acme", &a), ("beta", &b)] {
            let (barrier, echo) = (&barrier, &echo);
            scope.spawn(move || {
                barrier.wait();
                for _ in 0..15 {
                    registry.upload(tenant, &name("p"), echo, None).unwrap();
                    registry.delete(tenant, &name("p")).unwrap();
                }
                registry.upload(tenant, &name("p"), echo, None).unwrap();
            });
        }
    });
    let (c, report, _) = replica(&settings);
    assert_eq!((report.plugins, report.failed.len()), (2, 0));
    assert!(c.get("acme", "p").is_some() && c.get("beta", "p").is_some());
    a.delete("acme", &name("p")).unwrap();
    assert_eq!(count(&runtime, &settings, "plugin_blobs"), 1);
    b.delete("beta", &name("p")).unwrap();
    assert_eq!(count(&runtime, &settings, "plugin_blobs"), 0);
}

#[test]
fn an_upload_of_bytes_another_tenant_stored_writes_them_again() {
    // Skipping the write would make the upload quicker and tell the tenant
    // that someone else runs the bytes: the row gets a new version anyway
    // (its xmin, the writing transaction, changes).
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (a, _, _) = replica(&settings);
    let echo = guests::test_guest("echo");
    let (info, _) = a.upload("acme", &name("p"), &echo, None).unwrap();
    let digest = info.digest.to_string();
    let writer = || -> String {
        runtime.block_on(async {
            let db = Db::connect(&settings).await.unwrap();
            let client = db.client().await.unwrap();
            client
                .query_one(
                    "SELECT xmin::text FROM plugin_blobs WHERE digest = $1",
                    &[&digest],
                )
                .await
                .unwrap()
                .get(0)
        })
    };
    let first = writer();
    let (_, outcome) = a.upload("beta", &name("q"), &echo, None).unwrap();
    assert_eq!(outcome, UploadOutcome::Created);
    let second = writer();
    assert_ne!(first, second, "the blob row was written again");
    // The same tenant's same upload is still unchanged, and one row holds
    // the bytes.
    let (_, outcome) = a.upload("acme", &name("p"), &echo, None).unwrap();
    assert_eq!(outcome, UploadOutcome::Unchanged);
    assert_eq!(count(&runtime, &settings, "plugin_blobs"), 1);
    assert_eq!(sql_blob(&runtime, &settings, &digest), echo);
}

#[test]
fn a_blob_edited_with_sql_is_refused_at_load_and_refresh() {
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let (a, _, _) = replica(&settings);
    let (b, _, _) = replica(&settings);
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    let (info, _) = a.upload("acme", &name("shout"), &rewrite, None).unwrap();
    let digest = info.digest.to_string();
    // Valid, harmless-looking bytes under the digest of others.
    runtime.block_on(async {
        let db = Db::connect(&settings).await.unwrap();
        let client = db.client().await.unwrap();
        let edited = client
            .execute(
                "UPDATE plugin_blobs SET bytes = $1 WHERE digest = $2",
                &[&echo, &digest],
            )
            .await
            .unwrap();
        assert_eq!(edited, 1);
    });

    let (c, report, _) = replica(&settings);
    assert_eq!((report.plugins, report.failed.len()), (0, 1));
    assert!(
        report.failed[0]
            .reason
            .contains("does not hash to its digest"),
        "{:?}",
        report.failed
    );
    assert!(c.get("acme", "shout").is_none());
    let report = b.refresh(Some("acme")).unwrap();
    assert_eq!(report.failed.len(), 1, "{:?}", report.failed);
    assert!(b.get("acme", "shout").is_none());
    // A keeps serving the bytes it verified when they were uploaded.
    assert!(uppercases(&a.get("acme", "shout").unwrap()));

    // The same upload again repairs the row, and the replicas load it.
    let (_, outcome) = a.upload("acme", &name("shout"), &rewrite, None).unwrap();
    assert_eq!(outcome, UploadOutcome::Replaced);
    assert_eq!(sql_blob(&runtime, &settings, &digest), rewrite);
    c.refresh(Some("acme")).unwrap();
    assert!(uppercases(&c.get("acme", "shout").unwrap()));
}

/// `settings` reaching the test server through `proxy`.
fn through(settings: &PgSettings, proxy: &proxy::Proxy) -> PgSettings {
    let mut via = settings.clone();
    let authority = upstream(settings);
    via.url = settings.url.replacen(&authority, &proxy.addr, 1);
    via.connect_timeout_ms = 1000;
    via
}

/// `host:port` of the test server's URL (`postgres://USER@HOST:PORT/DB`).
fn upstream(settings: &PgSettings) -> String {
    let rest = settings.url.split_once("://").map_or("", |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    assert!(
        host_port.contains(':'),
        "this test needs the test server's URL as postgres://USER@HOST:PORT/DB, not {}",
        settings.url
    );
    host_port.to_string()
}

#[test]
fn with_the_database_gone_changes_answer_unavailable_and_requests_go_on() {
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let proxy = proxy::Proxy::start(&upstream(&settings));
    let (r, _, _) = replica(&through(&settings, &proxy));
    let rewrite = guests::test_guest("rewrite");
    r.upload("acme", &name("shout"), &rewrite, Some("alice"))
        .unwrap();

    proxy.cut();
    let started = Instant::now();
    let e = r
        .upload("acme", &name("other"), &rewrite, None)
        .unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(
        r.delete("acme", &name("shout")),
        Err(StoreError::Unavailable(_))
    ));
    assert!(matches!(r.refresh(None), Err(StoreError::Unavailable(_))));
    // Requests go on with the last plugins known.
    assert!(uppercases(&r.get("acme", "shout").unwrap()));
    assert_eq!(r.list("acme").len(), 1);
    // Acknowledged is kept, refused was not written.
    let (direct, _, _) = replica(&settings);
    let names: Vec<_> = direct.list("acme").into_iter().map(|p| p.name).collect();
    assert_eq!(names, ["shout"]);

    proxy.heal();
    // The pool drops its dead connections as it finds them.
    let mut uploaded = Err(StoreError::Unavailable("not tried".into()));
    for _ in 0..20 {
        uploaded = r.upload("acme", &name("other"), &rewrite, None);
        if uploaded.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(uploaded.unwrap().1, UploadOutcome::Created);
    r.refresh(None).unwrap();
    assert_eq!(r.list("acme").len(), 2);
}

#[test]
fn a_dead_database_fails_the_start_naming_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let mut settings = PgSettings::new(format!("postgres://postgres@{addr}/test"));
    settings.connect_timeout_ms = 1000;
    let started = Instant::now();
    let e = PgPlugins::open(&settings).unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_folder_store_is_imported_whole_once() {
    if !guests::require() {
        return;
    }
    let runtime = runtime();
    let (settings, _schema) = runtime.block_on(TestSchema::new());
    let folder = scratch_folder();
    let (echo, rewrite) = (guests::test_guest("echo"), guests::test_guest("rewrite"));
    let before: Vec<PluginInfo> = {
        let (files, _) = PluginRegistry::open(&folder, engine()).unwrap();
        files
            .upload("acme", &name("echo"), &echo, Some("alice"))
            .unwrap();
        files
            .upload_version("acme", &name("shout"), &rewrite, Some("bob"), Some(3))
            .unwrap();
        files
            .upload_version("beta", &name("gone"), &echo, None, Some(9))
            .unwrap();
        files.delete("beta", &name("gone")).unwrap();
        files.list("acme")
    };
    let contents = read_file_store(&folder).unwrap();
    let imported = runtime
        .block_on(async {
            let db = Db::connect(&settings).await?;
            import_plugins(&db, &contents).await
        })
        .unwrap();
    assert_eq!(
        imported,
        PluginsImported {
            entries: 2,
            blobs: 2,
            floors: 1,
            already_there: false
        }
    );

    let (r, report, _) = replica(&settings);
    assert_eq!((report.plugins, report.failed.len()), (2, 0));
    let after = r.list("acme");
    let key = |p: &PluginInfo| {
        (
            p.name.clone(),
            p.digest,
            p.size_bytes,
            p.created_at,
            p.uploaded_by.clone(),
            p.version,
        )
    };
    assert_eq!(
        after.iter().map(key).collect::<Vec<_>>(),
        before.iter().map(key).collect::<Vec<_>>()
    );
    assert!(uppercases(&r.get("acme", "shout").unwrap()));
    // The deleted plugin's floor came along.
    let e = r
        .upload_version("beta", &name("gone"), &echo, None, Some(9))
        .unwrap_err();
    assert!(
        matches!(e, StoreError::VersionNotNewer { stored: 9, .. }),
        "{e:?}"
    );

    // A rerun changes nothing; another store is not mixed in.
    let again = runtime.block_on(async {
        let db = Db::connect(&settings).await.unwrap();
        import_plugins(&db, &contents).await
    });
    assert!(again.unwrap().already_there);
    r.upload("beta", &name("new"), &echo, None).unwrap();
    let mixed = runtime.block_on(async {
        let db = Db::connect(&settings).await.unwrap();
        import_plugins(&db, &contents).await
    });
    let Err(PluginImportError::Refused { why, .. }) = mixed else {
        panic!("imported into a schema with other plugins: {mixed:?}")
    };
    assert!(why.contains("already holds 3 plugins"), "{why}");
    let _ = std::fs::remove_dir_all(folder.parent().unwrap());
}

fn scratch_folder() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bulkhead-state-plugins-{}",
        crate::testing::unique_suffix()
    ));
    dir.join("store")
}
