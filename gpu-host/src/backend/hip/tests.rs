//! The HIP backend's own failure paths.

use super::*;
use crate::backend::budgeted::fake::MemoryOnly;

#[test]
fn a_lost_device_is_out_of_service_for_every_backend_sharing_it() {
    let device = Arc::new(MemoryOnly::default());
    let weights = DeviceWeights::new(device.clone());
    let a = HipBackend::sharing(device.clone(), Arc::clone(&weights));
    let b = HipBackend::sharing(device.clone(), weights);
    let (mut x, y) = (vec![1.0f32; 8], vec![2.0f32; 8]);
    a.add(&mut x, &y).unwrap();
    // A refused launch fails the op; the device stays in service.
    device.fail_launches(DeviceError::new("launch bh_add", "refused"));
    assert_eq!(a.add(&mut x, &y).unwrap_err().kind, DeviceErrorKind::Failed);
    assert!(a.out_of_service().is_none() && b.out_of_service().is_none());
    device.fail_launches(DeviceError::lost(
        "launch bh_add",
        "hipErrorIllegalAddress (700)",
    ));
    assert_eq!(a.add(&mut x, &y).unwrap_err().kind, DeviceErrorKind::Lost);
    let launched = device.launches().len();
    // Another partition's backend on the same device: refused at once.
    let e = b.add(&mut x, &y).unwrap_err();
    assert_eq!(e.kind, DeviceErrorKind::Lost);
    assert_eq!(
        e.to_string(),
        "the device is out of service: launch bh_add: hipErrorIllegalAddress (700)"
    );
    assert_eq!(
        device.launches().len(),
        launched,
        "nothing reached the device"
    );
    assert_eq!(device.live(), 0, "the failed ops freed what they allocated");
    assert!(b.out_of_service().is_some());
}
