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
}

struct State {
    /// `None` once put.
    loan: Option<milonga::Loan>,
    /// Views (buffers) of it that Python holds.
    views: usize,
}

impl Loan {
    pub(crate) fn new(loan: milonga::Loan) -> Loan {
        Loan {
            state: Mutex::new(State {
                loan: Some(loan),
                views: 0,
            }),
        }
    }

    /// The loan, to put: refused while Python holds a view of it (the
    /// memory would stay writable after it is published) or once put.
    pub(crate) fn take(&self) -> PyResult<milonga::Loan> {
        let mut st = lock(&self.state);
        if st.views > 0 {
            return Err(PyBufferError::new_err(format!(
                "the loan is still viewed ({} numpy arrays or memoryviews of it live): \
                 release them (del the array, memoryview.release()) before put_loan",
                st.views
            )));
        }
        st.loan
            .take()
            .ok_or_else(|| PyBufferError::new_err("the loan was put already"))
    }

    /// Gives a loan that was not put back to its owner.
    pub(crate) fn restore(&self, loan: milonga::Loan) {
        lock(&self.state).loan = Some(loan);
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
        let mut st = lock(&slf.get().state);
        let Some(loan) = st.loan.as_mut() else {
            return Err(PyBufferError::new_err(
                "the loan was put: its memory is the publisher's again",
            ));
        };
        let (ptr, len) = (loan.as_mut_ptr(), loan.len());
        let len = isize::try_from(len).map_err(|_| PyBufferError::new_err("buffer too large"))?;
        // SAFETY: `view` is the caller's Py_buffer. The memory stays valid,
        // and no one else writes it, while the view lives: the loan cannot
        // be taken (put) while `views` > 0, and FillInfo takes a reference
        // to `slf` (released by PyBuffer_Release, which calls
        // `__releasebuffer__`).
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len, 0, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
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
        lock(&self.state).loan.as_ref().map_or(0, |l| l.len())
    }

    /// Whether it is a slot of the publisher's shared memory (published
    /// without any copy to subscribers on this host), else memory of its
    /// own (sent as a `put` would send it).
    #[getter]
    fn shared(&self) -> bool {
        lock(&self.state)
            .loan
            .as_ref()
            .is_some_and(|l| l.is_shared())
    }

    fn __repr__(&self) -> String {
        let st = lock(&self.state);
        match &st.loan {
            Some(l) => format!("Loan({} bytes, shared={})", l.len(), l.is_shared()),
            None => "Loan(put)".to_owned(),
        }
    }
}
