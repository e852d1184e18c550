//! `trust.toml`: the publishers whose keys may sign the models this gateway
//! serves. Keys are read with the policy, so a bad key is a policy error
//! (`trust.toml:line:col`, naming the publisher) and a reload picks up a
//! changed key like any other policy change.

use std::collections::BTreeMap;
use std::path::Path;

use super::PolicyError;
use super::files::Parsed;
use super::files::TrustFile;
use super::names::{NAME_RULE, is_valid_name};
use crate::registration::{Publisher, Trust};
use crate::signing::PublicKey;

/// Most publishers one `trust.toml` may list: each registration is checked
/// against every key, so the list stays short.
pub const MAX_PUBLISHERS: usize = 256;

/// Checks `trust.toml` (absent: no publishers, so no model can be served)
/// and reads every publisher's key, relative to the policy folder `dir`.
pub(super) fn check_trust(
    dir: &Path,
    parsed: Option<&Parsed<TrustFile>>,
    errors: &mut Vec<PolicyError>,
) -> Trust {
    let Some(Parsed {
        source,
        doc: Some(doc),
    }) = parsed
    else {
        return Trust::default();
    };
    if doc.publishers.len() > MAX_PUBLISHERS {
        errors.push(source.error(format!(
            "{} publishers; at most {MAX_PUBLISHERS} may be listed",
            doc.publishers.len()
        )));
        return Trust::default();
    }
    let mut trust = Trust::default();
    // Name → line of its first entry; key hint → the publisher that has it.
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut hints: BTreeMap<String, &str> = BTreeMap::new();
    for publisher in &doc.publishers {
        let name = publisher.name.get_ref();
        if !is_valid_name(name) {
            errors.push(source.error_at(
                publisher.name.span(),
                format!("publisher name `{name}` is not valid: {NAME_RULE}"),
            ));
        } else if let Some(line) = names.get(name.as_str()) {
            errors.push(source.error_at(
                publisher.name.span(),
                format!("publisher `{name}` is already listed on line {line}"),
            ));
        } else {
            names.insert(name, source.line_col(publisher.name.span().start).0);
        }
        let path = dir.join(publisher.public_key.get_ref());
        let key = match PublicKey::from_pem_file(&path) {
            Ok(key) => key,
            Err(e) => {
                errors.push(source.error_at(
                    publisher.public_key.span(),
                    format!("publisher `{name}`: public key {e}"),
                ));
                continue;
            }
        };
        let hint = key.hint();
        if let Some(other) = hints.get(&hint) {
            // One key under two names would make "who published this" a guess.
            errors.push(source.error_at(
                publisher.public_key.span(),
                format!("publisher `{name}` has the same key as publisher `{other}`"),
            ));
            continue;
        }
        hints.insert(hint, name);
        trust.publishers.push(Publisher {
            name: name.clone(),
            key,
        });
    }
    trust
}
