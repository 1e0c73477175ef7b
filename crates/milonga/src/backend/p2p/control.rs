//! The node thread: discovery sources, the control socket, heartbeats,
//! socket monitors, waiting batches.
//!
//! It never waits on user code: it touches a data socket or a subscription
//! only when their lock is free (`try_lock`), and otherwise leaves a note
//! that the user's thread applies. It reaches the node above it only
//! through [`Host`].

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use milonga_wire::NodeId;
use serde::{Deserialize, Serialize};

use crate::backend::p2p::registry::RegistrySource;
use crate::backend::p2p::scout_peers::ScoutPeers;
use crate::backend::p2p::static_peers::StaticPeers;
use crate::backend::p2p::sub_link::{ConnectionWatcher, Monitor};
use crate::backend::p2p::uplink::BrokerSource;
use crate::backend::p2p::zmq_io::AUTH_FAILED;
use crate::backend::p2p::{curve, zmq_io, P2p, WakeRx};
use crate::discovery::etcd::EtcdSource;
use crate::discovery::local::LocalSource;
use crate::discovery::{ip_of, tcp_host_port, Announcement, Source};
use crate::model::error::IntoTransport;
use crate::model::error::OpenError;
use crate::model::node::NodeCore;
use crate::model::qos::Reliability;
use crate::util::stats::{self, NodeStats};
use crate::util::{lock, try_lock};

/// What the node thread needs of the node it runs for (the session).
pub(crate) trait Host: Send + Sync + 'static {
    /// The node's peer-to-peer resources.
    fn p2p(&self) -> &P2p;
    /// The node's current announcement.
    fn announcement(&self) -> Announcement;
    /// Publishes the node's announcement (always, or only if something
    /// changed since the last: `only_if_changed`).
    fn reannounce(&self, only_if_changed: bool);
    /// The peers the discovery sources see now (this node aside): the node
    /// adds itself and reconnects its subscriptions if they changed.
    fn set_peers(&self, peers: BTreeMap<String, Announcement>);
    /// The last sequence number of each key this node published, for its
    /// goodbye.
    fn last_seqs(&self) -> Vec<(String, u64)>;
    /// A number that changes whenever the announcement may have (for
    /// scouting's hellos).
    fn announcement_version(&self) -> u64;
    /// The node (`node`, when known) at control endpoint `endpoint` refused
    /// this node's key (ZAP `status`) before its announcement was known:
    /// every subscription is told.
    fn peer_refused(&self, endpoint: &str, node: Option<NodeId>, status: u32);
    /// A broker client moved from broker `from` to `to`: re-announce at
    /// the new one, and tell the subscriptions.
    fn broker_changed(&self, from: &str, to: &str);
    /// What a broker client tells its broker of itself (JSON, a
    /// `ClientReport`): its subscriptions and counters.
    fn broker_report(&self) -> Vec<u8>;
}

/// First frame of every control request and reply.
pub const CONTROL_MAGIC: &[u8] = milonga_wire::control::MAGIC;
/// The request "who are you, and how are you doing".
pub const CONTROL_INFO: &[u8] = milonga_wire::control::INFO;

/// What a node answers to `info` and `gossip`: its announcement, counters,
/// and the nodes it knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The node's announcement.
    pub announcement: Announcement,
    /// The node's counters (absent from a reply: all 0; docs/protocol.md
    /// §9.1).
    #[serde(default)]
    pub stats: NodeStats,
    /// The `tcp://` control endpoints at which it checked other nodes of
    /// its domain (at most 1,024; loopback ones only to an asker on
    /// loopback), in a reply to a `gossip` request of its domain only.
    /// Absent from the JSON when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<String>,
}

/// Most control endpoints a reply lists.
pub const MAX_TOLD: usize = 1024;

/// How long a publisher endpoint refuses connections before it is said
/// unreachable (if discovery still shows it): a publisher that closed is
/// forgotten by discovery within this.
const RETRY_SAID_AFTER: Duration = Duration::from_secs(1);
/// Most endpoints waiting for `RETRY_SAID_AFTER` at once.
const MAX_RETRIED: usize = 1024;
/// Longest wait between two reconnections (`reconnect_ivl_max`, zmq_io).
const RECONNECT_IVL_MAX: Duration = Duration::from_secs(2);

/// The refusals of one endpoint: libzmq reports one at every
/// disconnection (a reconnection is planned at once) and one each time a
/// reconnection fails, `reconnect_ivl` (100 ms) apart.
#[derive(Debug, Clone, Copy)]
struct Refusals {
    first: Instant,
    latest: Instant,
}

/// What to make of an endpoint's refusals now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Not for long enough yet.
    Waiting,
    /// Refused for [`RETRY_SAID_AFTER`]: say it, if discovery shows it.
    Still,
    /// No refusal for longer than one reconnection can take: it connected
    /// again (or was let go).
    Over,
}

impl Refusals {
    /// `connect_timeout`: how long one connection attempt may take
    /// (`handshake_timeout_ms`); refusals come at most that plus
    /// [`RECONNECT_IVL_MAX`] apart.
    fn verdict(&self, now: Instant, connect_timeout: Duration) -> Refused {
        let over_after = connect_timeout + RECONNECT_IVL_MAX + Duration::from_secs(1);
        if self.latest - self.first >= RETRY_SAID_AFTER {
            Refused::Still
        } else if now - self.latest >= over_after {
            Refused::Over
        } else {
            Refused::Waiting
        }
    }
}

pub(crate) const HANDSHAKE_FAILED: i32 = (zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) as i32;
pub(crate) const ACCEPT_FAILED: i32 = zmq_sys::ZMQ_EVENT_ACCEPT_FAILED as i32;
const DISCONNECTED: i32 = zmq_sys::ZMQ_EVENT_DISCONNECTED as i32;
const CONNECT_RETRIED: i32 = zmq_sys::ZMQ_EVENT_CONNECT_RETRIED as i32;

/// A socket monitor reporting failed handshakes (a peer that does not speak
/// ZMTP, or speaks it wrongly, or not within `handshake_timeout_ms`),
/// failed accepts (file descriptors exhausted) and closed peer connections
/// (libzmq closes one that sends a message over the socket's size limit,
/// with no event of its own) on `sock`.
pub(crate) fn monitor(p2p: &P2p, sock: &zmq::Socket, what: &str) -> Result<zmq::Socket, OpenError> {
    let ep = format!("inproc://milonga-mon-{}-{what}", p2p.core().id);
    let err = |source: zmq::Error| OpenError::Socket {
        action: "monitor",
        endpoint: ep.clone(),
        source: source.transport(),
    };
    sock.monitor(&ep, HANDSHAKE_FAILED | ACCEPT_FAILED | DISCONNECTED)
        .map_err(err)?;
    let pair = p2p.ctx().socket(zmq::PAIR)?;
    pair.set_linger(0).map_err(err)?;
    zmq_io::unbounded_monitor_queue(&pair).map_err(err)?;
    pair.connect(&ep).map_err(err)?;
    Ok(pair)
}

/// The node's liveliness socket: an XPUB on which the node thread sends a
/// heartbeat every `heartbeat_interval_ms`, and at once to each new
/// subscriber (it is verbose, so every subscription shows).
fn liveliness_socket(p2p: &P2p) -> Result<zmq::Socket, OpenError> {
    let cfg = &p2p.core().cfg;
    let mut sock = p2p.ctx().socket(zmq::XPUB)?;
    let err = |source: zmq::Error| OpenError::Socket {
        action: "configure",
        endpoint: "liveliness".into(),
        source: source.transport(),
    };
    zmq_io::apply_common(&sock, cfg).map_err(err)?;
    // Its own heartbeats are the lease: no ZMTP heartbeats besides.
    zmq_io::apply_leased(&mut sock, cfg).map_err(err)?;
    // Not the data high-water mark: with a small one, the heartbeats that
    // wait for a subscriber that is not reading would crowd out the
    // goodbye, and with it the report of its trailing losses.
    sock.set_sndhwm(LIVELINESS_HWM).map_err(err)?;
    // Subscriptions, and the history queries and filter declarations a
    // subscription sends to all its connections (ignored here).
    sock.set_maxmsgsize(crate::engine::history::MAX_QUERY_BYTES as i64)
        .map_err(err)?;
    sock.set_xpub_verbose(true).map_err(err)?;
    // The last heartbeat (leaving) gets a moment to go out on close: up to
    // 200 ms, the whole 200 when `close_linger_ms` is negative ("as long as
    // it takes"; clamping that to 0 would drop the goodbye).
    let linger = if cfg.close_linger_ms < 0 {
        200
    } else {
        cfg.close_linger_ms.min(200)
    };
    sock.set_linger(linger).map_err(err)?;
    p2p.secure_server(&mut sock)?;
    Ok(sock)
}

/// Heartbeats queued per subscriber of the liveliness socket (about 60
/// bytes each): a subscriber that reads nothing for this many heartbeat
/// intervals may miss the goodbye (docs/guarantees.md).
const LIVELINESS_HWM: i32 = 1000;

/// How long this process keeps a segment of another mapped when no
/// sample of it is held and none came (docs/shared-memory.md).
const SHM_MAPPING_IDLE: Duration = Duration::from_secs(5);

/// Most keys whose last sequence number a goodbye carries.
pub(crate) const MAX_GOODBYE_KEYS: usize = 8192;

/// A heartbeat frame: kind 3 under `@hb`, body `{"leaving": bool}`; a
/// goodbye (`leaving`) adds `"last": {key: last sequence number}` for the
/// node's keys (at most [`MAX_GOODBYE_KEYS`]), so that subscribers know
/// at once what they have not received.
pub(crate) fn heartbeat_frame(
    node: &NodeCore,
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
        domain_tag: node.domain_tag,
        schema_id: 0,
        node_id: node.id,
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

/// A service's socket monitor: the node thread reads it while the service
/// lives (`Weak`); the service holds the reader too, and lets it go only
/// after it has stopped its socket's monitor (libzmq blocks on a monitor
/// event nobody can take).
pub(crate) type SvcMonitor = (
    Weak<dyn std::any::Any + Send + Sync>,
    crate::backend::p2p::serve_link::ServeMonitor,
);

/// Monitors created since the node thread last looked.
#[derive(Default)]
pub(crate) struct NewMonitors {
    /// Of data sockets (their events counted).
    pub(crate) data: Vec<NodeMonitor>,
    /// Of subscriptions (their closed connections told to them).
    pub(crate) subs: Vec<(Weak<dyn ConnectionWatcher>, Monitor)>,
    /// Of services (their events counted while the service lives).
    pub(crate) services: Vec<SvcMonitor>,
}

impl NewMonitors {
    fn is_empty(&self) -> bool {
        self.data.is_empty() && self.subs.is_empty() && self.services.is_empty()
    }
}

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
pub(crate) fn bind_node(p2p: &P2p) -> Result<NodeSockets, OpenError> {
    let cfg = &p2p.core().cfg;
    let mut router = p2p.ctx().socket(zmq::ROUTER)?;
    let ep = p2p.endpoint_for("c", cfg.control_endpoint.as_ref());
    zmq_io::apply_common(&router, cfg)
        .and_then(|_| router.set_maxmsgsize(65_536))
        // A connection that asks and never reads holds at most 16
        // answers (each up to tens of KiB, with its peers); the rest fail
        // at once, counted, rather than being dropped unseen.
        .and_then(|_| router.set_sndhwm(16))
        .and_then(|_| router.set_router_mandatory(true))
        .map_err(|source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: ep.clone(),
            source: source.transport(),
        })?;
    p2p.secure_server(&mut router)?;
    let control_endpoint = p2p.bind(&router, &ep)?;
    let live = liveliness_socket(p2p)?;
    let ep = p2p.endpoint_for("hb", None);
    let liveliness_endpoint =
        p2p.place(&live, &ep, crate::backend::p2p::uplink::Plane::Liveliness)?;
    Ok(NodeSockets {
        router,
        live,
        control_endpoint,
        liveliness_endpoint,
    })
}

/// Starts the node thread with the node's sockets and its local discovery
/// source, if any (static peers come from the configuration). It finds the
/// peers that exist now and announces the node before it returns, so that
/// a subscription declared right after `open` connects to them before it
/// returns.
pub(crate) fn start<H: Host>(
    host: &Arc<H>,
    socks: NodeSockets,
    wake: WakeRx,
    local: Option<LocalSource>,
) -> Result<JoinHandle<()>, OpenError> {
    let p2p = host.p2p();
    let NodeSockets {
        router,
        live,
        control_endpoint,
        ..
    } = socks;
    let statics = StaticPeers::new(p2p.core.clone(), &control_endpoint, p2p.guard());
    let scout = if let Some(iface) = scouts(p2p.core()) {
        match ScoutPeers::open(p2p.core.clone(), iface, control_endpoint, p2p.guard()) {
            Ok(s) => Some(s),
            // A group that is not one: the configuration is wrong.
            Err(e) if matches!(&e, OpenError::Config { key, .. } if key.starts_with("scout_group")) => {
                return Err(e)
            }
            // Scouting is on by default: a host where it cannot run (the
            // port taken without sharing, no multicast route) still runs
            // the node, with the other sources.
            Err(e) => {
                tracing::warn!(err = %e, "cannot scout; going on without it (static peers and local discovery still work)");
                None
            }
        }
    } else {
        None
    };
    let broker = match p2p.uplink() {
        Some(up) => {
            let mut b = BrokerSource::new(
                p2p.core.clone(),
                up,
                p2p.brokers(),
                p2p.client_key().to_owned(),
            )?;
            let wait = Duration::from_millis(p2p.core().cfg.handshake_timeout_ms.max(1) as u64);
            b.first_view(
                host.announcement_version(),
                host.announcement().to_json(),
                wait,
            );
            Some(b)
        }
        None => None,
    };
    let registry = if p2p.core().cfg.registry.is_empty() {
        None
    } else if p2p.uplink().is_some() {
        tracing::warn!("registry is ignored by a broker's client: the broker is its discovery");
        None
    } else {
        let mut r = RegistrySource::new(p2p.core.clone(), p2p.guard().as_deref())?;
        let wait = Duration::from_millis(p2p.core().cfg.handshake_timeout_ms.max(1) as u64);
        r.first_view(
            host.announcement_version(),
            host.announcement().to_json(),
            wait,
        );
        Some(r)
    };
    if p2p.core().cfg.discovery == "etcd" && p2p.core().cfg.etcd_endpoints.is_empty() {
        return Err(OpenError::Config {
            key: "etcd_endpoints".into(),
            why: "discovery = etcd needs etcd's client URLs (http://HOST:2379)".into(),
        });
    }
    let etcd = (p2p.core().cfg.discovery == "etcd").then(|| {
        let weak = Arc::downgrade(host);
        let wake = Box::new(move || {
            if let Some(h) = weak.upgrade() {
                h.p2p().wake();
            }
        });
        let mut e = EtcdSource::new(p2p.core.clone(), wake);
        let wait = Duration::from_millis(p2p.core().cfg.handshake_timeout_ms.max(1) as u64);
        e.first_view(
            host.announcement_version(),
            host.announcement().to_json(),
            wait,
        );
        e
    });
    let monitor = self::monitor(p2p, &router, "control")?;
    let live_monitor = self::monitor(p2p, &live, "liveliness")?;
    let watch_fd = local.as_ref().and_then(LocalSource::watch_fd);
    let mut ctl = Control {
        host: host.clone(),
        router,
        monitors: vec![("control", monitor), ("liveliness", live_monitor)],
        sub_monitors: Vec::new(),
        svc_monitors: Vec::new(),
        wake: wake.0,
        live,
        heartbeat_seq: 0,
        next_heartbeat: Instant::now(),
        statics,
        local,
        scout,
        broker,
        registry,
        etcd,
        watch_fd,
        flooded: false,
        known: Vec::new(),
        retried: std::collections::HashMap::new(),
        unreachable_said: 0,
    };
    ctl.discover(Instant::now(), true);
    host.reannounce(false);
    let name = format!("milonga-node {}", p2p.core().domain);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || ctl.run())
        .map_err(OpenError::Thread)
}

/// The address the node scouts from, if it scouts: `scouting` is on (the
/// default) and `tcp_host` is an address other hosts can reach. A node
/// bound to loopback (the default) has nothing to find other hosts for
/// and is found by none, so it does not scout, and says so only at debug
/// level; one bound to a wildcard, a name or an IPv6 link-local address
/// cannot announce where it is reached, and says so once at info level
/// (docs/discovery.md).
fn scouts(core: &NodeCore) -> Option<std::net::IpAddr> {
    let cfg = &core.cfg;
    if !cfg.scouting {
        return None;
    }
    match cfg.tcp_host.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_loopback() => {
            tracing::debug!(tcp_host = %cfg.tcp_host, "not scouting: bound to loopback (set tcp_host = auto to find and be found by other hosts)");
            None
        }
        Ok(std::net::IpAddr::V6(v6)) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            tracing::info!(tcp_host = %cfg.tcp_host, "not scouting: an IPv6 link-local address needs a scope that no endpoint carries (give a global or unique-local address)");
            None
        }
        Ok(ip) if !ip.is_unspecified() => Some(ip),
        _ => {
            tracing::info!(tcp_host = %cfg.tcp_host, "not scouting: tcp_host is not one address of this host (a wildcard or a name cannot be announced; set an address, or auto)");
            None
        }
    }
}

/// Which of the node thread's sockets a poll found readable.
struct Ready {
    router: bool,
    live: bool,
    /// A socket monitor (data sockets, subscriptions, services).
    monitors: bool,
}

/// The node thread's state.
struct Control<H: Host> {
    host: Arc<H>,
    router: zmq::Socket,
    monitors: Vec<NodeMonitor>,
    /// Subscriptions' socket monitors (closed connections).
    sub_monitors: Vec<(Weak<dyn ConnectionWatcher>, Monitor)>,
    /// Services' socket monitors (bad handshakes, failed accepts).
    svc_monitors: Vec<SvcMonitor>,
    /// Woken by user threads (a batch started waiting).
    wake: zmq::Socket,
    /// Heartbeats go out here.
    live: zmq::Socket,
    heartbeat_seq: u64,
    next_heartbeat: Instant,
    /// Discovery sources: static peers, the local directory, scouting.
    statics: StaticPeers,
    local: Option<LocalSource>,
    scout: Option<ScoutPeers>,
    /// A broker client's discovery: the broker's view.
    broker: Option<BrokerSource>,
    /// Registry mode: the registries' views.
    registry: Option<RegistrySource>,
    /// `discovery = etcd`: etcd's view.
    etcd: Option<EtcdSource>,
    /// The local directory's inotify descriptor, if any.
    watch_fd: Option<std::os::fd::RawFd>,
    /// The last drain of the data sockets left messages to read.
    flooded: bool,
    /// The `tcp://` control endpoints of the peers, told in replies.
    known: Vec<String>,
    /// Publisher endpoints a subscription could not connect to (libzmq
    /// retries them), and when: said unreachable only if they keep
    /// refusing for [`RETRY_SAID_AFTER`] and a peer discovery shows has
    /// them (a publisher that just closed is not unreachable).
    retried: std::collections::HashMap<String, Refusals>,
    /// How many times an endpoint was said unreachable (the log is
    /// rate-limited).
    unreachable_said: u64,
}

impl<H: Host> Control<H> {
    fn p2p(&self) -> &P2p {
        self.host.p2p()
    }

    fn run(mut self) {
        let interval = self.p2p().core().cfg.discovery_interval();
        // Shared-memory segments of processes that ended are removed by
        // whichever node on the host sweeps first (docs/shared-memory.md).
        let sweeps = self.p2p().core().cfg.shared_memory;
        let mut next_sweep = Instant::now();
        while !self.p2p().core().is_closed() {
            // A waiting batch is retried every millisecond: it exists only
            // while a subscriber is full, and must leave as soon as it can.
            let batching = self.p2p().batch_pending();
            // Only sockets the poll found readable are read: each read of
            // an empty socket is a system call, and this runs every turn.
            let ready = self.wait(if self.flooded {
                Duration::ZERO
            } else if batching {
                Duration::from_millis(1)
            } else if self.watch_fd.is_some() && !self.p2p().has_data_sockets() {
                // Nothing here needs a turn every `interval`: discovery
                // changes and socket events wake the poll; only timers
                // remain (liveness checks, heartbeats, static queries).
                self.until_next_timer()
            } else {
                interval
            });
            if self.p2p().batch_pending() {
                self.flush_batches();
            }
            if ready.router {
                self.serve_control();
            }
            self.read_monitors(ready.monitors);
            self.say_unreachable();
            self.discover(Instant::now(), false);
            self.flooded = self.drain_data_sockets();
            self.heartbeat(ready.live);
            self.host.reannounce(true);
            if sweeps && Instant::now() >= next_sweep {
                crate::backend::p2p::shm::sweep(SHM_MAPPING_IDLE);
                next_sweep = Instant::now() + Duration::from_secs(1);
            }
        }
        // Tell subscribers this node is leaving, so that they report it
        // `closed` rather than wait for the connection or the lease. The
        // subscriptions that arrived since the last turn are read first:
        // the socket sends only to subscribers it knows of.
        while self.live.recv_msg(zmq::DONTWAIT).is_ok() {}
        self.send_heartbeat(true);
        if let Some(s) = &self.scout {
            s.leave();
        }
        if let Some(b) = &self.broker {
            b.leave();
        }
        if let Some(r) = &self.registry {
            r.leave();
        }
        if let Some(e) = &self.etcd {
            e.leave();
        }
        self.stop_monitors();
    }

    /// How long until the next timed duty: a discovery source's, a
    /// heartbeat.
    fn until_next_timer(&self) -> Duration {
        let now = Instant::now();
        let mut next = self.next_heartbeat.min(now + Duration::from_millis(250));
        for due in self
            .sources()
            .into_iter()
            .flatten()
            .filter_map(Source::next_due)
        {
            next = next.min(due);
        }
        next.saturating_duration_since(now)
            .max(Duration::from_millis(1))
    }

    /// The discovery sources this node has, in the order their views are
    /// merged (a later source's entry of a node replaces an earlier one's).
    fn sources(&self) -> [Option<&dyn Source>; 6] {
        [
            self.scout.as_ref().map(|s| s as &dyn Source),
            self.local.as_ref().map(|s| s as &dyn Source),
            self.registry.as_ref().map(|s| s as &dyn Source),
            self.etcd.as_ref().map(|s| s as &dyn Source),
            Some(&self.statics as &dyn Source),
            self.broker.as_ref().map(|s| s as &dyn Source),
        ]
    }

    /// Gives every discovery source its turn and, if one changed (or
    /// `force`), hands the merged peers to the node.
    fn discover(&mut self, now: Instant, force: bool) {
        let mut changed = self.statics.turn(now);
        for (endpoint, status) in self.statics.take_refusals() {
            self.host.peer_refused(&endpoint, None, status);
        }
        if let Some(g) = self.host.p2p().security() {
            // Keys added or removed: the peers to connect to may change.
            changed |= g.refresh();
        }
        if let Some(local) = &mut self.local {
            changed |= local.turn(now);
        }
        if let Some(scout) = &mut self.scout {
            let v = self.host.announcement_version();
            if v != scout.version() {
                scout.set_announcement(v, self.host.announcement().to_json());
            }
            changed |= scout.turn(now);
            for (node, endpoint, status) in scout.take_refusals() {
                self.host.peer_refused(&endpoint, Some(node), status);
            }
        }
        if let Some(broker) = &mut self.broker {
            let v = self.host.announcement_version();
            if v != broker.version() {
                broker.set_announcement(v, self.host.announcement().to_json());
            }
            if broker.report_due(now) {
                broker.set_report(self.host.broker_report());
            }
            changed |= broker.turn(now);
            if let Some((from, to)) = broker.take_move() {
                // The node's sockets follow it to the new broker; its
                // subscriptions follow the new view (the nodes there are
                // at the new broker's endpoints).
                let p2p = self.host.p2p();
                let id = p2p.core().id.to_hex();
                let old = p2p.move_uplink(to.clone());
                let live = crate::backend::p2p::uplink::Plane::Liveliness;
                if let Some(old) = old {
                    let _ = self.live.disconnect(old.endpoints(live, &id).0);
                }
                let at = to.endpoints(live, &id).0;
                if let Err(e) = p2p.secure_client(&self.live, at) {
                    tracing::warn!(err = %e, "the liveliness socket cannot connect to the new broker");
                } else if let Err(e) = self.live.connect(at) {
                    tracing::warn!(err = %e, "the liveliness socket cannot connect to the new broker");
                }
                self.host.broker_changed(&from, &to.broker);
                changed = true;
            }
        }
        if let Some(registry) = &mut self.registry {
            let v = self.host.announcement_version();
            if v != registry.version() {
                registry.set_announcement(v, self.host.announcement().to_json());
            }
            changed |= registry.turn(now);
        }
        if let Some(etcd) = &mut self.etcd {
            let v = self.host.announcement_version();
            if v != etcd.version() {
                etcd.set_announcement(v, self.host.announcement().to_json());
            }
            changed |= etcd.turn(now);
        }
        if !changed && !force {
            return;
        }
        // (With security on, claims of another node's id are set aside.)
        let views = self.sources().into_iter().flatten().map(|source| {
            let mut v = Vec::new();
            source.peers_into(&mut v);
            v
        });
        let (mut peers, unattributed) = merge_views(self.host.p2p().security().is_some(), views);
        // Told to gossip askers: endpoints checked, not claimed: where a
        // static peer answered, where a hello came from, and the local
        // nodes (their files are this user's).
        let mut known: Vec<String> = self.statics.answered().map(str::to_owned).collect();
        if let Some(scout) = &self.scout {
            known.extend(scout.heard().map(str::to_owned));
        }
        if let Some(local) = &self.local {
            let mut here = Vec::new();
            local.peers_into(&mut here);
            known.extend(here.into_iter().map(|a| a.control));
        }
        let own = self.statics.own_control();
        known.retain(|ep| ep != own && endpoint_ip(ep).is_some_and(|ip| !ip.is_unspecified()));
        known.sort_unstable();
        known.dedup();
        let excluded = match self.host.p2p().security() {
            Some(g) => {
                let mut excluded = g.admit_peers(&mut peers);
                for (a, why) in unattributed {
                    g.note_unattributed(&a, &why);
                    excluded.push((a, why));
                }
                // Told with their keys (`KEY@tcp://…`): only those known
                // and trusted.
                known = known
                    .into_iter()
                    .filter_map(|ep| g.key_for(&ep).map(|k| format!("{}@{ep}", k.to_z85())))
                    .collect();
                excluded
            }
            None => {
                let mut excluded = Vec::new();
                peers.retain(|_, a| {
                    if a.key.is_none() {
                        return true;
                    }
                    limited!(warn, node = %a.name, "not connecting to a peer: its security is on and this node's is off (docs/security.md)");
                    excluded.push((a.clone(), "its security is on and this node's is off".to_owned()));
                    false
                });
                excluded
            }
        };
        known.truncate(MAX_TOLD);
        self.known = known;
        self.host.p2p().set_excluded(excluded);
        self.host.set_peers(peers);
    }

    /// Stops the monitors this thread reads before their readers go (see
    /// [`zmq_io::stop_monitor`]). A subscription that outlives the node
    /// gets its monitor's reader back, to drop after its own socket.
    fn stop_monitors(&mut self) {
        zmq_io::stop_monitor(&mut self.router);
        zmq_io::stop_monitor(&mut self.live);
        // The mailbox first: a data socket created meanwhile has its
        // monitor there, and its reader must outlive the stop below (it
        // goes with `self`). Services keep their own readers.
        let new = self.p2p().take_new_monitors();
        self.monitors.extend(new.data);
        self.sub_monitors.extend(new.subs);
        for d in self.p2p().data_sockets() {
            zmq_io::stop_monitor(&mut lock(&d.sock).sock);
        }
        for (sub, m) in self.sub_monitors.drain(..) {
            if let Some(sub) = sub.upgrade() {
                sub.monitor_back(m);
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
                    zmq_io::note_freed(msg.len());
                }
            }
        }
        if joined || Instant::now() >= self.next_heartbeat {
            self.send_heartbeat(false);
            zmq_io::trim_if_due();
        }
    }

    fn send_heartbeat(&mut self, leaving: bool) {
        self.heartbeat_seq += 1;
        let last = if leaving {
            let mut last = self.host.last_seqs();
            last.retain(|(_, s)| *s > 0);
            last.truncate(MAX_GOODBYE_KEYS);
            last
        } else {
            Vec::new()
        };
        let core = self.host.p2p().core();
        let frame = heartbeat_frame(core, self.heartbeat_seq, leaving, last);
        let every = Duration::from_millis(core.cfg.heartbeat_interval_ms.max(1) as u64);
        // Never waits: a subscriber whose queue is full of heartbeats is
        // not reading them anyway.
        let _ = self.live.send(frame, zmq::DONTWAIT);
        self.next_heartbeat = Instant::now() + every;
    }

    /// Sleeps until a control request, a monitor event, a static reply or
    /// a change of the local directory arrives, or `interval` passes.
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
            self.sub_monitors
                .iter()
                .map(|(_, m)| m.0.as_poll_item(zmq::POLLIN)),
        );
        // Held through the poll; nobody else locks them but a service
        // going away, which only drops its handle.
        let svc: Vec<_> = self.svc_monitors.iter().map(|(_, m)| lock(m)).collect();
        items.extend(svc.iter().map(|m| m.as_poll_item(zmq::POLLIN)));
        let monitors = items.len() - 3;
        // Static replies and directory changes: their sources read them in
        // their turn.
        let statics = items.len();
        items.extend(self.statics.poll_items());
        let scouting = items.len();
        if let Some(s) = &self.scout {
            items.push(zmq::PollItem::from_fd(s.fd(), zmq::POLLIN));
            items.extend(s.poll_items());
        }
        let scouted = items.len();
        if let Some(r) = &self.registry {
            items.extend(r.poll_items());
        }
        let registered = items.len();
        if let Some(fd) = self.watch_fd {
            items.push(zmq::PollItem::from_fd(fd, zmq::POLLIN));
        }
        let _ = zmq::poll(&mut items, interval.as_millis() as i64);
        let readable: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        drop(items);
        drop(svc);
        if readable[1] {
            while self.wake.recv_msg(zmq::DONTWAIT).is_ok() {}
        }
        if readable[statics..statics + self.statics.sockets()]
            .iter()
            .any(|r| *r)
        {
            self.statics.mark_readable();
        }
        if readable[scouted..registered].iter().any(|r| *r) {
            if let Some(r) = &mut self.registry {
                r.mark_readable();
            }
        }
        if readable[scouting..scouted].iter().any(|r| *r) {
            if let Some(s) = &mut self.scout {
                s.mark_readable();
            }
        }
        Ready {
            router: readable[0],
            live: readable[2],
            monitors: readable[3..3 + monitors].iter().any(|r| *r),
        }
    }

    fn serve_control(&mut self) {
        use milonga_wire::control::Request;
        let core = self.host.p2p().core();
        let c = &core.counters;
        while let Some(Received { frames, from, key }) = recv_request(&self.router) {
            // Frame 0 is the ROUTER's identity of the asker.
            let request = match Request::decode(&frames[1..]) {
                Ok(r) => r,
                Err(err) => {
                    let n = c.control_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 10 || n % 1000 == 0 {
                        tracing::warn!(
                            dropped_so_far = n,
                            frames = frames.len(),
                            %err,
                            "dropped a malformed control request (expected [{}, info] or [{0}, gossip, endpoint, domain])",
                            String::from_utf8_lossy(CONTROL_MAGIC)
                        );
                    }
                    continue;
                }
            };
            // The peers this node knows are told only to a gossip asker
            // of its domain.
            let mut tell = false;
            if let Request::Gossip { control, domain } = request {
                if domain != core.domain {
                    stats::inc(&c.peers_foreign_domain);
                    limited!(info, asker = %control, their = %domain, ours = %core.domain, "a node of another domain asked this one (answered, not learned)");
                } else if let Some(at) = asker_at(&control, from.as_deref()) {
                    if at != control {
                        // Its endpoint is not where it asked from (a node
                        // on several networks names its first address,
                        // or NAT): learned at the address it came from,
                        // never at the one it names.
                        stats::inc(&c.gossip_readdressed);
                        limited!(info, asker = %control, learned_at = %at, "a gossip request named another address than it came from: learned at the one it came from");
                    }
                    // With security on, the asker is learned with the key
                    // its connection was admitted with.
                    let told = match &key {
                        Some(k) => format!("{k}@{at}"),
                        None => at,
                    };
                    self.statics.learn(&told, Instant::now());
                    // A node with gossip off neither learns nor tells.
                    tell = core.cfg.gossip;
                }
            }
            let asker_on_loopback = from
                .as_deref()
                .and_then(ip_of)
                .is_some_and(|ip| ip.is_loopback());
            let peers = if tell {
                self.known
                    .iter()
                    .filter(|ep| {
                        asker_on_loopback
                            || !tcp_host_port(ep).is_some_and(|(h, _)| is_loopback_host(h))
                    })
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            };
            let info = NodeInfo {
                announcement: self.host.announcement(),
                stats: c.snapshot(),
                peers,
            };
            let body = serde_json::to_vec(&info).unwrap_or_default();
            let [magic, info, body] = milonga_wire::control::info_reply(&body);
            let reply: [&[u8]; 4] = [&frames[0], magic, info, body];
            if self.router.send_multipart(reply, zmq::DONTWAIT).is_err() {
                stats::inc(&c.control_replies_dropped);
            }
        }
    }

    /// Says (rate-limited) which publisher endpoints kept refusing
    /// connections for [`RETRY_SAID_AFTER`], among those that discovery
    /// still shows: a publisher that closed is gone from discovery by
    /// then, and its refusals are only counted.
    fn say_unreachable(&mut self) {
        let now = Instant::now();
        let connect_timeout =
            Duration::from_millis(self.host.p2p().core().cfg.handshake_timeout_ms.max(1) as u64);
        if self
            .retried
            .values()
            .all(|r| r.verdict(now, connect_timeout) == Refused::Waiting)
        {
            return;
        }
        let mut peers = Vec::new();
        for source in self.sources().into_iter().flatten() {
            source.peers_into(&mut peers);
        }
        let shown = |ep: &str| {
            peers.iter().any(|a| {
                [&a.data_best_effort, &a.data_reliable, &a.liveliness]
                    .into_iter()
                    .flatten()
                    .any(|e| same_endpoint(e, ep))
                    || a.publications
                        .iter()
                        .filter_map(|p| p.endpoint.as_deref())
                        .any(|e| same_endpoint(e, ep))
            })
        };
        let failed = self
            .host
            .p2p()
            .core()
            .counters
            .connects_failed
            .load(Ordering::Relaxed);
        let said = &mut self.unreachable_said;
        self.retried.retain(|endpoint, r| {
            match r.verdict(now, connect_timeout) {
                Refused::Waiting => return true,
                Refused::Over => return false,
                Refused::Still => {}
            }
            if shown(endpoint) {
                *said += 1;
                if *said <= 10 || *said % 1000 == 0 {
                    tracing::warn!(%endpoint, failed_so_far = failed, "cannot connect to a publisher (no answer within handshake_timeout_ms, refused, or no route): unreachable from here? retrying");
                }
            }
            false
        });
    }

    /// Reads the monitors' events: all of them when `readable` (the poll
    /// saw one), and those of sockets created since the last turn.
    fn read_monitors(&mut self, readable: bool) {
        // Data sockets, subscriptions and services created since the last
        // turn bring their monitors.
        let new = self.host.p2p().take_new_monitors();
        let added = !new.is_empty();
        self.monitors.extend(new.data);
        self.sub_monitors.extend(new.subs);
        self.svc_monitors.extend(new.services);
        if !readable && !added {
            return;
        }
        let counters = self.host.p2p().core().counters.clone();
        let retried = &mut self.retried;
        self.sub_monitors.retain(|(sub, m)| {
            let Some(sub) = sub.upgrade() else {
                return false;
            };
            while let Ok(frames) = m.0.recv_multipart(zmq::DONTWAIT) {
                let endpoint = frames
                    .get(1)
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .unwrap_or_default();
                let (event, status) = zmq_io::monitor_event(&frames);
                if event == AUTH_FAILED {
                    sub.connection_refused(endpoint, status);
                    continue;
                }
                if event == CONNECT_RETRIED {
                    // Not made: a publisher that just closed, or one
                    // discovery shows that this host cannot reach.
                    // Counted now, said later (`say_unreachable`), and
                    // retried by libzmq.
                    counters.connects_failed.fetch_add(1, Ordering::Relaxed);
                    let now = Instant::now();
                    if retried.len() < MAX_RETRIED || retried.contains_key(&endpoint) {
                        retried
                            .entry(endpoint)
                            .and_modify(|r| r.latest = now)
                            .or_insert(Refusals {
                                first: now,
                                latest: now,
                            });
                    }
                    continue;
                }
                sub.connection_closed(endpoint);
            }
            true
        });
        let core = self.host.p2p().core();
        for (what, m) in &self.monitors {
            count_events(core, what, m);
        }
        self.svc_monitors.retain(|(svc, m)| {
            if svc.strong_count() == 0 {
                // The service's own handle keeps the reader until its
                // socket's monitor is stopped.
                return false;
            }
            count_events(core, "service", &lock(m));
            true
        });
    }

    /// Tries to send a reliable publisher's waiting batch, without waiting
    /// for the socket if a user thread holds it (that thread sends it).
    fn flush_batches(&self) {
        let p2p = self.p2p();
        // The flag is taken before the sockets are looked at: a batch a
        // user thread leaves after its socket was looked at sets it again.
        // (Cleared after the look, as it was, that batch's notice could be
        // lost, and the batch waited for its publisher's next put: a
        // reliable sample accepted and never sent.)
        p2p.clear_batch_pending();
        let mut left = false;
        for d in p2p.data_sockets() {
            if d.reliability != Reliability::Reliable {
                continue;
            }
            match try_lock(&d.sock) {
                Some(mut g) => {
                    let _ = g.send_pending(zmq::DONTWAIT, &p2p.core().counters);
                    left |= g.out.pending().is_some();
                }
                None => left = true,
            }
        }
        if left {
            p2p.batch_still_pending();
        }
    }

    /// Reads subscription messages so that they do not pile up in a
    /// publisher socket nobody is putting on.
    /// Whether a socket had more to read than one drain takes (a flood):
    /// the node thread then comes back without sleeping.
    fn drain_data_sockets(&self) -> bool {
        let p2p = self.p2p();
        let mut more = false;
        for d in p2p.data_sockets() {
            if let Some(mut g) = try_lock(&d.sock) {
                more |= g.drain_subscriptions(p2p.core());
            }
        }
        more
    }
}

/// The next request waiting on the control ROUTER, without waiting: its
/// frames, and the address it came from (libzmq's `Peer-Address`, `None`
/// over ipc).
/// A control request: its frames, the address it came from (libzmq's
/// `Peer-Address`) and, with security on, the asker's public key (the
/// `User-Id` the ZAP handler gave its connection, in Z85).
struct Received {
    frames: Vec<Vec<u8>>,
    from: Option<String>,
    key: Option<String>,
}

fn recv_request(router: &zmq::Socket) -> Option<Received> {
    // The identity frame is the ROUTER's own: the peer's properties come
    // with the frames it sent.
    let identity = router.recv_bytes(zmq::DONTWAIT).ok()?;
    let mut r = Received {
        frames: vec![identity],
        from: None,
        key: None,
    };
    while router.get_rcvmore().unwrap_or(false) {
        let Ok(mut m) = router.recv_msg(0) else {
            break;
        };
        if r.frames.len() == 1 {
            r.from = m.gets("Peer-Address").map(str::to_owned);
            r.key = m
                .gets("User-Id")
                .filter(|k| !k.is_empty())
                .map(str::to_owned);
        }
        r.frames.push(m.to_vec());
    }
    Some(r)
}

/// Where to learn a gossip asker that names `control` and asked from
/// `from` (libzmq's `Peer-Address`): the port it names, at the address it
/// came from. `None` without an address (ipc) or a port.
fn asker_at(control: &str, from: Option<&str>) -> Option<String> {
    let ip = ip_of(from?)?;
    let (_, port) = tcp_host_port(control)?;
    port.parse::<u16>().ok()?;
    Some(crate::discovery::scout::endpoint_at(ip, port))
}

/// The IP address of a `tcp://` endpoint (`None` for a name).
fn endpoint_ip(endpoint: &str) -> Option<std::net::IpAddr> {
    ip_of(tcp_host_port(endpoint)?.0)
}

/// Whether two endpoints name the same place: tags (`#node`) aside, and
/// an IPv4-mapped IPv6 address as its IPv4 one (libzmq's events name an
/// IPv4 peer of a socket with IPv6 on so: `tcp://[::ffff:10.0.0.1]:7100`).
fn same_endpoint(a: &str, b: &str) -> bool {
    let (a, b) = (
        crate::backend::p2p::uplink::untagged(a),
        crate::backend::p2p::uplink::untagged(b),
    );
    if a == b {
        return true;
    }
    match (tcp_host_port(a), tcp_host_port(b)) {
        (Some((ha, pa)), Some((hb, pb))) => {
            pa == pb && ip_of(ha).is_some_and(|ip| Some(ip) == ip_of(hb))
        }
        _ => false,
    }
}

fn is_loopback_host(host: &str) -> bool {
    ip_of(host).is_some_and(|ip| ip.is_loopback()) || host == "localhost"
}

/// Counts the events a monitor of one of this node's listening sockets
/// (`what`) reported: failed handshakes, failed accepts, closed peer
/// connections.
fn count_events(node: &NodeCore, what: &str, m: &zmq::Socket) {
    while let Ok(frames) = m.recv_multipart(zmq::DONTWAIT) {
        let endpoint = frames
            .get(1)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .unwrap_or_default();
        let (event, value) = zmq_io::monitor_event(&frames);
        let c = &node.counters;
        if event == DISCONNECTED {
            stats::inc(&c.peer_disconnects);
            continue;
        }
        if event == AUTH_FAILED {
            // A key the trust directory lacks: counted (`auth_refused`)
            // and logged by the ZAP handler.
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
                "dropped a connection whose peer does not speak ZMTP correctly, or not within handshake_timeout_ms (with security on: not CURVE with this node's key)"
            );
        }
    }
}

/// Asks every node of `endpoints` for its [`NodeInfo`] at once, waiting at
/// most `timeout` in all: nodes that do not answer (gone, or a ghost
/// announcement) cost the caller one timeout, not one each.
pub(crate) fn query_many(
    p2p: &P2p,
    endpoints: &[String],
    timeout: Duration,
) -> Vec<Option<NodeInfo>> {
    let mut out: Vec<Option<NodeInfo>> = vec![None; endpoints.len()];
    let socks: Vec<Option<zmq::Socket>> = endpoints
        .iter()
        .map(|ep| {
            let s = p2p.ctx().socket(zmq::DEALER).ok()?;
            s.set_linger(0).ok()?;
            s.set_maxmsgsize(16 << 20).ok()?;
            s.set_ipv6(true).ok()?;
            p2p.secure_client(&s, ep).ok()?;
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
pub(crate) fn query(p2p: &P2p, endpoint: &str, timeout: Duration) -> Option<NodeInfo> {
    let sock = p2p.ctx().socket(zmq::DEALER).ok()?;
    sock.set_linger(0).ok()?;
    sock.set_maxmsgsize(16 << 20).ok()?;
    sock.set_ipv6(true).ok()?;
    p2p.secure_client(&sock, endpoint).ok()?;
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

/// Merges the discovery sources' views (in [`Control::sources`]' order)
/// into the peers by node id: within a source the first entry of a node
/// stands, a later source's replaces an earlier one's. With security on
/// (`secure`), an announcement whose node id its key does not give is set
/// aside (returned with why) before the merge, so that a claim of another
/// node's id cannot displace it; and one that names no key, or a
/// malformed one, is never connected to (`admit_peers` says why) and is
/// merged last, so that such a claim, which anyone who can write to a
/// discovery store can make, cannot hide a node announced with its key.
fn merge_views(
    secure: bool,
    views: impl IntoIterator<Item = Vec<Announcement>>,
) -> (BTreeMap<String, Announcement>, Vec<(Announcement, String)>) {
    let mut peers = BTreeMap::new();
    let mut unattributed = Vec::new();
    let mut keyless = BTreeMap::new();
    for view in views {
        let mut mine = BTreeMap::new();
        for a in view {
            if !secure {
                mine.entry(a.node_id.clone()).or_insert(a);
                continue;
            }
            match curve::attributed(&a) {
                Err(why) => unattributed.push((a, why)),
                Ok(()) if !curve::has_key(&a) => {
                    keyless.entry(a.node_id.clone()).or_insert(a);
                }
                Ok(()) => {
                    mine.entry(a.node_id.clone()).or_insert(a);
                }
            }
        }
        peers.extend(mine);
    }
    for (id, a) in keyless {
        peers.entry(id).or_insert(a);
    }
    (peers, unattributed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_security_a_claim_without_a_key_cannot_hide_a_node_announced_with_its_key() {
        use crate::backend::p2p::curve::Identity;
        let id = Identity::generate("alice").unwrap();
        let salt = [5u8; 16];
        let mut real = crate::engine::routes::test_announcement(1, 1, &[]);
        real.node_id = NodeId::keyed(id.public().as_bytes(), &salt).to_hex();
        real.key = Some(id.public().to_z85());
        real.id_salt = Some(NodeId(salt).to_hex());
        real.control = "tcp://127.0.0.1:1".into();
        // A later source (etcd after the local directory) claims its id
        // with no key, or with a malformed one.
        let mut claim = real.clone();
        claim.control = "tcp://127.0.0.1:2".into();
        claim.key = None;
        let mut bad = claim.clone();
        bad.key = Some("not a key".into());
        for claim in [claim, bad] {
            let views = vec![vec![real.clone()], vec![claim.clone()]];
            let (peers, unattributed) = merge_views(true, views.clone());
            assert_eq!(peers[&real.node_id].control, "tcp://127.0.0.1:1");
            assert!(unattributed.is_empty());
            // Alone, it is still merged (and `admit_peers` says why it is
            // not connected to).
            let (peers, _) = merge_views(true, vec![vec![claim.clone()]]);
            assert_eq!(peers[&real.node_id].control, "tcp://127.0.0.1:2");
            // Security off: a later source replaces an earlier one's.
            let (peers, _) = merge_views(false, views);
            assert_eq!(peers[&real.node_id].control, "tcp://127.0.0.1:2");
        }
        // Another key claiming the id is set aside, with why.
        let mallory = Identity::generate("mallory").unwrap();
        let mut forged = real.clone();
        forged.key = Some(mallory.public().to_z85());
        let (peers, unattributed) = merge_views(true, vec![vec![real.clone()], vec![forged]]);
        assert_eq!(peers[&real.node_id].key, real.key);
        assert!(
            unattributed[0].1.contains("not its own"),
            "{unattributed:?}"
        );
    }

    #[test]
    fn a_gossip_asker_is_learned_at_the_address_it_came_from() {
        assert_eq!(endpoint_ip("tcp://10.0.0.1:7100"), "10.0.0.1".parse().ok());
        assert_eq!(endpoint_ip("tcp://[fd99::1]:7100"), "fd99::1".parse().ok());
        assert_eq!(endpoint_ip("tcp://host.example:7100"), None);
        assert_eq!(endpoint_ip("ipc:///x"), None);
        let at = |ep: &str, from: Option<&str>| asker_at(ep, from);
        assert_eq!(
            at("tcp://10.0.0.1:7100", Some("10.0.0.1")).as_deref(),
            Some("tcp://10.0.0.1:7100")
        );
        // Another address named: the one it came from, with its port.
        assert_eq!(
            at("tcp://10.9.9.9:7100", Some("10.0.0.1")).as_deref(),
            Some("tcp://10.0.0.1:7100")
        );
        // libzmq reports an IPv4 peer of an IPv6-enabled socket mapped.
        assert_eq!(
            at("tcp://10.0.0.1:7100", Some("::ffff:10.0.0.1")).as_deref(),
            Some("tcp://10.0.0.1:7100")
        );
        assert_eq!(
            at("tcp://host.example:7100", Some("fd99::2")).as_deref(),
            Some("tcp://[fd99::2]:7100"),
            "a name is never resolved"
        );
        assert_eq!(at("tcp://10.0.0.1:7100", None), None, "ipc: no address");
        assert_eq!(at("tcp://10.0.0.1:x", Some("10.0.0.1")), None);
        assert!(is_loopback_host("::ffff:127.0.0.1") && is_loopback_host("::1"));
        assert!(!is_loopback_host("10.0.0.1"));
    }

    /// One refusal (a disconnection whose reconnection worked) is never
    /// said; refusals that go on for a second are.
    #[test]
    fn only_refusals_that_go_on_are_said() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let timeout = ms(3000);
        let one = Refusals {
            first: t0,
            latest: t0,
        };
        assert_eq!(one.verdict(t0 + ms(1500), timeout), Refused::Waiting);
        // Attempts that time out (no answer at all) come a connect
        // timeout and up to RECONNECT_IVL_MAX apart: still waiting.
        assert_eq!(one.verdict(t0 + ms(5000), timeout), Refused::Waiting);
        assert_eq!(one.verdict(t0 + ms(6000), timeout), Refused::Over);
        let going_on = Refusals {
            first: t0,
            latest: t0 + ms(900),
        };
        assert_eq!(going_on.verdict(t0 + ms(1000), timeout), Refused::Waiting);
        let still = Refusals {
            first: t0,
            latest: t0 + RETRY_SAID_AFTER,
        };
        assert_eq!(
            still.verdict(t0 + RETRY_SAID_AFTER, timeout),
            Refused::Still
        );
    }

    #[test]
    fn an_endpoint_in_a_monitor_event_is_the_announced_one() {
        assert!(same_endpoint(
            "tcp://[::ffff:127.0.0.1]:5",
            "tcp://127.0.0.1:5"
        ));
        assert!(same_endpoint(
            "tcp://10.0.0.1:5#00ff",
            "tcp://[::ffff:10.0.0.1]:5"
        ));
        assert!(same_endpoint("ipc:///run/a", "ipc:///run/a"));
        assert!(!same_endpoint("tcp://127.0.0.1:5", "tcp://127.0.0.1:6"));
        assert!(!same_endpoint("tcp://127.0.0.1:5", "tcp://127.0.0.2:5"));
        assert!(!same_endpoint("tcp://host:5", "tcp://[::ffff:127.0.0.1]:5"));
    }
}
