//! Our allocator layer over a [`KernelDevice`]: every allocation through a
//! [`BudgetedDevice`] is charged to its [`MemoryBudget`] before the device
//! is asked, and refused past it with the budget's own error (the
//! partition, the bytes asked, used and left). HIP memory pools' `maxSize`
//! is only a cooperative cap, so this is where a partition's device memory
//! is actually bounded. Several budgeted views of one device share its
//! address space: a partition's launches may read the weights another view
//! (the model reservation) allocated. Each view also keeps the
//! [`Ledger`] of what it asked of the device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bulkhead_kernels::hip::{DeviceError, KernelDevice};

use super::ledger::{Ledger, Transfers};
use crate::hip::{MemoryBudget, Reservation};

/// A device whose allocations are charged to one budget, and whose calls
/// are counted in one ledger.
#[derive(Debug)]
pub struct BudgetedDevice {
    inner: Arc<dyn KernelDevice>,
    budget: Arc<MemoryBudget>,
    /// The charge of every live allocation made through this view.
    held: Mutex<HashMap<u64, Reservation>>,
    ledger: Ledger,
}

impl BudgetedDevice {
    /// `inner`, with every allocation made through the result charged to `budget`.
    pub fn new(inner: Arc<dyn KernelDevice>, budget: Arc<MemoryBudget>) -> BudgetedDevice {
        BudgetedDevice {
            inner,
            budget,
            held: Mutex::new(HashMap::new()),
            ledger: Ledger::default(),
        }
    }

    /// What this view has asked of the device so far.
    pub fn transfers(&self) -> Transfers {
        self.ledger.totals()
    }

    /// The budget charged.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// Allocations made through this view and not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl KernelDevice for BudgetedDevice {
    fn describe(&self) -> String {
        format!(
            "{}, budget of {:?}",
            self.inner.describe(),
            self.budget.partition()
        )
    }

    fn wave_size(&self) -> u32 {
        self.inner.wave_size()
    }

    /// Charged first: a refusal never reaches the device.
    fn alloc(&self, bytes: usize) -> Result<u64, DeviceError> {
        let what = || format!("alloc {bytes} bytes");
        let reservation = self
            .budget
            .reserve(bytes as u64)
            .map_err(|e| DeviceError::out_of_memory(what(), e.to_string()))?;
        // A failed device allocation drops the reservation: nothing charged.
        let addr = self.inner.alloc(bytes)?;
        self.ledger.allocated();
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, reservation);
        Ok(addr)
    }

    fn free(&self, addr: u64) -> Result<(), DeviceError> {
        let reservation = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&addr)
            .ok_or_else(|| {
                DeviceError::new(
                    format!("free {addr:#x}"),
                    format!(
                        "not an allocation of the {:?} budget",
                        self.budget.partition()
                    ),
                )
            })?;
        let freed = self.inner.free(addr);
        self.ledger.freed();
        // Given back once the device has the memory back (or says it is
        // not an allocation: then it was never the device's to hold).
        drop(reservation);
        freed
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError> {
        self.ledger.copied_to_device(bytes.len());
        self.inner.write(addr, bytes)
    }

    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.ledger.copied_to_host(out.len());
        self.inner.read(addr, out)
    }

    fn launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        threads: u32,
        args: &[u8],
    ) -> Result<(), DeviceError> {
        self.ledger.launched();
        self.inner.launch(kernel, grid, threads, args)
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.ledger.synchronized();
        self.inner.synchronize()
    }
}

/// Test support: a device that only holds memory (no kernels run), so
/// allocation accounting is tested without a GPU or the emulator.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;

    /// Memory by address; launches are recorded, not run.
    #[derive(Debug, Default)]
    pub(crate) struct MemoryOnly {
        state: Mutex<State>,
    }

    #[derive(Debug, Default)]
    struct State {
        next: u64,
        buffers: HashMap<u64, Vec<u8>>,
        launches: Vec<String>,
        /// What every launch fails with from now on.
        failure: Option<DeviceError>,
    }

    impl MemoryOnly {
        pub(crate) fn live(&self) -> usize {
            self.state.lock().unwrap().buffers.len()
        }

        pub(crate) fn launches(&self) -> Vec<String> {
            self.state.lock().unwrap().launches.clone()
        }

        /// Every launch from now on fails with `error`.
        pub(crate) fn fail_launches(&self, error: DeviceError) {
            self.state.lock().unwrap().failure = Some(error);
        }
    }

    impl KernelDevice for MemoryOnly {
        fn describe(&self) -> String {
            "memory-only test device".into()
        }

        fn wave_size(&self) -> u32 {
            64
        }

        fn alloc(&self, bytes: usize) -> Result<u64, DeviceError> {
            let mut s = self.state.lock().unwrap();
            s.next += 1 << 32;
            let addr = s.next;
            s.buffers.insert(addr, vec![0; bytes]);
            Ok(addr)
        }

        fn free(&self, addr: u64) -> Result<(), DeviceError> {
            let mut s = self.state.lock().unwrap();
            s.buffers
                .remove(&addr)
                .map(drop)
                .ok_or_else(|| DeviceError::new("free", "not an allocation"))
        }

        fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), DeviceError> {
            let mut s = self.state.lock().unwrap();
            let b = s
                .buffers
                .get_mut(&addr)
                .ok_or_else(|| DeviceError::new("write", "not an allocation"))?;
            b[..bytes.len()].copy_from_slice(bytes);
            Ok(())
        }

        fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
            let s = self.state.lock().unwrap();
            let b = s
                .buffers
                .get(&addr)
                .ok_or_else(|| DeviceError::new("read", "not an allocation"))?;
            out.copy_from_slice(&b[..out.len()]);
            Ok(())
        }

        fn launch(&self, kernel: &str, _: [u32; 3], _: u32, _: &[u8]) -> Result<(), DeviceError> {
            let mut s = self.state.lock().unwrap();
            s.launches.push(kernel.into());
            s.failure.clone().map_or(Ok(()), Err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::MemoryOnly;
    use super::*;
    use crate::hip::BUDGET_GRANULE_BYTES;

    #[test]
    fn allocations_are_charged_and_given_back_when_freed() {
        let device = Arc::new(MemoryOnly::default());
        let budget = MemoryBudget::new("dedicated:acme", 64 << 10);
        let view = BudgetedDevice::new(device.clone(), Arc::clone(&budget));
        let a = view.alloc(100).unwrap();
        let b = view.alloc(8192).unwrap();
        assert_eq!(budget.used_bytes(), BUDGET_GRANULE_BYTES + 8192);
        assert_eq!((view.live_allocations(), device.live()), (2, 2));
        view.write(a, &[7; 100]).unwrap();
        let mut back = [0; 100];
        view.read(a, &mut back).unwrap();
        assert_eq!(back, [7; 100]);
        view.free(a).unwrap();
        assert_eq!(budget.used_bytes(), 8192);
        view.free(b).unwrap();
        assert_eq!((budget.used_bytes(), device.live()), (0, 0));
    }

    #[test]
    fn past_the_budget_is_a_typed_refusal_that_never_reaches_the_device() {
        let device = Arc::new(MemoryOnly::default());
        let budget = MemoryBudget::new("dedicated:acme", 1 << 20);
        let view = BudgetedDevice::new(device.clone(), Arc::clone(&budget));
        let held = view.alloc(768 << 10).unwrap();
        let err = view.alloc(512 << 10).unwrap_err();
        assert_eq!(err.operation, "alloc 524288 bytes");
        assert_eq!(
            err.message,
            "partition \"dedicated:acme\" cannot allocate 512KiB: 768KiB of its 1MiB \
             device-memory budget is in use, 256KiB left"
        );
        assert_eq!(device.live(), 1, "the device was never asked");
        assert_eq!(budget.used_bytes(), 768 << 10, "a refusal charges nothing");
        view.free(held).unwrap();
        assert!(view.alloc(1 << 20).is_ok(), "all of it fits once freed");
    }

    #[test]
    fn two_views_of_one_device_charge_their_own_budgets() {
        let device: Arc<dyn KernelDevice> = Arc::new(MemoryOnly::default());
        let weights = MemoryBudget::new("model reservation", 1 << 20);
        let partition = MemoryBudget::new("shared", 1 << 20);
        let w = BudgetedDevice::new(Arc::clone(&device), Arc::clone(&weights));
        let p = BudgetedDevice::new(device, Arc::clone(&partition));
        let weight = w.alloc(4096).unwrap();
        w.write(weight, &[1; 4096]).unwrap();
        // The partition reads what the reservation holds (one address
        // space), but cannot free it: it is not its allocation.
        let mut out = [0; 16];
        p.read(weight, &mut out).unwrap();
        assert_eq!(out, [1; 16]);
        let err = p.free(weight).unwrap_err();
        assert!(
            err.message
                .contains("not an allocation of the \"shared\" budget"),
            "{err}"
        );
        assert_eq!((weights.used_bytes(), partition.used_bytes()), (4096, 0));
        let scratch = p.alloc(10).unwrap();
        assert_eq!((weights.used_bytes(), partition.used_bytes()), (4096, 4096));
        p.free(scratch).unwrap();
        w.free(weight).unwrap();
        assert_eq!((weights.used_bytes(), partition.used_bytes()), (0, 0));
    }
}
