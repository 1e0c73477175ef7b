//! The command's calls into the C library and into libzmq beyond the safe
//! `zmq` crate (the raw baseline of `bench` needs what Milonga's engine
//! does: ZMQ_XPUB_NODROP and zero-copy sends), each behind a safe
//! function: the only module where `unsafe` is allowed
//! (`#![deny(unsafe_code)]` in main.rs).

use anyhow::{bail, Result};
use milonga::Bytes;

extern "C" fn on_signal(_: libc::c_int) {
    crate::INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Makes SIGINT, SIGTERM and SIGHUP (the terminal or the ssh session
/// closed) set `crate::INTERRUPTED`; SIGHUP only if it is not ignored
/// (`nohup milonga broker &` goes on after the session closes).
pub(crate) fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        let old = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
        if sig == libc::SIGHUP && old == libc::SIG_IGN {
            // SAFETY: putting back the disposition the process had.
            unsafe { libc::signal(sig, libc::SIG_IGN) };
        }
    }
}

/// Asks the kernel to send this process `signal` when its parent dies.
pub(crate) fn die_with_parent(signal: i32) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and has no
    // memory effects.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal) };
}

/// Sends `signal` to process `pid` (a child of ours). A pid that is not a
/// positive `pid_t` is ignored (as a negative one, kill would signal a
/// process group).
pub(crate) fn signal(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid, signal) };
}

pub(crate) fn set_xpub_nodrop(s: &mut zmq::Socket, on: bool) -> Result<()> {
    let v: std::os::raw::c_int = on.into();
    // SAFETY: valid socket, integer option of the size passed.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            s.as_mut_ptr(),
            zmq_sys::ZMQ_XPUB_NODROP as _,
            (&v as *const std::os::raw::c_int).cast(),
            std::mem::size_of_val(&v),
        )
    };
    if rc != 0 {
        bail!("cannot set ZMQ_XPUB_NODROP");
    }
    Ok(())
}

unsafe extern "C" fn free_shared(
    _data: *mut std::os::raw::c_void,
    hint: *mut std::os::raw::c_void,
) {
    // SAFETY: `hint` is the Box<Bytes> leaked by `send_shared`, handed back
    // once by libzmq.
    drop(unsafe { Box::from_raw(hint.cast::<Bytes>()) });
}

/// Sends `data` as one frame without copying it (zmq_msg_init_data with a
/// reference on the buffer as the hint).
pub(crate) fn send_shared(s: &mut zmq::Socket, data: &Bytes) -> Result<()> {
    let hint = Box::into_raw(Box::new(data.clone()));
    let mut msg = zmq_sys::zmq_msg_t::default();
    // SAFETY: the buffer lives while the Box<Bytes> behind `hint` lives;
    // libzmq calls `free_shared` once when done and never writes to it.
    let rc = unsafe {
        zmq_sys::zmq_msg_init_data(
            &mut msg,
            data.as_ptr() as *mut _,
            data.len(),
            Some(free_shared),
            hint.cast(),
        )
    };
    if rc != 0 {
        // SAFETY: init failed: the hint was not taken.
        drop(unsafe { Box::from_raw(hint) });
        bail!("zmq_msg_init_data failed");
    }
    // SAFETY: initialised message, valid socket used by this thread only.
    let rc = unsafe { zmq_sys::zmq_msg_send(&mut msg, s.as_mut_ptr(), 0) };
    if rc < 0 {
        // SAFETY: a failed send leaves the message with us.
        unsafe { zmq_sys::zmq_msg_close(&mut msg) };
        bail!("zmq_msg_send failed");
    }
    Ok(())
}

/// This process's CPU time (user and system, nanoseconds), its ended
/// threads' included (`getrusage(RUSAGE_SELF)`); 0 if it fails.
pub fn cpu_time_ns() -> u64 {
    rusage_ns(libc::RUSAGE_SELF)
}

/// The calling thread's CPU time (user and system, nanoseconds, to the
/// microsecond: `getrusage(RUSAGE_THREAD)`); 0 if it fails.
pub fn thread_cpu_time_ns() -> u64 {
    rusage_ns(libc::RUSAGE_THREAD)
}

fn rusage_ns(who: libc::c_int) -> u64 {
    // SAFETY: a zeroed `rusage` (integers and timevals) is a valid one.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage` for the call's length.
    if unsafe { libc::getrusage(who, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (us(u.ru_utime) + us(u.ru_stime)) * 1000
}

/// Whether stdout is a pipe (or socket) whose reader has gone: `poll`
/// says an error on its write end.
pub fn stdout_reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & libc::POLLERR != 0
}
