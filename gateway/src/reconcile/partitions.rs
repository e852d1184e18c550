//! The tenants' partitions: the whole tenant set, each tenant's `[gpu]`
//! request with it, sent to the gpu-host (`SetPartitions`) whenever the
//! reconciler brings the host up to date (after the host starts or
//! restarts, after every accepted policy reload, and at each periodic
//! pass; the host ignores a set that gives the layout it has).

use bulkhead_partition::TenantRequest;

use crate::policy::Policy;
use crate::upstream::{Upstream, UpstreamError};

/// The tenant set of `policy`: every tenant's whole `[gpu]` request.
pub(crate) fn tenant_set(policy: &Policy) -> Vec<TenantRequest> {
    policy
        .tenants
        .values()
        .map(|t| TenantRequest {
            tenant: t.id.clone(),
            gpu: t.gpu.clone(),
        })
        .collect()
}

/// Sends `policy`'s tenant set to `host`. A refusal is logged once per
/// distinct message (`last_refusal` remembers it), and the host keeps the
/// layout it has.
pub(super) async fn sync(host: &Upstream, policy: &Policy, last_refusal: &mut Option<String>) {
    match host.set_partitions(&tenant_set(policy)).await {
        Ok(changed) => {
            if changed {
                tracing::info!(
                    tenants = policy.tenants.len(),
                    "the gpu-host re-partitioned"
                );
            }
            *last_refusal = None;
        }
        Err(UpstreamError::InvalidArgument(message)) => {
            if last_refusal.as_deref() != Some(&message) {
                tracing::error!(
                    "the gpu-host refused the tenants' partitions; its previous layout keeps \
                     serving: {message}"
                );
                *last_refusal = Some(message);
            }
        }
        Err(e) => tracing::warn!("cannot send the tenants' partitions to the gpu-host: {e}"),
    }
}
