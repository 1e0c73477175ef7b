//! Values between Python and Milonga.
//!
//! Python to Milonga: `None`, `bool`, `int`, `float`, `str`, `bytes`
//! (`bytearray`, `memoryview`), `list`, `tuple`, `dict`, numpy arrays and
//! `Tagged`. A numpy array is an RFC 8746 typed array (with more than one
//! dimension, inside RFC 8746's tag 40, `[shape, elements]`); a C-contiguous
//! little-endian array and a `bytes` object at or above the node's
//! `zero_copy_threshold_bytes` are sent from their own memory, not copied.
//!
//! Milonga to Python: a typed array is a read-only numpy array viewing the
//! received message (no copy); a byte string at or above the threshold is a
//! read-only `memoryview` of the message, below it a `bytes`.

use std::ffi::c_int;

use milonga::wire::cbor::TAG_NDARRAY;
use milonga::{wire::ElementType, wire::TypedArray, Bytes, Value};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PyString, PyTuple,
};
use pyo3::{ffi, IntoPyObjectExt};

/// CBOR nesting Milonga accepts (as the decoder does).
const MAX_DEPTH: usize = 64;

/// Read-only bytes shared with a received message (or any `Bytes`),
/// exposed through the buffer protocol: numpy arrays and memoryviews of it
/// keep the message alive and never copy it.
#[pyclass(frozen, module = "milonga._native", name = "Buffer")]
pub(crate) struct Buffer {
    bytes: Bytes,
    born: crate::fork::Born,
}

impl Buffer {
    pub(crate) fn new(bytes: Bytes) -> Buffer {
        Buffer {
            bytes,
            born: crate::fork::Born::now(),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // A slot of shared memory, in a forked child, stays the parent's.
        self.born.release(std::mem::take(&mut self.bytes));
    }
}

#[pymethods]
impl Buffer {
    /// The buffer protocol's `getbuffer`, called by Python with the
    /// `Py_buffer` to fill.
    ///
    /// # Safety
    /// `view` must point to a writable `Py_buffer` (Python guarantees it).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a received message is read-only"));
        }
        let b = &slf.get().bytes;
        // SAFETY: `view` is the caller's Py_buffer; the memory stays valid
        // and unchanged while `slf` lives (`fill_view` makes the view hold
        // a reference to it).
        unsafe {
            fill_view(
                view,
                slf.as_any(),
                b.as_ptr().cast_mut(),
                b.len(),
                true,
                flags,
            )
        }
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }
}

/// Fills `view` (a `getbuffer` call's) with `len` bytes at `ptr`, the view
/// holding a reference to `owner` until `PyBuffer_Release`.
///
/// # Safety
/// `view` must be the `Py_buffer` Python passed to `getbuffer`, and the
/// memory must stay valid (and, if `readonly`, unchanged) while `owner`
/// lives.
pub(crate) unsafe fn fill_view(
    view: *mut ffi::Py_buffer,
    owner: &Bound<'_, PyAny>,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
    flags: c_int,
) -> PyResult<()> {
    let len = isize::try_from(len).map_err(|_| PyBufferError::new_err("buffer too large"))?;
    // SAFETY: as the caller promises.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            ptr.cast(),
            len,
            c_int::from(readonly),
            flags,
        )
    };
    if rc != 0 {
        return Err(PyErr::fetch(owner.py()));
    }
    Ok(())
}

/// A CBOR tag Milonga does not interpret, and its content.
#[pyclass(frozen, module = "milonga._native", name = "Tagged")]
pub(crate) struct Tagged {
    #[pyo3(get)]
    tag: u64,
    #[pyo3(get)]
    value: Py<PyAny>,
}

#[pymethods]
impl Tagged {
    #[new]
    fn new(tag: u64, value: Py<PyAny>) -> Self {
        Tagged { tag, value }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Tagged({}, {})",
            self.tag,
            self.value.bind(py).repr()?
        ))
    }

    /// The hash of `(tag, value)`: a tagged value may be a map's key.
    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        (self.tag, self.value.clone_ref(py))
            .into_pyobject(py)?
            .hash()
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match other.cast::<Tagged>() {
            Ok(o) => Ok(self.tag == o.get().tag && self.value.bind(py).eq(o.get().value.bind(py))?),
            Err(_) => Ok(false),
        }
    }
}

/// Python memory kept alive for as long as a message refers to it.
struct Borrowed {
    _owner: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the memory belongs to an immutable object (bytes), to a numpy
// array the user handed over for sending, or to the exporter of a
// read-only memoryview, pinned by a view of Milonga's own that nobody else
// can release; `_owner` keeps it alive, and a `Py` may be dropped on any
// thread without waiting (its reference is released when a thread next
// holds the interpreter): a message is often let go under a lock of the
// node's, which a thread holding the interpreter may be waiting for.
unsafe impl Send for Borrowed {}
// SAFETY: shared access only reads the memory, which nobody writes (above).
unsafe impl Sync for Borrowed {}

impl AsRef<[u8]> for Borrowed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see above; ptr/len came from the owner's buffer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

struct Numpy {
    ndarray: Py<PyAny>,
    /// numpy's bool and complex scalar types: neither is a number here
    /// (a bool went out as 1.0, a complex as its real part).
    bool_: Py<PyAny>,
    complexfloating: Py<PyAny>,
    frombuffer: Py<PyAny>,
    ascontiguousarray: Py<PyAny>,
    dtypes: Vec<(ElementType, Py<PyAny>)>,
}

static NUMPY: PyOnceLock<Numpy> = PyOnceLock::new();

fn numpy(py: Python<'_>) -> PyResult<&Numpy> {
    NUMPY.get_or_try_init(py, || {
        let np = py.import("numpy")?;
        let dtype = np.getattr("dtype")?;
        let mut dtypes = Vec::new();
        for (e, code) in [
            (ElementType::U8, "<u1"),
            (ElementType::U16, "<u2"),
            (ElementType::U32, "<u4"),
            (ElementType::U64, "<u8"),
            (ElementType::I8, "<i1"),
            (ElementType::I16, "<i2"),
            (ElementType::I32, "<i4"),
            (ElementType::I64, "<i8"),
            (ElementType::F32, "<f4"),
            (ElementType::F64, "<f8"),
        ] {
            dtypes.push((e, dtype.call1((code,))?.unbind()));
        }
        Ok(Numpy {
            ndarray: np.getattr("ndarray")?.unbind(),
            bool_: np.getattr("bool_")?.unbind(),
            complexfloating: np.getattr("complexfloating")?.unbind(),
            frombuffer: np.getattr("frombuffer")?.unbind(),
            ascontiguousarray: np.getattr("ascontiguousarray")?.unbind(),
            dtypes,
        })
    })
}

/// Converts a received value. `threshold`: byte strings this long or
/// longer are viewed, not copied.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    v: &Value,
    threshold: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => match i64::try_from(*i) {
            Ok(small) => small.into_bound_py_any(py)?,
            Err(_) => i.into_bound_py_any(py)?,
        },
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::Text(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => {
            if b.len() >= threshold.max(1) {
                let buf = Bound::new(py, Buffer::new(b.clone()))?;
                PyMemoryView::from(&buf.into_any())?.into_any()
            } else {
                PyBytes::new(py, b).into_any()
            }
        }
        Value::Array(items) => {
            let list = PyList::empty(py);
            for x in items {
                list.append(to_py(py, x, threshold)?)?;
            }
            list.into_any()
        }
        Value::Map(pairs) => {
            let d = PyDict::new(py);
            for (k, x) in pairs {
                let key = to_py(py, k, threshold)?;
                // A CBOR array used as a key becomes a tuple (lists are not
                // hashable).
                let key = match key.cast::<PyList>() {
                    Ok(l) => PyTuple::new(py, l.iter())?.into_any(),
                    Err(_) => key,
                };
                d.set_item(key, to_py(py, x, threshold)?)?;
            }
            d.into_any()
        }
        Value::Typed(t) => typed_to_numpy(py, t)?,
        Value::Tagged(TAG_NDARRAY, inner) => match ndarray_parts(inner) {
            Some((shape, t)) => typed_to_numpy(py, t)?.call_method1("reshape", (shape,))?,
            None => tagged(py, TAG_NDARRAY, inner, threshold)?,
        },
        Value::Tagged(tag, inner) => tagged(py, *tag, inner, threshold)?,
        other => {
            return Err(PyTypeError::new_err(format!(
                "this version of the binding cannot convert {other:?}"
            )))
        }
    })
}

fn tagged<'py>(
    py: Python<'py>,
    tag: u64,
    inner: &Value,
    threshold: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let value = to_py(py, inner, threshold)?.unbind();
    Ok(Bound::new(py, Tagged { tag, value })?.into_any())
}

/// `[shape, typed array]` of an RFC 8746 multi-dimensional array.
fn ndarray_parts(v: &Value) -> Option<(Vec<usize>, &TypedArray)> {
    let Value::Array(parts) = v else { return None };
    let [Value::Array(dims), Value::Typed(t)] = parts.as_slice() else {
        return None;
    };
    let shape: Vec<usize> = dims
        .iter()
        .map(|d| match d {
            Value::Int(n) => usize::try_from(*n).ok(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (shape.iter().try_fold(1usize, |a, d| a.checked_mul(*d)) == Some(t.len())).then_some((shape, t))
}

fn typed_to_numpy<'py>(py: Python<'py>, t: &TypedArray) -> PyResult<Bound<'py, PyAny>> {
    let np = numpy(py)?;
    let dtype = np
        .dtypes
        .iter()
        .find(|(e, _)| *e == t.element())
        .map(|(_, d)| d.bind(py))
        .ok_or_else(|| PyTypeError::new_err(format!("no numpy type for {}", t.element().name())))?;
    let buf = Bound::new(py, Buffer::new(t.bytes().clone()))?;
    np.frombuffer.bind(py).call1((buf, dtype))
}

fn encode_err(message: impl Into<String>) -> PyErr {
    Python::attach(|py| crate::errors::raise(py, "EncodeError", message))
}

/// Converts a value to send. `threshold`: `bytes` and numpy arrays this
/// large or larger are sent from their own memory.
pub(crate) fn from_py(obj: &Bound<'_, PyAny>, threshold: usize) -> PyResult<Value> {
    from_py_at(obj, threshold, 0)
}

fn from_py_at(obj: &Bound<'_, PyAny>, threshold: usize, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(encode_err(format!(
            "the value nests deeper than {MAX_DEPTH} levels"
        )));
    }
    let py = obj.py();
    if obj.is_none() {
        return Ok(Value::Null);
    }
    // bool before int: True is an int in Python.
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return i
            .extract::<i128>()
            .map(Value::Int)
            .map_err(|_| encode_err("the int is outside CBOR's range (-2**64 .. 2**64-1)"));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Text(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        let data = b.as_bytes();
        if data.len() >= threshold.max(1) {
            let owner = Borrowed {
                _owner: b.clone().into_any().unbind(),
                ptr: data.as_ptr(),
                len: data.len(),
            };
            return Ok(Value::Bytes(Bytes::from_owner(owner)));
        }
        return Ok(Value::Bytes(Bytes::copy_from_slice(data)));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Value::Bytes(Bytes::from(b.to_vec())));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return list
            .iter()
            .map(|x| from_py_at(&x, threshold, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t
            .iter()
            .map(|x| from_py_at(&x, threshold, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        // A snapshot of its items: converting one may run Python code
        // (`__index__`, a dataclass's fields) or let another thread in,
        // which may change the dict, and PyO3's dict iterator panics then.
        return d
            .items()
            .iter()
            .map(|kv| {
                let (k, x): (Bound<'_, PyAny>, Bound<'_, PyAny>) = kv.extract()?;
                Ok((
                    from_py_at(&k, threshold, depth + 1)?,
                    from_py_at(&x, threshold, depth + 1)?,
                ))
            })
            .collect::<PyResult<_>>()
            .map(Value::Map);
    }
    if let Ok(t) = obj.cast::<Tagged>() {
        let t = t.get();
        return Ok(Value::Tagged(
            t.tag,
            Box::new(from_py_at(t.value.bind(py), threshold, depth + 1)?),
        ));
    }
    if let Ok(m) = obj.cast::<PyMemoryView>() {
        // A read-only view (of bytes, or of a received message) is sent
        // from its own memory, held until it has left; a writable one is
        // copied once (the caller may change it while it is on its way).
        // Held through a view of Milonga's own (a new memoryview, or the
        // cast of one): it pins the exporter's buffer as the caller's view
        // does, but the caller's `release()` cannot end it.
        let own = match pyo3::buffer::PyBuffer::<u8>::get(obj) {
            Ok(_) => PyMemoryView::from(obj)?.into_any(),
            Err(_) => m.call_method1("cast", ("B",))?,
        };
        let view = pyo3::buffer::PyBuffer::<u8>::get(&own)?;
        let len = view.len_bytes();
        if view.readonly() && view.is_c_contiguous() && len >= threshold.max(1) {
            let ptr = view.buf_ptr() as *const u8;
            // (Released here, with the interpreter held.)
            drop(view);
            return Ok(Value::Bytes(Bytes::from_owner(Borrowed {
                _owner: own.unbind(),
                ptr,
                len,
            })));
        }
        return Ok(Value::Bytes(Bytes::from(view.to_vec(py)?)));
    }
    let np = numpy(py)?;
    if obj.is_instance(np.ndarray.bind(py))? {
        return numpy_to_value(py, np, obj, threshold);
    }
    // numpy scalars and other numbers.
    if obj.is_instance(np.bool_.bind(py))? {
        return Ok(Value::Bool(obj.is_truthy()?));
    }
    if obj.is_instance(np.complexfloating.bind(py))? {
        return Err(encode_err(
            "cannot send a complex number (send its real and imaginary parts)",
        ));
    }
    if obj.hasattr("__index__")? {
        if let Ok(i) = obj.extract::<i128>() {
            return Ok(Value::Int(i));
        }
    }
    if obj.hasattr("__float__")? {
        if let Ok(f) = obj.extract::<f64>() {
            return Ok(Value::Float(f));
        }
    }
    // A dataclass instance is the map of its fields (nested ones too); an
    // enum member its name (an IntEnum or StrEnum member outside a
    // dataclass goes as its int or str): what a schema'd publisher's
    // values are (docs/schemas.md).
    if obj.hasattr("__dataclass_fields__")? && !obj.is_instance_of::<pyo3::types::PyType>() {
        let fields = py.import("dataclasses")?.call_method1("fields", (obj,))?;
        let enum_class = py.import("enum")?.getattr("Enum")?;
        let mut pairs = Vec::new();
        for f in fields.try_iter()? {
            let name: String = f?.getattr("name")?.extract()?;
            let value = obj.getattr(name.as_str())?;
            // A field's enum member goes by its name, an IntEnum's or a
            // StrEnum's too (as a schema's enum is read).
            let v = if value.is_instance(&enum_class)? {
                Value::Text(value.getattr("name")?.extract()?)
            } else {
                from_py_at(&value, threshold, depth + 1)?
            };
            pairs.push((Value::Text(name), v));
        }
        return Ok(Value::Map(pairs));
    }
    if obj.is_instance(&py.import("enum")?.getattr("Enum")?)? {
        return Ok(Value::Text(obj.getattr("name")?.extract()?));
    }
    Err(encode_err(format!(
        "cannot send a {}: values are None, bool, int, float, str, bytes, list, tuple, dict, numpy arrays, dataclasses, enum members and milonga.Tagged",
        obj.get_type().name()?
    )))
}

fn numpy_to_value(
    py: Python<'_>,
    np: &Numpy,
    obj: &Bound<'_, PyAny>,
    threshold: usize,
) -> PyResult<Value> {
    let element = element_of(&obj.getattr("dtype")?)?;
    let le = np
        .dtypes
        .iter()
        .find(|(e, _)| *e == element)
        .map(|(_, d)| d.bind(py))
        .expect("every element type has a dtype");
    // The shape before the copy: `ascontiguousarray` makes a 0-d array
    // 1-D.
    let shape: Vec<usize> = obj.getattr("shape")?.extract()?;
    // Little-endian and C-contiguous, or a copy that is.
    let arr = np.ascontiguousarray.bind(py).call1((obj, le))?;
    let flat = arr.call_method1("reshape", (-1,))?;
    let view = PyMemoryView::from(&flat)?.call_method1("cast", ("B",))?;
    let buf = pyo3::buffer::PyBuffer::<u8>::get(&view)?;
    let len = buf.len_bytes();
    let bytes = if len >= threshold.max(1) {
        Bytes::from_owner(Borrowed {
            _owner: arr.clone().unbind(),
            ptr: buf.buf_ptr() as *const u8,
            len,
        })
    } else {
        Bytes::copy_from_slice(
            // SAFETY: the buffer is held (and C-contiguous) for this copy.
            unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, len) },
        )
    };
    drop(buf);
    let typed = TypedArray::from_bytes(element, bytes).map_err(|e| encode_err(e.to_string()))?;
    if shape.len() == 1 {
        Ok(Value::Typed(typed))
    } else {
        let dims = shape.iter().map(|d| Value::Int(*d as i128)).collect();
        Ok(Value::Tagged(
            TAG_NDARRAY,
            Box::new(Value::Array(vec![Value::Array(dims), Value::Typed(typed)])),
        ))
    }
}

/// The element type of a numpy dtype (its kind and size; the byte order
/// is the caller's business).
pub(crate) fn element_of(dtype: &Bound<'_, PyAny>) -> PyResult<ElementType> {
    let kind: String = dtype.getattr("kind")?.extract()?;
    let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
    Ok(match (kind.as_str(), itemsize) {
        ("u", 1) => ElementType::U8,
        ("u", 2) => ElementType::U16,
        ("u", 4) => ElementType::U32,
        ("u", 8) => ElementType::U64,
        ("i", 1) => ElementType::I8,
        ("i", 2) => ElementType::I16,
        ("i", 4) => ElementType::I32,
        ("i", 8) => ElementType::I64,
        ("f", 4) => ElementType::F32,
        ("f", 8) => ElementType::F64,
        _ => {
            return Err(encode_err(format!(
                "cannot send a numpy array of {}: typed arrays hold u1..u8, i1..i8, f4 and f8",
                dtype.str()?
            )))
        }
    })
}
