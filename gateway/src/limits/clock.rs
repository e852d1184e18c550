//! One notion of "now" for every limiter. governor's GCRA and our token
//! bucket read the same [`LimitClock`], so advancing a fake clock in a test
//! moves both, and production pays one monotonic clock read per check.

use governor::clock::{Clock, FakeRelativeClock, QuantaClock, QuantaInstant, Reference};
use governor::nanos::Nanos;

/// The clock every limiter of a [`super::Limiters`] table reads: the
/// monotonic clock in production, a [`FakeRelativeClock`] in tests.
///
/// Instants are nanoseconds since an origin shared by all clones, so two
/// limiters built from clones of one clock agree on the time.
#[derive(Clone, Debug)]
pub struct LimitClock(Source);

#[derive(Clone, Debug)]
enum Source {
    /// quanta's TSC-backed monotonic clock (what governor uses by default).
    Monotonic {
        clock: QuantaClock,
        origin: QuantaInstant,
    },
    /// Time that only moves when a test says so.
    Fake(FakeRelativeClock),
}

impl LimitClock {
    /// The real, monotonic clock.
    pub fn monotonic() -> LimitClock {
        let clock = QuantaClock::default();
        let origin = clock.now();
        LimitClock(Source::Monotonic { clock, origin })
    }

    /// A clock that stands still until `clock.advance(..)`; clones of `clock`
    /// kept by the test drive this one.
    pub fn fake(clock: FakeRelativeClock) -> LimitClock {
        LimitClock(Source::Fake(clock))
    }

    /// Nanoseconds since the origin.
    pub(crate) fn now_nanos(&self) -> u64 {
        self.now().as_u64()
    }
}

impl Default for LimitClock {
    fn default() -> LimitClock {
        LimitClock::monotonic()
    }
}

impl Clock for LimitClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        match &self.0 {
            Source::Monotonic { clock, origin } => clock.now().duration_since(*origin),
            Source::Fake(clock) => clock.now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn clones_of_a_fake_clock_share_time() {
        let fake = FakeRelativeClock::default();
        let clock = LimitClock::fake(fake.clone());
        let copy = clock.clone();
        fake.advance(Duration::from_millis(1500));
        assert_eq!(clock.now_nanos(), 1_500_000_000);
        assert_eq!(copy.now_nanos(), 1_500_000_000);
    }

    #[test]
    fn monotonic_clock_does_not_go_back() {
        let clock = LimitClock::monotonic();
        let first = clock.now_nanos();
        let second = clock.clone().now_nanos();
        assert!(second >= first);
    }
}
