//! What a tenant's limiters are configured from (policy resolves it from
//! the tenant's and its class's `[limits]`).

/// A tenant's effective limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sustained requests per second (GCRA); at least 1.
    pub requests_per_s: u32,
    /// Requests allowed at once above the sustained rate; at least 1.
    pub burst: u32,
    /// Prompt + completion tokens per minute; at least 1.
    pub tokens_per_min: u64,
    /// Requests in flight at once; at least 1.
    pub max_concurrent: u32,
    /// Largest request body in bytes (never above the gateway's).
    pub max_body_bytes: u64,
    /// Largest `max_tokens` a request may ask for, and the default when it asks none.
    pub max_tokens: u32,
    /// Rate limits per `sub` claim rather than per tenant.
    pub per_sub: bool,
}

impl Limits {
    /// Used where neither the tenant nor its class sets a value: small enough
    /// that a forgotten limit cannot flood a GPU, large enough for a demo.
    pub const DEFAULT: Limits = Limits {
        requests_per_s: 5,
        burst: 10,
        tokens_per_min: 20_000,
        max_concurrent: 4,
        max_body_bytes: 1 << 20,
        max_tokens: 512,
        per_sub: false,
    };

    /// One of `n` replicas' part when each enforces its own: 1/`n` of
    /// every rate and count, rounded down (so the parts never add up to
    /// more) but at least 1. The per-request limits stay whole.
    pub fn share(&self, n: u32) -> Limits {
        let n = n.max(1);
        Limits {
            requests_per_s: (self.requests_per_s / n).max(1),
            burst: (self.burst / n).max(1),
            tokens_per_min: (self.tokens_per_min / u64::from(n)).max(1),
            max_concurrent: (self.max_concurrent / n).max(1),
            ..*self
        }
    }
}
