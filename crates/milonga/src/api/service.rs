//! Services, the serving side: a ROUTER socket per service and a pool of
//! worker threads (leader/followers with a standby).
//!
//! One worker leads: it waits on the socket, reads a request and runs the
//! handler itself, then sends the reply and reads the next. With a fast
//! handler that is all that happens, which costs what a hand-written ROUTER
//! loop costs. An idle worker stands by: when the leader's handler has run
//! for [`TAKEOVER`], the standby takes the lead (the socket is free while a
//! handler runs) and another idle worker stands by. A worker that finishes a
//! handler after losing the lead gives its reply to the leader (an outbox,
//! and a wake-up message to the socket from an inproc peer). So a slow
//! handler holds one worker, not the service.
//!
//! When no other worker is idle, the leader does not run what it reads: it
//! queues it for the next worker to finish, up to `max_queued`, and answers
//! further requests at once with status `rejected`, kind `overload`. With a
//! single worker, calls simply run one at a time in arrival order.
//!
//! The standby checks the leader every [`TAKEOVER`] while calls come in, and
//! sleeps without a timer when none has come for a while, so an idle
//! service costs no CPU.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use milonga_wire::cbor::{decode_payload, encode_payload};
use milonga_wire::frame::Header;
use milonga_wire::service::{Failure, ReplyStatus};
use milonga_wire::{Bytes, Key, NodeId, Value};

use crate::backend::p2p::serve_link::{Caller, ServeLink, ServeMonitor, ServeWaker};
use crate::engine::serve::{check_request, reply_of, Check};
use crate::engine::Me;
use crate::model::error::ServeError;
use crate::session::NodeInner;
use crate::util::lock;
use crate::util::stats;

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

pub use milonga_wire::announce::ServiceInfo;

type Handler = dyn Fn(Request) -> Result<Value, ServiceError> + Send + Sync;

/// How long the leader may run a handler before the standby takes the lead.
pub const TAKEOVER: Duration = Duration::from_millis(2);
/// Checks of the standby with no new call before it sleeps without a timer.
const QUIET_CHECKS: u32 = 50;

/// A request read from the socket.
struct Incoming {
    identity: Caller,
    header: Header,
    frame: Bytes,
    body_offset: usize,
    second: Option<Bytes>,
}

/// A reply ready to go.
struct Outgoing {
    identity: Caller,
    head: Vec<u8>,
    tail: Option<Bytes>,
}

#[derive(Default)]
struct Pool {
    /// The worker that reads the socket (it may be running a handler).
    leader: Option<usize>,
    /// Since when the leader runs a handler.
    leader_busy_since: Option<Instant>,
    /// Requests read while no other worker was idle.
    queue: VecDeque<Incoming>,
    /// Replies of workers that lost the lead, for the leader to send.
    outbox: Vec<Outgoing>,
    /// An idle worker watches the leader.
    standby: bool,
    /// The standby sleeps without a timer (no call came lately).
    standby_asleep: bool,
    /// Idle workers, the standby included.
    idle: usize,
    /// Requests read so far, to tell traffic from quiet.
    taken: u64,
    /// Queued requests per caller connection (ROUTER identity): one
    /// connection may hold at most a quarter of the queue, so that a flood
    /// from one caller gets the rejections, not everybody else while its
    /// backlog drains.
    queued_by: HashMap<Vec<u8>, usize>,
}

/// The share of `max_queued` one caller connection may hold.
fn per_caller_limit(max_queued: usize) -> usize {
    (max_queued / 4).max(1)
}

struct Server {
    key: Key,
    node: Arc<NodeInner>,
    /// Held by the leader while it reads or sends, not while a handler runs.
    sock: Mutex<ServeLink>,
    /// An inproc peer of the socket: an empty message from it wakes the
    /// leader (outbox, close).
    waker: ServeWaker,
    pool: Mutex<Pool>,
    standby_cv: Condvar,
    followers_cv: Condvar,
    handler: Box<Handler>,
    opts: ServeOptions,
    closed: AtomicBool,
    /// The reader of `sock`'s monitor, shared with the node thread; let go
    /// only after the monitor is stopped (`ServeLink`'s drop: `sock` is
    /// declared first).
    _monitor: ServeMonitor,
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

    /// The endpoint callers connect to (see [`crate::p2p::ServiceExt`]).
    pub(crate) fn bound_endpoint(&self) -> &str {
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
        let n = node.next_service_id();
        let endpoint = node.backend().endpoint_for(&format!("s{n}"), None);
        let (sock, waker, bound, monitor) = ServeLink::open(node.backend(), n, &endpoint)?;
        let server = Arc::new(Server {
            key,
            node: node.clone(),
            sock: Mutex::new(sock),
            waker,
            pool: Mutex::new(Pool::default()),
            standby_cv: Condvar::new(),
            followers_cv: Condvar::new(),
            handler,
            opts,
            closed: AtomicBool::new(false),
            _monitor: monitor.clone(),
        });
        {
            let weak: std::sync::Weak<Server> = Arc::downgrade(&server);
            let weak: std::sync::Weak<dyn std::any::Any + Send + Sync> = weak;
            node.backend().watch_service(weak, monitor);
        }
        let mut service = Service {
            server: server.clone(),
            threads: Vec::new(),
            endpoint: bound,
        };
        for i in 0..server.opts.workers {
            let s = server.clone();
            let th = std::thread::Builder::new()
                .name(format!("milonga-svc{n}-{i}"))
                .spawn(move || s.work(i))
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
            max_request_bytes: self.server.node.cfg().max_message_bytes,
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let s = &self.server;
        // Withdraw from the announcement first, so callers stop choosing it.
        s.node.withdraw_service(s.key.as_str(), &self.endpoint);
        s.closed.store(true, Ordering::Release);
        s.wake();
        {
            let _p = lock(&s.pool);
            s.standby_cv.notify_all();
            s.followers_cv.notify_all();
        }
        // A handler may drop its own service: that worker is not waited
        // for (it ends once its handler returns).
        let me = std::thread::current().id();
        for th in self.threads.drain(..) {
            if th.thread().id() != me {
                let _ = th.join();
            }
        }
        // Replies still to send go; what still waits is turned away.
        let (waiting, outbox) = {
            let mut p = lock(&s.pool);
            (
                p.queue.drain(..).collect::<Vec<_>>(),
                std::mem::take(&mut p.outbox),
            )
        };
        let mut sock = lock(&s.sock);
        for out in outbox {
            s.send(&mut sock, out);
        }
        let turn_away = |sock: &mut ServeLink, r: Incoming| {
            let f = Failure {
                kind: "withdrawn".into(),
                message: "the service was withdrawn".into(),
            };
            s.refuse(
                sock,
                r.identity,
                &r.header,
                ReplyStatus::NoSuchService,
                f,
                None,
            );
        };
        for r in waiting {
            turn_away(&mut sock, r);
        }
        while let Ok(Some((caller, frames))) = sock.recv(false) {
            if frames.len() == 1 && frames[0].is_empty() {
                continue;
            }
            if let Some(r) = s.parse(&mut sock, caller, frames) {
                turn_away(&mut sock, r);
            }
        }
    }
}

impl Server {
    /// A worker's life: run queued requests, lead when nobody does, stand
    /// by or wait otherwise.
    fn work(self: Arc<Self>, me: usize) {
        let mut p = lock(&self.pool);
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            if let Some(job) = p.queue.pop_front() {
                let id = job.identity.to_vec();
                if let Some(n) = p.queued_by.get_mut(&id) {
                    *n -= 1;
                    if *n == 0 {
                        p.queued_by.remove(&id);
                    }
                }
                drop(p);
                let out = self.answer(job);
                self.deliver(me, out);
                p = lock(&self.pool);
                continue;
            }
            if p.leader.is_none() {
                p.leader = Some(me);
                drop(p);
                self.lead(me);
                p = lock(&self.pool);
                continue;
            }
            if p.standby {
                p.idle += 1;
                p = self.followers_cv.wait(p).unwrap_or_else(|e| e.into_inner());
                p.idle -= 1;
                continue;
            }
            p = self.stand_by(me, p);
        }
    }

    /// Watches the leader; returns when there is queued work, nobody leads,
    /// the service closes, or after taking the lead from a leader whose
    /// handler has run for [`TAKEOVER`] (then it has led).
    fn stand_by<'a>(&'a self, me: usize, mut p: MutexGuard<'a, Pool>) -> MutexGuard<'a, Pool> {
        p.standby = true;
        p.idle += 1;
        let mut quiet = 0;
        let mut last_taken = p.taken;
        let mut took_over = false;
        loop {
            if self.closed.load(Ordering::Acquire) || !p.queue.is_empty() || p.leader.is_none() {
                break;
            }
            if let Some(since) = p.leader_busy_since {
                if since.elapsed() >= TAKEOVER {
                    p.leader = Some(me);
                    p.leader_busy_since = None;
                    took_over = true;
                    break;
                }
            }
            if p.taken == last_taken {
                quiet += 1;
            } else {
                last_taken = p.taken;
                quiet = 0;
            }
            if quiet > QUIET_CHECKS && p.leader_busy_since.is_none() {
                p.standby_asleep = true;
                p = self.standby_cv.wait(p).unwrap_or_else(|e| e.into_inner());
                p.standby_asleep = false;
                quiet = 0;
            } else {
                let wait = p
                    .leader_busy_since
                    .map_or(TAKEOVER, |s| TAKEOVER.saturating_sub(s.elapsed()))
                    .max(Duration::from_micros(100));
                p = self
                    .standby_cv
                    .wait_timeout(p, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        p.standby = false;
        p.idle -= 1;
        // Another idle worker stands by in turn.
        if p.idle > 0 {
            self.followers_cv.notify_one();
        }
        if took_over {
            drop(p);
            self.lead(me);
            p = lock(&self.pool);
        }
        p
    }

    /// Reads the socket and runs what it reads, until another worker takes
    /// the lead or the service closes.
    fn lead(&self, me: usize) {
        let mut sock = Some(lock(&self.sock));
        loop {
            let s = sock.get_or_insert_with(|| lock(&self.sock));
            if self.closed.load(Ordering::Acquire) {
                lock(&self.pool).leader = None;
                return;
            }
            let (caller, frames) = match s.recv(true) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(err) => {
                    tracing::error!(service = %self.key.as_str(), %err, "cannot read the service socket");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let mut p = lock(&self.pool);
            if !p.outbox.is_empty() {
                let out = std::mem::take(&mut p.outbox);
                drop(p);
                for o in out {
                    self.send(s, o);
                }
                p = lock(&self.pool);
            }
            if frames.len() == 1 && frames[0].is_empty() {
                // A wake-up: the outbox is sent, `closed` is checked above.
                continue;
            }
            drop(p);
            let Some(r) = self.parse(s, caller, frames) else {
                continue;
            };
            stats::inc(&self.node.counters().requests_received);
            let mut p = lock(&self.pool);
            p.taken += 1;
            if self.opts.workers > 1 && (p.idle == 0 || !p.queue.is_empty()) {
                // Nobody else would read while this ran: queue it.
                let caller = r.identity.to_vec();
                let share = per_caller_limit(self.opts.max_queued);
                let mine = p.queued_by.get(&caller).copied().unwrap_or(0);
                if p.queue.len() >= self.opts.max_queued || mine >= share {
                    drop(p);
                    stats::inc(&self.node.counters().calls_rejected);
                    let msg = if mine >= share {
                        format!(
                            "{mine} requests of this caller already wait for a worker (a caller may hold a quarter of max_queued)"
                        )
                    } else {
                        format!(
                            "{} requests already wait for a worker (max_queued)",
                            self.opts.max_queued
                        )
                    };
                    let f = Failure {
                        kind: "overload".into(),
                        message: msg,
                    };
                    self.refuse(s, r.identity, &r.header, ReplyStatus::Rejected, f, None);
                    continue;
                }
                *p.queued_by.entry(caller).or_insert(0) += 1;
                p.queue.push_back(r);
                if p.idle > 0 {
                    self.followers_cv.notify_one();
                    self.standby_cv.notify_one();
                }
                continue;
            }
            // Run it here, watched by the standby.
            p.leader_busy_since = Some(Instant::now());
            if p.standby_asleep {
                p.standby_asleep = false;
                self.standby_cv.notify_one();
            }
            drop(p);
            sock = None;
            let out = self.answer(r);
            let mut p = lock(&self.pool);
            if p.leader != Some(me) && !self.closed.load(Ordering::Acquire) {
                // The standby took over meanwhile (and cleared the busy
                // mark, which now belongs to the new leader). (Once the
                // service is closed, nobody else sends: the handler may
                // have dropped its own service, whose drop has sent the
                // outbox already, so the reply goes out from here.)
                p.outbox.push(out);
                drop(p);
                self.wake();
                return;
            }
            p.leader_busy_since = None;
            drop(p);
            let s = sock.insert(lock(&self.sock));
            self.send(s, out);
        }
    }

    /// Sends a reply from a worker that may not lead.
    fn deliver(&self, me: usize, out: Outgoing) {
        let mut p = lock(&self.pool);
        if p.leader.is_none() || p.leader == Some(me) || self.closed.load(Ordering::Acquire) {
            drop(p);
            self.send(&mut lock(&self.sock), out);
        } else {
            p.outbox.push(out);
            drop(p);
            self.wake();
        }
    }

    /// Makes the leader's receive return.
    fn wake(&self) {
        self.waker.wake();
    }

    /// Checks a received message; answers at once the ones no handler
    /// should see. Runs with the socket locked (`sock`).
    fn parse(
        &self,
        sock: &mut ServeLink,
        identity: Caller,
        frames: Vec<Bytes>,
    ) -> Option<Incoming> {
        let me = Me::from(self.node.core());
        match check_request(&me, &self.node.core().domain, &self.key, frames) {
            Check::Accept(r) => {
                if let Err(f) = self.permitted(&identity) {
                    self.refuse(sock, identity, &r.header, ReplyStatus::Rejected, f, None);
                    return None;
                }
                Some(Incoming {
                    identity,
                    header: r.header,
                    frame: r.frame,
                    body_offset: r.body_offset,
                    second: r.second,
                })
            }
            Check::Refuse(header, status, f, asked) => {
                self.refuse(sock, identity, &header, status, f, asked.as_ref());
                None
            }
            Check::Drop => None,
        }
    }

    /// Whether the node's access control rules let `caller` call this
    /// service: else the failure it is refused with (kind
    /// `permission_denied`, the message naming the rules file).
    fn permitted(&self, caller: &Caller) -> Result<(), Failure> {
        let Some(g) = self.node.backend().security() else {
            return Ok(());
        };
        // An inproc caller has no handshake, hence no key: it is this process.
        if caller.key().is_none() && self.node.cfg().transport == crate::Transport::Inproc {
            return Ok(());
        }
        let key = self.key.as_str();
        g.allowed(caller.key(), |acl, who| {
            acl.check(who, crate::model::acl::Operation::Call, key)
        })
        .map_err(|why| {
            stats::inc(&self.node.counters().acl_denied);
            limited!(warn, service = %key, %why, "access control refused a call");
            Failure {
                kind: "permission_denied".into(),
                message: why,
            }
        })
    }

    /// Runs the handler on one request: its reply.
    fn answer(&self, r: Incoming) -> Outgoing {
        let c = self.node.counters();
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
        let encoded = outcome.and_then(|v| {
            encode_payload(&v, self.node.cfg().zero_copy_threshold_bytes).map_err(|e| {
                (
                    ReplyStatus::Error,
                    Failure {
                        kind: "bad_reply".into(),
                        message: format!("the handler's reply cannot be encoded: {e}"),
                    },
                )
            })
        });
        let me = Me::from(self.node.core());
        let (head, tail) = reply_of(&me, &self.key, &h, encoded, crate::util::now_ns());
        stats::inc(&c.calls_served);
        Outgoing {
            identity: r.identity,
            head,
            tail,
        }
    }

    /// Answers a request without running the handler.
    fn refuse(
        &self,
        sock: &mut ServeLink,
        identity: Caller,
        h: &Header,
        status: ReplyStatus,
        f: Failure,
        asked: Option<&Key>,
    ) {
        let me = Me::from(self.node.core());
        let key = asked.unwrap_or(&self.key);
        let (head, _) = reply_of(&me, key, h, Err((status, f)), crate::util::now_ns());
        self.send(
            sock,
            Outgoing {
                identity,
                head,
                tail: None,
            },
        );
    }

    fn send(&self, sock: &mut ServeLink, out: Outgoing) {
        let Outgoing {
            identity,
            head,
            tail,
        } = out;
        if let Err(err) = sock.send(identity, head, tail) {
            // EHOSTUNREACH: the caller is gone. EAGAIN: its queue is full.
            let n = self
                .node
                .counters()
                .replies_undeliverable
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            if n <= 10 || n % 1000 == 0 {
                tracing::info!(service = %self.key.as_str(), %err, dropped_so_far = n, "a reply could not be delivered (the caller left, or is not reading)");
            }
        }
    }
}
