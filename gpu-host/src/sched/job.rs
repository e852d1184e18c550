//! A validated generation on its way to a partition's scheduler, and the
//! channel its events go back on.

use std::sync::Arc;

use bulkhead_protocol::v1;
use tokio::sync::mpsc;
use tonic::Status;

use super::counters::Counted;
use crate::engine::GenerateRequest;
use crate::models::LoadedModel;

/// Where a generation's events go; dropped by the client side when it leaves.
pub(crate) type EventSender = mpsc::Sender<Result<v1::GenerateEvent, Status>>;

/// One queued generation, already validated.
#[derive(Debug)]
pub(crate) struct Job {
    pub model: Arc<LoadedModel>,
    pub request: GenerateRequest,
    pub tenant: String,
    pub priority: i32,
    pub events: EventSender,
}

/// A job in a partition's queue, with the counts it settles when it starts
/// running or leaves.
#[derive(Debug)]
pub(crate) struct Queued {
    pub job: Job,
    pub counted: Counted,
}
