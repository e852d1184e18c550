//! Percentiles and the JSON line the run script reads.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::driver::{Plan, Samples};

/// What one run measured.
#[derive(Debug)]
pub struct Summary {
    /// Sorted latencies of the successful requests, in ns.
    sorted_ns: Vec<u64>,
    errors: BTreeMap<String, u64>,
    error_details: BTreeMap<String, String>,
    window: Duration,
}

impl Summary {
    pub fn new(samples: Samples, window: Duration) -> Summary {
        let mut sorted_ns = samples.latencies_ns;
        sorted_ns.sort_unstable();
        Summary {
            sorted_ns,
            errors: samples.errors,
            error_details: samples.error_details,
            window,
        }
    }

    /// The `p`-th percentile (nearest rank) in ms; `None` without samples.
    fn percentile_ms(&self, p: f64) -> Option<f64> {
        let n = self.sorted_ns.len();
        if n == 0 {
            return None;
        }
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        Some(ns_to_ms(self.sorted_ns[rank.clamp(1, n) - 1]))
    }

    fn mean_ms(&self) -> Option<f64> {
        if self.sorted_ns.is_empty() {
            return None;
        }
        let total: u128 = self.sorted_ns.iter().map(|&ns| u128::from(ns)).sum();
        Some(total as f64 / self.sorted_ns.len() as f64 / 1e6)
    }

    /// One line of JSON: successes per second over the window, latency
    /// percentiles of the successes in ms, and failures by kind (with the
    /// first message of each).
    pub fn to_json(&self, label: &str, mode: &str, concurrency: usize, plan: &Plan) -> String {
        let count = self.sorted_ns.len();
        json!({
            "label": label,
            "mode": mode,
            "concurrency": concurrency,
            "warmup_s": plan.warmup.as_secs_f64(),
            "duration_s": self.window.as_secs_f64(),
            "count": count,
            "rps": count as f64 / self.window.as_secs_f64(),
            "p50_ms": self.percentile_ms(50.0),
            "p90_ms": self.percentile_ms(90.0),
            "p99_ms": self.percentile_ms(99.0),
            "max_ms": self.sorted_ns.last().map(|&ns| ns_to_ms(ns)),
            "mean_ms": self.mean_ms(),
            "errors": self.errors,
            "error_details": self.error_details,
        })
        .to_string()
    }
}

fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(ms: &[u64]) -> Summary {
        let samples = Samples {
            latencies_ns: ms.iter().map(|m| m * 1_000_000).collect(),
            ..Samples::default()
        };
        Summary::new(samples, Duration::from_secs(1))
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s = summary(&(1..=100).rev().collect::<Vec<_>>());
        assert_eq!(s.percentile_ms(50.0), Some(50.0));
        assert_eq!(s.percentile_ms(99.0), Some(99.0));
        assert_eq!(s.percentile_ms(100.0), Some(100.0));
        let one = summary(&[7]);
        assert_eq!(one.percentile_ms(50.0), Some(7.0));
        assert_eq!(one.percentile_ms(99.0), Some(7.0));
        assert_eq!(summary(&[]).percentile_ms(50.0), None);
    }
}
