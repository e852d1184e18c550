//! What can go wrong with a plugin: at upload (the component is refused) or
//! during a call (that one request fails). Every variant says which limit
//! or rule, and a call error names the plugin and the hook.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

/// The hook (or instantiation) a call error happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// Creating the instance, before any hook.
    Instantiate,
    OnRequest,
    OnResponse,
    OnChunk,
    OnStreamEnd,
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hook::Instantiate => "instantiation",
            Hook::OnRequest => "on-request",
            Hook::OnResponse => "on-response",
            Hook::OnChunk => "on-chunk",
            Hook::OnStreamEnd => "on-stream-end",
        })
    }
}

/// A refused upload or a failed plugin call.
#[derive(Debug, Error)]
pub enum PluginError {
    // Upload: the component is refused, nothing is kept.
    #[error("the component is {size} bytes; the limit is {max}")]
    TooLarge { size: usize, max: usize },

    #[error(
        "this is a core WebAssembly module, not a component: build the plugin \
         for wasm32-wasip2 (or wrap the module with `wasm-tools component new`)"
    )]
    NotAComponent,

    #[error("not a valid WebAssembly component: {reason}")]
    Malformed { reason: String },

    #[error("the component imports `{import}`, which plugins are not offered ({reason})")]
    ForbiddenImport {
        import: String,
        reason: &'static str,
    },

    #[error("the component imports `{import}`: this gateway supports version {supported}")]
    UnsupportedVersion {
        import: String,
        supported: &'static str,
    },

    #[error("the component does not export `{export}`, which every plugin must")]
    MissingExport { export: &'static str },

    #[error("the component does not fit the plugin ABI: {reason}")]
    Incompatible { reason: String },

    #[error("compiling the component took longer than {budget:?}")]
    CompileTimeout { budget: Duration },

    #[error("{in_flight} plugin compiles are already running; try again later")]
    CompileBusy { in_flight: usize },

    #[error(
        "tenant `{tenant}` already has an upload compiling (one at a time per tenant); retry \
         when it is done"
    )]
    TenantCompileBusy { tenant: String },

    #[error("compiling the component failed: {reason}")]
    Compile { reason: String },

    #[error("the plugin engine could not start: {reason}")]
    Engine { reason: String },

    // Call: this request fails; the gateway and other requests go on.
    #[error("plugin `{plugin}`: every plugin instance slot is in use; try again later")]
    Busy { plugin: Arc<str> },

    #[error("plugin `{plugin}` trapped in {hook}: {detail}")]
    Trap {
        plugin: Arc<str>,
        hook: Hook,
        detail: String,
    },

    #[error("plugin `{plugin}` ran past its deadline of {deadline:?} in {hook}")]
    Timeout {
        plugin: Arc<str>,
        hook: Hook,
        deadline: Duration,
    },

    #[error("plugin `{plugin}` reached its memory limit of {limit_bytes} bytes in {hook}")]
    MemoryLimit {
        plugin: Arc<str>,
        hook: Hook,
        limit_bytes: usize,
    },

    #[error("plugin `{plugin}` reached its table limit of {limit_elements} elements in {hook}")]
    TableLimit {
        plugin: Arc<str>,
        hook: Hook,
        limit_elements: usize,
    },

    #[error(
        "plugin `{plugin}` returned {size} bytes from {hook}; the limit is {limit_bytes} bytes"
    )]
    OutputTooLarge {
        plugin: Arc<str>,
        hook: Hook,
        size: usize,
        limit_bytes: usize,
    },

    #[error("plugin `{plugin}` already failed in this request; {hook} was not called")]
    AlreadyFailed { plugin: Arc<str>, hook: Hook },
}

impl PluginError {
    /// A stable label for metrics and the API's error `code`.
    pub fn code(&self) -> &'static str {
        match self {
            PluginError::TooLarge { .. } => "plugin_too_large",
            PluginError::NotAComponent => "plugin_not_component",
            PluginError::Malformed { .. } => "plugin_malformed",
            PluginError::ForbiddenImport { .. } => "plugin_forbidden_import",
            PluginError::UnsupportedVersion { .. } => "plugin_unsupported_version",
            PluginError::MissingExport { .. } => "plugin_missing_export",
            PluginError::Incompatible { .. } => "plugin_incompatible",
            PluginError::CompileTimeout { .. } => "plugin_compile_timeout",
            PluginError::CompileBusy { .. } | PluginError::TenantCompileBusy { .. } => {
                "plugin_compile_busy"
            }
            PluginError::Compile { .. } => "plugin_compile_failed",
            PluginError::Engine { .. } => "plugin_engine",
            PluginError::Busy { .. } => "plugin_busy",
            PluginError::Trap { .. } => "plugin_trap",
            PluginError::Timeout { .. } => "plugin_timeout",
            PluginError::MemoryLimit { .. } | PluginError::TableLimit { .. } => "plugin_memory",
            PluginError::OutputTooLarge { .. } => "plugin_output_too_large",
            PluginError::AlreadyFailed { .. } => "plugin_already_failed",
        }
    }

    /// Whether the same thing may succeed later: the gateway was busy, not
    /// the plugin at fault.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            PluginError::Busy { .. }
                | PluginError::CompileBusy { .. }
                | PluginError::TenantCompileBusy { .. }
        )
    }
}
