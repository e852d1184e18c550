//! One tenant's limiters and the admission sequence: request rate →
//! concurrency → tokens.

use std::sync::Arc;

use super::Limits;
use super::clock::LimitClock;
use super::concurrency::ConcurrencyLimiter;
use super::headers::{RateLimitHeaders, retry_after_secs};
use super::requests::{RequestDenied, RequestLimiter, RequestState};
use super::tokens::{TokenBucket, TokenDenied, TokenState};
use super::{Admission, RejectReason, Rejection};

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
                let message = format!(
                    "{} is over its request rate of {}/s (burst {}); retry in {}s",
                    self.who(sub),
                    self.requests_per_s,
                    state.limit,
                    retry_after_secs(retry_after),
                );
                return Err(self.reject(
                    RejectReason::RequestRate,
                    Some(retry_after),
                    state,
                    message,
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
                return Err(self.reject(
                    RejectReason::TooManySubjects,
                    Some(retry_after),
                    state,
                    message,
                ));
            }
        };
        let Some(slot) = self.concurrency.try_acquire() else {
            let message = format!(
                "tenant `{}` already has {} requests in flight, its limit; retry when one finishes",
                self.id,
                self.concurrency.max(),
            );
            // A slot frees when one of the tenant's requests ends, which
            // nothing here can foresee; a second is the shortest wait
            // `Retry-After` can say, so clients poll at that pace.
            return Err(self.reject(
                RejectReason::Concurrency,
                Some(CONCURRENCY_RETRY_AFTER),
                requests,
                message,
            ));
        };
        match self.tokens.reserve(estimated_tokens) {
            Ok((tokens, token_state)) => Ok(Admission {
                headers: headers(requests, token_state),
                tokens,
                _slot: slot,
            }),
            Err(TokenDenied::NeverFits { state }) => {
                let message = format!(
                    "this request needs {estimated_tokens} tokens (prompt + max_tokens), more than \
                     tenant `{}`'s whole budget of {} tokens per minute; lower max_tokens or \
                     shorten the prompt",
                    self.id, state.limit,
                );
                Err(Rejection {
                    reason: RejectReason::TooManyTokens,
                    retry_after: None,
                    headers: headers(requests, state),
                    message,
                })
            }
            Err(TokenDenied::Short {
                available,
                retry_after,
                state,
            }) => {
                let message = format!(
                    "tenant `{}` is over its token rate: this request needs {estimated_tokens} \
                     tokens, {available} are available; retry in {}s",
                    self.id,
                    retry_after_secs(retry_after),
                );
                Err(Rejection {
                    reason: RejectReason::TokenRate,
                    retry_after: Some(retry_after),
                    headers: headers(requests, state),
                    message,
                })
            }
        }
    }

    /// A refusal before the token check, with the token headers as they are.
    fn reject(
        &self,
        reason: RejectReason,
        retry_after: Option<std::time::Duration>,
        requests: RequestState,
        message: String,
    ) -> Rejection {
        Rejection {
            reason,
            retry_after,
            headers: headers(requests, self.tokens.peek()),
            message,
        }
    }

    /// Whose request limit it is, for messages.
    fn who(&self, sub: Option<&str>) -> String {
        match sub {
            Some(sub) if self.requests.per_subject() => {
                format!("subject `{sub}` of tenant `{}`", self.id)
            }
            _ => format!("tenant `{}`", self.id),
        }
    }
}

/// `Retry-After` of a request refused for `max_concurrent`.
const CONCURRENCY_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

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
