//! Per-tenant usage: requests and prompt/completion tokens by model and by
//! UTC day, counted where the token limiter is told what a request used
//! (the prompt once its size is known, each completion token as it is
//! generated), so what a tenant is shown is what it was charged.
//!
//! The book lives outside the policy snapshot, so a reload keeps it, and in
//! memory: it counts since this gateway process started, like the limits'
//! own state. At most [`KEPT_DAYS`] days are kept per tenant.
//!
//! The request path takes the book's lock once per request, to find its
//! day's counters; every token after that is an atomic add on them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Days of usage kept per tenant; older days are dropped as new ones start.
pub const KEPT_DAYS: u32 = 62;

/// Usage of one tenant with one model on one day.
#[derive(Debug, Default)]
pub struct Counts {
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

/// A snapshot of [`Counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Counts {
    fn totals(&self) -> Totals {
        Totals {
            requests: self.requests.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
        }
    }
}

/// Days since 1970-01-01, UTC.
pub type Day = u32;

/// The UTC day of `time`.
pub fn day_of(time: SystemTime) -> Day {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(secs / 86_400).unwrap_or(u32::MAX)
}

/// `YYYY-MM-DD` of a [`Day`] (proleptic Gregorian).
pub fn day_text(day: Day) -> String {
    // Howard Hinnant's civil-from-days.
    let z = i64::from(day) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

type TenantBook = BTreeMap<(Day, String), Arc<Counts>>;

/// Every tenant's usage. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct UsageBook {
    tenants: Arc<Mutex<HashMap<String, TenantBook>>>,
}

/// One request's counters: where its tokens are booked.
#[derive(Clone, Debug)]
pub struct RequestUsage(Arc<Counts>);

impl RequestUsage {
    /// `n` prompt tokens processed.
    pub fn prompt(&self, n: u64) {
        self.0.prompt_tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` completion tokens generated.
    pub fn completion(&self, n: u64) {
        self.0.completion_tokens.fetch_add(n, Ordering::Relaxed);
    }
}

impl UsageBook {
    pub fn new() -> UsageBook {
        UsageBook::default()
    }

    /// Counts one request of `tenant` with `model` on `day` and returns
    /// where its tokens go.
    pub fn start(&self, tenant: &str, model: &str, day: Day) -> RequestUsage {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let book = match tenants.get_mut(tenant) {
            Some(book) => book,
            None => tenants.entry(tenant.to_owned()).or_default(),
        };
        let oldest_kept = day.saturating_sub(KEPT_DAYS - 1);
        while let Some(((first, _), _)) = book.first_key_value() {
            if *first >= oldest_kept {
                break;
            }
            book.pop_first();
        }
        let counts = book
            .entry((day, model.to_owned()))
            .or_insert_with(|| Arc::new(Counts::default()));
        counts.requests.fetch_add(1, Ordering::Relaxed);
        RequestUsage(Arc::clone(counts))
    }

    /// `tenant`'s usage from day `from` on, by day then model.
    pub fn of(&self, tenant: &str, from: Day) -> Vec<(Day, String, Totals)> {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        tenants.get(tenant).map_or_else(Vec::new, |book| {
            book.range((from, String::new())..)
                .map(|((day, model), counts)| (*day, model.clone(), counts.totals()))
                .collect()
        })
    }

    /// The tenants with any usage kept, sorted.
    pub fn tenants(&self) -> Vec<String> {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let mut names: Vec<String> = tenants.keys().cloned().collect();
        names.sort_unstable();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn books_by_day_and_model_and_drops_old_days() {
        let book = UsageBook::new();
        let a = book.start("acme", "m1", 100);
        a.prompt(5);
        a.completion(7);
        book.start("acme", "m1", 100).completion(1);
        book.start("acme", "m2", 101).prompt(2);
        book.start("other", "m1", 101).prompt(50);
        let usage = book.of("acme", 0);
        assert_eq!(
            usage,
            vec![
                (
                    100,
                    "m1".to_owned(),
                    Totals {
                        requests: 2,
                        prompt_tokens: 5,
                        completion_tokens: 8
                    }
                ),
                (
                    101,
                    "m2".to_owned(),
                    Totals {
                        requests: 1,
                        prompt_tokens: 2,
                        completion_tokens: 0
                    }
                ),
            ]
        );
        assert_eq!(book.of("acme", 101).len(), 1);
        assert!(book.of("nobody", 0).is_empty());
        // A request KEPT_DAYS after day 100 drops days 100 and 101.
        book.start("acme", "m1", 101 + KEPT_DAYS);
        assert_eq!(book.of("acme", 0).len(), 1);
        assert_eq!(book.tenants(), ["acme", "other"]);
    }

    #[test]
    fn days_print_as_utc_dates() {
        assert_eq!(day_text(0), "1970-01-01");
        assert_eq!(
            day_text(day_of(
                UNIX_EPOCH + std::time::Duration::from_secs(951_782_400)
            )),
            "2000-02-29"
        );
        assert_eq!(day_text(20_819), "2027-01-01");
    }
}
