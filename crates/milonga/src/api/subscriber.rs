//! Subscriptions: the handle, and the thread that receives for it. The
//! protocol's checks live in the engine ([`Subscription`]); the socket is
//! the backend's ([`SubLink`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use milonga_wire::frame;
use milonga_wire::history::REPLY_KEY_PREFIX;
use milonga_wire::{KeyExpr, NodeId};

use crate::backend::p2p::sub_link::{ConnectionWatcher, Incoming, Monitor, SubLink, Waker};
use crate::engine::queue::{AppQueue, Pushed};
use crate::engine::routes::Routes;
use crate::engine::subscription::{SubState, Subscription, Wants, FLOOD_GRACE};
use crate::model::error::{OpenError, RecvError, SubscribeError};
use crate::model::qos::SubscriberQos;
use crate::model::sample::Event;
use crate::session::{NodeInner, RouteTarget};
use crate::util::stats::{self, log_drop};
use crate::util::{lock, try_lock};

/// The part of a subscription the node thread also reaches.
pub(crate) struct SubShared {
    /// The protocol's state that other threads reach too.
    pub(crate) core: Subscription,
    /// The receive state and the socket, held by the receiving thread.
    io: Mutex<SubState<SubLink>>,
    waker: Waker,
    /// The socket monitors (closed connections) until the node thread
    /// takes them to watch, and when it gives them back.
    pub(crate) monitors: Mutex<Vec<Monitor>>,
    /// This subscription, for the node thread to tell of the sockets
    /// made after it began (security on: one per publishers' key).
    pub(crate) this: std::sync::OnceLock<std::sync::Weak<SubShared>>,
    /// Endpoints whose connection closed, reported by the node thread.
    closed_connections: Mutex<Vec<String>>,
    /// Connections a publisher's node refused (its ZAP status), reported
    /// with the closed ones.
    refused_connections: Mutex<Vec<(String, u32)>>,
    has_closed_connections: AtomicBool,
    stop: AtomicBool,
    /// With a `file:///` locator: events read from the recording, handed
    /// over by the feeder thread (api/file_node.rs), and whether some wait.
    pub(crate) injected: Mutex<std::collections::VecDeque<Event>>,
    pub(crate) has_injected: AtomicBool,
    /// About the bytes of `injected`'s values (`file_node`'s feeder adds,
    /// the reader that takes them all sets 0).
    pub(crate) injected_bytes: std::sync::atomic::AtomicUsize,
    /// The feeder read the recording to its end: once what it handed over
    /// is read, `recv` says so ([`RecvError::EndOfRecording`]).
    pub(crate) ended: AtomicBool,
    /// Endpoints already told as refusing this node (`RouteTarget::denied`).
    denied: Mutex<std::collections::HashSet<String>>,
    /// The application queue, with a queue policy.
    app: Option<AppQueue>,
    squashed: AtomicU64,
    /// Whether receive times are wanted ([`Subscriber::recv_timeout_stamped`]
    /// was called): then the receiving thread reads the clock into
    /// `SubState::stamp` once for each message it reads and each time it
    /// makes events itself, always with nothing pending, so that every
    /// event it hands out was made at the time it carries.
    stamps: AtomicBool,
    /// Declared last: dropped after the sockets above, so that if this
    /// holds the last reference to the node, they are closed before the
    /// context is terminated (which waits for every socket).
    node: Arc<NodeInner>,
}

impl SubShared {
    pub(crate) fn new(
        node: &Arc<NodeInner>,
        id: u64,
        expr: KeyExpr,
        qos: &SubscriberQos,
    ) -> Result<Self, OpenError> {
        // Random, so that nobody can name it in a query without having
        // seen this subscription's own subscribe message: a publisher
        // answers only tokens subscribed on its socket, and a guessable
        // token would let anyone direct history replies at this
        // subscriber.
        let mut t = [0u8; 16];
        getrandom::fill(&mut t).map_err(|e| OpenError::Config {
            key: "subscription token".into(),
            why: format!("no randomness available: {e}"),
        })?;
        let token = milonga_wire::NodeId(t).to_hex();
        let filter = qos.filter.clone().map(|f| {
            let id = f.id_for(expr.as_str());
            let prefix = format!("{}{id}/", milonga_wire::filter::FILTERED_KEY_PREFIX);
            (f, prefix)
        });
        let mut prefixes = expr.subscription_prefixes();
        if let Some((_, fp)) = &filter {
            // Only the samples that pass, under `@f/<id>/<key>`.
            for p in &mut prefixes {
                let mut q = fp.as_bytes().to_vec();
                q.extend_from_slice(p);
                *p = q;
            }
        }
        prefixes.push(format!("{}\0", frame::HEARTBEAT_KEY).into_bytes());
        prefixes.push(format!("{REPLY_KEY_PREFIX}{token}\0").into_bytes());
        let hwm = qos.queue_depth.unwrap_or(node.cfg().recv_hwm);
        let (link, waker, monitor) =
            SubLink::open(node.backend(), id, expr.as_str(), prefixes, hwm)?;
        let wants = Wants {
            deadline: qos.deadline,
            lease: Duration::from_millis(node.cfg().heartbeat_timeout_ms.max(1) as u64),
            last: qos.last,
            reliable: qos.reliable,
            token,
            filter,
            max_bytes: node.cfg().max_message_bytes,
            schema: qos.schema.clone(),
            typed: qos.typed,
        };
        Ok(SubShared {
            core: Subscription::new(expr, wants, node.core().domain_tag, node.counters().clone()),
            node: node.clone(),
            io: Mutex::new(SubState::new(link, qos.last)),
            waker,
            monitors: Mutex::new(vec![monitor]),
            this: std::sync::OnceLock::new(),
            closed_connections: Mutex::new(Vec::new()),
            refused_connections: Mutex::new(Vec::new()),
            has_closed_connections: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            injected: Mutex::new(std::collections::VecDeque::new()),
            has_injected: AtomicBool::new(false),
            injected_bytes: std::sync::atomic::AtomicUsize::new(0),
            ended: AtomicBool::new(false),
            denied: Mutex::new(std::collections::HashSet::new()),
            app: qos.queue.map(AppQueue::new),
            squashed: AtomicU64::new(0),
            stamps: AtomicBool::new(false),
        })
    }

    /// Interrupts a thread blocked in `recv` so that it re-checks its state.
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Whether the subscription was dropped or its node closed.
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.node.is_closed()
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Event, RecvError> {
        self.next_event_stamped(timeout).map(|(ev, _)| ev)
    }

    /// The next event and its receive time (`SubState::stamp`, read under
    /// the same lock: another thread's receive cannot change it between).
    fn next_event_stamped(&self, timeout: Option<Duration>) -> Result<(Event, u64), RecvError> {
        // The deadline is computed only when there is nothing to return at
        // once: reading the clock costs as much as a small sample.
        let mut deadline: Option<Option<Instant>> = None;
        let mut io = lock(&self.io);
        loop {
            // Injected events wait until what is pending was taken: they
            // get a receive time of their own.
            if io.pending.is_empty() && self.has_injected.load(Ordering::Acquire) {
                self.stamp_now(&mut io);
                self.has_injected.store(false, Ordering::Release);
                let injected: Vec<Event> = {
                    let mut q = lock(&self.injected);
                    self.injected_bytes.store(0, Ordering::Release);
                    q.drain(..).collect()
                };
                for ev in injected {
                    if matches!(ev, Event::BrokerChanged(_)) {
                        // The nodes behind the lost broker are reached
                        // through the new one: not disconnected.
                        self.core.broker_changed(&mut io);
                    }
                    // A loss read from a recording counts as a live one
                    // (`Subscriber::lost`, the node's `samples_lost`).
                    if let Event::Lost(l) = &ev {
                        self.core
                            .count_lost(self.node.counters(), l.publisher, l.count);
                    }
                    io.pending.push_back(ev);
                }
            }
            if let Some(ev) = io.pending.pop_front() {
                return Ok((ev, io.stamp));
            }
            if self.node.is_closed() || self.stop.load(Ordering::Acquire) {
                return Err(RecvError::Closed);
            }
            if self.ended.load(Ordering::Acquire) && !self.has_injected.load(Ordering::Acquire) {
                return Err(RecvError::EndOfRecording);
            }
            self.core.apply(&mut io);
            self.watch_new_sockets(&mut io);
            // Nothing was pending: what applying the routes made
            // (publishers alive or lost, QoS refused) is handed out now,
            // with a receive time of its own, not after the next message
            // or wait.
            if !io.pending.is_empty() {
                self.stamp_now(&mut io);
                continue;
            }
            // Closed connections and departed publishers are dealt with
            // once what already arrived has been read: a closing node's
            // goodbye comes before its connection closes and its
            // announcement goes.
            let closed = self.has_closed_connections.load(Ordering::Acquire);
            // Under a flood, take what is there without reading the clock.
            if io.skip_try == 0 || closed || timeout == Some(Duration::ZERO) {
                match io.link.try_recv() {
                    Ok(Some(msg)) => {
                        self.received(&mut io, msg);
                        continue;
                    }
                    Ok(None) if closed => {
                        self.stamp_now(&mut io);
                        self.read_closed_connections(&mut io);
                        continue;
                    }
                    Ok(None) => io.skip_try = 16,
                    Err(None) => continue,
                    Err(Some(e)) => return Err(RecvError::Socket(e)),
                }
            } else {
                io.skip_try -= 1;
            }
            // Leases and deadlines, then wait until the next of them at most.
            let timer_ms = match io.next_timer {
                None => None,
                Some(t) => {
                    let now = Instant::now();
                    if t <= now {
                        let drained = !io.link.readable();
                        self.stamp_now(&mut io);
                        self.core.check_timers(&mut io, now, drained);
                        continue;
                    }
                    Some((t - now).as_micros().div_ceil(1000) as i64)
                }
            };
            let wait_ms = match timeout {
                None => 1000,
                Some(Duration::ZERO) => return Err(RecvError::Empty),
                Some(t) => {
                    // A timeout too long to add to the clock waits forever.
                    match *deadline.get_or_insert_with(|| Instant::now().checked_add(t)) {
                        None => 1000,
                        Some(d) => {
                            let left = d.saturating_duration_since(Instant::now());
                            if left.is_zero() {
                                return Err(RecvError::Timeout);
                            }
                            // Round up so that a wait never ends early.
                            (left.as_micros().div_ceil(1000) as i64).min(1000)
                        }
                    }
                }
            };
            let mut wait_ms = timer_ms.map_or(wait_ms, |t| t.min(wait_ms)).max(1) as i32;
            // The low-latency mode: poll a while before blocking (a
            // message that comes meanwhile skips the wake-up). The spin
            // counts against the wait: together they never outlast it.
            let spin = u64::from(self.node.cfg().recv_spin_us).min(wait_ms as u64 * 1000);
            if spin > 0 {
                let began = Instant::now();
                let until = began + Duration::from_micros(spin);
                let mut got = None;
                while got.is_none() && Instant::now() < until {
                    match io.link.try_recv() {
                        Ok(Some(msg)) => got = Some(msg),
                        Ok(None) | Err(None) => std::hint::spin_loop(),
                        Err(Some(e)) => return Err(RecvError::Socket(e)),
                    }
                }
                if let Some(msg) = got {
                    self.received(&mut io, msg);
                    continue;
                }
                let left_us = i64::from(wait_ms) * 1000 - began.elapsed().as_micros() as i64;
                if left_us <= 0 {
                    // The deadline and the timers are looked at again.
                    continue;
                }
                wait_ms = ((left_us + 999) / 1000) as i32;
            }
            match io.link.recv_wait(wait_ms) {
                Ok(Some(msg)) => self.received(&mut io, msg),
                // A timeout, or a signal handled elsewhere: look again.
                Ok(None) => {}
                Err(e) => return Err(RecvError::Socket(e)),
            }
        }
    }

    /// The next event for the application: from the application queue when
    /// the subscription has a queue policy, else straight from the socket.
    fn next_for_app(&self, timeout: Option<Duration>) -> Result<Event, RecvError> {
        let Some(app) = &self.app else {
            return self.next_event(timeout);
        };
        match app.pop(timeout) {
            Ok(ev) => Ok(ev),
            // The pump stopped at the end of a recording: said as such.
            Err(true) if self.ended.load(Ordering::Acquire) => Err(RecvError::EndOfRecording),
            Err(true) => Err(RecvError::Closed),
            Err(false) if timeout == Some(Duration::ZERO) => Err(RecvError::Empty),
            Err(false) => Err(RecvError::Timeout),
        }
    }

    /// The pump thread of a subscription with a queue policy: reads events
    /// as they come and queues them by the policy.
    fn pump(&self) {
        let Some(app) = &self.app else { return };
        let c = self.node.counters();
        loop {
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            match self.next_event(Some(Duration::from_millis(200))) {
                Ok(ev) => {
                    let publisher = ev.as_sample().map(|s| s.publisher);
                    match app.push(ev) {
                        Pushed::Queued => {}
                        Pushed::Squashed => {
                            stats::inc(&c.samples_squashed);
                            self.squashed.fetch_add(1, Ordering::Relaxed);
                        }
                        Pushed::Dropped => {
                            if let Some(p) = publisher {
                                self.core.count_lost(c, p, 1);
                            }
                        }
                    }
                }
                Err(RecvError::Timeout) => {}
                Err(_) => break,
            }
        }
        app.close();
    }

    /// Hands the node thread the monitors of the sockets the link made
    /// since the last call (a connection to a publisher of another key).
    fn watch_new_sockets(&self, io: &mut SubState<SubLink>) {
        let new = io.link.take_new_monitors();
        if new.is_empty() {
            return;
        }
        let Some(this) = self.this.get() else {
            // Not started yet: Node::subscribe hands them over.
            lock(&self.monitors).extend(new);
            return;
        };
        for m in new {
            let watcher: std::sync::Weak<dyn ConnectionWatcher> = this.clone();
            self.node.backend().watch_subscription(watcher, m);
        }
    }

    /// Reads the clock into `io.stamp`, if receive times are wanted: the
    /// receive time of the events made next (called with nothing pending).
    fn stamp_now(&self, io: &mut SubState<SubLink>) {
        if self.stamps.load(Ordering::Relaxed) {
            io.stamp = crate::util::now_ns();
        }
    }

    /// Handles a received message; under a flood the socket is never
    /// empty, so the timers are looked at every 256 messages all the same.
    fn received(&self, io: &mut SubState<SubLink>, msg: Incoming) {
        self.stamp_now(io);
        match msg {
            Incoming::Message(first, second, sender) => {
                self.core.handle_from(io, first, second, sender.as_deref())
            }
            Incoming::TooManyFrames => {
                let c = self.node.counters();
                let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(n, "a data message", &"more than two frames");
            }
            Incoming::Nothing => {}
        }
        io.handled = io.handled.wrapping_add(1);
        if io.handled % 256 == 0 {
            self.peek_closed_connections(io);
        }
        if io.handled % 256 == 0 && io.next_timer.is_some() {
            let now = Instant::now();
            if io.next_timer.is_some_and(|t| t <= now) {
                self.core.check_timers(io, now, false);
            }
        }
    }

    /// Counts connections that closed (the node thread watches the socket
    /// monitor and reports each one), and connects again to an endpoint
    /// still wanted: ZeroMQ does not reconnect after a protocol error such
    /// as an over-size frame.
    fn read_closed_connections(&self, io: &mut SubState<SubLink>) {
        self.has_closed_connections.store(false, Ordering::Release);
        let refused = std::mem::take(&mut *lock(&self.refused_connections));
        for (endpoint, status) in refused {
            for endpoint in io.link.carried_by(endpoint) {
                self.core.connection_refused(io, endpoint, status);
            }
        }
        // A broker's connection carries the nodes behind it: they are
        // reported disconnected only if the node does not move to another
        // broker within the failover grace (docs/broker.md).
        let (mut direct, mut brokered) = (Vec::new(), Vec::new());
        for e in std::mem::take(&mut *lock(&self.closed_connections)) {
            let carried = io.link.carried_by(e.clone());
            match carried.as_slice() {
                [one] if *one == e => direct.push(e),
                _ => brokered.extend(carried),
            }
        }
        let now = Instant::now();
        self.core.connections_closed(io, direct, now);
        self.core.connections_closed_with(
            io,
            brokered,
            now,
            crate::engine::subscription::BROKER_GRACE,
        );
    }

    /// Under a flood the socket is never empty, so closed connections
    /// would wait for it to be: liveliness closes are noted now (with a
    /// longer grace, as the goodbye may still wait in the queue), so that
    /// a killed publisher is reported `disconnected`, not `lease_expired`
    /// or `undeclared` once discovery or its lease catches up.
    fn peek_closed_connections(&self, io: &mut SubState<SubLink>) {
        if !self.has_closed_connections.load(Ordering::Acquire) {
            return;
        }
        let closed = lock(&self.closed_connections).clone();
        let now = Instant::now();
        for e in closed {
            let carried = io.link.carried_by(e.clone());
            let grace = match carried.as_slice() {
                [one] if *one == e => FLOOD_GRACE,
                _ => crate::engine::subscription::BROKER_GRACE,
            };
            for endpoint in carried {
                self.core.note_liveliness_closed(io, &endpoint, now, grace);
            }
        }
    }

    /// Applies the routes set last to `io`, held by a thread that is not
    /// receiving. Events that makes must not share the receive time of
    /// events still pending: then the receiving thread applies them once
    /// those are taken (this wakes it).
    fn apply_held(&self, io: &mut SubState<SubLink>) {
        if !io.pending.is_empty() && self.stamps.load(Ordering::Relaxed) {
            self.wake();
            return;
        }
        self.core.apply(io);
        if !io.pending.is_empty() {
            self.stamp_now(io);
        }
        self.watch_new_sockets(io);
    }
}

impl RouteTarget for SubShared {
    fn expr(&self) -> &KeyExpr {
        &self.core.expr
    }

    /// Applied at once if the socket is free, else by the thread using it,
    /// which this wakes: a receiving thread, or an accessor that holds the
    /// socket for a moment ([`Subscriber::connected_endpoints`]), which
    /// applies the routes set last whenever it takes the socket.
    fn set_routes(&self, routes: Routes) {
        if !self.core.set_target(routes) {
            return;
        }
        match try_lock(&self.io) {
            Some(mut io) => self.apply_held(&mut io),
            None => self.wake(),
        }
    }

    fn wake(&self) {
        SubShared::wake(self);
    }

    fn queued(&self) -> usize {
        // A receiving thread holds `io`: what it decoded ahead is not
        // counted then (a few events at most).
        let pending = try_lock(&self.io).map_or(0, |io| io.pending.len());
        pending + self.app.as_ref().map_or(0, AppQueue::len)
    }

    fn denied(&self, ev: crate::model::sample::PermissionDenied) {
        {
            let mut told = lock(&self.denied);
            if told.len() >= 1024 || !told.insert(ev.endpoint.clone()) {
                return;
            }
        }
        tracing::warn!(expr = %self.core.expr, endpoint = %ev.endpoint, "a node refused this node's key; this subscription receives nothing from it");
        self.inject_event(Event::PermissionDenied(ev));
    }

    fn inject(&self, ev: Event) {
        self.inject_event(ev);
    }
}

/// Most closed connections a subscription holds until it is next read.
const MAX_CLOSED: usize = 4096;

impl SubShared {
    fn inject_event(&self, ev: Event) {
        lock(&self.injected).push_back(ev);
        self.has_injected.store(true, Ordering::Release);
        self.wake();
    }
}

impl ConnectionWatcher for SubShared {
    /// Called by the node thread, which watches the socket monitor.
    fn connection_closed(&self, endpoint: String) {
        // Read when the application next receives: an endpoint once (its
        // handling is the same), and at most MAX_CLOSED, the oldest let
        // go (a subscription nobody reads, its publishers restarting on
        // new ports, grew this for ever).
        let mut closed = lock(&self.closed_connections);
        if !closed.contains(&endpoint) {
            if closed.len() >= MAX_CLOSED {
                closed.remove(0);
            }
            closed.push(endpoint);
        }
        drop(closed);
        self.has_closed_connections.store(true, Ordering::Release);
        self.wake();
    }

    fn connection_refused(&self, endpoint: String, status: u32) {
        let mut r = lock(&self.refused_connections);
        if r.len() < 1024 {
            r.push((endpoint, status));
        }
        drop(r);
        self.has_closed_connections.store(true, Ordering::Release);
        self.wake();
    }

    fn monitor_back(&self, monitor: Monitor) {
        lock(&self.monitors).push(monitor);
    }
}

/// A subscription. `Send + Sync`. Events queue for [`Subscriber::recv`]
/// (and its variants, and the iterator), or go to the callback given at
/// declaration. Dropping it undeclares the subscription.
pub struct Subscriber {
    pub(crate) shared: Arc<SubShared>,
    dispatcher: Option<JoinHandle<()>>,
    pump: Option<JoinHandle<()>>,
}

impl Subscriber {
    pub(crate) fn start(
        _node: Arc<NodeInner>,
        shared: Arc<SubShared>,
        callback: Option<Box<dyn FnMut(Event) + Send>>,
    ) -> Result<Subscriber, SubscribeError> {
        // With a queue policy, a pump reads the socket as fast as events
        // come and the application (or the callback) reads the queue.
        let pump = match &shared.app {
            None => None,
            Some(_) => {
                let s = shared.clone();
                let th = std::thread::Builder::new()
                    .name(format!("milonga-pump {}", shared.core.expr))
                    .spawn(move || s.pump())
                    .map_err(SubscribeError::Thread)?;
                Some(th)
            }
        };
        let dispatcher = match callback {
            None => None,
            Some(mut cb) => {
                let s = shared.clone();
                let th = std::thread::Builder::new()
                    .name(format!("milonga-sub {}", shared.core.expr))
                    .spawn(move || loop {
                        match s.next_for_app(Some(Duration::from_millis(200))) {
                            Ok(ev) => {
                                let key = s.expr().to_string();
                                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cb(ev)));
                                if r.is_err() {
                                    tracing::error!(expr = %key, "a subscription callback panicked; the subscription goes on");
                                }
                            }
                            Err(RecvError::Timeout) => {}
                            Err(_) => break,
                        }
                        if s.stop.load(Ordering::Acquire) {
                            break;
                        }
                    })
                    .map_err(SubscribeError::Thread)?;
                Some(th)
            }
        };
        Ok(Subscriber {
            shared,
            dispatcher,
            pump,
        })
    }

    fn check_mode(&self) -> Result<(), RecvError> {
        if self.dispatcher.is_some() {
            Err(RecvError::CallbackMode)
        } else {
            Ok(())
        }
    }

    /// The key expression.
    pub fn key_expr(&self) -> &str {
        self.shared.core.expr.as_str()
    }

    /// Waits for the next event until the node closes.
    pub fn recv(&self) -> Result<Event, RecvError> {
        self.check_mode()?;
        self.shared.next_for_app(None)
    }

    /// Waits at most `timeout` for the next event; [`RecvError::Timeout`]
    /// when none came, a zero `timeout` included.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, RecvError> {
        self.check_mode()?;
        match self.shared.next_for_app(Some(timeout)) {
            Err(RecvError::Empty) => Err(RecvError::Timeout),
            other => other,
        }
    }

    /// As [`Subscriber::recv_timeout`], with the event's receive time (ns
    /// since the Unix epoch): when this subscription read the message that
    /// carried it from its socket, one clock reading for every sample of a
    /// batch; for a status event, when the subscription made it. Two
    /// exceptions: samples held back while a late joiner's history or a
    /// repair is awaited carry the time they were released (at most the
    /// query's 2 s timeout later), and events read before the first call
    /// the time of that call. What `milonga record` stamps its messages
    /// with (one clock read a message instead of one a sample: a read
    /// costs about half of what recording a 92-byte sample does otherwise,
    /// docs/benchmarks.md "Recording"). With a queue policy
    /// ([`SubscriberQos::queue`](crate::SubscriberQos)), whose thread reads
    /// ahead, the clock is read when the event is taken.
    pub fn recv_timeout_stamped(&self, timeout: Duration) -> Result<(Event, u64), RecvError> {
        self.check_mode()?;
        let s = &self.shared;
        if s.app.is_some() {
            return self
                .recv_timeout(timeout)
                .map(|ev| (ev, crate::util::now_ns()));
        }
        if !s.stamps.load(Ordering::Relaxed) {
            s.stamps.store(true, Ordering::Relaxed);
        }
        match s.next_event_stamped(Some(timeout)) {
            // Read before receive times were asked for.
            Ok((ev, 0)) => Ok((ev, crate::util::now_ns())),
            Ok(x) => Ok(x),
            Err(RecvError::Empty) => Err(RecvError::Timeout),
            Err(e) => Err(e),
        }
    }

    /// The next event if one is queued, else [`RecvError::Empty`].
    pub fn try_recv(&self) -> Result<Event, RecvError> {
        self.check_mode()?;
        self.shared.next_for_app(Some(Duration::ZERO))
    }

    /// Samples replaced by newer ones of their key (`keep_last` policy).
    pub fn squashed(&self) -> u64 {
        self.shared.squashed.load(Ordering::Relaxed)
    }

    /// Iterates over events until the node closes.
    pub fn iter(&self) -> Iter<'_> {
        Iter { sub: self }
    }

    /// Samples lost, over all publishers, since the subscription began.
    pub fn lost(&self) -> u64 {
        self.shared.core.lost_total.load(Ordering::Relaxed)
    }

    /// Samples lost per publisher.
    pub fn lost_by_publisher(&self) -> HashMap<NodeId, u64> {
        lock(&self.shared.core.lost_by_publisher).clone()
    }

    /// Number of publisher data endpoints this subscription is connected to.
    pub fn connected_endpoints(&self) -> usize {
        match try_lock(&self.shared.io) {
            // New routes that came while another call held the socket (this
            // one, a moment ago) are applied now: nobody else may.
            Some(mut io) => {
                self.shared.apply_held(&mut io);
                io.data_connections()
            }
            None => self.shared.core.target_data_endpoints(),
        }
    }
}

/// Blocking iterator over a subscription's events; ends when the node closes.
#[derive(Debug)]
pub struct Iter<'a> {
    sub: &'a Subscriber,
}

impl Iterator for Iter<'_> {
    type Item = Event;
    fn next(&mut self) -> Option<Event> {
        self.sub.recv().ok()
    }
}

impl<'a> IntoIterator for &'a Subscriber {
    type Item = Event;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("key_expr", &self.key_expr())
            .field("callback", &self.dispatcher.is_some())
            .finish()
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        for th in [self.dispatcher.take(), self.pump.take()]
            .into_iter()
            .flatten()
        {
            if th.thread().id() != std::thread::current().id() {
                let _ = th.join();
            }
        }
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Subscriber>();
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use milonga_testkit::TempDir;

    use crate::util::lock;
    use crate::{Config, Node};

    /// Routes that come while an accessor holds the socket for a moment
    /// are applied by the next call of that accessor: a subscription nobody
    /// receives on, polled with `connected_endpoints`, saw no publisher
    /// (the routes waited for a receive that never came; a test setup of
    /// `tests/bad_input.rs` timed out on it on a busy machine).
    #[test]
    fn routes_set_while_the_socket_is_held_are_applied_by_the_next_accessor() {
        let dir = TempDir::new("held-routes");
        let open = |name: &str| {
            let mut cfg = Config::new("milonga:///held", name);
            cfg.runtime_dir = Some(dir.path().to_path_buf());
            Node::open_with(cfg).unwrap()
        };
        let a = open("a");
        let sub = a.subscribe("t/**").unwrap();
        let held = lock(&sub.shared.io);
        let b = open("b");
        let _p = b.publisher("t/x").unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while sub.shared.core.target_data_endpoints() == 0 {
            assert!(Instant::now() < end, "the publisher was never found");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(held);
        assert_eq!(sub.connected_endpoints(), 1);
    }
}
