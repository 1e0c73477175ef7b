//! A subscription's connections in the peer-to-peer backend: XSUB sockets
//! connected to the data and liveliness endpoints of the publishers it
//! follows (its subscriptions, history queries and filter declarations
//! travel upstream on the same connections, docs/protocol.md §4), a
//! socket monitor per socket that tells the node thread of closed
//! connections, and an inproc PUB that wakes a thread blocked in a receive.
//!
//! With security off there is one socket. With security on, one per
//! server key the subscription connects to (usually one: the default
//! identity is the user's): libzmq tells a message's receiver nothing of
//! the connection it came on, so the socket is what says which key sent
//! it, and the engine checks that key against the one the frame's node
//! announced (docs/security.md, "Authentic headers").

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::backend::p2p::curve;
use crate::backend::p2p::shm;
use crate::backend::p2p::zmq_io::{self, message_bytes, ContextRef};
use crate::backend::p2p::P2p;
use crate::engine::subscription::Link;
use crate::model::error::{IntoTransport, OpenError, TransportError};
use crate::model::node::NodeCore;
use crate::util::stats;

/// Prefix of the wake-up messages a subscription's own inproc PUB sends to
/// its SUB socket, so that a thread blocked in `recv` on that one socket
/// wakes (a zmq_poll over several sockets costs a dozen system calls per
/// message; a blocking recv on one, as raw libzmq does, costs one).
const WAKE: &[u8] = b"@w\0";

/// The XSUB sockets of one subscription.
pub(crate) struct SubLink {
    /// At least one; the first takes the key of its first connection.
    groups: Vec<Group>,
    /// Endpoint connected -> the group whose socket connected it.
    at: HashMap<String, usize>,
    /// Tagged endpoints (`ENDPOINT#<node id>`, nodes a broker speaks for)
    /// connected, by the endpoint their one connection is made to.
    tagged: HashMap<String, BTreeSet<String>>,
    /// The group read first next time (several groups take turns).
    next: usize,
    /// The receive timeout currently set on the first group's socket, in
    /// ms (a single group's receive blocks on it; several are polled).
    rcvtimeo: i32,
    /// The node's security, when on: each connection names its server's key.
    guard: Option<Arc<curve::Guard>>,
    /// What a new group's socket is made of.
    spec: Spec,
    /// Monitors of groups made since the subscription last looked, for
    /// the node thread to watch ([`SubLink::take_new_monitors`]).
    new_monitors: Vec<Monitor>,
    // Declared last: the sockets above close before the context goes.
    ctx: ContextRef,
}

/// One XSUB socket and the key every connection it made names.
struct Group {
    /// The server key (Z85) of its connections; `None`: frames not held
    /// to a key (security off, `inproc://` in the node's own process, or
    /// a broker, which vouches for the frames it forwards).
    key: Option<Arc<str>>,
    sock: zmq::Socket,
    /// Whether it connected an endpoint yet (the first group, unclaimed,
    /// takes the key of the first connection).
    used: bool,
}

/// What every socket of a subscription is made with.
struct Spec {
    core: Arc<NodeCore>,
    id: u64,
    what: String,
    prefixes: Vec<Vec<u8>>,
    hwm: i32,
    wake_ep: String,
    /// This host's shared-memory marker, while the subscription asks for
    /// payloads through shared memory (docs/shared-memory.md): each key
    /// prefix is followed by `marker ‖ prefix`.
    marker: Option<&'static [u8]>,
}

/// Wakes the thread blocked in [`SubLink::recv_wait`].
pub(crate) struct Waker(Mutex<zmq::Socket>);

/// The socket monitor of one of a subscription's sockets (closed
/// connections), read by the node thread.
pub(crate) struct Monitor(pub(crate) zmq::Socket);

/// What the node thread tells a subscription of its socket's connections.
pub(crate) trait ConnectionWatcher: Send + Sync {
    /// The connection to `endpoint` closed.
    fn connection_closed(&self, endpoint: String);
    /// The node at `endpoint` refused this node's key (ZAP `status`).
    fn connection_refused(&self, endpoint: String, status: u32);
    /// The node thread stopped: the monitor's reader goes back to the
    /// subscription, to be dropped after its socket (libzmq blocks on a
    /// monitor event nobody can take).
    fn monitor_back(&self, monitor: Monitor);
}

/// What a receive found.
pub(crate) enum Incoming {
    /// A data message: its first frame, the payload frame if the
    /// publisher sent one, and the server key (Z85) of the connection it
    /// came on (`None`: security off, or the node's own process).
    Message(Bytes, Option<Bytes>, Option<Arc<str>>),
    /// A message of more than two frames, read to its end and dropped.
    TooManyFrames,
    /// A wake-up, or a message whose second frame could not be read.
    Nothing,
}

impl Spec {
    /// A socket of group `g`, subscribed to the prefixes and to wake-ups,
    /// and its monitor.
    fn socket(&self, ctx: &ContextRef, g: usize) -> Result<(zmq::Socket, Monitor), OpenError> {
        // XSUB rather than SUB: it can send history queries upstream, on the
        // same connections as its subscriptions (docs/protocol.md §4.2).
        let mut sock = ctx.socket(zmq::XSUB)?;
        let cfg_err = |source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: format!("subscription {}", self.what),
            source: source.transport(),
        };
        zmq_io::apply_common(&sock, &self.core.cfg).map_err(cfg_err)?;
        zmq_io::apply_receiving(&mut sock, &self.core.cfg).map_err(cfg_err)?;
        // A connection whose SYN goes unanswered (a firewall, no route
        // back) fails within the handshake timeout, not the kernel's two
        // minutes, and is retried; the monitor reports each failure.
        sock.set_connect_timeout(self.core.cfg.handshake_timeout_ms.max(1))
            .map_err(cfg_err)?;
        // Publishers may be at IPv6 addresses.
        sock.set_ipv6(true).map_err(cfg_err)?;
        sock.set_rcvhwm(self.hwm.max(1)).map_err(cfg_err)?;
        for p in self.prefixes.iter().map(Vec::as_slice).chain([WAKE]) {
            let mut msg = Vec::with_capacity(p.len() + 1);
            msg.push(1);
            msg.extend_from_slice(p);
            sock.send(msg, 0).map_err(cfg_err)?;
        }
        // After the prefixes they mark (a publisher counts a marker only
        // with its prefix, and libzmq sends them on in byte order, where
        // 0xFF comes last).
        for m in self.markers() {
            let mut msg = m;
            msg.insert(0, 1);
            sock.send(msg, 0).map_err(cfg_err)?;
        }
        let mon_ep = match g {
            0 => format!("inproc://milonga-submon-{}-{}", self.core.id, self.id),
            g => format!("inproc://milonga-submon-{}-{}-{g}", self.core.id, self.id),
        };
        sock.monitor(
            &mon_ep,
            (zmq_sys::ZMQ_EVENT_DISCONNECTED
                | zmq_sys::ZMQ_EVENT_CONNECT_RETRIED
                | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) as i32,
        )
        .map_err(cfg_err)?;
        let monitor = ctx.socket(zmq::PAIR)?;
        monitor.set_linger(0).map_err(cfg_err)?;
        zmq_io::unbounded_monitor_queue(&monitor).map_err(cfg_err)?;
        monitor.connect(&mon_ep).map_err(cfg_err)?;
        sock.connect(&self.wake_ep)
            .map_err(|source: zmq::Error| OpenError::Socket {
                action: "connect",
                endpoint: self.wake_ep.clone(),
                source: source.transport(),
            })?;
        Ok((sock, Monitor(monitor)))
    }
}

impl Spec {
    /// The marker subscriptions (`marker ‖ P`) of its key prefixes; none
    /// for a filtered prefix (filtered copies never go through shared
    /// memory) or with shared memory off.
    fn markers(&self) -> Vec<Vec<u8>> {
        let Some(m) = self.marker else {
            return Vec::new();
        };
        self.prefixes
            .iter()
            .filter(|p| p.first() != Some(&b'@'))
            .map(|p| [m, p].concat())
            .collect()
    }
}

impl SubLink {
    /// Opens the socket of subscription `id` of `node`, subscribed to
    /// `prefixes` (and to wake-ups), with a receive high-water mark of
    /// `hwm` messages.
    pub(crate) fn open(
        p2p: &P2p,
        id: u64,
        what: &str,
        prefixes: Vec<Vec<u8>>,
        hwm: i32,
    ) -> Result<(SubLink, Waker, Monitor), OpenError> {
        let ctx = ContextRef::acquire();
        let cfg_err = |source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: format!("subscription {what}"),
            source: source.transport(),
        };
        let wake_ep = format!("inproc://milonga-wake-{}-{id}", p2p.core().id);
        let wake_tx = ctx.socket(zmq::PUB)?;
        wake_tx.set_linger(0).map_err(cfg_err)?;
        wake_tx.set_sndhwm(4).map_err(cfg_err)?;
        zmq_io::bind(&wake_tx, &wake_ep)?;
        let spec = Spec {
            core: p2p.core_arc(),
            id,
            what: what.to_owned(),
            prefixes,
            hwm,
            wake_ep,
            marker: {
                let cfg = &p2p.core().cfg;
                let inproc = cfg.transport == crate::model::config::Transport::Inproc;
                (cfg.shared_memory && !inproc).then(shm::marker).flatten()
            },
        };
        let (sock, monitor) = spec.socket(&ctx, 0)?;
        Ok((
            SubLink {
                groups: vec![Group {
                    key: None,
                    sock,
                    used: false,
                }],
                at: HashMap::new(),
                tagged: HashMap::new(),
                next: 0,
                rcvtimeo: -1,
                guard: p2p.guard(),
                spec,
                new_monitors: Vec::new(),
                ctx,
            },
            Waker(Mutex::new(wake_tx)),
            monitor,
        ))
    }

    /// The monitors of the sockets made since the last call, for the node
    /// thread to watch.
    pub(crate) fn take_new_monitors(&mut self) -> Vec<Monitor> {
        std::mem::take(&mut self.new_monitors)
    }

    /// Whether a message is waiting to be read.
    pub(crate) fn readable(&self) -> bool {
        self.groups
            .iter()
            .any(|g| g.sock.get_events().is_ok_and(|e| e.contains(zmq::POLLIN)))
    }

    /// Reads a message if one is waiting: `Ok(None)` if none is,
    /// `Err(None)` if a signal interrupted the read.
    pub(crate) fn try_recv(&mut self) -> Result<Option<Incoming>, Option<TransportError>> {
        let n = self.groups.len();
        for i in 0..n {
            let g = if n == 1 { 0 } else { (self.next + i) % n };
            match self.groups[g].sock.recv_msg(zmq::DONTWAIT) {
                Ok(first) => {
                    self.next = g + 1;
                    return Ok(Some(self.rest(g, first)));
                }
                Err(zmq::Error::EAGAIN) => {}
                Err(zmq::Error::EINTR) => return Err(None),
                Err(e) => return Err(Some(e.transport())),
            }
        }
        Ok(None)
    }

    /// Waits up to `wait_ms` (at least 1) for a message: `Ok(None)` when
    /// none came, or a signal interrupted the wait. A wake-up ends it too.
    pub(crate) fn recv_wait(&mut self, wait_ms: i32) -> Result<Option<Incoming>, TransportError> {
        if self.groups.len() > 1 {
            // Several sockets: wait on all of them, then read the first
            // ready in turn.
            let mut items: Vec<zmq::PollItem> = self
                .groups
                .iter()
                .map(|g| g.sock.as_poll_item(zmq::POLLIN))
                .collect();
            match zmq::poll(&mut items, i64::from(wait_ms)) {
                Ok(0) | Err(zmq::Error::EINTR) => return Ok(None),
                Ok(_) => {}
                Err(e) => return Err(e.transport()),
            }
            drop(items);
            return match self.try_recv() {
                Ok(m) => Ok(m),
                Err(None) => Ok(None),
                Err(Some(e)) => Err(e),
            };
        }
        if self.rcvtimeo != wait_ms {
            self.groups[0]
                .sock
                .set_rcvtimeo(wait_ms)
                .map_err(IntoTransport::transport)?;
            self.rcvtimeo = wait_ms;
        }
        // One blocking receive on one socket: wake-ups (a stop, new routes,
        // a closed connection) arrive on it too.
        match self.groups[0].sock.recv_msg(0) {
            Ok(first) => Ok(Some(self.rest(0, first))),
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => Ok(None),
            Err(e) => Err(e.transport()),
        }
    }

    /// The rest of the message that starts with `first`, read on group `g`.
    fn rest(&mut self, g: usize, first: zmq::Message) -> Incoming {
        if first.first() == Some(&b'@') && first.starts_with(WAKE) {
            return Incoming::Nothing;
        }
        let group = &self.groups[g];
        let second = if first.get_more() {
            match group.sock.recv_msg(0) {
                Ok(m) if !m.get_more() => Some(message_bytes(m)),
                Ok(_) => {
                    while let Ok(m) = group.sock.recv_msg(0) {
                        if !m.get_more() {
                            break;
                        }
                    }
                    return Incoming::TooManyFrames;
                }
                Err(_) => return Incoming::Nothing,
            }
        } else {
            None
        };
        let key = group.key.clone();
        if second.is_none() && self.spec.marker.is_some() {
            match shm::resolve(&first, self.spec.core.cfg.max_message_bytes) {
                None => {}
                Some(Ok((frame, payload))) => {
                    stats::inc(&self.spec.core.counters.shm_received);
                    return Incoming::Message(frame, Some(payload), key);
                }
                Some(Err(e)) => {
                    stats::inc(&self.spec.core.counters.shm_unreadable);
                    limited!(
                        warn,
                        subscription = %self.spec.what,
                        error = %e,
                        "a shared-memory sample could not be read: it is reported lost"
                    );
                    if matches!(e, shm::Unreadable::Withdraw(_)) {
                        self.stop_shared_memory();
                    }
                    return Incoming::Nothing;
                }
            }
        }
        Incoming::Message(message_bytes(first), second, key)
    }

    /// Stops asking for payloads through shared memory (a segment could
    /// not be mapped): the markers are withdrawn, and publishers send this
    /// subscription's samples through the socket from then on.
    fn stop_shared_memory(&mut self) {
        for m in self.spec.markers() {
            let mut msg = m;
            msg.insert(0, 0);
            for g in &self.groups {
                let _ = g.sock.send(msg.as_slice(), zmq::DONTWAIT);
            }
        }
        self.spec.marker = None;
    }

    /// The group whose connections name `key` as their server's: one
    /// that does, else the first if it connected nothing yet, else a new
    /// one (its monitor handed to the node thread).
    fn group_for(&mut self, key: Option<Arc<str>>) -> Result<usize, TransportError> {
        if let Some(g) = self.groups.iter().position(|g| g.key == key) {
            return Ok(g);
        }
        if !self.groups[0].used {
            self.groups[0].key = key;
            return Ok(0);
        }
        let g = self.groups.len();
        let (sock, monitor) = self
            .spec
            .socket(&self.ctx, g)
            .map_err(|e| TransportError::new(e.to_string(), None))?;
        self.groups.push(Group {
            key,
            sock,
            used: false,
        });
        self.new_monitors.push(monitor);
        Ok(g)
    }
}

impl SubLink {
    /// The endpoints the engine connected that a connection to `endpoint`
    /// (as the socket made it) carries: itself, or the tagged endpoints
    /// of the nodes a broker serves there.
    pub(crate) fn carried_by(&self, endpoint: String) -> Vec<String> {
        match self.tagged.get(&endpoint) {
            Some(tags) => tags.iter().cloned().collect(),
            None => vec![endpoint],
        }
    }

    fn connect_tagged(&mut self, endpoint: &str, real: &str) -> Result<(), TransportError> {
        if let Some(tags) = self.tagged.get_mut(real) {
            tags.insert(endpoint.to_owned());
            return Ok(());
        }
        // A broker's sockets time out a connection silent after a PING,
        // whatever it carries.
        self.connect_untagged(real, true)?;
        self.tagged
            .insert(real.to_owned(), BTreeSet::from([endpoint.to_owned()]));
        Ok(())
    }

    fn connect_untagged(&mut self, endpoint: &str, pinged: bool) -> Result<(), TransportError> {
        // A broker's connection carries the frames of every node it
        // serves: the broker checked each against the key of the
        // connection it came on (docs/broker.md), so it vouches for them,
        // and they are not held to its own key here (no key: no check).
        let key = match self.guard.as_deref() {
            Some(g) if g.brokered(endpoint) => None,
            g => curve::server_key(g, endpoint).map(|k| k.to_z85().into()),
        };
        let g = self.group_for(key)?;
        let group = &mut self.groups[g];
        curve::secure_client(self.guard.as_deref(), &group.sock, endpoint)?;
        zmq_io::set_pings(&group.sock, &self.spec.core.cfg, pinged)
            .map_err(IntoTransport::transport)?;
        group
            .sock
            .connect(endpoint)
            .map_err(IntoTransport::transport)?;
        group.used = true;
        self.at.insert(endpoint.to_owned(), g);
        Ok(())
    }
}

impl Link for SubLink {
    fn connect(&mut self, endpoint: &str, pinged: bool) -> Result<(), TransportError> {
        match crate::backend::p2p::uplink::untagged(endpoint) {
            real if real.len() != endpoint.len() => self.connect_tagged(endpoint, real),
            _ => self.connect_untagged(endpoint, pinged),
        }
    }

    fn disconnect(&mut self, endpoint: &str) {
        let real = crate::backend::p2p::uplink::untagged(endpoint);
        if real.len() != endpoint.len() {
            let Some(tags) = self.tagged.get_mut(real) else {
                return;
            };
            tags.remove(endpoint);
            if !tags.is_empty() {
                return;
            }
            self.tagged.remove(real);
        }
        if let Some(g) = self.at.remove(real) {
            let _ = self.groups[g].sock.disconnect(real);
        }
    }

    fn send(&mut self, msg: Vec<u8>) -> Result<(), TransportError> {
        // Upstream messages go to every connection, whichever its socket.
        let mut result = Ok(());
        for g in self.groups.iter().filter(|g| g.used) {
            if let Err(e) = g.sock.send(msg.as_slice(), zmq::DONTWAIT) {
                result = result.and(Err(e.transport()));
            }
        }
        result
    }

    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
}

impl Drop for SubLink {
    fn drop(&mut self) {
        // Before the monitors' readers (the node thread's, or the
        // subscription's own) go: see `zmq_io::stop_monitor`.
        for g in &mut self.groups {
            zmq_io::stop_monitor(&mut g.sock);
        }
    }
}

impl Waker {
    /// Interrupts a thread blocked in [`SubLink::recv_wait`].
    pub(crate) fn wake(&self) {
        let _ = crate::util::lock(&self.0).send(WAKE, zmq::DONTWAIT);
    }
}
