//! `SCHED_IDLE` for the scrub's hashing thread: such a thread runs only on
//! CPU time no normal thread wants, and a normal thread waking on its CPU
//! preempts it at once. Any thread may move a thread of its own process
//! there; moving it back needs `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20, so
//! nothing here tries (the scrub's watcher, a normal thread, does the
//! hashing itself when the idle one falls behind).
//!
//! rustix does not wrap `sched_setscheduler`, and musl's libc stubs it out
//! (POSIX defines it per process), so this calls the Linux system call,
//! which takes a thread id.

use rustix::thread::Pid;

/// Moves thread `tid` of this process to `SCHED_IDLE`.
#[allow(unsafe_code)]
pub(super) fn set_idle(tid: Pid) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: the system call reads one `sched_param` through the pointer,
    // which points to `param`, alive for the whole call; the other
    // arguments are integers. A thread that is gone gives ESRCH.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_setscheduler,
            libc::c_long::from(tid.as_raw_nonzero().get()),
            libc::c_long::from(libc::SCHED_IDLE),
            &raw const param,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The scheduling policy of thread `tid` (a `libc::SCHED_*` value).
#[cfg(test)]
#[allow(unsafe_code)]
pub(super) fn policy_of(tid: Pid) -> std::io::Result<i32> {
    // SAFETY: the system call takes one integer and returns one.
    let policy = unsafe {
        libc::syscall(
            libc::SYS_sched_getscheduler,
            libc::c_long::from(tid.as_raw_nonzero().get()),
        )
    };
    if policy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SCHED_RESET_ON_FORK may be or-ed in; the policy is the rest.
    Ok((policy & !libc::c_long::from(libc::SCHED_RESET_ON_FORK)) as i32)
}

#[cfg(test)]
mod tests {
    use rustix::thread::gettid;

    use super::*;

    #[test]
    fn a_thread_moved_to_idle_reports_sched_idle_and_others_keep_theirs() {
        let me = gettid();
        let before = policy_of(me).unwrap();
        assert_eq!(before, libc::SCHED_OTHER);
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, finish) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let _ = finish.recv();
        });
        let tid = rx.recv().unwrap();
        set_idle(tid).unwrap();
        assert_eq!(policy_of(tid).unwrap(), libc::SCHED_IDLE);
        assert_eq!(policy_of(me).unwrap(), libc::SCHED_OTHER);
        drop(done);
        other.join().unwrap();
    }

    #[test]
    fn a_thread_that_is_gone_is_an_error_not_another_thread() {
        let tid = std::thread::spawn(gettid).join().unwrap();
        // The id may be reused by a new thread in time, but not this soon
        // on a box that is not forking thousands of threads.
        let err = set_idle(tid).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
    }
}
