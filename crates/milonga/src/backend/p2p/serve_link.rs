//! A service's socket in the peer-to-peer backend: a ROUTER bound where
//! callers connect, read by the worker that leads (docs/services.md), an
//! inproc peer that wakes it, and the socket monitor the node thread reads
//! (bad handshakes, failed accepts).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::backend::p2p::curve::ClientKeys;
use crate::backend::p2p::zmq_io::{self, message_bytes, recv_parts};
use crate::backend::p2p::P2p;
use crate::model::error::{IntoTransport, OpenError, TransportError};

/// The ROUTER socket of one service.
pub(crate) struct ServeLink {
    sock: zmq::Socket,
    /// A broker client's service: where it is connected, and where the
    /// node thread tells it to move.
    at: Option<(String, Arc<ServeMove>)>,
}

/// Where a broker client's service should connect next (the node moved
/// to another broker), and a way to wake the leader blocked on it.
pub(crate) struct ServeMove {
    /// The broker's services endpoint, and the keys its connection names
    /// (security on).
    to: Mutex<Option<(String, Option<ClientKeys>)>>,
    waker: ServeWaker,
}

impl ServeMove {
    /// Tells the service to connect to `endpoint` instead.
    pub(crate) fn move_to(&self, endpoint: String, curve: Option<ClientKeys>) {
        *crate::util::lock(&self.to) = Some((endpoint, curve));
        self.waker.wake();
    }
}

/// Who sent a request: the ROUTER's identity of the caller's connection,
/// the envelope a broker put before the request (docs/protocol.md §4.5),
/// and (security on) the key that connection was admitted with.
pub(crate) struct Caller(zmq::Message, Option<zmq::Message>, Option<String>);

/// What an envelope frame starts with: a broker's name for the caller
/// whose request it relays, sent back before the reply.
pub(crate) const ENVELOPE: &[u8] = b"@via/";
/// The longest envelope a server takes.
pub(crate) const MAX_ENVELOPE: usize = 256;

impl Caller {
    /// Who the caller is, as bytes (its connection, and the envelope of
    /// one relayed by a broker), to count its requests.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        let mut v = self.0.to_vec();
        if let Some(e) = &self.1 {
            v.extend_from_slice(e);
        }
        v
    }

    /// The caller's key (Z85), when its connection was secured.
    pub(crate) fn key(&self) -> Option<&str> {
        self.2.as_deref()
    }
}

/// Makes the leader's receive return.
pub(crate) struct ServeWaker(Mutex<zmq::Socket>);

/// The reader of a service socket's monitor, shared by the service and the
/// node thread (see `control::SvcMonitor`).
pub(crate) type ServeMonitor = Arc<Mutex<zmq::Socket>>;

impl ServeLink {
    /// Binds service number `n` of `node` at `endpoint`: the link, its
    /// waker, the endpoint bound and the monitor's reader.
    pub(crate) fn open(
        p2p: &P2p,
        n: u64,
        endpoint: &str,
    ) -> Result<(ServeLink, ServeWaker, String, ServeMonitor), OpenError> {
        let mut sock = p2p.ctx().socket(zmq::ROUTER)?;
        let opt_err = |source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: endpoint.to_owned(),
            source: source.transport(),
        };
        zmq_io::apply_common(&sock, &p2p.core().cfg).map_err(opt_err)?;
        // A reply to a caller that has gone fails (and is counted) rather
        // than vanishing.
        sock.set_router_mandatory(true).map_err(opt_err)?;
        p2p.secure_server(&mut sock)?;
        // Replies already queued get a moment to leave when the service goes.
        // Negative (wait forever) is capped like any long wait.
        let linger = if p2p.core().cfg.close_linger_ms < 0 {
            1000
        } else {
            p2p.core().cfg.close_linger_ms.min(1000)
        };
        sock.set_linger(linger).map_err(opt_err)?;
        let mut at = None;
        let bound = match p2p.uplink() {
            // A broker client's service connects to the broker, which
            // relays the calls made to the endpoint it announces.
            Some(up) => {
                at = Some(up.hello.services_in.clone());
                let (to, announced) = up.service_endpoints(&p2p.core().id.to_hex(), n);
                // The tag and the node's client key: the broker sends the
                // tag's calls to that identity only (docs/protocol.md
                // §11.4), so that a connection that knows the tag alone
                // cannot take them.
                let tag = announced.split_once('#').map_or("", |(_, t)| t);
                let identity = format!("{tag}/{}", p2p.client_key());
                sock.set_identity(identity.as_bytes()).map_err(opt_err)?;
                p2p.secure_client(&sock, &to)
                    .map_err(|source| OpenError::Socket {
                        action: "secure",
                        endpoint: to.clone(),
                        source,
                    })?;
                sock.connect(&to)
                    .map_err(|source: zmq::Error| OpenError::Socket {
                        action: "connect",
                        endpoint: to.clone(),
                        source: source.transport(),
                    })?;
                announced
            }
            None => p2p.bind(&sock, endpoint)?,
        };
        let wake_ep = format!("inproc://milonga-svcwake-{}-{n}", p2p.core().id);
        let wake_err = |source: zmq::Error| OpenError::Socket {
            action: "bind or connect",
            endpoint: wake_ep.clone(),
            source: source.transport(),
        };
        sock.bind(&wake_ep).map_err(wake_err)?;
        let waker = p2p.ctx().socket(zmq::DEALER)?;
        waker.set_linger(0).map_err(wake_err)?;
        waker.connect(&wake_ep).map_err(wake_err)?;
        let at = match at {
            Some(to) => {
                let w = p2p.ctx().socket(zmq::DEALER)?;
                w.set_linger(0).map_err(wake_err)?;
                w.connect(&wake_ep).map_err(wake_err)?;
                let m = Arc::new(ServeMove {
                    to: Mutex::new(None),
                    waker: ServeWaker(Mutex::new(w)),
                });
                p2p.watch_service_move(Arc::downgrade(&m));
                // A move the node made after the uplink was read above, and
                // before this service was watched, passed it by: made now.
                if let Some(up) = p2p.uplink().filter(|u| u.hello.services_in != to) {
                    m.move_to(up.hello.services_in.clone(), up.curve.clone());
                }
                Some((to, m))
            }
            None => None,
        };
        // Created last: nothing fallible follows before the link owns the
        // socket, whose `Drop` stops the monitor before the reader goes.
        let monitor = Arc::new(Mutex::new(crate::backend::p2p::control::monitor(
            p2p,
            &sock,
            &format!("s{n}"),
        )?));
        Ok((
            ServeLink { sock, at },
            ServeWaker(Mutex::new(waker)),
            bound,
            monitor,
        ))
    }

    /// Reads one whole message, waiting for it if `wait`: the caller and
    /// the frames after its identity (`Ok(None)`: none waiting, or a
    /// signal). A wake-up is one empty frame.
    pub(crate) fn recv(
        &mut self,
        wait: bool,
    ) -> Result<Option<(Caller, Vec<Bytes>)>, TransportError> {
        if let Some((at, m)) = &mut self.at {
            // (A move to where it is already, told twice when the service
            // was made during a move, changes nothing.)
            let moving = crate::util::lock(&m.to).take().filter(|(to, _)| to != at);
            if let Some((to, curve)) = moving {
                let _ = self.sock.disconnect(at);
                let secured = curve.map_or(Ok(()), |c| c.apply(&self.sock));
                if let Err(e) = secured.and_then(|()| self.sock.connect(&to)) {
                    tracing::warn!(err = %e, broker = %to, "a service cannot connect to the new broker");
                }
                *at = to;
            }
        }
        let flags = if wait { 0 } else { zmq::DONTWAIT };
        match recv_parts(&mut self.sock, flags) {
            Ok(mut parts) => {
                let mut rest = parts.split_off(1);
                // The properties of the connection come with the frames
                // the caller sent (the identity frame is the ROUTER's).
                let key = rest.first_mut().and_then(|m| {
                    m.gets("User-Id")
                        .filter(|k| !k.is_empty())
                        .map(str::to_owned)
                });
                // A broker's envelope (one frame, before the request).
                let envelope = match rest.first() {
                    Some(f) if f.len() <= MAX_ENVELOPE && f.starts_with(ENVELOPE) => {
                        Some(rest.remove(0))
                    }
                    _ => None,
                };
                let rest = rest.into_iter().map(message_bytes).collect();
                let identity = parts.pop().expect("a message has a first frame");
                Ok(Some((Caller(identity, envelope, key), rest)))
            }
            Err(zmq::Error::EINTR | zmq::Error::EAGAIN) => Ok(None),
            Err(e) => Err(e.transport()),
        }
    }

    /// Sends a reply to `caller` (`head`, and `tail` as a second frame)
    /// without waiting: an error if the caller is gone (EHOSTUNREACH) or
    /// its queue is full (EAGAIN).
    pub(crate) fn send(
        &mut self,
        caller: Caller,
        head: Vec<u8>,
        tail: Option<Bytes>,
    ) -> Result<(), TransportError> {
        let more = if tail.is_some() { zmq::SNDMORE } else { 0 };
        self.sock
            .send(caller.0, zmq::DONTWAIT | zmq::SNDMORE)
            .and_then(|_| match caller.1 {
                Some(e) => self.sock.send(e, zmq::DONTWAIT | zmq::SNDMORE),
                None => Ok(()),
            })
            .and_then(|_| self.sock.send(head, zmq::DONTWAIT | more))
            .and_then(|_| match tail {
                Some(t) => zmq_io::send_bytes(&mut self.sock, t, zmq::DONTWAIT),
                None => Ok(()),
            })
            .map_err(IntoTransport::transport)
    }
}

impl Drop for ServeLink {
    fn drop(&mut self) {
        // Before the monitor's reader can go (see zmq_io::stop_monitor).
        zmq_io::stop_monitor(&mut self.sock);
    }
}

impl ServeWaker {
    /// Makes the leader's receive return.
    pub(crate) fn wake(&self) {
        let _ = crate::util::lock(&self.0).send(&[][..], zmq::DONTWAIT);
    }
}
