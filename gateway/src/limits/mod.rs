//! Per-tenant admission limits, checked after authentication and before any
//! GPU work: requests per second with a burst (GCRA, `governor`), tokens per
//! minute (a token bucket with reservations), and requests in flight; plus
//! the stateless per-request checks (body size, `max_tokens`).
//!
//! # Hot path
//!
//! [`Limiters::admit`] runs, in order: the request rate (per tenant, or per
//! `sub` when the tenant's limits say `per_sub`), the concurrency slot, then
//! the token reservation. A later refusal undoes what can be undone: the
//! concurrency slot is released. A request cell spent at the first step
//! stays spent, as it would for any refused request — otherwise a client
//! could probe the token budget at no request cost.
//!
//! Tokens and concurrency are always per tenant, even with `per_sub`: they
//! stand for GPU capacity the tenant pays for, and splitting them per
//! subject would let a tenant multiply its share by minting subjects. Only
//! the request rate, which protects against one noisy caller, is per `sub`.
//!
//! # Reload
//!
//! A [`Limiters`] is an immutable table of per-tenant limiters, each held by
//! `Arc`. The control plane builds the next one with
//! [`Limiters::reconcile`] and publishes it (`arc_swap::ArcSwap<Limiters>`);
//! the hot path only loads the current table and never takes a lock the
//! control plane holds. A tenant whose request (or token) limits did not
//! change keeps its limiter and so its state; a changed one gets a fresh
//! limiter; a removed tenant is dropped once its last admission ends. The
//! in-flight count carries over even when `max_concurrent` changes, so an
//! [`Admission`] from the old table releases into the counter the new table
//! reads.

mod changes;
mod clock;
mod concurrency;
mod config;
mod headers;
mod requests;
mod shape;
mod shared;
mod store;
mod tenant;
mod tokens;
mod usage;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use tenant::TenantLimiter;

pub use changes::ChangeLimiter;
pub use clock::LimitClock;
pub use concurrency::ConcurrencyGuard;
pub use config::Limits;
pub use headers::{RateLimitHeaders, format_reset, retry_after_secs};
pub use requests::MAX_SUBJECTS_PER_TENANT;
pub use shape::{ShapeError, check_request_shape};
pub use shared::{SharedLimits, StoreUnavailable};
pub use store::{LimitStore, OnStoreError, RedisStore};
pub use tokens::TokenReservation;
pub use usage::journal::{FLUSH_EVERY, Journal, JournalError};
pub use usage::{
    Day, Hour, HourRow, KEPT_DAYS, RequestUsage, Totals, UsageBook, day_of, day_text, hour_of,
    hour_text, parse_hour,
};

/// Every tenant's limiters, for one version of the policy.
#[derive(Debug)]
pub struct Limiters {
    tenants: HashMap<String, TenantLimiter>,
    clock: LimitClock,
}

impl Limiters {
    /// Limiters for the given `(tenant id, limits)` pairs, on `clock`.
    pub fn new<'a>(
        tenants: impl IntoIterator<Item = (&'a str, &'a Limits)>,
        clock: LimitClock,
    ) -> Limiters {
        let tenants = tenants
            .into_iter()
            .map(|(id, limits)| (id.to_owned(), TenantLimiter::new(id, limits, &clock)))
            .collect();
        Limiters { tenants, clock }
    }

    /// The table for reloaded `(tenant id, limits)` pairs, keeping the
    /// state of limiters whose limits did not change (see the module docs).
    pub fn reconcile<'a>(
        &self,
        tenants: impl IntoIterator<Item = (&'a str, &'a Limits)>,
    ) -> Limiters {
        let tenants = tenants
            .into_iter()
            .map(|(id, limits)| {
                let limiter = match self.tenants.get(id) {
                    Some(old) => old.reconciled(limits, &self.clock),
                    None => TenantLimiter::new(id, limits, &self.clock),
                };
                (id.to_owned(), limiter)
            })
            .collect();
        Limiters {
            tenants,
            clock: self.clock.clone(),
        }
    }

    /// Admits one request of tenant `tenant_id` (and JWT subject `sub`)
    /// expected to use `estimated_tokens` (prompt estimate + `max_tokens`),
    /// or says why not. Never blocks; locks only the tenant's own state, for
    /// nanoseconds.
    pub fn admit(
        &self,
        tenant_id: &str,
        sub: Option<&str>,
        estimated_tokens: u64,
    ) -> Result<Admission, Rejection> {
        match self.tenants.get(tenant_id) {
            Some(tenant) => tenant.admit(sub, estimated_tokens),
            None => Err(Rejection {
                reason: RejectReason::UnknownTenant,
                retry_after: None,
                headers: RateLimitHeaders::default(),
                message: format!("tenant `{tenant_id}` has no limits in the current policy"),
            }),
        }
    }

    /// Requests of `tenant_id` in flight now (for metrics).
    pub fn in_flight(&self, tenant_id: &str) -> Option<u32> {
        self.tenants.get(tenant_id).map(TenantLimiter::in_flight)
    }

    /// The clock the limiters read.
    pub fn clock(&self) -> &LimitClock {
        &self.clock
    }
}

/// An admitted request. Holds its concurrency slot and token reservation
/// until dropped: keep it alive with the response (stream), so that a
/// finished, failed or disconnected request releases both.
#[derive(Debug)]
pub struct Admission {
    headers: RateLimitHeaders,
    tokens: TokenReservation,
    _slot: Slot,
}

/// An admitted request's place among the tenant's requests in flight,
/// held for its `Drop`, which releases it.
#[derive(Debug)]
#[expect(dead_code, reason = "held only to be dropped")]
enum Slot {
    /// Counted in this process.
    Local(ConcurrencyGuard),
    /// A lease in the shared store, renewed while held.
    Shared(shared::Lease),
}

impl Admission {
    /// The rate-limit headers to send with the response.
    pub fn headers(&self) -> &RateLimitHeaders {
        &self.headers
    }

    /// The tokens reserved for this request; report usage through it.
    pub fn tokens(&self) -> &TokenReservation {
        &self.tokens
    }
}

/// A refused request: answer 429 (or 403 for [`RejectReason::UnknownTenant`],
/// 400 for [`RejectReason::TooManyTokens`], which no wait helps) with
/// `message`, the rate-limit headers and `Retry-After`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Rejection {
    pub reason: RejectReason,
    /// When a retry can succeed; for [`RejectReason::Concurrency`] a
    /// second (a slot frees when any request ends, which cannot be
    /// foreseen); `None` when waiting will not help
    /// ([`RejectReason::TooManyTokens`], [`RejectReason::UnknownTenant`]).
    pub retry_after: Option<Duration>,
    /// The tenant's limits as they stand (all zero for
    /// [`RejectReason::UnknownTenant`], which has none).
    pub headers: RateLimitHeaders,
    /// For the caller: which limit, the figures, and when to retry.
    pub message: String,
}

impl Rejection {
    /// The `x-ratelimit-*` headers and, when known, `retry-after` (whole
    /// seconds, rounded up).
    pub fn to_header_pairs(&self) -> Vec<(&'static str, String)> {
        if self.reason == RejectReason::UnknownTenant {
            return Vec::new();
        }
        let mut pairs = self.headers.to_header_pairs();
        if let Some(retry_after) = self.retry_after {
            pairs.push(("retry-after", retry_after_secs(retry_after).to_string()));
        }
        pairs
    }
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// Over the request rate (GCRA) of the tenant or its `sub`.
    RequestRate,
    /// Over tokens per minute: enough tokens will be back later.
    TokenRate,
    /// The request alone needs more tokens than a whole minute's budget: it
    /// can never fit.
    TooManyTokens,
    /// `max_concurrent` requests already in flight.
    Concurrency,
    /// Per-`sub` limits, and the tenant already tracks
    /// [`MAX_SUBJECTS_PER_TENANT`] busy subjects.
    TooManySubjects,
    /// The tenant is not in the current policy (it was removed between
    /// authentication and admission).
    UnknownTenant,
}

impl RejectReason {
    /// A stable snake_case name, for metrics labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::RequestRate => "request_rate",
            RejectReason::TokenRate => "token_rate",
            RejectReason::TooManyTokens => "too_many_tokens",
            RejectReason::Concurrency => "concurrency",
            RejectReason::TooManySubjects => "too_many_subjects",
            RejectReason::UnknownTenant => "unknown_tenant",
        }
    }
}
