//! Paged KV-cache accounting: a partition's KV memory as a pool of
//! fixed-size blocks, each charged to the tenant whose sequence holds it.
//!
//! Blocks are [`KV_BLOCK_TOKENS`] = 16 tokens. Small enough that a sequence
//! wastes at most 15 tokens of cache (under 7% of a 256-token sequence, less
//! for longer ones), large enough that a 32k context is a 2,048-entry block
//! table and the attention kernel reads 16 contiguous positions per block
//! (one per lane group of a 64-wide wavefront, 4 lanes each). It is also what
//! vLLM settled on, so the trade-off has been measured by others.
//!
//! Rules, per tenant in the pool:
//! - **Admission reserves** `prompt + max_tokens` worth of blocks against the
//!   tenant's budget (the most it may hold); a request that does not fit is
//!   refused with how much it needs and has. One sequence must also fit the
//!   tenant's *guaranteed* blocks, so the oldest sequence of every tenant
//!   can always finish (see below).
//! - **Blocks are taken on demand**, one at a time as the sequence grows,
//!   from a pool shared by the partition: a tenant may use blocks others
//!   leave idle, up to its reservation.
//! - **When the pool is empty**, [`KvPool::choose_victim`] picks a sequence
//!   to preempt (its blocks freed, recomputed later): first the youngest
//!   sequence of the other tenant furthest over its guarantee, if it is
//!   further over than the requester; else, if the requester's tenant is at
//!   or over its own guarantee, its own youngest sequence if that is not
//!   older than the requester; else the requester waits. **Another tenant's sequence is preempted only while
//!   that tenant holds more than its guaranteed blocks.**
//!
//! No deadlock: the guarantees add up to at most the pool, so when the pool
//! is empty and a tenant holds less than its guarantee, some other tenant
//! holds more and is preempted. A tenant at its guarantee preempts its own
//! younger sequences; its oldest one needs no more than the guarantee
//! (admission), so it always gets its blocks and finishes.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{AS_GUARANTEED_SHARE, LEFT_OF_BUDGET};
use crate::{Partition, PartitionError};

/// Tokens per KV block (see the module documentation for why 16).
pub const KV_BLOCK_TOKENS: u32 = 16;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

/// How many bytes one token of KV cache takes for a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    bytes_per_token: u64,
}

impl KvGeometry {
    /// K and V (2) × layers × KV heads × head dimension × element size.
    pub fn new(
        layers: u32,
        kv_heads: u32,
        head_dim: u32,
        dtype: KvDtype,
    ) -> Result<KvGeometry, PartitionError> {
        if layers == 0 || kv_heads == 0 || head_dim == 0 {
            return Err(PartitionError::InvalidKvGeometry {
                reason: format!(
                    "layers {layers}, kv_heads {kv_heads}, head_dim {head_dim}: none may be 0"
                ),
            });
        }
        let bytes_per_token = [u64::from(layers), u64::from(kv_heads), u64::from(head_dim)]
            .into_iter()
            .try_fold(2 * dtype.bytes(), u64::checked_mul)
            .filter(|b| b.checked_mul(u64::from(KV_BLOCK_TOKENS)).is_some())
            .ok_or_else(|| PartitionError::InvalidKvGeometry {
                reason: "one block's size does not fit in 64 bits".to_string(),
            })?;
        Ok(KvGeometry { bytes_per_token })
    }

    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }

    pub fn bytes_per_block(&self) -> u64 {
        self.bytes_per_token * u64::from(KV_BLOCK_TOKENS)
    }

    /// Whole blocks in `bytes` (rounded down).
    pub fn blocks_in(&self, bytes: u64) -> u64 {
        bytes / self.bytes_per_block()
    }

    /// Blocks that hold `tokens` tokens (rounded up).
    pub fn blocks_for_tokens(tokens: u64) -> u64 {
        tokens.div_ceil(u64::from(KV_BLOCK_TOKENS))
    }
}

/// A block of the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

/// An admitted sequence; ids increase with admission, so a larger id is a
/// younger sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

/// A tenant's standing in a pool, in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantBlocks {
    /// Blocks it always gets (preempting tenants over their own guarantee).
    pub guaranteed: u64,
    /// The most its admitted sequences may reserve together.
    pub budget: u64,
}

/// Whether free blocks of the pool can satisfy a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FreeBlocks {
    Count,
    Ignore,
}

/// What to do when a sequence cannot get a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victim {
    /// Free blocks exist: allocate again.
    Retry,
    /// Preempt this sequence ([`KvPool::preempt`]); it may be the requester.
    Preempt(SeqId),
    /// Nobody may be preempted: wait for a sequence to finish.
    Wait,
}

#[derive(Debug)]
struct Account {
    limits: TenantBlocks,
    /// Blocks its sequences hold now.
    held: u64,
    /// Blocks its admitted sequences reserved.
    reserved: u64,
}

#[derive(Debug)]
struct Sequence {
    tenant: Arc<str>,
    blocks: Vec<BlockId>,
    reserved: u64,
}

/// One partition's KV blocks and who holds them.
#[derive(Debug)]
pub struct KvPool {
    total: u32,
    /// Free blocks, taken from the end.
    free: Vec<BlockId>,
    tenants: BTreeMap<Arc<str>, Account>,
    sequences: BTreeMap<SeqId, Sequence>,
    next_seq: u64,
}

impl KvPool {
    /// A pool of `total_blocks` shared by `tenants`. Their guarantees must
    /// add up to at most the pool, and each budget lie between its
    /// guarantee and the pool.
    pub fn new<'a>(
        total_blocks: u32,
        tenants: impl IntoIterator<Item = (&'a str, TenantBlocks)>,
    ) -> Result<KvPool, PartitionError> {
        let mut accounts = BTreeMap::new();
        let mut guaranteed = 0u64;
        for (tenant, limits) in tenants {
            let invalid = |reason: String| PartitionError::InvalidKvPool { reason };
            if limits.guaranteed > limits.budget || limits.budget > u64::from(total_blocks) {
                return Err(invalid(format!(
                    "tenant {tenant}: guaranteed {} ≤ budget {} ≤ pool {total_blocks} does not hold",
                    limits.guaranteed, limits.budget
                )));
            }
            guaranteed = guaranteed.saturating_add(limits.guaranteed);
            let account = Account {
                limits,
                held: 0,
                reserved: 0,
            };
            if accounts.insert(Arc::from(tenant), account).is_some() {
                return Err(invalid(format!("tenant {tenant} is listed twice")));
            }
        }
        if guaranteed > u64::from(total_blocks) {
            return Err(PartitionError::InvalidKvPool {
                reason: format!(
                    "guarantees add up to {guaranteed} blocks, above the pool's {total_blocks}"
                ),
            });
        }
        Ok(KvPool {
            total: total_blocks,
            // Reversed so blocks are handed out from 0 up.
            free: (0..total_blocks).rev().map(BlockId).collect(),
            tenants: accounts,
            sequences: BTreeMap::new(),
            next_seq: 1,
        })
    }

    /// The pool of `partition` for a model with `geometry`.
    pub fn for_partition(
        partition: &Partition,
        geometry: &KvGeometry,
    ) -> Result<KvPool, PartitionError> {
        let blocks = |bytes| geometry.blocks_in(bytes);
        let total = u32::try_from(blocks(partition.memory_bytes)).map_err(|_| {
            PartitionError::InvalidKvPool {
                reason: format!(
                    "{} blocks do not fit in 32 bits",
                    blocks(partition.memory_bytes)
                ),
            }
        })?;
        let limits: Vec<(&str, TenantBlocks)> = partition
            .tenants
            .iter()
            .map(|slot| {
                let limits = TenantBlocks {
                    guaranteed: blocks(slot.guaranteed_bytes),
                    budget: blocks(slot.budget_bytes),
                };
                (slot.tenant.as_str(), limits)
            })
            .collect();
        KvPool::new(total, limits)
    }

    /// Adds `tenant` to the pool (a shared partition whose tenants are
    /// known only as their requests arrive). The guarantees must still add
    /// up to at most the pool: lower the others first ([`KvPool::set_limits`]).
    pub fn add_tenant(&mut self, tenant: &str, limits: TenantBlocks) -> Result<(), PartitionError> {
        if self.tenants.contains_key(tenant) {
            return Err(PartitionError::InvalidKvPool {
                reason: format!("tenant {tenant} is listed twice"),
            });
        }
        self.check_limits(tenant, limits, 0)?;
        let account = Account {
            limits,
            held: 0,
            reserved: 0,
        };
        self.tenants.insert(Arc::from(tenant), account);
        Ok(())
    }

    /// Changes `tenant`'s limits. Sequences already admitted keep their
    /// reservations (a lower budget only stops new admissions); a lower
    /// guarantee makes blocks held above it preemptible.
    pub fn set_limits(&mut self, tenant: &str, limits: TenantBlocks) -> Result<(), PartitionError> {
        let old = self
            .tenants
            .get(tenant)
            .ok_or_else(|| PartitionError::UnknownTenant {
                tenant: tenant.to_string(),
            })?
            .limits
            .guaranteed;
        self.check_limits(tenant, limits, old)?;
        if let Some(account) = self.tenants.get_mut(tenant) {
            account.limits = limits;
        }
        Ok(())
    }

    /// Removes `tenant`, which must have no admitted sequence.
    pub fn remove_tenant(&mut self, tenant: &str) -> Result<(), PartitionError> {
        let account = self
            .tenants
            .get(tenant)
            .ok_or_else(|| PartitionError::UnknownTenant {
                tenant: tenant.to_string(),
            })?;
        if account.reserved > 0 || account.held > 0 {
            return Err(PartitionError::InvalidKvPool {
                reason: format!("tenant {tenant} still has admitted sequences"),
            });
        }
        self.tenants.remove(tenant);
        Ok(())
    }

    /// Tenants in the pool, by name.
    pub fn tenants(&self) -> impl Iterator<Item = &str> + '_ {
        self.tenants.keys().map(|t| &**t)
    }

    /// `limits` for `tenant` keep guaranteed ≤ budget ≤ pool and the sum of
    /// guarantees (with `replaced` of it taken out) within the pool.
    fn check_limits(
        &self,
        tenant: &str,
        limits: TenantBlocks,
        replaced: u64,
    ) -> Result<(), PartitionError> {
        let total = u64::from(self.total);
        if limits.guaranteed > limits.budget || limits.budget > total {
            return Err(PartitionError::InvalidKvPool {
                reason: format!(
                    "tenant {tenant}: guaranteed {} ≤ budget {} ≤ pool {total} does not hold",
                    limits.guaranteed, limits.budget
                ),
            });
        }
        let others: u64 = self
            .tenants
            .values()
            .map(|a| a.limits.guaranteed)
            .sum::<u64>()
            - replaced;
        if others.saturating_add(limits.guaranteed) > total {
            return Err(PartitionError::InvalidKvPool {
                reason: format!(
                    "guarantees would add up to {} blocks, above the pool's {total}",
                    others.saturating_add(limits.guaranteed)
                ),
            });
        }
        Ok(())
    }

    /// Admits a sequence of `tenant` that may grow to `prompt_tokens +
    /// max_tokens`, reserving that many blocks of its budget.
    pub fn admit(
        &mut self,
        tenant: &str,
        prompt_tokens: u64,
        max_tokens: u64,
    ) -> Result<SeqId, PartitionError> {
        let (name, account) =
            self.tenants
                .get_key_value(tenant)
                .ok_or_else(|| PartitionError::UnknownTenant {
                    tenant: tenant.to_string(),
                })?;
        let name = Arc::clone(name);
        let needed_tokens = prompt_tokens.saturating_add(max_tokens);
        let needed_blocks = KvGeometry::blocks_for_tokens(needed_tokens);
        let refuse = |available_blocks: u64, of| PartitionError::KvBudgetExceeded {
            tenant: tenant.to_string(),
            needed_blocks,
            needed_tokens,
            available_blocks,
            available_tokens: available_blocks.saturating_mul(u64::from(KV_BLOCK_TOKENS)),
            of,
        };
        let guaranteed = account.limits.guaranteed;
        if needed_blocks > guaranteed {
            return Err(refuse(guaranteed, AS_GUARANTEED_SHARE));
        }
        let left = account.limits.budget - account.reserved;
        if needed_blocks > left {
            return Err(refuse(left, LEFT_OF_BUDGET));
        }
        if let Some(account) = self.tenants.get_mut(tenant) {
            account.reserved += needed_blocks;
        }
        let seq = SeqId(self.next_seq);
        self.next_seq += 1;
        self.sequences.insert(
            seq,
            Sequence {
                tenant: name,
                blocks: Vec::new(),
                reserved: needed_blocks,
            },
        );
        Ok(seq)
    }

    /// One more block for `seq`, charged to its tenant. `KvPoolExhausted`:
    /// ask [`KvPool::choose_victim`].
    pub fn allocate(&mut self, seq: SeqId) -> Result<BlockId, PartitionError> {
        let sequence = self
            .sequences
            .get_mut(&seq)
            .ok_or(PartitionError::UnknownSequence { seq: seq.0 })?;
        if sequence.blocks.len() as u64 >= sequence.reserved {
            return Err(PartitionError::KvReservationUsed { seq: seq.0 });
        }
        let block = self
            .free
            .pop()
            .ok_or_else(|| PartitionError::KvPoolExhausted {
                tenant: sequence.tenant.to_string(),
            })?;
        sequence.blocks.push(block);
        if let Some(account) = self.tenants.get_mut(&sequence.tenant) {
            account.held += 1;
        }
        Ok(block)
    }

    /// Frees `seq`'s blocks but keeps it admitted (it will recompute its
    /// cache and take blocks again). Returns how many were freed.
    pub fn preempt(&mut self, seq: SeqId) -> Result<u64, PartitionError> {
        let sequence = self
            .sequences
            .get_mut(&seq)
            .ok_or(PartitionError::UnknownSequence { seq: seq.0 })?;
        let freed = sequence.blocks.len() as u64;
        // Reversed so the next allocations reuse them in the same order.
        self.free.extend(sequence.blocks.drain(..).rev());
        if let Some(account) = self.tenants.get_mut(&sequence.tenant) {
            account.held -= freed;
        }
        Ok(freed)
    }

    /// Ends `seq` (finished, failed or cancelled): its blocks and its
    /// reservation return.
    pub fn release(&mut self, seq: SeqId) -> Result<(), PartitionError> {
        self.preempt(seq)?;
        if let Some(sequence) = self.sequences.remove(&seq)
            && let Some(account) = self.tenants.get_mut(&sequence.tenant)
        {
            account.reserved -= sequence.reserved;
        }
        Ok(())
    }

    /// Which sequence to preempt so `requester` can grow (module docs).
    pub fn choose_victim(&self, requester: SeqId) -> Result<Victim, PartitionError> {
        self.victim_for(requester, FreeBlocks::Count)
    }

    /// As [`KvPool::choose_victim`] when memory outside this pool ran out
    /// (a partition's budget shared with the pools of its other models):
    /// free blocks here do not help, so never [`Victim::Retry`].
    pub fn choose_victim_ignoring_free(&self, requester: SeqId) -> Result<Victim, PartitionError> {
        self.victim_for(requester, FreeBlocks::Ignore)
    }

    fn victim_for(&self, requester: SeqId, free: FreeBlocks) -> Result<Victim, PartitionError> {
        let own = self
            .sequences
            .get(&requester)
            .ok_or(PartitionError::UnknownSequence { seq: requester.0 })?;
        if free == FreeBlocks::Count && !self.free.is_empty() {
            return Ok(Victim::Retry);
        }
        let excess =
            |account: &Account| i128::from(account.held) - i128::from(account.limits.guaranteed);
        let own_excess = self.tenants.get(&own.tenant).map_or(0, excess);
        // The other tenant furthest over its guarantee; the first by name on ties.
        let furthest = self
            .tenants
            .iter()
            .filter(|(name, _)| **name != own.tenant)
            .map(|(name, account)| (name, excess(account)))
            .filter(|(_, over)| *over > 0 && *over > own_excess)
            .fold(
                None,
                |best: Option<(&Arc<str>, i128)>, (name, over)| match best {
                    Some((_, best_over)) if best_over >= over => best,
                    _ => Some((name, over)),
                },
            );
        if let Some((tenant, _)) = furthest {
            return Ok(self
                .youngest_holding(tenant)
                .map_or(Victim::Wait, Victim::Preempt));
        }
        // At or over its own guarantee, a tenant makes room from its own
        // sequences, younger ones first; never an older one for a younger.
        if own_excess >= 0
            && let Some(seq) = self.youngest_holding(&own.tenant)
            && (seq > requester || (seq == requester && self.holders_of(&own.tenant) > 1))
        {
            return Ok(Victim::Preempt(seq));
        }
        Ok(Victim::Wait)
    }

    fn youngest_holding(&self, tenant: &str) -> Option<SeqId> {
        self.sequences
            .iter()
            .rev()
            .find(|(_, s)| &*s.tenant == tenant && !s.blocks.is_empty())
            .map(|(id, _)| *id)
    }

    fn holders_of(&self, tenant: &str) -> usize {
        self.sequences
            .values()
            .filter(|s| &*s.tenant == tenant && !s.blocks.is_empty())
            .count()
    }

    /// The blocks `seq` holds, in the order it took them (its block table).
    pub fn blocks(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.sequences.get(&seq).map(|s| s.blocks.as_slice())
    }

    /// The tenant of `seq`.
    pub fn tenant_of(&self, seq: SeqId) -> Option<&str> {
        self.sequences.get(&seq).map(|s| &*s.tenant)
    }

    /// Blocks `tenant`'s sequences hold (what it is charged).
    pub fn held_blocks(&self, tenant: &str) -> Option<u64> {
        self.tenants.get(tenant).map(|a| a.held)
    }

    /// Blocks `tenant`'s admitted sequences reserved.
    pub fn reserved_blocks(&self, tenant: &str) -> Option<u64> {
        self.tenants.get(tenant).map(|a| a.reserved)
    }

    pub fn limits(&self, tenant: &str) -> Option<TenantBlocks> {
        self.tenants.get(tenant).map(|a| a.limits)
    }

    pub fn total_blocks(&self) -> u32 {
        self.total
    }

    pub fn free_blocks(&self) -> u32 {
        self.free.len() as u32
    }

    /// Admitted sequences, oldest first.
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.sequences.keys().copied()
    }

    /// No sequence admitted and every block free.
    pub fn is_idle(&self) -> bool {
        self.sequences.is_empty()
            && self.free.len() == self.total as usize
            && self
                .tenants
                .values()
                .all(|a| a.held == 0 && a.reserved == 0)
    }
}

#[cfg(test)]
mod tests;
