//! What a token lets its bearer do: a few named scopes in a bitset.

use std::fmt;
use std::str::FromStr;

/// One permission a token can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `inference`: completions, chat, embeddings, model listing.
    Inference,
    /// `plugins:write`: upload and delete the tenant's plugins.
    PluginsWrite,
    /// `admin`: the operator API (tokens from the operator issuer).
    Admin,
}

impl Scope {
    /// Every scope, in the order they are printed.
    pub const ALL: [Scope; 3] = [Scope::Inference, Scope::PluginsWrite, Scope::Admin];

    /// The name used in the `scope` claim.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Inference => "inference",
            Scope::PluginsWrite => "plugins:write",
            Scope::Admin => "admin",
        }
    }

    const fn bit(self) -> u8 {
        match self {
            Scope::Inference => 1,
            Scope::PluginsWrite => 2,
            Scope::Admin => 4,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown scope name (only the CLI rejects these; tokens ignore them).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown scope `{0}` (known: inference, plugins:write, admin)")]
pub struct UnknownScope(pub String);

impl FromStr for Scope {
    type Err = UnknownScope;

    fn from_str(s: &str) -> Result<Scope, UnknownScope> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| UnknownScope(s.to_owned()))
    }
}

/// A set of [`Scope`]s.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u8);

impl Scopes {
    /// No scope at all.
    pub const NONE: Scopes = Scopes(0);

    /// Whether `scope` is in the set.
    pub const fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// The set with `scope` added.
    #[must_use]
    pub const fn with(self, scope: Scope) -> Scopes {
        Scopes(self.0 | scope.bit())
    }

    /// Adds `scope`.
    pub fn insert(&mut self, scope: Scope) {
        *self = self.with(scope);
    }

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The scopes in the set, in [`Scope::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }

    /// Adds the scopes named in one space-separated `scope` value
    /// (RFC 8693 §4.2); names we do not know are ignored, as a token may
    /// carry scopes meant for other services.
    pub fn add_names(&mut self, names: &str) {
        for name in names.split_ascii_whitespace() {
            if let Ok(scope) = name.parse() {
                self.insert(scope);
            }
        }
    }
}

impl From<Scope> for Scopes {
    fn from(scope: Scope) -> Scopes {
        Scopes::NONE.with(scope)
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Scopes {
        iter.into_iter().fold(Scopes::NONE, Scopes::with)
    }
}

/// Space-separated, as in the `scope` claim.
impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, scope) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(scope.as_str())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_ignored() {
        let mut scopes = Scopes::NONE;
        scopes.add_names("  openid inference\tplugins:write  email ");
        assert!(scopes.contains(Scope::Inference));
        assert!(scopes.contains(Scope::PluginsWrite));
        assert!(!scopes.contains(Scope::Admin));
        assert_eq!(scopes.to_string(), "inference plugins:write");
        for scope in Scope::ALL {
            assert_eq!(scope.as_str().parse::<Scope>(), Ok(scope));
        }
        assert_eq!(
            "Admin".parse::<Scope>().unwrap_err().to_string(),
            "unknown scope `Admin` (known: inference, plugins:write, admin)"
        );
    }

    #[test]
    fn sets_collect_and_print() {
        let scopes: Scopes = [Scope::Admin, Scope::Inference].into_iter().collect();
        assert_eq!(scopes.to_string(), "inference admin");
        assert_eq!(format!("{scopes:?}"), "{Inference, Admin}");
        assert!(Scopes::NONE.is_empty());
        assert_eq!(Scopes::NONE.to_string(), "");
    }
}
