//! The planner's KV memory: admission against a tenant's budget (and its
//! KV wait), blocks for each chunk, preemption when the pool or the
//! partition's memory is full, and the tenants' weighted parts of the
//! pool as they come and go.

use std::time::Instant;

use bulkhead_partition::{DEFAULT_KV_WAIT, PartitionError, SeqId, TenantBlocks, Victim};

use super::budget::Holding;
use super::{Planner, Range, SequenceError};
use crate::engine::BLOCK_TOKENS;

impl Planner {
    /// Admits a waiting sequence into the pool if a slot and its tenant's
    /// budget allow; refuses it for good if it can never fit.
    pub(super) fn admit(&mut self, key: u64, now: Instant) -> bool {
        let running = self.slots.values().filter(|s| s.kv.is_some()).count();
        if running >= self.limits.max_running {
            return false;
        }
        let Some(s) = self.slots.get_mut(&key) else {
            return false;
        };
        let prompt = s.seq.prompt_tokens;
        match self.pool.admit(&s.seq.tenant, prompt, s.seq.max_tokens) {
            Ok(seq) => {
                s.kv = Some(seq);
                self.events.started.push(key);
                true
            }
            Err(e @ PartitionError::KvBudgetExceeded { .. }) if e.is_retryable() => {
                // Its own other sequences hold the rest of its budget.
                let since = *s.kv_waiting_since.get_or_insert(now);
                self.wait_for_budget(key, e, since, now)
            }
            Err(e) if e.is_retryable() => false,
            Err(PartitionError::KvBudgetExceeded {
                tenant,
                needed_tokens,
                available_tokens,
                of,
                ..
            }) => {
                self.kv_refusals += 1;
                if let Some(c) = self.count_of(&tenant) {
                    c.kv_refusals += 1;
                }
                let err = SequenceError::KvBudget {
                    tenant,
                    needed_tokens,
                    available_tokens,
                    of,
                };
                self.refuse(key, err);
                false
            }
            Err(e) => {
                self.refuse(key, SequenceError::Accounting(e));
                false
            }
        }
    }

    /// A waiting sequence whose tenant's budget is held by its other
    /// sequences: false while its KV wait lasts, then refused.
    pub(super) fn wait_for_budget(
        &mut self,
        key: u64,
        e: PartitionError,
        since: Instant,
        now: Instant,
    ) -> bool {
        let PartitionError::KvBudgetExceeded {
            tenant,
            needed_tokens,
            available_tokens,
            ..
        } = e
        else {
            return false;
        };
        let wait = self
            .shares
            .get(&tenant)
            .map_or(DEFAULT_KV_WAIT, |share| share.kv_wait);
        let waited = now.saturating_duration_since(since);
        if waited < wait {
            return false;
        }
        self.kv_refusals += 1;
        if let Some(c) = self.count_of(&tenant) {
            c.kv_refusals += 1;
        }
        let err = SequenceError::KvWait {
            tenant,
            needed_tokens,
            available_tokens,
            waited_ms: waited.as_millis(),
        };
        self.refuse(key, err);
        false
    }

    /// Gives `key` blocks for `positions` positions, preempting by the
    /// pool's rule when it is empty. A victim already chosen for this step
    /// is taken out of it.
    pub(super) fn grow(
        &mut self,
        key: u64,
        positions: usize,
        chosen: &mut Vec<(u64, Range<usize>, bool)>,
        deferred: &mut Vec<u64>,
    ) -> Grown {
        let needed = positions.div_ceil(BLOCK_TOKENS);
        loop {
            let Some(s) = self.slots.get_mut(&key) else {
                return Grown::No;
            };
            let Some(seq) = s.kv else { return Grown::No };
            if s.table.len() >= needed {
                return Grown::Yes;
            }
            let age = s.age;
            if !self
                .budget
                .try_charge(self.batch_id, key, age, self.block_bytes)
            {
                // The partition's memory is held, partly by other models.
                match self.partition_room(key, seq, age) {
                    Some(vkey) => {
                        if let Some(at) = chosen.iter().position(|(k, ..)| *k == vkey) {
                            chosen.remove(at);
                        }
                        deferred.push(vkey);
                        if vkey == key {
                            return Grown::No;
                        }
                        continue;
                    }
                    None => return Grown::No,
                }
            }
            let allocated = self.pool.allocate(seq);
            if allocated.is_err() {
                self.budget.release(age, self.block_bytes);
            }
            let Some(s) = self.slots.get_mut(&key) else {
                return Grown::No;
            };
            match allocated {
                Ok(block) => s.table.push(block.0),
                Err(PartitionError::KvPoolExhausted { .. }) => match self.pool.choose_victim(seq) {
                    Ok(Victim::Retry) => {}
                    Ok(Victim::Preempt(victim)) => {
                        let Some(vkey) = self.key_of(victim) else {
                            return Grown::No;
                        };
                        self.preempt(vkey);
                        if let Some(at) = chosen.iter().position(|(k, ..)| *k == vkey) {
                            chosen.remove(at);
                        }
                        // It prefills again: back in the round robin.
                        deferred.push(vkey);
                        if vkey == key {
                            return Grown::No;
                        }
                    }
                    Ok(Victim::Wait) | Err(_) => return Grown::No,
                },
                Err(e) => {
                    self.refuse(key, SequenceError::Accounting(e));
                    return Grown::No;
                }
            }
        }
    }

    /// Makes room in the partition's memory for `key` (module docs of
    /// [`PartitionKv`]): the sequence preempted (possibly `key` itself), or
    /// `None` when it must wait.
    pub(super) fn partition_room(&mut self, key: u64, seq: SeqId, age: u64) -> Option<u64> {
        if let Ok(Victim::Preempt(victim)) = self.pool.choose_victim_ignoring_free(seq) {
            let vkey = self.key_of(victim)?;
            self.preempt(vkey);
            return Some(vkey);
        }
        match self.budget.youngest_after(age) {
            Some(Holding {
                batch, key: vkey, ..
            }) if batch == self.batch_id => {
                self.preempt(vkey);
                Some(vkey)
            }
            Some(Holding { batch, age, .. }) => {
                self.budget.ask_reclaim(batch, age);
                None
            }
            None => {
                // The youngest holder: older sequences go first.
                let holds = self.slots.get(&key).is_some_and(|s| !s.table.is_empty());
                holds.then(|| {
                    self.preempt(key);
                    key
                })
            }
        }
    }

    /// Frees `key`'s blocks; it keeps its reservation and recomputes its
    /// cache (prompt and generated tokens) when it runs again.
    pub(super) fn preempt(&mut self, key: u64) {
        if let Some(s) = self.slots.get_mut(&key)
            && let Some(seq) = s.kv
        {
            let _ = self.pool.preempt(seq);
            self.budget
                .release(s.age, s.table.len() as u64 * self.block_bytes);
            self.preemptions += 1;
            self.events.preempted.push(key);
            s.table.clear();
            s.cached = 0;
            let tenant = s.seq.tenant.clone();
            if let Some(c) = self.count_of(&tenant) {
                c.preemptions += 1;
            }
        }
    }

    pub(super) fn key_of(&self, seq: SeqId) -> Option<u64> {
        self.slots
            .iter()
            .find(|(_, s)| s.kv == Some(seq))
            .map(|(k, _)| *k)
    }

    /// A tenant's first sequence: the weighted parts are divided anew
    /// (the others' shrink first, so the guarantees never exceed the pool).
    pub(super) fn join_tenant(&mut self, tenant: &str) -> Result<(), PartitionError> {
        let share = self.shares.get(tenant).copied().unwrap_or_default();
        let active: Vec<String> = self.pool.tenants().map(str::to_string).collect();
        let weights = self.active_weights(active.iter().map(String::as_str).chain([tenant]));
        for t in &active {
            self.pool.set_limits(t, self.limits_of(t, weights))?;
        }
        self.pool
            .add_tenant(tenant, self.limits_of(tenant, weights))?;
        self.drr.set_tenant(tenant, share.weight)
    }

    /// A tenant's last sequence ended: the others' parts grow back.
    pub(super) fn leave_tenant(&mut self, tenant: &str) {
        if self.pool.remove_tenant(tenant).is_err() {
            return;
        }
        if !self.shares.contains_key(tenant) {
            // An unlisted tenant's counts go with it (its names are the caller's).
            self.counts.remove(tenant);
        }
        let active: Vec<String> = self.pool.tenants().map(str::to_string).collect();
        let weights = self.active_weights(active.iter().map(String::as_str));
        for t in &active {
            let _ = self.pool.set_limits(t, self.limits_of(t, weights));
        }
    }

    /// Total weight of the `active` tenants without blocks of their own.
    pub(super) fn active_weights<'a>(&self, active: impl Iterator<Item = &'a str>) -> u64 {
        active
            .map(|t| self.shares.get(t).copied().unwrap_or_default())
            .filter(|s| s.own_blocks.is_none())
            .map(|s| u64::from(s.weight))
            .sum()
    }

    /// `tenant`'s limits while tenants of total weight `weights` share the
    /// blocks no one owns: its own blocks, or its weighted part of those
    /// (rounded down, so the parts never add up past them) and all of them
    /// to borrow.
    pub(super) fn limits_of(&self, tenant: &str, weights: u64) -> TenantBlocks {
        let share = self.shares.get(tenant).copied().unwrap_or_default();
        let total = u64::from(self.pool.total_blocks());
        match share.own_blocks {
            Some(own) => TenantBlocks {
                guaranteed: own.min(total),
                budget: own.min(total),
            },
            None => {
                let unowned = total - self.owned_blocks.min(total);
                let part =
                    u128::from(unowned) * u128::from(share.weight) / u128::from(weights.max(1));
                TenantBlocks {
                    guaranteed: u64::try_from(part).unwrap_or(unowned),
                    budget: unowned,
                }
            }
        }
    }
}

pub(super) enum Grown {
    Yes,
    No,
}
