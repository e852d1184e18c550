//! The clock plugin deadlines count in: a thread that advances the engine's
//! epoch every [`EPOCH_TICK`], but only while guest code can run.
//!
//! Ticking 1,000 times a second when no plugin runs cost a tenth of the
//! gateway's CPU under load without plugins (a wake-up, a context switch and
//! an atomic add each millisecond; `tests/bench/gateway_overhead`). So the
//! thread parks once no call has been running for [`IDLE_TICKS`] ticks, and
//! the next call to start wakes it. A call's deadline is counted from the
//! epoch when it starts and [`PluginLimits::deadline_ticks`] adds a tick for
//! the one that may come at once, so a parked ticker changes no deadline: it
//! only stops advancing an epoch nobody waits on.
//!
//! [`PluginLimits::deadline_ticks`]: super::limits::PluginLimits

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

use wasmtime::Engine;

use super::limits::EPOCH_TICK;

/// Ticks without a running call before the thread parks: 100 ms, so a
/// steady stream of requests with plugins never pays for waking it.
const IDLE_TICKS: u32 = 100;

/// Advances an engine's epoch while calls run; stops when dropped.
pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    /// Calls (instantiations and hooks) running now.
    running: AtomicUsize,
    /// Epochs advanced so far (tests watch it).
    ticks: AtomicU64,
    state: Mutex<State>,
    /// Wakes the thread from parking or from its tick sleep (on stop).
    wake: Condvar,
}

#[derive(Default)]
struct State {
    parked: bool,
    stop: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is two flags; a panic elsewhere cannot leave them torn.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps the ticker ticking while it lives: hold one across any call into
/// guest code.
pub(crate) struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            running: AtomicUsize::new(0),
            ticks: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let thread = thread::Builder::new()
            .name("plugin-epoch".to_string())
            .spawn({
                let shared = Arc::clone(&shared);
                move || tick(&engine, &shared)
            })?;
        Ok(EpochTicker {
            shared,
            thread: Some(thread),
        })
    }

    /// Marks a call as running (waking the thread if it is parked) until
    /// the guard is dropped.
    pub(crate) fn running(&self) -> Running<'_> {
        let shared = &*self.shared;
        if shared.running.fetch_add(1, Ordering::SeqCst) == 0 {
            // The thread checks `running` under this lock before it parks,
            // so either it sees this call or it is parked and gets the wake.
            let state = shared.lock();
            if state.parked {
                shared.wake.notify_one();
            }
        }
        Running(shared)
    }

    /// Epochs advanced since the ticker started.
    #[cfg(test)]
    pub(crate) fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::SeqCst)
    }

    /// Whether the thread is parked (no call ran for [`IDLE_TICKS`]).
    #[cfg(test)]
    fn is_parked(&self) -> bool {
        self.shared.lock().parked
    }
}

fn tick(engine: &Engine, shared: &Shared) {
    let mut idle = 0;
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        if idle >= IDLE_TICKS && shared.running.load(Ordering::SeqCst) == 0 {
            state.parked = true;
            while shared.running.load(Ordering::SeqCst) == 0 && !state.stop {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.parked = false;
            idle = 0;
            continue;
        }
        // Sleeps one tick unless told to stop (a wake while not parked only
        // brings the next tick forward, which deadlines allow for).
        state = shared
            .wake
            .wait_timeout(state, EPOCH_TICK)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
        if state.stop {
            return;
        }
        engine.increment_epoch();
        shared.ticks.fetch_add(1, Ordering::SeqCst);
        if shared.running.load(Ordering::SeqCst) == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (bounded) until `done` holds; false if it never did.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if done() {
                return true;
            }
            thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn it_ticks_while_a_call_runs_and_parks_when_none_does() {
        let ticker = EpochTicker::start(Engine::default()).unwrap();
        assert!(eventually(|| ticker.is_parked()), "never parked while idle");
        let parked_at = ticker.ticks();
        // Parked: no ticks, however long nobody calls.
        thread::sleep(EPOCH_TICK * 20);
        assert_eq!(ticker.ticks(), parked_at);

        let call = ticker.running();
        assert!(!ticker.is_parked() || eventually(|| !ticker.is_parked()));
        let woke_at = ticker.ticks();
        assert!(
            eventually(|| ticker.ticks() >= woke_at + 5),
            "no ticks while a call runs"
        );
        // Still ticking past the idle threshold while the call runs.
        let before = ticker.ticks();
        assert!(eventually(
            || ticker.ticks() >= before + u64::from(IDLE_TICKS) + 5
        ));
        assert!(!ticker.is_parked());
        drop(call);
        assert!(
            eventually(|| ticker.is_parked()),
            "never parked after the call"
        );
    }

    #[test]
    fn a_call_that_starts_as_it_parks_still_gets_ticks() {
        let ticker = EpochTicker::start(Engine::default()).unwrap();
        for _ in 0..10 {
            assert!(eventually(|| ticker.is_parked()));
            let call = ticker.running();
            let at = ticker.ticks();
            assert!(eventually(|| ticker.ticks() > at), "a call got no ticks");
            drop(call);
        }
    }

    #[test]
    fn it_stops_when_dropped_parked_or_not() {
        let ticker = EpochTicker::start(Engine::default()).unwrap();
        assert!(eventually(|| ticker.is_parked()));
        let started = Instant::now();
        drop(ticker); // joins the thread
        assert!(started.elapsed() < Duration::from_secs(1));

        let ticker = EpochTicker::start(Engine::default()).unwrap();
        drop(ticker.running());
        let started = Instant::now();
        drop(ticker); // ticking, not parked
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
