//! The node thread: discovery, the control socket, socket monitors.
//!
//! It never waits on user code: it touches a data socket or a subscription
//! only when their lock is free (`try_lock`), and otherwise leaves a note
//! that the user's thread applies.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::discovery::Announcement;
use crate::model::error::IntoTransport;
use crate::model::error::OpenError;
use crate::session::NodeInner;
use crate::util::stats::{self, NodeStats};
use crate::util::{lock, try_lock};

/// First frame of every control request and reply.
pub const CONTROL_MAGIC: &[u8] = milonga_wire::control::MAGIC;
/// The one request of protocol v1: "who are you, and how are you doing".
pub const CONTROL_INFO: &[u8] = milonga_wire::control::INFO;

/// What a node answers to `info`: its announcement and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's announcement.
    pub announcement: Announcement,
    /// The node's counters.
    pub stats: NodeStats,
}

const HANDSHAKE_FAILED: i32 = (zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) as i32;
const ACCEPT_FAILED: i32 = zmq_sys::ZMQ_EVENT_ACCEPT_FAILED as i32;
const DISCONNECTED: i32 = zmq_sys::ZMQ_EVENT_DISCONNECTED as i32;

/// A socket monitor reporting failed handshakes (a peer that does not speak
/// ZMTP, or speaks it wrongly, or not within `handshake_timeout_ms`),
/// failed accepts (file descriptors exhausted) and closed peer connections
/// (libzmq closes one that sends a message over the socket's size limit,
/// with no event of its own) on `sock`.
pub(crate) fn monitor(
    inner: &NodeInner,
    sock: &zmq::Socket,
    what: &str,
) -> Result<zmq::Socket, OpenError> {
    let ep = format!("inproc://milonga-mon-{}-{what}", inner.id);
    let err = |source: zmq::Error| OpenError::Socket {
        action: "monitor",
        endpoint: ep.clone(),
        source: source.transport(),
    };
    sock.monitor(&ep, HANDSHAKE_FAILED | ACCEPT_FAILED | DISCONNECTED)
        .map_err(err)?;
    let pair = inner.ctx.socket(zmq::PAIR)?;
    pair.set_linger(0).map_err(err)?;
    pair.connect(&ep).map_err(err)?;
    Ok(pair)
}

/// The node's liveliness socket: an XPUB on which the node thread sends a
/// heartbeat every `heartbeat_interval_ms`, and at once to each new
/// subscriber (it is verbose, so every subscription shows).
fn liveliness_socket(inner: &NodeInner) -> Result<zmq::Socket, OpenError> {
    let sock = inner.ctx.socket(zmq::XPUB)?;
    let err = |source: zmq::Error| OpenError::Socket {
        action: "configure",
        endpoint: "liveliness".into(),
        source: source.transport(),
    };
    crate::backend::p2p::zmq_io::apply_common(&sock, &inner.cfg).map_err(err)?;
    // Subscriptions, and the history queries and filter declarations a
    // subscription sends to all its connections (ignored here).
    sock.set_maxmsgsize(crate::engine::history::MAX_QUERY_BYTES as i64)
        .map_err(err)?;
    sock.set_xpub_verbose(true).map_err(err)?;
    // The last heartbeat (leaving) gets a moment to go out on close: up to
    // 200 ms, the whole 200 when `close_linger_ms` is negative ("as long as
    // it takes"; clamping that to 0 would drop the goodbye).
    let linger = if inner.cfg.close_linger_ms < 0 {
        200
    } else {
        inner.cfg.close_linger_ms.min(200)
    };
    sock.set_linger(linger).map_err(err)?;
    Ok(sock)
}

/// Most keys whose last sequence number a goodbye carries.
pub(crate) const MAX_GOODBYE_KEYS: usize = 8192;

/// A heartbeat frame: kind 3 under `@hb`, body `{"leaving": bool}`; a
/// goodbye (`leaving`) adds `"last": {key: last sequence number}` for the
/// node's keys (at most [`MAX_GOODBYE_KEYS`]), so that subscribers know
/// at once what they have not received.
pub(crate) fn heartbeat_frame(
    inner: &NodeInner,
    seq: u64,
    leaving: bool,
    last: Vec<(String, u64)>,
) -> Vec<u8> {
    use milonga_wire::frame::{self, Encoding, Header, Kind, HEARTBEAT_KEY};
    use milonga_wire::Key;
    let header = Header {
        kind: Kind::Heartbeat,
        flags: 0,
        encoding: Encoding::Cbor,
        domain_tag: inner.domain_tag,
        schema_id: 0,
        node_id: inner.id,
        seq,
        timestamp_ns: crate::util::now_ns(),
    };
    let body = milonga_wire::heartbeat::Heartbeat {
        leaving,
        last: milonga_wire::heartbeat::Last::Keys(last),
    };
    let key = Key::internal(HEARTBEAT_KEY).expect("a valid internal key");
    frame::encode(&key, &header, &body.encode())
}

/// The monitor of one of the node's own sockets, by role (`be`, `r`,
/// `liveliness`): the node thread counts its events.
pub(crate) type NodeMonitor = (&'static str, zmq::Socket);

/// A node's control ROUTER and liveliness XPUB, bound, before the node
/// thread takes them.
pub(crate) struct NodeSockets {
    router: zmq::Socket,
    live: zmq::Socket,
    /// Where the router is bound.
    pub(crate) control_endpoint: String,
    /// Where the liveliness socket is bound.
    pub(crate) liveliness_endpoint: String,
}

/// Binds the node's control and liveliness sockets.
pub(crate) fn bind_node(inner: &NodeInner) -> Result<NodeSockets, OpenError> {
    let router = inner.ctx.socket(zmq::ROUTER)?;
    let ep = inner.endpoint_for("c", inner.cfg.control_endpoint.as_ref());
    crate::backend::p2p::zmq_io::apply_common(&router, &inner.cfg)
        .and_then(|_| router.set_maxmsgsize(65_536))
        .map_err(|source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: ep.clone(),
            source: source.transport(),
        })?;
    let control_endpoint = crate::backend::p2p::zmq_io::bind(&router, &ep)?;
    let live = liveliness_socket(inner)?;
    let ep = inner.endpoint_for("hb", None);
    let liveliness_endpoint = crate::backend::p2p::zmq_io::bind(&live, &ep)?;
    Ok(NodeSockets {
        router,
        live,
        control_endpoint,
        liveliness_endpoint,
    })
}

/// Starts the node thread with the node's sockets. It finds the peers
/// that exist now and announces the node before it returns, so that a
/// subscription declared right after `open` connects to them before it
/// returns.
pub(crate) fn start(
    inner: &Arc<NodeInner>,
    socks: NodeSockets,
    wake: crate::backend::p2p::WakeRx,
) -> Result<JoinHandle<()>, OpenError> {
    let NodeSockets { router, live, .. } = socks;
    let monitor = self::monitor(inner, &router, "control")?;
    let live_monitor = self::monitor(inner, &live, "liveliness")?;
    lock(&inner.state)
        .new_monitors
        .push(("liveliness", live_monitor));
    let mut ctl = Control::new(inner.clone(), router, monitor, wake.0, live);
    ctl.scan_local();
    inner.announce();
    spawn(ctl).map_err(OpenError::Thread)
}

fn spawn(ctl: Control) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("milonga-node {}", ctl.inner.domain))
        .spawn(move || ctl.run())
}

struct StaticPeer {
    endpoint: String,
    sock: zmq::Socket,
    last_reply: Option<Instant>,
    announcement: Option<Announcement>,
    warned_domain: bool,
}

/// A service's socket monitor: the node thread reads it while the service
/// lives (`Weak`); the service holds the reader too, and lets it go only
/// after it has stopped its socket's monitor (libzmq blocks on a monitor
/// event nobody can take).
pub(crate) type SvcMonitor = (
    std::sync::Weak<dyn std::any::Any + Send + Sync>,
    Arc<std::sync::Mutex<zmq::Socket>>,
);

/// Which of the node thread's sockets a poll found readable.
struct Ready {
    router: bool,
    live: bool,
    /// A socket monitor (data sockets, subscriptions).
    monitors: bool,
    statics: bool,
}

/// The node thread's state.
pub(crate) struct Control {
    inner: Arc<NodeInner>,
    router: zmq::Socket,
    monitors: Vec<NodeMonitor>,
    /// Subscriptions' socket monitors (closed connections).
    sub_monitors: Vec<(
        std::sync::Weak<crate::api::subscriber::SubShared>,
        crate::backend::p2p::sub_link::Monitor,
    )>,
    /// Services' socket monitors (bad handshakes, failed accepts).
    svc_monitors: Vec<SvcMonitor>,
    /// Woken by user threads (a batch started waiting).
    wake: zmq::Socket,
    /// Heartbeats go out here.
    live: zmq::Socket,
    heartbeat_seq: u64,
    next_heartbeat: Instant,
    statics: Vec<StaticPeer>,
    local: BTreeMap<String, Announcement>,
    last_scan: Option<Instant>,
    /// The local directory's inotify descriptor, if any.
    watch_fd: Option<std::os::fd::RawFd>,
    last_alive_check: Option<Instant>,
    /// When a local scan last changed the peer table.
    last_published: Option<Instant>,
    last_query: Option<Instant>,
    /// The last drain of the data sockets left messages to read.
    flooded: bool,
}

impl Control {
    fn new(
        inner: Arc<NodeInner>,
        router: zmq::Socket,
        monitor: zmq::Socket,
        wake: zmq::Socket,
        live: zmq::Socket,
    ) -> Self {
        let mut statics = Vec::new();
        for ep in &inner.cfg.peers {
            match inner.ctx.socket(zmq::DEALER).and_then(|s| {
                let _ = crate::backend::p2p::zmq_io::apply_common(&s, &inner.cfg);
                let _ = s.set_sndhwm(4);
                s.connect(ep)
                    .map_err(|source: zmq::Error| OpenError::Socket {
                        action: "connect",
                        endpoint: ep.clone(),
                        source: source.transport(),
                    })?;
                Ok(s)
            }) {
                Ok(sock) => statics.push(StaticPeer {
                    endpoint: ep.clone(),
                    sock,
                    last_reply: None,
                    announcement: None,
                    warned_domain: false,
                }),
                Err(err) => tracing::warn!(peer = %ep, %err, "ignoring a static peer"),
            }
        }
        let watch_fd = inner
            .local
            .as_ref()
            .and_then(|d| lock(d).watch.as_ref().map(crate::discovery::Watch::fd));
        Control {
            inner,
            router,
            monitors: vec![("control", monitor)],
            sub_monitors: Vec::new(),
            svc_monitors: Vec::new(),
            wake,
            live,
            heartbeat_seq: 0,
            next_heartbeat: Instant::now(),
            statics,
            local: BTreeMap::new(),
            last_scan: None,
            watch_fd,
            last_alive_check: None,
            last_published: None,
            last_query: None,
            flooded: false,
        }
    }

    fn run(mut self) {
        let interval = self.inner.cfg.discovery_interval();
        while !self.inner.closed.load(Ordering::Acquire) {
            // A waiting batch is retried every millisecond: it exists only
            // while a subscriber is full, and must leave as soon as it can.
            let batching = self.inner.batch_pending.load(Ordering::Acquire);
            // Only sockets the poll found readable are read: each read of
            // an empty socket is a system call, and this runs every turn.
            let ready = self.wait(if self.flooded {
                Duration::ZERO
            } else if batching {
                Duration::from_millis(1)
            } else if self.watch_fd.is_some() && !self.has_data_sockets() {
                // Nothing here needs a turn every `interval`: discovery
                // changes and socket events wake the poll; only timers
                // remain (liveness checks, heartbeats, static queries).
                self.until_next_timer()
            } else {
                interval
            });
            if self.inner.batch_pending.load(Ordering::Acquire) {
                self.flush_batches();
            }
            if ready.router {
                self.serve_control();
            }
            self.read_monitors(ready.monitors);
            if ready.statics {
                self.read_statics();
            }
            self.query_statics();
            self.scan_local();
            self.flooded = self.drain_data_sockets();
            self.heartbeat(ready.live);
            if lock(&self.inner.state).announce_dirty {
                self.inner.announce();
            }
        }
        // Tell subscribers this node is leaving, so that they report it
        // `closed` rather than wait for the connection or the lease. The
        // subscriptions that arrived since the last turn are read first:
        // the socket sends only to subscribers it knows of.
        while self.live.recv_msg(zmq::DONTWAIT).is_ok() {}
        self.send_heartbeat(true);
        self.stop_monitors();
    }

    /// Whether this node has a data socket, whose subscriptions, history
    /// queries and filter declarations this thread reads every turn.
    fn has_data_sockets(&self) -> bool {
        let st = lock(&self.inner.state);
        st.data_best_effort.is_some() || st.data_reliable.is_some()
    }

    /// How long until the next timed duty: a liveness check of local peers
    /// (250 ms), a heartbeat, a static query.
    fn until_next_timer(&self) -> Duration {
        let now = Instant::now();
        let mut next = now + Duration::from_millis(250);
        next = next.min(self.next_heartbeat);
        if !self.statics.is_empty() {
            let every = Duration::from_millis(self.inner.cfg.static_query_interval_ms.max(10));
            next = next.min(self.last_query.map_or(now, |t| t + every));
        }
        next.saturating_duration_since(now)
            .max(Duration::from_millis(1))
    }

    /// Stops the monitors this thread reads before their readers go (see
    /// [`crate::backend::p2p::zmq_io::stop_monitor`]). A subscription that outlives the
    /// node gets its monitor's reader back, to drop after its own socket.
    fn stop_monitors(&mut self) {
        crate::backend::p2p::zmq_io::stop_monitor(&mut self.router);
        crate::backend::p2p::zmq_io::stop_monitor(&mut self.live);
        let socks = {
            let st = lock(&self.inner.state);
            [st.data_best_effort.clone(), st.data_reliable.clone()]
        };
        for d in socks.into_iter().flatten() {
            crate::backend::p2p::zmq_io::stop_monitor(&mut lock(&d.sock).sock);
        }
        {
            let mut st = lock(&self.inner.state);
            self.sub_monitors.append(&mut st.new_sub_monitors);
        }
        for (sub, m) in self.sub_monitors.drain(..) {
            if let Some(sub) = sub.upgrade() {
                *lock(&sub.monitor) = Some(m);
            }
        }
    }

    /// Sends a heartbeat when one is due, or when a subscriber has just
    /// connected (so that it hears of this node at once).
    fn heartbeat(&mut self, readable: bool) {
        let mut joined = false;
        if readable {
            while let Ok(msg) = self.live.recv_msg(zmq::DONTWAIT) {
                joined |= msg.first() == Some(&1);
                // With XPUB_VERBOSE, an unsubscribe comes only when the
                // last subscriber of the prefix left.
                if msg.first() == Some(&0) {
                    crate::backend::p2p::zmq_io::note_freed(msg.len());
                }
            }
        }
        if joined || Instant::now() >= self.next_heartbeat {
            self.send_heartbeat(false);
            crate::backend::p2p::zmq_io::trim_if_due();
        }
    }

    fn send_heartbeat(&mut self, leaving: bool) {
        self.heartbeat_seq += 1;
        let last = if leaving {
            self.last_seqs()
        } else {
            Vec::new()
        };
        let frame = heartbeat_frame(&self.inner, self.heartbeat_seq, leaving, last);
        // Never waits: a subscriber whose queue is full of heartbeats is
        // not reading them anyway.
        let _ = self.live.send(frame, zmq::DONTWAIT);
        let every = Duration::from_millis(self.inner.cfg.heartbeat_interval_ms.max(1) as u64);
        self.next_heartbeat = Instant::now() + every;
    }

    /// The last sequence number of each key this node published (live
    /// publishers and dropped ones), for its goodbye.
    fn last_seqs(&self) -> Vec<(String, u64)> {
        let st = lock(&self.inner.state);
        let mut last: BTreeMap<String, u64> = st.last_seq.clone().into_iter().collect();
        for (k, s) in &st.pub_seqs {
            last.insert(k.clone(), s.load(Ordering::Relaxed));
        }
        last.into_iter()
            .filter(|(_, s)| *s > 0)
            .take(MAX_GOODBYE_KEYS)
            .collect()
    }

    /// Sleeps until a control request, a monitor event or a static reply
    /// arrives, or `interval` passes.
    fn wait(&mut self, interval: Duration) -> Ready {
        let mut items = vec![
            self.router.as_poll_item(zmq::POLLIN),
            self.wake.as_poll_item(zmq::POLLIN),
            self.live.as_poll_item(zmq::POLLIN),
        ];
        items.extend(
            self.monitors
                .iter()
                .map(|(_, m)| m.as_poll_item(zmq::POLLIN)),
        );
        items.extend(
            self.statics
                .iter()
                .map(|p| p.sock.as_poll_item(zmq::POLLIN)),
        );
        items.extend(
            self.sub_monitors
                .iter()
                .map(|(_, m)| m.0.as_poll_item(zmq::POLLIN)),
        );
        // Held through the poll; nobody else locks them but a service
        // going away, which only drops its handle.
        let svc: Vec<_> = self.svc_monitors.iter().map(|(_, m)| lock(m)).collect();
        items.extend(svc.iter().map(|m| m.as_poll_item(zmq::POLLIN)));
        if let Some(fd) = self.watch_fd {
            items.push(zmq::PollItem::from_fd(fd, zmq::POLLIN));
        }
        let _ = zmq::poll(&mut items, interval.as_millis() as i64);
        let readable: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        drop(items);
        drop(svc);
        let (m, st) = (self.monitors.len(), self.statics.len());
        let (sm, vm) = (self.sub_monitors.len(), self.svc_monitors.len());
        let ready = Ready {
            router: readable[0],
            live: readable[2],
            monitors: readable[3..3 + m].iter().any(|r| *r)
                || readable[3 + m + st..3 + m + st + sm + vm]
                    .iter()
                    .any(|r| *r),
            statics: readable[3 + m..3 + m + st].iter().any(|r| *r),
        };
        if readable[1] {
            while self.wake.recv_msg(zmq::DONTWAIT).is_ok() {}
        }
        ready
    }

    fn serve_control(&mut self) {
        while let Ok(frames) = self.router.recv_multipart(zmq::DONTWAIT) {
            // Frame 0 is the ROUTER's identity of the asker.
            let request = frames.get(1..).map(milonga_wire::control::Request::decode);
            if !matches!(request, Some(Ok(milonga_wire::control::Request::Info))) {
                let n = self
                    .inner
                    .counters
                    .control_malformed
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                if n <= 10 || n % 1000 == 0 {
                    tracing::warn!(
                        dropped_so_far = n,
                        frames = frames.len(),
                        "dropped a malformed control request (expected [{}, info])",
                        String::from_utf8_lossy(CONTROL_MAGIC)
                    );
                }
                continue;
            }
            let info = NodeInfo {
                announcement: self.inner.announcement(&lock(&self.inner.state)),
                stats: self.inner.counters.snapshot(),
            };
            let body = serde_json::to_vec(&info).unwrap_or_default();
            let [magic, info, body] = milonga_wire::control::info_reply(&body);
            let reply: [&[u8]; 4] = [&frames[0], magic, info, body];
            let _ = self.router.send_multipart(reply, zmq::DONTWAIT);
        }
    }

    /// Reads the monitors' events: all of them when `readable` (the poll
    /// saw one), and those of sockets created since the last turn.
    fn read_monitors(&mut self, readable: bool) {
        // Data sockets and subscriptions created since the last turn bring
        // their monitors.
        let added = {
            let mut st = lock(&self.inner.state);
            let added = !st.new_monitors.is_empty()
                || !st.new_sub_monitors.is_empty()
                || !st.new_svc_monitors.is_empty();
            self.monitors.append(&mut st.new_monitors);
            self.sub_monitors.append(&mut st.new_sub_monitors);
            self.svc_monitors.append(&mut st.new_svc_monitors);
            added
        };
        if !readable && !added {
            return;
        }
        self.sub_monitors.retain(|(sub, m)| {
            let Some(sub) = sub.upgrade() else {
                return false;
            };
            while let Ok(frames) = m.0.recv_multipart(zmq::DONTWAIT) {
                let endpoint = frames
                    .get(1)
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .unwrap_or_default();
                sub.connection_closed(endpoint);
            }
            true
        });
        for (what, m) in &self.monitors {
            count_events(&self.inner, what, m);
        }
        self.svc_monitors.retain(|(svc, m)| {
            if svc.strong_count() == 0 {
                // The service's own handle keeps the reader until its
                // socket's monitor is stopped.
                return false;
            }
            count_events(&self.inner, "service", &lock(m));
            true
        });
    }

    fn read_statics(&mut self) {
        let domain = self.inner.domain.clone();
        let mut changed = false;
        for p in &mut self.statics {
            while let Ok(frames) = p.sock.recv_multipart(zmq::DONTWAIT) {
                let parsed = milonga_wire::control::decode_info_reply(&frames)
                    .ok()
                    .and_then(|body| serde_json::from_slice::<NodeInfo>(body).ok());
                let Some(info) = parsed else {
                    stats::inc(&self.inner.counters.control_malformed);
                    limited!(warn, peer = %p.endpoint, "dropped a malformed reply from a static peer");
                    continue;
                };
                if info.announcement.domain != domain {
                    stats::inc(&self.inner.counters.peers_foreign_domain);
                    if !p.warned_domain {
                        tracing::warn!(
                            peer = %p.endpoint,
                            their = %info.announcement.domain,
                            ours = %domain,
                            "ignoring a static peer of another domain"
                        );
                        p.warned_domain = true;
                    }
                    continue;
                }
                p.last_reply = Some(Instant::now());
                if p.announcement.as_ref() != Some(&info.announcement) {
                    p.announcement = Some(info.announcement);
                    changed = true;
                }
            }
        }
        if changed {
            self.publish_peers();
        }
    }

    fn query_statics(&mut self) {
        if self.statics.is_empty() {
            return;
        }
        let every = Duration::from_millis(self.inner.cfg.static_query_interval_ms.max(10));
        if self.last_query.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.last_query = Some(Instant::now());
        let expiry = (every * 3).max(Duration::from_millis(
            self.inner.cfg.heartbeat_timeout_ms as u64,
        ));
        let mut changed = false;
        for p in &mut self.statics {
            let req = milonga_wire::control::Request::Info.frames();
            let _ = p.sock.send_multipart(req, zmq::DONTWAIT);
            if p.announcement.is_some() && p.last_reply.is_none_or(|t| t.elapsed() > expiry) {
                tracing::info!(peer = %p.endpoint, "static peer stopped answering");
                p.announcement = None;
                changed = true;
            }
        }
        if changed {
            self.publish_peers();
        }
    }

    pub(crate) fn scan_local(&mut self) {
        // Peers are published (compared with the table, which costs a copy
        // of every announcement) only when a scan or a static peer changed
        // something: on every turn, each node would pay O(nodes).
        let Some(dir) = &self.inner.local else {
            return;
        };
        // Re-read when the directory changes. Every 250 ms, check that the
        // known peers' processes exist (one kill(pid, 0) each), which
        // catches nodes killed with -9, and re-read if one is gone; every
        // 5 s, re-read anyway (a recycled pid is told by its start time).
        // Re-reading every file on a timer would cost each node O(nodes)
        // parses, the whole host O(nodes^2).
        let now = Instant::now();
        let full_due = self
            .last_scan
            .is_none_or(|t| now - t >= Duration::from_secs(5));
        let alive_due = self
            .last_alive_check
            .is_none_or(|t| now - t >= Duration::from_millis(250));
        let mut dir = lock(dir);
        if full_due {
            dir.mark_all_dirty();
        }
        if !full_due && !dir.changed() {
            drop(dir);
            let gone = alive_due && {
                self.last_alive_check = Some(now);
                !self
                    .local
                    .values()
                    .all(|a| crate::discovery::pid_exists(a.pid))
            };
            if !gone {
                return;
            }
            dir = lock(self.inner.local.as_ref().expect("checked above"));
        }
        self.last_scan = Some(now);
        self.last_alive_check = Some(now);
        let mut bad = 0;
        let found = dir.scan(&mut bad);
        drop(dir);
        stats::add(&self.inner.counters.announcements_malformed, bad);
        let me = self.inner.id.to_hex();
        let local: BTreeMap<String, Announcement> = found
            .into_iter()
            .filter(|(id, a)| {
                if *id == me {
                    return false;
                }
                if a.domain != self.inner.domain {
                    stats::inc(&self.inner.counters.peers_foreign_domain);
                    return false;
                }
                true
            })
            .collect();
        if local != self.local || self.last_published.is_none() {
            self.local = local;
            self.last_published = Some(now);
            self.publish_peers();
        }
    }

    /// Merges local and static peers with this node and, if the set
    /// changed, reconnects subscriptions.
    fn publish_peers(&mut self) {
        let mut peers = self.local.clone();
        for p in &self.statics {
            if let Some(a) = &p.announcement {
                peers.insert(a.node_id.clone(), a.clone());
            }
        }
        let changed = {
            let mut st = lock(&self.inner.state);
            let me = self.inner.announcement(&st);
            peers.insert(me.node_id.clone(), me);
            if st.peers != peers {
                st.peers = peers;
                true
            } else {
                false
            }
        };
        if changed {
            self.inner.reconcile();
        }
    }

    /// Tries to send a reliable publisher's waiting batch, without waiting
    /// for the socket if a user thread holds it (that thread sends it).
    fn flush_batches(&self) {
        let d = lock(&self.inner.state).data_reliable.clone();
        let Some(d) = d else {
            self.inner.batch_pending.store(false, Ordering::Release);
            return;
        };
        let guard = try_lock(&d.sock);
        if let Some(mut g) = guard {
            let _ = g.send_pending(zmq::DONTWAIT, &self.inner.counters);
            if g.out.pending().is_none() {
                self.inner.batch_pending.store(false, Ordering::Release);
            }
        };
    }

    /// Reads subscription messages so that they do not pile up in a
    /// publisher socket nobody is putting on.
    /// Whether a socket had more to read than one drain takes (a flood):
    /// the node thread then comes back without sleeping.
    fn drain_data_sockets(&self) -> bool {
        let socks = {
            let st = lock(&self.inner.state);
            [st.data_best_effort.clone(), st.data_reliable.clone()]
        };
        let mut more = false;
        for d in socks.into_iter().flatten() {
            if let Some(mut g) = try_lock(&d.sock) {
                more |= g.drain_subscriptions(&self.inner);
            }
        }
        more
    }
}

/// Counts the events a monitor of one of this node's listening sockets
/// (`what`) reported: failed handshakes, failed accepts, closed peer
/// connections.
fn count_events(inner: &NodeInner, what: &str, m: &zmq::Socket) {
    while let Ok(frames) = m.recv_multipart(zmq::DONTWAIT) {
        let endpoint = frames
            .get(1)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .unwrap_or_default();
        // Frame 1: the event (u16) and its value (u32), little endian.
        let (event, value) = match frames.first().map(|f| &f[..]) {
            Some([a, b, c, d, e, f, ..]) => (
                i32::from(u16::from_le_bytes([*a, *b])),
                u32::from_le_bytes([*c, *d, *e, *f]),
            ),
            _ => (0, 0),
        };
        let c = &inner.counters;
        if event == DISCONNECTED {
            stats::inc(&c.peer_disconnects);
            continue;
        }
        if event == ACCEPT_FAILED {
            let n = c.accepts_failed.fetch_add(1, Ordering::Relaxed) + 1;
            if n <= 10 || n % 1000 == 0 {
                let err = std::io::Error::from_raw_os_error(value as i32);
                tracing::error!(
                    socket = %what,
                    %endpoint,
                    failed_so_far = n,
                    "cannot accept a connection: {err} (file descriptors exhausted? idle connections are closed after handshake_timeout_ms)"
                );
            }
            continue;
        }
        let n = c.handshakes_failed.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= 10 || n % 1000 == 0 {
            tracing::warn!(
                socket = %what,
                %endpoint,
                dropped_so_far = n,
                "dropped a connection whose peer does not speak ZMTP correctly, or not within handshake_timeout_ms"
            );
        }
    }
}

/// Asks every node of `endpoints` for its [`NodeInfo`] at once, waiting at
/// most `timeout` in all: nodes that do not answer (gone, or a ghost
/// announcement) cost the caller one timeout, not one each.
pub(crate) fn query_many(
    inner: &NodeInner,
    endpoints: &[String],
    timeout: Duration,
) -> Vec<Option<NodeInfo>> {
    let mut out: Vec<Option<NodeInfo>> = vec![None; endpoints.len()];
    let socks: Vec<Option<zmq::Socket>> = endpoints
        .iter()
        .map(|ep| {
            let s = inner.ctx.socket(zmq::DEALER).ok()?;
            s.set_linger(0).ok()?;
            s.set_maxmsgsize(16 << 20).ok()?;
            s.connect(ep).ok()?;
            let req = milonga_wire::control::Request::Info.frames();
            s.send_multipart(req, zmq::DONTWAIT).ok()?;
            Some(s)
        })
        .collect();
    let end = Instant::now() + timeout;
    let mut waiting: Vec<usize> = (0..socks.len()).filter(|i| socks[*i].is_some()).collect();
    while !waiting.is_empty() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let mut items: Vec<zmq::PollItem> = waiting
            .iter()
            .filter_map(|i| socks[*i].as_ref().map(|s| s.as_poll_item(zmq::POLLIN)))
            .collect();
        if zmq::poll(&mut items, left.as_millis().max(1) as i64).is_err() {
            break;
        }
        let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        drop(items);
        let mut still = Vec::new();
        for (i, r) in waiting.into_iter().zip(ready) {
            let Some(s) = socks[i].as_ref().filter(|_| r) else {
                still.push(i);
                continue;
            };
            if let Ok(frames) = s.recv_multipart(zmq::DONTWAIT) {
                out[i] = milonga_wire::control::decode_info_reply(&frames)
                    .ok()
                    .and_then(|body| serde_json::from_slice(body).ok());
            }
        }
        waiting = still;
    }
    out
}

/// Asks the node at `endpoint` for its [`NodeInfo`].
pub(crate) fn query(inner: &NodeInner, endpoint: &str, timeout: Duration) -> Option<NodeInfo> {
    let sock = inner.ctx.socket(zmq::DEALER).ok()?;
    sock.set_linger(0).ok()?;
    sock.set_maxmsgsize(16 << 20).ok()?;
    sock.connect(endpoint).ok()?;
    sock.send_multipart(milonga_wire::control::Request::Info.frames(), 0)
        .ok()?;
    if sock.poll(zmq::POLLIN, timeout.as_millis() as i64).ok()? == 0 {
        return None;
    }
    let frames = sock.recv_multipart(zmq::DONTWAIT).ok()?;
    let body = milonga_wire::control::decode_info_reply(&frames).ok()?;
    serde_json::from_slice(body).ok()
}
