//! Per-tenant rate of control-plane changes (plugin uploads and deletes):
//! each change is compiled and fsync'd into the shared audit log, so one
//! tenant's loop must not flood either. A token bucket per tenant of
//! `changes_per_min`, refilled continuously, kept outside the policy
//! snapshot so a reload keeps each tenant's budget (a changed rate starts
//! a full one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::clock::LimitClock;
use super::tokens::{TokenBucket, TokenDenied};

/// Every tenant's change budget. Cloning shares it.
#[derive(Clone, Debug)]
pub struct ChangeLimiter {
    clock: LimitClock,
    /// Tenant → its rate and bucket. Only authenticated tenants (bounded
    /// by the policy) ever get one.
    buckets: Arc<Mutex<HashMap<String, Budget>>>,
}

/// A tenant's rate and the bucket that enforces it.
type Budget = (u32, Arc<TokenBucket>);

impl ChangeLimiter {
    pub fn new(clock: LimitClock) -> ChangeLimiter {
        ChangeLimiter {
            clock,
            buckets: Arc::default(),
        }
    }

    /// Takes one change from `tenant`'s budget of `per_min`, or says when
    /// the next one is allowed.
    pub fn take(&self, tenant: &str, per_min: u32) -> Result<(), Duration> {
        let bucket = {
            let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
            match buckets.get(tenant) {
                Some((rate, bucket)) if *rate == per_min => Arc::clone(bucket),
                _ => {
                    let bucket = Arc::new(TokenBucket::new(u64::from(per_min), self.clock.clone()));
                    buckets.insert(tenant.to_owned(), (per_min, Arc::clone(&bucket)));
                    bucket
                }
            }
        };
        match bucket.reserve(1) {
            Ok((reservation, _)) => {
                // Spent for good: dropping a used reservation keeps the charge.
                reservation.record_used(1);
                Ok(())
            }
            Err(TokenDenied::Short { retry_after, .. }) => Err(retry_after),
            // `per_min` is at least 1, so one change always fits a full bucket.
            Err(TokenDenied::NeverFits { .. }) => Err(Duration::from_secs(60)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use governor::clock::FakeRelativeClock;

    use super::*;

    #[test]
    fn a_tenant_gets_its_rate_and_no_more_and_others_keep_theirs() {
        let fake = FakeRelativeClock::default();
        let limiter = ChangeLimiter::new(LimitClock::fake(fake.clone()));
        for _ in 0..3 {
            limiter.take("acme", 3).expect("within the budget");
        }
        let retry = limiter.take("acme", 3).unwrap_err();
        assert!(
            retry > Duration::ZERO && retry <= Duration::from_secs(20),
            "{retry:?}"
        );
        // Another tenant is not touched by acme's flood.
        limiter.take("beta", 3).expect("beta's own budget");
        // A third of a minute later acme has one change back.
        fake.advance(Duration::from_secs(20));
        limiter.take("acme", 3).expect("refilled");
        assert!(limiter.take("acme", 3).is_err());
    }
}
