//! One request's plugin instance: a fresh store and instance with the
//! call's limits, and the hooks. Calls are synchronous and run on the
//! calling thread; each hook is bounded by the epoch deadline, so the HTTP
//! layer runs them on a blocking thread (`spawn_blocking`) or accepts up to
//! one deadline of blocking. The thread needs at least 1 MiB of stack
//! (`limits::MAX_WASM_STACK_BYTES`).

use std::fmt;
use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime::{
    PoolConcurrencyLimitError, ResourceLimiter, Store, StoreLimits, StoreLimitsBuilder, Trap,
};
use wasmtime_wasi::{I32Exit, WasiCtx, WasiCtxView, WasiView};

use super::bindings::bulkhead::plugin::types as wit;
use super::bindings::{Plugin, PluginPre};
use super::error::{Hook, PluginError};
use super::host::{HostState, LogSource, LogStats, PluginConfig};
use super::instances::InstanceLease;
use super::limits::{MAX_INSTANCES_PER_STORE, PluginLimits};
use super::runtime::Runtime;
use super::types::{OutputSize, Rejection, Request, Response};
use super::wasi::{self, Captured};

/// Longest trap detail kept in an error (it reaches the tenant).
const MAX_TRAP_DETAIL_BYTES: usize = 512;

/// Who is calling and under which limits: the tenant's policy entry for
/// this plugin.
#[derive(Clone, Debug)]
pub struct CallContext {
    /// Tags the plugin's log lines.
    pub tenant: Arc<str>,
    /// The plugin's name in the tenant's table: errors and logs name it.
    pub plugin: Arc<str>,
    /// What `host.config` and `host.config-entries` return.
    pub config: Arc<PluginConfig>,
    pub limits: PluginLimits,
}

/// The store's data for one call.
pub(crate) struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: CallLimiter,
    pub(crate) host: HostState,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Which limit a call ran into, so the trap that follows (a Rust guest
/// aborts when an allocation fails) is reported as that limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LimitHit {
    Memory,
    Table,
}

/// `StoreLimits`, remembering the first limit it refused and the most
/// memory it granted.
struct CallLimiter {
    limits: StoreLimits,
    hit: Option<LimitHit>,
    peak_memory_bytes: usize,
}

impl CallLimiter {
    fn new(limits: &PluginLimits) -> Self {
        CallLimiter {
            limits: StoreLimitsBuilder::new()
                .memory_size(limits.max_memory_bytes)
                .table_elements(limits.max_table_elements)
                .instances(MAX_INSTANCES_PER_STORE)
                .build(),
            hit: None,
            peak_memory_bytes: 0,
        }
    }

    fn note(&mut self, hit: LimitHit) {
        self.hit.get_or_insert(hit);
    }
}

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        if allowed {
            self.peak_memory_bytes = self.peak_memory_bytes.max(desired);
        } else {
            self.note(LimitHit::Memory);
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.note(LimitHit::Memory);
        self.limits.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.table_growing(current, desired, maximum)?;
        if !allowed {
            self.note(LimitHit::Table);
        }
        Ok(allowed)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.note(LimitHit::Table);
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

/// One request's instance of one plugin. Hooks run in the ABI's order:
/// [`on_request`](Self::on_request), then either
/// [`on_response`](Self::on_response) or [`on_chunk`](Self::on_chunk) per
/// streamed delta followed by one [`on_stream_end`](Self::on_stream_end).
/// State the plugin keeps lives exactly as long as this value.
///
/// Each hook returns `Ok(Ok(_))` to go on, `Ok(Err(rejection))` when the
/// plugin refuses, or `Err(PluginError)` when the plugin failed (trap,
/// deadline, memory, output size): that fails this request only, and every
/// later hook on this instance returns `plugin_already_failed`.
pub struct PluginCall {
    /// The engine whose epoch ticker must tick while guest code runs.
    runtime: Arc<Runtime>,
    store: Store<CallState>,
    plugin: Plugin,
    name: Arc<str>,
    /// The tenant's hold on one of the pool's instances.
    _lease: InstanceLease,
    limits: PluginLimits,
    stdout: Captured,
    stderr: Captured,
    failed: bool,
}

impl fmt::Debug for PluginCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginCall")
            .field("plugin", &self.name)
            .field("limits", &self.limits)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl PluginCall {
    pub(crate) fn start(
        runtime: &Arc<Runtime>,
        pre: &PluginPre<CallState>,
        call: CallContext,
    ) -> Result<Self, PluginError> {
        let lease = runtime.instances.acquire(&call.tenant, &call.plugin)?;
        let limits = call.limits.clamped();
        let stdout = Captured::new(limits.max_log_bytes);
        let stderr = Captured::new(limits.max_log_bytes);
        let state = CallState {
            wasi: wasi::wasi_ctx(&stdout, &stderr),
            table: ResourceTable::new(),
            limiter: CallLimiter::new(&limits),
            host: HostState::new(
                call.tenant,
                Arc::clone(&call.plugin),
                call.config,
                limits.max_log_bytes,
            ),
        };
        let mut store = Store::new(&runtime.engine, state);
        store.limiter(|state| &mut state.limiter);
        store.epoch_deadline_trap();
        // Instantiation runs the guest's initializers: same deadline.
        store.set_epoch_deadline(limits.deadline_ticks());
        let running = runtime.ticker.running();
        let instantiated = pre.instantiate(&mut store);
        drop(running);
        flush_stdio(&mut store, &stdout, &stderr);
        let plugin = match instantiated {
            Ok(plugin) => plugin,
            Err(e) if e.downcast_ref::<PoolConcurrencyLimitError>().is_some() => {
                return Err(PluginError::Busy {
                    plugin: call.plugin,
                });
            }
            Err(e) => {
                let hit = store.data().limiter.hit;
                return Err(classify(e, hit, &call.plugin, Hook::Instantiate, &limits));
            }
        };
        Ok(PluginCall {
            runtime: Arc::clone(runtime),
            store,
            plugin,
            name: call.plugin,
            _lease: lease,
            limits,
            stdout,
            stderr,
            failed: false,
        })
    }

    /// The plugin's name, as errors give it.
    pub fn plugin(&self) -> &str {
        &self.name
    }

    /// The largest linear memory this instance has grown to, in bytes.
    pub fn peak_memory_bytes(&self) -> usize {
        self.store.data().limiter.peak_memory_bytes
    }

    /// How much this instance has logged so far.
    pub fn log_stats(&self) -> LogStats {
        self.store.data().host.log.stats()
    }

    /// Rewrite (return it changed) or reject the request.
    pub fn on_request(&mut self, req: Request) -> Result<Result<Request, Rejection>, PluginError> {
        let req = wit::Request::from(req);
        let out = self.run(Hook::OnRequest, |plugin, store| {
            plugin.call_on_request(store, &req)
        })?;
        self.checked(
            Hook::OnRequest,
            out.map(Request::from).map_err(Rejection::from),
        )
    }

    /// Rewrite or reject a complete response.
    pub fn on_response(
        &mut self,
        resp: Response,
    ) -> Result<Result<Response, Rejection>, PluginError> {
        let resp = wit::Response::from(resp);
        let out = self.run(Hook::OnResponse, |plugin, store| {
            plugin.call_on_response(store, &resp)
        })?;
        self.checked(
            Hook::OnResponse,
            out.map(Response::from).map_err(Rejection::from),
        )
    }

    /// One streamed delta: the text to send now (possibly empty, holding
    /// some back) or a rejection of the rest of the stream.
    pub fn on_chunk(&mut self, text: &str) -> Result<Result<String, Rejection>, PluginError> {
        let out = self.run(Hook::OnChunk, |plugin, store| {
            plugin.call_on_chunk(store, text)
        })?;
        self.checked(Hook::OnChunk, out.map_err(Rejection::from))
    }

    /// The stream ended: whatever the plugin held back.
    pub fn on_stream_end(&mut self) -> Result<Result<String, Rejection>, PluginError> {
        let out = self.run(Hook::OnStreamEnd, |plugin, store| {
            plugin.call_on_stream_end(store)
        })?;
        self.checked(Hook::OnStreamEnd, out.map_err(Rejection::from))
    }

    /// Runs one hook under a fresh deadline; a failure poisons the instance.
    fn run<R>(
        &mut self,
        hook: Hook,
        call: impl FnOnce(&Plugin, &mut Store<CallState>) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        if self.failed {
            return Err(PluginError::AlreadyFailed {
                plugin: Arc::clone(&self.name),
                hook,
            });
        }
        self.store.set_epoch_deadline(self.limits.deadline_ticks());
        // A limit refused in an earlier hook that the guest survived says
        // nothing about this one.
        self.store.data_mut().limiter.hit = None;
        let running = self.runtime.ticker.running();
        let result = call(&self.plugin, &mut self.store);
        drop(running);
        flush_stdio(&mut self.store, &self.stdout, &self.stderr);
        result.map_err(|e| {
            self.failed = true;
            let hit = self.store.data().limiter.hit;
            classify(e, hit, &self.name, hook, &self.limits)
        })
    }

    /// Refuses a result over `max_output_bytes`.
    fn checked<T: OutputSize>(
        &mut self,
        hook: Hook,
        out: Result<T, Rejection>,
    ) -> Result<Result<T, Rejection>, PluginError> {
        let size = out.output_bytes();
        if size > self.limits.max_output_bytes {
            self.failed = true;
            return Err(PluginError::OutputTooLarge {
                plugin: Arc::clone(&self.name),
                hook,
                size,
                limit_bytes: self.limits.max_output_bytes,
            });
        }
        Ok(out)
    }
}

/// Sends what the guest wrote to stdout and stderr to the log.
fn flush_stdio(store: &mut Store<CallState>, stdout: &Captured, stderr: &Captured) {
    let host = &mut store.data_mut().host;
    for (source, captured) in [(LogSource::Stdout, stdout), (LogSource::Stderr, stderr)] {
        let (bytes, dropped) = captured.take();
        if !bytes.is_empty() || dropped > 0 {
            host.write_captured(source, &bytes, dropped);
        }
    }
}

/// Names the limit or fault behind a failed call. A limit the store refused
/// wins over the trap that followed it.
fn classify(
    e: wasmtime::Error,
    hit: Option<LimitHit>,
    plugin: &Arc<str>,
    hook: Hook,
    limits: &PluginLimits,
) -> PluginError {
    let plugin = Arc::clone(plugin);
    match hit {
        Some(LimitHit::Memory) => {
            return PluginError::MemoryLimit {
                plugin,
                hook,
                limit_bytes: limits.max_memory_bytes,
            };
        }
        Some(LimitHit::Table) => {
            return PluginError::TableLimit {
                plugin,
                hook,
                limit_elements: limits.max_table_elements,
            };
        }
        None => {}
    }
    let detail = match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => {
            return PluginError::Timeout {
                plugin,
                hook,
                deadline: limits.deadline,
            };
        }
        Some(Trap::StackOverflow) => "stack overflow".to_string(),
        Some(trap) => trap.to_string(),
        None => match e.downcast_ref::<I32Exit>() {
            Some(I32Exit(code)) => format!("the plugin called exit({code})"),
            None => format!("{e:#}"),
        },
    };
    PluginError::Trap {
        plugin,
        hook,
        detail: cut(detail),
    }
}

fn cut(mut detail: String) -> String {
    if detail.len() > MAX_TRAP_DETAIL_BYTES {
        let end = detail.floor_char_boundary(MAX_TRAP_DETAIL_BYTES);
        detail.truncate(end);
        detail.push('…');
    }
    detail
}
