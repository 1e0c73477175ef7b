//! `milonga._native`: the Rust side of Milonga's Python package.
//!
//! Private: users import `milonga`, whose classes derive from or re-export
//! these. Every wait releases the interpreter (the GIL) and looks at
//! Python's signals every 50 ms, so Ctrl-C interrupts it; nothing here
//! panics across the boundary (errors become `milonga.errors` exceptions).
// `unsafe` lives in convert.rs and loan.rs alone (the buffer protocol of
// a zero-copy view and of a loan).
#![deny(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use milonga::{
    Config, ConfigValue, Event, Filter, PublisherQos, QueuePolicy, RecvError, ServeOptions,
    ServiceError, SubscriberQos, Value,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

#[allow(unsafe_code)]
mod convert;
mod errors;
mod fork;
#[allow(unsafe_code)]
mod loan;
mod recording;

use convert::{from_py, to_py};
use fork::Born;

/// Longest a blocking call waits between looks at Python's signals.
const SLICE: Duration = Duration::from_millis(50);

/// Bytes of a value's bulk data (`bytes`, an array), from which a put
/// releases the interpreter while it encodes, compresses and sends.
const RELEASE_FROM: usize = 64 << 10;

/// The bytes of `v`'s bulk data (byte strings, typed arrays), wherever
/// they are in it (a dict of arrays, a list of images), counted up to
/// [`RELEASE_FROM`] (a long list of numbers is not walked to its end).
fn bulk_bytes(v: &Value) -> usize {
    fn walk(v: &Value, sum: &mut usize) {
        if *sum >= RELEASE_FROM {
            return;
        }
        match v {
            Value::Bytes(b) => *sum += b.len(),
            Value::Typed(t) => *sum += t.bytes().len(),
            Value::Tagged(_, inner) => walk(inner, sum),
            Value::Array(items) => {
                for x in items {
                    walk(x, sum);
                    if *sum >= RELEASE_FROM {
                        return;
                    }
                }
            }
            Value::Map(pairs) => {
                for (k, x) in pairs {
                    walk(k, sum);
                    walk(x, sum);
                    if *sum >= RELEASE_FROM {
                        return;
                    }
                }
            }
            _ => {}
        }
    }
    let mut sum = 0;
    walk(v, &mut sum);
    sum
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A schema from its map form (`milonga.schema_of` builds one from a
/// dataclass), as the Rust `Schema::from_value` reads it.
fn schema_of(obj: &Bound<'_, PyAny>, threshold: usize) -> PyResult<milonga::Schema> {
    let v = from_py(obj, threshold)?;
    milonga::Schema::from_value(&v)
        .map_err(|e| errors::raise(obj.py(), "ConfigError", e.to_string()))
}

/// A timeout in seconds as a `Duration`; `None` stays `None`.
fn seconds(what: &str, s: Option<f64>) -> PyResult<Option<Duration>> {
    match s {
        None => Ok(None),
        // (Infinity: no limit, as about 31 years.)
        Some(s) if s >= 0.0 => Ok(Some(Duration::from_secs_f64(s.min(1e9)))),
        Some(s) => Err(Python::attach(|py| {
            errors::raise(
                py,
                "ConfigError",
                format!("{what} must be a number of seconds >= 0, not {s}"),
            )
        })),
    }
}

/// Runs `work` on a thread of its own and waits for it in slices, between
/// which signals are checked (Ctrl-C): a wait that may last (a handler
/// that runs for an hour, a long timeout) stays interruptible. Interrupted,
/// the work goes on in the background and its outcome is dropped.
fn in_slices<T: Send + 'static>(
    py: Python<'_>,
    name: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> PyResult<T> {
    if IN_HANDLER.get() {
        // A handler closing its own service or node: the close runs on
        // this worker, which the service's drop does not wait for; a
        // helper thread would wait for the worker, and the worker for it.
        return Ok(py.detach(work));
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| errors::raise(py, "Error", format!("cannot start a thread: {e}")))?;
    let mut rx = rx;
    loop {
        // (The receiver is moved in and out: it may not be shared.)
        let (got, back) = py.detach(move || (rx.recv_timeout(SLICE), rx));
        rx = back;
        match got {
            Ok(v) => return Ok(v),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(errors::raise(
                    py,
                    "Error",
                    format!("{name} ended without an outcome"),
                ))
            }
        }
    }
}

/// Applies `open(..., **config)` keys to a configuration: each goes to
/// `Config::set`, which knows the keys (one table, `Config::keys`), their
/// kinds and ranges.
fn apply_config(cfg: &mut Config, config: &Bound<'_, PyDict>) -> PyResult<()> {
    for (k, v) in config.iter() {
        let key: String = k.extract()?;
        // `bool` before `int`: a Python bool is an int.
        let value = if v.is_none() {
            ConfigValue::Unset
        } else if v.is_instance_of::<pyo3::types::PyBool>() {
            ConfigValue::Bool(v.extract()?)
        } else if let Ok(i) = v.extract::<i64>() {
            ConfigValue::Int(i)
        } else if v.is_instance_of::<pyo3::types::PyInt>() {
            ConfigValue::Bad(format!("{v} is out of range"))
        } else if let Ok(t) = v.extract::<String>() {
            ConfigValue::Text(t)
        } else if let Ok(p) = v.extract::<std::path::PathBuf>() {
            ConfigValue::Path(p)
        } else if let Ok(l) = v.extract::<Vec<String>>() {
            ConfigValue::List(l)
        } else {
            ConfigValue::Bad(format!(
                "a {} is not a configuration value",
                v.get_type().name()?
            ))
        };
        cfg.set(&key, value).map_err(|e| errors::open(v.py(), e))?;
    }
    Ok(())
}

/// A node: the handle on a domain (`milonga.open`).
#[pyclass(frozen, subclass, module = "milonga._native", name = "Node")]
pub(crate) struct Node {
    /// Shared with the threads that run a `call_all` or a `close` while
    /// the calling thread waits for them in slices (Ctrl-C).
    node: Arc<milonga::Node>,
    threshold: usize,
    /// `max_message_bytes`: no loan can be larger.
    max_message: usize,
    /// The node's `compression` settings, which a publisher's QoS changes.
    compression: milonga::Compression,
    born: Born,
}

impl Drop for Node {
    fn drop(&mut self) {
        // In a forked child, the parent's node is never closed from here.
        // Otherwise a node let go without `close()` closes here, the
        // interpreter released as `close()` does (a handler running on
        // one of its workers may be waiting for it).
        if self.born.inherited() {
            std::mem::forget(self.node.clone());
        } else if Arc::strong_count(&self.node) == 1 {
            let node = &self.node;
            Python::attach(|py| py.detach(|| node.close()));
        }
    }
}

#[pymethods]
impl Node {
    #[new]
    #[pyo3(signature = (locator, name, config=None))]
    fn new(
        py: Python<'_>,
        locator: &str,
        name: &str,
        config: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut cfg = Config::from_env(locator, name).map_err(|e| errors::open(py, e))?;
        if let Some(c) = config {
            apply_config(&mut cfg, c)?;
        }
        let threshold = cfg.zero_copy_threshold_bytes;
        let max_message = cfg.max_message_bytes;
        let compression = cfg.compression();
        let node = py
            .detach(|| milonga::Node::open_with(cfg))
            .map_err(|e| errors::open(py, e))?;
        Ok(Node {
            node: Arc::new(node),
            threshold,
            max_message,
            compression,
            born: Born::now(),
        })
    }

    /// The node's name.
    #[getter]
    fn name(&self) -> &str {
        self.node.name()
    }

    /// The node's id (32 hex digits).
    #[getter]
    fn id(&self) -> String {
        self.node.id().to_hex()
    }

    /// The domain.
    #[getter]
    fn domain(&self) -> &str {
        self.node.domain()
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (key, reliable=false, history=0, put_timeout=None, compression=None,
                        compression_threshold=None, compression_level=None, schema=None,
                        compression_dictionary=None))]
    fn _publisher(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        key: &str,
        reliable: bool,
        history: usize,
        put_timeout: Option<f64>,
        compression: Option<&str>,
        compression_threshold: Option<usize>,
        compression_level: Option<i32>,
        schema: Option<&Bound<'_, PyAny>>,
        compression_dictionary: Option<bool>,
    ) -> PyResult<Publisher> {
        let this = slf.get();
        this.born.check(py, "node")?;
        let mut qos = if reliable {
            PublisherQos::reliable()
        } else {
            PublisherQos::best_effort()
        };
        qos = qos.history(history);
        // The node's settings, changed where the QoS says.
        if compression.is_some()
            || compression_threshold.is_some()
            || compression_level.is_some()
            || compression_dictionary.is_some()
        {
            let mut c = match compression {
                None => this.compression,
                Some("none") => milonga::Compression::none(),
                Some("lz4") => milonga::Compression::lz4(),
                Some("zstd") => milonga::Compression::zstd(),
                Some(other) => {
                    return Err(errors::raise(
                        py,
                        "ConfigError",
                        format!("compression {other:?}: expected 'none', 'lz4' or 'zstd'"),
                    ))
                }
            };
            if let Some(t) = compression_threshold {
                c = c.threshold(t);
            }
            if let Some(l) = compression_level {
                c = c.level(l);
            }
            if let Some(d) = compression_dictionary {
                c.dictionary = d;
            }
            qos = qos.compression(c);
        }
        if let Some(s) = schema {
            qos = qos.schema(schema_of(s, this.threshold)?);
        }
        let timeout = seconds("put_timeout", put_timeout)?;
        // Declaring writes the node's announcement and waits for its
        // thread: without the interpreter, as a subscription does.
        let p = py
            .detach(|| this.node.publisher_with(key, qos))
            .map_err(|e| errors::publisher(py, e))?;
        Ok(Publisher {
            inner: RwLock::new(Some(Arc::new(p))),
            reliable,
            put_timeout: timeout,
            threshold: this.threshold,
            max_message: this.max_message,
            born: Born::now(),
            _node: slf.clone().into_any().unbind(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (expr, reliable=false, last=0, deadline=None, queue_depth=None,
                        keep_all=None, keep_last=None, filter_expr=None, abs_change=None,
                        rel_change=None, min_period_ms=None, schema=None))]
    fn _subscribe(
        &self,
        py: Python<'_>,
        expr: &str,
        reliable: bool,
        last: usize,
        deadline: Option<f64>,
        queue_depth: Option<i32>,
        keep_all: Option<usize>,
        keep_last: Option<usize>,
        filter_expr: Option<String>,
        abs_change: Option<f64>,
        rel_change: Option<f64>,
        min_period_ms: Option<u64>,
        schema: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Subscription> {
        self.born.check(py, "node")?;
        let mut qos = SubscriberQos::default().last(last);
        if let Some(s) = schema {
            qos = qos.schema(schema_of(s, self.threshold)?);
        }
        if reliable {
            qos = qos.reliable();
        }
        if let Some(d) = seconds("deadline", deadline)? {
            qos = qos.deadline(d);
        }
        if let Some(q) = queue_depth {
            qos = qos.queue_depth(q);
        }
        qos.queue = match (keep_all, keep_last) {
            (Some(_), Some(_)) => {
                return Err(errors::raise(
                    py,
                    "ConfigError",
                    "keep_all and keep_last exclude each other",
                ))
            }
            (Some(n), None) => Some(QueuePolicy::KeepAll(n)),
            (None, Some(n)) => Some(QueuePolicy::KeepLast(n)),
            (None, None) => None,
        };
        if filter_expr.is_some()
            || abs_change.is_some()
            || rel_change.is_some()
            || min_period_ms.is_some()
        {
            qos = qos.filter(Filter {
                expr: filter_expr,
                abs_change,
                rel_change,
                min_period_ms,
            });
        }
        let sub = py
            .detach(|| self.node.subscribe_with(expr, qos))
            .map_err(|e| errors::subscribe(py, e))?;
        Ok(Subscription {
            inner: RwLock::new(Some(Arc::new(sub))),
            expr: expr.to_owned(),
            threshold: self.threshold,
            stash: Mutex::new(VecDeque::new()),
            taking: Mutex::new(()),
            born: Born::now(),
        })
    }

    #[pyo3(signature = (key, handler, workers=4, max_queued=1024))]
    fn _serve(
        &self,
        py: Python<'_>,
        key: &str,
        handler: Py<PyAny>,
        workers: usize,
        max_queued: usize,
    ) -> PyResult<Service> {
        self.born.check(py, "node")?;
        let threshold = self.threshold;
        let handler = Arc::new(handler);
        let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let opts = ServeOptions::default()
            .workers(workers)
            .max_queued(max_queued);
        let svc = py
            .detach(|| {
                self.node
                    .serve_with(key, opts, move |req: milonga::Request| {
                        Python::attach(|py| run_handler(py, &handler, req, threshold, &failures))
                    })
            })
            .map_err(|e| errors::serve(py, e))?;
        Ok(Service {
            inner: Mutex::new(Some(svc)),
            key: key.to_owned(),
            born: Born::now(),
        })
    }

    /// Calls `key` with `value` and waits for the reply (seconds).
    #[pyo3(signature = (key, value, timeout=5.0))]
    fn call(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        timeout: f64,
    ) -> PyResult<Py<PyAny>> {
        self.call_start(py, key, value, timeout)?.wait(py)
    }

    /// Sends a call and returns a pending call at once.
    #[pyo3(signature = (key, value, timeout=5.0))]
    fn call_start(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        timeout: f64,
    ) -> PyResult<PendingCall> {
        self.born.check(py, "node")?;
        let t = seconds("timeout", Some(timeout))?.unwrap_or_default();
        let v = from_py(value, self.threshold)?;
        let p = self
            .node
            .call_async(key, v, t)
            .map_err(|e| errors::call(py, e))?;
        Ok(PendingCall {
            inner: Mutex::new(Some(p)),
            threshold: self.threshold,
            born: Born::now(),
        })
    }

    /// Calls every server of every key matching `expr`.
    #[pyo3(signature = (expr, value, timeout=5.0))]
    fn call_all(
        &self,
        py: Python<'_>,
        expr: &str,
        value: &Bound<'_, PyAny>,
        timeout: f64,
    ) -> PyResult<Vec<ServerReply>> {
        self.born.check(py, "node")?;
        let t = seconds("timeout", Some(timeout))?.unwrap_or_default();
        let v = from_py(value, self.threshold)?;
        let (node, expr) = (self.node.clone(), expr.to_owned());
        let replies = in_slices(py, "milonga-call-all", move || node.call_all(&expr, v, t))?
            .map_err(|e| errors::call(py, e))?;
        replies
            .into_iter()
            .map(|r| {
                let (value, error) = match r.result {
                    Ok(v) => (to_py(py, &v, self.threshold)?.unbind(), None),
                    Err(e) => (
                        py.None(),
                        Some(errors::call(py, e).into_value(py).into_any()),
                    ),
                };
                Ok(ServerReply {
                    key: r.key,
                    server: r.server,
                    node: r.node.to_hex(),
                    value,
                    error,
                })
            })
            .collect()
    }

    /// The peers discovery knows, as JSON (announcements).
    fn _peers_json(&self, py: Python<'_>) -> PyResult<String> {
        self.born.check(py, "node")?;
        serde_json::to_string(&self.node.peers()).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The node's counters, as JSON.
    fn _stats_json(&self, py: Python<'_>) -> PyResult<String> {
        self.born.check(py, "node")?;
        serde_json::to_string(&self.node.stats()).map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Closes the node: its publishers, subscriptions and services stop
    /// (running handlers finish first). Ctrl-C ends the wait; the closing
    /// goes on in the background.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.born.inherited() {
            // A forked child's copy: the parent's node goes on.
            return Ok(());
        }
        let node = self.node.clone();
        in_slices(py, "milonga-close", move || node.close())
    }
}

thread_local! {
    /// Set while this thread runs a service's handler (`in_slices`).
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as running a handler while it lives.
struct HandlerRunning;

impl HandlerRunning {
    fn start() -> HandlerRunning {
        IN_HANDLER.set(true);
        HandlerRunning
    }
}

impl Drop for HandlerRunning {
    fn drop(&mut self) {
        IN_HANDLER.set(false);
    }
}

/// Logs on the `milonga` logger, with its traceback, an exception of a
/// service's handler that the caller gets as `RemoteError` (not a
/// `ServiceError` the handler raised on purpose): the first ten of the
/// service, then every thousandth, as a subscription's callback's.
fn log_handler_failure(py: Python<'_>, key: &str, what: &str, err: &PyErr, failures: &AtomicU64) {
    let n = failures.fetch_add(1, Ordering::Relaxed) + 1;
    if n > 10 && n % 1000 != 0 {
        return;
    }
    let logged = (|| -> PyResult<()> {
        let log = py
            .import("logging")?
            .call_method1("getLogger", ("milonga",))?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("exc_info", err.value(py))?;
        log.call_method(
            "error",
            (
                "service %r: %s (the caller gets RemoteError; %d so far)",
                key,
                what,
                n,
            ),
            Some(&kwargs),
        )?;
        Ok(())
    })();
    if let Err(e) = logged {
        // (Logging itself failed: said where it can be.)
        e.write_unraisable(py, None);
    }
}

fn run_handler(
    py: Python<'_>,
    handler: &Py<PyAny>,
    req: milonga::Request,
    threshold: usize,
    failures: &AtomicU64,
) -> Result<Value, ServiceError> {
    let _running = HandlerRunning::start();
    let value = to_py(py, &req.value, threshold)
        .map_err(|e| ServiceError::new("bad_request", e.to_string()))?;
    let key = req.key.clone();
    let request = Request {
        key: req.key,
        value: value.unbind(),
        caller: req.caller.to_hex(),
        call_id: req.call_id,
        timestamp_ns: req.timestamp_ns,
    };
    match handler.bind(py).call1((request,)) {
        Ok(reply) => from_py(&reply, threshold).map_err(|e| {
            log_handler_failure(
                py,
                &key,
                "the handler's return value cannot be sent",
                &e,
                failures,
            );
            ServiceError::new(
                "bad_reply",
                format!("the handler's return value cannot be sent: {e}"),
            )
        }),
        Err(err) => {
            let exc = err.value(py);
            let explicit = (|| -> PyResult<(String, String)> {
                let class = py.import("milonga.errors")?.getattr("ServiceError")?;
                if exc.is_instance(&class)? {
                    Ok((
                        exc.getattr("kind")?.extract()?,
                        exc.getattr("message")?.extract()?,
                    ))
                } else {
                    Err(PyValueError::new_err("not a ServiceError"))
                }
            })();
            let (kind, message) = explicit.unwrap_or_else(|_| {
                log_handler_failure(py, &key, "the handler raised", &err, failures);
                let kind = exc
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "Exception".into());
                let message = exc.str().map(|s| s.to_string()).unwrap_or_default();
                (kind, message)
            });
            Err(ServiceError::new(kind, message))
        }
    }
}

/// A publisher of one key.
#[pyclass(frozen, module = "milonga._native", name = "Publisher")]
pub(crate) struct Publisher {
    inner: RwLock<Option<Arc<milonga::Publisher>>>,
    reliable: bool,
    put_timeout: Option<Duration>,
    threshold: usize,
    max_message: usize,
    born: Born,
    /// Its node, kept alive while the publisher is (a node let go closes,
    /// and a publisher of a closed node can only raise `Closed`).
    _node: Py<PyAny>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.born.release_rwlock(&mut self.inner);
    }
}

impl Publisher {
    fn get(&self, py: Python<'_>) -> PyResult<Arc<milonga::Publisher>> {
        self.born.check(py, "publisher")?;
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| errors::raise(py, "Closed", "the publisher is closed"))
    }
}

#[pymethods]
impl Publisher {
    /// The key.
    #[getter]
    fn key(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.get(py)?.key().to_owned())
    }

    /// Publishes `value`. A reliable publisher waits for room at most
    /// `timeout` seconds (default: its QoS `put_timeout`, else forever).
    /// `timestamp_ns` is the source timestamp (ns since the Unix epoch:
    /// when the value was measured); default: now.
    #[pyo3(signature = (value, timeout=None, timestamp_ns=None))]
    fn put(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        timestamp_ns: Option<u64>,
    ) -> PyResult<()> {
        let p = self.get(py)?;
        // Checked first: a bad timeout is an error whether or not it was
        // needed.
        let limit = seconds("timeout", timeout)?.or(self.put_timeout);
        let v = from_py(value, self.threshold)?;
        let try_put = |v: Value| match timestamp_ns {
            Some(ts) => p.try_put_at(v, ts),
            None => p.try_put(v),
        };
        let put_timeout = |v: Value, t: Duration| match timestamp_ns {
            Some(ts) => p.put_at_timeout(v, ts, t),
            None => p.put_timeout(v, t),
        };
        let best_effort = |v: Value| match timestamp_ns {
            Some(ts) => p.put_at(v, ts),
            None => p.put(v),
        };
        // A large value is encoded, compressed and copied with the
        // interpreter released: other threads run meanwhile.
        let large = bulk_bytes(&v) >= RELEASE_FROM;
        if !self.reliable {
            let put = match large {
                true => py.detach(|| best_effort(v)),
                false => best_effort(v),
            };
            return put.map_err(|e| errors::put(py, e));
        }
        // Room now: no need to wait, nor (unless large) to release the
        // interpreter.
        let tried = match large {
            true => py.detach(|| try_put(v.clone())),
            false => try_put(v.clone()),
        };
        match tried {
            Ok(()) => return Ok(()),
            Err(milonga::PutError::WouldBlock) => {}
            Err(e) => return Err(errors::put(py, e)),
        }
        let deadline = limit.map(|t| Instant::now() + t);
        loop {
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            let v2 = v.clone();
            match py.detach(|| put_timeout(v2, slice)) {
                Ok(()) => return Ok(()),
                Err(milonga::PutError::Timeout(_))
                    if deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    py.check_signals()?;
                    // Closed from another thread meanwhile: this put ends
                    // too (it holds its own handle of the publisher).
                    self.get(py)?;
                }
                Err(milonga::PutError::Timeout(_)) => return Err(no_room(py, limit)),
                Err(e) => return Err(errors::put(py, e)),
            }
        }
    }

    /// Publishes `value` only if every subscriber has room now
    /// (`WouldBlock` otherwise).
    fn try_put(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let p = self.get(py)?;
        let v = from_py(value, self.threshold)?;
        p.try_put(v).map_err(|e| errors::put(py, e))
    }

    /// A buffer of `nbytes` to fill in place and publish with
    /// `put_loan`: a slot of the publisher's shared memory when its
    /// samples can go through it (docs/shared-memory.md), else memory of
    /// its own. Its content is unspecified: write all of it.
    fn loan(&self, py: Python<'_>, nbytes: usize) -> PyResult<loan::Loan> {
        let p = self.get(py)?;
        if nbytes > self.max_message {
            return Err(errors::raise(
                py,
                "TooLarge",
                format!(
                    "a loan of {nbytes} bytes exceeds the limit of {} bytes (max_message_bytes)",
                    self.max_message
                ),
            ));
        }
        Ok(loan::Loan::new(py.detach(|| p.loan(nbytes))))
    }

    /// Publishes a filled loan: as bytes, or with `dtype` as a numpy
    /// array of that element type (little-endian), of `shape` if given.
    /// Waits for room as `put` does; if it raises, the loan stays the
    /// caller's, to put again (unless the transport kept it: then it
    /// reads as put). Refused while a view of the loan lives.
    #[pyo3(signature = (loan, dtype=None, shape=None, timeout=None))]
    fn put_loan(
        &self,
        py: Python<'_>,
        loan: &Bound<'_, loan::Loan>,
        dtype: Option<&Bound<'_, PyAny>>,
        shape: Option<Vec<usize>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let p = self.get(py)?;
        let layout = loan_layout(py, dtype, shape)?;
        let limit = seconds("timeout", timeout)?.or(self.put_timeout);
        let owner = loan.get();
        let mut l = owner.take(py)?;
        // Room now (or best effort): no need to release the interpreter.
        let deadline = limit.map(|t| Instant::now() + t);
        let mut slice = Duration::ZERO;
        loop {
            let put = |l| p.put_loan_timeout(l, &layout, slice);
            let done = match slice.is_zero() {
                true => put(l),
                false => py.detach(|| put(l)),
            };
            let e = match done {
                Ok(()) => {
                    owner.spent();
                    return Ok(());
                }
                Err(e) => e,
            };
            let waiting = self.reliable
                && matches!(
                    e.error,
                    milonga::PutError::WouldBlock | milonga::PutError::Timeout(_)
                );
            let Some(back) = e.loan else {
                // The transport kept it (a socket error after the first
                // frame had left): spent.
                owner.spent();
                return Err(errors::put(py, e.error));
            };
            if !waiting {
                owner.restore(*back);
                return Err(errors::put(py, e.error));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                owner.restore(*back);
                return Err(no_room(py, limit));
            }
            if let Err(interrupted) = py.check_signals().and_then(|()| self.get(py).map(drop)) {
                owner.restore(*back);
                return Err(interrupted);
            }
            l = *back;
            slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
        }
    }

    /// Subscribers connected to this publisher's key.
    fn subscriber_count(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.get(py)?.subscriber_count())
    }

    /// Withdraws the publication.
    fn close(&self, py: Python<'_>) {
        if self.born.inherited() {
            return;
        }
        let p = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| drop(p));
    }
}

/// A reliable put that found no room within its `limit`.
fn no_room(py: Python<'_>, limit: Option<Duration>) -> PyErr {
    errors::raise(
        py,
        "TimeoutError",
        format!(
            "a subscriber had no room for {:?}",
            limit.unwrap_or_default()
        ),
    )
}

/// How `put_loan` lays out a loan: bytes, or a typed array of `dtype`
/// (little-endian), of `shape` if given.
fn loan_layout(
    py: Python<'_>,
    dtype: Option<&Bound<'_, PyAny>>,
    shape: Option<Vec<usize>>,
) -> PyResult<milonga::LoanLayout> {
    let Some(dtype) = dtype else {
        return match shape {
            None => Ok(milonga::LoanLayout::Bytes),
            Some(_) => Err(errors::raise(py, "ConfigError", "a shape needs a dtype")),
        };
    };
    let dtype = py.import("numpy")?.getattr("dtype")?.call1((dtype,))?;
    let big = match dtype.getattr("byteorder")?.extract::<String>()?.as_str() {
        ">" => true,
        "=" => cfg!(target_endian = "big"),
        _ => false,
    };
    if big {
        return Err(errors::raise(
            py,
            "EncodeError",
            format!("a loan holds little-endian elements, not {}", dtype.str()?),
        ));
    }
    let element = convert::element_of(&dtype)?;
    Ok(match shape {
        Some(shape) => milonga::LoanLayout::Array(element, shape),
        None => milonga::LoanLayout::Typed(element),
    })
}

/// A subscription: its events, with `recv`, iteration or `async for`.
#[pyclass(frozen, module = "milonga._native", name = "Subscription")]
pub(crate) struct Subscription {
    inner: RwLock<Option<Arc<milonga::Subscriber>>>,
    expr: String,
    threshold: usize,
    /// Events taken from the subscriber and not yet returned. Every event
    /// passes through here, in the order it came: a cancelled `await`'s
    /// worker (`_fill`) and the next `await` may receive at once, and
    /// neither may lose an event or return a later one first.
    stash: Mutex<VecDeque<Event>>,
    /// Held (with the GIL released) by whoever moves events from the
    /// subscriber to `stash`.
    taking: Mutex<()>,
    born: Born,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.born.release_rwlock(&mut self.inner);
        // Samples of shared memory among them: their slots are the parent's.
        let stash = self
            .stash
            .get_mut()
            .map_or_else(|e| std::mem::take(e.into_inner()), std::mem::take);
        self.born.release(stash);
    }
}

impl Subscription {
    fn get(&self, py: Python<'_>) -> PyResult<Arc<milonga::Subscriber>> {
        self.born.check(py, "subscription")?;
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| errors::raise(py, "Closed", "the subscription is closed"))
    }

    /// Moves the next event of the subscriber to `stash` if one comes by
    /// `until` (`None`: only if one is there now, and only if no other
    /// thread is taking one); whether `stash` holds an event. The wait is
    /// counted from when this thread may take (another may hold `taking`
    /// for its own slice), so it never ends after `until`.
    fn take(
        &self,
        py: Python<'_>,
        s: &milonga::Subscriber,
        until: Option<Instant>,
    ) -> PyResult<bool> {
        let taken = py.detach(|| {
            let _taking = match until {
                Some(_) => lock(&self.taking),
                None => match self.taking.try_lock() {
                    Ok(g) => g,
                    Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                    // Another thread waits for the next event: it stashes it.
                    Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
                },
            };
            if !lock(&self.stash).is_empty() {
                return Ok(true);
            }
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            let ev = match left {
                Some(w) if !w.is_zero() => s.recv_timeout(w),
                _ => s.try_recv(),
            };
            match ev {
                Ok(ev) => {
                    lock(&self.stash).push_back(ev);
                    Ok(true)
                }
                Err(RecvError::Empty | RecvError::Timeout) => Ok(false),
                Err(e) => Err(e),
            }
        });
        taken.map_err(|e| errors::recv(py, e))
    }

    /// The oldest stashed event, as a Python object (converted after the
    /// stash's lock is let go: the conversion may run Python code).
    fn pop(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.born.check(py, "subscription")?;
        let ev = lock(&self.stash).pop_front();
        ev.map(|ev| event_to_py(py, ev, self.threshold)).transpose()
    }

    /// Waits until `stash` holds an event, at most `timeout` (`None`: no
    /// limit), in slices between which signals are checked (Ctrl-C);
    /// whether it does.
    fn fill(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<bool> {
        let s = self.get(py)?;
        if self.take(py, &s, None)? {
            return Ok(true);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            if slice.is_zero() {
                return Ok(false);
            }
            if self.take(py, &s, Some(Instant::now() + slice))? {
                return Ok(true);
            }
            py.check_signals()?;
            // Closed from another thread meanwhile: this wait ends with
            // `Closed` (it holds its own handle of the subscriber, which
            // goes with it).
            self.get(py)?;
        }
    }

    /// The next event, waiting at most `timeout` (`None`: no limit).
    /// `Ok(None)` on timeout.
    fn next_event(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<Option<Py<PyAny>>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(ev) = self.pop(py)? {
                return Ok(Some(ev));
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            // An event stashed for this thread may be taken by another
            // first: then it waits again, until its deadline.
            if !self.fill(py, left)? {
                return Ok(None);
            }
        }
    }
}

#[pymethods]
impl Subscription {
    /// The key expression.
    #[getter]
    fn key_expr(&self) -> &str {
        &self.expr
    }

    /// The next event; raises `milonga.TimeoutError` after `timeout`
    /// seconds (`None`: wait as long as it takes).
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let t = seconds("timeout", timeout)?;
        self.next_event(py, t)?.ok_or_else(|| {
            errors::raise(
                py,
                "TimeoutError",
                format!(
                    "no event on {:?} within {:?}",
                    self.expr,
                    t.unwrap_or_default()
                ),
            )
        })
    }

    /// The next event if one is there, else `None` (also while another
    /// thread of this subscription is receiving one: it keeps it for the
    /// next `recv`, in order).
    fn try_recv(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if let Some(ev) = self.pop(py)? {
            return Ok(Some(ev));
        }
        let s = self.get(py)?;
        self.take(py, &s, None)?;
        self.pop(py)
    }

    /// Waits up to `timeout` seconds for an event and keeps it for the
    /// next `recv`; true if one came. (The async iterator runs this in a
    /// worker thread, so a cancelled `await` loses nothing.)
    fn _fill(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let t = seconds("timeout", Some(timeout))?;
        self.fill(py, t)
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// The next event; the iteration ends when the subscription closes.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.next_event(py, None) {
            Err(e) if is_closed(py, &e) => Ok(None),
            other => other,
        }
    }

    /// Samples lost so far, over all publishers.
    #[getter]
    fn lost(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.get(py)?.lost())
    }

    /// Samples squashed by `keep_last` so far.
    #[getter]
    fn squashed(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.get(py)?.squashed())
    }

    /// Lost samples per publisher node id.
    fn lost_by_publisher(&self, py: Python<'_>) -> PyResult<Vec<(String, u64)>> {
        Ok(self
            .get(py)?
            .lost_by_publisher()
            .into_iter()
            .map(|(k, v)| (k.to_hex(), v))
            .collect())
    }

    /// Ends the subscription.
    fn close(&self, py: Python<'_>) {
        if self.born.inherited() {
            return;
        }
        let s = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| drop(s));
    }
}

fn is_closed(py: Python<'_>, e: &PyErr) -> bool {
    py.import("milonga.errors")
        .and_then(|m| m.getattr("Closed"))
        .map(|c| e.value(py).is_instance(&c).unwrap_or(false))
        .unwrap_or(false)
}

fn event_to_py(py: Python<'_>, ev: Event, threshold: usize) -> PyResult<Py<PyAny>> {
    Ok(match ev {
        Event::Sample(s) => Py::new(
            py,
            Sample {
                key: s.key,
                value: to_py(py, &s.value, threshold)?.unbind(),
                seq: s.seq,
                timestamp_ns: s.timestamp_ns,
                replayed: s.replayed,
                publisher: s.publisher,
            },
        )?
        .into_any(),
        Event::Lost(l) => Py::new(
            py,
            Lost {
                key: l.key,
                publisher: l.publisher.to_hex(),
                count: l.count,
                first_seq: l.first_seq,
            },
        )?
        .into_any(),
        Event::PublisherAlive(a) => Py::new(
            py,
            PublisherAlive {
                publisher: a.publisher.to_hex(),
                name: a.name,
            },
        )?
        .into_any(),
        Event::PublisherLost(l) => Py::new(
            py,
            PublisherLost {
                publisher: l.publisher.to_hex(),
                name: l.name,
                reason: l.reason.as_str().to_owned(),
            },
        )?
        .into_any(),
        Event::DeadlineMissed(d) => Py::new(
            py,
            DeadlineMissed {
                key: d.key,
                silent_for: d.silent_for.as_secs_f64(),
            },
        )?
        .into_any(),
        Event::SubscriptionLive => Py::new(py, SubscriptionLive {})?.into_any(),
        Event::IncompatibleQos(q) => Py::new(
            py,
            IncompatibleQos {
                publisher: q.publisher.to_hex(),
                key: q.key,
                policy: q.policy.as_str().to_owned(),
                detail: q.detail,
            },
        )?
        .into_any(),
        Event::PermissionDenied(p) => Py::new(
            py,
            PermissionDenied {
                endpoint: p.endpoint,
                publisher: p.publisher.map(|n| n.to_hex()),
                reason: p.reason,
            },
        )?
        .into_any(),
        Event::BrokerChanged(b) => Py::new(
            py,
            BrokerChanged {
                from_broker: b.from,
                to_broker: b.to,
            },
        )?
        .into_any(),
        other => Py::new(
            py,
            Unknown {
                description: format!("{other:?}"),
            },
        )?
        .into_any(),
    })
}

/// A sample: a value published on a key.
#[pyclass(frozen, module = "milonga._native", name = "Sample")]
pub(crate) struct Sample {
    #[pyo3(get)]
    key: String,
    #[pyo3(get)]
    value: Py<PyAny>,
    #[pyo3(get)]
    seq: u64,
    #[pyo3(get)]
    timestamp_ns: u64,
    /// Republished from a recording (`milonga replay`); `timestamp_ns` is
    /// then when it was first published.
    #[pyo3(get)]
    replayed: bool,
    /// Formatted when asked for (most readers never look).
    publisher: milonga::NodeId,
}

#[pymethods]
impl Sample {
    /// The publisher's node id (32 hex digits).
    #[getter]
    fn publisher(&self) -> String {
        self.publisher.to_hex()
    }

    /// The source timestamp, in seconds since the Unix epoch.
    #[getter]
    fn timestamp(&self) -> f64 {
        self.timestamp_ns as f64 / 1e9
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Sample(key={:?}, seq={}, value={})",
            self.key,
            self.seq,
            self.value.bind(py).repr()?
        ))
    }
}

/// Samples of a key were lost before the next one delivered.
#[pyclass(frozen, module = "milonga._native", name = "Lost", get_all)]
pub(crate) struct Lost {
    key: String,
    publisher: String,
    count: u64,
    first_seq: u64,
}

#[pymethods]
impl Lost {
    fn __repr__(&self) -> String {
        format!(
            "Lost(key={:?}, count={}, first_seq={}, publisher={:?})",
            self.key, self.count, self.first_seq, self.publisher
        )
    }
}

/// A publisher node is alive (heard from for the first time, or again).
#[pyclass(frozen, module = "milonga._native", name = "PublisherAlive", get_all)]
pub(crate) struct PublisherAlive {
    publisher: String,
    name: String,
}

#[pymethods]
impl PublisherAlive {
    fn __repr__(&self) -> String {
        format!("PublisherAlive(name={:?})", self.name)
    }
}

/// A publisher node was lost: `reason` is `closed`, `disconnected`, `forgotten`,
/// `lease_expired` or `undeclared`.
#[pyclass(frozen, module = "milonga._native", name = "PublisherLost", get_all)]
pub(crate) struct PublisherLost {
    publisher: String,
    name: String,
    reason: String,
}

#[pymethods]
impl PublisherLost {
    fn __repr__(&self) -> String {
        format!(
            "PublisherLost(name={:?}, reason={:?})",
            self.name, self.reason
        )
    }
}

/// A key was silent longer than the subscription's deadline.
#[pyclass(frozen, module = "milonga._native", name = "DeadlineMissed", get_all)]
pub(crate) struct DeadlineMissed {
    key: String,
    silent_for: f64,
}

#[pymethods]
impl DeadlineMissed {
    fn __repr__(&self) -> String {
        format!(
            "DeadlineMissed(key={:?}, silent_for={:.3})",
            self.key, self.silent_for
        )
    }
}

/// What publishers kept has been delivered; what follows is live.
#[pyclass(frozen, module = "milonga._native", name = "SubscriptionLive")]
pub(crate) struct SubscriptionLive {}

#[pymethods]
impl SubscriptionLive {
    fn __repr__(&self) -> &'static str {
        "SubscriptionLive()"
    }
}

/// A matching publication offers less than the subscription asked for.
#[pyclass(frozen, module = "milonga._native", name = "IncompatibleQos", get_all)]
pub(crate) struct IncompatibleQos {
    publisher: String,
    key: String,
    policy: String,
    detail: String,
}

#[pymethods]
impl IncompatibleQos {
    fn __repr__(&self) -> String {
        format!(
            "IncompatibleQos(key={:?}, policy={:?}, detail={:?})",
            self.key, self.policy, self.detail
        )
    }
}

/// A publisher's node refused this subscription (its security is on and
/// this node's key is not in its trust directory).
#[pyclass(frozen, module = "milonga._native", name = "PermissionDenied", get_all)]
pub(crate) struct PermissionDenied {
    endpoint: String,
    publisher: Option<String>,
    reason: String,
}

#[pymethods]
impl PermissionDenied {
    fn __repr__(&self) -> String {
        format!(
            "PermissionDenied(endpoint={:?}, reason={:?})",
            self.endpoint, self.reason
        )
    }
}

/// The node lost its broker and moved to another (a locator naming
/// several brokers, docs/broker.md).
#[pyclass(frozen, module = "milonga._native", name = "BrokerChanged", get_all)]
pub(crate) struct BrokerChanged {
    from_broker: String,
    to_broker: String,
}

#[pymethods]
impl BrokerChanged {
    fn __repr__(&self) -> String {
        format!(
            "BrokerChanged(from_broker={:?}, to_broker={:?})",
            self.from_broker, self.to_broker
        )
    }
}

/// An event of a kind this binding does not know yet.
#[pyclass(frozen, module = "milonga._native", name = "UnknownEvent", get_all)]
pub(crate) struct Unknown {
    description: String,
}

/// A request, as a service handler receives it.
#[pyclass(frozen, module = "milonga._native", name = "Request", get_all)]
pub(crate) struct Request {
    key: String,
    value: Py<PyAny>,
    caller: String,
    call_id: u64,
    timestamp_ns: u64,
}

#[pymethods]
impl Request {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Request(key={:?}, value={})",
            self.key,
            self.value.bind(py).repr()?
        ))
    }
}

/// A service being served; `close()` withdraws it.
#[pyclass(frozen, module = "milonga._native", name = "Service")]
pub(crate) struct Service {
    inner: Mutex<Option<milonga::Service>>,
    key: String,
    born: Born,
}

#[pymethods]
impl Service {
    /// The key.
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// Withdraws the service: callers stop finding it, waiting requests are
    /// turned away, running handlers finish. Ctrl-C ends the wait for them
    /// (they finish in the background).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.born.inherited() {
            return Ok(());
        }
        let s = lock(&self.inner).take();
        // Workers may wait for the interpreter to run a handler.
        in_slices(py, "milonga-service-close", move || drop(s))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.born.inherited() {
            self.born.release_mutex(&mut self.inner);
            return;
        }
        if let Some(s) = lock(&self.inner).take() {
            Python::attach(|py| py.detach(|| drop(s)));
        }
    }
}

/// A call in flight.
#[pyclass(frozen, module = "milonga._native", name = "PendingCall")]
pub(crate) struct PendingCall {
    inner: Mutex<Option<milonga::PendingCall>>,
    threshold: usize,
    born: Born,
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.born.release_mutex(&mut self.inner);
    }
}

#[pymethods]
impl PendingCall {
    /// Waits for the reply (or raises why there is none).
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.born.check(py, "call")?;
        // Never block on this lock while holding the interpreter: the
        // holder releases it between slices and needs the interpreter back.
        let mut g = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(errors::raise(
                    py,
                    "Error",
                    "another thread is already waiting for this call",
                ))
            }
        };
        let Some(p) = g.as_mut() else {
            return Err(errors::raise(
                py,
                "Closed",
                "this call was already waited for",
            ));
        };
        loop {
            match py.detach(|| p.wait_for(SLICE)) {
                Some(Ok(v)) => {
                    *g = None;
                    return Ok(to_py(py, &v, self.threshold)?.unbind());
                }
                Some(Err(e)) => {
                    *g = None;
                    return Err(errors::call(py, e));
                }
                None => py.check_signals()?,
            }
        }
    }
}

/// One server's reply to `call_all`: `value`, or `error` (an exception).
#[pyclass(frozen, module = "milonga._native", name = "ServerReply", get_all)]
pub(crate) struct ServerReply {
    key: String,
    server: String,
    node: String,
    value: Py<PyAny>,
    error: Option<Py<PyAny>>,
}

#[pymethods]
impl ServerReply {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(match &self.error {
            None => format!(
                "ServerReply(key={:?}, server={:?}, value={})",
                self.key,
                self.server,
                self.value.bind(py).repr()?
            ),
            Some(e) => format!(
                "ServerReply(key={:?}, server={:?}, error={})",
                self.key,
                self.server,
                e.bind(py).repr()?
            ),
        })
    }
}

/// Makes a CURVE identity: `directory/name.key` (the secret, mode 0600)
/// and `directory/name.pub`; their paths.
#[pyfunction]
fn keygen(py: Python<'_>, name: &str, directory: std::path::PathBuf) -> PyResult<(String, String)> {
    let made = milonga::security::Identity::generate(name).and_then(|id| id.write(&directory));
    match made {
        Ok((key, public)) => Ok((key.display().to_string(), public.display().to_string())),
        Err(e @ milonga::SecurityError::BadName(_)) => {
            Err(errors::raise(py, "ConfigError", e.to_string()))
        }
        Err(e) => Err(errors::raise(py, "OpenError", e.to_string())),
    }
}

/// Milonga's version.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Node>()?;
    m.add_class::<Publisher>()?;
    m.add_class::<loan::Loan>()?;
    m.add_class::<Subscription>()?;
    m.add_class::<Sample>()?;
    m.add_class::<Lost>()?;
    m.add_class::<PublisherAlive>()?;
    m.add_class::<PublisherLost>()?;
    m.add_class::<DeadlineMissed>()?;
    m.add_class::<SubscriptionLive>()?;
    m.add_class::<IncompatibleQos>()?;
    m.add_class::<PermissionDenied>()?;
    m.add_class::<BrokerChanged>()?;
    m.add_class::<Unknown>()?;
    m.add_class::<Request>()?;
    m.add_class::<Service>()?;
    m.add_class::<PendingCall>()?;
    m.add_class::<ServerReply>()?;
    m.add_class::<recording::Recording>()?;
    m.add_class::<convert::Buffer>()?;
    m.add_class::<convert::Tagged>()?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(keygen, m)?)?;
    fork::register(m)?;
    Ok(())
}
