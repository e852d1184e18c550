//! The plugin engine, one per gateway: a wasmtime `Engine` (Cranelift,
//! components, the pooling allocator, epoch interruption), the epoch
//! ticker, and the `Linker` with every allowed import, built once. Uploads
//! are validated and compiled here, once each, into a [`CompiledPlugin`]
//! that instantiates cheaply per call.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use wasmtime::component::{Component, HasData, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig};

use super::bindings::{Plugin, PluginPre};
use super::call::{CallContext, CallState, PluginCall};
use super::compile_queue::{CompileQueue, Compiler};
use super::error::PluginError;
use super::host::HostState;
use super::instances::InstanceShares;
use super::limits::{
    COMPILE_BUDGET, COMPILE_WAIT, CORE_INSTANCES_PER_COMPONENT, DEFAULT_MAX_INSTANCES,
    MAX_COMPILES_IN_FLIGHT, MAX_COMPONENT_BYTES, MAX_MEMORY_BYTES_CEILING,
    MAX_TABLE_ELEMENTS_CEILING, MAX_WASM_STACK_BYTES, MEMORIES_PER_INSTANCE, TABLES_PER_INSTANCE,
};
use super::runtime::Runtime;
use super::store::VerifiedArtifact;
use super::ticker::EpochTicker;
use super::{validate, wasi};

/// Engine-wide settings; the defaults are the named constants in `limits`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEngineConfig {
    /// Plugin instances alive at once across the gateway (pool slots).
    pub max_instances: u32,
    /// Wall-clock budget for compiling one upload.
    pub compile_budget: Duration,
    /// Compiles running at once, including ones past their budget.
    pub max_compiles_in_flight: usize,
    /// How long a compile waits for a slot before it is refused.
    pub compile_wait: Duration,
}

impl Default for PluginEngineConfig {
    fn default() -> Self {
        PluginEngineConfig {
            max_instances: DEFAULT_MAX_INSTANCES,
            compile_budget: COMPILE_BUDGET,
            max_compiles_in_flight: MAX_COMPILES_IN_FLIGHT,
            compile_wait: COMPILE_WAIT,
        }
    }
}

/// The gateway's plugin runtime. Cheap to clone (shared); the epoch ticker
/// stops when the last clone and the last [`CompiledPlugin`] are dropped.
#[derive(Clone)]
pub struct PluginEngine {
    inner: Arc<EngineInner>,
}

pub(crate) struct EngineInner {
    runtime: Arc<Runtime>,
    linker: Linker<CallState>,
    config: PluginEngineConfig,
    compiles: Arc<CompileQueue>,
}

impl fmt::Debug for PluginEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PluginEngine")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// `host` imports read and write the store's [`HostState`].
struct HostData;

impl HasData for HostData {
    type Data<'a> = &'a mut HostState;
}

impl PluginEngine {
    /// Starts the engine (reserving the pool's address space) and its epoch
    /// ticker, and links the allowed imports.
    pub fn new(config: PluginEngineConfig) -> Result<Self, PluginError> {
        let engine = Engine::new(&wasmtime_config(&config)).map_err(engine_error)?;
        let mut linker = Linker::new(&engine);
        Plugin::add_to_linker::<CallState, HostData>(&mut linker, |state| &mut state.host)
            .map_err(engine_error)?;
        wasi::add_to_linker(&mut linker).map_err(engine_error)?;
        let ticker = EpochTicker::start(engine.clone()).map_err(|e| PluginError::Engine {
            reason: format!("cannot start the epoch ticker: {e}"),
        })?;
        Ok(PluginEngine {
            inner: Arc::new(EngineInner {
                runtime: Arc::new(Runtime {
                    engine,
                    instances: InstanceShares::new(config.max_instances as usize),
                    ticker,
                }),
                linker,
                compiles: CompileQueue::new(config.max_compiles_in_flight, config.compile_wait),
                config,
            }),
        })
    }

    /// Test hook: takes a compile slot for `who` as an upload would, held
    /// until the returned guard is dropped.
    #[cfg(test)]
    pub(crate) fn hold_compile_slot(
        &self,
        who: Compiler<'_>,
    ) -> Result<super::compile_queue::CompileSlot, PluginError> {
        self.inner.compiles.acquire(who)
    }

    /// Test hook: epochs the ticker has advanced (deadlines count in them).
    #[cfg(test)]
    pub(crate) fn epoch_ticks(&self) -> u64 {
        self.inner.runtime.ticker.ticks()
    }

    /// How many tenants share the instance pool (those with plugin chains
    /// in the policy in force): each is guaranteed an equal part of it.
    pub fn share_instances_among(&self, tenants: usize) {
        self.inner.runtime.instances.set_tenants(tenants);
    }

    /// The settings this engine was started with.
    pub fn config(&self) -> &PluginEngineConfig {
        &self.inner.config
    }

    /// Checks an upload and compiles it, once: at most
    /// [`MAX_COMPONENT_BYTES`]; a component, not a core module; every import
    /// on the allow-list (`validate::ALLOWED_IMPORTS`); every hook exported
    /// with the ABI's types; compiled within the engine's compile budget.
    ///
    /// Compilation runs on its own thread. When it runs past the budget the
    /// upload is refused (`plugin_compile_timeout`) but the thread cannot be
    /// stopped: it runs to completion in the background and its result is
    /// dropped. Such threads keep their compile slot (and their tenant's
    /// one place), so slow uploads cannot pile up.
    ///
    /// Blocks for up to the wait for a slot plus the compile budget: call it
    /// from a blocking thread.
    pub fn validate_and_compile(&self, bytes: &[u8]) -> Result<CompiledPlugin, PluginError> {
        self.validate_and_compile_for(bytes, Compiler::Gateway)
    }

    /// [`Self::validate_and_compile`] on behalf of `who`, who waits for a
    /// compile slot in its turn (`compile_queue.rs`): a tenant has one
    /// compile at a time, and waits behind other tenants' uploads.
    pub fn validate_and_compile_for(
        &self,
        bytes: &[u8],
        who: Compiler<'_>,
    ) -> Result<CompiledPlugin, PluginError> {
        let surface = check_upload(bytes)?;
        let component = self.compile(bytes, who)?;
        self.link(bytes, surface, component)
    }

    /// A plugin from an artifact this gateway compiled earlier
    /// ([`CompiledPlugin::serialize`]) and sealed with its store key: no
    /// compilation, only the cheap checks of [`Self::validate_and_compile`]
    /// on the original `bytes` (size, component, imports, exports) and the
    /// link. Fails when the artifact does not belong to `bytes` or was made
    /// by an incompatible engine; the caller then compiles `bytes` afresh.
    pub(crate) fn load_precompiled(
        &self,
        bytes: &[u8],
        artifact: &VerifiedArtifact,
    ) -> Result<CompiledPlugin, PluginError> {
        let surface = check_upload(bytes)?;
        if artifact.digest() != PluginDigest::of(bytes) {
            return Err(PluginError::Compile {
                reason: "the cached artifact belongs to other bytes".to_string(),
            });
        }
        let component = deserialize_verified(&self.inner.runtime.engine, artifact)?;
        self.link(bytes, surface, component)
    }

    /// What an artifact's MAC binds it to besides its bytes: this engine's
    /// compilation settings (wasmtime version, target, Cranelift flags,
    /// features), as a SHA-256 of wasmtime's compatibility hash input.
    pub(crate) fn compatibility_digest(&self) -> [u8; 32] {
        let mut hasher = Sha256Hasher(Sha256::new());
        self.inner
            .runtime
            .engine
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        hasher.0.finalize().into()
    }

    /// The compiled component linked against the allowed imports (the
    /// typed check of imports and hooks), shared by both ways in.
    fn link(
        &self,
        bytes: &[u8],
        surface: validate::Surface,
        component: Component,
    ) -> Result<CompiledPlugin, PluginError> {
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(incompatible)?;
        let pre = PluginPre::new(instance_pre).map_err(incompatible)?;
        Ok(CompiledPlugin {
            inner: Arc::new(CompiledInner {
                digest: PluginDigest::of(bytes),
                size_bytes: bytes.len(),
                imports: surface.imports,
                pre,
                engine: Arc::clone(&self.inner),
            }),
        })
    }

    #[cfg(test)]
    pub(crate) fn inner_engine(&self) -> &Engine {
        &self.inner.runtime.engine
    }

    #[cfg(test)]
    pub(crate) fn linker(&self) -> &Linker<CallState> {
        &self.inner.linker
    }

    fn compile(&self, bytes: &[u8], who: Compiler<'_>) -> Result<Component, PluginError> {
        let slot = self.inner.compiles.acquire(who)?;
        let (done, result) = mpsc::sync_channel(1);
        let engine = self.inner.runtime.engine.clone();
        let bytes = bytes.to_vec();
        thread::Builder::new()
            .name("plugin-compile".to_string())
            .spawn(move || {
                let compiled = Component::from_binary(&engine, &bytes);
                // Free before the waiter hears, so the tenant's next upload
                // finds its place free.
                drop(slot);
                // The waiter may have given up: then nobody reads this.
                let _ = done.send(compiled);
            })
            .map_err(|e| PluginError::Compile {
                reason: format!("cannot start the compiler thread: {e}"),
            })?;
        match result.recv_timeout(self.inner.config.compile_budget) {
            Ok(Ok(component)) => Ok(component),
            Ok(Err(e)) => Err(PluginError::Compile {
                reason: format!("{e:#}"),
            }),
            Err(RecvTimeoutError::Timeout) => Err(PluginError::CompileTimeout {
                budget: self.inner.config.compile_budget,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(PluginError::Compile {
                reason: "the compiler stopped without a result".to_string(),
            }),
        }
    }
}

fn wasmtime_config(config: &PluginEngineConfig) -> Config {
    let instances = config.max_instances;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(instances)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .total_core_instances(instances.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .max_memories_per_component(MEMORIES_PER_INSTANCE)
        .total_memories(instances.saturating_mul(MEMORIES_PER_INSTANCE))
        .max_memory_size(MAX_MEMORY_BYTES_CEILING)
        .max_tables_per_component(TABLES_PER_INSTANCE)
        .total_tables(instances.saturating_mul(TABLES_PER_INSTANCE))
        .table_elements(MAX_TABLE_ELEMENTS_CEILING)
        // Fiber stacks are for async calls; plugin calls are synchronous.
        .total_stacks(0);
    let mut wasm = Config::new();
    wasm.cranelift_opt_level(OptLevel::Speed)
        .wasm_component_model(true)
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK_BYTES)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    wasm
}

fn engine_error(e: wasmtime::Error) -> PluginError {
    PluginError::Engine {
        reason: format!("{e:#}"),
    }
}

fn incompatible(e: wasmtime::Error) -> PluginError {
    PluginError::Incompatible {
        reason: format!("{e:#}"),
    }
}

/// The checks every upload passes before it is compiled or loaded: size,
/// then the import and export surface (`validate.rs`).
fn check_upload(bytes: &[u8]) -> Result<validate::Surface, PluginError> {
    if bytes.len() > MAX_COMPONENT_BYTES {
        return Err(PluginError::TooLarge {
            size: bytes.len(),
            max: MAX_COMPONENT_BYTES,
        });
    }
    validate::check_surface(bytes)
}

/// The one `unsafe` in the plugin host (the gateway has none): wasmtime trusts a serialized component
/// to be its own output (it maps the machine code in it as executable).
#[allow(unsafe_code)]
fn deserialize_verified(
    engine: &Engine,
    artifact: &VerifiedArtifact,
) -> Result<Component, PluginError> {
    // SAFETY: `Component::deserialize` requires bytes that wasmtime itself
    // produced with `serialize`. A `VerifiedArtifact` exists only after its
    // HMAC-SHA256 checked out under the store's 32-byte random key, and that
    // MAC is written only over the output of `CompiledPlugin::serialize` on
    // a component this gateway compiled from the same digest with the same
    // engine settings. Forging one needs the key, a 0600 file in a 0700
    // folder: only the gateway's own user (or root) can read it, and they
    // can change the gateway's code anyway. wasmtime still checks the
    // header's version and engine settings and refuses a mismatch.
    unsafe { Component::deserialize(engine, artifact.bytes()) }.map_err(|e| PluginError::Compile {
        reason: format!("the cached artifact does not load: {e:#}"),
    })
}

/// Feeds `Hash` input into SHA-256, so wasmtime's compatibility hash has a
/// stable, collision-resistant value to MAC.
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes of 32"))
    }
}

/// The SHA-256 of an upload's bytes: what compiled plugins are cached and
/// audited by.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PluginDigest([u8; 32]);

impl PluginDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        PluginDigest(Sha256::digest(bytes).into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest written as 64 lowercase hex digits (as `Display` prints it).
    pub fn from_hex(hex: &str) -> Option<PluginDigest> {
        let hex = hex.as_bytes();
        if hex.len() != 64 {
            return None;
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.chunks_exact(2)) {
            *byte = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(PluginDigest(bytes))
    }
}

impl fmt::Display for PluginDigest {
    /// Lowercase hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for PluginDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PluginDigest({self})")
    }
}

/// A validated, compiled plugin, ready to instantiate. Cheap to clone;
/// holds its engine (and so the epoch ticker) alive.
#[derive(Clone)]
pub struct CompiledPlugin {
    inner: Arc<CompiledInner>,
}

struct CompiledInner {
    digest: PluginDigest,
    size_bytes: usize,
    imports: Vec<String>,
    pre: PluginPre<CallState>,
    engine: Arc<EngineInner>,
}

impl fmt::Debug for CompiledPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompiledPlugin")
            .field("digest", &self.inner.digest)
            .field("size_bytes", &self.inner.size_bytes)
            .field("imports", &self.inner.imports)
            .finish_non_exhaustive()
    }
}

impl CompiledPlugin {
    /// SHA-256 of the uploaded bytes.
    pub fn digest(&self) -> PluginDigest {
        self.inner.digest
    }

    /// Size of the upload.
    pub fn size_bytes(&self) -> usize {
        self.inner.size_bytes
    }

    /// The component's imports as written in it (`wasi:cli/stdout@0.2.6`),
    /// all on the allow-list.
    pub fn imports(&self) -> &[String] {
        &self.inner.imports
    }

    /// The compiled machine code in wasmtime's serialized form, for the
    /// store's artifact cache (read back only through
    /// [`PluginEngine::load_precompiled`], after its MAC checks out).
    pub(crate) fn serialize(&self) -> Result<Vec<u8>, PluginError> {
        self.inner
            .pre
            .instance_pre()
            .component()
            .serialize()
            .map_err(|e| PluginError::Compile {
                reason: format!("serializing the compiled component: {e:#}"),
            })
    }

    /// A fresh instance for one request, in a fresh store with `call`'s
    /// limits: nothing is shared with any other call. Fails with
    /// `plugin_busy` when the tenant's part of the pool and what it may
    /// borrow are taken (`instances.rs`), or every pool slot is.
    pub fn instantiate(&self, call: CallContext) -> Result<PluginCall, PluginError> {
        PluginCall::start(&self.inner.engine.runtime, &self.inner.pre, call)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_engine_starts() {
        // Reserves the default pool's address space (virtual only).
        let engine = PluginEngine::new(PluginEngineConfig::default()).unwrap();
        assert_eq!(engine.config().max_instances, DEFAULT_MAX_INSTANCES);
    }

    #[test]
    fn a_digest_prints_as_lowercase_hex() {
        assert_eq!(
            PluginDigest::of(b"").to_string(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_digest_reads_back_from_lowercase_hex_only() {
        let digest = PluginDigest::of(b"plugin");
        assert_eq!(PluginDigest::from_hex(&digest.to_string()), Some(digest));
        let upper = digest.to_string().to_uppercase();
        for bad in ["", "00", &upper, &"g".repeat(64), &"0".repeat(65)] {
            assert_eq!(PluginDigest::from_hex(bad), None, "{bad}");
        }
    }
}
