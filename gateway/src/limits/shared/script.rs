//! The Lua scripts that keep a tenant's limits in Redis, and their replies.
//!
//! One script call decides one admission: request rate (GCRA), concurrency
//! lease, token reservation, in that order and with the same rules as the
//! in-memory limiters (`super::super::tenant`). Redis runs a script
//! atomically, so replicas admitting at once never both see the last free
//! slot or token. Every time is Redis's own (`TIME`), so replica clocks may
//! disagree without effect.
//!
//! Scripts, not Redis 7 functions: `EVALSHA` with a fallback to `EVAL`
//! (redis-rs `Script`) needs nothing loaded ahead of time, so a Redis that
//! restarted empty or a failover replica works on the first call; functions
//! would have to be loaded into every server first.
//!
//! Numbers: Lua in Redis has doubles, exact up to 2^53. Times are in
//! microseconds (about 1.8e15 today) for the request rate and milliseconds
//! for tokens and leases; token levels are kept as tokens × 60 000
//! (token-milliseconds per minute), so a bucket refills `tokens_per_min`
//! units per millisecond exactly, up to 1.5e11 tokens per minute. Stored
//! numbers are written with `%.0f`: Lua's default formatting keeps 14
//! digits only.

use std::time::Duration;

use redis::Script;

/// What every script starts with: Redis's clock, and a token bucket's
/// level refilled up to it (an absent key is a full bucket).
const PRELUDE: &str = r"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local SCALE = 60000
local function fmt(x) return string.format('%.0f', x) end
local function bucket_level(key, capacity)
  local full = capacity * SCALE
  local stored = redis.call('HMGET', key, 'level', 'at')
  if not (stored[1] and stored[2]) then return full end
  local level = tonumber(stored[1])
  local at = tonumber(stored[2])
  if now_ms > at then level = level + (now_ms - at) * capacity end
  if level > full then level = full end
  return level
end
";

/// Keys: the request-rate key, the token bucket, the lease set.
/// Args: emission interval (µs), burst, tokens per minute, tokens needed,
/// max concurrent, lease id, lease TTL (ms).
///
/// Reply: `{outcome, requests remaining, requests reset (µs), tokens
/// remaining, tokens reset (ms), retry after (µs), tokens available}`.
const ADMIT: &str = r"
local emission = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local capacity = tonumber(ARGV[3])
local needed = tonumber(ARGV[4])
local max_concurrent = tonumber(ARGV[5])
local ttl = tonumber(ARGV[7])
local full = capacity * SCALE
local level = bucket_level(KEYS[2], capacity)
local function tokens_left(l)
  if l <= 0 then return 0 end
  return math.floor(l / SCALE)
end
local function tokens_reset(l)
  if l >= full then return 0 end
  return math.ceil((full - l) / capacity)
end

local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now_us then tat = now_us end
local new_tat = tat + emission
local allow_at = new_tat - burst * emission
if now_us < allow_at then
  -- Full again `burst - 1` intervals after the next cell conforms.
  return {1, 0, tat - now_us, tokens_left(level), tokens_reset(level), allow_at - now_us, 0}
end
redis.call('SET', KEYS[1], fmt(new_tat), 'PX', math.ceil((new_tat - now_us) / 1000) + 1)
local requests_left = math.floor((now_us - allow_at) / emission)
local requests_reset = new_tat - now_us

redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
if redis.call('ZCARD', KEYS[3]) >= max_concurrent then
  return {2, requests_left, requests_reset, tokens_left(level), tokens_reset(level), 0, 0}
end

if needed > capacity then
  return {4, requests_left, requests_reset, tokens_left(level), tokens_reset(level), 0, 0}
end
local cost = needed * SCALE
if level < cost then
  return {3, requests_left, requests_reset, tokens_left(level), tokens_reset(level),
          math.ceil((cost - level) / capacity) * 1000, tokens_left(level)}
end
level = level - cost
redis.call('HSET', KEYS[2], 'level', fmt(level), 'at', fmt(now_ms))
redis.call('PEXPIRE', KEYS[2], tokens_reset(level) + 1000)
redis.call('ZADD', KEYS[3], fmt(now_ms + ttl), ARGV[6])
redis.call('PEXPIRE', KEYS[3], 2 * ttl)
return {0, requests_left, requests_reset, tokens_left(level), tokens_reset(level), 0, 0}
";

/// Keys: the token bucket. Args: tokens per minute, tokens to give back
/// (negative: to charge, which may take the bucket into debt).
const SETTLE: &str = r"
local capacity = tonumber(ARGV[1])
local full = capacity * SCALE
local level = bucket_level(KEYS[1], capacity) + tonumber(ARGV[2]) * SCALE
if level >= full then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('HSET', KEYS[1], 'level', fmt(level), 'at', fmt(now_ms))
redis.call('PEXPIRE', KEYS[1], math.ceil((full - level) / capacity) + 1000)
return 0
";

/// Keys: lease sets, one per tenant. Args: lease TTL (ms), then for each
/// key the number of its leases and their ids. Extends only leases that are
/// still there (`XX`): one released or expired meanwhile stays gone.
const RENEW: &str = r"
local ttl = tonumber(ARGV[1])
local expiry = fmt(now_ms + ttl)
local arg = 2
for i, key in ipairs(KEYS) do
  local n = tonumber(ARGV[arg])
  arg = arg + 1
  for j = 1, n do
    redis.call('ZADD', key, 'XX', expiry, ARGV[arg])
    arg = arg + 1
  end
  redis.call('PEXPIRE', key, 2 * ttl)
end
return 0
";

/// The three scripts, hashed once.
pub(super) struct Scripts {
    pub(super) admit: Script,
    pub(super) settle: Script,
    pub(super) renew: Script,
}

impl std::fmt::Debug for Scripts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scripts")
    }
}

impl Scripts {
    pub(super) fn new() -> Scripts {
        let script = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Scripts {
            admit: script(ADMIT),
            settle: script(SETTLE),
            renew: script(RENEW),
        }
    }
}

/// What [`ADMIT`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Admitted,
    RequestRate,
    Concurrency,
    TokenRate,
    TooManyTokens,
}

/// [`ADMIT`]'s reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Reply {
    pub(super) outcome: Outcome,
    pub(super) requests_remaining: u32,
    pub(super) requests_reset: Duration,
    pub(super) tokens_remaining: u64,
    pub(super) tokens_reset: Duration,
    pub(super) retry_after: Duration,
    pub(super) tokens_available: u64,
}

impl Reply {
    /// Decodes the script's seven integers; `None` if Redis answered
    /// anything else (a different script under our hash, say).
    pub(super) fn decode(values: &[i64]) -> Option<Reply> {
        let [
            outcome,
            req_left,
            req_reset_us,
            tok_left,
            tok_reset_ms,
            retry_us,
            available,
        ] = *values
        else {
            return None;
        };
        let outcome = match outcome {
            0 => Outcome::Admitted,
            1 => Outcome::RequestRate,
            2 => Outcome::Concurrency,
            3 => Outcome::TokenRate,
            4 => Outcome::TooManyTokens,
            _ => return None,
        };
        let count = |v: i64| u64::try_from(v).ok();
        Some(Reply {
            outcome,
            requests_remaining: u32::try_from(req_left).ok()?,
            requests_reset: Duration::from_micros(count(req_reset_us)?),
            tokens_remaining: count(tok_left)?,
            tokens_reset: Duration::from_millis(count(tok_reset_ms)?),
            retry_after: Duration::from_micros(count(retry_us)?),
            tokens_available: count(available)?,
        })
    }
}
