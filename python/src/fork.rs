//! What a forked child does with the objects it inherits.
//!
//! `os.fork()` (and `multiprocessing` with the `fork` start method) copies
//! the parent's nodes, publishers and subscriptions into the child, but
//! not their threads; their libzmq sockets and wake-up file descriptors
//! still belong to the parent. A child that used one, or merely dropped it
//! (at its exit, when the interpreter clears its objects), would wake the
//! parent's libzmq threads with commands they never find, and libzmq
//! aborts the parent; a sample read from shared memory, dropped in the
//! child, would release its slot under the parent's feet. So in a child,
//! every object inherited this way refuses to be used (`Closed`, saying
//! why), its `close()` does nothing, and dropping it lets it go without a
//! word to libzmq or to shared memory. Nodes opened in the child are its
//! own and work as usual (docs/python.md, "Processes").

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors;

/// How many forks lie between the process that imported the module and
/// this one: each child adds one (`os.register_at_fork`).
static FORKS: AtomicU64 = AtomicU64::new(0);

#[pyfunction]
fn after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// Has every child `os.fork` makes from now on count itself.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("after_in_child", wrap_pyfunction!(after_fork_in_child, m)?)?;
    py.import("os")?
        .call_method("register_at_fork", (), Some(&kwargs))?;
    Ok(())
}

/// The process an object was made in, as the forks since the import.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Born(u64);

impl Born {
    /// This process.
    pub(crate) fn now() -> Born {
        Born(FORKS.load(Ordering::Relaxed))
    }

    /// Whether this process is a fork of the one the object was made in.
    pub(crate) fn inherited(self) -> bool {
        self.0 != FORKS.load(Ordering::Relaxed)
    }

    /// `Closed` if the object (`what`) was inherited through a fork.
    pub(crate) fn check(self, py: Python<'_>, what: &str) -> PyResult<()> {
        if self.inherited() {
            return Err(errors::raise(
                py,
                "Closed",
                format!(
                    "this {what} belongs to the process that forked this one (its sockets and threads stayed there); open a node in this process with milonga.open"
                ),
            ));
        }
        Ok(())
    }

    /// Drops `v`, or, in a forked child, lets it go untouched.
    pub(crate) fn release<T>(self, v: T) {
        if self.inherited() {
            std::mem::forget(v);
        } else {
            drop(v);
        }
    }

    /// [`Born::release`], the interpreter released while `v` drops: a
    /// node or subscription closing waits for its threads (a service's
    /// workers among them, which may be waiting for the interpreter to run
    /// a handler), as their `close()` does.
    pub(crate) fn release_detached<T: Send>(self, v: T) {
        if self.inherited() {
            std::mem::forget(v);
        } else {
            Python::attach(|py| py.detach(|| drop(v)));
        }
    }

    /// [`Born::release`] of what `slot` holds, for a `Drop` (no lock is
    /// taken: a forked child's copy of a lock may be held for ever).
    pub(crate) fn release_mutex<T>(self, slot: &mut Mutex<Option<T>>) {
        self.release(
            slot.get_mut()
                .map_or_else(|e| e.into_inner().take(), Option::take),
        );
    }

    /// [`Born::release_mutex`] for a `RwLock`, the interpreter released
    /// ([`Born::release_detached`]).
    pub(crate) fn release_rwlock<T: Send>(self, slot: &mut RwLock<Option<T>>) {
        self.release_detached(
            slot.get_mut()
                .map_or_else(|e| e.into_inner().take(), Option::take),
        );
    }
}
