//! What a token lets its bearer do: named scopes in a bitset, each owned by
//! one kind of principal. A tenant's token can only ever carry tenant
//! scopes and an operator's only operator scopes, whatever names the token
//! claims: the verifier keeps the names its issuer's kind may grant and
//! drops the rest.

use std::fmt;
use std::str::FromStr;

/// Who a scope belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Principal {
    /// A tenant's token, from the tenant's own issuer.
    Tenant,
    /// An operator's token, from an issuer in `gateway.toml`'s `[operator]`.
    Operator,
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Principal::Tenant => "tenant",
            Principal::Operator => "operator",
        })
    }
}

/// One permission a token can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Tenant: completions, chat, its model list and its usage.
    Inference,
    /// Tenant: upload, list and delete its plugins, and read its own
    /// entries in the audit log.
    PluginsWrite,
    /// Operator: list registered models.
    ModelsRead,
    /// Operator: register and unregister models.
    ModelsWrite,
    /// Operator: the whole audit log, checkpoints and proofs.
    AuditRead,
    /// Operator: the gpu-host's partitions.
    PartitionsRead,
    /// Operator: the tenants and their effective policy.
    TenantsRead,
    /// Operator: every tenant's usage.
    UsageRead,
    /// Operator: the gpu-hosts, their state, load and models.
    GpuHostsRead,
    /// Operator: drain a gpu-host and put it back.
    GpuHostsWrite,
}

impl Scope {
    /// Every scope, in the order they are printed.
    pub const ALL: [Scope; 10] = [
        Scope::Inference,
        Scope::PluginsWrite,
        Scope::ModelsRead,
        Scope::ModelsWrite,
        Scope::AuditRead,
        Scope::PartitionsRead,
        Scope::TenantsRead,
        Scope::UsageRead,
        Scope::GpuHostsRead,
        Scope::GpuHostsWrite,
    ];

    /// The name used in the `scope` claim.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Inference => "inference",
            Scope::PluginsWrite => "plugins:write",
            Scope::ModelsRead => "models:read",
            Scope::ModelsWrite => "models:write",
            Scope::AuditRead => "audit:read",
            Scope::PartitionsRead => "partitions:read",
            Scope::TenantsRead => "tenants:read",
            Scope::UsageRead => "usage:read",
            Scope::GpuHostsRead => "gpu-hosts:read",
            Scope::GpuHostsWrite => "gpu-hosts:write",
        }
    }

    /// The kind of principal whose tokens may carry this scope.
    pub const fn principal(self) -> Principal {
        match self {
            Scope::Inference | Scope::PluginsWrite => Principal::Tenant,
            _ => Principal::Operator,
        }
    }

    /// The scopes `principal`'s tokens may carry, in print order.
    pub fn of(principal: Principal) -> impl Iterator<Item = Scope> {
        Scope::ALL
            .into_iter()
            .filter(move |s| s.principal() == principal)
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown scope name (only the CLI rejects these; tokens ignore them).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown scope `{name}` (tenant scopes: {}; operator scopes: {}){}",
    names(Principal::Tenant),
    names(Principal::Operator),
    hint(name)
)]
pub struct UnknownScope {
    pub name: String,
}

fn names(principal: Principal) -> String {
    Scope::of(principal)
        .map(Scope::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn hint(name: &str) -> &'static str {
    if name == "admin" {
        "; `admin` is gone: operators have their own issuer ([operator] in gateway.toml) \
         and fine-grained scopes"
    } else {
        ""
    }
}

impl FromStr for Scope {
    type Err = UnknownScope;

    fn from_str(s: &str) -> Result<Scope, UnknownScope> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.as_str() == s)
            .ok_or_else(|| UnknownScope { name: s.to_owned() })
    }
}

/// A set of [`Scope`]s.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u16);

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

    /// Only the scopes `principal` may hold.
    #[must_use]
    pub fn only(self, principal: Principal) -> Scopes {
        self.iter().filter(|s| s.principal() == principal).collect()
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
        scopes.add_names("  openid inference\tplugins:write admin email ");
        assert!(scopes.contains(Scope::Inference));
        assert!(scopes.contains(Scope::PluginsWrite));
        assert_eq!(scopes.to_string(), "inference plugins:write");
        for scope in Scope::ALL {
            assert_eq!(scope.as_str().parse::<Scope>(), Ok(scope));
        }
        let unknown = "Admin".parse::<Scope>().unwrap_err().to_string();
        assert!(
            unknown.starts_with("unknown scope `Admin` (tenant scopes: inference, plugins:write; operator scopes: models:read, models:write, audit:read,"),
            "{unknown}"
        );
        let gone = "admin".parse::<Scope>().unwrap_err().to_string();
        assert!(gone.contains("`admin` is gone"), "{gone}");
    }

    #[test]
    fn each_principal_keeps_only_its_own_scopes() {
        let mut claimed = Scopes::NONE;
        claimed.add_names(
            "inference plugins:write models:read models:write audit:read partitions:read \
             tenants:read usage:read gpu-hosts:read gpu-hosts:write",
        );
        assert_eq!(claimed.iter().count(), Scope::ALL.len());
        let tenant = claimed.only(Principal::Tenant);
        assert_eq!(tenant.to_string(), "inference plugins:write");
        let operator = claimed.only(Principal::Operator);
        assert!(!operator.contains(Scope::Inference));
        assert!(!operator.contains(Scope::PluginsWrite));
        assert_eq!(operator.iter().count(), 8);
        assert!(Scope::of(Principal::Tenant).all(|s| s.principal() == Principal::Tenant));
    }

    #[test]
    fn sets_collect_and_print() {
        let scopes: Scopes = [Scope::AuditRead, Scope::ModelsRead].into_iter().collect();
        assert_eq!(scopes.to_string(), "models:read audit:read");
        assert_eq!(format!("{scopes:?}"), "{ModelsRead, AuditRead}");
        assert!(Scopes::NONE.is_empty());
        assert_eq!(Scopes::NONE.to_string(), "");
    }
}
