//! `milonga.open_recording(path)`: a recording read back as the events a
//! live subscription yields (docs/recording.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use milonga::recording::{Entry, RecordReader};
use milonga::Event;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{errors, event_to_py};

/// A recording opened for reading: iterate it for its events in file
/// order (samples and status events, as a live subscription yields them).
/// Usable from several threads: one reads at a time, and `close()` from
/// another ends its reading at the next event (`Closed`).
#[pyclass(frozen, module = "milonga._native", name = "Recording")]
pub(crate) struct Recording {
    path: String,
    reader: Mutex<Option<RecordReader>>,
    threshold: usize,
    received_ns: AtomicU64,
    /// Set by `close()` before it waits for the reader's lock: a read in
    /// another thread stops at its next event, so that `close` gets the
    /// lock (a reader that takes it again at once would starve it).
    closed: AtomicBool,
    /// A forked child's copy shares the file's offset with the parent's:
    /// it does not read (`fork.rs`).
    born: crate::fork::Born,
}

impl Recording {
    /// Runs `f` on the reader under its lock, without the interpreter
    /// (taken and let go while detached: no thread waits for the lock
    /// while holding the interpreter, nor for the interpreter while
    /// holding the lock).
    fn with_reader<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Option<RecordReader>) -> T + Send,
    ) -> T {
        py.detach(|| f(&mut self.lock()))
    }

    fn lock(&self) -> MutexGuard<'_, Option<RecordReader>> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn open_error(py: Python<'_>, e: milonga::recording::RecordError) -> PyErr {
    errors::raise(py, "OpenError", e.to_string())
}

#[pymethods]
impl Recording {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let reader = RecordReader::open(&path).map_err(|e| open_error(py, e))?;
        Ok(Recording {
            path: path.display().to_string(),
            reader: Mutex::new(Some(reader)),
            // Arrays from this size on are views, as on a live node.
            threshold: milonga::Config::new("milonga:///recording", "recording")
                .zero_copy_threshold_bytes,
            received_ns: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            born: crate::fork::Born::now(),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.born.check(py, "recording")?;
        let next = match self.closed.load(Ordering::Acquire) {
            true => None,
            false => self.with_reader(py, |r| r.as_mut().map(RecordReader::next_entry)),
        };
        let Some(next) = next else {
            return Err(errors::raise(
                py,
                "Closed",
                format!("{} is closed", self.path),
            ));
        };
        let (ev, at) = match next.map_err(|e| open_error(py, e))? {
            None => return Ok(None),
            Some(Entry::Sample(s, at)) => (Event::Sample(s), at),
            Some(Entry::Event(ev, at)) => (ev, at),
        };
        self.received_ns.store(at, Ordering::Relaxed);
        event_to_py(py, ev, self.threshold).map(Some)
    }

    /// When the event last yielded was received (ns since the Unix epoch).
    #[getter]
    fn received_ns(&self) -> u64 {
        self.received_ns.load(Ordering::Relaxed)
    }

    /// Whether the file ended with its summary (the recorder finished it).
    #[getter]
    fn complete(&self, py: Python<'_>) -> bool {
        self.with_reader(py, |r| r.as_ref().is_some_and(RecordReader::complete))
    }

    /// Why the file ended before its summary, once read to its end: it was
    /// cut short (a recorder killed, a full disk). `None` otherwise.
    #[getter]
    fn truncated(&self, py: Python<'_>) -> Option<String> {
        self.with_reader(py, |r| {
            r.as_ref().and_then(|r| r.truncated().map(str::to_owned))
        })
    }

    /// Why the first damaged chunk was skipped (its CRC, its compressed
    /// data, its framing), once read to its end; `None` if none was. The
    /// read went on after it: its messages are lost, said as losses.
    #[getter]
    fn damage(&self, py: Python<'_>) -> Option<String> {
        self.with_reader(py, |r| {
            r.as_ref().and_then(|r| r.damage().map(str::to_owned))
        })
    }

    /// The recording's `milonga` metadata (domain, expressions, recorder,
    /// started_ns).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let meta: Vec<(String, String)> = self.with_reader(py, |r| {
            r.as_ref()
                .map(|r| {
                    r.metadata()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                })
                .unwrap_or_default()
        });
        let d = PyDict::new(py);
        for (k, v) in meta {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Closes the file (a read in another thread ends at its next event).
    fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::Release);
        self.with_reader(py, |r| *r = None);
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (ty, value, tb, /))]
    fn __exit__(
        &self,
        ty: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        tb: &Bound<'_, PyAny>,
    ) -> bool {
        let _ = (ty, value, tb);
        self.close(ty.py());
        false
    }

    fn __repr__(&self) -> String {
        format!("<milonga.Recording {:?}>", self.path)
    }
}
