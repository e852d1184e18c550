//! Bulkhead's gateway: the OpenAI-compatible HTTP API in front of the
//! gpu-hosts, with per-tenant JWT auth, limits and policy files.

#![forbid(unsafe_code)]

pub mod auth;
pub mod limits;
pub mod policy;
