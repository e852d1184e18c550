//! What can go wrong with the state database, said so that the caller
//! knows whose fault it is and whether a retry can help.

use tokio_postgres::error::SqlState;

/// An error of the state database.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The settings are wrong: the operator fixes `key`; retrying will not help.
    #[error("state database setting `{key}`: {why}")]
    Config {
        /// The setting (or environment variable) at fault.
        key: &'static str,
        /// What is wrong with it and what to do.
        why: String,
    },
    /// The database cannot be reached or is out of connections now; a
    /// later retry may succeed (the gateway answers 503).
    #[error("PostgreSQL at {target} is unavailable: {why}")]
    Unavailable {
        /// `host:port` (or the Unix socket) tried.
        target: String,
        /// What happened.
        why: String,
    },
    /// The schema was migrated by a newer gateway; this one must not touch it.
    #[error(
        "the database schema `{schema}` is at version {found}; this gateway knows up to \
         {known}: upgrade the gateway"
    )]
    NewerSchema {
        /// The schema.
        schema: String,
        /// Its version in `schema_version`.
        found: i32,
        /// [`crate::SCHEMA_VERSION`] of this build.
        known: i32,
    },
    /// A migration failed; it was rolled back and the schema stays at the
    /// version before it.
    #[error(
        "migrating schema `{schema}` to version {version} ({name}) failed: {}",
        error_text(source)
    )]
    Migration {
        /// The schema.
        schema: String,
        /// The migration's version.
        version: i32,
        /// The migration's name.
        name: &'static str,
        /// The database's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// An audit log could not be imported into `schema` (it already holds
    /// one, or the entries given are not a log); nothing was written.
    #[error("importing the audit log into schema `{schema}`: {why}")]
    Import {
        /// The schema.
        schema: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// A statement failed (see [`StateError::is_unavailable`] for whether
    /// the connection, not the statement, was at fault).
    #[error("PostgreSQL query failed: {}", error_text(.0))]
    Query(#[from] tokio_postgres::Error),
}

impl StateError {
    /// Whether this is the database being unreachable, overloaded or
    /// restarting rather than a wrong setting or statement: the gateway
    /// answers 503 and a retry may succeed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StateError::Unavailable { .. } => true,
            StateError::Query(e) | StateError::Migration { source: e, .. } => transient(e),
            StateError::Config { .. }
            | StateError::NewerSchema { .. }
            | StateError::Import { .. } => false,
        }
    }

    /// The error for a connection to `target` that failed: the server
    /// refusing the user or the database is a setting to fix, anything
    /// else (refused, reset, timed out, TLS, too many clients) is
    /// unavailability.
    pub(crate) fn connect(target: &str, error: &tokio_postgres::Error) -> StateError {
        if let Some(db) = error.as_db_error() {
            let code = db.code().code();
            if code.starts_with("28") {
                return StateError::Config {
                    key: "password_file",
                    why: format!(
                        "PostgreSQL at {target} refused the login: {} (check the user in \
                         `url` and the password in `password_file` or PGPASSWORD)",
                        db.message()
                    ),
                };
            }
            if *db.code() == SqlState::INVALID_CATALOG_NAME {
                return StateError::Config {
                    key: "url",
                    why: format!(
                        "PostgreSQL at {target}: {} (create it, or name another database \
                         in `url`)",
                        db.message()
                    ),
                };
            }
        }
        StateError::Unavailable {
            target: target.to_string(),
            why: error_text(error),
        }
    }
}

/// The error with its causes: tokio-postgres's own `Display` names only
/// the kind ("db error", "error connecting to server").
pub(crate) fn error_text(error: &tokio_postgres::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A lost connection, a server shutting down or out of connections, a
/// statement timeout, or a serialization failure: none is the
/// statement's fault.
fn transient(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    let Some(code) = error.code() else {
        // No SQLSTATE: an I/O error on the connection.
        return error.as_db_error().is_none()
            && std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>());
    };
    let code = code.code();
    // 08: connection exception; 53: insufficient resources; 57P0x: admin
    // or crash shutdown, cannot connect now; 57014: statement timeout;
    // 40001/40P01: serialization failure, deadlock.
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || code == "57014"
        || code == "40001"
        || code == "40P01"
}
