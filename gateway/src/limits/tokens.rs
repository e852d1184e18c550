//! Tokens per minute: a token bucket of `tokens_per_min` refilling
//! continuously, with reservations that settle on drop.
//!
//! Admission reserves the request's estimate (prompt estimate +
//! `max_tokens`) atomically under a per-tenant mutex held for a few
//! arithmetic operations, never across an `.await`. The [`TokenReservation`]
//! then travels with the request:
//!
//! - [`TokenReservation::record_used`] counts tokens as they are spent
//!   (prompt once processed, completion tokens as they stream);
//! - [`TokenReservation::set_reserved`] replaces the estimate once the exact
//!   figure is known (say the tokenized prompt + `max_tokens`), charging or
//!   refunding the difference at once. Charging may push the bucket below
//!   zero: that debt is real usage, and later requests wait it out;
//! - on drop — normal end, error, or the client disconnecting and the
//!   response stream being dropped — the bucket gets `reserved - used` back,
//!   or is charged `used - reserved` if usage overran the reservation, so the
//!   tenant pays exactly what it used. Usage never reported is refunded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::clock::LimitClock;

/// The bucket counts in token·nanoseconds-per-minute so that continuous
/// refill (`capacity` tokens per minute = `capacity` units per nanosecond) is
/// exact integer arithmetic with no drift.
const NANOS_PER_MINUTE: i128 = 60_000_000_000;

/// One tenant's token bucket.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    capacity: u64,
    clock: LimitClock,
    level: Mutex<Level>,
}

#[derive(Debug)]
struct Level {
    /// Tokens × [`NANOS_PER_MINUTE`]; negative while in debt.
    scaled: i128,
    /// When `scaled` was last brought up to date (clock nanoseconds).
    at: u64,
}

/// The token side of the rate-limit headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TokenState {
    pub limit: u64,
    /// Whole tokens available now (0 while in debt).
    pub remaining: u64,
    /// Time until the bucket is full.
    pub reset: Duration,
}

/// Why a reservation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenDenied {
    /// The request needs more than the whole bucket: it can never fit.
    NeverFits { state: TokenState },
    /// Not enough tokens now; `retry_after` is when `needed` will be.
    Short {
        available: u64,
        retry_after: Duration,
        state: TokenState,
    },
}

impl TokenBucket {
    /// A full bucket of `capacity` tokens.
    pub(crate) fn new(capacity: u64, clock: LimitClock) -> TokenBucket {
        let at = clock.now_nanos();
        TokenBucket {
            capacity,
            clock,
            level: Mutex::new(Level {
                scaled: full_scaled(capacity),
                at,
            }),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Takes `needed` tokens out if they are there, all or nothing.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        needed: u64,
    ) -> Result<(TokenReservation, TokenState), TokenDenied> {
        if needed > self.capacity {
            return Err(TokenDenied::NeverFits { state: self.peek() });
        }
        let cost = scaled(needed);
        let mut level = self.lock_level();
        if level.scaled < cost {
            let deficit = cost - level.scaled;
            return Err(TokenDenied::Short {
                available: whole_tokens(level.scaled),
                retry_after: self.refill_time(deficit),
                state: self.state(&level),
            });
        }
        level.scaled -= cost;
        let state = self.state(&level);
        drop(level);
        let reservation = TokenReservation::new(Bucket::Local(Arc::clone(self)), needed);
        Ok((reservation, state))
    }

    /// The bucket as it stands, taking nothing.
    pub(crate) fn peek(&self) -> TokenState {
        let level = self.lock_level();
        self.state(&level)
    }

    /// Adds `tokens` back (a refund) or, when negative, charges them, going
    /// into debt if need be.
    fn settle(&self, tokens: i128) {
        if tokens == 0 {
            return;
        }
        let mut level = self.lock_level();
        level.scaled = level
            .scaled
            .saturating_add(tokens.saturating_mul(NANOS_PER_MINUTE))
            .min(full_scaled(self.capacity));
    }

    /// The level, refilled up to now.
    fn lock_level(&self) -> std::sync::MutexGuard<'_, Level> {
        // The critical sections are plain arithmetic and cannot panic half
        // way, so a poisoned lock still holds a consistent level.
        let mut level = self.level.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now_nanos();
        if now > level.at {
            let elapsed = i128::from(now - level.at);
            level.scaled = level
                .scaled
                .saturating_add(elapsed.saturating_mul(i128::from(self.capacity)))
                .min(full_scaled(self.capacity));
            level.at = now;
        }
        level
    }

    fn state(&self, level: &Level) -> TokenState {
        TokenState {
            limit: self.capacity,
            remaining: whole_tokens(level.scaled),
            reset: self.refill_time(full_scaled(self.capacity) - level.scaled),
        }
    }

    /// Time to refill `deficit` scaled units, rounded up to the nanosecond.
    fn refill_time(&self, deficit: i128) -> Duration {
        if deficit <= 0 || self.capacity == 0 {
            return Duration::ZERO;
        }
        let nanos = deficit.unsigned_abs().div_ceil(u128::from(self.capacity));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

fn scaled(tokens: u64) -> i128 {
    i128::from(tokens) * NANOS_PER_MINUTE
}

fn full_scaled(capacity: u64) -> i128 {
    scaled(capacity)
}

fn whole_tokens(scaled: i128) -> u64 {
    u64::try_from(scaled.max(0) / NANOS_PER_MINUTE).unwrap_or(u64::MAX)
}

/// Tokens held for one admitted request; settles with the bucket on drop
/// (see the module docs). Shareable: all methods take `&self`.
#[derive(Debug)]
pub struct TokenReservation {
    bucket: Bucket,
    reserved: AtomicU64,
    used: AtomicU64,
}

/// Where a reservation settles.
#[derive(Debug)]
pub(super) enum Bucket {
    /// This process's bucket.
    Local(Arc<TokenBucket>),
    /// The tenant's bucket in a shared store.
    Shared(Box<dyn Settle>),
}

/// A bucket kept elsewhere (the shared store's): takes a settlement
/// without blocking.
pub(super) trait Settle: std::fmt::Debug + Send + Sync {
    /// Gives `tokens` back, or charges them when negative.
    fn settle(&self, tokens: i128);
}

impl Bucket {
    /// Gives `tokens` back, or charges them when negative.
    fn settle(&self, tokens: i128) {
        match self {
            Bucket::Local(bucket) => bucket.settle(tokens),
            Bucket::Shared(sink) => sink.settle(tokens),
        }
    }
}

impl TokenReservation {
    /// `reserved` tokens already taken from `bucket`.
    pub(super) fn new(bucket: Bucket, reserved: u64) -> TokenReservation {
        TokenReservation {
            bucket,
            reserved: AtomicU64::new(reserved),
            used: AtomicU64::new(0),
        }
    }

    /// Tokens currently held for this request.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Acquire)
    }

    /// Tokens reported used so far.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Reports `tokens` more as spent (prompt tokens processed, completion
    /// tokens generated).
    pub fn record_used(&self, tokens: u64) {
        self.used.fetch_add(tokens, Ordering::AcqRel);
    }

    /// Replaces the reservation with `total` tokens, charging the bucket the
    /// difference now (possibly into debt) or refunding it. Meant to be
    /// called once, when the exact prompt size is known; calling it again
    /// applies the new difference.
    pub fn set_reserved(&self, total: u64) {
        let previous = self.reserved.swap(total, Ordering::AcqRel);
        self.bucket.settle(i128::from(previous) - i128::from(total));
    }
}

impl Drop for TokenReservation {
    fn drop(&mut self) {
        let reserved = i128::from(*self.reserved.get_mut());
        let used = i128::from(*self.used.get_mut());
        self.bucket.settle(reserved - used);
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn bucket(capacity: u64) -> (Arc<TokenBucket>, FakeRelativeClock) {
        let fake = FakeRelativeClock::default();
        let bucket = Arc::new(TokenBucket::new(capacity, LimitClock::fake(fake.clone())));
        (bucket, fake)
    }

    fn remaining(bucket: &TokenBucket) -> u64 {
        bucket.peek().remaining
    }

    #[test]
    fn reservation_takes_tokens_and_an_unused_one_refunds_all_on_drop() {
        let (bucket, _clock) = bucket(1000);
        let (reservation, state) = bucket.reserve(300).expect("fits");
        assert_eq!(state.remaining, 700);
        assert_eq!(state.limit, 1000);
        // 300 tokens at 1000/min take 18s to come back.
        assert_eq!(state.reset, Duration::from_secs(18));
        assert_eq!(reservation.reserved(), 300);
        drop(reservation);
        assert_eq!(remaining(&bucket), 1000);
        assert_eq!(bucket.peek().reset, Duration::ZERO);
    }

    #[test]
    fn drop_after_partial_use_charges_only_the_use() {
        // A client that disconnects mid-stream: 120 of 500 tokens were spent.
        let (bucket, _clock) = bucket(1000);
        let (reservation, _) = bucket.reserve(500).expect("fits");
        reservation.record_used(100);
        reservation.record_used(20);
        assert_eq!(reservation.used(), 120);
        assert_eq!(remaining(&bucket), 500);
        drop(reservation);
        assert_eq!(remaining(&bucket), 880);
    }

    #[test]
    fn usage_beyond_the_reservation_is_charged_on_drop() {
        let (bucket, _clock) = bucket(1000);
        let (reservation, _) = bucket.reserve(100).expect("fits");
        reservation.record_used(150);
        drop(reservation);
        assert_eq!(remaining(&bucket), 850);
    }

    #[test]
    fn set_reserved_refunds_a_smaller_total_at_once() {
        let (bucket, _clock) = bucket(1000);
        let (reservation, _) = bucket.reserve(800).expect("fits");
        reservation.set_reserved(500);
        assert_eq!(reservation.reserved(), 500);
        assert_eq!(remaining(&bucket), 500);
        reservation.record_used(500);
        drop(reservation);
        assert_eq!(remaining(&bucket), 500);
    }

    #[test]
    fn set_reserved_charges_into_debt_and_later_requests_wait_it_out() {
        let (bucket, clock) = bucket(1200); // 20 tokens per second
        let (reservation, _) = bucket.reserve(1000).expect("fits");
        // The real prompt was longer than estimated: 1400 in all.
        reservation.set_reserved(1400);
        let state = bucket.peek();
        assert_eq!(state.remaining, 0, "in debt by 200");
        assert_eq!(state.reset, Duration::from_secs(70));
        // Debt 200 + 100 needed = 300 tokens = 15s.
        match bucket.reserve(100) {
            Err(TokenDenied::Short {
                available,
                retry_after,
                ..
            }) => {
                assert_eq!(available, 0);
                assert_eq!(retry_after, Duration::from_secs(15));
            }
            other => panic!("expected a short bucket, got {other:?}"),
        }
        clock.advance(Duration::from_millis(14_950));
        assert!(bucket.reserve(100).is_err(), "still one token short");
        clock.advance(Duration::from_millis(50));
        let (second, state) = bucket.reserve(100).expect("debt paid off");
        assert_eq!(state.remaining, 0);
        reservation.record_used(1400);
        drop((reservation, second));
        assert_eq!(remaining(&bucket), 100);
    }

    #[test]
    fn a_request_larger_than_the_bucket_never_fits() {
        let (bucket, _clock) = bucket(1000);
        assert!(matches!(
            bucket.reserve(1001),
            Err(TokenDenied::NeverFits { .. })
        ));
        assert!(bucket.reserve(1000).is_ok(), "exactly the capacity fits");
    }

    #[test]
    fn refills_continuously_up_to_capacity() {
        let (bucket, clock) = bucket(600); // 10 per second
        let (reservation, _) = bucket.reserve(600).expect("fits");
        reservation.record_used(600);
        drop(reservation);
        assert_eq!(remaining(&bucket), 0);
        clock.advance(Duration::from_millis(150));
        assert_eq!(remaining(&bucket), 1);
        clock.advance(Duration::from_millis(850));
        let state = bucket.peek();
        assert_eq!(state.remaining, 10);
        assert_eq!(state.reset, Duration::from_secs(59));
        clock.advance(Duration::from_secs(3600));
        assert_eq!(remaining(&bucket), 600);
    }

    #[test]
    fn refunds_never_overfill() {
        let (bucket, clock) = bucket(1000);
        let (reservation, _) = bucket.reserve(1000).expect("fits");
        clock.advance(Duration::from_secs(60));
        drop(reservation);
        assert_eq!(remaining(&bucket), 1000);
    }

    #[test]
    fn many_threads_never_overspend_a_frozen_bucket() {
        const CAPACITY: u64 = 50_000;
        let (bucket, _frozen) = bucket(CAPACITY);
        let held: Vec<Vec<TokenReservation>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..16u64)
                .map(|thread| {
                    let bucket = &bucket;
                    scope.spawn(move || {
                        (0..1000u64)
                            .filter_map(|i| bucket.reserve(1 + (thread * 7 + i) % 10).ok())
                            .map(|(reservation, _)| reservation)
                            .collect()
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().expect("worker"))
                .collect()
        });
        let admitted: u64 = held.iter().flatten().map(TokenReservation::reserved).sum();
        // 16 × 1000 requests of 5.5 tokens on average ask for 88,000.
        assert!(admitted <= CAPACITY, "overspent: {admitted}");
        assert!(admitted > CAPACITY - 10, "underspent: {admitted}");
        assert_eq!(remaining(&bucket), CAPACITY - admitted, "no token lost");
        drop(held);
        assert_eq!(remaining(&bucket), CAPACITY);
    }
}
