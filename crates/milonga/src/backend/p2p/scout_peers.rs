//! The `scout` discovery source (docs/protocol.md §9.5): the nodes heard
//! in the scouting group, each known from the announcement its hello
//! carries, or asked for it over the control protocol (§9.1) when its
//! hello names a version it does not carry and not fetched yet, and
//! forgotten when it says it leaves or is not heard for three intervals
//! (at least the lease). It multicasts this node's hello every
//! `scout_interval_ms`, at once when the announcement changes, and asks
//! the others for theirs when it opens, so that a new node has its view
//! within a round trip.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use milonga_wire::scout::Hello;
use milonga_wire::NodeId;

use crate::backend::p2p::control::NodeInfo;
use crate::backend::p2p::curve::{secure_client_to, Guard, PublicKey};
use crate::backend::p2p::{zmq_io, ContextRef};
use crate::discovery::scout::Scout;
use crate::discovery::{reached_at, Announcement, Source};
use crate::model::error::OpenError;
use crate::model::node::NodeCore;
use crate::util::stats;

/// Most nodes scouting remembers; hellos of further new nodes are dropped
/// and counted (`scout_nodes_dropped`).
pub(crate) const MAX_SCOUTED: usize = 10_000;
/// How long a query for an announcement may take before it is given up
/// (asked again after [`RETRY_AFTER`], or at once for a newer version).
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
/// How often silent nodes and late queries are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(100);
/// Least time between two hellos sent to answer others' asks.
const ANSWER_EVERY: Duration = Duration::from_millis(100);
/// Most queries in flight at once: hellos of many new nodes without their
/// announcement (or forged ones) must not cost a socket each.
const MAX_INFLIGHT: usize = 64;
/// How long a version whose query failed (no answer, a bad one) waits
/// before it is asked for again; a newer version is asked for at once.
const RETRY_AFTER: Duration = Duration::from_secs(5);
/// Largest reply to a query taken (an announcement and the counters).
const MAX_REPLY_BYTES: i64 = 1 << 20;

/// A node heard in the group.
struct Scouted {
    control: String,
    /// When a hello last named `control` (a node on two networks this
    /// host is on is heard at two endpoints: the first stays while heard).
    control_heard: Instant,
    /// The announcement version its last hello named.
    version: u64,
    last_heard: Instant,
    /// Its announcement, and the version it was fetched for.
    announcement: Option<(Announcement, u64)>,
    /// A query in flight.
    query: Option<Query>,
    /// The CURVE key its last hello carried (its security is on).
    key: Option<[u8; 32]>,
    /// The last version whose query failed, and when.
    failed: Option<(u64, Instant)>,
}

impl Scouted {
    /// The version of the announcement held, if any.
    fn fetched(&self) -> Option<u64> {
        self.announcement.as_ref().map(|(_, v)| *v)
    }

    /// Whether its announcement should be asked for now.
    fn wants_query(&self, now: Instant) -> bool {
        self.query.is_none()
            && self.fetched().is_none_or(|v| v < self.version)
            && self
                .failed
                .is_none_or(|(v, at)| v < self.version || now >= at + RETRY_AFTER)
    }
}

/// Whether every endpoint announcement `a` names (data, liveliness,
/// control, services; a broker's `#tag` aside) is a tcp endpoint at the
/// address of `control`, the hello's, which scouting checked is the
/// datagram's sender. A hello is not authenticated: an announcement riding
/// in one that named another host's endpoints would make every node that
/// hears it connect there (a reflection of one datagram onto a victim),
/// and an ipc one, a socket of the hearer's own host.
fn all_at_sender(a: &Announcement, control: &str) -> bool {
    use crate::discovery::{ip_of, tcp_host_port};
    let Some(sender) = tcp_host_port(control).and_then(|(h, _)| ip_of(h)) else {
        return false;
    };
    a.data_endpoints()
        .chain(a.liveliness.as_deref())
        .chain(std::iter::once(a.control.as_str()))
        .chain(a.services.iter().map(|s| s.endpoint.as_str()))
        .all(|ep| {
            let ep = ep.split_once('#').map_or(ep, |(e, _)| e);
            tcp_host_port(ep).and_then(|(h, _)| ip_of(h)) == Some(sender)
        })
}

/// A query for a node's announcement: its socket, when it was sent, the
/// version asked, and with security on a monitor that tells a refused key
/// (the peer's ZAP handler) from no answer.
struct Query {
    sock: zmq::Socket,
    mon: Option<zmq::Socket>,
    sent: Instant,
    asked: u64,
}

impl Query {
    /// The ZAP status with which the peer refused this node's key, if it
    /// did.
    fn refused(&self) -> Option<u32> {
        zmq_io::auth_refusal(self.mon.as_ref()?)
    }
}

impl Drop for Query {
    fn drop(&mut self) {
        // Before the monitor's reader goes (see `zmq_io::stop_monitor`).
        if self.mon.is_some() {
            zmq_io::stop_monitor(&mut self.sock);
        }
    }
}

/// The nodes scouting found.
pub(crate) struct ScoutPeers {
    node: Arc<NodeCore>,
    scout: Scout,
    nodes: HashMap<NodeId, Scouted>,
    /// This node's control endpoint, announcement version and
    /// announcement (JSON), for its hellos.
    control: String,
    version: u64,
    announcement: Vec<u8>,
    sent_version: Option<u64>,
    next_hello: Instant,
    last_answer: Option<Instant>,
    answer_due: bool,
    /// The poll saw a datagram or a reply waiting.
    readable: bool,
    /// Queries in flight.
    inflight: usize,
    /// A hello named a version not fetched yet.
    stale: bool,
    /// When silent nodes and late queries are next looked for.
    next_sweep: Instant,
    warned_full: bool,
    /// The node's security, when on: queries name the hello's key.
    guard: Option<Arc<Guard>>,
    /// Nodes that refused this node's key when asked for their
    /// announcement (node, control endpoint, ZAP status), for the node
    /// thread to tell the subscriptions.
    refusals: Vec<(NodeId, String, u32)>,
    /// Numbers the query monitors' endpoints.
    queries_made: u64,
    // Last: the query sockets above close before it.
    ctx: ContextRef,
}

impl ScoutPeers {
    /// Joins the group; the first turn says hello and asks the others for
    /// theirs.
    pub(crate) fn open(
        node: Arc<NodeCore>,
        iface: std::net::IpAddr,
        control: String,
        guard: Option<Arc<Guard>>,
    ) -> Result<ScoutPeers, OpenError> {
        Ok(ScoutPeers {
            scout: Scout::open(node.clone(), iface)?,
            node,
            nodes: HashMap::new(),
            control,
            // No version yet: the first turn sets the announcement, so
            // that the first hello carries it.
            version: u64::MAX,
            announcement: Vec::new(),
            sent_version: None,
            next_hello: Instant::now(),
            last_answer: None,
            answer_due: false,
            readable: true,
            inflight: 0,
            stale: false,
            next_sweep: Instant::now(),
            warned_full: false,
            guard,
            refusals: Vec::new(),
            queries_made: 0,
            ctx: ContextRef::acquire(),
        })
    }

    /// The refusals since the last call.
    pub(crate) fn take_refusals(&mut self) -> Vec<(NodeId, String, u32)> {
        std::mem::take(&mut self.refusals)
    }

    /// The control endpoints of the nodes heard (each the address its
    /// hello came from) whose announcement is held: told to gossip askers.
    pub(crate) fn heard(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .values()
            .filter(|n| n.announcement.is_some())
            .map(|n| n.control.as_str())
    }

    /// The UDP socket, for the node thread's poll.
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.scout.fd()
    }

    /// The query sockets in flight, for the node thread's poll.
    pub(crate) fn poll_items(&self) -> Vec<zmq::PollItem<'_>> {
        self.nodes
            .values()
            .filter_map(|n| n.query.as_ref())
            .map(|q| q.sock.as_poll_item(zmq::POLLIN))
            .collect()
    }

    /// The poll saw something waiting.
    pub(crate) fn mark_readable(&mut self) {
        self.readable = true;
    }

    /// The announcement version its hellos name.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// This node's announcement now, and its version: a change is said at
    /// once; hellos carry it when it fits.
    pub(crate) fn set_announcement(&mut self, version: u64, json: Vec<u8>) {
        self.version = version;
        self.announcement = json;
    }

    /// Sends a hello on every interface scouted, each naming the control
    /// endpoint at that interface's address (the announcement names the
    /// first; the others reach the same ports at theirs).
    fn send_hellos(&self, leaving: bool, ask: bool) {
        let port = self.control.rsplit_once(':').map_or("", |(_, p)| p);
        for &iface in self.scout.ifaces() {
            let h = Hello {
                leaving,
                ask,
                domain_tag: self.node.domain_tag,
                node_id: self.node.id,
                version: self.version,
                control: crate::discovery::scout::endpoint_at(iface, port),
                announcement: None,
                key: self.guard.as_ref().map(|g| *g.identity.public().as_bytes()),
            };
            let bytes = if leaving {
                h.encode()
            } else {
                h.encode_with(&self.announcement)
            };
            self.scout.send(iface, &bytes);
        }
    }

    /// Says goodbye: the others forget this node at once.
    pub(crate) fn leave(&self) {
        self.send_hellos(true, false);
    }

    fn interval(&self) -> Duration {
        Duration::from_millis(self.node.cfg.scout_interval_ms.max(10))
    }

    /// How long a node may stay silent before it is forgotten.
    fn expiry(&self) -> Duration {
        (self.interval() * 3).max(Duration::from_millis(
            self.node.cfg.heartbeat_timeout_ms.max(1) as u64,
        ))
    }

    /// Sends this node's hello when one is due: every interval, when the
    /// announcement changed, and (at most every [`ANSWER_EVERY`]) when a
    /// new node asked.
    fn say_hello(&mut self, now: Instant) {
        let first = self.sent_version.is_none();
        let changed = self.sent_version != Some(self.version);
        let answer = self.answer_due && self.last_answer.is_none_or(|t| now >= t + ANSWER_EVERY);
        if !(first || changed || answer || now >= self.next_hello) {
            return;
        }
        if answer {
            self.answer_due = false;
            self.last_answer = Some(now);
        }
        self.send_hellos(false, first);
        self.sent_version = Some(self.version);
        self.next_hello = now + self.interval();
    }

    /// The announcement a hello carries, if it is one of its node and of
    /// this domain (a bad one is counted, and asked for instead).
    fn inline(&self, h: &Hello) -> Option<Announcement> {
        let json = h.announcement.as_deref()?;
        match Announcement::from_json(json) {
            Ok(mut a) if a.node_id == h.node_id.to_hex() && a.domain == self.node.domain => {
                reached_at(&mut a, &h.control);
                if !all_at_sender(&a, &h.control) {
                    stats::inc(&self.node.counters.scout_malformed);
                    limited!(warn, node = %h.node_id, control = %h.control, "a hello's announcement names endpoints away from its sender: dropped (nodes would connect there)");
                    return None;
                }
                Some(a)
            }
            Ok(_) | Err(_) => {
                stats::inc(&self.node.counters.scout_malformed);
                limited!(warn, node = %h.node_id, "a hello's announcement is not its node's, or does not decode");
                None
            }
        }
    }

    /// Takes in the hellos that arrived; whether a node left or an
    /// announcement they carry changed. Versions only go forward (a node's
    /// counter never goes back; a late datagram does not roll it back).
    fn hear(&mut self, now: Instant) -> bool {
        let mut changed = false;
        for h in self.scout.receive() {
            self.answer_due |= h.ask;
            if h.leaving {
                // Only from the endpoint it is known at: a forged goodbye
                // naming another endpoint removes nothing.
                let known = self
                    .nodes
                    .get(&h.node_id)
                    .is_some_and(|n| n.control == h.control);
                if known {
                    changed |= self
                        .nodes
                        .remove(&h.node_id)
                        .is_some_and(|n| n.announcement.is_some());
                }
                continue;
            }
            if let Some(n) = self.nodes.get(&h.node_id) {
                let newer = h.version > n.version || n.fetched().is_none_or(|v| v < h.version);
                let inline = if newer { self.inline(&h) } else { None };
                let alive_for = self.interval() * 2;
                let n = self.nodes.get_mut(&h.node_id).expect("just found");
                if n.control != h.control && now < n.control_heard + alive_for {
                    // The same node on another network this host is on
                    // too: it stays known at the address heard first.
                    n.last_heard = now;
                    continue;
                }
                n.last_heard = now;
                n.control_heard = now;
                n.key = h.key;
                if n.control != h.control {
                    // Another endpoint for the same id (ids are random per
                    // process: a forged hello, or a move): ask again.
                    n.control = h.control;
                    n.query = None;
                    n.failed = None;
                    n.announcement = None;
                }
                n.version = n.version.max(h.version);
                if let Some(a) = inline.filter(|_| n.fetched().is_none_or(|v| v < h.version)) {
                    changed |= n.announcement.as_ref().is_none_or(|(old, _)| *old != a);
                    n.announcement = Some((a, h.version));
                    n.query = None;
                }
                self.stale |= n.fetched().is_none_or(|v| v < n.version);
                continue;
            }
            if self.nodes.len() >= MAX_SCOUTED {
                stats::inc(&self.node.counters.scout_nodes_dropped);
                if !std::mem::replace(&mut self.warned_full, true) {
                    tracing::warn!(
                        limit = MAX_SCOUTED,
                        "scouting knows {MAX_SCOUTED} nodes: hellos of further new nodes are ignored (counted in scout_nodes_dropped)"
                    );
                }
                continue;
            }
            let inline = self.inline(&h);
            self.stale |= inline.is_none();
            changed |= inline.is_some();
            self.nodes.insert(
                h.node_id,
                Scouted {
                    control: h.control,
                    control_heard: now,
                    version: h.version,
                    last_heard: now,
                    announcement: inline.map(|a| (a, h.version)),
                    query: None,
                    failed: None,
                    key: h.key,
                },
            );
        }
        changed
    }

    /// Asks the nodes whose announcement is older than their hello, and
    /// reads the answers; whether an announcement changed.
    fn fetch(&mut self, now: Instant) -> bool {
        let mut changed = false;
        let mut inflight = 0;
        let domain = &self.node.domain;
        let c = &self.node.counters;
        for (id, n) in &mut self.nodes {
            if let Some(Query {
                sock, sent, asked, ..
            }) = &n.query
            {
                if let Ok(frames) = sock.recv_multipart(zmq::DONTWAIT) {
                    let info = milonga_wire::control::decode_info_reply(&frames)
                        .ok()
                        .and_then(|body| serde_json::from_slice::<NodeInfo>(body).ok())
                        .map(|mut i| {
                            reached_at(&mut i.announcement, &n.control);
                            i
                        });
                    let asked = *asked;
                    n.query = None;
                    // Asked again only for a newer version, or after a
                    // while: a bad answer must not start a loop of queries.
                    n.failed = Some((asked, now));
                    match info {
                        Some(i) if i.announcement.domain != *domain => {
                            stats::inc(&c.peers_foreign_domain);
                        }
                        Some(i) if i.announcement.node_id != id.to_hex() => {
                            stats::inc(&c.control_malformed);
                            limited!(warn, endpoint = %n.control, "a scouted node's control endpoint answered for another node");
                        }
                        Some(i) if !all_at_sender(&i.announcement, &n.control) => {
                            stats::inc(&c.scout_malformed);
                            limited!(warn, endpoint = %n.control, "a scouted node's announcement names endpoints away from its control endpoint's address: dropped");
                        }
                        Some(i) => {
                            n.failed = None;
                            if n.fetched().is_none_or(|v| v < asked) {
                                changed |= n
                                    .announcement
                                    .as_ref()
                                    .is_none_or(|(a, _)| *a != i.announcement);
                                n.announcement = Some((i.announcement, asked));
                            }
                        }
                        None => {
                            stats::inc(&c.control_malformed);
                            limited!(warn, endpoint = %n.control, "dropped a malformed reply from a scouted node");
                        }
                    }
                } else if let Some(status) = n.query.as_ref().and_then(Query::refused) {
                    // Its ZAP handler refused this node's key: said to the
                    // subscriptions (they would otherwise wait in silence:
                    // without the announcement they know of no publisher).
                    stats::inc(&c.auth_rejected);
                    limited!(warn, node = %id, endpoint = %n.control, status, "a node heard by scouting refused this node's key: it is not in that node's trust directory");
                    self.refusals.push((*id, n.control.clone(), status));
                    n.failed = Some((n.version, now));
                    n.query = None;
                } else if now >= *sent + QUERY_TIMEOUT {
                    // Heard, yet not reachable at what it announces: say
                    // so rather than leave it silently missing.
                    stats::inc(&c.scout_unreachable);
                    limited!(warn, node = %id, endpoint = %n.control, "a node heard by scouting did not answer at its control endpoint within 2 s: unreachable from here (a route, a firewall, or an address of another network?)");
                    n.failed = Some((*asked, now));
                    n.query = None;
                }
            }
            inflight += usize::from(n.query.is_some());
        }
        // New queries, at most MAX_INFLIGHT at once (the rest wait for a
        // later turn: `stale` stays set).
        let mut more = false;
        for n in self.nodes.values_mut() {
            if !n.wants_query(now) {
                continue;
            }
            if inflight >= MAX_INFLIGHT {
                more = true;
                break;
            }
            {
                self.queries_made += 1;
                let mon = self.guard.is_some().then(|| {
                    format!(
                        "inproc://milonga-scoutq-{}-{}",
                        self.node.id, self.queries_made
                    )
                });
                let asked = (now, n.version);
                match query(
                    &self.ctx,
                    self.guard.as_deref(),
                    &n.control,
                    n.key,
                    mon.as_deref(),
                    asked,
                ) {
                    Ok(q) => {
                        n.query = Some(q);
                        inflight += 1;
                    }
                    Err(e) => {
                        n.failed = Some((n.version, now));
                        limited!(warn, endpoint = %n.control, err = %e, "cannot ask a scouted node for its announcement")
                    }
                }
            }
        }
        self.stale |= more;
        self.inflight = inflight;
        changed
    }

    /// Forgets the nodes silent for too long; whether one had an
    /// announcement.
    fn expire(&mut self, now: Instant) -> bool {
        let expiry = self.expiry();
        let before = self.nodes.len();
        let mut changed = false;
        self.nodes.retain(|_, n| {
            let keep = now < n.last_heard + expiry;
            changed |= !keep && n.announcement.is_some();
            keep
        });
        if self.nodes.len() < before {
            tracing::debug!(
                forgotten = before - self.nodes.len(),
                "scouted nodes went silent"
            );
        }
        changed
    }
}

/// A query (a DEALER) that has asked `endpoint` for its node's
/// announcement, with the reader of its monitor at `monitor` (handshakes
/// refused), if asked.
fn query(
    ctx: &ContextRef,
    guard: Option<&Guard>,
    endpoint: &str,
    key: Option<[u8; 32]>,
    monitor: Option<&str>,
    (sent, asked): (Instant, u64),
) -> Result<Query, OpenError> {
    use crate::model::error::{IntoTransport, TransportError};
    let s = ctx.socket(zmq::DEALER)?;
    if let Some(g) = guard {
        let secured = match key {
            Some(k) => secure_client_to(g, &s, PublicKey::from_bytes(k)),
            None => Err(TransportError::new(
                "its hello carries no key (its security is off)".into(),
                None,
            )),
        };
        secured.map_err(|source| OpenError::Socket {
            action: "secure a query to",
            endpoint: endpoint.to_owned(),
            source,
        })?;
    }
    let err = |source: zmq::Error| OpenError::Socket {
        action: "query",
        endpoint: endpoint.to_owned(),
        source: source.transport(),
    };
    s.set_linger(0).map_err(err)?;
    s.set_maxmsgsize(MAX_REPLY_BYTES).map_err(err)?;
    s.set_rcvhwm(1).map_err(err)?;
    s.set_ipv6(true).map_err(err)?;
    let mon = match monitor {
        None => None,
        Some(ep) => {
            s.monitor(ep, zmq_io::AUTH_FAILED).map_err(err)?;
            let m = ctx.socket(zmq::PAIR)?;
            m.set_linger(0).map_err(err)?;
            zmq_io::unbounded_monitor_queue(&m).map_err(err)?;
            m.connect(ep).map_err(err)?;
            Some(m)
        }
    };
    // Whole from here: dropped on an error, it stops its monitor first.
    let query = Query {
        sock: s,
        mon,
        sent,
        asked,
    };
    query.sock.connect(endpoint).map_err(err)?;
    query
        .sock
        .send_multipart(milonga_wire::control::Request::Info.frames(), zmq::DONTWAIT)
        .map_err(err)?;
    Ok(query)
}

impl Source for ScoutPeers {
    /// The nodes are gone through only when something asks for it (a
    /// hello with a new version, a reply, a query or a node due to time
    /// out): a turn of the node thread costs nothing otherwise.
    fn turn(&mut self, now: Instant) -> bool {
        let mut changed = false;
        if std::mem::take(&mut self.readable) {
            changed |= self.hear(now);
        }
        let sweep = now >= self.next_sweep;
        if std::mem::take(&mut self.stale) || self.inflight > 0 || sweep {
            changed |= self.fetch(now);
        }
        if sweep {
            changed |= self.expire(now);
            self.next_sweep = now + SWEEP_EVERY;
        }
        self.say_hello(now);
        changed
    }

    fn peers_into(&self, peers: &mut Vec<Announcement>) {
        for n in self.nodes.values() {
            if let Some((a, _)) = &n.announcement {
                peers.push(a.clone());
            }
        }
    }

    fn next_due(&self) -> Option<Instant> {
        let mut next = self.next_hello;
        if !self.nodes.is_empty() {
            next = next.min(self.next_sweep);
        }
        if self.answer_due {
            next = next.min(
                self.last_answer
                    .map_or_else(Instant::now, |t| t + ANSWER_EVERY),
            );
        }
        Some(next)
    }
}
