//! A caller's connection to one server in the peer-to-peer backend: a
//! DEALER socket connected to the service's ROUTER, and the reader of its
//! socket monitor, which tells a waiting call that the connection broke
//! (the server's process died).

use bytes::Bytes;

use crate::backend::p2p::zmq_io::{self, message_bytes};
use crate::backend::p2p::P2p;
use crate::model::error::{IntoTransport, OpenError, TransportError};

const LOST_EVENTS: u16 = (zmq_sys::ZMQ_EVENT_DISCONNECTED
    | zmq_sys::ZMQ_EVENT_CONNECT_RETRIED
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) as u16;
const REFUSED: u16 = zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH as u16;
const UP_EVENTS: u16 = zmq_sys::ZMQ_EVENT_HANDSHAKE_SUCCEEDED as u16;

/// A connection to one server: a DEALER and the reader of its monitor.
pub(crate) struct CallLink {
    sock: zmq::Socket,
    monitor: zmq::Socket,
    /// The receive timeout set on `sock`, in ms.
    rcvtimeo: i32,
    /// The last monitor event read said the connection is down.
    down: bool,
    /// ... because the server refused this node's key (security on).
    refused: bool,
}

impl CallLink {
    /// Connects channel number `n` of `node` to `endpoint`, accepting
    /// replies of up to `limit` bytes.
    pub(crate) fn open(
        p2p: &P2p,
        n: u64,
        endpoint: &str,
        limit: usize,
    ) -> Result<CallLink, OpenError> {
        let sock_err = |action: &'static str| {
            move |source: zmq::Error| OpenError::Socket {
                action,
                endpoint: endpoint.to_owned(),
                source: source.transport(),
            }
        };
        let sock = p2p.ctx().socket(zmq::DEALER)?;
        zmq_io::apply_common(&sock, &p2p.core().cfg).map_err(sock_err("configure"))?;
        sock.set_maxmsgsize(i64::try_from(limit).unwrap_or(i64::MAX))
            .map_err(sock_err("configure"))?;
        sock.set_ipv6(true).map_err(sock_err("configure"))?;
        let mon = format!("inproc://milonga-callmon-{}-{n}", p2p.core().id);
        sock.monitor(&mon, i32::from(LOST_EVENTS | UP_EVENTS))
            .map_err(sock_err("monitor"))?;
        let monitor = p2p.ctx().socket(zmq::PAIR)?;
        monitor.set_linger(0).map_err(sock_err("monitor"))?;
        zmq_io::unbounded_monitor_queue(&monitor).map_err(sock_err("monitor"))?;
        monitor.connect(&mon).map_err(sock_err("monitor"))?;
        p2p.secure_client(&sock, endpoint)
            .map_err(|source| OpenError::Socket {
                action: "secure a call to",
                endpoint: endpoint.to_owned(),
                source,
            })?;
        let real = crate::backend::p2p::uplink::untagged(endpoint);
        if let Some((_, tag)) = endpoint.split_once('#') {
            // A service behind a broker: the connection's identity names
            // it (and this connection, uniquely), so that the broker knows
            // where to relay (docs/protocol.md §11).
            let mut r = [0u8; 8];
            let _ = getrandom::fill(&mut r);
            let id = format!("{tag}|{}", u64::from_le_bytes(r));
            sock.set_identity(id.as_bytes())
                .map_err(sock_err("configure"))?;
        }
        sock.connect(real).map_err(sock_err("connect"))?;
        Ok(CallLink {
            sock,
            monitor,
            rcvtimeo: -1,
            down: false,
            refused: false,
        })
    }

    /// Sends a request (`head`, and `tail` as a second frame), without
    /// waiting: a DEALER with a connection being made queues the message,
    /// and one call per connection at a time never fills its queue.
    pub(crate) fn send(
        &mut self,
        head: Vec<u8>,
        tail: Option<&Bytes>,
    ) -> Result<(), TransportError> {
        let more = if tail.is_some() { zmq::SNDMORE } else { 0 };
        self.sock
            .send(head, zmq::DONTWAIT | more)
            .and_then(|_| match tail {
                Some(t) => zmq_io::send_bytes(&mut self.sock, t.clone(), zmq::DONTWAIT),
                None => Ok(()),
            })
            .map_err(IntoTransport::transport)
    }

    /// Waits up to `ms` (at least 1) for a whole message: `Ok(None)` if
    /// none came (or a signal interrupted the wait).
    pub(crate) fn recv_wait(&mut self, ms: i32) -> Result<Option<Vec<Bytes>>, TransportError> {
        if self.rcvtimeo != ms {
            self.sock
                .set_rcvtimeo(ms)
                .map_err(IntoTransport::transport)?;
            self.rcvtimeo = ms;
        }
        match zmq_io::recv_parts(&mut self.sock, 0) {
            Ok(parts) => Ok(Some(parts.into_iter().map(message_bytes).collect())),
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => Ok(None),
            Err(e) => Err(e.transport()),
        }
    }

    /// Whether the server refused this node's key (as of the last
    /// [`CallLink::is_down`]).
    pub(crate) fn refused(&self) -> bool {
        self.refused
    }

    /// Whether the connection is down, as its last monitor event says.
    /// Reads the monitor's queued events, so that they never pile up in
    /// its queue (libzmq's I/O thread would block on a full one): a
    /// disconnection followed by a reconnection is not down.
    pub(crate) fn is_down(&mut self) -> bool {
        while let Ok(event) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let what = event
                .first()
                .filter(|f| f.len() >= 2)
                .map_or(0, |f| u16::from_le_bytes([f[0], f[1]]));
            if what & LOST_EVENTS != 0 {
                self.down = true;
                // A refusal is followed by its disconnection: it stands
                // until a handshake succeeds.
                self.refused |= what & REFUSED != 0;
            } else if what & UP_EVENTS != 0 {
                self.down = false;
                self.refused = false;
            }
        }
        self.down
    }
}

impl Drop for CallLink {
    fn drop(&mut self) {
        // Before the monitor's reader goes (see zmq_io::stop_monitor).
        zmq_io::stop_monitor(&mut self.sock);
    }
}
