//! What every call of one plugin engine shares: the wasmtime engine, the
//! tenants' shares of the instance pool, and the epoch ticker that bounds
//! guest code. Calls hold it; the engine that compiles builds it.

use std::sync::Arc;

use wasmtime::Engine;

use super::instances::InstanceShares;
use super::ticker::EpochTicker;

pub(crate) struct Runtime {
    pub(crate) engine: Engine,
    pub(crate) instances: Arc<InstanceShares>,
    pub(crate) ticker: EpochTicker,
}
