//! RFC 3339 timestamps in UTC with millisecond precision
//! (`2025-03-01T12:34:56.789Z`), formatted and parsed by hand so the audit
//! log needs no date crate. One fixed form: an entry's bytes are hashed, so
//! a time must have exactly one spelling.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Milliseconds since the Unix epoch, shown as RFC 3339 UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp(pub u64);

/// The latest year the parser accepts: four digits.
const MAX_YEAR: i64 = 9999;

impl Timestamp {
    /// Now, by the system clock (a clock before 1970 reads as the epoch).
    pub fn now() -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }

    /// Parses exactly the form [`Display`](fmt::Display) writes.
    pub fn parse(text: &str) -> Result<Timestamp, String> {
        let bad = || format!("`{text}` is not an RFC 3339 UTC time like 2025-03-01T12:34:56.789Z");
        let b = text.as_bytes();
        if b.len() != 24
            || b[4] != b'-'
            || b[7] != b'-'
            || b[10] != b'T'
            || b[13] != b':'
            || b[16] != b':'
            || b[19] != b'.'
            || b[23] != b'Z'
        {
            return Err(bad());
        }
        let num = |range: std::ops::Range<usize>| -> Result<i64, String> {
            let part = &b[range];
            if !part.iter().all(u8::is_ascii_digit) {
                return Err(bad());
            }
            Ok(part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
        };
        let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
        let (hour, minute, second, milli) =
            (num(11..13)?, num(14..16)?, num(17..19)?, num(20..23)?);
        if !(1970..=MAX_YEAR).contains(&year)
            || !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
            || hour > 23
            || minute > 59
            || second > 59
        {
            return Err(bad());
        }
        let days = days_from_civil(year, month, day);
        let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
        // Non-negative: the year is at least 1970.
        Ok(Timestamp(seconds as u64 * 1_000 + milli as u64))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0 % 1_000;
        let seconds = self.0 / 1_000;
        let days = (seconds / 86_400) as i64;
        let of_day = seconds % 86_400;
        let (year, month, day) = civil_from_days(days);
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            of_day / 3_600,
            of_day / 60 % 60,
            of_day % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Timestamp::parse(&text).map_err(serde::de::Error::custom)
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`: eras of 400 years starting in March).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_as_rfc3339() {
        assert_eq!(Timestamp(0).to_string(), "1970-01-01T00:00:00.000Z");
        // `date -u -d @951782400` → 2000-02-29 (a leap day of a century year).
        assert_eq!(
            Timestamp(951_782_400_123).to_string(),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            Timestamp(1_709_251_199_999).to_string(),
            "2024-02-29T23:59:59.999Z"
        );
        assert_eq!(
            Timestamp(4_102_444_800_000).to_string(),
            "2100-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn every_day_for_centuries_round_trips() {
        let mut previous = None;
        for day in 0..(400 * 366) {
            let at = Timestamp(day * 86_400_000 + 45_296_007);
            let text = at.to_string();
            assert_eq!(Timestamp::parse(&text), Ok(at), "{text}");
            assert!(previous.as_ref() < Some(&text), "dates sort as text");
            previous = Some(text);
        }
    }

    #[test]
    fn other_spellings_are_refused() {
        for bad in [
            "2024-02-30T00:00:00.000Z",
            "2023-02-29T00:00:00.000Z",
            "2024-13-01T00:00:00.000Z",
            "2024-01-01T24:00:00.000Z",
            "2024-01-01T00:00:60.000Z",
            "2024-01-01T00:00:00Z",
            "2024-01-01T00:00:00.000+00:00",
            "2024-01-01 00:00:00.000Z",
            "1969-12-31T23:59:59.999Z",
            "+024-01-01T00:00:00.000Z",
            "2024-01-01T00:00:00.0a0Z",
        ] {
            assert!(Timestamp::parse(bad).is_err(), "{bad}");
        }
    }
}
