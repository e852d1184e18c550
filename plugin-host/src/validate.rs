//! What an upload must be before it is compiled: a component (not a core
//! module) whose every import is on the allow-list and which exports every
//! hook. Read from the binary's top level with `wasmparser` (cheap, no
//! compilation); the compiled component is then checked again, by type,
//! when it is linked.

use wasmparser::{ComponentTypeRef, Parser, Payload, TypeBounds};

use super::error::PluginError;

/// One interface a plugin may import, and what the host gives it there.
#[derive(Clone, Copy, Debug)]
pub struct AllowedImport {
    /// `namespace:package/interface`.
    pub interface: &'static str,
    /// `major.minor`: any patch release of it is accepted.
    pub version: &'static str,
    /// What a plugin gets from it: never anything from outside the call.
    pub offers: &'static str,
}

const fn allow(
    interface: &'static str,
    version: &'static str,
    offers: &'static str,
) -> AllowedImport {
    AllowedImport {
        interface,
        version,
        offers,
    }
}

/// Every interface a plugin may import. The ABI's two, and the WASI 0.2
/// interfaces Rust's `wasm32-wasip2` std uses for stdio, the environment,
/// exit, clocks and `HashMap` seeds, each made capability-free. Nothing
/// else: no filesystem, sockets, HTTP, or anything unknown. The linker
/// (`wasi.rs`, `PluginEngine::new`) defines exactly these.
pub const ALLOWED_IMPORTS: &[AllowedImport] = &[
    allow("bulkhead:plugin/types", "0.1", "the ABI's data types"),
    allow(
        "bulkhead:plugin/host",
        "0.1",
        "bounded logging and this plugin's config",
    ),
    allow(
        "wasi:cli/environment",
        "0.2",
        "no variables, no arguments, no working directory",
    ),
    allow("wasi:cli/exit", "0.2", "ends the call as a trap"),
    allow("wasi:cli/stdin", "0.2", "an empty stream"),
    allow(
        "wasi:cli/stdout",
        "0.2",
        "captured, bounded, to the gateway log",
    ),
    allow(
        "wasi:cli/stderr",
        "0.2",
        "captured, bounded, to the gateway log",
    ),
    allow("wasi:cli/terminal-input", "0.2", "no terminal"),
    allow("wasi:cli/terminal-output", "0.2", "no terminal"),
    allow("wasi:cli/terminal-stdin", "0.2", "no terminal"),
    allow("wasi:cli/terminal-stdout", "0.2", "no terminal"),
    allow("wasi:cli/terminal-stderr", "0.2", "no terminal"),
    allow("wasi:io/error", "0.2", "errors of the streams above"),
    allow(
        "wasi:io/poll",
        "0.2",
        "everything is ready at once; nothing ever waits",
    ),
    allow(
        "wasi:io/streams",
        "0.2",
        "the streams above, never blocking",
    ),
    allow(
        "wasi:clocks/wall-clock",
        "0.2",
        "always 0 (1970-01-01T00:00:00Z)",
    ),
    allow(
        "wasi:clocks/monotonic-clock",
        "0.2",
        "always 0; sleeps return at once",
    ),
    allow(
        "wasi:random/random",
        "0.2",
        "a fixed sequence, the same every call",
    ),
    allow(
        "wasi:random/insecure",
        "0.2",
        "a fixed sequence, the same every call",
    ),
    allow("wasi:random/insecure-seed", "0.2", "a fixed seed"),
];

/// The hooks every plugin exports (the SDK supplies no-op defaults).
pub const REQUIRED_EXPORTS: &[&str] = &["on-request", "on-response", "on-chunk", "on-stream-end"];

/// The top-level imports of a component that passed [`check_surface`], as
/// written in it (`wasi:cli/stdout@0.2.6`); type imports are left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Surface {
    pub imports: Vec<String>,
}

/// Whether `bytes` look like a component at all, from the 8-byte header:
/// `\0asm`, then a version and a layer (0: core module, 1: component).
pub fn check_header(bytes: &[u8]) -> Result<(), PluginError> {
    let Some((magic, rest)) = bytes.split_first_chunk::<4>() else {
        return Err(malformed("shorter than a WebAssembly header"));
    };
    if magic != b"\0asm" {
        return Err(malformed("no `\\0asm` header: not WebAssembly"));
    }
    match rest.get(2..4) {
        Some([0, 0]) => Err(PluginError::NotAComponent),
        Some([1, 0]) => Ok(()),
        Some(_) => Err(malformed("unknown WebAssembly layer in the header")),
        None => Err(malformed("shorter than a WebAssembly header")),
    }
}

/// Checks the top-level imports against [`ALLOWED_IMPORTS`] and that every
/// hook in [`REQUIRED_EXPORTS`] is exported. Nested modules and components
/// are skipped: their imports are satisfied inside the component.
pub fn check_surface(bytes: &[u8]) -> Result<Surface, PluginError> {
    check_header(bytes)?;
    let mut surface = Surface::default();
    let mut exports = Vec::new();
    // Each nested module or component starts with `Version` and ends with
    // `End`; depth 1 is the upload's own top level.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| malformed(&e.to_string()))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(section) if depth == 1 => {
                for import in section {
                    let import = import.map_err(|e| malformed(&e.to_string()))?;
                    let name = import.name;
                    if name.implements.is_some()
                        || name.version_suffix.is_some()
                        || name.external_id.is_some()
                    {
                        return Err(PluginError::ForbiddenImport {
                            import: name.name.to_string(),
                            reason: "import name options are not supported",
                        });
                    }
                    match import.ty {
                        // A type the component names for itself (`request`,
                        // bound to the ABI's type): not a capability.
                        ComponentTypeRef::Type(TypeBounds::Eq(_)) => {}
                        ComponentTypeRef::Type(TypeBounds::SubResource) => {
                            return Err(PluginError::ForbiddenImport {
                                import: name.name.to_string(),
                                reason: "an abstract resource the host does not provide",
                            });
                        }
                        _ => {
                            check_import(name.name)?;
                            surface.imports.push(name.name.to_string());
                        }
                    }
                }
            }
            Payload::ComponentExportSection(section) if depth == 1 => {
                for export in section {
                    let export = export.map_err(|e| malformed(&e.to_string()))?;
                    exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    if let Some(missing) = REQUIRED_EXPORTS
        .iter()
        .find(|hook| !exports.iter().any(|e| e == *hook))
    {
        return Err(PluginError::MissingExport { export: missing });
    }
    Ok(surface)
}

/// One non-type import: an allowed interface at a supported version.
fn check_import(import: &str) -> Result<(), PluginError> {
    let (interface, version) = import.split_once('@').unwrap_or((import, ""));
    let Some(allowed) = ALLOWED_IMPORTS.iter().find(|a| a.interface == interface) else {
        return Err(PluginError::ForbiddenImport {
            import: import.to_string(),
            reason: forbidden_reason(interface),
        });
    };
    if !version_matches(version, allowed.version) {
        return Err(PluginError::UnsupportedVersion {
            import: import.to_string(),
            supported: supported_label(allowed.version),
        });
    }
    Ok(())
}

/// Why an interface is refused, for the uploader.
fn forbidden_reason(interface: &str) -> &'static str {
    if interface.starts_with("wasi:filesystem/") {
        "plugins have no filesystem"
    } else if interface.starts_with("wasi:sockets/") || interface.starts_with("wasi:http/") {
        "plugins have no network"
    } else if !interface.contains(':') || !interface.contains('/') {
        "plugins import only named interfaces (`namespace:package/interface`)"
    } else {
        "it is not on the plugin import allow-list"
    }
}

/// `0.2.6` matches `0.2`; a pre-release (`0.2.0-rc-…`) or a missing version
/// does not.
fn version_matches(version: &str, major_minor: &str) -> bool {
    let mut parts = version.split('.');
    let (Some(major), Some(minor), Some(patch), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    numeric(major) && numeric(minor) && numeric(patch) && major_minor == format!("{major}.{minor}")
}

fn supported_label(major_minor: &'static str) -> &'static str {
    match major_minor {
        "0.1" => "0.1.x",
        "0.2" => "0.2.x",
        _ => major_minor,
    }
}

fn malformed(reason: &str) -> PluginError {
    PluginError::Malformed {
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_tells_core_modules_from_components() {
        assert!(matches!(
            check_header(b"\0asm\x01\0\0\0"),
            Err(PluginError::NotAComponent)
        ));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
        assert!(matches!(
            check_header(b"\0asm"),
            Err(PluginError::Malformed { .. })
        ));
        assert!(matches!(
            check_header(b"PK\x03\x04\0\0\0\0"),
            Err(PluginError::Malformed { .. })
        ));
        assert!(matches!(
            check_header(b""),
            Err(PluginError::Malformed { .. })
        ));
    }

    #[test]
    fn imports_are_checked_by_interface_and_version() {
        assert!(check_import("wasi:cli/stdout@0.2.6").is_ok());
        assert!(check_import("wasi:cli/stdout@0.2.0").is_ok());
        assert!(check_import("bulkhead:plugin/host@0.1.0").is_ok());
        assert!(check_import("bulkhead:plugin/host@0.1.7").is_ok());
        for (import, reason) in [
            ("wasi:sockets/tcp@0.2.0", "plugins have no network"),
            (
                "wasi:http/outgoing-handler@0.2.6",
                "plugins have no network",
            ),
            ("wasi:filesystem/types@0.2.6", "plugins have no filesystem"),
            (
                "acme:evil/backdoor@1.0.0",
                "it is not on the plugin import allow-list",
            ),
            (
                "backdoor",
                "plugins import only named interfaces (`namespace:package/interface`)",
            ),
        ] {
            match check_import(import) {
                Err(PluginError::ForbiddenImport {
                    import: named,
                    reason: why,
                }) => {
                    assert_eq!(named, import);
                    assert_eq!(why, reason);
                }
                other => panic!("{import}: {other:?}"),
            }
        }
        for import in [
            "bulkhead:plugin/host@0.2.0",
            "bulkhead:plugin/host",
            "wasi:cli/stdout@0.3.0",
            "wasi:cli/stdout@0.2.0-rc-2023-11-10",
            "wasi:cli/stdout@0.2",
        ] {
            assert!(
                matches!(
                    check_import(import),
                    Err(PluginError::UnsupportedVersion { .. })
                ),
                "{import}"
            );
        }
    }

    #[test]
    fn allow_list_has_no_duplicates() {
        for (i, a) in ALLOWED_IMPORTS.iter().enumerate() {
            assert!(
                ALLOWED_IMPORTS[i + 1..]
                    .iter()
                    .all(|b| b.interface != a.interface),
                "{} listed twice",
                a.interface
            );
        }
    }
}
