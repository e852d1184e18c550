//! One device split into partitions: each partition gets a [`HipBackend`]
//! of its own — launching on its own stream limited to the partition's
//! compute units, its allocations (activations, scratch, KV mirrors)
//! charged to a [`MemoryBudget`] of the partition's planned memory — while
//! the weights stay uploaded once per device, in one [`DeviceWeights`]
//! charged to the model reservation's budget and read by every partition.
//!
//! Where the streams come from is a [`StreamSource`]: the HIP runtime
//! (`device.rs`: `hipExtStreamCreateWithCUMask` with the partition's
//! mask), or, in tests, the kernel emulator or a fake that records the CU
//! sets it was asked for.

use std::fmt;
use std::sync::Arc;

use bulkhead_kernels::hip::KernelDevice;
use bulkhead_partition::{CuSet, Device};

use super::budgeted::BudgetedDevice;
use super::hip::{DeviceWeights, HipBackend};
use super::ledger::Transfers;
use crate::hip::MemoryBudget;

/// The name the weights' budget goes by in messages.
pub const MODEL_RESERVATION: &str = "model reservation";

/// Makes the streams partitions launch on.
pub trait StreamSource: Send + Sync + fmt::Debug {
    /// The device, for logs.
    fn describe(&self) -> String;
    /// A view of the device whose launches run only on the compute units
    /// of `cus` (mask bit `i` is id `i` of the set), on stream(s) of its
    /// own; its allocations share the device's address space.
    fn streams_for(&self, cus: &CuSet) -> Result<Arc<dyn KernelDevice>, String>;
    /// How partitions' streams are kept apart, for the partitions report.
    fn isolation(&self) -> String {
        "CU-masked streams".into()
    }
}

/// One partition's compute on the device.
#[derive(Debug)]
pub struct PartitionCompute {
    pub backend: Arc<HipBackend>,
    /// What its device allocations are charged to.
    pub budget: Arc<MemoryBudget>,
    /// Its view of the device: the budget's charges and the ledger.
    view: Arc<BudgetedDevice>,
}

impl PartitionCompute {
    /// What this partition has asked of the device so far.
    pub fn transfers(&self) -> Transfers {
        self.view.transfers()
    }
}

/// A device the partitions of a layout share.
#[derive(Debug)]
pub struct PartitionedDevice {
    /// The planner's view: compute units (and XCDs), memory.
    model: Device,
    model_reservation_bytes: u64,
    streams: Arc<dyn StreamSource>,
    weights: Arc<DeviceWeights>,
    weights_budget: Arc<MemoryBudget>,
    /// The view the weights are uploaded through.
    weights_view: Arc<BudgetedDevice>,
}

impl PartitionedDevice {
    /// `model` as the planner splits it, with `model_reservation_bytes` of
    /// its memory kept for weights (uploaded through a view on every CU,
    /// charged to a budget of that size), the rest for partitions.
    pub fn new(
        model: Device,
        model_reservation_bytes: u64,
        streams: Arc<dyn StreamSource>,
    ) -> Result<PartitionedDevice, String> {
        if model_reservation_bytes > model.memory_bytes {
            return Err(format!(
                "the model reservation ({}) is larger than {}'s memory ({})",
                bulkhead_partition::format_bytes(model_reservation_bytes),
                model.name,
                bulkhead_partition::format_bytes(model.memory_bytes)
            ));
        }
        let weights_budget = MemoryBudget::new(MODEL_RESERVATION, model_reservation_bytes);
        let all = streams.streams_for(&model.all())?;
        let weights_view = Arc::new(BudgetedDevice::new(all, Arc::clone(&weights_budget)));
        let weights = DeviceWeights::new(weights_view.clone());
        Ok(PartitionedDevice {
            model,
            model_reservation_bytes,
            streams,
            weights,
            weights_budget,
            weights_view,
        })
    }

    /// The device as the planner sees it.
    pub fn device(&self) -> &Device {
        &self.model
    }

    /// Memory kept for weights, outside every partition.
    pub fn model_reservation_bytes(&self) -> u64 {
        self.model_reservation_bytes
    }

    /// What the weights are charged to.
    pub fn weights_budget(&self) -> &Arc<MemoryBudget> {
        &self.weights_budget
    }

    /// How dedicated partitions are kept apart ([`StreamSource::isolation`]).
    pub fn isolation(&self) -> String {
        self.streams.isolation()
    }

    /// The weights every partition reads.
    pub fn weights(&self) -> &Arc<DeviceWeights> {
        &self.weights
    }

    /// What uploading (and freeing) the weights has asked of the device.
    pub fn weight_transfers(&self) -> Transfers {
        self.weights_view.transfers()
    }

    /// The compute of partition `id` (named in budget messages): streams
    /// on `cus`, a budget of `memory_bytes`, the shared weights.
    pub fn partition(
        &self,
        id: &str,
        cus: &CuSet,
        memory_bytes: u64,
    ) -> Result<PartitionCompute, String> {
        if cus.width() != self.model.compute_units {
            return Err(format!(
                "partition {id:?}: a CU set over {} compute units on {} with {}",
                cus.width(),
                self.model.name,
                self.model.compute_units
            ));
        }
        if cus.is_empty() {
            return Err(format!("partition {id:?} has no compute units"));
        }
        let view = self
            .streams
            .streams_for(cus)
            .map_err(|e| format!("partition {id:?}: streams on CUs {cus:?}: {e}"))?;
        let budget = MemoryBudget::new(id, memory_bytes);
        let view = Arc::new(BudgetedDevice::new(view, Arc::clone(&budget)));
        Ok(PartitionCompute {
            backend: Arc::new(HipBackend::sharing(view.clone(), Arc::clone(&self.weights))),
            budget,
            view,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Mutex;

    use bulkhead_kernels::{GgmlType, QuantMatrix};

    use super::*;
    use crate::backend::DeviceErrorKind;
    use crate::backend::budgeted::fake::MemoryOnly;

    /// Streams on a memory-only device, remembering the CU sets asked for.
    #[derive(Debug, Default)]
    pub(crate) struct RecordingStreams {
        pub device: Arc<MemoryOnly>,
        pub asked: Mutex<Vec<CuSet>>,
    }

    impl StreamSource for RecordingStreams {
        fn describe(&self) -> String {
            "recording".into()
        }

        fn streams_for(&self, cus: &CuSet) -> Result<Arc<dyn KernelDevice>, String> {
            self.asked.lock().unwrap().push(cus.clone());
            Ok(self.device.clone())
        }
    }

    fn mi325x(memory_bytes: u64) -> Device {
        Device {
            memory_bytes,
            ..Device::mi325x()
        }
    }

    #[test]
    fn partitions_get_streams_on_their_cus_and_budgets_of_their_memory() {
        let streams = Arc::new(RecordingStreams::default());
        let split = PartitionedDevice::new(mi325x(10 << 20), 4 << 20, streams.clone()).unwrap();
        assert_eq!(
            streams.asked.lock().unwrap().as_slice(),
            [CuSet::full(304)],
            "weights are uploaded through a view on every CU"
        );
        let xcd2 = split.device().xcd(2);
        let p = split.partition("dedicated:acme", &xcd2, 1 << 20).unwrap();
        assert_eq!(streams.asked.lock().unwrap()[1], xcd2);
        assert_eq!(p.budget.partition(), "dedicated:acme");
        assert_eq!(p.budget.limit_bytes(), 1 << 20);
        assert_eq!(split.weights_budget().limit_bytes(), 4 << 20);
        assert_eq!(split.weights_budget().partition(), MODEL_RESERVATION);
        assert!(Arc::ptr_eq(p.backend.weights(), split.weights()));
    }

    #[test]
    fn weights_are_uploaded_once_and_charged_to_the_reservation_only() {
        let streams = Arc::new(RecordingStreams::default());
        let split = PartitionedDevice::new(mi325x(10 << 20), 1 << 20, streams.clone()).unwrap();
        let device = split.device().clone();
        let a = split.partition("a", &device.xcd(0), 1 << 20).unwrap();
        let b = split.partition("b", &device.xcd(1), 1 << 20).unwrap();
        let (rows, cols) = (4, 256);
        let w: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let m = QuantMatrix::new(GgmlType::F32, &w, rows, cols).unwrap();
        let x = vec![1.0f32; cols];
        let mut out = vec![0.0f32; rows];
        for backend in [&a.backend, &b.backend, &a.backend] {
            crate::backend::Backend::matmul(&**backend, &m, &x, 1, &mut out).unwrap();
        }
        assert_eq!(streams.device.launches().len(), 3, "three matvecs launched");
        let weight_bytes = (rows * cols * 4) as u64;
        assert_eq!(split.weights().bytes() as u64, weight_bytes, "one copy");
        assert_eq!(split.weights_budget().used_bytes(), weight_bytes);
        // Each op's activations were charged to its partition and given
        // back when it returned.
        assert_eq!((a.budget.used_bytes(), b.budget.used_bytes()), (0, 0));
        // The weights plus what the partitions hold now: nothing else lives.
        assert_eq!(streams.device.live(), 1);
        // The ledgers: the weights went up once, through the reservation's
        // view (and the view waited for the copy, which every partition's
        // stream then reads); each matvec queued its input's copy and its
        // launch (an F32 matrix needs no quantized copy of the input) and
        // waited once, reading its output back.
        let matvec = |n: u64| Transfers {
            host_to_device_bytes: n * cols as u64 * 4,
            device_to_host_bytes: n * rows as u64 * 4,
            launches: n,
            synchronizations: n,
            allocations: 2 * n,
            frees: 2 * n,
        };
        assert_eq!((a.transfers(), b.transfers()), (matvec(2), matvec(1)));
        assert_eq!(
            split.weight_transfers(),
            Transfers {
                host_to_device_bytes: weight_bytes,
                synchronizations: 1,
                allocations: 1,
                ..Transfers::default()
            }
        );
        let before = a.transfers();
        crate::backend::Backend::matmul(&*a.backend, &m, &x, 1, &mut out).unwrap();
        assert_eq!(a.transfers().since(&before), matvec(1));
    }

    #[test]
    fn an_op_past_its_partitions_budget_fails_with_the_budget_message() {
        let streams = Arc::new(RecordingStreams::default());
        let split = PartitionedDevice::new(mi325x(10 << 20), 1 << 20, streams).unwrap();
        let device = split.device().clone();
        // One granule: the activations (16 floats) fit, the output does not.
        let a = split.partition("a", &device.xcd(0), 4096).unwrap();
        let w = vec![0u8; 4 * 16 * 4];
        let m = QuantMatrix::new(GgmlType::F32, &w, 4, 16).unwrap();
        let mut out = vec![0.0f32; 4];
        let e = crate::backend::Backend::matmul(&*a.backend, &m, &[1.0; 16], 1, &mut out)
            .expect_err("the output does not fit");
        assert_eq!(e.kind, DeviceErrorKind::OutOfMemory);
        assert_eq!(
            e.to_string(),
            "alloc 16 bytes: partition \"a\" cannot allocate 16B: 4KiB of its 4KiB \
             device-memory budget is in use, 0B left"
        );
        assert_eq!(a.budget.used_bytes(), 0, "the input was given back");
        assert!(
            a.backend.out_of_service().is_none(),
            "memory is not a lost device"
        );
    }

    #[test]
    fn bad_partitions_are_refused_naming_them() {
        let streams = Arc::new(RecordingStreams::default());
        let split = PartitionedDevice::new(mi325x(10 << 20), 1 << 20, streams).unwrap();
        let err = split
            .partition("dedicated:acme", &CuSet::full(38), 1 << 20)
            .unwrap_err();
        assert_eq!(
            err,
            "partition \"dedicated:acme\": a CU set over 38 compute units on mi325x with 304"
        );
        let err = split
            .partition("shared", &CuSet::empty(304), 1 << 20)
            .unwrap_err();
        assert_eq!(err, "partition \"shared\" has no compute units");
        let err = PartitionedDevice::new(
            mi325x(1 << 20),
            2 << 20,
            Arc::new(RecordingStreams::default()),
        )
        .unwrap_err();
        assert_eq!(
            err,
            "the model reservation (2MiB) is larger than mi325x's memory (1MiB)"
        );
    }
}
