//! Subscriptions: a key expression, a SUB socket, and the checks every
//! received frame goes through before it becomes an [`Event`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use milonga_wire::cbor::decode_payload;
use milonga_wire::frame::{self, BatchEntries, FrameError, Kind, FLAG_PAYLOAD_FRAME};
use milonga_wire::{Encoding, KeyExpr, NodeId, Value};

use crate::error::{OpenError, RecvError, SubscribeError};
use crate::node::{lock, try_lock, NodeInner, Routes};
use crate::qos::SubscriberQos;
use crate::sample::{
    DeadlineMissed, Event, LostReason, LostSamples, PublisherAlive, PublisherLost, Sample,
};
use crate::stats::{self, Counters};
use crate::zmq_io::{self, message_bytes};

/// Logs the first drops of a kind, then one in a thousand, so that a flood
/// of bad input cannot flood the log; the counters count every one.
fn log_drop(count: u64, what: &str, detail: &dyn std::fmt::Display) {
    if count <= 10 || count % 1000 == 0 {
        tracing::warn!(dropped_so_far = count, "dropped {what}: {detail}");
    }
}

/// Prefix of the wake-up messages a subscription's own inproc PUB sends to
/// its SUB socket, so that a thread blocked in `recv` on that one socket
/// wakes (a zmq_poll over several sockets costs a dozen system calls per
/// message; a blocking recv on one, as raw libzmq does, costs one).
const WAKE: &[u8] = b"@w\0";

struct SubIo {
    sock: zmq::Socket,
    /// The receive timeout currently set on `sock`, in ms.
    rcvtimeo: i32,
    /// Calls left that go straight to a blocking receive: set when a
    /// non-blocking attempt found nothing, which means messages arrive one
    /// at a time and trying first only costs a system call.
    skip_try: u8,
    connected: BTreeSet<String>,
    applied: u64,
    last_seq: HashMap<NodeId, HashMap<String, u64>>,
    /// The stream (publisher, key) of the last sample, kept out of
    /// `last_seq`: most traffic repeats the same stream, and this spares a
    /// hash lookup per sample.
    current: Option<Stream>,
    /// Whether a key matches a wildcard expression (bounded memo).
    matches: HashMap<String, bool>,
    pending: VecDeque<Event>,
    /// Liveliness endpoint -> node, as last applied.
    liveliness: BTreeMap<String, NodeId>,
    /// The publisher nodes discovery shows for this subscription.
    publishers: HashMap<NodeId, PubState>,
    /// Per-key deadline state, when the QoS sets a deadline.
    deadlines: HashMap<String, KeyDeadline>,
    /// When a lease or a deadline may next run out (never later than the
    /// first that does).
    next_timer: Option<Instant>,
    /// Messages handled: timers are checked every 256 under a flood.
    handled: u32,
    /// How many publishers are departing.
    departing: usize,
}

/// What a subscription knows of one publisher node's liveliness.
struct PubState {
    name: String,
    alive: bool,
    last_heard: Instant,
    /// Discovery no longer shows a matching publication: reported
    /// `undeclared` once what already arrived from it has been read.
    departing: bool,
}

/// When a key last spoke, and when its deadline runs out.
struct KeyDeadline {
    last: Instant,
    due: Instant,
}

/// Most keys a subscription watches deadlines of.
const MAX_DEADLINE_KEYS: usize = 1 << 16;

/// The last sequence number seen on one (publisher, key).
struct Stream {
    node: NodeId,
    key: String,
    last: u64,
}

/// Most keys a wildcard subscription remembers the match of.
const MATCH_MEMO: usize = 4096;

#[derive(Debug, Default)]
struct Target {
    routes: Routes,
    generation: u64,
}

/// The part of a subscription the node thread also reaches.
pub(crate) struct SubShared {
    pub expr: KeyExpr,
    io: Mutex<SubIo>,
    target: Mutex<Target>,
    wake_tx: Mutex<zmq::Socket>,
    /// The socket monitor (closed connections), until the node thread
    /// takes it to watch.
    pub(crate) monitor: Mutex<Option<zmq::Socket>>,
    /// Endpoints whose connection closed, reported by the node thread.
    closed_connections: Mutex<Vec<String>>,
    has_closed_connections: AtomicBool,
    stop: AtomicBool,
    lost_total: AtomicU64,
    lost_by_publisher: Mutex<HashMap<NodeId, u64>>,
    deadline: Option<Duration>,
    lease: Duration,
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
        let sock = node.ctx.socket(zmq::SUB)?;
        let cfg_err = |source| OpenError::Socket {
            action: "configure",
            endpoint: format!("subscription {expr}"),
            source,
        };
        zmq_io::apply_common(&sock, &node.cfg).map_err(cfg_err)?;
        sock.set_rcvhwm(qos.queue_depth.unwrap_or(node.cfg.recv_hwm))
            .map_err(cfg_err)?;
        for p in expr.zmq_prefixes() {
            sock.set_subscribe(&p).map_err(cfg_err)?;
        }
        let mut hb = frame::HEARTBEAT_KEY.as_bytes().to_vec();
        hb.push(0);
        sock.set_subscribe(&hb).map_err(cfg_err)?;
        let mon_ep = format!("inproc://milonga-submon-{}-{id}", node.id);
        sock.monitor(&mon_ep, zmq_sys::ZMQ_EVENT_DISCONNECTED as i32)
            .map_err(cfg_err)?;
        let monitor = node.ctx.socket(zmq::PAIR)?;
        monitor.set_linger(0).map_err(cfg_err)?;
        monitor.connect(&mon_ep).map_err(cfg_err)?;
        let wake_ep = format!("inproc://milonga-wake-{}-{id}", node.id);
        let wake_tx = node.ctx.socket(zmq::PUB)?;
        wake_tx.set_linger(0).map_err(cfg_err)?;
        wake_tx.set_sndhwm(4).map_err(cfg_err)?;
        node.bind(&wake_tx, &wake_ep)?;
        sock.set_subscribe(WAKE).map_err(cfg_err)?;
        sock.connect(&wake_ep).map_err(|source| OpenError::Socket {
            action: "connect",
            endpoint: wake_ep.clone(),
            source,
        })?;
        Ok(SubShared {
            expr,
            node: node.clone(),
            io: Mutex::new(SubIo {
                sock,
                rcvtimeo: -1,
                skip_try: 0,
                connected: BTreeSet::new(),
                applied: 0,
                last_seq: HashMap::new(),
                current: None,
                matches: HashMap::new(),
                pending: VecDeque::new(),
                liveliness: BTreeMap::new(),
                publishers: HashMap::new(),
                deadlines: HashMap::new(),
                next_timer: None,
                handled: 0,
                departing: 0,
            }),
            target: Mutex::new(Target::default()),
            wake_tx: Mutex::new(wake_tx),
            monitor: Mutex::new(Some(monitor)),
            closed_connections: Mutex::new(Vec::new()),
            has_closed_connections: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            lost_total: AtomicU64::new(0),
            lost_by_publisher: Mutex::new(HashMap::new()),
            deadline: qos.deadline,
            lease: Duration::from_millis(node.cfg.heartbeat_timeout_ms.max(1) as u64),
        })
    }

    /// Sets where this subscription should be connected and which
    /// publishers it follows. Applied at once if the socket is free, else by
    /// the thread using it, which this wakes.
    pub(crate) fn set_routes(&self, routes: Routes) {
        {
            let mut t = lock(&self.target);
            if t.routes == routes {
                return;
            }
            t.routes = routes;
            t.generation += 1;
        }
        match try_lock(&self.io) {
            Some(mut io) => self.apply(&mut io),
            None => self.wake(),
        }
    }

    /// Interrupts a thread blocked in `recv` so that it re-checks its state.
    pub(crate) fn wake(&self) {
        let _ = lock(&self.wake_tx).send(WAKE, zmq::DONTWAIT);
    }

    /// Called by the node thread, which watches the socket monitor: the
    /// connection to `endpoint` closed.
    pub(crate) fn connection_closed(&self, endpoint: String) {
        lock(&self.closed_connections).push(endpoint);
        self.has_closed_connections.store(true, Ordering::Release);
        self.wake();
    }

    fn apply(&self, io: &mut SubIo) {
        let t = lock(&self.target);
        if t.generation == io.applied {
            return;
        }
        io.applied = t.generation;
        let r = &t.routes;
        // Publishers that no longer offer a matching key depart: they are
        // reported once what already arrived from them has been read (a
        // closing node says goodbye before its announcement goes), and
        // their liveliness connection is kept until then.
        let now = Instant::now();
        for (id, p) in io.publishers.iter_mut() {
            p.departing = !r.publishers.contains_key(id);
        }
        io.departing = io.publishers.values().filter(|p| p.departing).count();
        let mut liveliness = r.liveliness.clone();
        for (ep, id) in &io.liveliness {
            if io.publishers.get(id).is_some_and(|p| p.departing) {
                liveliness.insert(ep.clone(), *id);
            }
        }
        io.liveliness = liveliness;
        let gone: Vec<String> = io
            .connected
            .iter()
            .filter(|ep| !r.endpoints.contains(*ep) && !io.liveliness.contains_key(*ep))
            .cloned()
            .collect();
        for ep in gone {
            let _ = io.sock.disconnect(&ep);
            io.connected.remove(&ep);
            tracing::debug!(expr = %self.expr, endpoint = %ep, "disconnected");
        }
        for ep in r.endpoints.difference(&io.connected.clone()) {
            match io.sock.connect(ep) {
                Ok(()) => {
                    io.connected.insert(ep.clone());
                    tracing::debug!(expr = %self.expr, endpoint = %ep, "connected");
                }
                Err(err) => {
                    tracing::warn!(expr = %self.expr, endpoint = %ep, %err, "cannot connect")
                }
            }
        }
        for (id, name) in &r.publishers {
            let p = io.publishers.entry(*id).or_insert_with(|| PubState {
                name: String::new(),
                alive: false,
                last_heard: now,
                departing: false,
            });
            p.name.clone_from(name);
        }
        if let Some(d) = self.deadline {
            for k in &r.keys {
                if io.deadlines.len() >= MAX_DEADLINE_KEYS {
                    break;
                }
                if !io.deadlines.contains_key(k) {
                    io.deadlines.insert(
                        k.clone(),
                        KeyDeadline {
                            last: now,
                            due: now + d,
                        },
                    );
                    io.next_timer = Some(io.next_timer.map_or(now + d, |t| t.min(now + d)));
                }
            }
        }
        // Forget the sequence state of nodes that left the domain, which
        // keeps memory bounded across publishers that come and go; a
        // publisher that is only briefly out of sight keeps its baseline, so
        // what it lost meanwhile is still reported.
        io.last_seq.retain(|id, _| r.live.contains(id));
        if io
            .current
            .as_ref()
            .is_some_and(|s| !r.live.contains(&s.node))
        {
            io.current = None;
        }
        lock(&self.lost_by_publisher).retain(|id, _| r.live.contains(id));
    }

    /// Reports the departing publishers `undeclared` (unless they said
    /// goodbye or their connection closed meanwhile), and disconnects
    /// their liveliness endpoints. Called when the socket is empty.
    fn settle_departures(&self, io: &mut SubIo) {
        let departed: Vec<NodeId> = io
            .publishers
            .iter()
            .filter(|(_, p)| p.departing)
            .map(|(id, _)| *id)
            .collect();
        for id in departed {
            self.mark_lost(io, id, LostReason::Undeclared);
            io.publishers.remove(&id);
        }
        io.departing = 0;
        let wanted = lock(&self.target).routes.liveliness.clone();
        let stale: Vec<String> = io
            .liveliness
            .keys()
            .filter(|ep| !wanted.contains_key(*ep))
            .cloned()
            .collect();
        for ep in stale {
            io.liveliness.remove(&ep);
            if io.connected.remove(&ep) {
                let _ = io.sock.disconnect(&ep);
            }
        }
    }

    /// Reports publisher `id` lost, if it was alive.
    fn mark_lost(&self, io: &mut SubIo, id: NodeId, reason: LostReason) {
        let Some(p) = io.publishers.get_mut(&id) else {
            return;
        };
        if !p.alive {
            return;
        }
        p.alive = false;
        tracing::info!(expr = %self.expr, publisher = %id, name = %p.name, %reason, "publisher lost");
        io.pending.push_back(Event::PublisherLost(PublisherLost {
            publisher: id,
            name: p.name.clone(),
            reason,
        }));
        // Its next sample must go through the slow path, which reports it
        // alive again.
        if io.current.as_ref().is_some_and(|s| s.node == id) {
            let old = io.current.take().expect("checked");
            io.last_seq
                .entry(old.node)
                .or_default()
                .insert(old.key, old.last);
        }
    }

    /// Reports publisher `id` alive, if it was not; `heard` refreshes its
    /// lease (heartbeats do, samples need not).
    fn note_alive(&self, io: &mut SubIo, id: NodeId, heard: Option<Instant>) {
        let Some(p) = io.publishers.get_mut(&id) else {
            return;
        };
        if let Some(now) = heard {
            p.last_heard = now;
        }
        if p.alive {
            return;
        }
        p.alive = true;
        let now = heard.unwrap_or_else(Instant::now);
        p.last_heard = now;
        let expiry = now + self.lease;
        io.next_timer = Some(io.next_timer.map_or(expiry, |t| t.min(expiry)));
        io.pending.push_back(Event::PublisherAlive(PublisherAlive {
            publisher: id,
            name: p.name.clone(),
        }));
    }

    /// Reports leases and deadlines that ran out by `now`, and sets when
    /// the next may.
    fn check_timers(&self, io: &mut SubIo, now: Instant) {
        let mut next: Option<Instant> = None;
        let mut earliest = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        let expired: Vec<NodeId> = io
            .publishers
            .iter()
            .filter(|(_, p)| p.alive && now >= p.last_heard + self.lease)
            .map(|(id, _)| *id)
            .collect();
        for p in io.publishers.values().filter(|p| p.alive) {
            if now < p.last_heard + self.lease {
                earliest(p.last_heard + self.lease);
            }
        }
        if let Some(d) = self.deadline {
            for (key, k) in io.deadlines.iter_mut() {
                if now >= k.due {
                    io.pending.push_back(Event::DeadlineMissed(DeadlineMissed {
                        key: key.clone(),
                        silent_for: now - k.last,
                    }));
                    k.due = now + d;
                }
                earliest(k.due);
            }
        }
        io.next_timer = next;
        for id in expired {
            self.mark_lost(io, id, LostReason::LeaseExpired);
        }
    }

    /// A heartbeat: the node is alive, or leaving.
    fn on_heartbeat(&self, io: &mut SubIo, c: &Counters, node: NodeId, body: &[u8]) {
        let leaving =
            match decode_payload(Encoding::Cbor, bytes::Bytes::copy_from_slice(body), None) {
                Ok(Value::Map(pairs)) => pairs
                    .iter()
                    .any(|(k, v)| *k == Value::from("leaving") && *v == Value::Bool(true)),
                Ok(_) | Err(_) => {
                    let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    log_drop(n, "a heartbeat", &"its body is not a CBOR map");
                    return;
                }
            };
        if leaving {
            self.mark_lost(io, node, LostReason::Closed);
        } else {
            self.note_alive(io, node, Some(Instant::now()));
        }
    }

    /// Notes that `key` spoke, for its deadline.
    fn note_deadline(io: &mut SubIo, d: Duration, key: &str) {
        let now = Instant::now();
        let full = io.deadlines.len() >= MAX_DEADLINE_KEYS;
        match io.deadlines.get_mut(key) {
            Some(k) => {
                k.last = now;
                k.due = now + d;
            }
            None if !full => {
                io.deadlines.insert(
                    key.to_owned(),
                    KeyDeadline {
                        last: now,
                        due: now + d,
                    },
                );
            }
            None => {}
        }
        io.next_timer = Some(io.next_timer.map_or(now + d, |t| t.min(now + d)));
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Event, RecvError> {
        // The deadline is computed only when there is nothing to return at
        // once: reading the clock costs as much as a small sample.
        let mut deadline: Option<Instant> = None;
        let mut io = lock(&self.io);
        loop {
            if let Some(ev) = io.pending.pop_front() {
                return Ok(ev);
            }
            if self.node.closed.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire) {
                return Err(RecvError::Closed);
            }
            self.apply(&mut io);
            // Closed connections and departed publishers are dealt with
            // once what already arrived has been read: a closing node's
            // goodbye comes before its connection closes and its
            // announcement goes.
            let closed = self.has_closed_connections.load(Ordering::Acquire);
            // Under a flood, take what is there without reading the clock.
            if io.skip_try == 0 || closed || io.departing > 0 || timeout == Some(Duration::ZERO) {
                match io.sock.recv_msg(zmq::DONTWAIT) {
                    Ok(first) => {
                        self.received(&mut io, first);
                        continue;
                    }
                    Err(zmq::Error::EAGAIN) if closed || io.departing > 0 => {
                        if closed {
                            self.read_closed_connections(&mut io);
                        }
                        if io.departing > 0 {
                            self.settle_departures(&mut io);
                        }
                        continue;
                    }
                    Err(zmq::Error::EAGAIN) => io.skip_try = 16,
                    Err(zmq::Error::EINTR) => continue,
                    Err(e) => return Err(RecvError::Socket(e)),
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
                        self.check_timers(&mut io, now);
                        continue;
                    }
                    Some((t - now).as_micros().div_ceil(1000) as i64)
                }
            };
            let wait_ms = match timeout {
                None => 1000,
                Some(Duration::ZERO) => return Err(RecvError::Empty),
                Some(t) => {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + t);
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvError::Timeout);
                    }
                    // Round up so that a wait never ends early.
                    (left.as_micros().div_ceil(1000) as i64).min(1000)
                }
            };
            let wait_ms = timer_ms.map_or(wait_ms, |t| t.min(wait_ms)).max(1) as i32;
            if io.rcvtimeo != wait_ms {
                io.sock.set_rcvtimeo(wait_ms).map_err(RecvError::Socket)?;
                io.rcvtimeo = wait_ms;
            }
            // One blocking receive on one socket: wake-ups (a stop, new
            // routes, a closed connection) arrive on it too.
            match io.sock.recv_msg(0) {
                Ok(first) => self.received(&mut io, first),
                // A timeout, or a signal handled elsewhere: look again.
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {}
                Err(e) => return Err(RecvError::Socket(e)),
            }
        }
    }

    /// Handles a received message; under a flood the socket is never
    /// empty, so the timers are looked at every 256 messages all the same.
    fn received(&self, io: &mut SubIo, first: zmq::Message) {
        self.handle(io, first);
        io.handled = io.handled.wrapping_add(1);
        if io.handled % 256 == 0 && io.next_timer.is_some() {
            let now = Instant::now();
            if io.next_timer.is_some_and(|t| t <= now) {
                self.check_timers(io, now);
            }
        }
    }

    /// Counts connections that closed (the node thread watches the socket
    /// monitor and reports each one), and connects again to an endpoint
    /// still wanted: libzmq does not reconnect after a protocol error such
    /// as an over-size frame.
    fn read_closed_connections(&self, io: &mut SubIo) {
        self.has_closed_connections.store(false, Ordering::Release);
        let closed = std::mem::take(&mut *lock(&self.closed_connections));
        for endpoint in closed {
            stats::inc(&self.node.counters.connections_closed);
            if let Some(id) = io.liveliness.get(&endpoint).copied() {
                self.mark_lost(io, id, LostReason::Disconnected);
            }
            tracing::info!(
                expr = %self.expr,
                %endpoint,
                "connection to a publisher closed (the peer went away, or sent a frame over max_message_bytes or broke ZMTP)"
            );
            if io.connected.remove(&endpoint) {
                let _ = io.sock.disconnect(&endpoint);
                // Make `apply` compare the target with what is connected.
                io.applied = io.applied.wrapping_sub(1);
            }
        }
    }

    /// Checks one received message and queues the events it yields.
    fn handle(&self, io: &mut SubIo, first: zmq::Message) {
        if first.first() == Some(&b'@') && first.starts_with(WAKE) {
            return;
        }
        let c = &self.node.counters;
        let second = if first.get_more() {
            match io.sock.recv_msg(0) {
                Ok(m) if !m.get_more() => Some(m),
                Ok(_) => {
                    while let Ok(m) = io.sock.recv_msg(0) {
                        if !m.get_more() {
                            break;
                        }
                    }
                    let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    log_drop(n, "a data message", &"more than two frames");
                    return;
                }
                Err(_) => return,
            }
        } else {
            None
        };
        let frame = message_bytes(first);
        let view = match frame::decode(&frame) {
            Ok(v) => v,
            Err(err) => {
                let counter = match err {
                    FrameError::UnsupportedVersion(_) => &c.frames_bad_version,
                    FrameError::UnknownKind(_) | FrameError::UnknownEncoding(_) => {
                        &c.frames_unknown_kind
                    }
                    _ => &c.frames_malformed,
                };
                let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(n, "a data frame", &err);
                return;
            }
        };
        let h = view.header;
        if h.domain_tag != self.node.domain_tag {
            let n = c.frames_foreign_domain.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(
                n,
                "a frame of another domain",
                &format_args!("key {}", view.key),
            );
            return;
        }
        let has_flag = h.flags & FLAG_PAYLOAD_FRAME != 0;
        if has_flag != second.is_some() {
            let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
            let err = FrameError::FrameCount {
                flag: has_flag,
                frames: 1 + usize::from(second.is_some()),
            };
            log_drop(n, "a data message", &err);
            return;
        }
        if h.kind == Kind::Heartbeat {
            self.on_heartbeat(io, c, h.node_id, view.body);
            return;
        }
        if !self.key_matches(io, view.key) {
            // Prefix filtering lets through a superset; not an error.
            stats::inc(&c.frames_filtered);
            return;
        }
        let key = view.key.to_owned();
        let body_offset = view.body_offset;
        match h.kind {
            Kind::Sample => {
                if !self.check_seq(io, c, h.node_id, &key, h.seq) {
                    return;
                }
                let first = frame.slice(body_offset..);
                match decode_payload(h.encoding, first, second.map(message_bytes)) {
                    Ok(value) => {
                        stats::inc(&c.samples_received);
                        if let Some(d) = self.deadline {
                            Self::note_deadline(io, d, &key);
                        }
                        io.pending.push_back(Event::Sample(Sample {
                            key,
                            value,
                            publisher: h.node_id,
                            seq: h.seq,
                            timestamp_ns: h.timestamp_ns,
                            encoding: h.encoding,
                            schema_id: h.schema_id,
                        }));
                    }
                    Err(err) => {
                        let n = c.payloads_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        log_drop(n, "a sample whose payload does not decode", &err);
                    }
                }
            }
            // Handled above, before key matching.
            Kind::Heartbeat => {}
            Kind::Batch => {
                // `decode` has validated every entry.
                let entries = BatchEntries::new(view.body).into_iter().flatten().flatten();
                for (i, e) in entries.enumerate() {
                    let Some(seq) = h.seq.checked_add(i as u64) else {
                        let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        log_drop(n, "a batch", &"sequence numbers overflow");
                        break;
                    };
                    if !self.check_seq(io, c, h.node_id, &key, seq) {
                        continue;
                    }
                    let start = body_offset + e.offset;
                    let payload = frame.slice(start..start + e.payload.len());
                    match decode_payload(h.encoding, payload, None) {
                        Ok(value) => {
                            stats::inc(&c.samples_received);
                            if let Some(d) = self.deadline {
                                Self::note_deadline(io, d, &key);
                            }
                            io.pending.push_back(Event::Sample(Sample {
                                key: key.clone(),
                                value,
                                publisher: h.node_id,
                                seq,
                                timestamp_ns: e.timestamp_ns,
                                encoding: h.encoding,
                                schema_id: h.schema_id,
                            }));
                        }
                        Err(err) => {
                            let n = c.payloads_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                            log_drop(n, "a batched sample whose payload does not decode", &err);
                        }
                    }
                }
            }
        }
    }

    /// Whether `key` matches the expression: ZeroMQ prefix filtering lets
    /// through a superset of the keys a wildcard selects.
    fn key_matches(&self, io: &mut SubIo, key: &str) -> bool {
        if self.expr.is_literal() {
            return self.expr.matches(key);
        }
        // Milonga's own keys (`@...`) are never a user's sample.
        if key.starts_with('@') {
            return false;
        }
        if let Some(m) = io.matches.get(key) {
            return *m;
        }
        let m = self.expr.matches(key);
        if io.matches.len() >= MATCH_MEMO {
            io.matches.clear();
        }
        io.matches.insert(key.to_owned(), m);
        m
    }

    /// Whether sample `seq` of (`node`, `key`) is new; queues a
    /// [`Event::Lost`] when it reveals a gap.
    fn check_seq(&self, io: &mut SubIo, c: &Counters, node: NodeId, key: &str, seq: u64) -> bool {
        let hit = io
            .current
            .as_ref()
            .is_some_and(|s| s.node == node && s.key == key);
        if !hit {
            self.note_alive(io, node, None);
            if let Some(old) = io.current.take() {
                io.last_seq
                    .entry(old.node)
                    .or_default()
                    .insert(old.key, old.last);
            }
            match io.last_seq.get_mut(&node).and_then(|m| m.remove_entry(key)) {
                Some((key, last)) => io.current = Some(Stream { node, key, last }),
                None => {
                    io.current = Some(Stream {
                        node,
                        key: key.to_owned(),
                        last: seq,
                    });
                    return true;
                }
            }
        }
        let s = io.current.as_mut().expect("set above");
        if seq == s.last {
            let n = c.samples_duplicate.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(n, "a duplicate sample", &format_args!("{key} seq {seq}"));
            return false;
        }
        if seq < s.last {
            // A publisher's sequence never goes back; a frame that says so is
            // corrupt or forged. Start over from it rather than let one bad
            // frame mute the stream.
            let n = c.sequence_resets.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(
                n,
                "the sequence baseline",
                &format_args!("{key} went back from {} to {seq}", s.last),
            );
            s.last = seq;
            return true;
        }
        let lost = seq - s.last - 1;
        let first_seq = s.last + 1;
        s.last = seq;
        if lost > 0 {
            stats::add(&c.samples_lost, lost);
            self.lost_total.fetch_add(lost, Ordering::Relaxed);
            let mut by = lock(&self.lost_by_publisher);
            let e = by.entry(node).or_insert(0);
            *e = e.saturating_add(lost);
            io.pending.push_back(Event::Lost(LostSamples {
                publisher: node,
                key: key.to_owned(),
                count: lost,
                first_seq,
            }));
        }
        true
    }
}

impl Drop for SubShared {
    fn drop(&mut self) {
        // Before the monitor's reader (the node thread's, or ours) goes.
        let io = self.io.get_mut().unwrap_or_else(|e| e.into_inner());
        zmq_io::stop_monitor(&mut io.sock);
    }
}

/// A subscription. `Send + Sync`. Events queue for [`Subscriber::recv`]
/// (and its variants, and the iterator), or go to the callback given at
/// declaration. Dropping it undeclares the subscription.
pub struct Subscriber {
    shared: Arc<SubShared>,
    dispatcher: Option<JoinHandle<()>>,
}

impl Subscriber {
    pub(crate) fn start(
        _node: Arc<NodeInner>,
        shared: Arc<SubShared>,
        callback: Option<Box<dyn FnMut(Event) + Send>>,
    ) -> Result<Subscriber, SubscribeError> {
        let dispatcher = match callback {
            None => None,
            Some(mut cb) => {
                let s = shared.clone();
                let th = std::thread::Builder::new()
                    .name(format!("milonga-sub {}", shared.expr))
                    .spawn(move || loop {
                        match s.next_event(Some(Duration::from_millis(200))) {
                            Ok(ev) => {
                                let key = s.expr.to_string();
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
        Ok(Subscriber { shared, dispatcher })
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
        self.shared.expr.as_str()
    }

    /// Waits for the next event until the node closes.
    pub fn recv(&self) -> Result<Event, RecvError> {
        self.check_mode()?;
        self.shared.next_event(None)
    }

    /// Waits at most `timeout` for the next event.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, RecvError> {
        self.check_mode()?;
        self.shared.next_event(Some(timeout))
    }

    /// The next event if one is queued, else [`RecvError::Empty`].
    pub fn try_recv(&self) -> Result<Event, RecvError> {
        self.check_mode()?;
        self.shared.next_event(Some(Duration::ZERO))
    }

    /// Iterates over events until the node closes.
    pub fn iter(&self) -> Iter<'_> {
        Iter { sub: self }
    }

    /// Samples lost, over all publishers, since the subscription began.
    pub fn lost(&self) -> u64 {
        self.shared.lost_total.load(Ordering::Relaxed)
    }

    /// Samples lost per publisher.
    pub fn lost_by_publisher(&self) -> HashMap<NodeId, u64> {
        lock(&self.shared.lost_by_publisher).clone()
    }

    /// Number of publisher data endpoints this subscription is connected to.
    pub fn connected_endpoints(&self) -> usize {
        match try_lock(&self.shared.io) {
            Some(io) => io
                .connected
                .iter()
                .filter(|e| !io.liveliness.contains_key(*e))
                .count(),
            None => {
                let t = lock(&self.shared.target);
                t.routes.endpoints.len() - t.routes.liveliness.len()
            }
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
        if let Some(th) = self.dispatcher.take() {
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
