//! What every layer uses and that depends on no other layer: locks taken
//! over when poisoned, the wall clock, counters, rate-limited logging and
//! the calls into the C library.

use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

#[macro_use]
pub(crate) mod log_limit;
pub(crate) mod stats;
#[allow(unsafe_code)]
pub(crate) mod sys;

/// FNV-1a 64 of `bytes`: the short, stable hash the protocol names
/// (docs/protocol.md: service tags, file domains, the broker's frame
/// streams). Not for untrusted keys of a map that must resist floods.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The lock, taken over if another thread panicked while holding it: a
/// panic in one thread must not take every other thread of the node down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock if it is free now (a poisoned lock is taken over, as [`lock`]
/// does), else `None`.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Nanoseconds since the Unix epoch (0 if the clock is before it): the
/// source timestamp of every frame.
pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
