use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::{Device, TenantRequest, plan};

fn blocks(guaranteed: u64, budget: u64) -> TenantBlocks {
    TenantBlocks { guaranteed, budget }
}

/// Checks every accounting invariant of `pool`.
fn assert_consistent(pool: &KvPool) {
    let mut seen = BTreeSet::new();
    for block in &pool.free {
        assert!(block.0 < pool.total, "{block:?} past the pool");
        assert!(seen.insert(*block), "{block:?} free twice");
    }
    for (name, account) in &pool.tenants {
        let mut held = 0;
        let mut reserved = 0;
        for s in pool.sequences.values().filter(|s| s.tenant == *name) {
            assert!(s.blocks.len() as u64 <= s.reserved);
            for block in &s.blocks {
                assert!(seen.insert(*block), "{block:?} held twice");
            }
            held += s.blocks.len() as u64;
            reserved += s.reserved;
        }
        assert_eq!(account.held, held, "{name} is charged for what it holds");
        assert_eq!(account.reserved, reserved, "{name}'s reservations");
        assert!(
            account.reserved <= account.limits.budget,
            "{name} within budget"
        );
    }
    assert_eq!(
        seen.len(),
        pool.total as usize,
        "every block is free or held"
    );
}

#[test]
fn geometry_is_two_times_layers_heads_dim_and_element_size() {
    // Llama-3-8B: 32 layers, 8 KV heads of 128, f16 → 128 KiB per token.
    let g = KvGeometry::new(32, 8, 128, KvDtype::F16).unwrap();
    assert_eq!(g.bytes_per_token(), 131_072);
    assert_eq!(g.bytes_per_block(), 2 << 20);
    assert_eq!(g.blocks_in(24 << 30), 12_288);
    let g = KvGeometry::new(2, 4, 8, KvDtype::F32).unwrap();
    assert_eq!(g.bytes_per_token(), 2 * 2 * 4 * 8 * 4);
    assert_eq!(KvGeometry::blocks_for_tokens(0), 0);
    assert_eq!(KvGeometry::blocks_for_tokens(16), 1);
    assert_eq!(KvGeometry::blocks_for_tokens(17), 2);
    assert!(KvGeometry::new(0, 8, 128, KvDtype::F16).is_err());
    assert!(KvGeometry::new(u32::MAX, u32::MAX, u32::MAX, KvDtype::F32).is_err());
}

#[test]
fn pools_follow_the_partitions_memory() {
    let gib = 1u64 << 30;
    let device = Device::cpu(2, 10 * gib).unwrap();
    let tenants = [
        TenantRequest {
            tenant: "a".to_string(),
            gpu: crate::GpuRequest {
                hbm_bytes: Some(2 * gib),
                ..Default::default()
            },
        },
        TenantRequest {
            tenant: "b".to_string(),
            gpu: Default::default(),
        },
    ];
    let layout = plan(&device, 0, &tenants).unwrap();
    let geometry = KvGeometry::new(32, 8, 128, KvDtype::F16).unwrap();
    let pool = KvPool::for_partition(layout.shared().unwrap(), &geometry).unwrap();
    assert_eq!(pool.total_blocks(), 5 * 1024);
    assert_eq!(pool.limits("a"), Some(blocks(1024, 1024)));
    assert_eq!(pool.limits("b"), Some(blocks(4 * 1024, 4 * 1024)));
}

#[test]
fn admission_says_what_a_request_needs_and_has() {
    let mut pool = KvPool::new(100, [("acme", blocks(40, 60)), ("beta", blocks(10, 10))]).unwrap();
    let first = pool.admit("acme", 300, 340).unwrap(); // 640 tokens = 40 blocks
    assert_eq!(pool.reserved_blocks("acme"), Some(40));
    let e = pool.admit("acme", 100, 300).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tenant acme needs 25 KV blocks (400 tokens) but has 20 (320 tokens) left of its budget"
    );
    assert!(e.is_retryable());
    let e = pool.admit("beta", 100, 100).unwrap_err();
    assert_eq!(
        e.to_string(),
        "tenant beta needs 13 KV blocks (200 tokens) but has 10 (160 tokens) as its guaranteed share"
    );
    assert!(!e.is_retryable());
    pool.release(first).unwrap();
    assert!(pool.admit("acme", 100, 300).is_ok());
    assert!(matches!(
        pool.admit("nobody", 1, 1),
        Err(PartitionError::UnknownTenant { .. })
    ));
}

#[test]
fn sequences_grow_within_their_reservation() {
    let mut pool = KvPool::new(8, [("a", blocks(4, 8))]).unwrap();
    let seq = pool.admit("a", 20, 12).unwrap(); // 2 blocks
    assert_eq!(pool.allocate(seq), Ok(BlockId(0)));
    assert_eq!(pool.allocate(seq), Ok(BlockId(1)));
    assert_eq!(
        pool.allocate(seq),
        Err(PartitionError::KvReservationUsed { seq: seq.0 })
    );
    assert_eq!(pool.blocks(seq), Some(&[BlockId(0), BlockId(1)][..]));
    assert_eq!(pool.held_blocks("a"), Some(2));
    pool.release(seq).unwrap();
    assert!(pool.is_idle());
}

#[test]
fn an_empty_pool_preempts_the_tenant_over_its_share() {
    // a and b each guaranteed 4 of 8; b borrowed a's idle half.
    let mut pool = KvPool::new(8, [("a", blocks(4, 8)), ("b", blocks(4, 8))]).unwrap();
    let b_old = pool.admit("b", 0, 64).unwrap();
    let b_young = pool.admit("b", 0, 64).unwrap();
    for _ in 0..4 {
        pool.allocate(b_old).unwrap();
        pool.allocate(b_young).unwrap();
    }
    let a = pool.admit("a", 0, 64).unwrap();
    assert!(matches!(
        pool.allocate(a),
        Err(PartitionError::KvPoolExhausted { .. })
    ));
    assert_eq!(pool.choose_victim(a), Ok(Victim::Preempt(b_young)));
    assert_eq!(pool.preempt(b_young), Ok(4));
    assert_eq!(pool.choose_victim(a), Ok(Victim::Retry));
    for _ in 0..4 {
        pool.allocate(a).unwrap();
    }
    // Both at their guarantee: b's sequences wait rather than take a's
    // blocks (a is within its share) or b's older sequence's.
    assert_eq!(pool.choose_victim(b_young), Ok(Victim::Wait));
    assert_eq!(pool.choose_victim(b_old), Ok(Victim::Wait));
    assert_consistent(&pool);
}

#[test]
fn at_its_share_a_tenant_preempts_its_own_younger_sequences() {
    let mut pool = KvPool::new(8, [("a", blocks(4, 8)), ("b", blocks(4, 8))]).unwrap();
    let a = pool.admit("a", 0, 64).unwrap();
    let b_old = pool.admit("b", 0, 64).unwrap();
    let b_young = pool.admit("b", 0, 64).unwrap();
    for _ in 0..4 {
        pool.allocate(a).unwrap();
    }
    for _ in 0..2 {
        pool.allocate(b_old).unwrap();
        pool.allocate(b_young).unwrap();
    }
    assert_eq!(pool.choose_victim(b_old), Ok(Victim::Preempt(b_young)));
    assert_eq!(pool.choose_victim(b_young), Ok(Victim::Preempt(b_young)));
    pool.preempt(b_young).unwrap();
    pool.allocate(b_old).unwrap();
    pool.allocate(b_old).unwrap();
    assert_eq!(pool.blocks(b_old).map(<[_]>::len), Some(4));
    assert_consistent(&pool);
}

#[derive(Clone, Debug)]
enum Op {
    Admit { tenant: usize, tokens: u64 },
    Grow { seq: usize },
    Preempt { seq: usize },
    Release { seq: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..3usize, 1..200u64).prop_map(|(tenant, tokens)| Op::Admit { tenant, tokens }),
        4 => (0..32usize).prop_map(|seq| Op::Grow { seq }),
        1 => (0..32usize).prop_map(|seq| Op::Preempt { seq }),
        1 => (0..32usize).prop_map(|seq| Op::Release { seq }),
    ]
}

const TENANTS: [&str; 3] = ["a", "b", "c"];

/// A pool of 40 blocks: a has a fixed 10, b and c split 30 (20 + 10) and
/// may each borrow all 30.
fn pool() -> KvPool {
    KvPool::new(
        40,
        [
            ("a", blocks(10, 10)),
            ("b", blocks(20, 30)),
            ("c", blocks(10, 30)),
        ],
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random admissions, growth (with preemption when the pool is empty),
    /// preemptions and releases: the accounting always adds up, no tenant
    /// within its guarantee loses a block to another, and releasing
    /// everything returns the pool to idle.
    #[test]
    fn accounting_holds_under_any_sequence_of_operations(ops in prop::collection::vec(op(), 1..300)) {
        let mut pool = pool();
        for op in ops {
            let live: Vec<SeqId> = pool.sequences().collect();
            let pick = |i: usize| live.get(i % live.len().max(1)).copied();
            match op {
                Op::Admit { tenant, tokens } => {
                    let _ = pool.admit(TENANTS[tenant], tokens / 2, tokens - tokens / 2);
                }
                Op::Grow { seq } => {
                    let Some(seq) = pick(seq) else { continue };
                    match pool.allocate(seq) {
                        Err(PartitionError::KvPoolExhausted { .. }) => {}
                        _ => continue,
                    }
                    let requester = pool.tenant_of(seq).unwrap().to_string();
                    match pool.choose_victim(seq).unwrap() {
                        Victim::Preempt(victim) => {
                            let owner = pool.tenant_of(victim).unwrap().to_string();
                            let held = pool.held_blocks(&owner).unwrap();
                            let guaranteed = pool.limits(&owner).unwrap().guaranteed;
                            if owner != requester {
                                prop_assert!(held > guaranteed, "{owner} within its share was preempted");
                            } else {
                                prop_assert!(held >= guaranteed, "{owner} below its share preempted itself");
                            }
                            prop_assert!(pool.preempt(victim).unwrap() > 0);
                            if victim != seq {
                                prop_assert!(pool.allocate(seq).is_ok());
                            }
                        }
                        Victim::Wait => {
                            let held = pool.held_blocks(&requester).unwrap();
                            let guaranteed = pool.limits(&requester).unwrap().guaranteed;
                            prop_assert!(held >= guaranteed, "{requester} below its share must not wait");
                        }
                        Victim::Retry => prop_assert!(false, "the pool was just exhausted"),
                    }
                }
                Op::Preempt { seq } => {
                    if let Some(seq) = pick(seq) {
                        pool.preempt(seq).unwrap();
                    }
                }
                Op::Release { seq } => {
                    if let Some(seq) = pick(seq) {
                        pool.release(seq).unwrap();
                    }
                }
            }
            assert_consistent(&pool);
        }
        let live: Vec<SeqId> = pool.sequences().collect();
        for seq in live {
            pool.release(seq).unwrap();
        }
        prop_assert!(pool.is_idle());
    }

    /// Every admitted sequence runs to its full reservation and finishes:
    /// steps go oldest first, a preempted sequence starts over, and the
    /// whole run ends within a bounded number of steps (no deadlock, no
    /// livelock).
    #[test]
    fn every_admitted_sequence_finishes(requests in prop::collection::vec((0..3usize, 1..160u64), 1..24)) {
        let mut pool = pool();
        let mut waiting: Vec<(usize, u64)> = requests;
        let mut steps = 0;
        while !waiting.is_empty() || pool.sequences().next().is_some() {
            // Admit what fits now; the rest waits for releases.
            waiting.retain(|&(tenant, tokens)| pool.admit(TENANTS[tenant], 0, tokens).is_err());
            let live: Vec<SeqId> = pool.sequences().collect();
            for seq in live {
                if pool.blocks(seq).is_none() {
                    continue; // preempted and released above in this step
                }
                match pool.allocate(seq) {
                    Ok(_) => {}
                    Err(PartitionError::KvReservationUsed { .. }) => pool.release(seq).unwrap(),
                    Err(PartitionError::KvPoolExhausted { .. }) => {
                        if let Victim::Preempt(victim) = pool.choose_victim(seq).unwrap() {
                            pool.preempt(victim).unwrap();
                        }
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                }
            }
            steps += 1;
            prop_assert!(steps < 20_000, "no progress: {pool:?}");
            assert_consistent(&pool);
        }
        prop_assert!(pool.is_idle());
    }
}

#[test]
fn tenants_join_and_leave_a_shared_pool_within_its_guarantees() {
    let mut pool = KvPool::new(64, [("a", blocks(64, 64))]).unwrap();
    // The pool is fully guaranteed to a: b fits only once a's share shrinks.
    assert!(pool.add_tenant("b", blocks(32, 64)).is_err());
    pool.set_limits("a", blocks(32, 64)).unwrap();
    pool.add_tenant("b", blocks(32, 64)).unwrap();
    assert!(pool.add_tenant("b", blocks(0, 64)).is_err(), "listed twice");
    assert!(
        pool.set_limits("a", blocks(33, 64)).is_err(),
        "above the pool"
    );
    assert!(
        pool.set_limits("a", blocks(8, 4)).is_err(),
        "guarantee above budget"
    );
    let seq = pool.admit("b", 10, 10).unwrap();
    pool.allocate(seq).unwrap();
    assert!(pool.remove_tenant("b").is_err(), "b still holds a sequence");
    pool.release(seq).unwrap();
    pool.remove_tenant("b").unwrap();
    assert_eq!(pool.tenants().collect::<Vec<_>>(), ["a"]);
    pool.set_limits("a", blocks(64, 64)).unwrap();
    assert!(pool.admit("b", 1, 1).is_err());
    assert!(pool.is_idle());
}

#[test]
fn with_memory_gone_elsewhere_free_blocks_do_not_stop_a_preemption() {
    let mut pool = KvPool::new(8, [("a", blocks(2, 8)), ("b", blocks(2, 8))]).unwrap();
    let a = pool.admit("a", 16, 0).unwrap();
    let b1 = pool.admit("b", 32, 0).unwrap();
    let b2 = pool.admit("b", 32, 0).unwrap();
    pool.allocate(a).unwrap();
    pool.allocate(b1).unwrap();
    pool.allocate(b1).unwrap();
    pool.allocate(b2).unwrap();
    assert_eq!(pool.choose_victim(a).unwrap(), Victim::Retry);
    // `b` is over its guarantee of 2: its youngest gives way, as if the
    // pool were empty.
    assert_eq!(
        pool.choose_victim_ignoring_free(a).unwrap(),
        Victim::Preempt(b2)
    );
    assert_consistent(&pool);
}
