//! The peer-to-peer backend: every node binds its own ZeroMQ sockets
//! (data XPUBs, a liveliness XPUB, a control ROUTER, services' ROUTERs),
//! and the node thread polls them (docs/internals.md).
//!
//! It knows nothing of the layers above it: the node thread reaches the
//! node through [`control::Host`], a subscription's closed connections
//! through [`sub_link::ConnectionWatcher`].

pub(crate) mod broker;
pub(crate) mod call_link;
pub(crate) mod control;
pub(crate) mod curve;
pub(crate) mod data;
pub(crate) mod federation;
pub(crate) mod registry;
pub(crate) mod scout_peers;
pub(crate) mod serve_link;
pub(crate) mod shm;
pub(crate) mod static_peers;
pub(crate) mod sub_link;
pub(crate) mod uplink;
// libzmq's calls that the zmq crate does not wrap.
#[allow(unsafe_code)]
pub(crate) mod zmq_io;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use milonga_wire::NodeId;

use crate::model::config::{Config, Security, Transport};
use crate::model::error::{IntoTransport, OpenError, TransportError};
use crate::model::node::NodeCore;
use crate::model::qos::Reliability;
use crate::util::lock;
use data::DataSocket;
pub(crate) use zmq_io::ContextRef;

/// Most excluded peers remembered for `ls`.
const MAX_EXCLUDED: usize = 1024;

/// Wakes the node thread: one end of an inproc PAIR.
pub(crate) struct NodeWaker(Mutex<zmq::Socket>);

/// The node thread's end of the pair.
pub(crate) struct WakeRx(pub(crate) zmq::Socket);

impl NodeWaker {
    /// The pair of node `id`.
    pub(crate) fn pair(ctx: &ContextRef, id: NodeId) -> Result<(NodeWaker, WakeRx), OpenError> {
        let wake_ep = format!("inproc://milonga-nodewake-{id}");
        let wake_rx = ctx.socket(zmq::PAIR)?;
        let wake_tx = ctx.socket(zmq::PAIR)?;
        let wake_err = |source: zmq::Error| OpenError::Socket {
            action: "bind or connect",
            endpoint: wake_ep.clone(),
            source: source.transport(),
        };
        wake_rx.set_linger(0).map_err(wake_err)?;
        wake_tx.set_linger(0).map_err(wake_err)?;
        wake_rx.bind(&wake_ep).map_err(wake_err)?;
        wake_tx.connect(&wake_ep).map_err(wake_err)?;
        Ok((NodeWaker(Mutex::new(wake_tx)), WakeRx(wake_rx)))
    }

    /// Wakes the node thread now rather than at its next turn.
    pub(crate) fn wake(&self) {
        let _ = crate::util::lock(&self.0).send(&[][..], zmq::DONTWAIT);
    }
}

/// One node's peer-to-peer resources: the ZeroMQ context, its data
/// sockets, the monitors handed to the node thread, and the thread's
/// waker. Owned by the session; everything here is reached through its
/// methods.
pub(crate) struct P2p {
    core: Arc<NodeCore>,
    /// A reliable publisher left a batch for the node thread to send.
    batch_pending: AtomicBool,
    waker: NodeWaker,
    /// Lock order: after the session's state, before a data socket.
    sockets: Mutex<Sockets>,
    /// CURVE: the node's key, what it trusts, its peers' keys (security on).
    security: Option<Arc<curve::Guard>>,
    /// Peers discovery shows that this node does not connect to, and why
    /// (as of the last discovery turn; at most [`MAX_EXCLUDED`]).
    excluded: Mutex<Vec<(crate::discovery::Announcement, String)>>,
    /// The broker a `milonga://HOST:PORT/DOMAIN` node is attached to: its
    /// data and liveliness sockets connect there instead of binding.
    uplink: Mutex<Option<uplink::Uplink>>,
    /// A broker client: the locator's brokers (it fails over among them).
    brokers: Vec<uplink::BrokerAt>,
    /// A broker client's services, told when the node moves to another
    /// broker.
    service_moves: Mutex<Vec<Weak<serve_link::ServeMove>>>,
    /// Its client key at brokers (docs/protocol.md §11.2): random, kept
    /// for the node's life, sent with its attaches and in its services'
    /// identities, so that no other connection can take its place.
    client_key: String,
    // Declared last: sockets above are closed before the context goes.
    ctx: ContextRef,
}

/// What [`P2p::sockets`] guards.
#[derive(Default)]
struct Sockets {
    /// The data sockets, numbered by their place here (never removed).
    /// Without access control, at most one per reliability; with it, one
    /// per reliability and set of `subscribe` rules covering its keys.
    data: Vec<Arc<DataSocket>>,
    /// Monitors created since the node thread last looked: of data
    /// sockets (counted), of subscriptions (closed connections), of
    /// services (counted while the service lives).
    new: control::NewMonitors,
}

/// A broker client with security on: every connection to one of `up`'s
/// endpoints names the broker's key.
fn broker_keys(g: &curve::Guard, up: &uplink::Uplink) {
    if let Some(c) = &up.curve {
        g.set_broker(up.all_endpoints(), c.server);
    }
}

/// The identity and trust directory of a node opened with `cfg`, if its
/// security is on (loaded before the node exists: its id is bound to the
/// key). An ACL without security is an error.
pub(crate) fn load_identity(
    cfg: &Config,
) -> Result<Option<(curve::Identity, std::path::PathBuf)>, OpenError> {
    match cfg.effective_security() {
        Security::On => {
            let (key_file, trust_dir) = match (&cfg.key_file, &cfg.trust_dir) {
                (Some(k), Some(t)) => (k.clone(), t.clone()),
                (given_key, given_trust) => {
                    let dir = Config::default_security_dir().ok_or_else(|| OpenError::Config {
                        key: "key_file".into(),
                        why: "security is on and no key_file or trust_dir is given, and there is no home directory for the default identity (set MILONGA_KEY and MILONGA_TRUST, or --key and --trust; docs/security.md)".into(),
                    })?;
                    // The default identity is made only when no key is
                    // given; the default trust directory when none is.
                    let key = match given_key {
                        Some(k) => k.clone(),
                        None => curve::default_identity(&dir)?,
                    };
                    let trust = match given_trust {
                        Some(t) => t.clone(),
                        None => curve::default_trust(&dir)?,
                    };
                    (key, trust)
                }
            };
            let identity = curve::Identity::load(&key_file)?;
            Ok(Some((identity, trust_dir)))
        }
        Security::Off if cfg.reachable() => {
            if cfg.acl_file.is_some() {
                return Err(OpenError::Config {
                    key: "acl_file".into(),
                    why: "access control needs security on (its rules name keys)".into(),
                });
            }
            tracing::warn!(
                tcp_host = %cfg.tcp_host,
                "security is off on a node other hosts can reach: anyone on the network can read, publish and call (docs/security.md)"
            );
            Ok(None)
        }
        _ if cfg.acl_file.is_some() => Err(OpenError::Config {
            key: "acl_file".into(),
            why: "access control needs security on (its rules name keys)".into(),
        }),
        _ => Ok(None),
    }
}

impl P2p {
    /// The backend of node `core`, and the node thread's end of its waker.
    pub(crate) fn new(
        core: Arc<NodeCore>,
        identity: Option<(curve::Identity, std::path::PathBuf)>,
        uplink: Option<uplink::Uplink>,
        brokers: Vec<uplink::BrokerAt>,
    ) -> Result<(P2p, WakeRx), OpenError> {
        let ctx = ContextRef::acquire();
        let (waker, wake_rx) = NodeWaker::pair(&ctx, core.id)?;
        let security = match identity {
            Some((identity, trust_dir)) => {
                let guard =
                    curve::Guard::new(&core, identity, &trust_dir, core.cfg.acl_file.as_deref())?;
                ctx.ensure_zap()?;
                if let Some(up) = &uplink {
                    broker_keys(&guard, up);
                }
                Some(guard)
            }
            None => None,
        };
        Ok((
            P2p {
                core,
                batch_pending: AtomicBool::new(false),
                waker,
                sockets: Mutex::new(Sockets::default()),
                security,
                excluded: Mutex::new(Vec::new()),
                uplink: Mutex::new(uplink),
                brokers,
                service_moves: Mutex::new(Vec::new()),
                client_key: uplink::client_key(),
                ctx,
            },
            wake_rx,
        ))
    }

    pub(crate) fn core(&self) -> &NodeCore {
        &self.core
    }

    /// The node's core, shared.
    pub(crate) fn core_arc(&self) -> Arc<NodeCore> {
        self.core.clone()
    }

    pub(crate) fn ctx(&self) -> &ContextRef {
        &self.ctx
    }

    /// The node's security, when it is on.
    pub(crate) fn security(&self) -> Option<&curve::Guard> {
        self.security.as_deref()
    }

    /// Records the peers this node does not connect to, and why.
    pub(crate) fn set_excluded(&self, mut peers: Vec<(crate::discovery::Announcement, String)>) {
        peers.truncate(MAX_EXCLUDED);
        *lock(&self.excluded) = peers;
    }

    /// The peers this node does not connect to, and why.
    pub(crate) fn excluded_peers(&self) -> Vec<(crate::discovery::Announcement, String)> {
        lock(&self.excluded).clone()
    }

    /// The node's public key, when its security is on.
    pub(crate) fn public_key(&self) -> Option<curve::PublicKey> {
        self.security.as_ref().map(|g| g.identity.public())
    }

    /// Makes `sock`, a socket that binds, a CURVE server admitting the
    /// trusted keys only (security on; nothing otherwise). Before `bind`.
    pub(crate) fn secure_server(&self, sock: &mut zmq::Socket) -> Result<(), OpenError> {
        self.secure_server_in(sock, None)
    }

    /// [`P2p::secure_server`] for a data socket: with access control, it
    /// admits only keys the rules let subscribe to something.
    pub(crate) fn secure_data_server(
        &self,
        sock: &mut zmq::Socket,
        number: u32,
    ) -> Result<(), OpenError> {
        self.secure_server_in(sock, Some(number))
    }

    fn secure_server_in(&self, sock: &mut zmq::Socket, data: Option<u32>) -> Result<(), OpenError> {
        let Some(g) = &self.security else {
            return Ok(());
        };
        let domain = match data {
            Some(n) => format!("{}{}{n}", g.zap_domain, curve::DATA_DOMAIN_INFIX),
            None => g.zap_domain.clone(),
        };
        let err = |source: zmq::Error| OpenError::Socket {
            action: "secure",
            endpoint: "a listening socket".into(),
            source: source.transport(),
        };
        curve::secure_server(g, sock, &domain).map_err(err)
    }

    /// Makes `sock` a CURVE client for its next `connect`, to `endpoint`
    /// (see [`curve::secure_client`]).
    pub(crate) fn secure_client(
        &self,
        sock: &zmq::Socket,
        endpoint: &str,
    ) -> Result<(), TransportError> {
        curve::secure_client(self.security.as_deref(), sock, endpoint)
    }

    /// The node's security, shared (for the discovery sources and links).
    pub(crate) fn guard(&self) -> Option<Arc<curve::Guard>> {
        self.security.clone()
    }

    /// Wakes the node thread now rather than at its next turn.
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// A reliable publisher left a batch for the node thread to send.
    pub(crate) fn note_batch_pending(&self) {
        self.batch_pending.store(true, Ordering::Release);
        self.wake();
    }

    /// Whether a reliable batch waits for the node thread.
    pub(crate) fn batch_pending(&self) -> bool {
        self.batch_pending.load(Ordering::Acquire)
    }

    /// The node thread takes the notice of waiting batches, before it
    /// tries to send them.
    fn clear_batch_pending(&self) {
        self.batch_pending.store(false, Ordering::Release);
    }

    /// A batch the node thread could not send waits on: it tries again
    /// next turn (no wake-up: it is the node thread).
    fn batch_still_pending(&self) {
        self.batch_pending.store(true, Ordering::Release);
    }

    /// Whether this node has a data socket, whose subscriptions, history
    /// queries and filter declarations the node thread reads every turn.
    fn has_data_sockets(&self) -> bool {
        !lock(&self.sockets).data.is_empty()
    }

    /// The monitors created since the node thread last looked.
    fn take_new_monitors(&self) -> control::NewMonitors {
        std::mem::take(&mut lock(&self.sockets).new)
    }

    /// Binds `sock` at `endpoint`; a tcp endpoint at `tcp_host` is bound at
    /// the same port on the node's other addresses too (a node on several
    /// networks is reached on each at the ports it announces). The bound
    /// endpoint at `tcp_host`. A port taken on another address is logged,
    /// and that network does not reach this socket.
    pub(crate) fn bind(&self, sock: &zmq::Socket, endpoint: &str) -> Result<String, OpenError> {
        if endpoint.starts_with("tcp://[") {
            // Only then: a listening socket with IPv6 on takes IPv4 peers
            // as IPv4-mapped addresses and names its endpoint so.
            sock.set_ipv6(true)
                .map_err(|source: zmq::Error| OpenError::Socket {
                    action: "configure",
                    endpoint: endpoint.to_owned(),
                    source: source.transport(),
                })?;
        }
        let core = &self.core;
        let ephemeral = endpoint == format!("tcp://{}:*", core.cfg.tcp_host);
        // An ephemeral port taken on another address is tried again with a
        // new one, a few times; a fixed one is what it is.
        let tries = if ephemeral && !core.other_hosts.is_empty() {
            8
        } else {
            1
        };
        let mut bound = String::new();
        for attempt in 1..=tries {
            bound = zmq_io::bind(sock, endpoint)?;
            let Some(port) = bound
                .strip_prefix("tcp://")
                .and_then(|hp| hp.strip_prefix(core.cfg.tcp_host.as_str()))
                .and_then(|p| p.strip_prefix(':'))
                .map(str::to_owned)
            else {
                break;
            };
            let mut done = vec![bound.clone()];
            let mut failed = None;
            for h in &core.other_hosts {
                let also = format!("tcp://{h}:{port}");
                match zmq_io::bind(sock, &also) {
                    Ok(ep) => done.push(ep),
                    Err(err) => {
                        failed = Some((also, err));
                        break;
                    }
                }
            }
            let Some((also, err)) = failed else {
                break;
            };
            if attempt < tries {
                for ep in &done {
                    let _ = sock.unbind(ep);
                }
                continue;
            }
            tracing::warn!(endpoint = %also, %err, "cannot bind the same port on every address of this node: that network will not reach this socket");
        }
        Ok(bound)
    }

    /// The broker this node is attached to, if it is a broker client.
    /// Its client key at brokers.
    pub(crate) fn client_key(&self) -> &str {
        &self.client_key
    }

    pub(crate) fn uplink(&self) -> Option<uplink::Uplink> {
        lock(&self.uplink).clone()
    }

    /// A broker client: the broker in use now (its listen endpoint).
    pub(crate) fn broker_in_use(&self) -> Option<String> {
        lock(&self.uplink).as_ref().map(|u| u.broker.clone())
    }

    /// A broker client: the locator's brokers.
    pub(crate) fn brokers(&self) -> Vec<uplink::BrokerAt> {
        self.brokers.clone()
    }

    /// Notes a broker client's service, to move it with the node.
    pub(crate) fn watch_service_move(&self, m: Weak<serve_link::ServeMove>) {
        let mut v = lock(&self.service_moves);
        v.retain(|w| w.strong_count() > 0);
        v.push(m);
    }

    /// A broker client moves to the broker `to` (its last one failed):
    /// its data sockets and services connect there instead. The
    /// liveliness socket is the node thread's to move. The broker before.
    pub(crate) fn move_uplink(&self, to: uplink::Uplink) -> Option<uplink::Uplink> {
        // The data sockets as the uplink changes: one made meanwhile
        // (`data_socket` holds the list while it places one) is either in
        // the list, placed at the old broker, or placed at the new one and
        // not moved again (a second connect of an XPUB to the same
        // endpoint would send it every sample twice).
        let (old, data) = {
            let sockets = lock(&self.sockets);
            let old = lock(&self.uplink).replace(to.clone());
            (old, sockets.data.clone())
        };
        if let Some(g) = &self.security {
            broker_keys(g, &to);
        }
        for d in data {
            let plane = match d.reliability {
                Reliability::BestEffort => uplink::Plane::BestEffort,
                Reliability::Reliable => uplink::Plane::Reliable,
            };
            let id = self.core.id.to_hex();
            *lock(&d.moving) = Some(data::SocketMove {
                from: old.as_ref().map(|o| o.endpoints(plane, &id).0.to_owned()),
                to: to.endpoints(plane, &id).0.to_owned(),
            });
            // Made here, or by a reliable put that holds the socket while
            // it waits for room (`data::SocketMove`): never waited for.
            loop {
                let held = match d.sock.try_lock() {
                    Ok(g) => Some(g),
                    Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                    Err(std::sync::TryLockError::WouldBlock) => None,
                };
                if let Some(g) = held {
                    let moved = lock(&d.moving).take();
                    if let Some(m) = moved {
                        m.apply(self, &g.sock);
                    }
                    break;
                }
                if lock(&d.moving).is_none() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        for m in lock(&self.service_moves).iter().filter_map(Weak::upgrade) {
            m.move_to(to.hello.services_in.clone(), to.curve.clone());
        }
        old
    }

    /// The endpoint a broker client's socket of `plane` is announced at
    /// now (the current broker's), if it is one.
    pub(crate) fn announced_at(&self, plane: uplink::Plane) -> Option<String> {
        let up = lock(&self.uplink);
        up.as_ref()
            .map(|u| u.endpoints(plane, &self.core.id.to_hex()).1)
    }

    /// Places a data or liveliness socket: binds it at `endpoint`, or, for
    /// a broker client, connects it to the broker's socket of `plane`.
    /// The endpoint to announce.
    pub(crate) fn place(
        &self,
        sock: &zmq::Socket,
        endpoint: &str,
        plane: uplink::Plane,
    ) -> Result<String, OpenError> {
        let Some(up) = self.uplink() else {
            return self.bind(sock, endpoint);
        };
        let (to, announced) = up.endpoints(plane, &self.core.id.to_hex());
        self.secure_client(sock, to)
            .map_err(|source| OpenError::Socket {
                action: "secure",
                endpoint: to.to_owned(),
                source,
            })?;
        sock.connect(to)
            .map_err(|source: zmq::Error| OpenError::Socket {
                action: "connect",
                endpoint: to.to_owned(),
                source: source.transport(),
            })?;
        Ok(announced)
    }

    /// The endpoint to bind for a new socket of role `role` (`c`, `be`, `r`,
    /// `hb`, `sN`), unless the configuration fixes it.
    pub(crate) fn endpoint_for(&self, role: &str, fixed: Option<&String>) -> String {
        if let Some(e) = fixed {
            return e.clone();
        }
        let id = self.core.id.to_hex();
        let cfg = &self.core.cfg;
        match cfg.transport {
            // An IPv6 address goes in brackets.
            Transport::Tcp if cfg.tcp_host.contains(':') => format!("tcp://[{}]:*", cfg.tcp_host),
            Transport::Tcp => format!("tcp://{}:*", cfg.tcp_host),
            Transport::Ipc => {
                let dir = cfg.runtime_root().join(&self.core.domain);
                format!("ipc://{}/{}-{role}.sock", dir.display(), &id[..12])
            }
            Transport::Inproc => format!("inproc://milonga-{id}-{role}"),
        }
    }

    /// The data socket serving a publication of `key` with
    /// `reliability`, created on first use; whether it was (the
    /// announcement then names it). Without access control, one per
    /// reliability. With it, keys share a socket only if the same
    /// `subscribe` rules cover them, so that the socket's handshake, which
    /// admits only keys allowed to subscribe to everything it carries,
    /// decides `subscribe` per key (docs/security.md).
    pub(crate) fn data_socket(
        &self,
        reliability: Reliability,
        key: &str,
    ) -> Result<(Arc<DataSocket>, bool), OpenError> {
        let mut s = lock(&self.sockets);
        let acl = self.security.as_ref().filter(|g| g.has_acl());
        let fits = |d: &&Arc<DataSocket>| {
            d.reliability == reliability && acl.is_none_or(|g| g.fits_data_socket(d.number, key))
        };
        if let Some(d) = s.data.iter().find(fits) {
            if let Some(g) = acl {
                g.note_data_key(d.number, key);
            }
            return Ok((d.clone(), false));
        }
        let number = u32::try_from(s.data.len()).unwrap_or(u32::MAX);
        let first = !s.data.iter().any(|d| d.reliability == reliability);
        // Noted before the socket can admit anyone.
        if let Some(g) = acl {
            g.note_data_key(number, key);
        }
        let (d, monitor) = match DataSocket::open(self, reliability, number, first) {
            Ok(opened) => opened,
            Err(e) => {
                if let Some(g) = acl {
                    g.forget_data_socket(number);
                }
                return Err(e);
            }
        };
        let d = Arc::new(d);
        s.data.push(d.clone());
        s.new.data.push(monitor);
        drop(s);
        // From now on the node thread reads this socket every turn.
        self.wake();
        Ok((d, true))
    }

    /// The data sockets.
    pub(crate) fn data_sockets(&self) -> Vec<Arc<DataSocket>> {
        lock(&self.sockets).data.clone()
    }

    /// Where the node's first data socket of each reliability is bound
    /// (best effort, reliable): the ones its announcement names; the
    /// others are named by the publications they serve.
    pub(crate) fn data_endpoints(&self) -> [Option<String>; 2] {
        let s = lock(&self.sockets);
        let first = |r: Reliability| {
            let d = s.data.iter().find(|d| d.reliability == r && d.first)?;
            // A broker client's: at its current broker.
            let plane = match r {
                Reliability::BestEffort => uplink::Plane::BestEffort,
                Reliability::Reliable => uplink::Plane::Reliable,
            };
            Some(
                self.announced_at(plane)
                    .unwrap_or_else(|| d.endpoint.clone()),
            )
        };
        [first(Reliability::BestEffort), first(Reliability::Reliable)]
    }

    /// Hands the node thread the monitor of a subscription's socket: it
    /// tells `watcher` of the connections that close.
    pub(crate) fn watch_subscription(
        &self,
        watcher: Weak<dyn sub_link::ConnectionWatcher>,
        monitor: sub_link::Monitor,
    ) {
        lock(&self.sockets).new.subs.push((watcher, monitor));
        // The node thread may be asleep until its next timer; it must
        // watch the new monitor now.
        self.wake();
    }

    /// Hands the node thread the monitor of a service's socket, counted
    /// while `service` lives.
    pub(crate) fn watch_service(
        &self,
        service: Weak<dyn std::any::Any + Send + Sync>,
        monitor: serve_link::ServeMonitor,
    ) {
        lock(&self.sockets).new.services.push((service, monitor));
        self.wake();
    }

    /// Gives a reliable batch still waiting up to `close_linger_ms` to
    /// leave, and the subscribers sent a shared-memory reference as long
    /// to open the segment (docs/shared-memory.md): it is removed when the
    /// socket closes, and a subscriber opens it by name when the reference
    /// arrives (the node is closing).
    pub(crate) fn flush_at_close(&self) {
        let linger = self.core.cfg.close_linger_ms;
        let sockets = self.data_sockets();
        for d in &sockets {
            if d.reliability == Reliability::Reliable {
                lock(&d.sock).flush_at_close(linger, &self.core.counters);
            }
        }
        // A negative linger (no limit for queued samples) waits at most 10 s here.
        let wait = u64::try_from(linger).unwrap_or(10_000);
        let end = std::time::Instant::now() + std::time::Duration::from_millis(wait);
        for d in &sockets {
            while lock(&d.sock).shared_memory_awaited() && std::time::Instant::now() < end {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
}
