//! Per-tenant usage: requests, prompt/completion tokens and compute time
//! by model and by UTC hour, counted where the token limiter is told what
//! a request used (the prompt once its size is known, each completion
//! token as it is generated, the host's compute time at the end), so what
//! a tenant is shown is what it was charged.
//!
//! The book lives outside the policy snapshot, so a reload keeps it. With
//! `[usage] dir` it survives a restart: [`journal`] appends what changed
//! every second and reads it all back at start. At most [`KEPT_DAYS`] days
//! are kept per tenant.
//!
//! The request path takes the book's lock once per request, to find its
//! hour's counters; every token after that is an atomic add on them.

pub mod journal;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use bulkhead_audit::time::Timestamp;

/// Days of usage kept per tenant; older days are dropped as new ones start.
pub const KEPT_DAYS: u32 = 62;

/// Usage of one tenant with one model in one hour.
#[derive(Debug)]
pub struct Counts {
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    compute_us: AtomicU64,
    /// Whose counts these are.
    tenant: String,
    hour: Hour,
    model: String,
    /// Changed since the journal last took it (it is on the dirty list).
    dirty: AtomicBool,
    /// What the journal holds of it already.
    journaled: Mutex<Totals>,
}

/// The counters changed since the journal's last flush.
type DirtyList = Arc<Mutex<Vec<Arc<Counts>>>>;

/// A snapshot of [`Counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// The gpu-host's compute time, in microseconds.
    pub compute_us: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.requests += other.requests;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.compute_us += other.compute_us;
    }

    /// What `self` has more than `earlier` (counters only grow).
    fn since(self, earlier: Totals) -> Totals {
        Totals {
            requests: self.requests.saturating_sub(earlier.requests),
            prompt_tokens: self.prompt_tokens.saturating_sub(earlier.prompt_tokens),
            completion_tokens: self
                .completion_tokens
                .saturating_sub(earlier.completion_tokens),
            compute_us: self.compute_us.saturating_sub(earlier.compute_us),
        }
    }

    fn is_zero(&self) -> bool {
        *self == Totals::default()
    }
}

impl Counts {
    fn new(tenant: &str, hour: Hour, model: &str) -> Counts {
        Counts {
            requests: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            compute_us: AtomicU64::new(0),
            tenant: tenant.to_owned(),
            hour,
            model: model.to_owned(),
            dirty: AtomicBool::new(false),
            journaled: Mutex::new(Totals::default()),
        }
    }

    fn totals(&self) -> Totals {
        Totals {
            requests: self.requests.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.load(Ordering::Relaxed),
            completion_tokens: self.completion_tokens.load(Ordering::Relaxed),
            compute_us: self.compute_us.load(Ordering::Relaxed),
        }
    }

    fn add(&self, t: Totals) {
        self.requests.fetch_add(t.requests, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(t.prompt_tokens, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(t.completion_tokens, Ordering::Relaxed);
        self.compute_us.fetch_add(t.compute_us, Ordering::Relaxed);
    }
}

/// Days since 1970-01-01, UTC.
pub type Day = u32;

/// Hours since 1970-01-01T00:00Z.
pub type Hour = u32;

/// The UTC day of `time`.
pub fn day_of(time: SystemTime) -> Day {
    hour_of(time) / 24
}

/// The UTC hour of `time`.
pub fn hour_of(time: SystemTime) -> Hour {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    u32::try_from(secs / 3600).unwrap_or(u32::MAX)
}

/// `YYYY-MM-DDTHH:00:00Z` of an [`Hour`].
pub fn hour_text(hour: Hour) -> String {
    format!("{}T{:02}:00:00Z", day_text(hour / 24), hour % 24)
}

/// The [`Hour`] a `YYYY-MM-DD`, `YYYY-MM-DDTHH` or RFC 3339 UTC time
/// (`...THH:MM`, `...THH:MM:SS`, `...THH:MM:SS.mmm`, each with or without
/// `Z`) falls in; `None` when it is none of those. The calendar is the
/// audit log's ([`Timestamp::parse`]), given the full form.
pub fn parse_hour(text: &str) -> Option<Hour> {
    let (date, time) = text.split_once('T').unwrap_or((text, "00"));
    let time = time.strip_suffix('Z').unwrap_or(time);
    let rest = match time.len() {
        2 => ":00:00.000",
        5 => ":00.000",
        8 => ".000",
        12 => "",
        _ => return None,
    };
    let millis = Timestamp::parse(&format!("{date}T{time}{rest}Z")).ok()?.0;
    u32::try_from(millis / 3_600_000).ok()
}

/// `YYYY-MM-DD` of a [`Day`] (proleptic Gregorian).
pub fn day_text(day: Day) -> String {
    let mut text = Timestamp(u64::from(day) * 86_400_000).to_string();
    text.truncate(10);
    text
}

type TenantBook = BTreeMap<(Hour, String), Arc<Counts>>;

/// Every tenant's usage. Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct UsageBook {
    tenants: Arc<Mutex<HashMap<String, TenantBook>>>,
    dirty: DirtyList,
}

/// Counters that grew since the journal last held them.
#[derive(Debug)]
struct Changed {
    counts: Arc<Counts>,
    now: Totals,
    grew: Totals,
}

impl Changed {
    /// The journal holds `now`.
    fn journaled(&self) {
        *self
            .counts
            .journaled
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = self.now;
    }

    /// The write failed: the next flush tries again.
    fn retry(&self, book: &UsageBook) {
        mark(&self.counts, &book.dirty);
    }
}

/// One hour of one tenant's use of one model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HourRow {
    pub hour: Hour,
    pub tenant: String,
    pub model: String,
    pub totals: Totals,
}

/// One request's counters: where its tokens are booked.
#[derive(Clone, Debug)]
pub struct RequestUsage {
    counts: Arc<Counts>,
    dirty: DirtyList,
}

impl RequestUsage {
    /// `n` prompt tokens processed.
    pub fn prompt(&self, n: u64) {
        self.counts.prompt_tokens.fetch_add(n, Ordering::Relaxed);
        self.changed();
    }

    /// `n` completion tokens generated.
    pub fn completion(&self, n: u64) {
        self.counts
            .completion_tokens
            .fetch_add(n, Ordering::Relaxed);
        self.changed();
    }

    /// `us` microseconds of the host's compute time.
    pub fn compute(&self, us: u64) {
        self.counts.compute_us.fetch_add(us, Ordering::Relaxed);
        self.changed();
    }

    /// Puts the counters on the dirty list once until the journal takes
    /// them (one relaxed load per token otherwise).
    fn changed(&self) {
        mark(&self.counts, &self.dirty);
    }
}

fn mark(counts: &Arc<Counts>, dirty: &DirtyList) {
    if !counts.dirty.load(Ordering::Relaxed) && !counts.dirty.swap(true, Ordering::AcqRel) {
        dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(counts));
    }
}

impl UsageBook {
    pub fn new() -> UsageBook {
        UsageBook::default()
    }

    /// Counts one request of `tenant` with `model` in `hour` and returns
    /// where its tokens go.
    pub fn start(&self, tenant: &str, model: &str, hour: Hour) -> RequestUsage {
        let counts = self.counts(tenant, model, hour);
        counts.requests.fetch_add(1, Ordering::Relaxed);
        let usage = RequestUsage {
            counts,
            dirty: Arc::clone(&self.dirty),
        };
        usage.changed();
        usage
    }

    /// Adds `totals`, read back from the journal (so held there already),
    /// to an hour's counters.
    pub fn add_journaled(&self, tenant: &str, model: &str, hour: Hour, totals: Totals) {
        let counts = self.counts(tenant, model, hour);
        counts.add(totals);
        counts
            .journaled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(totals);
    }

    fn counts(&self, tenant: &str, model: &str, hour: Hour) -> Arc<Counts> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let book = match tenants.get_mut(tenant) {
            Some(book) => book,
            None => tenants.entry(tenant.to_owned()).or_default(),
        };
        let oldest_kept = (hour / 24).saturating_sub(KEPT_DAYS - 1) * 24;
        while let Some(((first, _), _)) = book.first_key_value() {
            if *first >= oldest_kept {
                break;
            }
            book.pop_first();
        }
        Arc::clone(
            book.entry((hour, model.to_owned()))
                .or_insert_with(|| Arc::new(Counts::new(tenant, hour, model))),
        )
    }

    /// `tenant`'s usage from day `from` on, by day then model.
    pub fn of(&self, tenant: &str, from: Day) -> Vec<(Day, String, Totals)> {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let mut days: BTreeMap<(Day, String), Totals> = BTreeMap::new();
        if let Some(book) = tenants.get(tenant) {
            for ((hour, model), counts) in book.range((from.saturating_mul(24), String::new())..) {
                days.entry((hour / 24, model.clone()))
                    .or_default()
                    .add(counts.totals());
            }
        }
        days.into_iter()
            .map(|((day, model), totals)| (day, model, totals))
            .collect()
    }

    /// Every hour in `from..to` with usage, of `tenant` or of every
    /// tenant, by hour, tenant, then model.
    pub fn hours(&self, tenant: Option<&str>, from: Hour, to: Hour) -> Vec<HourRow> {
        let tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let mut rows = Vec::new();
        for (name, book) in tenants.iter() {
            if tenant.is_some_and(|t| t != name) {
                continue;
            }
            for ((hour, model), counts) in book.range((from, String::new())..) {
                if *hour >= to {
                    break;
                }
                let totals = counts.totals();
                if !totals.is_zero() {
                    rows.push(HourRow {
                        hour: *hour,
                        tenant: name.clone(),
                        model: model.clone(),
                        totals,
                    });
                }
            }
        }
        rows.sort_by(|a, b| (a.hour, &a.tenant, &a.model).cmp(&(b.hour, &b.tenant, &b.model)));
        rows
    }

    /// The counters changed since the last call, each with what grew
    /// since the journal last held it, for the journal: call
    /// [`Changed::journaled`] once written, or [`Changed::retry`].
    fn take_changed(&self) -> Vec<Changed> {
        let taken = std::mem::take(&mut *self.dirty.lock().unwrap_or_else(PoisonError::into_inner));
        taken
            .into_iter()
            .filter_map(|counts| {
                // Cleared first: a token added from here on marks it again.
                counts.dirty.store(false, Ordering::Release);
                let now = counts.totals();
                let held = *counts
                    .journaled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let grew = now.since(held);
                (!grew.is_zero()).then_some(Changed { counts, now, grew })
            })
            .collect()
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
        let a = book.start("acme", "m1", 100 * 24);
        a.prompt(5);
        a.completion(7);
        a.compute(900);
        // Another hour of the same day adds up in the day's row.
        book.start("acme", "m1", 100 * 24 + 23).completion(1);
        book.start("acme", "m2", 101 * 24).prompt(2);
        book.start("other", "m1", 101 * 24).prompt(50);
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
                        completion_tokens: 8,
                        compute_us: 900,
                    }
                ),
                (
                    101,
                    "m2".to_owned(),
                    Totals {
                        requests: 1,
                        prompt_tokens: 2,
                        completion_tokens: 0,
                        compute_us: 0,
                    }
                ),
            ]
        );
        assert_eq!(book.of("acme", 101).len(), 1);
        assert!(book.of("nobody", 0).is_empty());
        assert_eq!(book.hours(Some("acme"), 0, 101 * 24).len(), 2);
        let all = book.hours(None, 101 * 24, 102 * 24);
        let who: Vec<&str> = all.iter().map(|r| r.tenant.as_str()).collect();
        assert_eq!(who, ["acme", "other"]);
        // A request KEPT_DAYS after day 100 drops days 100 and 101.
        book.start("acme", "m1", (101 + KEPT_DAYS) * 24);
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
        assert_eq!(hour_text(20_819 * 24 + 5), "2027-01-01T05:00:00Z");
    }

    #[test]
    fn hours_parse_from_dates_and_times_and_nothing_else() {
        let h = 20_819 * 24;
        assert_eq!(parse_hour("2027-01-01"), Some(h));
        assert_eq!(parse_hour("2027-01-01T05"), Some(h + 5));
        assert_eq!(parse_hour("2027-01-01T05:59:59Z"), Some(h + 5));
        assert_eq!(parse_hour("2027-01-01T05:59"), Some(h + 5));
        assert_eq!(
            parse_hour("2000-02-29T00:00:00.000Z"),
            Some(day_of(UNIX_EPOCH + std::time::Duration::from_secs(951_782_400)) * 24)
        );
        for bad in [
            "",
            "2027-1-01",
            "2027-02-30",
            "2027-01-01T24",
            "2027-01-01T5",
            "x",
            "2027-01-01T05:00+02:00",
            "2027-13-01",
        ] {
            assert_eq!(parse_hour(bad), None, "{bad}");
        }
        for h in [0, 1, 500_000, 20_819 * 24 + 23] {
            assert_eq!(parse_hour(&hour_text(h)), Some(h));
        }
    }
}
