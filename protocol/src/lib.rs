//! The gRPC contract between Bulkhead's gateway and its GPU hosts: the
//! generated `bulkhead.gpu_host.v1` messages, client and server, and how to
//! reach a host (`unix:PATH` or `tcp:ADDR`); the one wire conversion of
//! the tenant set and of the partitions report; and the weight digests both sides (and the model-signing
//! CLI) agree on.

#![forbid(unsafe_code)]

mod connect;
pub mod digest;
mod report;
mod tenants;

/// `bulkhead.gpu_host.v1`, generated from `proto/bulkhead/gpu_host/v1/gpu_host.proto`.
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("bulkhead.gpu_host.v1");
}

pub use connect::{
    AUTHORIZATION, ClientTls, ConnectError, Target, bearer_value, connect, connect_lazy,
    connect_lazy_with, connect_with,
};
pub use tenants::{MAX_TENANT_BYTES, tenant_request};
