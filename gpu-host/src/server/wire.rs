//! Where the schedulers' types meet the wire's: a stream's events and
//! errors, the partitions report, and the `SetPartitions` tenant set read
//! into the planner's requests. `crate::sched` knows neither the protocol's
//! messages nor gRPC status codes; this module gives each scheduler error
//! its code, and the clients (the gateway above all) read those codes and
//! the texts.

use bulkhead_partition::{PartitionKind, TenantRequest};
use bulkhead_protocol::v1::{self, generate_event};
use tonic::Status;

use crate::engine::FinishReason;
use crate::sched::{
    Event, MAX_TENANTS, PartitionReport, PartitionsReport, SchedError, TenantReport,
};

/// A stream's item as `Generate` answers it.
pub(super) type StreamItem = Result<v1::GenerateEvent, Status>;

/// Each error's code: RESOURCE_EXHAUSTED for a full queue or a KV budget
/// (the gateway reads the `kv_budget_exceeded:` prefix to tell them
/// apart), FAILED_PRECONDITION for what the host cannot serve as it is,
/// INVALID_ARGUMENT for the client's fault, UNAVAILABLE while stopping,
/// INTERNAL for the host's failures. The message is the error's text.
impl From<SchedError> for Status {
    fn from(error: SchedError) -> Status {
        let message = error.to_string();
        match error {
            SchedError::QueueFull { .. } | SchedError::KvBudget(_) => {
                Status::resource_exhausted(message)
            }
            SchedError::OutOfService { .. } | SchedError::NoPartition { .. } => {
                Status::failed_precondition(message)
            }
            SchedError::Unplannable { .. } | SchedError::BadRequest(_) => {
                Status::invalid_argument(message)
            }
            SchedError::ShuttingDown => Status::unavailable(message),
            SchedError::Internal(_) => Status::internal(message),
        }
    }
}

/// One item of a generation's stream, as the client reads it.
pub(super) fn stream_item(item: Result<Event, SchedError>) -> StreamItem {
    item.map(event).map_err(Status::from)
}

fn event(event: Event) -> v1::GenerateEvent {
    let event = match event {
        Event::Started {
            prompt_tokens,
            model,
            model_digest,
            weights_verified_at_ms,
        } => generate_event::Event::Started(v1::Started {
            prompt_tokens: small(prompt_tokens),
            model,
            model_digest,
            weights_verified_at_unix_ms: weights_verified_at_ms,
        }),
        Event::Delta { text, token_ids } => {
            generate_event::Event::Delta(v1::Delta { text, token_ids })
        }
        Event::Finished {
            reason,
            prompt_tokens,
            completion_tokens,
        } => {
            let reason = match reason {
                FinishReason::Stop => v1::FinishReason::Stop,
                FinishReason::Length => v1::FinishReason::Length,
            };
            generate_event::Event::Finished(v1::Finished {
                finish_reason: reason.into(),
                usage: Some(v1::Usage {
                    prompt_tokens: small(prompt_tokens),
                    completion_tokens: small(completion_tokens),
                }),
            })
        }
    };
    v1::GenerateEvent { event: Some(event) }
}

/// The `Partitions` answer (also `SetPartitions`' layout). The layout's
/// epoch is the wire's `generation`.
pub(super) fn partitions(report: PartitionsReport) -> v1::PartitionsResponse {
    v1::PartitionsResponse {
        device: report.device,
        unit: report.unit.to_string(),
        compute_units: report.compute_units,
        memory_bytes: report.memory_bytes,
        generation: report.epoch,
        partitions: report.partitions.into_iter().map(partition).collect(),
    }
}

fn partition(p: PartitionReport) -> v1::PartitionInfo {
    v1::PartitionInfo {
        id: p.id,
        kind: match p.kind {
            PartitionKind::Dedicated => "dedicated",
            PartitionKind::Shared => "shared",
        }
        .to_string(),
        cores: p.units,
        memory_bytes: p.memory_bytes,
        memory_used_bytes: p.memory_used_bytes,
        queued: small(p.queued),
        running: small(p.running),
        preemptions: p.preemptions,
        tenants: p.tenants.into_iter().map(tenant_usage).collect(),
        draining: p.draining,
        host_cpus: p.host_cpus.into_iter().map(small).collect(),
        lane: p.lane.unwrap_or_default(),
    }
}

fn tenant_usage(t: TenantReport) -> v1::TenantUsage {
    v1::TenantUsage {
        tenant: t.tenant,
        weight: t.weight,
        kv_blocks: t.kv_blocks,
        kv_bytes: t.kv_bytes,
        guaranteed_bytes: t.guaranteed_bytes,
        budget_bytes: t.budget_bytes,
        preemptions: t.preemptions,
        kv_refusals: t.kv_refusals,
        queued: small(t.queued),
        queue_guaranteed: small(t.queue_guaranteed),
        queue_refusals: t.queue_refusals,
    }
}

/// The wire tenant set, checked: at most [`MAX_TENANTS`], each entry as
/// `bulkhead_protocol::tenant_request` reads it. Refusals are
/// INVALID_ARGUMENT naming the entry.
pub(super) fn tenant_requests(tenants: &[v1::TenantGpu]) -> Result<Vec<TenantRequest>, Status> {
    if tenants.len() > MAX_TENANTS {
        return Err(Status::invalid_argument(format!(
            "tenants: {} listed, at most {MAX_TENANTS}",
            tenants.len()
        )));
    }
    tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            bulkhead_protocol::tenant_request(t)
                .map_err(|what| Status::invalid_argument(format!("tenants[{i}]: {what}")))
        })
        .collect()
}

/// A count in a `uint32` field (saturated).
fn small(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
