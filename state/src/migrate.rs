//! The schema's migrations (`state/migrations/NNNN_name.sql`), applied in
//! order, each in its own transaction, under a session-level advisory lock
//! keyed by the schema name: replicas starting together migrate once, the
//! others wait and find the work done.

use tokio_postgres::Client;

use crate::StateError;

/// The schema version this build migrates to and knows how to use.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// One step of the schema.
struct Migration {
    /// 1, 2, ...: the version the schema is at once it has run.
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order; never edit one that has shipped, add the next.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "audit",
        sql: include_str!("../migrations/0001_audit.sql"),
    },
    Migration {
        version: 2,
        name: "plugins_registrations",
        sql: include_str!("../migrations/0002_plugins_registrations.sql"),
    },
    Migration {
        version: 3,
        name: "registrations",
        sql: include_str!("../migrations/0003_registrations.sql"),
    },
    Migration {
        version: 4,
        name: "plugins",
        sql: include_str!("../migrations/0004_plugins.sql"),
    },
];

/// What connecting did to the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migrated {
    /// The version found (0: a new schema).
    pub from_version: i32,
    /// The version left ([`SCHEMA_VERSION`]).
    pub to_version: i32,
}

/// The advisory lock's key, hashed by the server (`hashtextextended`) so
/// every build agrees on it; a collision with another lock only makes
/// someone wait.
fn lock_name(schema: &str) -> String {
    format!("bulkhead-state migrate {schema}")
}

/// Creates `schema` if missing and brings it to [`SCHEMA_VERSION`], or
/// refuses a newer one. `client` is a session of its own whose
/// `search_path` is `schema`: the caller closes it afterwards, which also
/// frees the lock if this fails half way.
pub(crate) async fn run(client: &mut Client, schema: &str) -> Result<Migrated, StateError> {
    let lock = lock_name(schema);
    client
        .execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", &[&lock])
        .await?;
    // Checked first so a role without CREATE on the database can use a
    // schema its DBA made.
    let exists: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await?
        .get(0);
    if !exists {
        client
            .batch_execute(&format!("CREATE SCHEMA \"{schema}\""))
            .await?;
    }
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_version (
                 one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
                 version INTEGER NOT NULL CHECK (version >= 0)
             );
             INSERT INTO schema_version (version) VALUES (0) ON CONFLICT DO NOTHING;",
        )
        .await?;
    let found: i32 = client
        .query_one("SELECT version FROM schema_version", &[])
        .await?
        .get(0);
    if found > SCHEMA_VERSION {
        // The caller closes the session anyway; the refusal is the news.
        let _ = unlock(client, &lock).await;
        return Err(StateError::NewerSchema {
            schema: schema.to_string(),
            found,
            known: SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > found) {
        apply(client, schema, migration).await?;
        tracing::info!(
            schema,
            version = migration.version,
            name = migration.name,
            "state database migrated"
        );
    }
    unlock(client, &lock).await?;
    Ok(Migrated {
        from_version: found,
        to_version: SCHEMA_VERSION,
    })
}

/// One migration and its version bump, all or nothing.
async fn apply(client: &mut Client, schema: &str, migration: &Migration) -> Result<(), StateError> {
    let failed = |source| StateError::Migration {
        schema: schema.to_string(),
        version: migration.version,
        name: migration.name,
        source,
    };
    let transaction = client.transaction().await.map_err(failed)?;
    transaction
        .batch_execute(migration.sql)
        .await
        .map_err(failed)?;
    transaction
        .execute(
            "UPDATE schema_version SET version = $1",
            &[&migration.version],
        )
        .await
        .map_err(failed)?;
    transaction.commit().await.map_err(failed)
}

async fn unlock(client: &Client, lock: &str) -> Result<(), StateError> {
    client
        .execute(
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
            &[&lock],
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_one_by_one_and_match_their_files() {
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, i as i32 + 1, "{}", migration.name);
            assert!(!migration.sql.trim().is_empty(), "{}", migration.name);
        }
        assert_eq!(SCHEMA_VERSION, MIGRATIONS.len() as i32);
        let mut files: Vec<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
                .expect("state/migrations")
                .map(|entry| {
                    entry
                        .expect("entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
        files.sort();
        let expected: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.name))
            .collect();
        assert_eq!(
            files, expected,
            "every file in state/migrations is in MIGRATIONS"
        );
    }
}
