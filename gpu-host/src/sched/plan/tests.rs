//! The planner alone, with no model: an executor is simulated by counting
//! positions (a chunk that reaches the end of a history samples one
//! token), so the scheduling policy is checked in microseconds and exactly.

use std::time::Duration;

use bulkhead_partition::DEFAULT_KV_WAIT;

use super::*;
use crate::engine::BLOCK_TOKENS;

fn share(weight: u32, max_rows: Option<usize>) -> TenantShare {
    TenantShare {
        weight,
        own_blocks: None,
        kv_wait: DEFAULT_KV_WAIT,
        max_rows,
    }
}

fn planner(shares: &[(&str, TenantShare)], max_running: usize, max_rows: usize) -> Planner {
    let shares = shares.iter().map(|(t, s)| (t.to_string(), *s)).collect();
    let limits = BatchLimits {
        max_running,
        max_rows,
        kv_blocks: 4096,
    };
    Planner::new(limits, shares, PartitionKv::unlimited(), 1024).unwrap()
}

fn add(planner: &mut Planner, tenant: &str, prompt: usize, max_tokens: u64) -> u64 {
    planner
        .add(Planned {
            tenant: tenant.to_string(),
            priority: 0,
            prompt_tokens: prompt as u64,
            max_tokens,
            len: prompt,
        })
        .unwrap()
}

/// What a simulated executor saw over some steps.
#[derive(Debug, Default)]
struct Seen {
    /// Decode rows run, per tenant.
    decode: BTreeMap<String, usize>,
    /// Prompt positions prefilled, per tenant.
    prefill: BTreeMap<String, usize>,
    started: Vec<u64>,
    preempted: Vec<u64>,
    refused: Vec<(u64, String)>,
    /// Every plan's chunks, in order.
    plans: Vec<Vec<Chunk>>,
}

/// Runs `steps` plans as an executor would, the tenant of each key from
/// `tenants`; a sequence ends after `max_tokens` sampled tokens.
fn run(
    planner: &mut Planner,
    tenants: &BTreeMap<u64, (String, u64)>,
    steps: usize,
    now: Instant,
) -> Seen {
    let mut seen = Seen::default();
    let mut sampled: BTreeMap<u64, u64> = BTreeMap::new();
    for _ in 0..steps {
        let plan = planner.plan(now);
        seen.started.extend(&plan.started);
        seen.preempted.extend(&plan.preempted);
        seen.refused
            .extend(plan.refused.iter().map(|(k, e)| (*k, e.to_string())));
        seen.plans.push(plan.chunks.clone());
        let mut ran = Vec::new();
        for chunk in &plan.chunks {
            let (tenant, max_tokens) = &tenants[&chunk.key];
            let counter = if chunk.decode {
                &mut seen.decode
            } else {
                &mut seen.prefill
            };
            *counter.entry(tenant.clone()).or_default() += chunk.range.len();
            let len = planner.slots[&chunk.key].seq.len;
            let samples = chunk.range.end == len;
            let done = samples && {
                let n = sampled.entry(chunk.key).or_default();
                *n += 1;
                *n >= *max_tokens
            };
            if done {
                planner.remove(chunk.key);
            } else {
                planner.advance(chunk.key, chunk.range.len(), len + usize::from(samples));
                ran.push(chunk.key);
            }
        }
        planner.requeue(ran);
    }
    seen
}

/// Two tenants flooding with `seqs` sequences each, decoding until done.
fn flood(planner: &mut Planner, seqs: [(&str, usize); 2]) -> BTreeMap<u64, (String, u64)> {
    let mut tenants = BTreeMap::new();
    for (tenant, n) in seqs {
        for _ in 0..n {
            let key = add(planner, tenant, 8, 1_000);
            tenants.insert(key, (tenant.to_string(), 1_000));
        }
    }
    tenants
}

/// Steps until every sequence holds KV and decodes (measured from then).
fn warm_up(planner: &mut Planner, tenants: &BTreeMap<u64, (String, u64)>, now: Instant) {
    let mut started = 0;
    for _ in 0..100 {
        started += run(planner, tenants, 1, now).started.len();
        if started == tenants.len() && planner.slots.values().all(Slot::is_decoding) {
            return;
        }
    }
    panic!("only {started} of {} sequences started", tenants.len());
}

fn fraction(seen: &Seen, tenant: &str) -> f64 {
    let total: usize = seen.decode.values().sum();
    seen.decode.get(tenant).copied().unwrap_or(0) as f64 / total as f64
}

#[test]
fn weights_three_to_one_give_three_quarters_of_the_decode_rows() {
    // Equal numbers of sequences: a FIFO (or one row per sequence) gives
    // half each; weighted fairness gives 0.75 / 0.25.
    let mut p = planner(&[("a", share(3, None)), ("b", share(1, None))], 32, 8);
    let tenants = flood(&mut p, [("a", 16), ("b", 16)]);
    let now = Instant::now();
    warm_up(&mut p, &tenants, now);
    let seen = run(&mut p, &tenants, 400, now);
    assert_eq!(
        seen.decode.values().sum::<usize>(),
        400 * 8,
        "every row is used"
    );
    let a = fraction(&seen, "a");
    assert!((a - 0.75).abs() <= 0.05, "a got {a:.3} of the decode rows");
    assert!((fraction(&seen, "b") - 0.25).abs() <= 0.05);
}

#[test]
fn the_weighted_split_holds_whichever_tenant_has_more_sequences() {
    for seqs in [[("a", 4), ("b", 24)], [("a", 24), ("b", 4)]] {
        let mut p = planner(&[("a", share(3, None)), ("b", share(1, None))], 32, 4);
        let tenants = flood(&mut p, seqs);
        let now = Instant::now();
        warm_up(&mut p, &tenants, now);
        let seen = run(&mut p, &tenants, 400, now);
        let a = fraction(&seen, "a");
        assert!((a - 0.75).abs() <= 0.05, "{seqs:?}: a got {a:.3}");
    }
    // Equal weights, three times the sequences: still half each.
    let mut p = planner(&[("a", share(1, None)), ("b", share(1, None))], 32, 4);
    let tenants = flood(&mut p, [("a", 18), ("b", 6)]);
    let now = Instant::now();
    warm_up(&mut p, &tenants, now);
    let a = fraction(&run(&mut p, &tenants, 400, now), "a");
    assert!((a - 0.5).abs() <= 0.05, "a got {a:.3}");
}

#[test]
fn a_tenant_alone_uses_every_row_and_a_capped_one_its_cap() {
    let mut p = planner(&[("a", share(1, Some(1))), ("b", share(1, None))], 32, 4);
    let tenants = flood(&mut p, [("a", 6), ("b", 6)]);
    let now = Instant::now();
    run(&mut p, &tenants, 4, now);
    let seen = run(&mut p, &tenants, 100, now);
    assert_eq!((seen.decode["a"], seen.decode["b"]), (100, 300));
    // `a` alone: its cap holds only while others have sequences left out.
    let mut p = planner(&[("a", share(1, Some(1)))], 32, 4);
    let tenants = flood(&mut p, [("a", 6), ("b", 0)]);
    run(&mut p, &tenants, 4, now);
    assert_eq!(run(&mut p, &tenants, 100, now).decode["a"], 400);
}

#[test]
fn plans_are_deterministic() {
    let plans = || {
        let mut p = planner(&[("a", share(3, Some(3))), ("b", share(2, None))], 6, 4);
        let mut tenants = BTreeMap::new();
        for (i, tenant) in ["a", "b", "a", "c", "b", "a", "c", "b"].iter().enumerate() {
            let key = add(&mut p, tenant, 20 + 37 * i, 3 + i as u64);
            tenants.insert(key, (tenant.to_string(), 3 + i as u64));
        }
        run(&mut p, &tenants, 40, Instant::now()).plans
    };
    let first = plans();
    assert!(first.iter().flatten().any(|c| !c.decode));
    assert!(first.iter().flatten().any(|c| c.decode));
    assert_eq!(first, plans());
}

#[test]
fn a_long_prompt_takes_one_chunk_a_step_beside_the_decode_rows() {
    let mut p = planner(&[], 8, 4);
    let short = add(&mut p, "a", 4, 1000);
    let now = Instant::now();
    let plan = p.plan(now);
    assert_eq!(plan.started, vec![short]);
    p.advance(short, 4, 5);
    p.requeue([short]);
    let long = add(&mut p, "b", 3 * BATCH_PREFILL_CHUNK, 10);
    let mut tenants = BTreeMap::new();
    tenants.insert(short, ("a".to_string(), 1000));
    tenants.insert(long, ("b".to_string(), 10));
    for step in 0..3 {
        let seen = run(&mut p, &tenants, 1, now);
        assert_eq!(
            seen.decode.get("a"),
            Some(&1),
            "step {step}: the decode row runs"
        );
        assert_eq!(
            seen.prefill.get("b"),
            Some(&BATCH_PREFILL_CHUNK),
            "step {step}"
        );
    }
}

#[test]
fn a_request_that_can_never_fit_is_refused_and_a_waiting_one_after_its_kv_wait() {
    let own = TenantShare {
        weight: 1,
        own_blocks: Some(16),
        kv_wait: Duration::from_millis(500),
        max_rows: None,
    };
    let limits = BatchLimits {
        max_running: 8,
        max_rows: 4,
        kv_blocks: 64,
    };
    let shares = BTreeMap::from([("t".to_string(), own)]);
    let mut p = Planner::new(limits, shares, PartitionKv::unlimited(), 1024).unwrap();
    // 16 blocks = 16 * BLOCK_TOKENS tokens: more can never fit.
    let budget = 16 * BLOCK_TOKENS;
    let never = add(&mut p, "t", 8, budget as u64);
    let first = add(&mut p, "t", 8, (budget - 8) as u64);
    let second = add(&mut p, "t", 8, 8);
    let t0 = Instant::now();
    let plan = p.plan(t0);
    assert_eq!(plan.refused.len(), 1);
    assert_eq!(plan.refused[0].0, never);
    assert!(matches!(plan.refused[0].1, SequenceError::KvBudget { .. }));
    assert_eq!(plan.started, vec![first]);
    // `second` fits the budget but `first` holds it: it waits, on the
    // plan's clock, then is refused.
    p.requeue(plan.chunks.iter().map(|c| c.key));
    let plan = p.plan(t0 + Duration::from_millis(499));
    assert!(plan.refused.is_empty() && !plan.started.contains(&second));
    let plan = p.plan(t0 + Duration::from_millis(500));
    assert_eq!(plan.refused.len(), 1, "{plan:?}");
    assert!(matches!(
        plan.refused[0],
        (key, SequenceError::KvWait { waited_ms: 500, .. }) if key == second
    ));
    assert_eq!(p.stats().kv_refusals, 2);
}

#[test]
fn an_empty_pool_preempts_the_tenant_over_its_guarantee() {
    // 8 blocks, two equal tenants: 4 guaranteed each. `a` fills the pool
    // while alone (two sequences of 4 blocks); `b`'s sequence then takes
    // blocks back from `a`'s.
    let limits = BatchLimits {
        max_running: 8,
        max_rows: 8,
        kv_blocks: 8,
    };
    let mut p = Planner::new(limits, BTreeMap::new(), PartitionKv::unlimited(), 1024).unwrap();
    let now = Instant::now();
    let mut tenants = BTreeMap::new();
    for _ in 0..2 {
        let key = add(&mut p, "a", 4 * BLOCK_TOKENS - 8, 8);
        tenants.insert(key, ("a".to_string(), 8));
    }
    warm_up(&mut p, &tenants, now);
    assert_eq!(p.held_blocks("a"), 8);
    let b = add(&mut p, "b", BLOCK_TOKENS, 4);
    tenants.insert(b, ("b".to_string(), 4));
    let seen = run(&mut p, &tenants, 2, now);
    assert!(seen.started.contains(&b), "{seen:?}");
    assert!(!seen.preempted.is_empty());
    assert!(seen.preempted.iter().all(|k| tenants[k].0 == "a"));
    assert_eq!(p.stats().preemptions, seen.preempted.len() as u64);
    assert!(p.held_blocks("b") >= 1);
    assert!(p.held_blocks("a") + p.held_blocks("b") <= 8);
}
