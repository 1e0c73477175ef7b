//! `milonga.Loan`: a publisher's buffer to fill in place (docs/python.md,
//! "Loans"), writable through the buffer protocol.

use std::ffi::c_int;
use std::sync::Mutex;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::lock;

/// A buffer lent by `Publisher.loan`: filled through the buffer protocol
/// (`numpy.frombuffer(loan, dtype)`, `memoryview(loan)`), published with
/// `Publisher.put_loan`, which refuses it while a view of it lives.
#[pyclass(frozen, module = "milonga._native", name = "Loan")]
pub(crate) struct Loan {
    state: Mutex<State>,
    born: crate::fork::Born,
}

impl Drop for Loan {
    fn drop(&mut self) {
        // A slot of shared memory, in a forked child, stays the parent's.
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        self.born.release(st.loan.take());
    }
}

struct State {
    /// The loan while it is the caller's; `None` while a put has it, and
    /// once put.
    loan: Option<milonga::Loan>,
    /// A put has it now (it comes back if the put fails).
    putting: bool,
    /// Its size and whether it is a slot of shared memory, kept apart so
    /// that reading them never makes a reference to memory a view may be
    /// writing.
    len: usize,
    shared: bool,
    /// Views (buffers) of it that Python holds.
    views: usize,
}

impl Loan {
    pub(crate) fn new(loan: milonga::Loan) -> Loan {
        Loan {
            state: Mutex::new(State {
                len: loan.len(),
                shared: loan.is_shared(),
                loan: Some(loan),
                putting: false,
                views: 0,
            }),
            born: crate::fork::Born::now(),
        }
    }

    /// The loan, to put: refused while Python holds a view of it (the
    /// memory would stay writable after it is published), while another
    /// put has it, or once put.
    pub(crate) fn take(&self, py: Python<'_>) -> PyResult<milonga::Loan> {
        // A forked child's copy: its slot is the parent's.
        self.born.check(py, "loan")?;
        let mut st = lock(&self.state);
        if st.views > 0 {
            return Err(PyBufferError::new_err(format!(
                "the loan is still viewed ({} numpy arrays or memoryviews of it live): \
                 release them (del the array, memoryview.release()) before put_loan",
                st.views
            )));
        }
        if st.putting {
            return Err(PyBufferError::new_err("another thread is putting the loan"));
        }
        let loan = st
            .loan
            .take()
            .ok_or_else(|| PyBufferError::new_err("the loan was put already"))?;
        st.putting = true;
        Ok(loan)
    }

    /// Gives a loan that was not put back to its owner.
    pub(crate) fn restore(&self, loan: milonga::Loan) {
        let mut st = lock(&self.state);
        st.loan = Some(loan);
        st.putting = false;
    }

    /// The put took the loan for good.
    pub(crate) fn spent(&self) {
        let mut st = lock(&self.state);
        st.putting = false;
        st.len = 0;
        st.shared = false;
    }
}

#[pymethods]
impl Loan {
    /// The buffer protocol's `getbuffer`: a writable view of the loan.
    ///
    /// # Safety
    /// `view` must point to a writable `Py_buffer` (Python guarantees it).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // A forked child writing the parent's slot would change what the
        // parent publishes.
        slf.get().born.check(slf.py(), "loan")?;
        let mut st = lock(&slf.get().state);
        let putting = st.putting;
        let Some(loan) = st.loan.as_mut() else {
            return Err(PyBufferError::new_err(match putting {
                true => "another thread is putting the loan",
                false => "the loan was put: its memory is the publisher's again",
            }));
        };
        let (ptr, len) = (loan.as_mut_ptr(), loan.len());
        // SAFETY: `view` is the caller's Py_buffer. The memory stays valid,
        // and no one else writes it, while the view lives: the loan cannot
        // be taken (put) while `views` > 0, and the view holds a reference
        // to `slf` (released by PyBuffer_Release, which calls
        // `__releasebuffer__`).
        unsafe { crate::convert::fill_view(view, slf.as_any(), ptr, len, false, flags) }?;
        st.views += 1;
        Ok(())
    }

    /// The buffer protocol's `releasebuffer`: a view went.
    ///
    /// # Safety
    /// Called by Python with a view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(slf: Bound<'_, Self>, _view: *mut ffi::Py_buffer) {
        let mut st = lock(&slf.get().state);
        st.views = st.views.saturating_sub(1);
    }

    /// Its size in bytes (0 once put).
    fn __len__(&self) -> usize {
        lock(&self.state).len
    }

    /// Whether it is a slot of the publisher's shared memory (published
    /// without any copy to subscribers on this host), else memory of its
    /// own (sent as a `put` would send it).
    #[getter]
    fn shared(&self) -> bool {
        lock(&self.state).shared
    }

    fn __repr__(&self) -> String {
        let st = lock(&self.state);
        match (st.len, st.loan.is_some() || st.putting) {
            (_, false) => "Loan(put)".to_owned(),
            (len, true) => {
                let shared = if st.shared { "True" } else { "False" };
                format!("Loan({len} bytes, shared={shared})")
            }
        }
    }
}
