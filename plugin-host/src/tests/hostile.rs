//! Guests that misbehave: each failure is that call's alone, reported as
//! the limit it hit, and the gateway goes on.

use std::time::Instant;

use super::*;

fn hostile(limits: PluginLimits) -> PluginCall {
    compiled("hostile")
        .instantiate(context("hostile", limits))
        .unwrap()
}

fn fail(command: &str, limits: PluginLimits) -> PluginError {
    match hostile(limits).on_request(text_request(command)) {
        Err(e) => e,
        Ok(out) => panic!("{command}: expected a plugin error, got {out:?}"),
    }
}

#[test]
fn an_infinite_loop_stops_at_the_deadline() {
    require_guests!();
    let deadline = Duration::from_millis(50);
    let limits = PluginLimits {
        deadline,
        ..PluginLimits::default()
    };
    // Its own engine, so that no other test's call shares the ticks.
    let engine = test_engine();
    let plugin = engine
        .validate_and_compile(&guests::test_guest("hostile"))
        .unwrap();
    let mut call = plugin
        .instantiate(context("hostile", limits.clone()))
        .unwrap();
    let (ticks_before, started) = (engine.epoch_ticks(), Instant::now());
    let e = call.on_request(text_request("loop")).unwrap_err();
    let (ticks, took) = (engine.epoch_ticks() - ticks_before, started.elapsed());
    assert!(
        matches!(&e, PluginError::Timeout { plugin, hook: Hook::OnRequest, deadline: d }
            if &**plugin == "hostile" && *d == deadline),
        "{e:?}"
    );
    assert_eq!(e.code(), "plugin_timeout");
    assert!(took >= deadline, "stopped after {took:?}");
    // The deadline is 50 ticks of 1 ms from the hook's start: it stops at
    // the 50th (the ticker's clock, so a loaded machine delays the ticks,
    // not the count), give or take the few between our reads and the
    // hook's. A deadline not enforced, or counted twice, lands far off.
    let want = (deadline.as_nanos() / EPOCH_TICK.as_nanos()) as u64;
    assert!(
        (want..=want + 20).contains(&ticks),
        "stopped after {ticks} ticks, {want} due"
    );
    assert!(e.to_string().contains("50ms"), "{e}");

    // Streaming hooks get a deadline of their own.
    let mut call = hostile(limits);
    assert_eq!(call.on_chunk("fine").unwrap(), Ok("fine".to_string()));
    let e = call.on_chunk("loop").unwrap_err();
    assert!(
        matches!(
            e,
            PluginError::Timeout {
                hook: Hook::OnChunk,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn a_failed_instance_refuses_later_hooks() {
    require_guests!();
    let mut call = hostile(PluginLimits {
        deadline: Duration::from_millis(20),
        ..PluginLimits::default()
    });
    assert!(call.on_request(text_request("loop")).is_err());
    let e = call.on_stream_end().unwrap_err();
    assert!(
        matches!(
            e,
            PluginError::AlreadyFailed {
                hook: Hook::OnStreamEnd,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.code(), "plugin_already_failed");
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    require_guests!();
    let limits = PluginLimits {
        max_memory_bytes: 16 << 20,
        ..relaxed_limits()
    };
    let e = fail("grow", limits);
    assert!(
        matches!(e, PluginError::MemoryLimit { hook: Hook::OnRequest, limit_bytes, .. }
            if limit_bytes == 16 << 20),
        "{e:?}"
    );
    assert_eq!(e.code(), "plugin_memory");
}

#[test]
fn memory_below_what_the_guest_starts_with_fails_instantiation() {
    require_guests!();
    let limits = PluginLimits {
        max_memory_bytes: 64 << 10,
        ..relaxed_limits()
    };
    let e = compiled("echo")
        .instantiate(context("echo", limits))
        .unwrap_err();
    assert!(
        matches!(
            e,
            PluginError::MemoryLimit {
                hook: Hook::Instantiate,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn deep_recursion_traps_with_a_stack_overflow() {
    require_guests!();
    let e = fail("recurse", relaxed_limits());
    assert!(
        matches!(&e, PluginError::Trap { hook: Hook::OnRequest, detail, .. }
            if detail == "stack overflow"),
        "{e:?}"
    );
    assert_eq!(e.code(), "plugin_trap");
}

#[test]
fn a_panic_traps_and_its_message_goes_to_the_log() {
    require_guests!();
    let mut call = hostile(relaxed_limits());
    let e = call.on_request(text_request("panic")).unwrap_err();
    assert!(matches!(e, PluginError::Trap { .. }), "{e:?}");
    assert!(
        call.log_stats().written_bytes > 0,
        "the panic message was written to stderr"
    );
}

#[test]
fn oversized_results_are_refused() {
    require_guests!();
    let limits = PluginLimits {
        max_output_bytes: 1 << 20,
        ..relaxed_limits()
    };
    for command in ["huge", "huge-rejection", "huge-metadata"] {
        let e = fail(command, limits.clone());
        assert!(
            matches!(e, PluginError::OutputTooLarge { hook: Hook::OnRequest, size, limit_bytes, .. }
                if size > limit_bytes && limit_bytes == 1 << 20),
            "{command}: {e:?}"
        );
        assert_eq!(e.code(), "plugin_output_too_large");
    }
}

#[test]
fn a_full_pool_fails_fast_and_frees_with_the_call() {
    require_guests!();
    let engine = PluginEngine::new(PluginEngineConfig {
        max_instances: 1,
        ..PluginEngineConfig::default()
    })
    .unwrap();
    let echo = engine
        .validate_and_compile(&guests::test_guest("echo"))
        .unwrap();
    let held = echo.instantiate(context("echo", relaxed_limits())).unwrap();
    let e = echo
        .instantiate(context("echo", relaxed_limits()))
        .unwrap_err();
    assert!(
        matches!(&e, PluginError::Busy { plugin } if &**plugin == "echo"),
        "{e:?}"
    );
    assert!(e.retryable());
    drop(held);
    let mut call = echo.instantiate(context("echo", relaxed_limits())).unwrap();
    assert!(call.on_stream_end().is_ok());
}

#[test]
fn a_tenant_holding_instances_leaves_another_tenant_its_part_of_the_pool() {
    require_guests!();
    let engine = PluginEngine::new(PluginEngineConfig {
        max_instances: 4,
        ..PluginEngineConfig::default()
    })
    .unwrap();
    engine.share_instances_among(2);
    let echo = engine
        .validate_and_compile(&guests::test_guest("echo"))
        .unwrap();
    let of = |tenant: &str| CallContext {
        tenant: Arc::from(tenant),
        ..context("echo", relaxed_limits())
    };
    // acme's streams hold its two...
    let held: Vec<_> = (0..2)
        .map(|_| echo.instantiate(of("acme")).unwrap())
        .collect();
    let e = echo.instantiate(of("acme")).unwrap_err();
    assert!(matches!(e, PluginError::Busy { .. }), "{e:?}");
    // ...and beta's two are still there.
    let mut beta: Vec<_> = (0..2)
        .map(|_| echo.instantiate(of("beta")).unwrap())
        .collect();
    assert!(beta[0].on_stream_end().is_ok());
    drop(held);
    assert!(echo.instantiate(of("acme")).is_ok());
}

#[test]
fn a_call_keeps_its_deadline_after_the_engine_is_dropped() {
    require_guests!();
    let engine = PluginEngine::new(PluginEngineConfig {
        max_instances: 1,
        ..PluginEngineConfig::default()
    })
    .unwrap();
    let plugin = engine
        .validate_and_compile(&guests::test_guest("hostile"))
        .unwrap();
    let mut call = plugin
        .instantiate(context(
            "hostile",
            PluginLimits {
                deadline: Duration::from_millis(20),
                ..PluginLimits::default()
            },
        ))
        .unwrap();
    // The call alone keeps the epoch ticker going.
    drop((plugin, engine));
    let e = call.on_request(text_request("loop")).unwrap_err();
    assert!(matches!(e, PluginError::Timeout { .. }), "{e:?}");
}
