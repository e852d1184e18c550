//! Feeds arbitrary bytes to the GGUF parser: it must return Ok or a clean error,
//! never panic, hang or allocate beyond its limits.
#![no_main]

use bulkhead_gpu_host::gguf::{GgufLayout, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(layout) = GgufLayout::parse(data, &Limits::default()) {
        // Every accepted tensor range must lie inside the input.
        for t in &layout.tensors {
            assert!(t.file_range().end <= data.len());
        }
    }
});
