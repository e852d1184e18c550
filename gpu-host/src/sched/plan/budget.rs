//! One partition's KV memory, shared by the batches of every model it
//! serves. Each model's `KvPool` is sized to the whole partition (any one
//! model may use all of it), and every block a batch takes is also charged
//! here in bytes (models' blocks differ in size), so the models together
//! never hold more than the partition's memory.
//!
//! When the partition's memory is full, a sequence that needs a block
//! first asks its own pool's rule (a tenant over its guarantee gives way,
//! as when the pool itself is empty); failing that, memory goes oldest
//! first across models: the youngest sequence holding memory is preempted
//! if it is younger than the requester (at once in the same batch; at the
//! start of its batch's next step in another, the requester waiting until
//! then), and a requester that is itself the youngest frees its own blocks.
//! So the oldest sequence of the partition always gets its blocks (it fits
//! alone: admission keeps it within one pool) and no two models deadlock.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// A partition's KV byte budget; clones share it (one per scheduler thread).
#[derive(Clone, Debug)]
pub struct PartitionKv(Rc<RefCell<Ledger>>);

#[derive(Debug)]
struct Ledger {
    limit_bytes: u64,
    used_bytes: u64,
    next_batch: u32,
    next_age: u64,
    /// Sequences holding memory, by age (partition-wide arrival order).
    holders: BTreeMap<u64, Holder>,
    /// Sequences to preempt at their batch's next step: (batch, age).
    reclaim: BTreeSet<(u32, u64)>,
}

#[derive(Debug)]
struct Holder {
    batch: u32,
    key: u64,
    bytes: u64,
}

/// The youngest sequence holding memory, younger than a requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holding {
    pub batch: u32,
    pub key: u64,
    pub age: u64,
}

impl PartitionKv {
    /// A budget of `limit_bytes` for all the partition's models together.
    pub fn new(limit_bytes: u64) -> PartitionKv {
        PartitionKv(Rc::new(RefCell::new(Ledger {
            limit_bytes,
            used_bytes: 0,
            next_batch: 0,
            next_age: 0,
            holders: BTreeMap::new(),
            reclaim: BTreeSet::new(),
        })))
    }

    /// No limit beyond each pool's own (a batch on its own).
    pub fn unlimited() -> PartitionKv {
        PartitionKv::new(u64::MAX)
    }

    /// Bytes held by every model's sequences now.
    pub fn used_bytes(&self) -> u64 {
        self.0.borrow().used_bytes
    }

    pub fn limit_bytes(&self) -> u64 {
        self.0.borrow().limit_bytes
    }

    /// A new batch's id.
    pub(super) fn join(&self) -> u32 {
        let mut l = self.0.borrow_mut();
        l.next_batch += 1;
        l.next_batch
    }

    /// The next sequence's age.
    pub(super) fn next_age(&self) -> u64 {
        let mut l = self.0.borrow_mut();
        l.next_age += 1;
        l.next_age
    }

    /// Charges `bytes` to sequence `age` (`key` of `batch`) if they fit.
    pub(super) fn try_charge(&self, batch: u32, key: u64, age: u64, bytes: u64) -> bool {
        let mut l = self.0.borrow_mut();
        if l.used_bytes.saturating_add(bytes) > l.limit_bytes {
            return false;
        }
        l.used_bytes += bytes;
        l.holders
            .entry(age)
            .or_insert(Holder {
                batch,
                key,
                bytes: 0,
            })
            .bytes += bytes;
        true
    }

    /// Returns `bytes` sequence `age` held.
    pub(super) fn release(&self, age: u64, bytes: u64) {
        let mut l = self.0.borrow_mut();
        let Some(holder) = l.holders.get_mut(&age) else {
            return;
        };
        let bytes = bytes.min(holder.bytes);
        holder.bytes -= bytes;
        if holder.bytes == 0 {
            l.holders.remove(&age);
        }
        l.used_bytes -= bytes;
    }

    /// The youngest sequence holding memory that is younger than `age`.
    pub(super) fn youngest_after(&self, age: u64) -> Option<Holding> {
        let l = self.0.borrow();
        let (&youngest, holder) = l.holders.last_key_value()?;
        (youngest > age).then_some(Holding {
            batch: holder.batch,
            key: holder.key,
            age: youngest,
        })
    }

    /// Asks `batch` to preempt sequence `age` at its next step.
    pub(super) fn ask_reclaim(&self, batch: u32, age: u64) {
        self.0.borrow_mut().reclaim.insert((batch, age));
    }

    /// The sequences of `batch` others asked it to preempt.
    pub(super) fn take_reclaims(&self, batch: u32) -> Vec<u64> {
        let mut l = self.0.borrow_mut();
        let mine: Vec<(u32, u64)> = l
            .reclaim
            .range((batch, 0)..=(batch, u64::MAX))
            .copied()
            .collect();
        for k in &mine {
            l.reclaim.remove(k);
        }
        mine.into_iter().map(|(_, age)| age).collect()
    }
}
