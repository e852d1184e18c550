//! Requests per second with a burst: GCRA through governor, per tenant or
//! per (tenant, `sub`).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use sha2::{Digest, Sha256};

use super::Limits;
use super::clock::LimitClock;

/// Most `sub`s tracked per tenant when limits are per subject. Each costs a
/// small limiter (~100 bytes); the cap keeps a tenant minting subjects from
/// growing the gateway's memory without bound.
pub const MAX_SUBJECTS_PER_TENANT: usize = 10_000;

type Gcra = RateLimiter<NotKeyed, InMemoryState, LimitClock, StateInformationMiddleware>;

/// The request side of the rate-limit headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestState {
    pub limit: u32,
    pub remaining: u32,
    pub reset: Duration,
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RequestDenied {
    /// Over the rate: the next request conforms after `retry_after`.
    Rate {
        retry_after: Duration,
        state: RequestState,
    },
    /// Per-subject limits, the tenant's subject table is full of subjects
    /// that are not idle; the first can be forgotten after `retry_after`.
    TooManySubjects { retry_after: Duration, max: usize },
}

/// One tenant's request limiter(s).
#[derive(Debug)]
pub(crate) struct RequestLimiter {
    quota: Quota,
    clock: LimitClock,
    scope: Scope,
}

#[derive(Debug)]
enum Scope {
    Tenant(Gcra),
    PerSubject(Mutex<SubjectTable>),
}

/// Per-subject limiters, keyed by the SHA-256 of the `sub` (a tenant picks
/// its subjects, up to a token's size each: a digest keeps every key 32
/// bytes), bounded by evicting idle ones: a limiter whose
/// bucket is full is indistinguishable from a fresh one, so forgetting it
/// loses nothing. If the table is full of busy subjects, a *new* subject is
/// refused (never a known one) rather than evicting a busy limiter, which
/// would hand that subject a fresh burst.
#[derive(Debug)]
struct SubjectTable {
    limiters: HashMap<[u8; 32], SubjectLimiter>,
    max: usize,
    /// No entry can be idle before this (clock nanoseconds), so a full table
    /// is not swept again until then.
    next_sweep_at: u64,
}

#[derive(Debug)]
struct SubjectLimiter {
    gcra: Gcra,
    /// The bucket is certainly full from then on (clock nanoseconds).
    full_at: u64,
}

impl RequestLimiter {
    pub(crate) fn new(limits: &Limits, clock: LimitClock) -> RequestLimiter {
        RequestLimiter::with_max_subjects(limits, clock, MAX_SUBJECTS_PER_TENANT)
    }

    pub(crate) fn with_max_subjects(
        limits: &Limits,
        clock: LimitClock,
        max_subjects: usize,
    ) -> RequestLimiter {
        let quota = quota(limits);
        let scope = if limits.per_sub {
            Scope::PerSubject(Mutex::new(SubjectTable {
                limiters: HashMap::new(),
                max: max_subjects.max(1),
                next_sweep_at: 0,
            }))
        } else {
            Scope::Tenant(gcra(quota, &clock))
        };
        RequestLimiter {
            quota,
            clock,
            scope,
        }
    }

    /// Whether this limiter enforces exactly `limits`' request limits (then
    /// a policy reload keeps it, state and all).
    pub(crate) fn enforces(&self, limits: &Limits) -> bool {
        self.quota == quota(limits) && matches!(self.scope, Scope::PerSubject(_)) == limits.per_sub
    }

    pub(crate) fn burst(&self) -> u32 {
        self.quota.burst_size().get()
    }

    pub(crate) fn per_subject(&self) -> bool {
        matches!(self.scope, Scope::PerSubject(_))
    }

    /// Spends one request cell for the tenant, or for `sub` when limits are
    /// per subject (requests without a `sub` share one anonymous bucket).
    pub(crate) fn check(&self, sub: Option<&str>) -> Result<RequestState, RequestDenied> {
        match &self.scope {
            Scope::Tenant(gcra) => self.check_one(gcra).map(|(state, _)| state),
            Scope::PerSubject(table) => {
                let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
                table.check(self, sub.unwrap_or(""))
            }
        }
    }

    /// One GCRA decision; on success also when the bucket will be full.
    fn check_one(&self, gcra: &Gcra) -> Result<(RequestState, u64), RequestDenied> {
        let burst = self.burst();
        let interval = self.quota.replenish_interval();
        match gcra.check() {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                // governor reports whole cells, not the time it holds
                // internally, so the reset is rounded up to a whole emission
                // interval: at most one interval late, never early.
                let reset = interval * (burst - remaining.min(burst));
                let full_at = self.clock.now_nanos().saturating_add(as_nanos(reset));
                let state = RequestState {
                    limit: burst,
                    remaining,
                    reset,
                };
                Ok((state, full_at))
            }
            Err(not_until) => {
                let retry_after = not_until.wait_time_from(self.clock.now());
                // The next cell conforms after `retry_after`; the bucket is
                // full `burst - 1` intervals after that.
                let reset = retry_after + interval * (burst - 1);
                Err(RequestDenied::Rate {
                    retry_after,
                    state: RequestState {
                        limit: burst,
                        remaining: 0,
                        reset,
                    },
                })
            }
        }
    }
}

impl SubjectTable {
    fn check(
        &mut self,
        limiter: &RequestLimiter,
        sub: &str,
    ) -> Result<RequestState, RequestDenied> {
        let key: [u8; 32] = Sha256::digest(sub.as_bytes()).into();
        if let Some(known) = self.limiters.get_mut(&key) {
            let (state, full_at) = limiter.check_one(&known.gcra)?;
            known.full_at = full_at;
            return Ok(state);
        }
        self.make_room(limiter.clock.now_nanos())?;
        let gcra = gcra(limiter.quota, &limiter.clock);
        // A fresh bucket always has room for one request.
        let (state, full_at) = limiter.check_one(&gcra)?;
        self.limiters.insert(key, SubjectLimiter { gcra, full_at });
        Ok(state)
    }

    fn make_room(&mut self, now: u64) -> Result<(), RequestDenied> {
        if self.limiters.len() < self.max {
            return Ok(());
        }
        if now >= self.next_sweep_at {
            self.limiters.retain(|_, limiter| limiter.full_at > now);
            self.next_sweep_at = self
                .limiters
                .values()
                .map(|limiter| limiter.full_at)
                .min()
                .unwrap_or(now);
        }
        if self.limiters.len() < self.max {
            return Ok(());
        }
        Err(RequestDenied::TooManySubjects {
            retry_after: Duration::from_nanos(self.next_sweep_at.saturating_sub(now)),
            max: self.max,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.limiters.len()
    }
}

fn quota(limits: &Limits) -> Quota {
    // Validation guarantees both are at least 1; fall back to 1 regardless.
    let per_second = NonZeroU32::new(limits.requests_per_s).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(limits.burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(per_second).allow_burst(burst)
}

fn gcra(quota: Quota, clock: &LimitClock) -> Gcra {
    RateLimiter::direct_with_clock(quota, clock.clone()).with_middleware()
}

fn as_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    const LIMITS: Limits = Limits {
        requests_per_s: 5,
        burst: 10,
        ..Limits::DEFAULT
    };

    fn limiter(limits: &Limits, max_subjects: usize) -> (RequestLimiter, FakeRelativeClock) {
        let fake = FakeRelativeClock::default();
        let limiter =
            RequestLimiter::with_max_subjects(limits, LimitClock::fake(fake.clone()), max_subjects);
        (limiter, fake)
    }

    fn retry_after(denied: RequestDenied) -> Duration {
        match denied {
            RequestDenied::Rate { retry_after, .. }
            | RequestDenied::TooManySubjects { retry_after, .. } => retry_after,
        }
    }

    #[test]
    fn burst_then_refuse_until_the_next_cell() {
        let (limiter, clock) = limiter(&LIMITS, 1);
        let remaining: Vec<u32> = (0..10)
            .map(|_| limiter.check(None).expect("within burst").remaining)
            .collect();
        assert_eq!(remaining, [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        let denied = limiter.check(None).unwrap_err();
        let RequestDenied::Rate { retry_after, state } = denied else {
            panic!("expected a rate refusal, got {denied:?}");
        };
        assert_eq!(retry_after, Duration::from_millis(200));
        assert_eq!(state.remaining, 0);
        assert_eq!(state.reset, Duration::from_secs(2));
        clock.advance(Duration::from_millis(199));
        assert!(limiter.check(None).is_err());
        clock.advance(Duration::from_millis(1));
        assert_eq!(limiter.check(None).expect("one cell back").remaining, 0);
    }

    #[test]
    fn reset_is_when_the_bucket_is_full_again() {
        let (limiter, clock) = limiter(&LIMITS, 1);
        let mut last = None;
        for _ in 0..4 {
            last = Some(limiter.check(None).expect("within burst"));
        }
        let state = last.expect("checked");
        assert_eq!(state.remaining, 6);
        assert_eq!(state.reset, Duration::from_millis(800));
        clock.advance(state.reset);
        let fresh = limiter.check(None).expect("full again");
        assert_eq!(fresh.remaining, 9);
        assert_eq!(fresh.reset, Duration::from_millis(200));
    }

    #[test]
    fn reset_rounds_up_to_a_whole_interval_between_cells() {
        let limits = Limits {
            requests_per_s: 1,
            burst: 2,
            ..LIMITS
        };
        let (limiter, clock) = limiter(&limits, 1);
        limiter.check(None).expect("first");
        clock.advance(Duration::from_millis(500));
        let state = limiter.check(None).expect("second");
        // Full in fact after 1.5s; governor reports whole cells, so 2s.
        assert_eq!(state.remaining, 0);
        assert_eq!(state.reset, Duration::from_secs(2));
        clock.advance(Duration::from_millis(1500));
        assert_eq!(limiter.check(None).expect("full").remaining, 1);
    }

    #[test]
    fn subjects_have_separate_buckets() {
        let limits = Limits {
            per_sub: true,
            burst: 2,
            ..LIMITS
        };
        let (limiter, _clock) = limiter(&limits, 100);
        assert!(limiter.check(Some("alice")).is_ok());
        assert!(limiter.check(Some("alice")).is_ok());
        assert!(limiter.check(Some("alice")).is_err());
        assert_eq!(limiter.check(Some("bob")).expect("own bucket").remaining, 1);
        // Requests without a subject share one bucket.
        assert!(limiter.check(None).is_ok());
        assert!(limiter.check(None).is_ok());
        assert!(limiter.check(None).is_err());
    }

    #[test]
    fn a_full_subject_table_evicts_idle_subjects_and_refuses_new_ones_while_all_are_busy() {
        let limits = Limits {
            per_sub: true,
            requests_per_s: 1,
            burst: 2,
            ..LIMITS
        };
        let (limiter, clock) = limiter(&limits, 2);
        limiter.check(Some("a")).expect("a");
        limiter.check(Some("b")).expect("b");
        limiter.check(Some("b")).expect("b again");
        // a is full again after 1s, b after 2s.
        let denied = limiter.check(Some("c")).unwrap_err();
        assert!(matches!(
            denied,
            RequestDenied::TooManySubjects { max: 2, .. }
        ));
        assert_eq!(retry_after(denied), Duration::from_secs(1));
        // Known subjects are still served while the table is full.
        assert!(limiter.check(Some("b")).is_err(), "b's own rate");
        clock.advance(Duration::from_millis(999));
        assert!(limiter.check(Some("c")).is_err());
        clock.advance(Duration::from_millis(1));
        assert_eq!(limiter.check(Some("c")).expect("a evicted").remaining, 1);
        let Scope::PerSubject(table) = &limiter.scope else {
            panic!("per subject");
        };
        assert_eq!(table.lock().expect("lock").len(), 2);
        // b kept its state: one cell back after 1s, not a fresh burst.
        assert_eq!(limiter.check(Some("b")).expect("b").remaining, 0);
    }

    #[test]
    fn enforces_compares_rate_burst_and_scope() {
        let (limiter, _clock) = limiter(&LIMITS, 1);
        assert!(limiter.enforces(&LIMITS));
        assert!(limiter.enforces(&Limits {
            tokens_per_min: 1,
            max_concurrent: 1,
            ..LIMITS
        }));
        assert!(!limiter.enforces(&Limits {
            burst: 11,
            ..LIMITS
        }));
        assert!(!limiter.enforces(&Limits {
            requests_per_s: 6,
            ..LIMITS
        }));
        assert!(!limiter.enforces(&Limits {
            per_sub: true,
            ..LIMITS
        }));
    }
}
