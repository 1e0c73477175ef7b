//! Services, the serving side: a ROUTER socket per service and a pool of
//! worker threads that take turns reading it (leader/follower).
//!
//! At any time at most one worker leads: it waits on the socket, reads every
//! request queued there into the pool's queue, then hands the lead to an
//! idle worker and runs the first request itself. A worker that finishes
//! sends its reply and reads what has arrived meanwhile before taking the
//! next request from the queue. So with a fast handler and steady traffic
//! one thread does everything, as a hand-written ROUTER loop would, and a
//! slow handler occupies one worker while the others go on serving.
//!
//! Every thread that uses the socket (under its lock) leaves it read to the
//! end: ZMQ_FD, on which the leader sleeps, only signals new activity, so a
//! message left behind could otherwise wait unnoticed.
//!
//! Overload: when `max_queued` requests wait for a worker, further ones are
//! answered at once with status `rejected`, kind `overload`.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use milonga_wire::cbor::{decode_payload, encode_payload, Encoded};
use milonga_wire::frame::{self, Encoding, Header, Kind, FLAG_PAYLOAD_FRAME};
use milonga_wire::service::{Failure, ReplyStatus};
use milonga_wire::{Bytes, Key, NodeId, Value};
use serde::{Deserialize, Serialize};

use crate::error::ServeError;
use crate::node::{lock, NodeInner};
use crate::stats;
use crate::zmq_io::{self, message_bytes, EventFd};

/// A call as its handler sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Request {
    /// The service's key.
    pub key: String,
    /// The request value (byte strings and typed arrays view the received
    /// message, without a copy).
    pub value: Value,
    /// The calling node.
    pub caller: NodeId,
    /// The call's id, unique among the caller's calls.
    pub call_id: u64,
    /// When the caller sent it, ns since the Unix epoch (the caller's clock).
    pub timestamp_ns: u64,
}

/// A handler's error: travels to the caller as
/// [`CallError::Remote`](crate::CallError::Remote).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ServiceError {
    /// A short machine-readable kind, such as `out_of_range`.
    pub kind: String,
    /// What went wrong, for a person.
    pub message: String,
}

impl ServiceError {
    /// An error of `kind` saying `message`.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ServiceError {
            kind: kind.into(),
            message: message.into(),
        }
    }
}

impl From<String> for ServiceError {
    /// An error of kind `error`.
    fn from(message: String) -> Self {
        ServiceError::new("error", message)
    }
}

impl From<&str> for ServiceError {
    /// An error of kind `error`.
    fn from(message: &str) -> Self {
        ServiceError::new("error", message)
    }
}

/// How a service is served.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServeOptions {
    /// Worker threads running the handler: up to this many calls run at
    /// once. Default 4. With 1, calls run one at a time in arrival order
    /// (Tango's serialisation by device).
    pub workers: usize,
    /// Requests that may wait for a free worker; beyond, a call is rejected
    /// with kind `overload`. Default 1024.
    pub max_queued: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            workers: 4,
            max_queued: 1024,
        }
    }
}

impl ServeOptions {
    /// These options with `workers` threads.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// These options with at most `max_queued` waiting requests.
    pub fn max_queued(mut self, max_queued: usize) -> Self {
        self.max_queued = max_queued;
        self
    }
}

/// A service in an announcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// The service's key.
    pub key: String,
    /// Where callers connect (a ROUTER socket).
    pub endpoint: String,
    /// Worker threads.
    pub workers: usize,
    /// The largest request the server accepts, in bytes.
    pub max_request_bytes: usize,
}

type Handler = dyn Fn(Request) -> Result<Value, ServiceError> + Send + Sync;

/// A request read from the socket, waiting for a worker.
struct Incoming {
    identity: zmq::Message,
    header: Header,
    frame: Bytes,
    body_offset: usize,
    second: Option<Bytes>,
}

#[derive(Default)]
struct Work {
    queue: VecDeque<Incoming>,
    /// A worker is waiting on the socket.
    leader: bool,
    /// Workers waiting on the condition variable.
    idle: usize,
}

struct Server {
    key: Key,
    node: Arc<NodeInner>,
    sock: Mutex<zmq::Socket>,
    zmq_fd: std::os::fd::RawFd,
    wake: EventFd,
    work: Mutex<Work>,
    cv: Condvar,
    handler: Box<Handler>,
    opts: ServeOptions,
    closed: AtomicBool,
}

/// A service being served. Dropping it withdraws the service: callers stop
/// finding it, requests still waiting for a worker are rejected, and the
/// drop waits for the calls running in handlers to finish.
pub struct Service {
    server: Arc<Server>,
    threads: Vec<JoinHandle<()>>,
    endpoint: String,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("key", &self.server.key.as_str())
            .field("endpoint", &self.endpoint)
            .field("workers", &self.server.opts.workers)
            .finish()
    }
}

impl Service {
    /// The service's key.
    pub fn key(&self) -> &str {
        self.server.key.as_str()
    }

    /// The endpoint callers connect to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn start(
        node: &Arc<NodeInner>,
        key: Key,
        opts: ServeOptions,
        handler: Box<Handler>,
    ) -> Result<Service, ServeError> {
        if opts.workers == 0 || opts.workers > 1024 {
            return Err(ServeError::Options(format!(
                "workers must be 1 to 1024, not {}",
                opts.workers
            )));
        }
        let sock = node.ctx.socket(zmq::ROUTER)?;
        let n = node.next_service_id();
        let endpoint = node.endpoint_for(&format!("s{n}"), None);
        let opt_err = |source| crate::error::OpenError::Socket {
            action: "configure",
            endpoint: endpoint.clone(),
            source,
        };
        zmq_io::apply_common(&sock, &node.cfg).map_err(opt_err)?;
        // A reply to a caller that has gone fails (and is counted) rather
        // than vanishing.
        sock.set_router_mandatory(true).map_err(opt_err)?;
        // Replies already queued get a moment to leave when the service goes.
        sock.set_linger(node.cfg.close_linger_ms.clamp(0, 1000))
            .map_err(opt_err)?;
        let bound = node.bind(&sock, &endpoint)?;
        let zmq_fd = sock.get_fd().map_err(opt_err)?;
        let wake = EventFd::new().map_err(ServeError::Thread)?;
        let server = Arc::new(Server {
            key,
            node: node.clone(),
            sock: Mutex::new(sock),
            zmq_fd,
            wake,
            work: Mutex::new(Work::default()),
            cv: Condvar::new(),
            handler,
            opts,
            closed: AtomicBool::new(false),
        });
        let mut service = Service {
            server: server.clone(),
            threads: Vec::new(),
            endpoint: bound,
        };
        for i in 0..server.opts.workers {
            let s = server.clone();
            let th = std::thread::Builder::new()
                .name(format!("milonga-svc{n}-{i}"))
                .spawn(move || s.work())
                .map_err(ServeError::Thread)?;
            // On an error above, dropping `service` stops the threads so far.
            service.threads.push(th);
        }
        Ok(service)
    }

    pub(crate) fn info(&self) -> ServiceInfo {
        ServiceInfo {
            key: self.key().to_owned(),
            endpoint: self.endpoint.clone(),
            workers: self.server.opts.workers,
            max_request_bytes: self.server.node.cfg.max_message_bytes,
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let s = &self.server;
        // Withdraw from the announcement first, so callers stop choosing it.
        s.node.withdraw_service(s.key.as_str(), &self.endpoint);
        s.closed.store(true, Ordering::Release);
        s.wake.signal();
        {
            let _w = lock(&s.work);
            s.cv.notify_all();
        }
        for th in self.threads.drain(..) {
            let _ = th.join();
        }
        // Whatever still waits for a worker is turned away explicitly.
        let waiting: Vec<_> = lock(&s.work).queue.drain(..).collect();
        let mut sock = lock(&s.sock);
        let gone = "the service was withdrawn";
        for r in waiting {
            s.refuse(
                &mut sock,
                r.identity,
                &r.header,
                ReplyStatus::NoSuchService,
                "withdrawn",
                gone,
            );
        }
        while let Ok(parts) = recv_parts(&mut sock) {
            if let Some(r) = s.parse(&mut sock, parts) {
                s.refuse(
                    &mut sock,
                    r.identity,
                    &r.header,
                    ReplyStatus::NoSuchService,
                    "withdrawn",
                    gone,
                );
            }
        }
    }
}

impl Server {
    /// A worker's life: run queued requests, lead when nobody does, wait
    /// otherwise.
    fn work(self: Arc<Self>) {
        loop {
            let job = {
                let mut w = lock(&self.work);
                loop {
                    if self.closed.load(Ordering::Acquire) {
                        return;
                    }
                    if let Some(j) = w.queue.pop_front() {
                        if !w.queue.is_empty() && w.idle > 0 {
                            self.cv.notify_one();
                        }
                        break Some(j);
                    }
                    if !w.leader {
                        w.leader = true;
                        break None;
                    }
                    w.idle += 1;
                    w = self.cv.wait(w).unwrap_or_else(|e| e.into_inner());
                    w.idle -= 1;
                }
            };
            match job {
                Some(j) => self.run(j),
                None => {
                    self.lead();
                    let mut w = lock(&self.work);
                    w.leader = false;
                    // Someone else waits on the socket while this thread
                    // runs what it read.
                    if w.idle > 0 {
                        self.cv.notify_one();
                    }
                }
            }
        }
    }

    /// Waits on the socket until at least one request is queued (or the
    /// service closes).
    fn lead(&self) {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            if self.drain(&mut lock(&self.sock)) > 0 {
                return;
            }
            let [_, woken] = zmq_io::poll_readable([self.zmq_fd, self.wake.raw()], -1);
            if woken {
                self.wake.clear();
            }
        }
    }

    /// Reads every message waiting on the socket; returns how many requests
    /// it queued. Beyond `max_queued`, requests are rejected at once.
    fn drain(&self, sock: &mut zmq::Socket) -> usize {
        let mut queued = 0;
        loop {
            let parts = match recv_parts(sock) {
                Ok(p) => p,
                Err(zmq::Error::EINTR) => continue,
                Err(_) => return queued,
            };
            let Some(r) = self.parse(sock, parts) else {
                continue;
            };
            let mut w = lock(&self.work);
            if w.queue.len() >= self.opts.max_queued {
                drop(w);
                stats::inc(&self.node.counters.calls_rejected);
                let msg = format!(
                    "{} requests already wait for a worker (max_queued)",
                    self.opts.max_queued
                );
                self.refuse(
                    sock,
                    r.identity,
                    &r.header,
                    ReplyStatus::Rejected,
                    "overload",
                    &msg,
                );
                continue;
            }
            w.queue.push_back(r);
            queued += 1;
        }
    }

    /// Checks a received message; answers at once the ones no handler
    /// should see. Runs with the socket locked (`sock`).
    fn parse(&self, sock: &mut zmq::Socket, mut parts: Vec<zmq::Message>) -> Option<Incoming> {
        let c = &self.node.counters;
        if parts.len() < 2 || parts.len() > 3 {
            stats::inc(&c.frames_malformed);
            return None;
        }
        let second = (parts.len() == 3).then(|| message_bytes(parts.pop().expect("3 parts")));
        let frame = message_bytes(parts.pop().expect("2 parts"));
        let identity = parts.pop().expect("1 part");
        let view = match frame::decode(&frame) {
            Ok(v) => v,
            Err(err) => {
                let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                if n <= 10 || n % 1000 == 0 {
                    tracing::warn!(service = %self.key.as_str(), %err, dropped_so_far = n, "dropped a malformed request");
                }
                return None;
            }
        };
        let header = view.header;
        if header.kind != Kind::Request
            || (header.flags & FLAG_PAYLOAD_FRAME != 0) != second.is_some()
        {
            stats::inc(&c.frames_malformed);
            return None;
        }
        if header.domain_tag != self.node.domain_tag {
            stats::inc(&c.frames_foreign_domain);
            let why = format!("this service is in domain {:?}", self.node.domain);
            self.refuse(
                sock,
                identity,
                &header,
                ReplyStatus::Rejected,
                "wrong_domain",
                &why,
            );
            return None;
        }
        if view.key != self.key.as_str() {
            let why = format!(
                "this endpoint serves {:?}, not {:?}",
                self.key.as_str(),
                view.key
            );
            self.refuse(
                sock,
                identity,
                &header,
                ReplyStatus::NoSuchService,
                "no_such_service",
                &why,
            );
            return None;
        }
        let body_offset = view.body_offset;
        Some(Incoming {
            identity,
            header,
            frame,
            body_offset,
            second,
        })
    }

    /// Runs one request and sends its reply.
    fn run(&self, r: Incoming) {
        let c = &self.node.counters;
        let h = r.header;
        let first = r.frame.slice(r.body_offset..);
        let outcome = match decode_payload(h.encoding, first, r.second) {
            Err(err) => Err((
                ReplyStatus::Rejected,
                Failure {
                    kind: "bad_request".into(),
                    message: format!("the request does not decode: {err}"),
                },
            )),
            Ok(value) => {
                let req = Request {
                    key: self.key.as_str().to_owned(),
                    value,
                    caller: h.node_id,
                    call_id: h.seq,
                    timestamp_ns: h.timestamp_ns,
                };
                match catch_unwind(AssertUnwindSafe(|| (self.handler)(req))) {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err((
                        ReplyStatus::Error,
                        Failure {
                            kind: e.kind,
                            message: e.message,
                        },
                    )),
                    Err(panic) => {
                        stats::inc(&c.handler_panics);
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a non-text panic payload".into());
                        tracing::error!(service = %self.key.as_str(), panic = %what, "a handler panicked; the service goes on");
                        Err((
                            ReplyStatus::Error,
                            Failure {
                                kind: "panic".into(),
                                message: format!("the handler panicked: {what}"),
                            },
                        ))
                    }
                }
            }
        };
        let (head, tail) = match outcome.and_then(|v| {
            encode_payload(&v, self.node.cfg.zero_copy_threshold_bytes).map_err(|e| {
                (
                    ReplyStatus::Error,
                    Failure {
                        kind: "bad_reply".into(),
                        message: format!("the handler's reply cannot be encoded: {e}"),
                    },
                )
            })
        }) {
            Ok(Encoded {
                encoding,
                head,
                tail,
            }) => {
                let size = frame::head_len(&self.key)
                    + 1
                    + head.len()
                    + tail.as_ref().map_or(0, Bytes::len);
                if size > self.node.cfg.max_message_bytes {
                    let f = Failure {
                        kind: "too_large".into(),
                        message: format!(
                            "the reply has {size} bytes, over the limit of {} (max_message_bytes)",
                            self.node.cfg.max_message_bytes
                        ),
                    };
                    (
                        self.reply_frame(&h, ReplyStatus::Error, Encoding::Cbor, 0, &f.encode()),
                        None,
                    )
                } else {
                    let flags = if tail.is_some() {
                        FLAG_PAYLOAD_FRAME
                    } else {
                        0
                    };
                    (
                        self.reply_frame(&h, ReplyStatus::Ok, encoding, flags, &head),
                        tail,
                    )
                }
            }
            Err((status, f)) => (
                self.reply_frame(&h, status, Encoding::Cbor, 0, &f.encode()),
                None,
            ),
        };
        let mut sock = lock(&self.sock);
        self.send(&mut sock, r.identity, head, tail);
        stats::inc(&c.calls_served);
        let queued = self.drain(&mut sock);
        drop(sock);
        if queued > 1 {
            let w = lock(&self.work);
            if w.idle > 0 {
                self.cv.notify_one();
            }
        }
    }

    /// Answers a request without running the handler.
    fn refuse(
        &self,
        sock: &mut zmq::Socket,
        identity: zmq::Message,
        h: &Header,
        status: ReplyStatus,
        kind: &str,
        message: &str,
    ) {
        let f = Failure {
            kind: kind.into(),
            message: message.into(),
        };
        let msg = self.reply_frame(h, status, Encoding::Cbor, 0, &f.encode());
        self.send(sock, identity, msg, None);
    }

    /// `key | 0 | header | status | body` for a reply to `req`.
    fn reply_frame(
        &self,
        req: &Header,
        status: ReplyStatus,
        encoding: Encoding,
        flags: u8,
        body: &[u8],
    ) -> Vec<u8> {
        let header = Header {
            kind: Kind::Reply,
            flags,
            encoding,
            domain_tag: self.node.domain_tag,
            schema_id: 0,
            node_id: self.node.id,
            seq: req.seq,
            timestamp_ns: crate::publisher::now_ns(),
        };
        let n = frame::head_len(&self.key);
        let mut out = vec![0u8; n + 1 + body.len()];
        frame::write_head(&self.key, &header, &mut out);
        out[n] = status as u8;
        out[n + 1..].copy_from_slice(body);
        out
    }

    fn send(
        &self,
        sock: &mut zmq::Socket,
        identity: zmq::Message,
        head: Vec<u8>,
        tail: Option<Bytes>,
    ) {
        let more = if tail.is_some() { zmq::SNDMORE } else { 0 };
        let sent = sock
            .send(identity, zmq::DONTWAIT | zmq::SNDMORE)
            .and_then(|_| sock.send(head, zmq::DONTWAIT | more))
            .and_then(|_| match tail {
                Some(t) => zmq_io::send_bytes(sock, t, zmq::DONTWAIT),
                None => Ok(()),
            });
        if let Err(err) = sent {
            // EHOSTUNREACH: the caller is gone. EAGAIN: its queue is full.
            let n = self
                .node
                .counters
                .replies_undeliverable
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            if n <= 10 || n % 1000 == 0 {
                tracing::info!(service = %self.key.as_str(), %err, dropped_so_far = n, "a reply could not be delivered (the caller left, or is not reading)");
            }
        }
    }
}

/// Receives one whole message (every frame) without copying it.
pub(crate) fn recv_parts(sock: &mut zmq::Socket) -> zmq::Result<Vec<zmq::Message>> {
    let mut parts = vec![sock.recv_msg(zmq::DONTWAIT)?];
    while sock.get_rcvmore()? {
        // The rest of a message is there as soon as its first frame is.
        parts.push(sock.recv_msg(0)?);
    }
    Ok(parts)
}
