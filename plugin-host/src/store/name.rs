//! Plugin names and tenant ids as they appear in store paths.

use std::fmt;

use super::StoreError;

/// The rule a plugin name follows, quoted in errors.
pub const PLUGIN_NAME_RULE: &str =
    "1 to 63 of a-z, 0-9 and `-`, starting with a letter or digit (`^[a-z0-9][a-z0-9-]{0,62}$`)";

/// Longest plugin name or tenant id.
const MAX_NAME_BYTES: usize = 63;

/// A plugin name a tenant chose: `^[a-z0-9][a-z0-9-]{0,62}$`, so it is
/// safe as a file name, in a URL and in a log line.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PluginName(String);

impl PluginName {
    /// `name` if it follows [`PLUGIN_NAME_RULE`].
    pub fn parse(name: &str) -> Result<PluginName, StoreError> {
        if is_valid(name, |c| c == '-') {
            Ok(PluginName(name.to_string()))
        } else {
            Err(StoreError::InvalidName {
                name: printable(name),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether `tenant` is a tenant id as the policy allows them
/// (`[a-z0-9][a-z0-9_-]{0,62}`): checked again here because it becomes a
/// folder name.
pub(crate) fn is_valid_tenant(tenant: &str) -> bool {
    is_valid(tenant, |c| c == '-' || c == '_')
}

fn is_valid(name: &str, extra: impl Fn(char) -> bool) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    first_ok
        && name.len() <= MAX_NAME_BYTES
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra(c))
}

/// A refused name as it can be shown: at most 80 characters, control
/// characters escaped.
fn printable(name: &str) -> String {
    let mut shown: String = name.chars().take(80).flat_map(char::escape_debug).collect();
    if name.chars().count() > 80 {
        shown.push('…');
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_follow_the_rule() {
        for good in ["a", "0", "pii-redact", "v2", &"a".repeat(63)] {
            assert!(PluginName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a_b",
            "Pii",
            "a.b",
            "a/b",
            "..",
            ".hidden",
            "a b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(PluginName::parse(bad), Err(StoreError::InvalidName { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_refused_name_is_shown_escaped_and_cut() {
        let Err(e) = PluginName::parse("a\nb") else {
            panic!("accepted")
        };
        assert!(e.to_string().contains(r"`a\nb`"), "{e}");
        let Err(StoreError::InvalidName { name }) = PluginName::parse(&"x".repeat(500)) else {
            panic!("accepted")
        };
        assert_eq!(name.chars().count(), 81);
    }

    #[test]
    fn tenant_ids_allow_underscores() {
        assert!(is_valid_tenant("acme_eu-1"));
        assert!(!is_valid_tenant("../acme"));
        assert!(!is_valid_tenant(""));
    }
}
