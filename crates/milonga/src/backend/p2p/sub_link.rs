//! A subscription's connections in the peer-to-peer backend: one XSUB
//! socket connected to the data and liveliness endpoints of the publishers
//! it follows (its subscriptions, history queries and filter declarations
//! travel upstream on the same connections, docs/protocol.md §4), a
//! socket monitor that tells the node thread of closed connections, and
//! an inproc PUB that wakes a thread blocked in a receive.

use std::sync::Mutex;

use bytes::Bytes;

use crate::backend::p2p::curve;
use crate::backend::p2p::zmq_io::{self, message_bytes};
use crate::backend::p2p::P2p;
use crate::engine::subscription::Link;
use crate::model::error::{IntoTransport, OpenError, TransportError};

/// Prefix of the wake-up messages a subscription's own inproc PUB sends to
/// its SUB socket, so that a thread blocked in `recv` on that one socket
/// wakes (a zmq_poll over several sockets costs a dozen system calls per
/// message; a blocking recv on one, as raw libzmq does, costs one).
const WAKE: &[u8] = b"@w\0";

/// The XSUB socket of one subscription.
pub(crate) struct SubLink {
    sock: zmq::Socket,
    /// The receive timeout currently set on `sock`, in ms.
    rcvtimeo: i32,
    /// The node's security, when on: each connection names its server's key.
    guard: Option<std::sync::Arc<curve::Guard>>,
}

/// Wakes the thread blocked in [`SubLink::recv_wait`].
pub(crate) struct Waker(Mutex<zmq::Socket>);

/// The socket monitor of a subscription's link (closed connections), read
/// by the node thread.
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
    /// A data message: its first frame, and the payload frame if the
    /// publisher sent one.
    Message(Bytes, Option<Bytes>),
    /// A message of more than two frames, read to its end and dropped.
    TooManyFrames,
    /// A wake-up, or a message whose second frame could not be read.
    Nothing,
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
        // XSUB rather than SUB: it can send history queries upstream, on the
        // same connections as its subscriptions (docs/protocol.md §4.2).
        let sock = p2p.ctx().socket(zmq::XSUB)?;
        let cfg_err = |source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: format!("subscription {what}"),
            source: source.transport(),
        };
        zmq_io::apply_common(&sock, &p2p.core().cfg).map_err(cfg_err)?;
        // A connection whose SYN goes unanswered (a firewall, no route
        // back) fails within the handshake timeout, not the kernel's two
        // minutes, and is retried; the monitor reports each failure.
        sock.set_connect_timeout(p2p.core().cfg.handshake_timeout_ms.max(1))
            .map_err(cfg_err)?;
        // Publishers may be at IPv6 addresses.
        sock.set_ipv6(true).map_err(cfg_err)?;
        sock.set_rcvhwm(hwm).map_err(cfg_err)?;
        for p in prefixes.iter().map(Vec::as_slice).chain([WAKE]) {
            let mut msg = Vec::with_capacity(p.len() + 1);
            msg.push(1);
            msg.extend_from_slice(p);
            sock.send(msg, 0).map_err(cfg_err)?;
        }
        let mon_ep = format!("inproc://milonga-submon-{}-{id}", p2p.core().id);
        sock.monitor(
            &mon_ep,
            (zmq_sys::ZMQ_EVENT_DISCONNECTED
                | zmq_sys::ZMQ_EVENT_CONNECT_RETRIED
                | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) as i32,
        )
        .map_err(cfg_err)?;
        let monitor = p2p.ctx().socket(zmq::PAIR)?;
        monitor.set_linger(0).map_err(cfg_err)?;
        monitor.connect(&mon_ep).map_err(cfg_err)?;
        let wake_ep = format!("inproc://milonga-wake-{}-{id}", p2p.core().id);
        let wake_tx = p2p.ctx().socket(zmq::PUB)?;
        wake_tx.set_linger(0).map_err(cfg_err)?;
        wake_tx.set_sndhwm(4).map_err(cfg_err)?;
        zmq_io::bind(&wake_tx, &wake_ep)?;
        sock.connect(&wake_ep)
            .map_err(|source: zmq::Error| OpenError::Socket {
                action: "connect",
                endpoint: wake_ep.clone(),
                source: source.transport(),
            })?;
        Ok((
            SubLink {
                sock,
                rcvtimeo: -1,
                guard: p2p.guard(),
            },
            Waker(Mutex::new(wake_tx)),
            Monitor(monitor),
        ))
    }

    /// Whether a message is waiting to be read.
    pub(crate) fn readable(&self) -> bool {
        self.sock
            .get_events()
            .is_ok_and(|e| e.contains(zmq::POLLIN))
    }

    /// Reads a message if one is waiting: `Ok(None)` if none is,
    /// `Err(None)` if a signal interrupted the read.
    pub(crate) fn try_recv(&mut self) -> Result<Option<Incoming>, Option<TransportError>> {
        match self.sock.recv_msg(zmq::DONTWAIT) {
            Ok(first) => Ok(Some(self.rest(first))),
            Err(zmq::Error::EAGAIN) => Ok(None),
            Err(zmq::Error::EINTR) => Err(None),
            Err(e) => Err(Some(e.transport())),
        }
    }

    /// Waits up to `wait_ms` (at least 1) for a message: `Ok(None)` when
    /// none came, or a signal interrupted the wait. A wake-up ends it too.
    pub(crate) fn recv_wait(&mut self, wait_ms: i32) -> Result<Option<Incoming>, TransportError> {
        if self.rcvtimeo != wait_ms {
            self.sock
                .set_rcvtimeo(wait_ms)
                .map_err(IntoTransport::transport)?;
            self.rcvtimeo = wait_ms;
        }
        // One blocking receive on one socket: wake-ups (a stop, new routes,
        // a closed connection) arrive on it too.
        match self.sock.recv_msg(0) {
            Ok(first) => Ok(Some(self.rest(first))),
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => Ok(None),
            Err(e) => Err(e.transport()),
        }
    }

    /// The rest of the message that starts with `first`.
    fn rest(&mut self, first: zmq::Message) -> Incoming {
        if first.first() == Some(&b'@') && first.starts_with(WAKE) {
            return Incoming::Nothing;
        }
        let second = if first.get_more() {
            match self.sock.recv_msg(0) {
                Ok(m) if !m.get_more() => Some(message_bytes(m)),
                Ok(_) => {
                    while let Ok(m) = self.sock.recv_msg(0) {
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
        Incoming::Message(message_bytes(first), second)
    }
}

impl Link for SubLink {
    fn connect(&mut self, endpoint: &str) -> Result<(), TransportError> {
        curve::secure_client(self.guard.as_deref(), &self.sock, endpoint)?;
        self.sock
            .connect(endpoint)
            .map_err(IntoTransport::transport)
    }

    fn disconnect(&mut self, endpoint: &str) {
        let _ = self.sock.disconnect(endpoint);
    }

    fn send(&mut self, msg: Vec<u8>) -> Result<(), TransportError> {
        self.sock
            .send(msg, zmq::DONTWAIT)
            .map_err(IntoTransport::transport)
    }

    fn now(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
}

impl Drop for SubLink {
    fn drop(&mut self) {
        // Before the monitor's reader (the node thread's, or the
        // subscription's own) goes: see `zmq_io::stop_monitor`.
        zmq_io::stop_monitor(&mut self.sock);
    }
}

impl Waker {
    /// Interrupts a thread blocked in [`SubLink::recv_wait`].
    pub(crate) fn wake(&self) {
        let _ = crate::util::lock(&self.0).send(WAKE, zmq::DONTWAIT);
    }
}
