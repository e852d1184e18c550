//! The gateway-wide cap on plugin code running at once, shared fairly
//! between tenants.
//!
//! A hook may burn a full core up to its deadline. Without a cap, one
//! tenant sending requests whose plugin loops can keep every core busy, and
//! every other tenant's requests (plugins or not) wait for time slices. The
//! gate lets at most `slots` hook runs hold a core at once; by default one
//! fewer than the machine's cores, so plugin code never takes the last core
//! from the request path (parsing, streaming, the gpu-host on a shared box).
//!
//! Waiting hook runs queue per tenant, and a freed slot goes to the next
//! tenant in turn (round robin), so a tenant with many requests queued does
//! not delay another tenant's next hook by more than one run per tenant
//! ahead of it. A [`GatePass`] is released when dropped: it moves onto the
//! hook's thread with the hook, so a slot stays taken until the guest code
//! has really stopped, even when the request that started it is gone.
//!
//! Hooks run on the gate's own threads ([`HookGate::spawn`]), at most one
//! per slot, started as needed, at a lower CPU priority (nice
//! [`HOOK_THREAD_NICE`]): when the machine is busy, the request path's
//! threads win the core from a looping guest at once instead of waiting out
//! its time slice.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, PoisonError, mpsc};

use tokio::sync::oneshot;

/// The most slots an operator may configure: far above any core count, and
/// low enough that a typo cannot turn the cap off in practice.
pub const MAX_GATE_SLOTS: usize = 1024;

/// The nice value of the threads hooks run on. 10 gives a thread about a
/// tenth of the CPU weight of a normal one (nice 0) when they compete, and
/// leaves room below for an operator who runs the whole gateway niced.
pub const HOOK_THREAD_NICE: i32 = 10;

/// Stack of a hook thread: the guest's stack (`MAX_WASM_STACK_BYTES`, 512
/// KiB) plus wasmtime's and our frames, with room to spare.
const HOOK_THREAD_STACK_BYTES: usize = 4 << 20;

/// The default number of slots: one fewer than the cores this process may
/// run on, at least one.
pub fn default_gate_slots() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().saturating_sub(1))
        .max(1)
}

/// The cap; clone the `Arc` to share it.
#[derive(Debug)]
pub struct HookGate {
    slots: usize,
    state: Mutex<GateState>,
    threads: Mutex<Threads>,
}

type Job = Box<dyn FnOnce() + Send>;

/// The hook threads: started one at a time as passes need them, never more
/// than `slots`; each takes jobs from one queue.
#[derive(Debug)]
struct Threads {
    started: usize,
    jobs: mpsc::Sender<Job>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
}

#[derive(Debug, Default)]
struct GateState {
    free: usize,
    /// Tenants with waiting runs, in the order they are served next; each
    /// tenant appears at most once.
    turns: VecDeque<TenantQueue>,
}

#[derive(Debug)]
struct TenantQueue {
    tenant: Arc<str>,
    waiting: VecDeque<oneshot::Sender<GatePass>>,
}

/// One slot, held until dropped.
#[derive(Debug)]
pub struct GatePass {
    /// `None` once handed back (or while being handed on).
    gate: Option<Arc<HookGate>>,
}

impl HookGate {
    /// A gate of `slots` (clamped to `1..=MAX_GATE_SLOTS`).
    pub fn new(slots: usize) -> Arc<HookGate> {
        let slots = slots.clamp(1, MAX_GATE_SLOTS);
        let (jobs, queue) = mpsc::channel();
        Arc::new(HookGate {
            slots,
            state: Mutex::new(GateState {
                free: slots,
                turns: VecDeque::new(),
            }),
            threads: Mutex::new(Threads {
                started: 0,
                jobs,
                queue: Arc::new(Mutex::new(queue)),
            }),
        })
    }

    /// Runs `job` on a hook thread, holding `pass` until it returns (or
    /// panics): passes bound the jobs in flight, so a thread is free or
    /// about to be. A job that panics takes nothing down with it: whatever
    /// it was to send back is dropped unsent.
    pub fn spawn(&self, pass: GatePass, job: impl FnOnce() + Send + 'static) {
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        if threads.started < self.in_use() {
            let queue = Arc::clone(&threads.queue);
            let started = std::thread::Builder::new()
                .name(format!("plugin-hooks-{}", threads.started))
                .stack_size(HOOK_THREAD_STACK_BYTES)
                .spawn(move || hook_thread(&queue));
            match started {
                Ok(_) => threads.started += 1,
                // The threads already started serve the job, later.
                Err(e) => tracing::error!("could not start a plugin hook thread: {e}"),
            }
        }
        // The receiving side lives as long as the gate's threads, which
        // never exit while the gate (holding the sender) exists.
        let _ = threads.jobs.send(Box::new(move || {
            let _held = pass;
            job();
        }));
    }

    /// Hook threads started so far.
    pub fn threads(&self) -> usize {
        self.threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .started
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Slots held now.
    pub fn in_use(&self) -> usize {
        self.slots - self.lock().free
    }

    /// Runs waiting for a slot, all tenants together.
    pub fn waiting(&self) -> usize {
        let state = self.lock();
        let queued = state.turns.iter().flat_map(|q| &q.waiting);
        queued.filter(|sender| !sender.is_closed()).count()
    }

    /// A slot for one hook run of `tenant`: at once when one is free and
    /// nobody waits, else when the tenant's turn comes. Dropping the future
    /// gives up the place in the queue (and a slot handed to it meanwhile).
    pub async fn enter(self: &Arc<Self>, tenant: &Arc<str>) -> GatePass {
        let receiver = {
            let mut state = self.lock();
            if state.free > 0 && state.turns.is_empty() {
                state.free -= 1;
                return GatePass {
                    gate: Some(Arc::clone(self)),
                };
            }
            let (sender, receiver) = oneshot::channel();
            match state.turns.iter_mut().find(|q| q.tenant == *tenant) {
                Some(queue) => queue.waiting.push_back(sender),
                None => state.turns.push_back(TenantQueue {
                    tenant: Arc::clone(tenant),
                    waiting: VecDeque::from([sender]),
                }),
            }
            receiver
        };
        // The gate is alive (we hold an `Arc`), and a sender is only dropped
        // after a pass was sent through it or when the waiter is gone.
        receiver.await.expect("the gate hands every waiter a pass")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // The state is consistent after every statement: a panic elsewhere
        // cannot leave it half-changed.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot came free: hand it to the next tenant's oldest waiter that is
    /// still there, or keep it.
    fn release(self: &Arc<Self>) {
        let mut state = self.lock();
        while let Some(mut queue) = state.turns.pop_front() {
            let next = queue.waiting.pop_front();
            if !queue.waiting.is_empty() {
                state.turns.push_back(queue);
            }
            let Some(sender) = next else { continue };
            let pass = GatePass {
                gate: Some(Arc::clone(self)),
            };
            match sender.send(pass) {
                Ok(()) => return,
                // The waiter gave up: take the pass back without releasing it
                // again (we hold the lock) and try the next one.
                Err(mut unsent) => {
                    unsent.gate = None;
                }
            }
        }
        state.free += 1;
    }
}

/// A hook thread: lowers its own priority, then runs jobs until the gate
/// is gone.
fn hook_thread(queue: &Mutex<mpsc::Receiver<Job>>) {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), HOOK_THREAD_NICE) {
        tracing::warn!("plugin hook thread runs at normal CPU priority: setpriority failed: {e}");
    }
    loop {
        let job = {
            let queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
            match queue.recv() {
                Ok(job) => job,
                Err(mpsc::RecvError) => return,
            }
        };
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("a plugin hook job panicked; its request fails, the thread goes on");
        }
    }
}

impl Drop for GatePass {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn tenant(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    /// Polls `future` once: `Some` if it finished.
    fn now<F: std::future::Future>(future: F) -> Option<F::Output> {
        let mut future = std::pin::pin!(future);
        let waker = std::task::Waker::noop();
        match future
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
        {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn at_most_slots_passes_are_out_and_a_freed_one_goes_to_a_waiter() {
        let gate = HookGate::new(2);
        let a = tenant("a");
        let first = gate.enter(&a).await;
        let second = gate.enter(&a).await;
        let mut third = Box::pin(gate.enter(&a));
        assert!(now(third.as_mut()).is_none(), "no third slot");
        assert_eq!(gate.waiting(), 1);
        drop(first);
        let third = third.await;
        assert_eq!(gate.waiting(), 0);
        drop((second, third));
        assert_eq!(gate.lock().free, 2, "every slot back");
    }

    #[tokio::test]
    async fn freed_slots_go_to_tenants_in_turn_not_in_arrival_order() {
        let gate = HookGate::new(1);
        let (a, b) = (tenant("a"), tenant("b"));
        let held = gate.enter(&a).await;
        let (sender, mut order) = tokio::sync::mpsc::unbounded_channel();
        // Tenant a queues three runs, then b one: b's goes second.
        let mut tasks = Vec::new();
        for (who, label) in [(&a, "a1"), (&a, "a2"), (&a, "a3"), (&b, "b1")] {
            let (shared, who, sender) = (Arc::clone(&gate), Arc::clone(who), sender.clone());
            tasks.push(tokio::spawn(async move {
                let pass = shared.enter(&who).await;
                sender.send((label, pass)).expect("receiver open");
            }));
            // Queued before the next one is spawned.
            while gate.waiting() < tasks.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        let mut served = Vec::new();
        for _ in 0..4 {
            let (label, pass) = order.recv().await.expect("served");
            served.push(label);
            drop(pass);
        }
        assert_eq!(served, ["a1", "b1", "a2", "a3"]);
        for task in tasks {
            task.await.expect("task");
        }
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_loses_its_place_and_no_slot_leaks() {
        let gate = HookGate::new(1);
        let (a, b) = (tenant("a"), tenant("b"));
        let held = gate.enter(&a).await;
        let mut gone = Box::pin(gate.enter(&b));
        assert!(now(gone.as_mut()).is_none());
        let mut next = Box::pin(gate.enter(&a));
        assert!(now(next.as_mut()).is_none());
        drop(gone);
        drop(held);
        let pass = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the slot skips the waiter that left");
        drop(pass);
        assert_eq!(gate.lock().free, 1);

        // A pass sent to a waiter that is dropped before it looks comes back.
        let held = gate.enter(&a).await;
        let mut late = Box::pin(gate.enter(&b));
        assert!(now(late.as_mut()).is_none());
        drop(held); // sent into `late`'s channel, not yet received
        drop(late);
        assert_eq!(gate.lock().free, 1, "the unreceived pass was released");
        assert!(now(gate.enter(&a)).is_some());
    }

    /// The nice value of the calling thread, from procfs.
    fn my_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("procfs");
        // Fields after the command (which may hold spaces): state is field
        // 3, nice field 19.
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        after
            .split(' ')
            .nth(16)
            .expect("nice")
            .parse()
            .expect("number")
    }

    #[tokio::test]
    async fn hooks_run_on_at_most_slots_niced_threads_and_a_panic_loses_no_thread() {
        let gate = HookGate::new(2);
        let a = tenant("a");
        let (first, second) = (gate.enter(&a).await, gate.enter(&a).await);
        // Both jobs wait for each other: they run on two threads at once.
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let mut seen = Vec::new();
        for pass in [first, second] {
            let (sender, receiver) = oneshot::channel();
            let barrier = Arc::clone(&barrier);
            gate.spawn(pass, move || {
                barrier.wait();
                let _ = sender.send((std::thread::current().name().map(String::from), my_nice()));
            });
            seen.push(receiver);
        }
        for receiver in seen {
            let (name, nice) = receiver.await.expect("ran");
            assert!(name.expect("named").starts_with("plugin-hooks-"));
            assert_eq!(nice, HOOK_THREAD_NICE.max(my_nice()));
        }
        assert_eq!(gate.threads(), 2);

        // A job that panics drops its sender; the thread serves the next.
        let pass = gate.enter(&a).await;
        let (sender, receiver) = oneshot::channel::<()>();
        gate.spawn(pass, move || {
            let _keep = sender;
            panic!("a hook job's bug");
        });
        assert!(receiver.await.is_err(), "nothing sent");
        for _ in 0..4 {
            let pass = gate.enter(&a).await;
            let (sender, receiver) = oneshot::channel();
            gate.spawn(pass, move || {
                let _ = sender.send(());
            });
            receiver.await.expect("served after the panic");
        }
        assert_eq!(gate.threads(), 2, "no more threads than slots");
        // Each pass is dropped just after its job sent its answer.
        while gate.in_use() > 0 {
            tokio::task::yield_now().await;
        }
    }

    #[test]
    fn slots_are_clamped_and_the_default_leaves_a_core() {
        assert_eq!(HookGate::new(0).slots(), 1);
        assert_eq!(HookGate::new(usize::MAX).slots(), MAX_GATE_SLOTS);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(default_gate_slots(), cores.saturating_sub(1).max(1));
    }
}
