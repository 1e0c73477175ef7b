//! Services, the calling side.
//!
//! The calling thread does its own I/O: it takes a connection (a DEALER
//! socket) to the chosen server from a pool, sends the request, and waits on
//! that socket and its monitor. So a call costs what a hand-written DEALER
//! round trip costs, calls from many threads run side by side (each on its
//! own connection), and a connection that breaks mid-call (the server's
//! process died) ends the call at once as [`CallError::ServerLost`].
//!
//! Server choice: among the servers discovery knows for the key, the one with
//! the fewest calls in flight from this node; ties go round robin.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use milonga_wire::cbor::{encode_payload, Encoded};
use milonga_wire::frame;
use milonga_wire::{Bytes, Key, KeyExpr, NodeId, Value};

use crate::backend::p2p::call_link::CallLink;
use crate::engine::call::{outcome, Waiting};
use crate::engine::Me;
use crate::model::error::CallError;
use crate::session::callers::Target;
use crate::session::NodeInner;
use crate::util::lock;
use crate::util::stats;

/// How often a waiting call looks at its connection's monitor (a lost
/// server), discovery and `close`.
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// A call that has been sent: wait for its outcome with
/// [`PendingCall::wait`], or `.await` it.
pub struct PendingCall {
    state: Option<InFlight>,
    /// Filled by the helper thread when the call is awaited.
    shared: Option<Arc<Awaited>>,
}

/// The outcome of a call.
type Outcome = Result<Value, CallError>;

/// Where the helper thread of an awaited call leaves its outcome.
#[derive(Default)]
struct Awaited {
    slot: Mutex<(Option<Outcome>, Option<Waker>)>,
    done: std::sync::Condvar,
    /// Set when the future is dropped before its end: the helper thread
    /// stops waiting at its next check (within [`CHECK_EVERY`]).
    cancelled: Arc<AtomicBool>,
}

/// A call sent by [`start_all`] to one server.
pub(crate) type Sent = (Arc<Target>, Result<PendingCall, CallError>);

impl std::fmt::Debug for PendingCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("PendingCall");
        if let Some(s) = &self.state {
            d.field("key", &s.target.key)
                .field("server", &s.target.server)
                .field("call_id", &s.call_id);
        }
        d.finish()
    }
}

/// A sent call's state.
struct InFlight {
    node: Arc<NodeInner>,
    target: Arc<Target>,
    channel: Option<CallLink>,
    call_id: u64,
    deadline: Instant,
    timeout: Duration,
    /// Set when nobody waits for the outcome any more.
    cancelled: Option<Arc<AtomicBool>>,
    /// A broker client: the broker the call went through. Once the node
    /// moved to another, its reply can no longer come (the old broker is
    /// dead or silent): the call ends `ServerLost` (docs/broker.md).
    via: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // A connection whose call ended (even by timeout: a late reply is
        // recognised by its call id and dropped) serves the next call,
        // unless it broke since (the next call opens a fresh one).
        let channel = self
            .channel
            .take()
            .and_then(|mut ch| (!ch.is_down()).then_some(ch));
        self.target.finished(channel);
    }
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            shared.cancelled.store(true, Ordering::Relaxed);
        }
    }
}

impl PendingCall {
    /// Blocks until the call ends: the reply, or the reason there is none.
    pub fn wait(mut self) -> Result<Value, CallError> {
        if let Some(shared) = self.shared.take() {
            // Already handed to a helper thread by `poll`: wait for it.
            let mut g = lock(&shared.slot);
            loop {
                if let Some(r) = g.0.take() {
                    return r;
                }
                g = shared.done.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        self.state.take().expect("a pending call has state").wait()
    }

    /// Waits at most `at_most` for the outcome: `None` if the call is still
    /// pending then (wait again), the outcome otherwise. Bindings wait in
    /// such slices to notice a Ctrl-C. After the outcome, or on a call
    /// already awaited as a future, it returns `Some(Err(Closed))`.
    pub fn wait_for(&mut self, at_most: Duration) -> Option<Result<Value, CallError>> {
        let stop = Instant::now() + at_most;
        if let Some(shared) = &self.shared {
            let mut g = lock(&shared.slot);
            loop {
                if let Some(r) = g.0.take() {
                    drop(g);
                    self.shared = None;
                    return Some(r);
                }
                let left = stop.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                g = shared
                    .done
                    .wait_timeout(g, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let Some(state) = self.state.as_mut() else {
            return Some(Err(CallError::Closed));
        };
        let r = state.wait_until(Some(stop))?;
        self.state = None;
        Some(r)
    }

    /// The server the call went to (its node's name).
    pub fn server(&self) -> Option<&str> {
        self.state.as_ref().map(|s| s.target.server.as_str())
    }
}

impl Future for PendingCall {
    type Output = Result<Value, CallError>;

    /// The first poll hands the wait to a helper thread, which wakes the
    /// task when the call ends.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(mut state) = self.state.take() {
            let shared = Arc::new(Awaited::default());
            state.cancelled = Some(shared.cancelled.clone());
            lock(&shared.slot).1 = Some(cx.waker().clone());
            let s2 = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("milonga-call".into())
                .spawn(move || {
                    let r = state.wait();
                    let waker = {
                        let mut g = lock(&s2.slot);
                        g.0 = Some(r);
                        s2.done.notify_all();
                        g.1.take()
                    };
                    if let Some(w) = waker {
                        w.wake();
                    }
                });
            if let Err(e) = spawned {
                return Poll::Ready(Err(CallError::Thread(e.to_string())));
            }
            self.shared = Some(shared);
            return Poll::Pending;
        }
        let Some(shared) = &self.shared else {
            return Poll::Ready(Err(CallError::Thread("polled after completion".into())));
        };
        let mut g = lock(&shared.slot);
        match g.0.take() {
            Some(r) => {
                drop(g);
                self.shared = None;
                Poll::Ready(r)
            }
            None => {
                g.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// The reply of one server to [`crate::Node::call_all`].
#[derive(Debug)]
#[non_exhaustive]
pub struct ServerReply {
    /// The service's key.
    pub key: String,
    /// The server's node name.
    pub server: String,
    /// The server's node id.
    pub node: NodeId,
    /// Its reply, or why there is none.
    pub result: Result<Value, CallError>,
}

/// Sends a call to the best server of `key`.
pub(crate) fn start(
    node: &Arc<NodeInner>,
    key: &str,
    value: &Value,
    timeout: Duration,
) -> Result<PendingCall, CallError> {
    if node.is_closed() {
        return Err(CallError::Closed);
    }
    let key = Key::new(key)?;
    let enc = encode_payload(value, node.cfg().zero_copy_threshold_bytes)?;
    let Some(servers) = node
        .callers()
        .servers_of(key.as_str())
        .filter(|s| !s.is_empty())
    else {
        stats::inc(&node.counters().calls_no_server);
        return Err(CallError::NoServer {
            key: key.as_str().to_owned(),
        });
    };
    let target = node.callers().choose(&servers);
    send(node, target, &key, &enc, timeout)
}

/// Sends a call to every server of a key matching `expr`.
pub(crate) fn start_all(
    node: &Arc<NodeInner>,
    expr: &str,
    value: &Value,
    timeout: Duration,
) -> Result<Vec<Sent>, CallError> {
    if node.is_closed() {
        return Err(CallError::Closed);
    }
    let expr = KeyExpr::new(expr)?;
    let enc = encode_payload(value, node.cfg().zero_copy_threshold_bytes)?;
    let servers = node.callers().servers_matching(&expr);
    if servers.is_empty() {
        stats::inc(&node.counters().calls_no_server);
        return Err(CallError::NoServer {
            key: expr.as_str().to_owned(),
        });
    }
    Ok(servers
        .into_iter()
        .map(|t| {
            let r = send(node, t.clone(), &t.key, &enc, timeout);
            (t, r)
        })
        .collect())
}

fn send(
    node: &Arc<NodeInner>,
    target: Arc<Target>,
    key: &Key,
    enc: &Encoded,
    timeout: Duration,
) -> Result<PendingCall, CallError> {
    let size = frame::head_len(key) + enc.head.len() + enc.tail.as_ref().map_or(0, Bytes::len);
    let limit = node.cfg().max_message_bytes.min(target.max_request_bytes);
    if size > limit {
        stats::inc(&node.counters().calls_rejected);
        return Err(CallError::Rejected {
            server: None,
            kind: "too_large".into(),
            message: format!(
                "the request has {size} bytes, over the limit of {limit} (max_message_bytes here or at the server)"
            ),
        });
    }
    let call_id = node.callers().next_call_id();
    let msg = crate::engine::call::request_frame(
        &Me::from(node.core()),
        key,
        call_id,
        enc,
        crate::util::now_ns(),
    );

    // The broker in use before a channel is chosen: a move between the two
    // makes the call end `ServerLost` (its channel may go to the old one).
    let via = node.backend().broker_in_use();
    let channel = match target.idle_channel() {
        Some(c) => c,
        None => open_channel(node, &target)?,
    };
    target.started();
    let deadline = Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(100 * 365 * 86_400));
    let mut call = InFlight {
        node: node.clone(),
        target,
        channel: Some(channel),
        call_id,
        deadline,
        timeout,
        cancelled: None,
        via,
    };
    let ch = call.channel.as_mut().expect("just set");
    if let Err(e) = ch.send(msg, enc.tail.as_ref()) {
        call.channel = None;
        return Err(CallError::Socket(e));
    }
    stats::inc(&node.counters().calls_sent);
    Ok(PendingCall {
        state: Some(call),
        shared: None,
    })
}

fn open_channel(node: &NodeInner, target: &Target) -> Result<CallLink, CallError> {
    // A reply is bounded by the server's limit (it refuses to send larger
    // ones). Were the connection's limit this node's smaller one, ZeroMQ
    // would drop the connection on a larger reply and the call would end
    // as a lost server; instead the reply is received and refused as
    // `BadReply`, and the connection lives on.
    let limit = node.cfg().max_message_bytes.max(target.max_request_bytes);
    let n = node.callers().next_channel();
    CallLink::open(node.backend(), n, &target.endpoint, limit).map_err(CallError::Open)
}

impl InFlight {
    fn wait(mut self) -> Result<Value, CallError> {
        self.wait_until(None)
            .expect("a wait without a limit ends with an outcome")
    }

    /// Waits for the outcome until `stop` at most: `None` if the call is
    /// still pending then.
    fn wait_until(&mut self, stop: Option<Instant>) -> Option<Result<Value, CallError>> {
        let r = self.wait_inner(stop)?;
        if matches!(r, Err(CallError::ServerLost { .. })) {
            // The connection is broken; do not reuse it.
            self.channel = None;
        }
        Some(r)
    }

    fn wait_inner(&mut self, stop: Option<Instant>) -> Option<Result<Value, CallError>> {
        let c = self.node.counters();
        let server = self.target.server.clone();
        loop {
            let now = Instant::now();
            if stop.is_some_and(|s| now >= s) && now < self.deadline {
                return None;
            }
            if now >= self.deadline {
                stats::inc(&c.calls_timed_out);
                return Some(Err(CallError::Timeout {
                    key: self.target.key.as_str().to_owned(),
                    server,
                    after: self.timeout,
                }));
            }
            // One blocking receive, as a hand-written client would do; the
            // monitor, `close` and discovery are looked at between slices.
            let until = stop.map_or(self.deadline, |s| s.min(self.deadline));
            let slice = until.saturating_duration_since(now).min(CHECK_EVERY);
            let ms = slice.as_micros().div_ceil(1000).max(1) as i32;
            let ch = self.channel.as_mut().expect("a waiting call has a channel");
            match ch.recv_wait(ms) {
                Ok(Some(parts)) => {
                    let to = Waiting {
                        call_id: self.call_id,
                        key: self.target.key.as_str(),
                        server: &self.target.server,
                    };
                    if let Some(r) = outcome(&Me::from(self.node.core()), &to, parts) {
                        return Some(r);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Some(Err(CallError::Socket(e))),
            }
            // The connection's state is its last event: a disconnection
            // followed by a reconnection (older than this call, or a
            // hiccup) is not a lost server.
            if ch.is_down() {
                if ch.refused() {
                    return Some(Err(CallError::PermissionDenied {
                        server,
                        reason:
                            "the server's node refused this node's key (not in its trust directory)"
                                .into(),
                    }));
                }
                stats::inc(&c.calls_server_lost);
                return Some(Err(CallError::ServerLost { server }));
            }
            if self.node.is_closed() {
                return Some(Err(CallError::Closed));
            }
            if self
                .cancelled
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed))
            {
                // Nobody will read this outcome.
                return Some(Err(CallError::Closed));
            }
            // A server whose process is gone before its connection was
            // made never reports a disconnection: discovery does. Through
            // a broker the node left (it died, or fell silent), nothing
            // comes back either.
            let gone = !self.node.knows_peer(self.target.node)
                || self.via.is_some() && self.node.backend().broker_in_use() != self.via;
            if gone {
                stats::inc(&c.calls_server_lost);
                return Some(Err(CallError::ServerLost { server }));
            }
        }
    }
}

/// Gathers the outcomes of calls sent by [`start_all`].
pub(crate) fn gather(sent: Vec<Sent>) -> Vec<ServerReply> {
    sent.into_iter()
        .map(|(t, p)| ServerReply {
            key: t.key.as_str().to_owned(),
            server: t.server.clone(),
            node: t.node,
            result: p.and_then(PendingCall::wait),
        })
        .collect()
}
