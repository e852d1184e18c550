//! Weighted-fair selection across the tenants of a shared partition:
//! deficit round robin on tokens (Shreedhar & Varghese, 1995). Each turn a
//! tenant earns `quantum × weight` tokens of credit and spends it on its
//! queued work (a decode step costs 1 token, a prefill chunk its length);
//! what it cannot afford waits for its next turn. Over time tenants get
//! tokens in proportion to their weights whatever their work's sizes.
//!
//! A tenant whose queue empties leaves the rotation and loses its credit,
//! so idling never banks a burst. Within a tenant, work runs by priority
//! (higher first), then in arrival order.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;

use crate::PartitionError;

/// Credit per turn per unit of weight: one KV block's worth of tokens. A
/// turn then serves up to 16 decode steps of a weight-1 tenant, or part of a
/// prefill chunk, so turns are short and shares converge within a few steps.
pub const DEFAULT_QUANTUM_TOKENS: u64 = 16;

/// A deficit-round-robin queue of work items `T` across tenants.
#[derive(Debug)]
pub struct Drr<T> {
    quantum_tokens: u64,
    lanes: BTreeMap<Arc<str>, Lane<T>>,
    /// Tenants with queued work, the one whose turn it is first.
    active: VecDeque<Arc<str>>,
    /// Whether the front tenant has had this turn's credit.
    turn_open: bool,
    /// Turns ended in a row without serving anything.
    idle_turns: usize,
    next_arrival: u64,
}

#[derive(Debug)]
struct Lane<T> {
    weight: u32,
    deficit_tokens: u64,
    queue: BinaryHeap<Entry<T>>,
}

#[derive(Debug)]
struct Entry<T> {
    priority: i32,
    arrival: u64,
    cost_tokens: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
/// The heap's greatest entry runs first: highest priority, then earliest.
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then(other.arrival.cmp(&self.arrival))
    }
}

/// A work item chosen to run, with its tenant and cost.
#[derive(Debug, PartialEq, Eq)]
pub struct Scheduled<T> {
    pub tenant: Arc<str>,
    pub cost_tokens: u64,
    pub item: T,
}

impl<T> Drr<T> {
    /// An empty queue; `quantum_tokens` of credit per turn per unit of
    /// weight (at least 1).
    pub fn new(quantum_tokens: u64) -> Drr<T> {
        Drr {
            quantum_tokens: quantum_tokens.max(1),
            lanes: BTreeMap::new(),
            active: VecDeque::new(),
            turn_open: false,
            idle_turns: 0,
            next_arrival: 0,
        }
    }

    /// Adds `tenant` or changes its weight (at least 1).
    pub fn set_tenant(&mut self, tenant: &str, weight: u32) -> Result<(), PartitionError> {
        if weight == 0 {
            return Err(PartitionError::InvalidRequest {
                tenant: tenant.to_string(),
                field: "weight",
                reason: "must be at least 1".to_string(),
            });
        }
        match self.lanes.get_mut(tenant) {
            Some(lane) => lane.weight = weight,
            None => {
                self.lanes.insert(
                    Arc::from(tenant),
                    Lane {
                        weight,
                        deficit_tokens: 0,
                        queue: BinaryHeap::new(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Queues `item` for `tenant`, costing `cost_tokens` when it runs.
    pub fn push(
        &mut self,
        tenant: &str,
        priority: i32,
        cost_tokens: u64,
        item: T,
    ) -> Result<(), PartitionError> {
        let (name, lane) =
            self.lanes
                .get_key_value(tenant)
                .ok_or_else(|| PartitionError::UnknownTenant {
                    tenant: tenant.to_string(),
                })?;
        if lane.queue.is_empty() {
            self.active.push_back(Arc::clone(name));
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        if let Some(lane) = self.lanes.get_mut(tenant) {
            lane.queue.push(Entry {
                priority,
                arrival,
                cost_tokens,
                item,
            });
        }
        Ok(())
    }

    /// The next item to run, or `None` when nothing is queued.
    pub fn pop(&mut self) -> Option<Scheduled<T>> {
        loop {
            let front = Arc::clone(self.active.front()?);
            let quantum = self.quantum_tokens;
            let lane = self.lanes.get_mut(&front)?;
            if !self.turn_open {
                lane.deficit_tokens = lane
                    .deficit_tokens
                    .saturating_add(quantum * u64::from(lane.weight));
                self.turn_open = true;
            }
            let affordable = lane
                .queue
                .peek()
                .is_some_and(|head| head.cost_tokens <= lane.deficit_tokens);
            if affordable && let Some(entry) = lane.queue.pop() {
                lane.deficit_tokens -= entry.cost_tokens;
                self.idle_turns = 0;
                if lane.queue.is_empty() {
                    // Leaving the rotation forfeits credit: no banked bursts.
                    lane.deficit_tokens = 0;
                    self.active.pop_front();
                    self.turn_open = false;
                }
                return Some(Scheduled {
                    tenant: front,
                    cost_tokens: entry.cost_tokens,
                    item: entry.item,
                });
            }
            self.active.rotate_left(1);
            self.turn_open = false;
            self.idle_turns += 1;
            if self.idle_turns >= self.active.len() {
                self.skip_idle_rounds();
            }
        }
    }

    /// Every tenant had a turn and none could afford its next item (items
    /// larger than a quantum): credit the rounds that would pass before the
    /// first one can, at once, instead of looping through them.
    fn skip_idle_rounds(&mut self) {
        let quantum = self.quantum_tokens;
        let rounds = self
            .active
            .iter()
            .filter_map(|name| {
                let lane = self.lanes.get(name)?;
                let head = lane.queue.peek()?;
                let per_turn = quantum * u64::from(lane.weight);
                Some(
                    head.cost_tokens
                        .saturating_sub(lane.deficit_tokens)
                        .div_ceil(per_turn),
                )
            })
            .min()
            .unwrap_or(1);
        // The next turn adds one round's credit itself.
        let skipped = rounds.saturating_sub(1);
        for name in &self.active {
            if let Some(lane) = self.lanes.get_mut(name) {
                let credit = skipped.saturating_mul(quantum * u64::from(lane.weight));
                lane.deficit_tokens = lane.deficit_tokens.saturating_add(credit);
            }
        }
        self.idle_turns = 0;
    }

    /// Items queued across all tenants.
    pub fn len(&self) -> usize {
        self.lanes.values().map(|l| l.queue.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// `tenant`'s unspent credit, in tokens.
    pub fn deficit_tokens(&self, tenant: &str) -> Option<u64> {
        self.lanes.get(tenant).map(|l| l.deficit_tokens)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Tokens each tenant got over `pops` pops, each popped item re-queued
    /// at the same cost: tenants with a backlog that never drains. (A
    /// tenant with a single item leaves the rotation each time it runs:
    /// one running sequence cannot use more than a token per step anyway.)
    fn shares(drr: &mut Drr<u64>, pops: usize) -> BTreeMap<String, u64> {
        let mut tokens = BTreeMap::new();
        for _ in 0..pops {
            let s = drr.pop().expect("work is always queued");
            *tokens.entry(s.tenant.to_string()).or_default() += s.cost_tokens;
            drr.push(&s.tenant, 0, s.cost_tokens, s.item).unwrap();
        }
        tokens
    }

    fn ratio(tokens: &BTreeMap<String, u64>, a: &str, b: &str) -> f64 {
        tokens[a] as f64 / tokens[b] as f64
    }

    #[test]
    fn equal_weights_get_equal_tokens_whatever_the_item_sizes() {
        let mut drr = Drr::new(DEFAULT_QUANTUM_TOKENS);
        drr.set_tenant("decode", 1).unwrap();
        drr.set_tenant("prefill", 1).unwrap();
        for i in 0..4 {
            drr.push("decode", 0, 1, i).unwrap();
        }
        drr.push("prefill", 0, 48, 0).unwrap();
        let tokens = shares(&mut drr, 20_000);
        let r = ratio(&tokens, "decode", "prefill");
        assert!((0.97..=1.03).contains(&r), "{tokens:?}");
    }

    #[test]
    fn three_to_one_weights_get_three_to_one_tokens() {
        let mut drr = Drr::new(DEFAULT_QUANTUM_TOKENS);
        drr.set_tenant("big", 3).unwrap();
        drr.set_tenant("small", 1).unwrap();
        for i in 0..64 {
            drr.push("big", 0, 1, i).unwrap();
            drr.push("small", 0, 5, i).unwrap();
        }
        let tokens = shares(&mut drr, 20_000);
        let r = ratio(&tokens, "big", "small");
        assert!((2.9..=3.1).contains(&r), "{tokens:?}");
    }

    #[test]
    fn an_idle_tenant_banks_no_credit() {
        let mut drr = Drr::new(DEFAULT_QUANTUM_TOKENS);
        drr.set_tenant("busy", 1).unwrap();
        drr.set_tenant("idle", 1).unwrap();
        drr.push("idle", 0, 1, 0).unwrap();
        drr.pop().unwrap(); // idle's one item; it leaves the rotation
        assert_eq!(drr.deficit_tokens("idle"), Some(0));
        for i in 0..100 {
            drr.push("busy", 0, 1, i).unwrap();
        }
        shares(&mut drr, 10_000);
        assert_eq!(drr.deficit_tokens("idle"), Some(0));
        // Back with a backlog: it gets half from now on, not a burst.
        for i in 0..1_000 {
            drr.push("idle", 0, 1, i).unwrap();
        }
        let mut idle = 0;
        for _ in 0..200 {
            let s = drr.pop().unwrap();
            if &*s.tenant == "idle" {
                idle += 1;
            } else {
                drr.push("busy", 0, 1, 0).unwrap();
            }
        }
        assert!((100 - 16..=100 + 16).contains(&idle), "{idle} of 200");
    }

    #[test]
    fn priority_orders_work_within_a_tenant() {
        let mut drr = Drr::new(DEFAULT_QUANTUM_TOKENS);
        drr.set_tenant("a", 1).unwrap();
        for (priority, item) in [(0, "low"), (5, "urgent-1"), (1, "normal"), (5, "urgent-2")] {
            drr.push("a", priority, 1, item).unwrap();
        }
        let order: Vec<&str> = std::iter::from_fn(|| drr.pop().map(|s| s.item)).collect();
        assert_eq!(order, ["urgent-1", "urgent-2", "normal", "low"]);
        assert!(drr.is_empty());
    }

    #[test]
    fn items_larger_than_a_quantum_run_without_spinning() {
        let mut drr = Drr::new(1);
        drr.set_tenant("a", 1).unwrap();
        drr.set_tenant("b", 2).unwrap();
        drr.push("a", 0, 1_000_000_000, "huge").unwrap();
        drr.push("b", 0, 3_000_000_000, "huger").unwrap();
        assert_eq!(drr.pop().map(|s| s.item), Some("huge"));
        assert_eq!(drr.pop().map(|s| s.item), Some("huger"));
        assert_eq!(drr.pop(), None);
    }

    #[test]
    fn unknown_tenants_and_zero_weights_are_refused() {
        let mut drr: Drr<()> = Drr::new(16);
        assert!(drr.push("nobody", 0, 1, ()).is_err());
        assert!(drr.set_tenant("a", 0).is_err());
        assert_eq!(drr.len(), 0);
    }
}
