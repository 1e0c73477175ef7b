//! `milonga.open_recording(path)`: a recording read back as the events a
//! live subscription yields (docs/recording.md).

use std::sync::Mutex;

use milonga::recording::{Entry, RecordReader};
use milonga::Event;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{errors, event_to_py};

/// A recording opened for reading: iterate it for its events in file
/// order (samples and status events, as a live subscription yields them).
#[pyclass(module = "milonga._native", name = "Recording")]
pub(crate) struct Recording {
    path: String,
    reader: Mutex<Option<RecordReader>>,
    threshold: usize,
    /// When the event last yielded was received (ns since the Unix epoch).
    #[pyo3(get)]
    received_ns: u64,
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
            received_ns: 0,
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let mut guard = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        let Some(reader) = guard.as_mut() else {
            return Err(errors::raise(
                py,
                "Closed",
                format!("{} is closed", self.path),
            ));
        };
        let next = py.detach(|| reader.next_entry());
        match next.map_err(|e| open_error(py, e))? {
            None => Ok(None),
            Some(Entry::Sample(s, at)) => {
                self.received_ns = at;
                event_to_py(py, Event::Sample(s), self.threshold).map(Some)
            }
            Some(Entry::Event(ev, at)) => {
                self.received_ns = at;
                event_to_py(py, ev, self.threshold).map(Some)
            }
        }
    }

    /// Whether the file ended with its summary (the recorder finished it).
    #[getter]
    fn complete(&self) -> bool {
        let g = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().is_some_and(RecordReader::complete)
    }

    /// Why the file ended before its summary, once read to its end: it was
    /// cut short (a recorder killed, a full disk). `None` otherwise.
    #[getter]
    fn truncated(&self) -> Option<String> {
        let g = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().and_then(|r| r.truncated().map(str::to_owned))
    }

    /// Why the first damaged chunk was skipped (its CRC, its compressed
    /// data, its framing), once read to its end; `None` if none was. The
    /// read went on after it: its messages are lost, said as losses.
    #[getter]
    fn damage(&self) -> Option<String> {
        let g = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().and_then(|r| r.damage().map(str::to_owned))
    }

    /// The recording's `milonga` metadata (domain, expressions, recorder,
    /// started_ns).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let g = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = g.as_ref() {
            for (k, v) in r.metadata() {
                d.set_item(k, v)?;
            }
        }
        Ok(d)
    }

    /// Closes the file.
    fn close(&self) {
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = None;
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
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        format!("<milonga.Recording {:?}>", self.path)
    }
}
