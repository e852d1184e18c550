//! Compiles `proto/` with protox (pure Rust, no system `protoc`) and hands the
//! descriptors to tonic-prost-build for the message, client and server code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/bulkhead/gpu_host/v1/gpu_host.proto";
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
