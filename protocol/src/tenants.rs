//! The tenant set on the wire: [`v1::TenantGpu`] to and from
//! `bulkhead_partition`'s [`TenantRequest`], the one place either side
//! converts it. Reading checks what the wire can say but the type cannot
//! (a name, `cus` and `share` both set, an unknown isolation, a wait above
//! [`MAX_KV_WAIT`]); value checks (weights, sizes, over-subscription) are
//! the planner's.

use std::time::Duration;

use bulkhead_partition::{Compute, GpuRequest, Isolation, MAX_KV_WAIT, TenantRequest};

use crate::v1;

/// Longest tenant name accepted (policy ids are far shorter).
pub const MAX_TENANT_BYTES: usize = 256;

impl From<&TenantRequest> for v1::TenantGpu {
    fn from(t: &TenantRequest) -> v1::TenantGpu {
        let gpu = &t.gpu;
        let (cus, share) = match gpu.compute {
            Compute::Unset => (None, None),
            Compute::Cus(n) => (Some(n), None),
            Compute::Share(s) => (None, Some(s)),
        };
        v1::TenantGpu {
            tenant: t.tenant.clone(),
            cus,
            share,
            hbm_bytes: gpu.hbm_bytes,
            isolation: match gpu.isolation {
                Isolation::Dedicated => v1::Isolation::Dedicated,
                Isolation::Shared => v1::Isolation::Shared,
            }
            .into(),
            weight: gpu.weight,
            // Saturates: a wait this long is refused on the other side.
            kv_wait_ms: gpu
                .kv_wait
                .map(|w| u32::try_from(w.as_millis()).unwrap_or(u32::MAX)),
        }
    }
}

/// The request a wire tenant makes, or what is wrong with it (the caller
/// says which entry).
pub fn tenant_request(t: &v1::TenantGpu) -> Result<TenantRequest, String> {
    let name = &t.tenant;
    if name.is_empty() || name.len() > MAX_TENANT_BYTES {
        return Err(format!(
            "tenant must be 1 to {MAX_TENANT_BYTES} bytes, not {}",
            name.len()
        ));
    }
    // A control character (a NUL above all) cannot name the tenant's
    // threads, and no policy tenant id has one.
    if name.chars().any(char::is_control) {
        return Err(format!("tenant {name:?} has a control character"));
    }
    let compute = match (t.cus, t.share) {
        (Some(_), Some(_)) => return Err(format!("tenant `{name}`: set cus or share, not both")),
        (Some(cus), None) => Compute::Cus(cus),
        (None, Some(share)) => Compute::Share(share),
        (None, None) => Compute::Unset,
    };
    let isolation = match v1::Isolation::try_from(t.isolation) {
        Ok(v1::Isolation::Dedicated) => Isolation::Dedicated,
        Ok(v1::Isolation::Shared | v1::Isolation::Unspecified) => Isolation::Shared,
        Err(_) => {
            return Err(format!(
                "tenant `{name}`: unknown isolation {}",
                t.isolation
            ));
        }
    };
    let kv_wait = match t.kv_wait_ms.map(|ms| Duration::from_millis(u64::from(ms))) {
        Some(wait) if wait > MAX_KV_WAIT => {
            return Err(format!(
                "tenant `{name}`: kv_wait_ms {} is above the most, {}",
                wait.as_millis(),
                MAX_KV_WAIT.as_millis()
            ));
        }
        wait => wait,
    };
    Ok(TenantRequest {
        tenant: name.clone(),
        gpu: GpuRequest {
            compute,
            hbm_bytes: t.hbm_bytes,
            isolation,
            weight: if t.weight == 0 { 1 } else { t.weight },
            kv_wait,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_the_wire() {
        let requests = [
            TenantRequest {
                tenant: "own".into(),
                gpu: GpuRequest {
                    compute: Compute::Cus(8),
                    hbm_bytes: Some(1 << 30),
                    isolation: Isolation::Dedicated,
                    weight: 3,
                    kv_wait: Some(Duration::from_millis(1500)),
                },
            },
            TenantRequest {
                tenant: "pooled".into(),
                gpu: GpuRequest {
                    compute: Compute::Share(0.25),
                    ..GpuRequest::default()
                },
            },
        ];
        for request in &requests {
            let wire = v1::TenantGpu::from(request);
            assert_eq!(tenant_request(&wire).as_ref(), Ok(request));
        }
    }

    #[test]
    fn what_the_type_cannot_hold_is_refused() {
        let ok = v1::TenantGpu::from(&TenantRequest {
            tenant: "t".into(),
            gpu: GpuRequest::default(),
        });
        let refused = |wire: v1::TenantGpu| tenant_request(&wire).unwrap_err();
        assert_eq!(
            refused(v1::TenantGpu {
                cus: Some(1),
                share: Some(0.5),
                ..ok.clone()
            }),
            "tenant `t`: set cus or share, not both"
        );
        assert_eq!(
            refused(v1::TenantGpu {
                isolation: 9,
                ..ok.clone()
            }),
            "tenant `t`: unknown isolation 9"
        );
        assert_eq!(
            refused(v1::TenantGpu {
                kv_wait_ms: Some(120_001),
                ..ok.clone()
            }),
            "tenant `t`: kv_wait_ms 120001 is above the most, 120000"
        );
        assert_eq!(
            refused(v1::TenantGpu {
                tenant: "a\0b".into(),
                ..ok.clone()
            }),
            "tenant \"a\\0b\" has a control character"
        );
        assert!(
            refused(v1::TenantGpu {
                tenant: String::new(),
                ..ok
            })
            .starts_with("tenant must be 1 to 256 bytes")
        );
    }
}
