//! At most `max_concurrent` admitted requests in flight per tenant.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// A tenant's in-flight counter and its current maximum.
///
/// The counter is shared across policy reloads even when `max_concurrent`
/// changes: the requests in flight are a fact about the world, not about the
/// limits, so a reload neither forgets them nor lets a guard from the old
/// table release into a counter nobody reads.
#[derive(Clone, Debug)]
pub(crate) struct ConcurrencyLimiter {
    in_flight: Arc<AtomicU32>,
    max: u32,
}

impl ConcurrencyLimiter {
    pub(crate) fn new(max: u32) -> ConcurrencyLimiter {
        ConcurrencyLimiter {
            in_flight: Arc::new(AtomicU32::new(0)),
            max,
        }
    }

    /// The same counter under a new maximum (requests above it simply wait
    /// for the count to drain below).
    pub(crate) fn with_max(&self, max: u32) -> ConcurrencyLimiter {
        ConcurrencyLimiter {
            in_flight: Arc::clone(&self.in_flight),
            max,
        }
    }

    pub(crate) fn max(&self) -> u32 {
        self.max
    }

    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes a slot if one is free.
    pub(crate) fn try_acquire(&self) -> Option<ConcurrencyGuard> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| ConcurrencyGuard {
                in_flight: Arc::clone(&self.in_flight),
            })
    }
}

/// One in-flight slot; released on drop.
#[derive(Debug)]
pub struct ConcurrencyGuard {
    in_flight: Arc<AtomicU32>,
}

impl Drop for ConcurrencyGuard {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_max_then_release_on_drop() {
        let limiter = ConcurrencyLimiter::new(2);
        let first = limiter.try_acquire().expect("first slot");
        let second = limiter.try_acquire().expect("second slot");
        assert!(limiter.try_acquire().is_none());
        assert_eq!(limiter.in_flight(), 2);
        drop(first);
        assert_eq!(limiter.in_flight(), 1);
        let third = limiter.try_acquire().expect("a freed slot");
        drop((second, third));
        assert_eq!(limiter.in_flight(), 0);
    }

    #[test]
    fn a_new_max_keeps_the_count() {
        let old = ConcurrencyLimiter::new(3);
        let guards: Vec<_> = (0..3).filter_map(|_| old.try_acquire()).collect();
        let new = old.with_max(2);
        assert_eq!(new.in_flight(), 3);
        assert!(new.try_acquire().is_none());
        drop(guards);
        assert_eq!(new.in_flight(), 0);
        assert!(new.try_acquire().is_some());
    }

    #[test]
    fn threads_never_exceed_the_max() {
        const MAX: u32 = 5;
        let limiter = ConcurrencyLimiter::new(MAX);
        let peak = AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..2000 {
                        if let Some(guard) = limiter.try_acquire() {
                            peak.fetch_max(limiter.in_flight(), Ordering::AcqRel);
                            drop(guard);
                        }
                    }
                });
            }
        });
        assert!(peak.load(Ordering::Acquire) <= MAX);
        assert_eq!(limiter.in_flight(), 0);
    }
}
