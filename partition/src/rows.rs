//! Which running sequences decode in a step, when more run than the step
//! has rows: deficit round robin on tokens across tenants, where a round is
//! one step. Each step every tenant with a sequence left out of some step
//! (backlogged) earns its weighted part of the step's rows as credit, and
//! rows go one at a time to the tenant with the most credit left (a decode
//! row costs one token). Within a tenant, rows go by priority (higher
//! first), then age (older first).
//!
//! Why not [`crate::Drr`] as is: each running sequence has exactly one row
//! of work per step, so a tenant's queue "empties" every step and plain DRR
//! would forfeit its credit each time; a tenant with few sequences would
//! then get a turn's worth less than one with many. Here credit is kept
//! while a tenant is backlogged, and bounded (at most one step's credit,
//! at least one row of debt), so a tenant neither banks a burst while it
//! cannot use its share nor runs up a debt while it borrows rows others
//! leave idle.
//!
//! Caps: a tenant may be capped at a fraction of the step's rows (a shared
//! tenant's `cus` or `share` of the pool). A capped tenant gets rows past
//! its cap only when no uncapped tenant has a sequence left waiting (work
//! conserving: a tenant alone still uses the whole step).

use std::collections::BTreeMap;

/// Credit is kept in 1/`SCALE` tokens, so weighted parts of a step need no
/// floating point (a step's rows × the largest weight × SCALE fit in i64).
const SCALE: i64 = 1 << 20;

/// One tenant's terms for a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowTerms {
    /// Weight for fair sharing; at least 1 (0 is taken as 1).
    pub weight: u32,
    /// The most rows of a step it gets while others wait; `None`: no cap.
    pub max_rows: Option<usize>,
}

impl Default for RowTerms {
    fn default() -> Self {
        RowTerms {
            weight: 1,
            max_rows: None,
        }
    }
}

/// A sequence that could decode this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowCandidate<K> {
    pub tenant: String,
    /// Higher first within its tenant.
    pub priority: i32,
    /// Lower is older: runs first among equal priorities.
    pub age: u64,
    pub key: K,
}

/// Per-tenant credit carried from step to step.
#[derive(Debug, Default)]
pub struct RowPicker {
    /// Credit of each backlogged tenant, in 1/SCALE tokens.
    credit: BTreeMap<String, i64>,
}

impl RowPicker {
    pub fn new() -> RowPicker {
        RowPicker::default()
    }

    /// Chooses at most `rows` of `candidates` for this step; `terms` gives
    /// each tenant's weight and cap (a tenant not in it gets the default).
    /// Returned in the order chosen.
    pub fn pick<K>(
        &mut self,
        rows: usize,
        candidates: Vec<RowCandidate<K>>,
        terms: impl Fn(&str) -> RowTerms,
    ) -> Vec<K> {
        let mut by_tenant: BTreeMap<String, Vec<RowCandidate<K>>> = BTreeMap::new();
        for c in candidates {
            by_tenant.entry(c.tenant.clone()).or_default().push(c);
        }
        // Credit only lives while its tenant has sequences to run.
        self.credit.retain(|t, _| by_tenant.contains_key(t));
        let waiting: usize = by_tenant.values().map(Vec::len).sum();
        if waiting <= rows {
            // Everyone runs: nobody is backlogged, nobody keeps credit.
            self.credit.clear();
            let mut all: Vec<RowCandidate<K>> = by_tenant.into_values().flatten().collect();
            all.sort_by_key(|c| (std::cmp::Reverse(c.priority), c.age));
            return all.into_iter().map(|c| c.key).collect();
        }
        let mut lanes: Vec<Lane<K>> = by_tenant
            .into_iter()
            .map(|(tenant, mut queue)| {
                // Popped from the end: lowest priority and youngest first in the vec.
                queue.sort_by_key(|c| (c.priority, std::cmp::Reverse(c.age)));
                let terms = terms(&tenant);
                Lane {
                    weight: i64::from(terms.weight.max(1)),
                    cap: terms.max_rows.unwrap_or(usize::MAX),
                    taken: 0,
                    queue,
                    tenant,
                }
            })
            .collect();
        let total_weight: i64 = lanes.iter().map(|l| l.weight).sum();
        let step_credit = |lane: &Lane<K>| {
            // rows ≤ usize, weight ≤ u32: within i64 for any real batch.
            i64::try_from(rows).unwrap_or(i64::MAX / SCALE) * SCALE * lane.weight / total_weight
        };
        for lane in &lanes {
            let credit = self.credit.entry(lane.tenant.clone()).or_insert(0);
            *credit = credit.saturating_add(step_credit(lane));
        }
        let mut chosen = Vec::with_capacity(rows);
        while chosen.len() < rows {
            let uncapped = lanes.iter().any(|l| !l.queue.is_empty() && l.taken < l.cap);
            let best = lanes
                .iter_mut()
                .filter(|l| !l.queue.is_empty() && (!uncapped || l.taken < l.cap))
                .max_by(|a, b| {
                    let ca = self.credit.get(&a.tenant).copied().unwrap_or(0);
                    let cb = self.credit.get(&b.tenant).copied().unwrap_or(0);
                    // Ties: the first tenant by name (max_by keeps the last).
                    ca.cmp(&cb).then(b.tenant.cmp(&a.tenant))
                });
            let Some(lane) = best else { break };
            let Some(c) = lane.queue.pop() else { break };
            lane.taken += 1;
            if let Some(credit) = self.credit.get_mut(&lane.tenant) {
                *credit -= SCALE;
            }
            chosen.push(c.key);
        }
        for lane in &lanes {
            let bound = step_credit(lane);
            if let Some(credit) = self.credit.get_mut(&lane.tenant) {
                // Debt past one row comes from rows others left idle:
                // borrowing them is free. Unused credit is not banked by a
                // tenant that ran everything it had, and at most one
                // step's worth by one held back by its cap.
                let most = if lane.queue.is_empty() { 0 } else { bound };
                *credit = (*credit).clamp(-SCALE, most.max(-SCALE));
            }
        }
        chosen
    }
}

struct Lane<K> {
    tenant: String,
    weight: i64,
    cap: usize,
    taken: usize,
    /// Sorted so `pop` gives the next to run.
    queue: Vec<RowCandidate<K>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows each tenant decoded over `steps` steps of `rows` rows, each
    /// tenant running `seqs` sequences that never end.
    fn decode(
        rows: usize,
        steps: usize,
        seqs: &[(&str, usize)],
        terms: impl Fn(&str) -> RowTerms + Copy,
    ) -> BTreeMap<String, usize> {
        let mut picker = RowPicker::new();
        let mut got: BTreeMap<String, usize> = BTreeMap::new();
        for _ in 0..steps {
            let mut candidates = Vec::new();
            let mut age = 0;
            for (tenant, n) in seqs {
                for i in 0..*n {
                    candidates.push(RowCandidate {
                        tenant: tenant.to_string(),
                        priority: 0,
                        age,
                        key: (tenant.to_string(), i),
                    });
                    age += 1;
                }
            }
            let chosen = picker.pick(rows, candidates, terms);
            assert!(chosen.len() <= rows);
            for (tenant, _) in chosen {
                *got.entry(tenant).or_default() += 1;
            }
        }
        got
    }

    fn weights(a: u32, b: u32) -> impl Fn(&str) -> RowTerms + Copy {
        move |t: &str| RowTerms {
            weight: if t == "a" { a } else { b },
            max_rows: None,
        }
    }

    fn share(got: &BTreeMap<String, usize>, t: &str) -> f64 {
        let total: usize = got.values().sum();
        got.get(t).copied().unwrap_or(0) as f64 / total as f64
    }

    #[test]
    fn equal_weights_split_rows_evenly_whatever_the_sequence_counts() {
        for rows in [5, 6, 8, 11] {
            let got = decode(rows, 1_000, &[("a", 36), ("b", 12)], weights(1, 1));
            assert_eq!(got.values().sum::<usize>(), rows * 1_000, "every row used");
            let a = share(&got, "a");
            assert!((0.45..=0.55).contains(&a), "rows {rows}: {got:?}");
        }
    }

    #[test]
    fn three_to_one_weights_split_rows_three_to_one() {
        for rows in [4, 8, 13] {
            let got = decode(rows, 1_000, &[("a", 12), ("b", 36)], weights(3, 1));
            let ratio = got["a"] as f64 / got["b"] as f64;
            assert!((2.7..=3.3).contains(&ratio), "rows {rows}: {got:?}");
        }
    }

    #[test]
    fn a_tenant_with_few_sequences_gets_them_all_and_the_rest_go_to_others() {
        // b's fair half is 4 rows but it has 2: a takes the other 6.
        let got = decode(8, 100, &[("a", 30), ("b", 2)], weights(1, 1));
        assert_eq!((got["a"], got["b"]), (600, 200));
    }

    #[test]
    fn a_tenant_alone_uses_every_row() {
        let got = decode(8, 10, &[("a", 30)], weights(1, 1));
        assert_eq!(got["a"], 80);
    }

    #[test]
    fn a_capped_tenant_stays_under_its_cap_while_others_wait_and_not_when_alone() {
        let terms = |t: &str| RowTerms {
            weight: 1,
            max_rows: (t == "a").then_some(2),
        };
        let got = decode(8, 100, &[("a", 30), ("b", 30)], terms);
        assert_eq!((got["a"], got["b"]), (200, 600));
        let got = decode(8, 100, &[("a", 30), ("b", 3)], terms);
        assert_eq!((got["a"], got["b"]), (500, 300), "a takes what b leaves");
        let got = decode(8, 100, &[("a", 30)], terms);
        assert_eq!(got["a"], 800, "alone, the cap does not idle the pool");
    }

    #[test]
    fn priority_then_age_within_a_tenant() {
        let mut picker = RowPicker::new();
        let c = |tenant: &str, priority, age, key| RowCandidate {
            tenant: tenant.to_string(),
            priority,
            age,
            key,
        };
        let candidates = vec![
            c("a", 0, 1, "a-old-low"),
            c("a", 5, 9, "a-young-urgent"),
            c("a", 0, 2, "a-young-low"),
            c("a", 5, 3, "a-old-urgent"),
            c("b", 0, 4, "b-1"),
            c("b", 0, 5, "b-2"),
        ];
        let mut chosen = picker.pick(4, candidates, |_| RowTerms::default());
        chosen.sort();
        assert_eq!(chosen, ["a-old-urgent", "a-young-urgent", "b-1", "b-2"]);
    }

    #[test]
    fn credit_is_not_banked_by_a_tenant_that_ran_everything() {
        let mut picker = RowPicker::new();
        let seqs = |a: usize, b: usize| {
            let mut v = Vec::new();
            for i in 0..a {
                v.push(RowCandidate {
                    tenant: "a".to_string(),
                    priority: 0,
                    age: i as u64,
                    key: "a",
                });
            }
            for i in 0..b {
                v.push(RowCandidate {
                    tenant: "b".to_string(),
                    priority: 0,
                    age: 100 + i as u64,
                    key: "b",
                });
            }
            v
        };
        // b runs 1 of its 4-row half for many steps, then brings 30.
        for _ in 0..100 {
            picker.pick(8, seqs(30, 1), |_| RowTerms::default());
        }
        let chosen = picker.pick(8, seqs(30, 30), |_| RowTerms::default());
        let b = chosen.iter().filter(|k| **k == "b").count();
        assert_eq!(b, 4, "half, not a burst: {chosen:?}");
    }
}
