//! The entries of the audit log: one JSON object per entry, with a fixed
//! schema (documented in `docs/audit-log.md`). Callers build an [`Event`]
//! and an [`Actor`]; the log adds the index and the time and serializes the
//! whole, so a malformed entry cannot be written.
//!
//! The serialized bytes are canonical: compact JSON, fields in the order
//! declared here, objects inside `manifest` with sorted keys. Parsing an
//! entry and serializing it again gives back the same bytes, which is how a
//! verifier rebuilds the exact leaf from the JSON the API serves, and how
//! `audit verify` tells a hand-edited entry from one the gateway wrote.

use serde::{Deserialize, Serialize};

use super::time::Timestamp;

/// One audit entry as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Its position in the log, from 0; equal to its leaf index.
    pub index: u64,
    /// When the gateway wrote it (RFC 3339, UTC, milliseconds).
    pub time: Timestamp,
    pub actor: Actor,
    /// The action and its fields (`"action": "plugin.upload"`, …).
    #[serde(flatten)]
    pub event: Event,
}

impl Entry {
    /// The canonical bytes of this entry.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain structs, strings and numbers cannot fail.
        serde_json::to_vec(self).expect("an audit entry serializes")
    }

    /// Parses stored bytes and checks they are canonical.
    pub fn from_bytes(bytes: &[u8]) -> Result<Entry, String> {
        let entry: Entry = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if entry.to_bytes() != bytes {
            return Err(
                "its bytes are not the canonical form the gateway writes (edited by hand?)"
                    .to_string(),
            );
        }
        Ok(entry)
    }
}

/// Who caused the action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Actor {
    /// A tenant's verified token.
    Tenant {
        tenant: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sub: Option<String>,
    },
    /// An operator: an operator token (its issuer and `sub`), or the person
    /// who edited the policy folder (neither known). `tenant` is only in
    /// entries written before operators had issuers of their own, when an
    /// `admin`-scoped tenant token acted as operator.
    Operator {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        issuer: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tenant: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sub: Option<String>,
    },
    /// The gateway itself (start, its own keys).
    Gateway,
}

/// Longest `sub` an entry keeps as it came. A token's `sub` is the
/// caller's to choose (up to the token's size); every entry is fsync'd and
/// kept forever, so a longer one is cut and its SHA-256 kept instead of the
/// rest, which still tells two long subjects apart.
pub const MAX_SUB_BYTES: usize = 128;

impl Actor {
    /// The actor with a `sub` over [`MAX_SUB_BYTES`] cut: its first 64
    /// bytes (at a character boundary), `…sha256:`, and the first 16 hex
    /// digits of the SHA-256 of the whole `sub`.
    pub fn bounded(mut self) -> Actor {
        if let Actor::Tenant { sub, .. } | Actor::Operator { sub, .. } = &mut self
            && let Some(long) = sub.as_mut().filter(|s| s.len() > MAX_SUB_BYTES)
        {
            use sha2::{Digest, Sha256};
            let digest = Sha256::digest(long.as_bytes());
            let mut cut = 64;
            while !long.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut short = long[..cut].to_owned();
            short.push_str("…sha256:");
            for byte in &digest[..8] {
                short.push_str(&format!("{byte:02x}"));
            }
            *long = short;
        }
        self
    }
}

/// Accepted, or refused with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "lowercase", deny_unknown_fields)]
pub enum Outcome {
    Accepted,
    Refused { reason: String },
}

/// A file and the SHA-256 of its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileDigest {
    /// Relative to the policy folder.
    pub path: String,
    /// `sha256:` and 64 lowercase hex digits.
    pub sha256: String,
}

/// What happened. `action` names the variant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", deny_unknown_fields)]
pub enum Event {
    /// The gateway started, with the policy it loaded.
    #[serde(rename = "gateway.start")]
    GatewayStart {
        /// The gateway's version.
        version: String,
        /// Every policy file loaded.
        policy_files: Vec<FileDigest>,
    },
    /// A model registration, accepted or refused.
    #[serde(rename = "model.register")]
    ModelRegister {
        model: String,
        /// `sha256:HEX` of the manifest's subject.
        digest: String,
        /// The signed manifest as received.
        manifest: serde_json::Value,
        outcome: Outcome,
    },
    /// A model taken out of service, on request or by a failed check.
    #[serde(rename = "model.unregister")]
    ModelUnregister {
        model: String,
        digest: String,
        outcome: Outcome,
    },
    /// A model the gpu-host took out of service because its resident
    /// weights no longer match what was verified at load.
    #[serde(rename = "model.quarantine")]
    ModelQuarantine {
        model: String,
        /// The digest the weights were verified against.
        digest: String,
        /// The gpu-host's finding (which chunk changed).
        reason: String,
    },
    /// A plugin stored for a tenant (new or replacing a version).
    #[serde(rename = "plugin.upload")]
    PluginUpload {
        tenant: String,
        name: String,
        /// `sha256:HEX` of the component.
        digest: String,
        size_bytes: u64,
    },
    /// A plugin removed from a tenant's store.
    #[serde(rename = "plugin.delete")]
    PluginDelete {
        tenant: String,
        name: String,
        /// The digest of the version removed.
        digest: String,
    },
    /// A policy folder reload: every file's digest, and whether it was
    /// published (refused: the previous policy kept serving).
    #[serde(rename = "policy.reload")]
    PolicyReload {
        files: Vec<FileDigest>,
        outcome: Outcome,
    },
    /// A key created, added, removed or rotated.
    #[serde(rename = "key.change")]
    KeyChange {
        /// Which key: `audit`, `tenant:acme:jwt`, …
        key: String,
        /// `created`, `added`, `removed`, `rotated`.
        change: String,
        /// The public key, when there is one (the audit key's vkey).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        public_key: Option<String>,
    },
    /// An operator API call that changes state, with what came of it;
    /// written before the call is answered.
    #[serde(rename = "admin.action")]
    AdminAction {
        /// The route, e.g. `POST /admin/v1/models`.
        route: String,
        /// What it acted on (a model name, …).
        target: String,
        outcome: Outcome,
    },
}

impl Event {
    /// The `action` string.
    pub fn action(&self) -> &'static str {
        match self {
            Event::GatewayStart { .. } => "gateway.start",
            Event::ModelRegister { .. } => "model.register",
            Event::ModelUnregister { .. } => "model.unregister",
            Event::ModelQuarantine { .. } => "model.quarantine",
            Event::PluginUpload { .. } => "plugin.upload",
            Event::PluginDelete { .. } => "plugin.delete",
            Event::PolicyReload { .. } => "policy.reload",
            Event::KeyChange { .. } => "key.change",
            Event::AdminAction { .. } => "admin.action",
        }
    }
}

/// `sha256:` and the lowercase hex of `digest`.
pub fn sha256_text(digest: &[u8; 32]) -> String {
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in digest {
        text.push_str(&format!("{byte:02x}"));
    }
    text
}

/// Policy files and digests as entries list them.
pub fn file_digests(files: &[(std::path::PathBuf, [u8; 32])]) -> Vec<FileDigest> {
    files
        .iter()
        .map(|(path, digest)| FileDigest {
            path: path.to_string_lossy().into_owned(),
            sha256: sha256_text(digest),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn entry(event: Event, actor: Actor) -> Entry {
        Entry {
            index: 7,
            time: Timestamp(1_700_000_000_123),
            actor,
            event,
        }
    }

    #[test]
    fn entries_serialize_to_the_documented_shape() {
        let upload = entry(
            Event::PluginUpload {
                tenant: "acme".into(),
                name: "redact".into(),
                digest: sha256_text(&[0xab; 32]),
                size_bytes: 1234,
            },
            Actor::Tenant {
                tenant: "acme".into(),
                sub: Some("ci-bot".into()),
            },
        );
        let text = String::from_utf8(upload.to_bytes()).unwrap();
        assert_eq!(
            text,
            format!(
                "{{\"index\":7,\"time\":\"2023-11-14T22:13:20.123Z\",\
                 \"actor\":{{\"kind\":\"tenant\",\"tenant\":\"acme\",\"sub\":\"ci-bot\"}},\
                 \"action\":\"plugin.upload\",\"tenant\":\"acme\",\"name\":\"redact\",\
                 \"digest\":\"sha256:{}\",\"size_bytes\":1234}}",
                "ab".repeat(32)
            )
        );
        assert_eq!(Entry::from_bytes(text.as_bytes()).unwrap(), upload);

        let refused = entry(
            Event::PolicyReload {
                files: vec![FileDigest {
                    path: "gateway.toml".into(),
                    sha256: sha256_text(&[0; 32]),
                }],
                outcome: Outcome::Refused {
                    reason: "gateway.toml:3:1: bad".into(),
                },
            },
            Actor::Operator {
                issuer: None,
                tenant: None,
                sub: None,
            },
        );
        let value: serde_json::Value = serde_json::from_slice(&refused.to_bytes()).unwrap();
        assert_eq!(value["actor"], json!({"kind": "operator"}));
        // An operator token's action, and one from before operators had
        // issuers (an admin-scoped tenant token): both canonical.
        for (actor, text) in [
            (
                Actor::Operator {
                    issuer: Some("ops-idp".into()),
                    tenant: None,
                    sub: Some("alice".into()),
                },
                r#"{"kind":"operator","issuer":"ops-idp","sub":"alice"}"#,
            ),
            (
                Actor::Operator {
                    issuer: None,
                    tenant: Some("demo".into()),
                    sub: Some("ops".into()),
                },
                r#"{"kind":"operator","tenant":"demo","sub":"ops"}"#,
            ),
        ] {
            let e = entry(
                Event::GatewayStart {
                    version: "1".into(),
                    policy_files: vec![],
                },
                actor,
            );
            let bytes = e.to_bytes();
            assert!(
                String::from_utf8_lossy(&bytes).contains(text),
                "{}",
                String::from_utf8_lossy(&bytes)
            );
            assert_eq!(Entry::from_bytes(&bytes).unwrap(), e);
        }
        assert_eq!(
            value["outcome"],
            json!({"result": "refused", "reason": "gateway.toml:3:1: bad"})
        );
    }

    #[test]
    fn long_subjects_are_cut_and_hashed() {
        let short = Actor::Tenant {
            tenant: "t".into(),
            sub: Some("ci-bot".into()),
        };
        assert_eq!(short.clone().bounded(), short);
        let long = |fill: &str| Actor::Tenant {
            tenant: "t".into(),
            sub: Some(fill.repeat(6000 / fill.len())),
        };
        let Actor::Tenant { sub: Some(a), .. } = long("x").bounded() else {
            panic!()
        };
        let Actor::Tenant { sub: Some(b), .. } = long("xy").bounded() else {
            panic!()
        };
        assert!(
            a.len() <= MAX_SUB_BYTES && b.len() <= MAX_SUB_BYTES,
            "{a} {b}"
        );
        assert!(
            a.starts_with(&"x".repeat(64)) && a.contains("…sha256:"),
            "{a}"
        );
        assert_ne!(a, b, "different subjects stay different");
        // Never split inside a character.
        let Actor::Tenant { sub: Some(c), .. } = long("é").bounded() else {
            panic!()
        };
        assert!(c.starts_with(&"é".repeat(32)), "{c}");
    }

    #[test]
    fn every_kind_round_trips_canonically() {
        let events = [
            Event::GatewayStart {
                version: "0.1.0".into(),
                policy_files: vec![],
            },
            Event::ModelRegister {
                model: "m".into(),
                digest: sha256_text(&[1; 32]),
                manifest: json!({"z": [1, 2.5, "x"], "a": {"k": null}}),
                outcome: Outcome::Accepted,
            },
            Event::ModelUnregister {
                model: "m".into(),
                digest: sha256_text(&[1; 32]),
                outcome: Outcome::Refused {
                    reason: "not registered".into(),
                },
            },
            Event::ModelQuarantine {
                model: "m".into(),
                digest: sha256_text(&[1; 32]),
                reason: "chunk 3 changed".into(),
            },
            Event::PluginDelete {
                tenant: "t".into(),
                name: "n".into(),
                digest: sha256_text(&[2; 32]),
            },
            Event::KeyChange {
                key: "audit".into(),
                change: "created".into(),
                public_key: Some("log+01020304+AQ==".into()),
            },
            Event::AdminAction {
                route: "DELETE /admin/v1/models/{name}".into(),
                target: "m".into(),
                outcome: Outcome::Refused {
                    reason: "model_configured: …".into(),
                },
            },
        ];
        for event in events {
            let action = event.action();
            let e = entry(event, Actor::Gateway);
            let bytes = e.to_bytes();
            assert!(String::from_utf8_lossy(&bytes).contains(&format!("\"action\":\"{action}\"")));
            assert_eq!(Entry::from_bytes(&bytes).unwrap(), e);
        }
    }

    #[test]
    fn edited_or_malformed_entries_are_refused() {
        let e = entry(
            Event::GatewayStart {
                version: "0.1.0".into(),
                policy_files: vec![],
            },
            Actor::Gateway,
        );
        let text = String::from_utf8(e.to_bytes()).unwrap();
        // Same meaning, other spelling: not what the gateway wrote.
        let spaced = text.replacen(":7,", ": 7,", 1);
        assert!(Entry::from_bytes(spaced.as_bytes()).is_err());
        for bad in [
            text.replacen("gateway.start", "gateway.stop", 1),
            text.replacen("\"kind\":\"gateway\"", "\"kind\":\"gateway\",\"x\":1", 1),
            text.replacen("\"version\"", "\"versio\"", 1),
            text.replacen("2023-11-14T22:13:20.123Z", "yesterday", 1),
            text[..text.len() - 1].to_string(),
        ] {
            assert!(Entry::from_bytes(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
