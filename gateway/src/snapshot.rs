//! The one immutable value the request path reads: a policy, the token
//! verifiers built from it and the limiters it sets, published together
//! (`ArcSwap`) so a request sees all three from the same policy. Built
//! here from a policy folder, at start and on every reload.

use std::path::Path;

use crate::auth::Verifiers;
use crate::limits::{LimitClock, Limiters};
use crate::policy::{self, Policy, PolicyErrors};

/// Everything a request reads from the control plane, published as one
/// value so a request sees a consistent policy, keys and limits.
#[derive(Debug)]
pub struct Snapshot {
    pub policy: Policy,
    pub verifiers: Verifiers,
    pub limiters: Limiters,
}

/// Loads and validates a policy folder into a snapshot: the policy, its
/// verifiers (key files read) and limiters (state carried over from
/// `previous` for tenants whose limits did not change).
pub fn build_snapshot(dir: &Path, previous: Option<&Snapshot>) -> Result<Snapshot, PolicyErrors> {
    let policy = policy::load(dir)?;
    let verifiers = Verifiers::build(&policy.auth()).map_err(PolicyErrors)?;
    let limiters = match previous {
        Some(previous) => previous.limiters.reconcile(policy.limits()),
        None => Limiters::new(policy.limits(), LimitClock::monotonic()),
    };
    Ok(Snapshot {
        policy,
        verifiers,
        limiters,
    })
}
