//! A persistent team of kernel threads: the caller plus `threads - 1`
//! workers that spin for a while after each job and then park.
//!
//! Rayon's `install` from a thread outside its pool puts the caller to sleep
//! on a latch and wakes a worker from sleep for every op: ~15 µs per hand-off
//! on the 2-core dev box, more than a whole decode matmul of a small model.
//! Here the caller publishes a job by bumping one atomic word, does its share
//! of the tasks, and waits only for the workers that joined; a worker that
//! finished the previous op a few µs ago is still spinning and joins within
//! a cache-line transfer. Workers park after [`SPIN`] without a job, so an
//! idle engine burns no CPU.
//!
//! One job runs at a time. A second caller (another thread, or a task that
//! calls back into the team) runs its tasks itself, serially: it never waits.
//!
//! Unsafe code, and why it is sound: a job lives on the caller's stack and
//! workers reach it through a raw pointer. [`Team::run`] does not return, nor
//! unwind, before every worker that joined the job has said it is done with
//! it, and a worker that did not join never touches it.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a worker spins for the next job before it parks. A decode step
/// runs a few µs of serial work (norms, rope, sampling) between parallel
/// ops; a parked worker takes ~10-50 µs to wake, so it must not park inside
/// a step, yet an idle engine should go quiet quickly.
const SPIN: Duration = Duration::from_micros(200);

/// `state`: generation in the high 32 bits, then the closed flag, then the
/// number of workers that joined the generation's job.
const CLOSED: u64 = 1 << 31;
const JOINED: u64 = CLOSED - 1;

fn generation(state: u64) -> u64 {
    state >> 32
}

/// One call of [`Team::run`], on the caller's stack.
///
/// The tasks are split into one contiguous range per thread, claimed in
/// order by its owner: consecutive tasks are usually consecutive weight
/// rows, and a thread that streams one run of rows keeps the hardware
/// prefetchers and DRAM pages on its side. Interleaving the threads' rows
/// task by task cost about 40% of two-thread decode speed when the weights
/// came from DRAM (a 64 MB Q4_0 set: 14 GB/s against 22 when each thread
/// read its own half). A thread that runs out of its range takes tasks from
/// the others', so a slow or absent worker holds nothing up.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
    n_tasks: usize,
    /// Per thread (the caller first): the next task of its range.
    next: &'a [Slot],
    /// Workers done with this job (they never touch it afterwards).
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

/// A thread's claim counter, on a cache line of its own so that claiming
/// from one's own range does not bounce a line between cores.
#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicUsize);

impl Job<'_> {
    /// The first task of thread `slot`'s range (`slot == threads`: the end).
    fn start(&self, slot: usize) -> usize {
        slot * self.n_tasks / self.next.len()
    }

    /// Claims and runs tasks until none are left: first thread `me`'s own
    /// range, then the others' in turn.
    fn work(&self, me: usize) {
        let threads = self.next.len();
        for k in 0..threads {
            let slot = (me + k) % threads;
            let end = self.start(slot + 1);
            loop {
                let i = self.next[slot].0.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                (self.task)(i);
            }
        }
    }
}

struct Shared {
    state: AtomicU64,
    /// The current generation's [`Job`], valid while its generation is open
    /// or any worker that joined it is not yet done.
    job: AtomicPtr<()>,
    /// Per worker: parked, or about to park (the caller must unpark it).
    parked: Vec<AtomicBool>,
    shutdown: AtomicBool,
}

/// The caller plus `threads - 1` persistent workers.
pub(crate) struct Team {
    shared: Arc<Shared>,
    /// Held by the caller of the job in flight, with the job's claim
    /// counters (one per thread).
    running: Mutex<Box<[Slot]>>,
    workers: Vec<(Thread, Option<JoinHandle<()>>)>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads())
            .finish()
    }
}

impl Team {
    /// A team of `threads` (≥ 1) threads: the caller and `threads - 1` workers.
    pub(crate) fn new(threads: usize) -> std::io::Result<Team> {
        let n_workers = threads.max(1) - 1;
        let shared = Arc::new(Shared {
            state: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            parked: (0..n_workers).map(|_| AtomicBool::new(false)).collect(),
            shutdown: AtomicBool::new(false),
        });
        let mut team = Team {
            shared: shared.clone(),
            running: Mutex::new((0..=n_workers).map(|_| Slot::default()).collect()),
            workers: Vec::with_capacity(n_workers),
        };
        for i in 0..n_workers {
            let shared = shared.clone();
            // On failure `team` drops here and stops the workers already started.
            let handle = thread::Builder::new()
                .name(format!("bulkhead-kernels-{}", i + 1))
                .spawn(move || worker(&shared, i))?;
            team.workers.push((handle.thread().clone(), Some(handle)));
        }
        Ok(team)
    }

    /// Threads that run a job, the caller included.
    pub(crate) fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `task(i)` for every `i` in `0..n_tasks`, each exactly once, on
    /// the caller and the workers; returns when all are done. A panic in a
    /// task is re-raised here once every thread has left the job.
    pub(crate) fn run(&self, n_tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let slots = match self.running.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return (0..n_tasks).for_each(task),
        };
        if n_tasks <= 1 || self.workers.is_empty() {
            return (0..n_tasks).for_each(task);
        }
        let job = Job {
            task,
            n_tasks,
            next: &slots,
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
        };
        for (i, slot) in slots.iter().enumerate() {
            // Published to the workers by the SeqCst store of `state` below.
            slot.0.store(job.start(i), Ordering::Relaxed);
        }
        let s = &*self.shared;
        s.job.store(
            (&job as *const Job<'_>).cast_mut().cast(),
            Ordering::Relaxed,
        );
        let next_gen = (generation(s.state.load(Ordering::Relaxed)) + 1) & u64::from(u32::MAX);
        // SeqCst pairs with a parking worker's SeqCst store of `parked` then
        // load of `state`: either it sees this job or we see it parked.
        s.state.store(next_gen << 32, Ordering::SeqCst);
        for ((thread, _), parked) in self.workers.iter().zip(&s.parked) {
            if parked.load(Ordering::SeqCst) {
                thread.unpark();
            }
        }
        // Closes the job and waits for the workers in it, also when a task
        // of ours unwinds: only then may `job` go out of scope.
        let close = CloseOnDrop {
            shared: s,
            job: &job,
        };
        job.work(0);
        drop(close);
        let panic = job.panic.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }

    /// Splits `data` into chunks of `chunk` elements (the last may be
    /// shorter) and runs `f(index, chunk)` on each, across the team.
    pub(crate) fn chunks_mut<T: Send>(
        &self,
        data: &mut [T],
        chunk: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        assert!(chunk > 0, "chunks_mut: chunk of 0 elements");
        let len = data.len();
        let base = SendPtr(data.as_mut_ptr());
        let task = |i: usize| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: `run` hands out each `i` exactly once, so the ranges
            // `start..start + n` are disjoint and inside `data`, which stays
            // mutably borrowed (by us) until `run` returns.
            let part = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
            f(i, part);
        };
        self.run(len.div_ceil(chunk), &task);
    }
}

/// A pointer to `chunks_mut`'s data that tasks on other threads may use.
struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    /// Through a method, so closures capture the whole `SendPtr` (and its
    /// `Sync`), not the raw pointer field.
    fn get(&self) -> *mut T {
        self.0
    }
}

// SAFETY: only used by `chunks_mut`, whose tasks touch disjoint elements;
// `T: Send` lets those elements be used from another thread.
unsafe impl<T: Send> Sync for SendPtr<T> {}

struct CloseOnDrop<'a> {
    shared: &'a Shared,
    job: &'a Job<'a>,
}

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        let state = self.shared.state.fetch_or(CLOSED, Ordering::AcqRel);
        let joined = (state & JOINED) as usize;
        let mut spins = 0u32;
        while self.job.done.load(Ordering::Acquire) != joined {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                // A joined worker may have been descheduled: let it run.
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.shared
            .job
            .store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}

fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let Some(state) = next_generation(s, index, seen) else {
            return;
        };
        let this = generation(state);
        if try_join(s, state) {
            let job = s.job.load(Ordering::Acquire).cast::<Job<'_>>().cast_const();
            // SAFETY: we joined the job while its generation was open, so the
            // caller waits for our `done` below before the job goes away.
            let job = unsafe { &*job };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job.work(index + 1))) {
                *job.panic.lock().unwrap_or_else(|p| p.into_inner()) = Some(payload);
            }
            // Our last touch of the job.
            job.done.fetch_add(1, Ordering::Release);
        }
        seen = this;
    }
}

/// Counts this worker into the job of `state`'s generation if it is still
/// open; false if it closed or a newer one replaced it.
fn try_join(s: &Shared, mut state: u64) -> bool {
    let this = generation(state);
    loop {
        if state & CLOSED != 0 {
            return false;
        }
        match s
            .state
            .compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) if generation(now) == this => state = now,
            Err(_) => return false,
        }
    }
}

/// Waits for a generation other than `seen`: spins for [`SPIN`], then parks.
/// `None` on shutdown.
fn next_generation(s: &Shared, index: usize, seen: u64) -> Option<u64> {
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        let state = s.state.load(Ordering::Acquire);
        if s.shutdown.load(Ordering::Relaxed) {
            return None;
        }
        if generation(state) != seen {
            return Some(state);
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && started.elapsed() > SPIN {
            break;
        }
    }
    let parked = &s.parked[index];
    parked.store(true, Ordering::SeqCst);
    loop {
        let state = s.state.load(Ordering::SeqCst);
        if s.shutdown.load(Ordering::SeqCst) {
            parked.store(false, Ordering::Relaxed);
            return None;
        }
        if generation(state) != seen {
            parked.store(false, Ordering::Relaxed);
            return Some(state);
        }
        thread::park();
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for (thread, handle) in &mut self.workers {
            thread.unpark();
            if let Some(handle) = handle.take() {
                let _ = handle.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in 1..=4 {
            let team = Team::new(threads).unwrap();
            for n_tasks in [0, 1, 2, 7, 64, 1000] {
                let counts: Vec<AtomicU32> = (0..n_tasks).map(|_| AtomicU32::new(0)).collect();
                team.run(n_tasks, &|i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                    "threads {threads}, tasks {n_tasks}"
                );
            }
        }
    }

    #[test]
    fn workers_take_tasks() {
        // Slow tasks give the worker time to join: more than one thread runs them.
        let team = Team::new(2).unwrap();
        let ids = Mutex::new(std::collections::HashSet::new());
        for _ in 0..20 {
            team.run(8, &|_| {
                ids.lock().unwrap().insert(thread::current().id());
                thread::sleep(Duration::from_millis(1));
            });
        }
        assert_eq!(ids.lock().unwrap().len(), 2);
    }

    #[test]
    fn parked_workers_wake_for_the_next_job() {
        let team = Team::new(3).unwrap();
        let sum = AtomicUsize::new(0);
        for round in 0..5 {
            // Long enough for every worker to park.
            thread::sleep(SPIN * 5);
            team.run(100, &|i| {
                sum.fetch_add(i, Ordering::Relaxed);
            });
            assert_eq!(sum.load(Ordering::Relaxed), (round + 1) * 4950);
        }
    }

    #[test]
    fn chunks_mut_covers_every_element_once() {
        let team = Team::new(2).unwrap();
        let mut data = vec![0usize; 1001];
        team.chunks_mut(&mut data, 64, |c, part| {
            for (j, x) in part.iter_mut().enumerate() {
                *x += c * 64 + j;
            }
        });
        assert!(data.iter().enumerate().all(|(i, &x)| x == i));
    }

    #[test]
    fn a_task_panic_reaches_the_caller_and_the_team_still_works() {
        let team = Team::new(2).unwrap();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            team.run(64, &|i| {
                if i == 40 {
                    panic!("task 40 failed");
                }
            })
        }));
        let payload = caught.expect_err("the panic must reach the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"task 40 failed"));
        let n = AtomicUsize::new(0);
        team.run(64, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 64);
    }

    #[test]
    fn a_nested_or_concurrent_call_runs_serially() {
        let team = Team::new(2).unwrap();
        let n = AtomicUsize::new(0);
        team.run(4, &|_| {
            team.run(3, &|_| {
                n.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(n.load(Ordering::Relaxed), 12);
        let team = Arc::new(team);
        let total = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let (team, total) = (team.clone(), total.clone());
                thread::spawn(move || {
                    for _ in 0..200 {
                        team.run(16, &|_| {
                            total.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(total.load(Ordering::Relaxed), 4 * 200 * 16);
    }
}
