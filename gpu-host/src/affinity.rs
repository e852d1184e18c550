//! Pinning a partition's threads to its cores. The CPU device's compute
//! units are numbered 0..N; unit `i` is the `i`-th CPU this process was
//! allowed to run on when it started (a host started under `taskset` or a
//! cgroup cpuset partitions the CPUs it was given, not CPUs 0..N).
//!
//! A thread pins itself, then creates its worker pool: Linux threads
//! inherit their creator's CPU mask, so the pool's threads run on the same
//! cores without the kernels crate knowing about partitions.

use rustix::thread::{CpuSet, Pid, sched_getaffinity, sched_setaffinity};

/// The CPUs compute units map onto, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CpuMap {
    cpus: Vec<usize>,
}

impl CpuMap {
    /// The CPUs the calling thread may run on now (at start: the process's).
    pub(crate) fn of_this_process() -> std::io::Result<CpuMap> {
        let set = sched_getaffinity(None)?;
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect();
        if cpus.is_empty() {
            return Err(std::io::Error::other("the CPU affinity mask is empty"));
        }
        Ok(CpuMap { cpus })
    }

    #[cfg(test)]
    pub(crate) fn from_cpus(cpus: Vec<usize>) -> CpuMap {
        CpuMap { cpus }
    }

    /// The CPU compute unit `unit` runs on. A device with more units than
    /// CPUs (`--threads` above the cores) wraps around.
    pub(crate) fn cpu_of(&self, unit: u32) -> usize {
        self.cpus[unit as usize % self.cpus.len()]
    }

    /// Every CPU of the map, sorted.
    pub(crate) fn all(&self) -> Vec<usize> {
        let mut cpus = self.cpus.clone();
        cpus.sort_unstable();
        cpus
    }

    /// The CPUs of `units`, sorted, without repeats.
    pub(crate) fn cpus_of(&self, units: impl IntoIterator<Item = u32>) -> Vec<usize> {
        let mut cpus: Vec<usize> = units.into_iter().map(|u| self.cpu_of(u)).collect();
        cpus.sort_unstable();
        cpus.dedup();
        cpus
    }
}

/// Restricts the calling thread (and the threads it creates from now on)
/// to `cpus`.
pub(crate) fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    pin(None, cpus)
}

/// Restricts the thread with kernel id `tid` (of this process) to `cpus`;
/// threads it created before keep their mask.
pub(crate) fn pin_thread(tid: Pid, cpus: &[usize]) -> std::io::Result<()> {
    pin(Some(tid), cpus)
}

fn pin(tid: Option<Pid>, cpus: &[usize]) -> std::io::Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        if cpu >= CpuSet::MAX_CPU {
            return Err(std::io::Error::other(format!(
                "CPU {cpu} is past the largest CPU id a mask holds"
            )));
        }
        set.set(cpu);
    }
    if cpus.is_empty() {
        return Err(std::io::Error::other("no CPU to pin to"));
    }
    sched_setaffinity(tid, &set).map_err(std::io::Error::from)
}

/// The calling thread's CPUs (tests).
#[cfg(test)]
pub(crate) fn current_cpus() -> Vec<usize> {
    CpuMap::of_this_process().map_or_else(|_| Vec::new(), |m| m.cpus)
}

/// The CPUs of thread `tid` (tests).
#[cfg(test)]
pub(crate) fn cpus_of_thread(tid: Pid) -> Vec<usize> {
    sched_getaffinity(Some(tid)).map_or_else(
        |_| Vec::new(),
        |set| (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_map_onto_the_allowed_cpus_in_order_and_wrap() {
        let map = CpuMap::from_cpus(vec![4, 6, 7]);
        assert_eq!([0, 1, 2, 3].map(|u| map.cpu_of(u)), [4, 6, 7, 4]);
        assert_eq!(map.cpus_of([2, 0, 3]), [4, 7]);
    }

    #[test]
    fn a_pinned_thread_and_the_threads_it_starts_run_on_those_cpus() {
        let map = CpuMap::of_this_process().unwrap();
        let last = map.cpu_of(u32::try_from(map.cpus.len() - 1).unwrap());
        let seen = std::thread::spawn(move || {
            pin_current_thread(&[last]).unwrap();
            let child = std::thread::spawn(current_cpus).join().unwrap();
            (current_cpus(), child)
        })
        .join()
        .unwrap();
        assert_eq!(seen, (vec![last], vec![last]));
        assert!(pin_current_thread(&[]).is_err());
    }
}
