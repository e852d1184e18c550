//! The wire's side of the schedulers' types: every error's code and text,
//! events, the partitions report and the tenant set.

use bulkhead_partition::{Compute, DEFAULT_KV_WAIT};
use tonic::Code;

use super::*;
use crate::engine::GenerateError;
use crate::sched::SequenceError;

const GIB: u64 = 1 << 30;

#[test]
fn every_scheduler_error_has_its_code_and_its_text() {
    let cases = [
        (
            SchedError::QueueFull {
                partition: "shared".into(),
                capacity: 8,
                tenant: "acme".into(),
                waiting: 8,
                guaranteed: 4,
            },
            Code::ResourceExhausted,
            "the request queue is full in partition `shared` (8 places) and tenant `acme` has 8 \
             requests waiting, its guaranteed part is 4; retry later",
        ),
        (
            SchedError::KvBudget(SequenceError::KvBudget {
                tenant: "acme".into(),
                needed_tokens: 4096,
                available_tokens: 1024,
                of: "in its budget",
            }),
            Code::ResourceExhausted,
            "kv_budget_exceeded: the request needs 4096 tokens of KV cache (prompt + max_tokens) \
             and tenant `acme` has 1024 in its budget",
        ),
        (
            SchedError::KvBudget(SequenceError::KvWait {
                tenant: "acme".into(),
                needed_tokens: 64,
                available_tokens: 16,
                waited_ms: 250,
            }),
            Code::ResourceExhausted,
            "kv_budget_exceeded: the request needs 64 tokens of KV cache (prompt + max_tokens) \
             and tenant `acme` had 16 left of its budget for 250 ms (its kv_wait_ms); retry when \
             its other requests end",
        ),
        (
            SchedError::Device(bulkhead_kernels::hip::DeviceError::lost(
                "launch bh_add",
                "hipStreamSynchronize failed: hipErrorIllegalAddress (700)",
            )),
            Code::Unavailable,
            "device_error: device_lost: launch bh_add: hipStreamSynchronize failed: \
             hipErrorIllegalAddress (700)",
        ),
        (
            SchedError::OutOfService {
                model: "llama".into(),
                reason: "weights changed while resident".into(),
            },
            Code::FailedPrecondition,
            "model `llama` is out of service: weights changed while resident",
        ),
        (
            SchedError::NoPartition {
                tenant: "globex".into(),
            },
            Code::FailedPrecondition,
            "tenant `globex` has no partition on this host: every core is dedicated to other \
             tenants",
        ),
        (
            SchedError::Unplannable {
                host: "cpu, 2 cores, 4GiB of KV memory".into(),
                errors: "cores: acme 2 + globex 1 = 3 > 2".into(),
            },
            Code::InvalidArgument,
            "the partitions cannot be planned on this host (cpu, 2 cores, 4GiB of KV memory): \
             cores: acme 2 + globex 1 = 3 > 2",
        ),
        (
            SchedError::BadRequest(GenerateError::EmptyPrompt),
            Code::InvalidArgument,
            "the prompt is empty",
        ),
        (
            SchedError::ShuttingDown,
            Code::Unavailable,
            "the host is shutting down",
        ),
        (
            SchedError::Internal("generation failed (a bug)".into()),
            Code::Internal,
            "generation failed (a bug)",
        ),
    ];
    for (error, code, message) in cases {
        let status = Status::from(error);
        assert_eq!((status.code(), status.message()), (code, message));
    }
}

#[test]
fn a_streams_events_and_its_error_read_on_the_wire() {
    let started = stream_item(Ok(Event::Started {
        prompt_tokens: 5,
        model: "llama".into(),
        model_digest: "sha256:ab".into(),
        weights_verified_at_ms: 1_700_000_000_000,
    }))
    .unwrap();
    assert_eq!(
        started.event,
        Some(generate_event::Event::Started(v1::Started {
            prompt_tokens: 5,
            model: "llama".into(),
            model_digest: "sha256:ab".into(),
            weights_verified_at_unix_ms: 1_700_000_000_000,
        }))
    );
    let delta = stream_item(Ok(Event::Delta {
        text: "Hi".into(),
        token_ids: vec![7, 8],
    }))
    .unwrap();
    assert_eq!(
        delta.event,
        Some(generate_event::Event::Delta(v1::Delta {
            text: "Hi".into(),
            token_ids: vec![7, 8],
        }))
    );
    for (reason, wire) in [
        (FinishReason::Stop, v1::FinishReason::Stop),
        (FinishReason::Length, v1::FinishReason::Length),
    ] {
        let finished = stream_item(Ok(Event::Finished {
            reason,
            prompt_tokens: 5,
            completion_tokens: usize::MAX,
            compute_us: 1234,
        }))
        .unwrap();
        assert_eq!(
            finished.event,
            Some(generate_event::Event::Finished(v1::Finished {
                finish_reason: wire.into(),
                usage: Some(v1::Usage {
                    prompt_tokens: 5,
                    completion_tokens: u32::MAX,
                }),
                compute_us: 1234,
            }))
        );
    }
    let failed = stream_item(Err(SchedError::ShuttingDown)).unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable);
}

#[test]
fn bad_wire_values_are_named() {
    let wire = |t: v1::TenantGpu| {
        let refused = tenant_requests(&[t]).unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        refused.message().to_string()
    };
    let both = wire(v1::TenantGpu {
        tenant: "acme".into(),
        cus: Some(1),
        share: Some(0.5),
        ..Default::default()
    });
    assert!(
        both.contains("tenants[0]: tenant `acme`: set cus or share"),
        "{both}"
    );
    let unnamed = wire(v1::TenantGpu::default());
    assert!(
        unnamed.contains("tenant must be 1 to 256 bytes, not 0"),
        "{unnamed}"
    );
    let nul = wire(v1::TenantGpu {
        tenant: "ac\0me".into(),
        isolation: v1::Isolation::Dedicated.into(),
        cus: Some(1),
        ..Default::default()
    });
    assert!(
        nul.contains("tenant \"ac\\0me\" has a control character"),
        "{nul}"
    );
    let isolation = wire(v1::TenantGpu {
        tenant: "acme".into(),
        isolation: 7,
        ..Default::default()
    });
    assert!(isolation.contains("unknown isolation 7"), "{isolation}");
    let many = vec![v1::TenantGpu::default(); MAX_TENANTS + 1];
    assert!(
        tenant_requests(&many)
            .unwrap_err()
            .message()
            .contains("at most 10000")
    );
    let ok = tenant_requests(&[v1::TenantGpu {
        tenant: "acme".into(),
        share: Some(0.5),
        isolation: v1::Isolation::Dedicated.into(),
        hbm_bytes: Some(GIB),
        ..Default::default()
    }])
    .unwrap();
    assert_eq!(ok[0].gpu.compute, Compute::Share(0.5));
    assert_eq!(ok[0].gpu.weight, 1);
    assert_eq!(ok[0].gpu.kv_wait(), DEFAULT_KV_WAIT);
    let slow = wire(v1::TenantGpu {
        tenant: "acme".into(),
        kv_wait_ms: Some(120_001),
        ..Default::default()
    });
    assert!(
        slow.contains("kv_wait_ms 120001 is above the most, 120000"),
        "{slow}"
    );
}
