//! The pool of plugin instances, shared among tenants.
//!
//! A request holds one instance per plugin in its chain for as long as it
//! runs (a stream's whole life for `on-chunk`), so a tenant with many slow
//! streams could hold every slot of the engine's pool and fail every other
//! tenant's plugins with `plugin_busy`. Each of the tenants that have
//! plugin chains is therefore **guaranteed** an equal part of the pool
//! (at least one instance) and may borrow beyond it only what no other
//! tenant's unused guarantee reserves. The number of such tenants comes
//! from the policy in force ([`InstanceShares::set_tenants`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::PluginError;

#[derive(Debug)]
pub(crate) struct InstanceShares {
    pool: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Tenants with plugin chains in the policy in force (at least 1).
    tenants: usize,
    /// Instances held now, by tenant (only tenants holding some).
    held: HashMap<Arc<str>, usize>,
    total: usize,
}

impl State {
    fn guarantee(&self, pool: usize) -> usize {
        (pool / self.tenants.max(1)).max(1)
    }

    /// Instances the guarantees of tenants other than `tenant` still
    /// reserve: their part less what they hold, for holders and for the
    /// tenants holding none.
    fn reserved_for_others(&self, tenant: &str, guarantee: usize) -> usize {
        let others_holding = self.held.keys().filter(|t| &***t != tenant).count();
        let idle_tenants = self
            .tenants
            .saturating_sub(1)
            .saturating_sub(others_holding);
        let holders: usize = self
            .held
            .iter()
            .filter(|(t, _)| &***t != tenant)
            .map(|(_, &n)| guarantee.saturating_sub(n))
            .sum();
        idle_tenants * guarantee + holders
    }
}

/// One instance held by a tenant, given back when dropped.
#[derive(Debug)]
pub(crate) struct InstanceLease {
    shares: Arc<InstanceShares>,
    tenant: Arc<str>,
}

impl InstanceShares {
    pub(crate) fn new(pool: usize) -> Arc<InstanceShares> {
        Arc::new(InstanceShares {
            pool,
            state: Mutex::new(State {
                tenants: 1,
                ..State::default()
            }),
        })
    }

    /// How many tenants share the pool (those with plugin chains).
    pub(crate) fn set_tenants(&self, tenants: usize) {
        self.lock().tenants = tenants.max(1);
    }

    /// An instance for `tenant`: within its guarantee, or borrowed from
    /// what no other tenant's guarantee reserves; otherwise `plugin_busy`.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        tenant: &Arc<str>,
        plugin: &Arc<str>,
    ) -> Result<InstanceLease, PluginError> {
        let mut state = self.lock();
        let guarantee = state.guarantee(self.pool);
        let mine = state.held.get(tenant).copied().unwrap_or(0);
        let fits = if mine < guarantee {
            state.total < self.pool
        } else {
            state.total + state.reserved_for_others(tenant, guarantee) < self.pool
        };
        if !fits {
            return Err(PluginError::Busy {
                plugin: Arc::clone(plugin),
            });
        }
        *state.held.entry(Arc::clone(tenant)).or_default() += 1;
        state.total += 1;
        Ok(InstanceLease {
            shares: Arc::clone(self),
            tenant: Arc::clone(tenant),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for InstanceLease {
    fn drop(&mut self) {
        let mut state = self.shares.lock();
        state.total -= 1;
        if let Some(n) = state.held.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                state.held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(shares: &Arc<InstanceShares>, tenant: &str, n: usize) -> Vec<InstanceLease> {
        let (tenant, plugin): (Arc<str>, Arc<str>) = (tenant.into(), "p".into());
        (0..n)
            .map(|_| shares.acquire(&tenant, &plugin).expect("an instance"))
            .collect()
    }

    fn refused(shares: &Arc<InstanceShares>, tenant: &str) -> bool {
        matches!(
            shares.acquire(&tenant.into(), &"p".into()),
            Err(PluginError::Busy { .. })
        )
    }

    #[test]
    fn a_flooding_tenant_leaves_every_other_tenant_its_part() {
        let shares = InstanceShares::new(12);
        shares.set_tenants(3);
        // a takes its 4, then borrows nothing: b's and c's 4 each are theirs.
        let a = take(&shares, "a", 4);
        assert!(refused(&shares, "a"));
        let b = take(&shares, "b", 4);
        let c = take(&shares, "c", 2);
        // c still has 2 reserved, so neither a nor b may borrow beyond theirs.
        assert!(refused(&shares, "b"));
        let c2 = take(&shares, "c", 2);
        assert!(refused(&shares, "c"));
        drop((a, b, c, c2));
        assert_eq!(shares.lock().total, 0);
        assert!(shares.lock().held.is_empty());
    }

    #[test]
    fn a_tenant_borrows_what_no_guarantee_reserves() {
        let shares = InstanceShares::new(10);
        shares.set_tenants(2);
        // Alone among two, a may take its 5; the other 5 stay b's.
        let a = take(&shares, "a", 5);
        assert!(refused(&shares, "a"));
        // Once b holds its part, nothing is left to borrow either.
        let b = take(&shares, "b", 5);
        assert!(refused(&shares, "b"));
        drop(b);
        // With one tenant in the policy, the whole pool is a's.
        shares.set_tenants(1);
        let more = take(&shares, "a", 5);
        assert!(refused(&shares, "a"));
        drop((a, more));
    }

    #[test]
    fn every_tenant_gets_one_however_many_share_the_pool() {
        let shares = InstanceShares::new(4);
        shares.set_tenants(100);
        let held: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|t| take(&shares, t, 1))
            .collect();
        // The pool itself is the hard limit.
        assert!(refused(&shares, "e"));
        drop(held);
    }
}
