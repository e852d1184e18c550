//! Every limit on plugins, as named constants with the reason beside each:
//! what an upload may be, the engine-wide pool, and the per-call limits a
//! tenant's policy sets (with their defaults).

use std::time::Duration;

/// Largest upload accepted. Rust plugins built for `wasm32-wasip2` are 50 KiB
/// to 2 MiB; 8 MiB leaves room for a plugin carrying large tables (regex,
/// Unicode data) while bounding the parse and compile work one upload costs.
pub const MAX_COMPONENT_BYTES: usize = 8 << 20;

/// Wall-clock budget for compiling one upload. Cranelift compiles a 2 MiB
/// plugin in well under a second on one core; ten times that covers a loaded
/// machine. Past it the upload is refused (`plugin_compile_timeout`).
pub const COMPILE_BUDGET: Duration = Duration::from_secs(10);

/// Compiles allowed at once, counting ones that ran past their budget and
/// still run in the background: uploads are rare, and this keeps a tenant who
/// uploads slow-to-compile components in a loop from taking every core.
pub const MAX_COMPILES_IN_FLIGHT: usize = 2;

/// How long an upload waits for a compile slot before 503
/// `plugin_compile_busy`. Tenants queue in arrival order with one place
/// each (`compile_queue.rs`), so with two slots this covers a few other
/// tenants' uploads ahead, each at most `COMPILE_BUDGET`.
pub const COMPILE_WAIT: Duration = Duration::from_secs(20);

/// How often the epoch ticker advances the engine's epoch, the clock plugin
/// deadlines count in. 1 ms: per-chunk hooks get deadlines of a few
/// milliseconds, which a 10 ms tick could not express; a deadline is at most
/// one tick late. The ticker thread wakes 1,000 times a second only while
/// guest code runs (and 100 ms after); otherwise it parks (`ticker.rs`).
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Plugin instances alive at once across the gateway (the pooling
/// allocator's slots). A request holds one instance per plugin in its chain
/// for as long as it streams; past this, instantiation fails fast with
/// `plugin_busy` (503, retry) instead of queueing. This bounds resident
/// plugin memory: 256 instances at the default 64 MiB is 16 GiB at worst,
/// within a 24 GiB host; the GPU behind one gateway serves far fewer
/// concurrent streams. The address space reserved is this times
/// [`MEMORIES_PER_INSTANCE`] times 4 GiB (wasmtime's default slot
/// reservation, which lets Cranelift drop bounds checks; virtual only).
pub const DEFAULT_MAX_INSTANCES: u32 = 256;

/// Linear memories per instance counted in the pool. Rust guests define one
/// (the WASI adapter shares it); two leaves room for a guest with a second.
pub const MEMORIES_PER_INSTANCE: u32 = 2;

/// Tables per instance counted in the pool: a Rust guest defines two (its
/// function table and the component's shim table).
pub const TABLES_PER_INSTANCE: u32 = 4;

/// Core module instances per component: a Rust guest instantiates three
/// (its module, the WASI adapter, the shim); 16 leaves room for guests
/// composed from several.
pub const CORE_INSTANCES_PER_COMPONENT: u32 = 16;

/// The most linear memory any policy may grant one instance: the pool's slot
/// size. Policy limits above it are clamped to it.
pub const MAX_MEMORY_BYTES_CEILING: usize = 256 << 20;

/// The most table elements any policy may grant: the pool's table size
/// (8 bytes of address space per element per table slot).
pub const MAX_TABLE_ELEMENTS_CEILING: usize = 100_000;

/// Native stack one plugin call may use. Deep recursion traps ("stack
/// overflow") at this depth; threads that run plugin calls need at least
/// 1 MiB of stack (tokio's blocking threads have 2 MiB).
pub const MAX_WASM_STACK_BYTES: usize = 512 << 10;

/// Longest message one `host.log` call (or one line of stdout/stderr) keeps;
/// the rest is cut and marked.
pub const MAX_LOG_MESSAGE_BYTES: usize = 1 << 10;

/// Largest `wasi:random` request served at once (the deterministic source).
pub const MAX_RANDOM_BYTES: u64 = 64 << 10;

/// Default [`PluginLimits::max_memory_bytes`]: a Rust plugin that copies a
/// 4 MiB request a few times needs under 32 MiB.
pub const DEFAULT_MAX_MEMORY_BYTES: usize = 64 << 20;

/// Default [`PluginLimits::max_table_elements`]: the test guests' largest
/// table has under 100 elements; a plugin with a large dependency tree
/// (serde, regex) has a few thousand indirect-call targets.
pub const DEFAULT_MAX_TABLE_ELEMENTS: usize = 20_000;

/// Default [`PluginLimits::deadline`]: CPU time per hook call. A hook that
/// rewrites text takes microseconds; 50 ms caps what a runaway plugin adds to
/// one request's latency.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(50);

/// Default [`PluginLimits::max_output_bytes`]: above the gateway's default
/// 1 MiB request body (a no-op plugin never fails a request the gateway
/// accepted), far below the memory limit.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 4 << 20;

/// Default [`PluginLimits::max_log_bytes`]: log volume (host `log` plus
/// stdout/stderr) one request's instance may write; enough for a few dozen
/// lines of diagnostics, too little to flood the gateway's log.
pub const DEFAULT_MAX_LOG_BYTES: usize = 16 << 10;

/// Core instances one store may create (`StoreLimits::instances`): one
/// component's worth.
pub const MAX_INSTANCES_PER_STORE: usize = CORE_INSTANCES_PER_COMPONENT as usize;

/// Each string or list element in a hook's result counts this many bytes on
/// top of its text toward [`PluginLimits::max_output_bytes`], so a list of a
/// million empty strings is not free.
pub const OUTPUT_ITEM_OVERHEAD_BYTES: usize = 16;

/// Limits on one plugin call (one request's instance), from the tenant's
/// policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginLimits {
    /// Linear memory the instance may grow to, in bytes (clamped to
    /// [`MAX_MEMORY_BYTES_CEILING`]).
    pub max_memory_bytes: usize,
    /// Elements any one table may grow to (clamped to
    /// [`MAX_TABLE_ELEMENTS_CEILING`]).
    pub max_table_elements: usize,
    /// Time each hook call (and instantiation) may run: wall-clock time,
    /// counted in epoch ticks ([`EPOCH_TICK`]); a call is stopped at most
    /// one tick after it.
    pub deadline: Duration,
    /// Size of one hook's result (text plus [`OUTPUT_ITEM_OVERHEAD_BYTES`]
    /// per string or list element), in bytes.
    pub max_output_bytes: usize,
    /// Log volume for the whole instance, in bytes.
    pub max_log_bytes: usize,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            max_table_elements: DEFAULT_MAX_TABLE_ELEMENTS,
            deadline: DEFAULT_DEADLINE,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
        }
    }
}

impl PluginLimits {
    /// These limits with memory and tables clamped to what the pool holds.
    pub(crate) fn clamped(&self) -> PluginLimits {
        PluginLimits {
            max_memory_bytes: self.max_memory_bytes.min(MAX_MEMORY_BYTES_CEILING),
            max_table_elements: self.max_table_elements.min(MAX_TABLE_ELEMENTS_CEILING),
            ..self.clone()
        }
    }

    /// The epoch deadline for one hook call: enough ticks that the call gets
    /// at least `deadline` (the next tick may come at once, so one more).
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let tick = EPOCH_TICK.as_nanos().max(1);
        let ticks = self.deadline.as_nanos().div_ceil(tick);
        u64::try_from(ticks)
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }
}
