//! One tenant's limiters and the admission sequence: request rate →
//! concurrency → tokens.

use std::sync::Arc;
use std::time::Duration;

use super::Limits;
use super::clock::LimitClock;
use super::concurrency::ConcurrencyLimiter;
use super::headers::{RateLimitHeaders, retry_after_secs};
use super::requests::{RequestDenied, RequestLimiter, RequestState};
use super::tokens::{TokenBucket, TokenDenied, TokenState};
use super::{Admission, RejectReason, Rejection, Slot};

/// A tenant's limiters. Cheap to clone: each part is shared, so a reload
/// can keep some parts (and their state) and replace others.
#[derive(Clone, Debug)]
pub(super) struct TenantLimiter {
    id: Arc<str>,
    requests_per_s: u32,
    requests: Arc<RequestLimiter>,
    tokens: Arc<TokenBucket>,
    concurrency: ConcurrencyLimiter,
}

impl TenantLimiter {
    pub(super) fn new(id: &str, limits: &Limits, clock: &LimitClock) -> TenantLimiter {
        TenantLimiter {
            id: id.into(),
            requests_per_s: limits.requests_per_s,
            requests: Arc::new(RequestLimiter::new(limits, clock.clone())),
            tokens: Arc::new(TokenBucket::new(limits.tokens_per_min, clock.clone())),
            concurrency: ConcurrencyLimiter::new(limits.max_concurrent),
        }
    }

    /// This tenant under (possibly) new `limits`: each part whose limits are
    /// unchanged is kept with its state, the others start fresh; the
    /// in-flight count always carries over.
    pub(super) fn reconciled(&self, limits: &Limits, clock: &LimitClock) -> TenantLimiter {
        let requests = if self.requests.enforces(limits) {
            Arc::clone(&self.requests)
        } else {
            Arc::new(RequestLimiter::new(limits, clock.clone()))
        };
        let tokens = if self.tokens.capacity() == limits.tokens_per_min {
            Arc::clone(&self.tokens)
        } else {
            Arc::new(TokenBucket::new(limits.tokens_per_min, clock.clone()))
        };
        TenantLimiter {
            id: Arc::clone(&self.id),
            requests_per_s: limits.requests_per_s,
            requests,
            tokens,
            concurrency: self.concurrency.with_max(limits.max_concurrent),
        }
    }

    pub(super) fn in_flight(&self) -> u32 {
        self.concurrency.in_flight()
    }

    pub(super) fn admit(
        &self,
        sub: Option<&str>,
        estimated_tokens: u64,
    ) -> Result<Admission, Rejection> {
        let requests = match self.requests.check(sub) {
            Ok(state) => state,
            Err(RequestDenied::Rate { retry_after, state }) => {
                return Err(rate_rejection(
                    &self.who(sub),
                    self.requests_per_s,
                    retry_after,
                    headers(state, self.tokens.peek()),
                ));
            }
            Err(RequestDenied::TooManySubjects { retry_after, max }) => {
                let state = RequestState {
                    limit: self.requests.burst(),
                    remaining: 0,
                    reset: retry_after,
                };
                let message = format!(
                    "tenant `{}` is already rate-limiting {max} busy subjects, the most it may; \
                     retry in {}s",
                    self.id,
                    retry_after_secs(retry_after),
                );
                return Err(Rejection {
                    reason: RejectReason::TooManySubjects,
                    retry_after: Some(retry_after),
                    headers: headers(state, self.tokens.peek()),
                    message,
                });
            }
        };
        let Some(slot) = self.concurrency.try_acquire() else {
            return Err(concurrency_rejection(
                &self.id,
                self.concurrency.max(),
                headers(requests, self.tokens.peek()),
            ));
        };
        match self.tokens.reserve(estimated_tokens) {
            Ok((tokens, token_state)) => Ok(Admission {
                headers: headers(requests, token_state),
                tokens,
                _slot: Slot::Local(slot),
            }),
            Err(TokenDenied::NeverFits { state }) => Err(never_fits_rejection(
                &self.id,
                estimated_tokens,
                headers(requests, state),
            )),
            Err(TokenDenied::Short {
                available,
                retry_after,
                state,
            }) => Err(token_rate_rejection(
                &self.id,
                estimated_tokens,
                available,
                retry_after,
                headers(requests, state),
            )),
        }
    }

    /// Whose request limit it is, for messages.
    fn who(&self, sub: Option<&str>) -> String {
        who(&self.id, sub, self.requests.per_subject())
    }
}

/// Whose request limit it is, for messages: the subject's when limits are
/// per subject, else the tenant's.
pub(super) fn who(tenant: &str, sub: Option<&str>, per_sub: bool) -> String {
    match sub {
        Some(sub) if per_sub => format!("subject `{sub}` of tenant `{tenant}`"),
        _ => format!("tenant `{tenant}`"),
    }
}

/// `Retry-After` of a request refused for `max_concurrent`: a slot frees
/// when one of the tenant's requests ends, which nothing here can foresee;
/// a second is the shortest wait `Retry-After` can say, so clients poll at
/// that pace.
const CONCURRENCY_RETRY_AFTER: Duration = Duration::from_secs(1);

// The refusals, worded the same whichever store decided them.

/// Over the request rate; `who` is the tenant or its subject.
pub(super) fn rate_rejection(
    who: &str,
    requests_per_s: u32,
    retry_after: Duration,
    headers: RateLimitHeaders,
) -> Rejection {
    let message = format!(
        "{who} is over its request rate of {requests_per_s}/s (burst {}); retry in {}s",
        headers.limit_requests,
        retry_after_secs(retry_after),
    );
    Rejection {
        reason: RejectReason::RequestRate,
        retry_after: Some(retry_after),
        headers,
        message,
    }
}

/// `max_concurrent` requests already in flight.
pub(super) fn concurrency_rejection(
    tenant: &str,
    max_concurrent: u32,
    headers: RateLimitHeaders,
) -> Rejection {
    Rejection {
        reason: RejectReason::Concurrency,
        retry_after: Some(CONCURRENCY_RETRY_AFTER),
        headers,
        message: format!(
            "tenant `{tenant}` already has {max_concurrent} requests in flight, its limit; \
             retry when one finishes"
        ),
    }
}

/// The request alone needs more than a minute's tokens.
pub(super) fn never_fits_rejection(
    tenant: &str,
    estimated_tokens: u64,
    headers: RateLimitHeaders,
) -> Rejection {
    let message = format!(
        "this request needs {estimated_tokens} tokens (prompt + max_tokens), more than \
         tenant `{tenant}`'s whole budget of {} tokens per minute; lower max_tokens or \
         shorten the prompt",
        headers.limit_tokens,
    );
    Rejection {
        reason: RejectReason::TooManyTokens,
        retry_after: None,
        headers,
        message,
    }
}

/// Not enough tokens now.
pub(super) fn token_rate_rejection(
    tenant: &str,
    estimated_tokens: u64,
    available: u64,
    retry_after: Duration,
    headers: RateLimitHeaders,
) -> Rejection {
    let message = format!(
        "tenant `{tenant}` is over its token rate: this request needs {estimated_tokens} \
         tokens, {available} are available; retry in {}s",
        retry_after_secs(retry_after),
    );
    Rejection {
        reason: RejectReason::TokenRate,
        retry_after: Some(retry_after),
        headers,
        message,
    }
}

fn headers(requests: RequestState, tokens: TokenState) -> RateLimitHeaders {
    RateLimitHeaders {
        limit_requests: requests.limit,
        remaining_requests: requests.remaining,
        reset_requests: requests.reset,
        limit_tokens: tokens.limit,
        remaining_tokens: tokens.remaining,
        reset_tokens: tokens.reset,
    }
}
