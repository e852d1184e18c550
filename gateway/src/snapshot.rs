//! The one immutable value the request path reads: a policy, the token
//! verifiers built from it and the limiters it sets, published together
//! (`ArcSwap`) so a request sees all three from the same policy. Built
//! here from a policy folder, at start and on every reload.

use std::path::Path;

use crate::auth::Verifiers;
use crate::limits::{LimitClock, Limiters, Limits};
use crate::policy::{self, Policy, PolicyErrors};

/// Everything a request reads from the control plane, published as one
/// value so a request sees a consistent policy, keys and limits.
#[derive(Debug)]
pub struct Snapshot {
    pub policy: Policy,
    pub verifiers: Verifiers,
    pub limiters: Limiters,
    /// The limiters enforce 1/`limit_share` of each tenant's limits (1
    /// with the memory store; `replicas` as a shared store's fallback).
    pub limit_share: u32,
}

/// Loads and validates a policy folder into a snapshot: the policy, its
/// verifiers (key files read) and limiters (state carried over from
/// `previous` for tenants whose limits did not change).
pub fn build_snapshot(dir: &Path, previous: Option<&Snapshot>) -> Result<Snapshot, PolicyErrors> {
    let policy = policy::load(dir)?;
    let verifiers = Verifiers::build(&policy.auth()).map_err(PolicyErrors)?;
    // With a shared store these limiters are the fallback, each replica's
    // share; with the memory store, the whole limits. The store is read at
    // start only, and so is the share: a reload that changes `[limits]`
    // takes effect at the next restart, all of it.
    let limit_share = previous.map_or_else(
        || policy.gateway.limit_store.local_share(),
        |previous| previous.limit_share,
    );
    let local: Vec<(&str, Limits)> = policy
        .limits()
        .map(|(id, limits)| (id, limits.share(limit_share)))
        .collect();
    let local = local.iter().map(|(id, limits)| (*id, limits));
    let limiters = match previous {
        Some(previous) => previous.limiters.reconcile(local),
        None => Limiters::new(local, LimitClock::monotonic()),
    };
    Ok(Snapshot {
        policy,
        verifiers,
        limiters,
        limit_share,
    })
}
