//! What `validate_and_compile` accepts and refuses.

use super::*;

fn refuse(bytes: &[u8]) -> PluginError {
    match engine().validate_and_compile(bytes) {
        Err(e) => e,
        Ok(plugin) => panic!("accepted: {plugin:?}"),
    }
}

fn wat(text: &str) -> Vec<u8> {
    wat::parse_str(text).expect("test WAT")
}

/// The exact imports of a Rust guest that uses nothing beyond `host`:
/// what `wasm32-wasip2` std pulls in (rustc 1.95's wasm-component-ld).
const RUST_GUEST_IMPORTS: &[&str] = &[
    "bulkhead:plugin/host@0.1.0",
    "bulkhead:plugin/types@0.1.0",
    "wasi:io/poll@0.2.6",
    "wasi:io/error@0.2.6",
    "wasi:io/streams@0.2.6",
    "wasi:cli/environment@0.2.6",
    "wasi:cli/exit@0.2.6",
    "wasi:cli/stdin@0.2.6",
    "wasi:cli/stdout@0.2.6",
    "wasi:cli/stderr@0.2.6",
    "wasi:cli/terminal-input@0.2.6",
    "wasi:cli/terminal-output@0.2.6",
    "wasi:cli/terminal-stdin@0.2.6",
    "wasi:cli/terminal-stdout@0.2.6",
    "wasi:cli/terminal-stderr@0.2.6",
];

#[test]
fn a_rust_guest_is_accepted_with_its_digest_and_imports() {
    require_guests!();
    let bytes = guests::test_guest("rewrite");
    let plugin = engine().validate_and_compile(&bytes).unwrap();
    assert_eq!(plugin.digest(), PluginDigest::of(&bytes));
    assert_eq!(plugin.digest().to_string().len(), 64);
    assert_eq!(plugin.size_bytes(), bytes.len());
    let mut imports = plugin.imports().to_vec();
    imports.sort();
    let mut expected: Vec<_> = RUST_GUEST_IMPORTS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(imports, expected);
}

#[test]
fn a_guest_using_std_time_and_hashmap_imports_clocks_and_random() {
    require_guests!();
    let plugin = compiled("observer");
    for import in [
        "wasi:clocks/wall-clock@0.2.6",
        "wasi:clocks/monotonic-clock@0.2.6",
        "wasi:random/insecure-seed@0.2.6",
    ] {
        assert!(
            plugin.imports().iter().any(|i| i == import),
            "{import} not in {:?}",
            plugin.imports()
        );
    }
}

#[test]
fn a_guest_using_the_filesystem_is_refused_naming_the_import() {
    require_guests!();
    let e = refuse(&guests::test_guest("fs-user"));
    assert!(
        matches!(&e, PluginError::ForbiddenImport { import, reason }
            if import.starts_with("wasi:filesystem/") && *reason == "plugins have no filesystem"),
        "{e:?}"
    );
    assert_eq!(e.code(), "plugin_forbidden_import");
}

#[test]
fn a_core_module_is_refused_as_not_a_component() {
    let e = refuse(&wat(r#"(module (func (export "on-request")))"#));
    assert!(matches!(e, PluginError::NotAComponent), "{e:?}");
    assert!(e.to_string().contains("wasm32-wasip2"), "{e}");
}

#[test]
fn network_and_unknown_imports_are_refused_by_name() {
    for (import, reason) in [
        ("wasi:sockets/tcp@0.2.0", "plugins have no network"),
        (
            "wasi:http/outgoing-handler@0.2.6",
            "plugins have no network",
        ),
        (
            "acme:evil/backdoor@1.0.0",
            "it is not on the plugin import allow-list",
        ),
        (
            "backdoor",
            "plugins import only named interfaces (`namespace:package/interface`)",
        ),
    ] {
        let e = refuse(&wat(&format!(
            r#"(component (import "{import}" (instance)))"#
        )));
        assert!(
            matches!(&e, PluginError::ForbiddenImport { import: named, reason: why }
                if named == import && *why == reason),
            "{import}: {e:?}"
        );
        assert!(e.to_string().contains(import), "{e}");
    }
}

#[test]
fn an_abi_version_other_than_0_1_is_refused_naming_it() {
    let e = refuse(&wat(
        r#"(component (import "bulkhead:plugin/host@0.2.0" (instance)))"#,
    ));
    assert!(
        matches!(&e, PluginError::UnsupportedVersion { import, supported }
            if import == "bulkhead:plugin/host@0.2.0" && *supported == "0.1.x"),
        "{e:?}"
    );
}

#[test]
fn a_missing_hook_is_refused_naming_it() {
    let e = refuse(&wat("(component)"));
    assert!(
        matches!(
            e,
            PluginError::MissingExport {
                export: "on-request"
            }
        ),
        "{e:?}"
    );
}

/// Every hook exported, with the wrong type (`func()`).
const WRONG_TYPES: &str = r#"
(component
  (core module $m (func (export "f")))
  (core instance $i (instantiate $m))
  (func $f (canon lift (core func $i "f")))
  (export "on-request" (func $f))
  (export "on-response" (func $f))
  (export "on-chunk" (func $f))
  (export "on-stream-end" (func $f))
)"#;

#[test]
fn hooks_of_the_wrong_type_are_refused() {
    let e = refuse(&wat(WRONG_TYPES));
    assert!(matches!(e, PluginError::Incompatible { .. }), "{e:?}");
    assert_eq!(e.code(), "plugin_incompatible");
}

#[test]
fn oversized_and_garbage_uploads_are_refused_before_parsing() {
    let e = refuse(&vec![0u8; MAX_COMPONENT_BYTES + 1]);
    assert!(
        matches!(e, PluginError::TooLarge { size, max } if size == MAX_COMPONENT_BYTES + 1 && max == MAX_COMPONENT_BYTES),
        "{e:?}"
    );
    for garbage in [
        &b""[..],
        b"\0asm",
        b"#!/bin/sh\nrm -rf /\n",
        b"\0asm\x0d\0\x01\0\xff\xff",
    ] {
        let e = refuse(garbage);
        assert!(
            matches!(e, PluginError::Malformed { .. }),
            "{garbage:?}: {e:?}"
        );
    }
}

#[test]
fn every_allowed_import_is_linked_at_old_and_current_versions() {
    for wasi_version in ["0.2.0", "0.2.6"] {
        let imports: String = ALLOWED_IMPORTS
            .iter()
            .map(|allowed| {
                let version = if allowed.version == "0.1" {
                    "0.1.0"
                } else {
                    wasi_version
                };
                format!(r#"(import "{}@{version}" (instance))"#, allowed.interface)
            })
            .collect();
        let component = wasmtime::component::Component::from_binary(
            engine().inner_engine(),
            &wat(&format!("(component {imports})")),
        )
        .unwrap();
        if let Err(e) = engine().linker().instantiate_pre(&component) {
            panic!("WASI {wasi_version}: {e:#}");
        }
    }
}

#[test]
fn a_compile_past_its_budget_is_refused() {
    let engine = PluginEngine::new(PluginEngineConfig {
        max_instances: 1,
        compile_budget: Duration::ZERO,
        ..PluginEngineConfig::default()
    })
    .unwrap();
    // Thousands of functions: no compiler finishes them in the instant
    // between starting its thread and the zero-length wait (a tiny
    // component could, and the test would see its type error instead).
    let functions: String = (0..4000)
        .map(|i| format!("(func (param i32) (result i32) local.get 0 i32.const {i} i32.mul)"))
        .collect();
    let slow = WRONG_TYPES.replace(
        r#"(func (export "f"))"#,
        &format!(r#"(func (export "f")) {functions}"#),
    );
    let e = engine.validate_and_compile(&wat(&slow)).unwrap_err();
    assert!(matches!(e, PluginError::CompileTimeout { .. }), "{e:?}");
    assert_eq!(e.code(), "plugin_compile_timeout");
}

#[test]
fn compiles_beyond_the_in_flight_cap_are_refused() {
    let engine = PluginEngine::new(PluginEngineConfig {
        max_instances: 1,
        max_compiles_in_flight: 0,
        compile_wait: Duration::ZERO,
        ..PluginEngineConfig::default()
    })
    .unwrap();
    let e = engine.validate_and_compile(&wat(WRONG_TYPES)).unwrap_err();
    assert!(matches!(e, PluginError::CompileBusy { .. }), "{e:?}");
    assert!(e.retryable());
}
