//! The engine's compile slots, shared fairly among tenants.
//!
//! At most `slots` compiles run at once. Each tenant has at most one
//! compile running or waiting: a second upload while one is in progress is
//! refused at once (the tenant's own limit). When every slot is taken, an
//! upload waits for one, up to `max_wait`, in arrival order; since a tenant
//! holds at most one place, a tenant that uploads in a loop waits behind
//! every other tenant's one upload and can never hold more than one slot.
//! A slot is held by the compiler thread until it ends, also past the
//! compile budget when the upload was already refused as too slow, so a
//! component that compiles forever holds its tenant's one place.
//! The gateway's own compiles (the store loading at start) have no tenant
//! and only wait their turn.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::PluginError;

/// Who asks to compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiler<'a> {
    /// A tenant's upload.
    Tenant(&'a str),
    /// The gateway itself (the store's contents at start).
    Gateway,
}

#[derive(Debug)]
pub(crate) struct CompileQueue {
    slots: usize,
    max_wait: Duration,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// Tenants with a compile running or waiting.
    tenants: BTreeSet<String>,
    /// Tickets in arrival order; the front one takes the next free slot.
    waiting: VecDeque<u64>,
    next_ticket: u64,
}

/// A compile slot (and its tenant's place), given back when dropped.
#[derive(Debug)]
pub(crate) struct CompileSlot {
    queue: Arc<CompileQueue>,
    tenant: Option<String>,
}

impl CompileQueue {
    pub(crate) fn new(slots: usize, max_wait: Duration) -> Arc<CompileQueue> {
        Arc::new(CompileQueue {
            slots,
            max_wait,
            state: Mutex::default(),
            freed: Condvar::new(),
        })
    }

    /// A slot for `who`, waiting for one up to `max_wait`. Refused at once
    /// with [`PluginError::TenantCompileBusy`] while the tenant has another
    /// compile running or waiting; after the wait with
    /// [`PluginError::CompileBusy`]. Blocks: call it from a blocking thread.
    pub(crate) fn acquire(self: &Arc<Self>, who: Compiler<'_>) -> Result<CompileSlot, PluginError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let tenant = match who {
            Compiler::Tenant(tenant) => {
                if !state.tenants.insert(tenant.to_owned()) {
                    return Err(PluginError::TenantCompileBusy {
                        tenant: tenant.to_owned(),
                    });
                }
                Some(tenant.to_owned())
            }
            Compiler::Gateway => None,
        };
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push_back(ticket);
        let deadline = Instant::now() + self.max_wait;
        loop {
            if state.running < self.slots && state.waiting.front() == Some(&ticket) {
                state.waiting.pop_front();
                state.running += 1;
                // The next in line may fit a slot too.
                self.freed.notify_all();
                return Ok(CompileSlot {
                    queue: Arc::clone(self),
                    tenant,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                state.waiting.retain(|t| *t != ticket);
                if let Some(tenant) = &tenant {
                    state.tenants.remove(tenant);
                }
                let in_flight = state.running;
                // The one behind may be at the front now.
                self.freed.notify_all();
                return Err(PluginError::CompileBusy { in_flight });
            }
            state = self
                .freed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        let mut state = self
            .queue
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.running -= 1;
        if let Some(tenant) = &self.tenant {
            state.tenants.remove(tenant);
        }
        self.queue.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::thread;

    use super::*;

    const LONG: Duration = Duration::from_secs(30);

    /// Starts a thread that waits for a slot for `tenant`, then reports
    /// (tenant, the slot) on `tx`.
    fn waiter(
        queue: &Arc<CompileQueue>,
        tenant: &'static str,
        tx: &mpsc::Sender<(&'static str, CompileSlot)>,
    ) -> thread::JoinHandle<()> {
        let (queue, tx) = (Arc::clone(queue), tx.clone());
        thread::spawn(move || {
            let slot = queue.acquire(Compiler::Tenant(tenant)).unwrap();
            tx.send((tenant, slot)).unwrap();
        })
    }

    /// Waits (bounded) until `n` tickets wait in `queue`.
    fn until_waiting(queue: &CompileQueue, n: usize) {
        let deadline = Instant::now() + LONG;
        while queue.state.lock().unwrap().waiting.len() < n {
            assert!(Instant::now() < deadline, "never {n} waiting");
            thread::yield_now();
        }
    }

    #[test]
    fn a_tenant_holds_one_place_and_slots_go_in_arrival_order() {
        let queue = CompileQueue::new(1, LONG);
        let first = queue.acquire(Compiler::Tenant("flood")).unwrap();
        // The flooder's second upload is refused at once, not queued.
        assert!(matches!(
            queue.acquire(Compiler::Tenant("flood")),
            Err(PluginError::TenantCompileBusy { ref tenant }) if tenant == "flood"
        ));
        let (tx, rx) = mpsc::channel();
        let b = waiter(&queue, "b", &tx);
        until_waiting(&queue, 1);
        let c = waiter(&queue, "c", &tx);
        until_waiting(&queue, 2);
        // The flooder's next upload queues behind both.
        drop(first);
        let (got, slot) = rx.recv().unwrap();
        assert_eq!(got, "b");
        let flood = {
            let queue = Arc::clone(&queue);
            thread::spawn(move || queue.acquire(Compiler::Tenant("flood")).map(drop))
        };
        until_waiting(&queue, 2);
        drop(slot);
        let (got, slot) = rx.recv().unwrap();
        assert_eq!(got, "c");
        drop(slot);
        flood.join().unwrap().unwrap();
        b.join().unwrap();
        c.join().unwrap();
    }

    #[test]
    fn a_wait_past_its_limit_is_refused_and_leaves_its_place() {
        let queue = CompileQueue::new(1, Duration::from_millis(20));
        let held = queue.acquire(Compiler::Gateway).unwrap();
        assert!(matches!(
            queue.acquire(Compiler::Tenant("late")),
            Err(PluginError::CompileBusy { in_flight: 1 })
        ));
        drop(held);
        // Its place was given back: it may try again.
        drop(queue.acquire(Compiler::Tenant("late")).unwrap());
        assert_eq!(queue.state.lock().unwrap().running, 0);
    }

    #[test]
    fn no_slots_refuse_after_the_wait() {
        let queue = CompileQueue::new(0, Duration::ZERO);
        assert!(matches!(
            queue.acquire(Compiler::Gateway),
            Err(PluginError::CompileBusy { in_flight: 0 })
        ));
    }
}
