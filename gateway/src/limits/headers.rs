//! OpenAI's rate-limit headers: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
//! and `retry-after`.

use std::fmt::Write as _;
use std::time::Duration;

/// The values behind OpenAI's `x-ratelimit-*` headers, sent on admitted and
/// rejected requests alike.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitHeaders {
    /// The request bucket's size (`burst`).
    pub limit_requests: u32,
    /// Requests the bucket still holds after this one.
    pub remaining_requests: u32,
    /// Time until the request bucket is full again.
    pub reset_requests: Duration,
    /// `tokens_per_min`.
    pub limit_tokens: u64,
    /// Tokens available after this request's reservation (0 while in debt).
    pub remaining_tokens: u64,
    /// Time until the token bucket is full again.
    pub reset_tokens: Duration,
}

impl RateLimitHeaders {
    /// The six headers as (lower-case name, value) pairs, resets formatted
    /// the way OpenAI prints them (`"1s"`, `"6m0s"`, `"20ms"`).
    pub fn to_header_pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "x-ratelimit-limit-requests",
                self.limit_requests.to_string(),
            ),
            (
                "x-ratelimit-remaining-requests",
                self.remaining_requests.to_string(),
            ),
            (
                "x-ratelimit-reset-requests",
                format_reset(self.reset_requests),
            ),
            ("x-ratelimit-limit-tokens", self.limit_tokens.to_string()),
            (
                "x-ratelimit-remaining-tokens",
                self.remaining_tokens.to_string(),
            ),
            ("x-ratelimit-reset-tokens", format_reset(self.reset_tokens)),
        ]
    }
}

/// A reset time as OpenAI prints it: Go's `time.Duration` format
/// (`"0s"`, `"20ms"`, `"1.5s"`, `"6m0s"`, `"1m30.5s"`, `"1h0m0s"`), rounded
/// *up* to whole milliseconds so a client never retries early and the value
/// stays ASCII (Go would print sub-millisecond values in `µs`).
pub fn format_reset(duration: Duration) -> String {
    let millis = duration.as_nanos().div_ceil(1_000_000);
    if millis == 0 {
        return "0s".to_owned();
    }
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let total_secs = millis / 1000;
    let frac_millis = millis % 1000;
    let hours = total_secs / 3600;
    let minutes = total_secs / 60 % 60;
    let secs = total_secs % 60;
    let mut out = String::new();
    // Writing to a String cannot fail.
    if hours > 0 {
        let _ = write!(out, "{hours}h{minutes}m");
    } else if minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{secs}");
    if frac_millis > 0 {
        let frac = format!("{frac_millis:03}");
        let _ = write!(out, ".{}", frac.trim_end_matches('0'));
    }
    out.push('s');
    out
}

/// `Retry-After` in whole seconds, rounded up and at least 1 (0 would invite
/// an immediate retry that is certain to fail).
pub fn retry_after_secs(duration: Duration) -> u64 {
    let secs = duration.as_nanos().div_ceil(1_000_000_000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_openai_and_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ms"),
            (Duration::from_micros(19_001), "20ms"),
            (Duration::from_millis(20), "20ms"),
            (Duration::from_millis(999), "999ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(8640), "8.64s"),
            (Duration::from_millis(59_999), "59.999s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_millis(90_500), "1m30.5s"),
            (Duration::from_secs(360), "6m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_040), "1h2m3.04s"),
        ];
        for (duration, want) in cases {
            assert_eq!(format_reset(duration), want, "{duration:?}");
        }
    }

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(27)), 27);
    }

    #[test]
    fn header_pairs_name_openai_headers() {
        let headers = RateLimitHeaders {
            limit_requests: 10,
            remaining_requests: 9,
            reset_requests: Duration::from_millis(200),
            limit_tokens: 20_000,
            remaining_tokens: 18_800,
            reset_tokens: Duration::from_millis(3600),
        };
        assert_eq!(
            headers.to_header_pairs(),
            [
                ("x-ratelimit-limit-requests", "10".to_owned()),
                ("x-ratelimit-remaining-requests", "9".to_owned()),
                ("x-ratelimit-reset-requests", "200ms".to_owned()),
                ("x-ratelimit-limit-tokens", "20000".to_owned()),
                ("x-ratelimit-remaining-tokens", "18800".to_owned()),
                ("x-ratelimit-reset-tokens", "3.6s".to_owned()),
            ]
        );
    }
}
