//! Where the schedulers' types meet the wire's: a stream's events and
//! errors, and the `SetPartitions` tenant set read into the planner's
//! requests (the partitions report converts in `bulkhead_protocol`). `crate::sched` knows neither the protocol's
//! messages nor gRPC status codes; this module gives each scheduler error
//! its code, and the clients (the gateway above all) read those codes and
//! the texts.

use bulkhead_partition::TenantRequest;
use bulkhead_protocol::v1::{self, generate_event};
use tonic::Status;

use crate::engine::FinishReason;
use crate::sched::{Event, MAX_TENANTS, SchedError};

/// A stream's item as `Generate` answers it.
pub(super) type StreamItem = Result<v1::GenerateEvent, Status>;

/// Each error's code: RESOURCE_EXHAUSTED for a full queue or a KV budget
/// (the gateway reads the `kv_budget_exceeded:` prefix to tell them
/// apart), FAILED_PRECONDITION for what the host cannot serve as it is,
/// INVALID_ARGUMENT for the client's fault, UNAVAILABLE while stopping or
/// when the device failed (`device_error:` prefix),
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
            // UNAVAILABLE like a stopping host, told apart by the prefix:
            // the gateway must not retry it as a restart.
            SchedError::Device(_) => Status::unavailable(message),
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
            compute_us,
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
                compute_us,
            })
        }
    };
    v1::GenerateEvent { event: Some(event) }
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
