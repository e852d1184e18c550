//! The HIP runtime layer (`bulkhead_gpu_host::hip`, feature `hip`) against
//! the real `libamdhip64`. Without a GPU (the dev box, CI) they check that
//! the runtime's "nothing here" answers become `HipError::NoDevice`; the
//! rest run wherever a device is visible and say why they skipped
//! otherwise (run with `--nocapture` to see it).
#![cfg(feature = "hip")]

use std::process::Command;

use bulkhead_testkit::{Need, skip};

use bulkhead_gpu_host::hip::{
    Device, DeviceBuffer, Event, HipError, KernelArgs, MemoryBudget, Module, Stream, devices,
    runtime_version,
};

/// Device 0, or `None` after skipping for `hip-device` (a failure where
/// `BULKHEAD_REQUIRE` lists it). Any error other than "no device" fails
/// the test.
fn device_or_skip(_test: &str) -> Option<Device> {
    match Device::open(0) {
        Ok(device) => Some(device),
        Err(err) if err.is_no_device() => {
            skip(Need::HipDevice, err);
            None
        }
        Err(err) => panic!("opening HIP device 0: {err}"),
    }
}

#[test]
fn the_runtime_reports_its_version_without_a_device() {
    let version = runtime_version().unwrap();
    assert!(version.runtime > 0, "{version:?}");
}

#[test]
fn enumeration_lists_sane_devices_or_says_none_is_visible() {
    match devices() {
        Ok(found) => {
            assert!(!found.is_empty(), "Ok(empty) must be NoDeviceCounted");
            for (i, props) in found.iter().enumerate() {
                assert_eq!(props.ordinal, i);
                props.check().unwrap();
            }
        }
        Err(HipError::NoDevice(why)) => {
            assert!(
                ["hipInit", "hipGetDeviceCount"].contains(&why.call),
                "{why}"
            );
            assert!(!why.name.is_empty(), "{why:?}");
        }
        Err(HipError::NoDeviceCounted) => {}
        Err(err) => panic!("a machine without a GPU must be NoDevice, got {err}"),
    }
}

#[test]
fn an_ordinal_past_the_devices_is_refused() {
    match Device::open(4096) {
        Err(HipError::NoSuchDevice { ordinal: 4096, .. }) => {}
        Err(err) if err.is_no_device() => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn buffers_round_trip_and_stay_within_their_budget() {
    let Some(device) = device_or_skip("buffers_round_trip_and_stay_within_their_budget") else {
        return;
    };
    let budget = MemoryBudget::new("test", 1 << 20);
    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
    let mut buffer = DeviceBuffer::from_host(&device, &data, &budget).unwrap();
    assert_eq!(buffer.to_host_vec().unwrap(), data);
    assert_eq!(
        budget.used_bytes(),
        4096,
        "4000 bytes charged as one granule"
    );
    buffer.copy_from_host_at(998, &[7.0, 8.0]).unwrap();
    let mut tail = [0.0f32; 3];
    buffer.copy_to_host_at(997, &mut tail).unwrap();
    assert_eq!(tail, [498.5, 7.0, 8.0]);
    assert!(buffer.copy_from_host_at(999, &[1.0, 2.0]).is_err());
    assert!(buffer.copy_from_host(&data[..10]).is_err());
    buffer.zero().unwrap();
    assert!(buffer.to_host_vec().unwrap().iter().all(|x| *x == 0.0));
    // Past the budget: refused before hipMalloc, nothing charged.
    let err = DeviceBuffer::<u8>::alloc(&device, 2 << 20, &budget).unwrap_err();
    assert!(matches!(err, HipError::Budget(_)), "{err}");
    drop(buffer);
    assert_eq!(budget.used_bytes(), 0);
}

#[test]
fn cu_masked_streams_and_events_work() {
    let Some(device) = device_or_skip("cu_masked_streams_and_events_work") else {
        return;
    };
    let cus = device.properties().compute_units;
    let first_half = bulkhead_partition::CuSet::from_ids(cus, 0..cus.div_ceil(2));
    let stream = Stream::for_cu_set(&device, &first_half).unwrap();
    assert_eq!(
        stream.cu_mask().map(<[u32]>::len),
        Some(cus.div_ceil(32) as usize)
    );
    let (start, end) = (Event::new(&device).unwrap(), Event::new(&device).unwrap());
    start.record(&stream).unwrap();
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
    assert!(Stream::with_cu_mask(&device, &[0]).is_err());
}

/// Compiles testdata/add_one.hip for the device's arch with hipcc, loads
/// it, launches it on a CU-masked stream and checks every element.
#[test]
fn a_kernel_compiled_for_the_device_runs() {
    let Some(device) = device_or_skip("a_kernel_compiled_for_the_device_runs") else {
        return;
    };
    let arch = device.properties().arch().to_string();
    let dir = std::env::temp_dir().join(format!("bulkhead-hip-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("add_one.co");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/src/hip/testdata/add_one.hip");
    let status = Command::new("hipcc")
        .args(["--genco", &format!("--offload-arch={arch}"), source, "-o"])
        .arg(&out)
        .status();
    // With a device here, only a missing hipcc is a reason to skip; a
    // compile that fails is a failure.
    let image = match status {
        Ok(s) if s.success() => std::fs::read(&out).unwrap(),
        Ok(s) => panic!("hipcc failed on {source}: {s}"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            skip(Need::HipToolchain, format!("hipcc: {e}"));
            return;
        }
        Err(e) => panic!("starting hipcc: {e}"),
    };
    let module = Module::load(&device, &image).unwrap();
    let add_one = module.function("add_one").unwrap();
    assert!(module.function("no_such_kernel").is_err());
    let budget = MemoryBudget::new("test", 1 << 20);
    let n = 10_000u32;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut x = DeviceBuffer::from_host(&device, &host, &budget).unwrap();
    let stream = Stream::new(&device).unwrap();
    {
        let mut args = KernelArgs::new();
        args.buffer_mut(&mut x).push(n);
        // SAFETY: add_one(float* x, unsigned n) touches x[0..n), which `x`
        // holds; the stream is synchronized before `x` is read or dropped.
        unsafe { add_one.launch(n.div_ceil(256), 256, 0, &stream, &args) }.unwrap();
    }
    stream.synchronize().unwrap();
    let back = x.to_host_vec().unwrap();
    assert!(back.iter().zip(&host).all(|(b, h)| *b == h + 1.0));
    std::fs::remove_dir_all(&dir).ok();
}
