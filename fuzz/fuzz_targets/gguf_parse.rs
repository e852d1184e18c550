//! Feeds arbitrary bytes to the GGUF parser (and to the lenient tensor-type
//! scan `inspect` uses on files whose types the engine lacks): each must
//! return Ok or a clean error, never panic, hang or allocate beyond its
//! limits.
#![no_main]

use bulkhead_gpu_host::gguf::{GgufLayout, Limits, TensorTypes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(layout) = GgufLayout::parse(data, &Limits::default()) {
        // Every accepted tensor range must lie inside the input.
        for t in &layout.tensors {
            assert!(t.file_range().end <= data.len());
        }
    }
    if let Ok(scan) = TensorTypes::scan(data, &Limits::default()) {
        assert!(scan.tensors.len() as u64 <= Limits::default().max_tensors);
    }
});
