//! Host bindings generated from the plugin ABI (`guest-sdk/wit`, world
//! `plugin`). Only this module and `types.rs` (which converts at the
//! boundary) see generated types; the rest of the gateway uses the plain
//! Rust types in `types.rs`.

wasmtime::component::bindgen!({
    path: "../guest-sdk/wit",
    world: "plugin",
});
