//! The plugin host against real components: Rust guests built for
//! `wasm32-wasip2` from `plugin-host/tests/plugins/` (`bulkhead_testkit::wasm`),
//! hand-written components in WAT, and the C example plugin (see
//! `c_guest.rs`).

/// Returns from a test that needs the Rust guests when they cannot be
/// built here, saying why (see `bulkhead_testkit::wasm::available`).
macro_rules! require_guests {
    () => {
        if !guests::require() {
            return;
        }
    };
}

mod bench;
mod c_guest;
mod calls;
mod hostile;
mod shared_store;
mod store;
mod upload;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use super::*;
use bulkhead_testkit::wasm as guests;

/// One engine for the tests that need no special engine settings.
fn engine() -> &'static PluginEngine {
    static ENGINE: OnceLock<PluginEngine> = OnceLock::new();
    ENGINE.get_or_init(test_engine)
}

/// An engine with the settings [`engine`]'s has.
fn test_engine() -> PluginEngine {
    PluginEngine::new(PluginEngineConfig {
        max_instances: 32,
        // Tests compile in parallel on a possibly loaded machine; the
        // budget and the cap have tests of their own.
        max_compiles_in_flight: 64,
        compile_budget: Duration::from_secs(120),
        ..PluginEngineConfig::default()
    })
    .expect("plugin engine")
}

/// A test guest, compiled once per process (the lock is held while
/// compiling, so parallel tests do not compile the same guest twice).
pub(crate) fn compiled(name: &str) -> CompiledPlugin {
    static CACHE: OnceLock<Mutex<HashMap<String, CompiledPlugin>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    cache
        .entry(name.to_string())
        .or_insert_with(|| {
            engine()
                .validate_and_compile(&guests::test_guest(name))
                .unwrap_or_else(|e| panic!("compiling {name}: {e}"))
        })
        .clone()
}

/// Limits for well-behaved guests: a deadline no loaded test machine
/// reaches, so only the hostile tests time out.
fn relaxed_limits() -> PluginLimits {
    PluginLimits {
        deadline: Duration::from_secs(10),
        ..PluginLimits::default()
    }
}

fn context(plugin: &str, limits: PluginLimits) -> CallContext {
    CallContext {
        tenant: Arc::from("acme"),
        plugin: Arc::from(plugin),
        config: Arc::new(PluginConfig::new()),
        limits,
    }
}

/// A fresh instance of a test guest under relaxed limits.
fn start(name: &str) -> PluginCall {
    compiled(name)
        .instantiate(context(name, relaxed_limits()))
        .unwrap_or_else(|e| panic!("instantiating {name}: {e}"))
}

fn request(prompt: Prompt) -> Request {
    Request {
        model: "tiny-llama".to_string(),
        prompt,
        sampling: Sampling {
            max_tokens: Some(16),
            temperature: 0.7,
            top_p: 0.9,
            seed: Some(42),
            stop: vec!["\n\n".to_string()],
        },
        metadata: vec![("request-id".to_string(), "r-1".to_string())],
    }
}

fn text_request(text: &str) -> Request {
    request(Prompt::Text(text.to_string()))
}

fn response(text: &str) -> Response {
    Response {
        model: "tiny-llama".to_string(),
        text: text.to_string(),
        finish_reason: "stop".to_string(),
        prompt_tokens: 5,
        completion_tokens: 7,
    }
}

/// A metadata value the guest added.
fn meta<'r>(req: &'r Request, key: &str) -> Option<&'r str> {
    req.metadata
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The HTTP layer moves a call to a blocking thread and shares compiled
/// plugins and the engine between requests.
#[test]
fn handles_cross_threads_as_the_http_layer_needs() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<PluginCall>();
    send_sync::<CompiledPlugin>();
    send_sync::<PluginEngine>();
    send_sync::<PluginError>();
}
