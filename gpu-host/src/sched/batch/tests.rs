//! The batcher on the fixture models: sequences joining and leaving give
//! exactly what `generate` gives alone, cancellation frees blocks within a
//! step, and a tenant far over its share cannot hurt another's sequences.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::rc::Rc;

use bulkhead_partition::{DEFAULT_KV_WAIT, TenantBlocks};

use super::super::plan::BATCH_PREFILL_CHUNK;
use super::*;
use crate::backend::{CpuBackend, DeviceErrorKind};
use crate::engine::{FinishReason, SamplingParams, generate};
use crate::engine::{GenerateRequest, PREFILL_CHUNK, Piece};

fn fixture(name: &str) -> (Model, Tokenizer) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(name);
    let model = Model::open(path).expect("fixture model opens");
    let tokenizer = Tokenizer::from_metadata(model.gguf().metadata()).unwrap();
    (model, tokenizer)
}

/// What a sink saw.
#[derive(Debug, Default)]
struct Log {
    started: bool,
    text: String,
    tokens: Vec<u32>,
    result: Option<Result<FinishReason, String>>,
    /// Set by the test: the client went away.
    closed: bool,
}

struct TestSink(Rc<RefCell<Log>>);

impl SequenceSink for TestSink {
    fn started(&mut self) {
        self.0.borrow_mut().started = true;
    }
    fn piece(&mut self, piece: Piece<'_>) -> ControlFlow<()> {
        let mut log = self.0.borrow_mut();
        log.text.push_str(piece.text);
        log.tokens.extend_from_slice(piece.tokens);
        if log.closed {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
    fn check(&mut self) -> ControlFlow<()> {
        if self.0.borrow().closed {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }
    fn finished(&mut self, result: Result<Decoded, SequenceError>) {
        let mut log = self.0.borrow_mut();
        log.result = Some(match result {
            Ok(d) => {
                assert_eq!(
                    (d.text.as_str(), &d.tokens),
                    (log.text.as_str(), &log.tokens)
                );
                Ok(d.finish_reason)
            }
            Err(e) => Err(e.to_string()),
        });
    }
}

fn request(tokenizer: &Tokenizer, prompt: &str, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_tokens: tokenizer.encode(prompt, true),
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
    }
}

fn add(
    batcher: &mut Batcher,
    tok: &Tokenizer,
    tenant: &str,
    req: GenerateRequest,
) -> Rc<RefCell<Log>> {
    let log = Rc::new(RefCell::new(Log::default()));
    batcher.add(
        tok,
        NewSequence {
            tenant: tenant.to_string(),
            priority: 0,
            request: req,
            sink: Box::new(TestSink(log.clone())),
        },
    );
    log
}

/// Steps until idle; panics if that takes more than `max_steps` (a stall).
fn run(
    batcher: &mut Batcher,
    model: &Model,
    tok: &Tokenizer,
    backend: &CpuBackend,
    max_steps: usize,
) {
    for _ in 0..max_steps {
        if batcher.is_idle() {
            return;
        }
        batcher.step(model, tok, backend).unwrap();
    }
    panic!("not idle after {max_steps} steps: {:?}", batcher.stats());
}

fn alone(
    model: &Model,
    tok: &Tokenizer,
    backend: &CpuBackend,
    req: &GenerateRequest,
) -> (String, Vec<u32>, FinishReason) {
    let g = generate(model, tok, backend, req, &mut |_| {}).unwrap();
    (g.text, g.tokens, g.finish_reason)
}

fn limits(max_running: usize, kv_blocks: u32) -> BatchLimits {
    BatchLimits {
        max_running,
        max_rows: max_running,
        kv_blocks,
    }
}

#[test]
fn sequences_join_and_leave_and_match_generate_alone() {
    let backend = CpuBackend::new(2).unwrap();
    for name in ["llama-q8_0.gguf", "qwen2-q4_0.gguf"] {
        let (model, tok) = fixture(name);
        let mut reqs = [
            request(&tok, "Once upon a time", 24),
            request(&tok, "The sky is", 9),
            request(&tok, "One two three four five six seven eight nine ten", 30),
            request(&tok, "Hello", 17),
        ];
        // Seeded sampling and a stop string behave as alone too.
        reqs[1].sampling = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            seed: 7,
            ..SamplingParams::default()
        };
        let want0 = alone(&model, &tok, &backend, &reqs[0]);
        if let Some(word) = want0.0.split_whitespace().nth(2) {
            reqs[3] = GenerateRequest {
                stop: vec![word.to_string()],
                ..reqs[0].clone()
            };
        }
        let wants: Vec<_> = reqs
            .iter()
            .map(|r| alone(&model, &tok, &backend, r))
            .collect();

        let mut batcher = Batcher::new(&model, limits(3, 64)).unwrap();
        let mut logs = vec![
            add(&mut batcher, &tok, "t", reqs[0].clone()),
            add(&mut batcher, &tok, "t", reqs[1].clone()),
        ];
        for _ in 0..3 {
            batcher.step(&model, &tok, &backend).unwrap();
        }
        // Two more join while the first two decode; one must wait for a slot.
        logs.push(add(&mut batcher, &tok, "u", reqs[2].clone()));
        logs.push(add(&mut batcher, &tok, "u", reqs[3].clone()));
        batcher.step(&model, &tok, &backend).unwrap();
        let stats = batcher.stats();
        assert_eq!((stats.running, stats.waiting), (3, 1), "{stats:?}");
        run(&mut batcher, &model, &tok, &backend, 500);
        for (i, (log, want)) in logs.iter().zip(&wants).enumerate() {
            let log = log.borrow();
            assert_eq!(log.result, Some(Ok(want.2)), "{name} #{i}");
            assert_eq!((&log.text, &log.tokens), (&want.0, &want.1), "{name} #{i}");
        }
        assert_eq!(batcher.stats().kv_blocks_used, 0);
    }
}

/// The batch cuts prompts in 64-token chunks where `generate` cuts 256:
/// still bit-identical output, on every fixture type (Q8_0; Q4_0 with a
/// Q6_K/other mix; F16 whose multi-token kernel sums in another order).
#[test]
fn a_long_prompt_is_prefilled_in_chunks_while_others_decode() {
    let backend = CpuBackend::new(2).unwrap();
    for name in ["llama-q8_0.gguf", "qwen2-q4_0.gguf", "llama-f16.gguf"] {
        let (model, tok) = fixture(name);
        let short = request(&tok, "Hello", 40);
        // The fixture's context is 512: one full 256 chunk and a partial one
        // for `generate`; seven full 64 chunks and a partial one here.
        let long_prompt: Vec<u32> = (0..PREFILL_CHUNK as u32 + 203)
            .map(|i| 3 + i % 200)
            .collect();
        let long = GenerateRequest {
            prompt_tokens: long_prompt,
            max_tokens: 4,
            ..short.clone()
        };
        let wants = [
            alone(&model, &tok, &backend, &short),
            alone(&model, &tok, &backend, &long),
        ];
        let mut batcher = Batcher::new(&model, limits(4, 128)).unwrap();
        let a = add(&mut batcher, &tok, "t", short);
        batcher.step(&model, &tok, &backend).unwrap();
        let b = add(&mut batcher, &tok, "t", long);
        // Every step while the long prompt prefills, the short one decodes a token.
        for step in 0..7 {
            let before = a.borrow().tokens.len();
            let ran = batcher.step(&model, &tok, &backend).unwrap();
            assert!(
                ran <= BATCH_PREFILL_CHUNK + 1,
                "step {step} ran {ran} tokens"
            );
            assert_eq!(a.borrow().tokens.len(), before + 1, "{name} step {step}");
        }
        run(&mut batcher, &model, &tok, &backend, 500);
        for (log, want) in [a, b].iter().zip(&wants) {
            let log = log.borrow();
            assert_eq!((&log.text, &log.tokens), (&want.0, &want.1), "{name}");
        }
    }
}

#[test]
fn a_cancelled_sequence_frees_its_blocks_within_one_step() {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    let mut batcher = Batcher::new(&model, limits(4, 64)).unwrap();
    let gone = add(
        &mut batcher,
        &tok,
        "a",
        request(&tok, "Once upon a time", 200),
    );
    let stays = add(&mut batcher, &tok, "b", request(&tok, "Hello", 20));
    for _ in 0..20 {
        batcher.step(&model, &tok, &backend).unwrap();
    }
    assert!(batcher.held_blocks("a") > 0);
    gone.borrow_mut().closed = true;
    batcher.step(&model, &tok, &backend).unwrap();
    assert_eq!(batcher.held_blocks("a"), 0, "freed within one step");
    assert_eq!(
        gone.borrow().result,
        None,
        "a cancelled stream gets no Finished"
    );
    run(&mut batcher, &model, &tok, &backend, 100);
    assert!(stays.borrow().result.as_ref().is_some_and(Result::is_ok));
    assert_eq!(
        batcher.stats(),
        BatchStats {
            kv_blocks_total: 64,
            ..BatchStats::default()
        }
    );
}

/// Tenant `flood` sends one request that can never fit its share and many
/// that together need far more than the pool; tenant `calm`'s sequence runs
/// beside them. The oversized one is refused with the numbers, the calm
/// tenant's output is exactly what it is alone, everyone else finishes (no
/// deadlock), and the pool ends empty.
#[test]
fn a_tenant_far_over_its_share_cannot_hurt_another() {
    let backend = CpuBackend::new(2).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    // 24 blocks = 384 tokens; two tenants are guaranteed 12 blocks (192 tokens) each.
    let mut batcher = Batcher::new(&model, limits(16, 24)).unwrap();
    let calm_req = request(&tok, "The sky is", 150);
    let want = alone(&model, &tok, &backend, &calm_req);
    let calm = add(&mut batcher, &tok, "calm", calm_req);
    let huge = add(&mut batcher, &tok, "flood", request(&tok, "Hi", 300));
    let floods: Vec<_> = (0..10)
        .map(|i| {
            add(
                &mut batcher,
                &tok,
                "flood",
                request(&tok, &format!("Story {i}:"), 100),
            )
        })
        .collect();
    // Admission happens when a step picks the request up.
    batcher.step(&model, &tok, &backend).unwrap();
    let huge_result = huge.borrow().result.clone();
    let message = match huge_result {
        Some(Err(m)) => m,
        other => panic!("the oversized request was not refused: {other:?}"),
    };
    assert!(message.starts_with("kv_budget_exceeded:"), "{message}");
    assert!(
        message.contains("needs 30") && message.contains("has 192"),
        "{message}"
    );
    let mut peak = 0;
    for _ in 0..5_000 {
        if batcher.is_idle() {
            break;
        }
        batcher.step(&model, &tok, &backend).unwrap();
        peak = peak.max(batcher.held_blocks("flood"));
    }
    assert!(batcher.is_idle(), "stalled: {:?}", batcher.stats());
    assert!(
        peak > 12,
        "the flood borrowed idle blocks beyond its share ({peak})"
    );
    assert!(
        batcher.stats().preemptions > 0,
        "the calm tenant took its share back"
    );
    let calm = calm.borrow();
    assert_eq!(calm.result, Some(Ok(want.2)));
    assert_eq!((&calm.text, &calm.tokens), (&want.0, &want.1));
    for f in &floods {
        assert!(f.borrow().result.as_ref().is_some_and(Result::is_ok));
    }
    assert_eq!(batcher.stats().kv_blocks_used, 0);
}

#[test]
fn priority_orders_admission_within_a_tenant() {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    let mut batcher = Batcher::new(&model, limits(1, 64)).unwrap();
    let first = add(&mut batcher, &tok, "t", request(&tok, "Hello", 3));
    batcher.step(&model, &tok, &backend).unwrap();
    assert!(first.borrow().started);
    // The batch is full (one slot): these two wait, the urgent one arriving last.
    let low = add(&mut batcher, &tok, "t", request(&tok, "Hello", 3));
    let log = Rc::new(RefCell::new(Log::default()));
    batcher.add(
        &tok,
        NewSequence {
            tenant: "t".into(),
            priority: 5,
            request: request(&tok, "Hello", 3),
            sink: Box::new(TestSink(log.clone())),
        },
    );
    while first.borrow().result.is_none() {
        batcher.step(&model, &tok, &backend).unwrap();
    }
    batcher.step(&model, &tok, &backend).unwrap();
    assert!(log.borrow().started, "the urgent one joins next");
    assert!(!low.borrow().started);
    run(&mut batcher, &model, &tok, &backend, 100);
}

#[test]
fn planned_shares_give_own_blocks_and_weighted_parts_and_count_refusals() {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    // 64 blocks: `fixed` owns 16; `heavy` (weight 3) and `light` (weight 1)
    // split the other 48 while both are active: 36 and 12 guaranteed.
    let shares = BTreeMap::from([
        (
            "fixed".to_string(),
            TenantShare {
                weight: 1,
                own_blocks: Some(16),
                kv_wait: DEFAULT_KV_WAIT,
                max_rows: None,
            },
        ),
        (
            "heavy".to_string(),
            TenantShare {
                weight: 3,
                own_blocks: None,
                kv_wait: DEFAULT_KV_WAIT,
                max_rows: None,
            },
        ),
        (
            "light".to_string(),
            TenantShare {
                weight: 1,
                own_blocks: None,
                kv_wait: DEFAULT_KV_WAIT,
                max_rows: None,
            },
        ),
    ]);
    let mut batcher = Batcher::with_shares(&model, limits(8, 64), shares).unwrap();
    // 16 blocks = 256 tokens is all `fixed` owns: 300 can never fit.
    let too_big = add(&mut batcher, &tok, "fixed", request(&tok, "Hi", 300));
    let heavy = add(&mut batcher, &tok, "heavy", request(&tok, "Once upon", 8));
    let light = add(&mut batcher, &tok, "light", request(&tok, "The sky", 8));
    batcher.step(&model, &tok, &backend).unwrap();
    let limits_of = |t: &str| batcher.planner.pool().limits(t).unwrap();
    assert_eq!(
        limits_of("heavy"),
        TenantBlocks {
            guaranteed: 36,
            budget: 48
        }
    );
    assert_eq!(
        limits_of("light"),
        TenantBlocks {
            guaranteed: 12,
            budget: 48
        }
    );
    // 12 blocks = 192 tokens: past `light`'s guaranteed part, refused.
    let light_big = add(&mut batcher, &tok, "light", request(&tok, "Hi", 200));
    run(&mut batcher, &model, &tok, &backend, 200);
    for log in [&heavy, &light] {
        assert_eq!(log.borrow().result, Some(Ok(FinishReason::Length)));
    }
    for log in [&too_big, &light_big] {
        let result = log.borrow().result.clone().unwrap().unwrap_err();
        assert!(result.starts_with("kv_budget_exceeded"), "{result}");
    }
    let counts = batcher.tenant_counts();
    assert_eq!(counts["fixed"].kv_refusals, 1);
    assert_eq!(counts["light"].kv_refusals, 1);
    assert_eq!(counts["heavy"].kv_refusals, 0);
    assert_eq!(batcher.stats().kv_refusals, 2);
    assert!(batcher.planner.pool().is_idle());
    // Blocks owned by tenants cannot exceed the pool.
    let over = BTreeMap::from([(
        "fixed".to_string(),
        TenantShare {
            weight: 1,
            own_blocks: Some(65),
            kv_wait: DEFAULT_KV_WAIT,
            max_rows: None,
        },
    )]);
    assert!(Batcher::with_shares(&model, limits(8, 64), over).is_err());
}

#[test]
fn a_request_waiting_for_its_tenants_budget_is_refused_after_its_kv_wait() {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    // `t` owns 8 blocks (128 tokens); each request reserves 6 (prompt + 80),
    // so the second waits for the first.
    for (kv_wait, refused) in [
        (std::time::Duration::ZERO, true),
        (std::time::Duration::from_secs(3600), false),
    ] {
        let shares = BTreeMap::from([(
            "t".to_string(),
            TenantShare {
                weight: 1,
                own_blocks: Some(8),
                kv_wait,
                max_rows: None,
            },
        )]);
        let mut batcher = Batcher::with_shares(&model, limits(4, 8), shares).unwrap();
        let first = add(&mut batcher, &tok, "t", request(&tok, "Once upon", 80));
        let second = add(&mut batcher, &tok, "t", request(&tok, "The sky", 80));
        run(&mut batcher, &model, &tok, &backend, 400);
        assert_eq!(first.borrow().result, Some(Ok(FinishReason::Length)));
        let result = second.borrow().result.clone().unwrap();
        if refused {
            let message = result.unwrap_err();
            assert!(
                message.starts_with("kv_budget_exceeded: the request needs")
                    && message.contains("tenant `t` had 32 left of its budget")
                    && message.contains("kv_wait_ms"),
                "{message}"
            );
            assert!(!second.borrow().started);
        } else {
            assert_eq!(result, Ok(FinishReason::Length));
        }
        assert_eq!(batcher.tenant_counts()["t"].kv_refusals, u64::from(refused));
        assert!(batcher.planner.pool().is_idle());
    }
}

#[test]
fn fail_all_tells_every_sequence_why_and_leaves_the_batch_empty() {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    let mut batcher = Batcher::new(&model, limits(1, 64)).unwrap();
    let running = add(
        &mut batcher,
        &tok,
        "a",
        request(&tok, "Once upon a time", 50),
    );
    let waiting = add(&mut batcher, &tok, "b", request(&tok, "Hello", 20));
    batcher.step(&model, &tok, &backend).unwrap();
    assert!(running.borrow().started && !waiting.borrow().started);
    batcher.fail_all("alloc 16 bytes: partition \"a\" cannot allocate 16B");
    for log in [&running, &waiting] {
        assert_eq!(
            log.borrow().result,
            Some(Err(
                "generation failed: alloc 16 bytes: partition \"a\" cannot allocate 16B".into()
            ))
        );
    }
    assert!(batcher.is_idle());
}

/// A step the device fails ends the sequences it ran with the device's
/// error and frees their blocks; sequences that were only waiting, and the
/// batch itself, go on, and a sequence after it matches `generate` alone.
#[test]
fn a_device_error_ends_the_steps_sequences_and_the_batch_goes_on() {
    use crate::backend::DeviceError;
    use crate::backend::faulty::Faulty;

    let cpu = CpuBackend::new(1).unwrap();
    let faulty = Faulty::new(1);
    let (model, tok) = fixture("llama-q8_0.gguf");
    let mut batcher = Batcher::new(&model, limits(2, 64)).unwrap();
    let a = add(
        &mut batcher,
        &tok,
        "a",
        request(&tok, "Once upon a time", 20),
    );
    let b = add(&mut batcher, &tok, "b", request(&tok, "The sky is", 20));
    let waiting = add(&mut batcher, &tok, "c", request(&tok, "Hello", 6));
    batcher.step(&model, &tok, &faulty).unwrap();
    batcher.step(&model, &tok, &faulty).unwrap();
    assert!(a.borrow().started && b.borrow().started && !waiting.borrow().started);
    faulty.fail_next(DeviceError::out_of_memory(
        "alloc 4096 bytes",
        "partition \"p\" cannot allocate 4KiB",
    ));
    let failed = batcher.step(&model, &tok, &faulty).unwrap_err();
    assert!(
        matches!(&failed, ForwardError::Device(e) if e.kind == DeviceErrorKind::OutOfMemory),
        "{failed:?}"
    );
    for log in [&a, &b] {
        assert_eq!(
            log.borrow().result,
            Some(Err(
                "device error: alloc 4096 bytes: partition \"p\" cannot allocate 4KiB".into()
            ))
        );
    }
    assert_eq!(waiting.borrow().result, None, "not in the failed step");
    let after = request(&tok, "One two three", 8);
    let want = alone(&model, &tok, &cpu, &after);
    let next = add(&mut batcher, &tok, "d", after);
    for _ in 0..100 {
        if batcher.is_idle() {
            break;
        }
        batcher.step(&model, &tok, &faulty).unwrap();
    }
    assert!(batcher.is_idle());
    assert!(matches!(waiting.borrow().result, Some(Ok(_))));
    let next = next.borrow();
    assert_eq!(next.result, Some(Ok(want.2)));
    assert_eq!((&next.text, &next.tokens), (&want.0, &want.1));
    assert_eq!(
        batcher.stats().kv_blocks_used,
        0,
        "the failed ones' blocks are free"
    );
}

/// Decode tokens `a` and `b` got over `steps` steps of a batch with
/// `max_rows` rows, once all their sequences (`seqs`) hold KV and decode.
fn decode_split(
    shares: [(u32, Option<usize>); 2],
    seqs: (usize, usize),
    max_rows: usize,
    steps: usize,
) -> (usize, usize) {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    let share = |(weight, max_rows): (u32, Option<usize>)| TenantShare {
        weight,
        own_blocks: None,
        kv_wait: DEFAULT_KV_WAIT,
        max_rows,
    };
    let shares = BTreeMap::from([
        ("a".to_string(), share(shares[0])),
        ("b".to_string(), share(shares[1])),
    ]);
    let limits = BatchLimits {
        max_running: seqs.0 + seqs.1,
        max_rows,
        kv_blocks: 1024,
    };
    let mut batcher = Batcher::with_shares(&model, limits, shares).unwrap();
    // Long enough that none ends while measured (asserted below).
    let logs: Vec<(&str, Rc<RefCell<Log>>)> = std::iter::repeat_n("a", seqs.0)
        .chain(std::iter::repeat_n("b", seqs.1))
        .map(|t| (t, add(&mut batcher, &tok, t, request(&tok, "Hi", 400))))
        .collect();
    let tokens = |tenant: &str| -> usize {
        logs.iter()
            .filter(|(t, _)| *t == tenant)
            .map(|(_, log)| log.borrow().tokens.len())
            .sum()
    };
    // Prefill: every sequence gets its first token.
    for _ in 0..50 {
        if logs.iter().all(|(_, log)| !log.borrow().tokens.is_empty()) {
            break;
        }
        batcher.step(&model, &tok, &backend).unwrap();
    }
    assert_eq!(batcher.stats().running, seqs.0 + seqs.1);
    let before = (tokens("a"), tokens("b"));
    for _ in 0..steps {
        let ran = batcher.step(&model, &tok, &backend).unwrap();
        assert_eq!(ran, max_rows, "every row is used");
    }
    for (_, log) in &logs {
        assert!(log.borrow().result.is_none(), "a sequence ended early");
    }
    (tokens("a") - before.0, tokens("b") - before.1)
}

#[test]
fn decode_rows_are_split_by_weight_not_by_sequence_count() {
    // Equal weights, `a` runs three times as many sequences: half each.
    let (a, b) = decode_split([(1, None), (1, None)], (9, 3), 4, 60);
    assert_eq!(a + b, 240);
    let half = 120.0;
    assert!((a as f64 - half).abs() <= 0.1 * half, "a {a}, b {b}");
    // 3:1 weights: 3:1 tokens, whichever has more sequences.
    let (a, b) = decode_split([(3, None), (1, None)], (4, 8), 4, 60);
    assert!((2.7..=3.3).contains(&(a as f64 / b as f64)), "a {a}, b {b}");
    // (With a row for every running sequence, `a` would get three quarters.)
}

#[test]
fn a_tenant_capped_at_a_quarter_of_the_pool_gets_a_quarter_of_the_rows() {
    // `a`'s cus are a quarter of the pool: 1 row of 4 while `b` waits.
    let (a, b) = decode_split([(1, Some(1)), (1, None)], (6, 6), 4, 40);
    assert_eq!((a, b), (40, 120));
    // `b` has fewer sequences than rows: `a` takes the rows left idle.
    let (a, b) = decode_split([(1, Some(1)), (1, None)], (6, 1), 4, 40);
    assert_eq!((a, b), (120, 40));
}

#[test]
fn the_models_of_a_partition_together_hold_no_more_than_its_memory() {
    let backend = CpuBackend::new(1).unwrap();
    let (llama, llama_tok) = fixture("llama-q8_0.gguf");
    let (qwen, qwen_tok) = fixture("qwen2-q4_0.gguf");
    let block = |m: &Model| m.kv_geometry().unwrap().bytes_per_block();
    let (llama_block, qwen_block) = (block(&llama), block(&qwen));
    // Room for 16 blocks of the larger model; each pool alone could take
    // all of it (so 32 blocks between them without the shared budget).
    let memory = 16 * llama_block.max(qwen_block);
    let kv = PartitionKv::new(memory);
    let pool = |b: u64| limits(4, u32::try_from(memory / b).unwrap());
    let mut x =
        Batcher::in_partition(&llama, pool(llama_block), BTreeMap::new(), kv.clone()).unwrap();
    let mut y =
        Batcher::in_partition(&qwen, pool(qwen_block), BTreeMap::new(), kv.clone()).unwrap();
    // Each sequence grows to ~7 blocks: three per model need ~21 of 16.
    let mut logs = Vec::new();
    for i in 0..3 {
        let tenant = if i % 2 == 0 { "t" } else { "u" };
        logs.push(add(
            &mut x,
            &llama_tok,
            tenant,
            request(&llama_tok, "Hi", 100),
        ));
        logs.push(add(
            &mut y,
            &qwen_tok,
            tenant,
            request(&qwen_tok, "Hi", 100),
        ));
    }
    let mut peak = 0;
    for _ in 0..3_000 {
        if x.is_idle() && y.is_idle() {
            break;
        }
        x.step(&llama, &llama_tok, &backend).unwrap();
        y.step(&qwen, &qwen_tok, &backend).unwrap();
        let held = u64::from(x.stats().kv_blocks_used) * llama_block
            + u64::from(y.stats().kv_blocks_used) * qwen_block;
        assert!(held <= memory, "{held} bytes held of {memory}");
        assert_eq!(held, kv.used_bytes());
        peak = peak.max(held);
    }
    assert!(
        x.is_idle() && y.is_idle(),
        "both models finish: no deadlock"
    );
    // Preempted and recomputed, each still writes what it writes alone.
    let want_x = alone(
        &llama,
        &llama_tok,
        &backend,
        &request(&llama_tok, "Hi", 100),
    );
    let want_y = alone(&qwen, &qwen_tok, &backend, &request(&qwen_tok, "Hi", 100));
    for (i, log) in logs.iter().enumerate() {
        let want = if i % 2 == 0 { &want_x } else { &want_y };
        let log = log.borrow();
        assert_eq!(log.result, Some(Ok(FinishReason::Length)));
        assert_eq!(log.tokens, want.1, "sequence {i}");
    }
    assert!(peak > memory / 2, "the models competed for memory ({peak})");
    assert!(x.stats().preemptions + y.stats().preemptions > 0);
    assert_eq!(kv.used_bytes(), 0);
}

/// Prompt tokens each tenant prefilled over `steps` steps of a batch with
/// four rows, each tenant with six long prompts waiting.
fn prefill_split(caps: [Option<usize>; 2], steps: usize) -> (usize, usize) {
    let backend = CpuBackend::new(1).unwrap();
    let (model, tok) = fixture("llama-q8_0.gguf");
    let share = |max_rows| TenantShare {
        weight: 1,
        own_blocks: None,
        kv_wait: DEFAULT_KV_WAIT,
        max_rows,
    };
    let mut shares = BTreeMap::from([("a".to_string(), share(caps[0]))]);
    if caps[1] != Some(0) {
        shares.insert("b".to_string(), share(caps[1]));
    }
    let limits = BatchLimits {
        max_running: 12,
        max_rows: 4,
        kv_blocks: 1024,
    };
    let mut batcher = Batcher::with_shares(&model, limits, shares).unwrap();
    let long = GenerateRequest {
        prompt_tokens: (0..448).map(|i| 3 + i % 200).collect(),
        ..request(&tok, "Hi", 1)
    };
    for tenant in ["a", "b"] {
        if tenant == "b" && caps[1] == Some(0) {
            continue; // `a` alone
        }
        for _ in 0..6 {
            add(&mut batcher, &tok, tenant, long.clone());
        }
    }
    for _ in 0..steps {
        batcher.step(&model, &tok, &backend).unwrap();
    }
    // A finished sequence (one token asked for) prefilled its whole prompt.
    let prefilled = |tenant: &str, added: usize| -> usize {
        let live = batcher.planner.cached_of(tenant);
        live.iter().sum::<usize>() + (added - live.len()) * long.prompt_tokens.len()
    };
    let b_added = if caps[1] == Some(0) { 0 } else { 6 };
    (prefilled("a", 6), prefilled("b", b_added))
}

#[test]
fn a_capped_tenants_prompts_get_its_part_of_the_prefill_tokens() {
    // `a`'s cus are a quarter of the pool (1 row of 4): 16 prompt tokens a
    // step on average while `b` has prompts waiting, `b` the other 48.
    let steps = 24;
    let (a, b) = prefill_split([Some(1), None], steps);
    assert_eq!(a + b, steps * BATCH_PREFILL_CHUNK, "every step is full");
    let quarter = (steps * BATCH_PREFILL_CHUNK / 4) as f64;
    assert!(
        (a as f64 - quarter).abs() <= BATCH_PREFILL_CHUNK as f64,
        "a {a}, b {b}"
    );
    // Uncapped, equal weights: half each.
    let (a, b) = prefill_split([None, None], steps);
    assert!(a.abs_diff(b) <= BATCH_PREFILL_CHUNK, "a {a}, b {b}");
    // Alone, the cap does not hold `a` back: a full chunk every step.
    let (a, _) = prefill_split([Some(1), Some(0)], steps);
    assert_eq!(a, steps * BATCH_PREFILL_CHUNK);
}
