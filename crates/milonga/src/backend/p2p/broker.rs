//! The broker (docs/broker.md): a ROUTER on its listen endpoint that
//! answers clients (docs/protocol.md §11), and, per domain, three planes
//! (best effort, reliable, liveliness) that move frames untouched:
//!
//! ```text
//!  clients' XPUBs ──> from_clients (XSUB) ──┬──> to_clients (XPUB) ──> clients' XSUBs
//!                                           └──> to_domain  (XPUB) ──> peer-to-peer subscribers
//!  peer-to-peer publishers ──> from_domain (XSUB) ──> to_clients
//! ```
//!
//! Subscriptions, history queries and filter declarations travel the
//! other way: from `to_clients` to both XSUBs, from `to_domain` to
//! `from_clients` only, so that a peer-to-peer subscriber never gets a
//! peer-to-peer publisher's frames twice. libzmq's XPUBs match each frame
//! against each connection's subscriptions: a frame goes only to the
//! connections that asked for it, and each connection's queue is bounded
//! by its high-water mark.
//!
//! The clients' announcements reach the domain through the broker's
//! node (`DomainHost::show`, its local directory), with endpoints at
//! `to_domain` tagged `#<node id>`; the domain's reach the clients in the
//! view, at `to_clients` likewise.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use milonga_wire::announce::Announcement;
use milonga_wire::broker::{
    self as wire, BrokerHello, BrokerRequest, ClientInfo, ClientReport, LsaDomain,
};
use serde::Serialize;

use crate::backend::p2p::federation::Federation;
use crate::backend::p2p::registry::{Refused, Table};
use crate::backend::p2p::serve_link::ENVELOPE;
use crate::backend::p2p::uplink::{self, Plane};
use crate::backend::p2p::zmq_io::{self, ContextRef, Frame};
use crate::model::config::Config;
use crate::model::error::{IntoTransport, OpenError};
use crate::util::lock;
use crate::util::stats::log_drop;

/// What the broker needs of its node in one domain.
pub(crate) trait DomainHost: Send + 'static {
    /// The domain.
    fn domain(&self) -> &str;
    /// The node's id (hex).
    fn node_id(&self) -> String;
    /// Every node discovery shows in the domain.
    fn peers(&self) -> Vec<Announcement>;
    /// Announces a client to the domain (as a node of the broker's
    /// process, so that it is gone when the broker is).
    fn show(&self, a: &Announcement);
    /// Withdraws a client's announcement.
    fn hide(&self, node_id: &str);
}

/// Opens the broker's node in a domain it serves from the first
/// request that names it (a broker serving every domain).
pub(crate) type OpenDomain = Box<dyn FnMut(&str) -> Result<Box<dyn DomainHost>, OpenError> + Send>;

/// How a broker runs.
#[derive(Debug, Clone)]
pub(crate) struct BrokerSpec {
    /// The ROUTER clients ask, `tcp://HOST:PORT`.
    pub listen: String,
    /// How often clients attach (ms).
    pub attach_interval_ms: u64,
    /// A client that has not attached for this long is forgotten (ms).
    pub lease_ms: u64,
    /// How long a reliable message waits for a full client before it is
    /// dropped for that client (ms).
    pub stall_ms: u64,
    /// MiB of reliable messages a plane holds for full clients before it
    /// stops reading its publishers.
    pub hold_mib: u64,
    /// Most clients served at once.
    pub max_clients: usize,
    /// Most endpoints of registered nodes connected to, a domain.
    pub max_registered_connected: usize,
    /// Most domains served when it serves every domain asked for (an
    /// [`OpenDomain`] given to [`start`]).
    pub max_domains: usize,
    /// A domain opened on request closes after this long without a
    /// client, a registered node or a federated broker naming it.
    pub domain_idle: Duration,
    /// The listen endpoints of the brokers it links to (federation).
    pub peers: Vec<String>,
    /// Socket options (high-water marks, heartbeats, message size).
    pub cfg: Config,
    /// With security on: the broker's identity and trust, and the key
    /// each client node attached with (docs/broker.md).
    pub security: Option<BrokerSecurity>,
}

/// A key in Z85, shared.
type Z85 = Arc<str>;

/// A broker's security: every socket its clients reach is a CURVE server
/// of its identity admitting the keys of its trust directory, a client
/// attaches only under a node id its key gives, and each frame a client
/// sends must name a node that attached with the key of its connection.
#[derive(Clone)]
pub(crate) struct BrokerSecurity {
    pub guard: Arc<crate::backend::p2p::curve::Guard>,
    /// What the guard counts (`auth_refused`) in: the guard holds it weakly.
    pub core: Arc<crate::model::node::NodeCore>,
    /// The key each client node id attached with.
    pub keys: Arc<std::sync::RwLock<HashMap<[u8; 16], Z85>>>,
}

impl std::fmt::Debug for BrokerSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerSecurity")
            .field("key", &self.guard.identity.public())
            .finish_non_exhaustive()
    }
}

impl BrokerSecurity {
    /// Makes `sock`, which binds, a CURVE server of the broker's identity
    /// admitting the trusted keys only.
    fn secure(&self, sock: &mut zmq::Socket, ep: &str) -> Result<(), OpenError> {
        crate::backend::p2p::curve::secure_server(&self.guard, sock, &self.guard.zap_domain)
            .map_err(sock_err(ep))
    }

    /// Whether a frame naming node `origin` may come on a connection
    /// admitted with `user` (a key in Z85).
    fn vouches(&self, origin: Option<[u8; 16]>, user: Option<&[u8]>) -> bool {
        let (Some(origin), Some(user)) = (origin, user) else {
            return false;
        };
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.get(&origin).is_some_and(|k| k.as_bytes() == user)
    }
}

/// [`BrokerSecurity::secure`] when security is on.
fn secure(spec: &BrokerSpec, sock: &mut zmq::Socket, ep: &str) -> Result<(), OpenError> {
    match &spec.security {
        Some(sec) => sec.secure(sock, ep),
        None => Ok(()),
    }
}

/// The broker's counters, shared by its threads.
#[derive(Debug, Default)]
pub(crate) struct BrokerCounters {
    pub frames_forwarded: AtomicU64,
    pub bytes_forwarded: AtomicU64,
    pub upstream_messages: AtomicU64,
    pub reliable_stalls: AtomicU64,
    pub reliable_dropped: AtomicU64,
    pub reliable_held: AtomicU64,
    pub reliable_held_bytes: AtomicU64,
    pub requests_malformed: AtomicU64,
    pub clients_expired: AtomicU64,
    pub clients_refused: AtomicU64,
    pub requests_refused: AtomicU64,
    pub clients: AtomicU64,
    pub calls_unroutable: AtomicU64,
    pub replies_undeliverable: AtomicU64,
    pub links: AtomicU64,
    pub federation_brokers: AtomicU64,
    pub duplicates_dropped: AtomicU64,
    pub registered: AtomicU64,
    pub registered_unconnected: AtomicU64,
    pub registry_refused: AtomicU64,
    pub registry_expired: AtomicU64,
    pub domains: AtomicU64,
    pub domains_refused: AtomicU64,
    pub domains_closed: AtomicU64,
    pub handshakes_failed: AtomicU64,
    pub accepts_failed: AtomicU64,
    pub frames_unattributed: AtomicU64,
    pub replies_dropped: AtomicU64,
    pub tree: Mutex<Vec<String>>,
}

/// A snapshot of the broker's counters (`milonga broker --json`).
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct BrokerStats {
    /// Clients attached now, in all domains.
    pub clients: u64,
    /// Messages (samples, batches, heartbeats, history replies; one or
    /// two frames each) forwarded, counted once per outgoing socket they
    /// were sent on (the clients', the domain's, each link's), whether a
    /// connection there subscribes or not.
    pub frames_forwarded: u64,
    /// Their bytes.
    pub bytes_forwarded: u64,
    /// Subscriptions, history queries and filter declarations forwarded.
    pub upstream_messages: u64,
    /// Reliable messages held: refused for a full client, or behind a
    /// held message of their node.
    pub reliable_stalls: u64,
    /// Reliable messages the broker dropped for a full client: first in
    /// line for `stall_ms` (less while a client is stuck), past what a
    /// port holds, or held for a link that closed (the client sees the
    /// gap: repaired from history or reported lost).
    pub reliable_dropped: u64,
    /// Reliable messages held now, in all domains, for clients (or links,
    /// or peer-to-peer subscribers) whose queue is full.
    pub reliable_held: u64,
    /// Their bytes.
    pub reliable_held_bytes: u64,
    /// Requests dropped as malformed.
    pub requests_malformed: u64,
    /// Clients forgotten after their lease.
    pub clients_expired: u64,
    /// Clients refused: the broker serves `max_clients` already.
    pub clients_refused: u64,
    /// Attaches and detaches refused: they name a client attached with
    /// another client key (docs/protocol.md §11.2), so they come from
    /// another connection than that client's (logged, the first ten and
    /// every 1,000th).
    pub requests_refused: u64,
    /// Calls for a service the broker could not reach (its server gone,
    /// or not connected yet): not relayed; the caller's deadline ends them.
    pub calls_unroutable: u64,
    /// Replies the broker could not pass back: their caller had gone, or
    /// its connection was full (or a reply named no caller).
    pub replies_undeliverable: u64,
    /// Federation links up now (docs/broker.md "Federation").
    pub links: u64,
    /// Other brokers of its federation it knows now.
    pub federation_brokers: u64,
    /// Frames dropped in a federation: no newer than one already
    /// forwarded of their publisher and key (a copy by another path while
    /// the tree changed, or a late one), or frames nothing tells from
    /// their copies on a link leaving the tree.
    pub duplicates_dropped: u64,
    /// Peer-to-peer nodes in its registry now, in all domains (registry
    /// mode, docs/discovery.md "A registry").
    pub registered: u64,
    /// Registered nodes whose publishers a client asks for but that the
    /// broker does not connect to, nor tell its clients of, now: it
    /// connects to at most `max_registered_connected` of their endpoints
    /// a domain.
    pub registered_unconnected: u64,
    /// Registrations refused: the registry holds its most.
    pub registry_refused: u64,
    /// Registered nodes removed after their lease (not unregistered).
    pub registry_expired: u64,
    /// Domains served now.
    pub domains: u64,
    /// Domains a request named that a broker serving every domain did
    /// not open: it serves `max_domains` already, or the domain's node
    /// could not open (the client is told why).
    pub domains_refused: u64,
    /// Domains opened on request and closed again, idle (no client, no
    /// registered node, no federated broker naming them) for the time
    /// `domain_idle_ms` says.
    pub domains_closed: u64,
    /// Connections to its listen port dropped in the handshake: the peer
    /// does not speak ZMTP, speaks it wrongly, or says nothing within
    /// `handshake_timeout_ms` (logged, the first ten and every 1,000th).
    pub handshakes_failed: u64,
    /// Connections to its listen port it could not accept (file
    /// descriptors exhausted; logged likewise).
    pub accepts_failed: u64,
    /// With security on: connections refused because their key is not
    /// in the broker's trust directory (logged, rate-limited).
    pub auth_refused: u64,
    /// With security on: frames a client sent under a node id that did
    /// not attach with the key of its connection, dropped (logged, the
    /// first ten and every 1,000th).
    pub frames_unattributed: u64,
    /// Answers to requests on its listen port (hellos, views, client
    /// lists, registry pages, federation records) dropped: the
    /// connection's queue held 16 unread already (a peer
    /// that does not read), or the peer was gone.
    pub replies_dropped: u64,
    /// The peers (broker ids) of its links in the federation's spanning
    /// tree, which data crosses.
    pub tree: Vec<String>,
}

impl BrokerCounters {
    pub(crate) fn snapshot(&self) -> BrokerStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BrokerStats {
            clients: g(&self.clients),
            frames_forwarded: g(&self.frames_forwarded),
            bytes_forwarded: g(&self.bytes_forwarded),
            upstream_messages: g(&self.upstream_messages),
            reliable_stalls: g(&self.reliable_stalls),
            reliable_dropped: g(&self.reliable_dropped),
            reliable_held: g(&self.reliable_held),
            reliable_held_bytes: g(&self.reliable_held_bytes),
            requests_malformed: g(&self.requests_malformed),
            clients_expired: g(&self.clients_expired),
            clients_refused: g(&self.clients_refused),
            requests_refused: g(&self.requests_refused),
            calls_unroutable: g(&self.calls_unroutable),
            replies_undeliverable: g(&self.replies_undeliverable),
            links: g(&self.links),
            federation_brokers: g(&self.federation_brokers),
            duplicates_dropped: g(&self.duplicates_dropped),
            registered: g(&self.registered),
            registered_unconnected: g(&self.registered_unconnected),
            registry_refused: g(&self.registry_refused),
            registry_expired: g(&self.registry_expired),
            domains: g(&self.domains),
            domains_refused: g(&self.domains_refused),
            domains_closed: g(&self.domains_closed),
            handshakes_failed: g(&self.handshakes_failed),
            accepts_failed: g(&self.accepts_failed),
            auth_refused: 0,
            frames_unattributed: g(&self.frames_unattributed),
            replies_dropped: g(&self.replies_dropped),
            tree: lock(&self.tree).clone(),
        }
    }
}

/// A running broker: its threads stop when it is dropped.
pub(crate) struct Running {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Where its ROUTER is bound.
    pub(crate) listen: String,
    pub(crate) counters: Arc<BrokerCounters>,
    /// Each domain's endpoints.
    pub(crate) hellos: Arc<Mutex<Vec<BrokerHello>>>,
    /// Its id in a federation (new at each start).
    pub(crate) broker_id: String,
    security: Option<BrokerSecurity>,
}

impl Running {
    /// Its public key, when its security is on.
    pub(crate) fn public_key(&self) -> Option<crate::backend::p2p::curve::PublicKey> {
        self.security.as_ref().map(|s| s.guard.identity.public())
    }

    /// A snapshot of its counters.
    pub(crate) fn stats(&self) -> BrokerStats {
        let mut s = self.counters.snapshot();
        if let Some(sec) = &self.security {
            s.auth_refused = sec.core.counters.auth_refused.load(Ordering::Relaxed);
        }
        s
    }

    /// Stops the threads and waits for them.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The control thread joins the threads of the domains it opened
        // as it ends (dropping them).
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The endpoints a plane's peer-to-peer XSUB should be connected to,
/// set by the control thread, applied by the plane's.
#[derive(Default)]
struct Wanted {
    generation: u64,
    endpoints: BTreeSet<String>,
    /// The links in the federation's spanning tree, by peer: the peer's
    /// XPUB for this broker on this plane, once told.
    links: BTreeMap<String, Option<String>>,
    /// Security on: the key each link's peer is reached with (Z85).
    link_keys: BTreeMap<String, String>,
    /// The nodes of other brokers shown to the domain.
    shown: Arc<HashSet<[u8; 16]>>,
    /// The registered nodes connected to: their frames go to the clients
    /// only (they are not brought into the federation).
    registered: Arc<HashSet<[u8; 16]>>,
    /// Some of `endpoints` linger (no longer wanted, still connected for
    /// [`LINK_LINGER`]): a publisher's frames may come by two paths (one
    /// that moved to this broker from another of its host, whose
    /// backlog comes late, a broker frozen and woken), so copies are
    /// dropped ([`Seen`]), as in a federation.
    lingering: bool,
}

/// What the clients subscribe to on one plane, as key prefixes
/// (docs/protocol.md §3; a filtered subscription's `@f/<id>/` taken off,
/// heartbeats' and replies' `@` topics left out): set by the plane's
/// thread, read by the control thread, which connects to a registered
/// node's publisher only if one of them covers its key.
#[derive(Default, Debug, PartialEq, Eq)]
struct Asked {
    prefixes: BTreeSet<Vec<u8>>,
}

impl Asked {
    /// From the topics of the ports' [`Interest`]s.
    fn of<'a>(topics: impl Iterator<Item = &'a Vec<u8>>) -> Asked {
        let filtered = milonga_wire::filter::FILTERED_KEY_PREFIX.as_bytes();
        let prefixes = topics
            .filter_map(|t| match t.strip_prefix(filtered) {
                // `@f/<id>/P`: P.
                Some(rest) => {
                    let slash = rest.iter().position(|b| *b == b'/')?;
                    Some(rest[slash + 1..].to_vec())
                }
                None if t.first() == Some(&b'@') => None,
                None => Some(t.clone()),
            })
            .collect();
        Asked { prefixes }
    }

    /// Whether a subscription asked for samples of `key` (its frames
    /// begin `key ‖ 0x00`). A subscription prefix is empty, ends at a
    /// chunk's `/`, or is a whole key and its NUL (§3): those are the
    /// prefixes looked up.
    fn covers(&self, key: &str) -> bool {
        let mut k = key.as_bytes().to_vec();
        k.push(0);
        self.prefixes.contains(&k[..0])
            || self.prefixes.contains(&k[..])
            || k.iter()
                .enumerate()
                .any(|(i, b)| *b == b'/' && self.prefixes.contains(&k[..=i]))
    }
}

/// How often a plane tells the control thread what is asked, at most.
const ASKED_EVERY: Duration = Duration::from_millis(50);

fn sock_err(endpoint: &str) -> impl Fn(zmq::Error) -> OpenError + '_ {
    move |source| OpenError::Socket {
        action: "configure",
        endpoint: endpoint.to_owned(),
        source: source.transport(),
    }
}

/// The host part of `tcp://HOST:PORT`.
fn host_of(listen: &str) -> Option<&str> {
    let rest = listen.strip_prefix("tcp://")?;
    Some(rest.rsplit_once(':')?.0)
}

/// Where a plane's messages come from and go: the clients' sockets, the
/// domain's, or a link's to a federated broker (by its id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Port {
    Clients,
    Domain,
    Link(String),
}

/// What one port's subscribers asked upstream: subscriptions with their
/// counts, and filter declarations by filter id. A link made later is
/// told them (a new XSUB knows none of them).
#[derive(Default)]
struct Interest {
    topics: BTreeMap<Vec<u8>, u32>,
    decls: BTreeMap<String, Vec<u8>>,
    /// Subscribes passed on untracked (past the limits) and not yet
    /// withdrawn: an unsubscribe of a topic not tracked goes on only
    /// while there are some (else it withdraws nothing of this port's,
    /// and could only withdraw another port's: a client's stray
    /// unsubscribe).
    untracked: u64,
    /// Bumped when `topics` gains or loses one, and its value at the
    /// last pruning of `decls`: a prune that can free nothing is skipped
    /// (a flood of declarations must not cost a full prune each).
    topics_gen: u64,
    pruned_gen: Option<u64>,
}

/// Most distinct topics (and declarations) a port's [`Interest`] keeps;
/// more are forwarded but not told to a link made later.
const MAX_TRACKED: usize = 65_536;

/// Longest subscription topic a port's [`Interest`] keeps.
const MAX_TRACKED_TOPIC_BYTES: usize = 1024;

/// Most filter declarations a port's [`Interest`] keeps, and the longest
/// it keeps (a declaration names a node, a socket, a key expression of at
/// most 512 bytes and a filter of at most 1 KiB: under 2 KiB): 16 MiB a
/// port at most. Others are forwarded, not told to a link made later.
const MAX_TRACKED_DECLS: usize = 4096;
const MAX_TRACKED_DECL_BYTES: usize = 4096;

/// What becomes of an upstream message once its port took note of it
/// ([`Interest::note`]).
#[derive(Debug, PartialEq, Eq)]
enum Pass {
    /// Another subscriber of a topic the port asked for already, or one
    /// of several leaving: it stops here.
    Skip,
    /// The port's first subscriber of the topic, or its last leaving: it
    /// goes on where no other port has asked for the topic
    /// ([`Plane::held_elsewhere`]).
    Edge,
    /// Not tracked (a query, a declaration, a topic past the limits): it
    /// goes on as it came.
    Always,
}

impl Interest {
    /// Takes note of an upstream message; what becomes of it. A port's
    /// subscription to a topic goes on once, when its first subscriber
    /// asks, and is withdrawn once, when its last one leaves, and only to
    /// the sockets that no other port's subscription to it reached: so
    /// that a subscribe repeated a million times (a flood, or a million
    /// subscribers) costs the publishers behind them one message, and so
    /// that each socket (whose libzmq XSUB passes every subscribe but only
    /// the last unsubscribe on) hears each topic once and its withdrawal
    /// once, and the publishers' counts return to 0. A link made later is
    /// told each topic once. What is not tracked (past [`MAX_TRACKED`]
    /// topics) goes on every time.
    fn note(&mut self, msg: &[u8]) -> Pass {
        match msg.split_first() {
            Some((1, topic)) => {
                if let Some(n) = self.topics.get_mut(topic) {
                    *n = n.saturating_add(1);
                    Pass::Skip
                } else {
                    // A topic longer than any key's subscription (a key
                    // of 512 bytes behind a filter's prefix) is passed on
                    // untracked: it matches nothing, and must not hold
                    // memory here.
                    if self.topics.len() < MAX_TRACKED && topic.len() <= MAX_TRACKED_TOPIC_BYTES {
                        self.topics.insert(topic.to_vec(), 1);
                        self.topics_gen += 1;
                        Pass::Edge
                    } else {
                        self.untracked += 1;
                        Pass::Always
                    }
                }
            }
            Some((0, topic)) => match self.topics.get_mut(topic) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    Pass::Skip
                }
                Some(_) => {
                    self.topics.remove(topic);
                    self.topics_gen += 1;
                    Pass::Edge
                }
                // Not tracked: its subscribe went on untracked, or there
                // was none (a stray, which must not withdraw what another
                // port asked for).
                None if self.untracked > 0 => {
                    self.untracked -= 1;
                    Pass::Always
                }
                None => Pass::Skip,
            },
            Some((&milonga_wire::filter::DECLARE_TAG, _)) => {
                if msg.len() <= MAX_TRACKED_DECL_BYTES {
                    if self.decls.len() >= MAX_TRACKED_DECLS {
                        // Those no subscription holds any more go first.
                        self.prune_decls();
                    }
                    if self.decls.len() < MAX_TRACKED_DECLS {
                        if let Ok(d) = milonga_wire::filter::Declaration::decode(msg) {
                            self.decls.insert(d.filter.id_for(&d.keys), msg.to_vec());
                        }
                    }
                }
                Pass::Always
            }
            _ => Pass::Always,
        }
    }

    /// The declarations whose filtered samples are still subscribed to.
    fn live_decls(&mut self) -> Vec<Vec<u8>> {
        self.pruned_gen = None;
        self.prune_decls();
        self.decls.values().cloned().collect()
    }

    /// Forgets the declarations whose filtered samples nobody of this
    /// port subscribes to any more.
    fn prune_decls(&mut self) {
        if self.pruned_gen == Some(self.topics_gen) {
            return;
        }
        self.pruned_gen = Some(self.topics_gen);
        let topics = &self.topics;
        self.decls.retain(|id, _| {
            let p = format!("{}{id}/", milonga_wire::filter::FILTERED_KEY_PREFIX);
            topics
                .range(p.as_bytes().to_vec()..)
                .next()
                .is_some_and(|(t, _)| t.starts_with(p.as_bytes()))
        });
    }
}

/// A link to a federated broker on one plane: an XPUB bound here that
/// the peer's XSUB connects to, and an XSUB connected to the peer's.
struct LinkIo {
    inp: zmq::Socket,
    out: zmq::Socket,
    /// The peer's XPUB for this broker, once told.
    peer_out: Option<String>,
    interest: Interest,
    /// When to tell the peer's publishers the filter declarations again
    /// (the connection is being made: a declaration sent before it is
    /// lost; publishers ignore one they keep).
    redeclare: Vec<Instant>,
    /// Out of the tree: closed at this time. Until then it carries data
    /// as before, so that nothing is lost while the links that replace it
    /// connect (a copy that comes twice is dropped, [`Seen`]).
    retire_at: Option<Instant>,
}

/// When to send the filter declarations again on connections being made:
/// a declaration sent before a connection is up is lost.
fn redeclare_times() -> Vec<Instant> {
    let now = Instant::now();
    [100, 500, 1500]
        .iter()
        .map(|ms| now + Duration::from_millis(*ms))
        .collect()
}

/// How long a link that left the tree goes on carrying data.
const LINK_LINGER: Duration = Duration::from_secs(2);

/// The newest data frame a broker of a federation has forwarded, by
/// publisher and key: while the tree changes a frame can come by two
/// paths (or around a cycle of old and new links), and a path delivers a
/// publisher's frames in order, so a frame no newer than one already
/// forwarded is a copy, or would reach the subscribers out of order; it
/// is dropped here (counted in `duplicates_dropped`). What one path
/// carried alone and another overtook shows to the subscribers as a gap,
/// repaired from history or reported exactly. Samples, batches and
/// heartbeats only: their (publisher, key, sequence number) is unique.
#[derive(Default)]
struct Seen {
    /// (publisher, hash of the key) -> the highest number forwarded.
    newest: HashMap<([u8; 16], u64), u64>,
}

/// Most (publisher, key) pairs [`Seen`] keeps; past that it starts over.
const MAX_SEEN: usize = 65_536;

/// The (publisher, hash of the key, sequence number) of a frame whose
/// copies [`Seen`] can tell: a sample, batch or heartbeat, not a filtered
/// sample (a filter declared again numbers from 1 again).
fn stream_of(first: &[u8]) -> Option<([u8; 16], u64, u64)> {
    use milonga_wire::frame::offset;
    let nul = first
        .iter()
        .take(milonga_wire::key::MAX_KEY_BYTES + 1)
        .position(|b| *b == 0)?;
    let h = &first[nul + 1..];
    if h.len() < milonga_wire::frame::HEADER_LEN
        || !matches!(h[offset::KIND], 1..=3)
        || first.starts_with(milonga_wire::filter::FILTERED_KEY_PREFIX.as_bytes())
    {
        return None;
    }
    let mut node = [0u8; 16];
    node.copy_from_slice(&h[offset::NODE_ID..offset::NODE_ID + 16]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&h[offset::SEQ..offset::SEQ + 8]);
    let key = crate::util::fnv1a64(&first[..nul]);
    Some((node, key, u64::from_le_bytes(seq)))
}

impl Seen {
    /// Whether a frame of `stream` is no newer than one forwarded already
    /// (then it is not to be forwarded); notes it otherwise.
    fn stale(&mut self, (node, key, seq): ([u8; 16], u64, u64)) -> bool {
        if self.newest.len() >= MAX_SEEN && !self.newest.contains_key(&(node, key)) {
            self.newest.clear();
        }
        let newest = self.newest.entry((node, key)).or_insert(0);
        if seq > *newest {
            *newest = seq;
            return false;
        }
        true
    }
}

/// What ends a domain's threads: the broker's stop, or the domain's own
/// (a domain opened on request and closed, idle).
#[derive(Clone)]
struct Stop {
    broker: Arc<AtomicBool>,
    domain: Arc<AtomicBool>,
}

impl Stop {
    fn now(&self) -> bool {
        self.broker.load(Ordering::Relaxed) || self.domain.load(Ordering::Relaxed)
    }
}

/// One plane's sockets and its thread's state.
struct PlaneIo {
    /// Its broker's id, short (for the logs).
    me: String,
    plane: Plane,
    from_clients: zmq::Socket,
    from_domain: zmq::Socket,
    to_clients: zmq::Socket,
    to_domain: zmq::Socket,
    links: BTreeMap<String, LinkIo>,
    seen: Seen,
    clients_interest: Interest,
    domain_interest: Interest,
    wanted: Arc<Mutex<Wanted>>,
    /// What the clients ask, for the control thread; changed since it was
    /// last told, and when it was.
    asked: Arc<Mutex<Arc<Asked>>>,
    asked_changed: bool,
    asked_at: Instant,
    /// The links' XPUB endpoints, by peer, for the control thread.
    bound: Arc<Mutex<BTreeMap<String, String>>>,
    /// Nodes of other brokers this one shows to its domain: their frames
    /// from links go to `to_domain` too.
    shown: Arc<HashSet<[u8; 16]>>,
    /// Registered nodes (registry mode): their frames go to no link.
    registered: Arc<HashSet<[u8; 16]>>,
    /// Copies are dropped ([`Seen`]) without links too: domain endpoints
    /// linger ([`Wanted::lingering`]).
    dedupe_domain: bool,
    host: String,
    ctx: ContextRef,
    spec_cfg: Config,
    applied: u64,
    connected: BTreeSet<String>,
    /// When to tell the domain's publishers the filter declarations again
    /// (new connections were being made).
    domain_redeclare: Vec<Instant>,
    /// The reliable plane's stall limit: how long a message waits for a
    /// full connection.
    stall: Duration,
    /// Reliable messages each port holds for full connections.
    held: HashMap<Port, Held>,
    hold: HoldLimits,
    /// What it held when it last told the counters (messages, bytes).
    held_told: (u64, u64),
    counters: Arc<BrokerCounters>,
    stop: Stop,
    /// With security on: each client frame's node must have attached
    /// with the key of the connection it came on.
    security: Option<BrokerSecurity>,
}

/// The longest stall limit: a day (a longer one is taken as a day).
const MAX_STALL_MS: u64 = 86_400_000;

/// How often held messages are offered again (ms).
const HELD_RETRY_MS: i64 = 1;

/// How long a message waits for a full connection while its port is
/// lossy ([`Held::lossy_until`]): a client that reads catches up in that
/// time; a stuck one costs the others no more.
const LOSSY_GRACE: Duration = Duration::from_millis(10);

/// What a plane holds for full connections ([`Held`]) before it stops
/// reading its publishers, and what one port holds at most.
#[derive(Debug, Clone, Copy)]
struct HoldLimits {
    /// Bytes (of all its ports) past which the plane stops reading its
    /// publishers until they fall below: a client or link that is only
    /// slow then slows the publishers, as a slow peer-to-peer subscriber
    /// does, rather than losing messages.
    pause_bytes: usize,
    /// Messages likewise (1,024 per MiB).
    pause_messages: usize,
    /// Four times those per port, whatever comes (what a burst read
    /// before the pause brought): past that the port's oldest message is
    /// dropped for the full connections.
    max_bytes: usize,
    max_messages: usize,
}

impl HoldLimits {
    fn of_mib(mib: u64) -> HoldLimits {
        let mib = usize::try_from(mib.max(1)).unwrap_or(usize::MAX >> 24);
        HoldLimits {
            pause_bytes: mib.saturating_mul(1 << 20),
            pause_messages: mib.saturating_mul(1024),
            max_bytes: mib.saturating_mul(4 << 20),
            max_messages: mib.saturating_mul(4096),
        }
    }
}

/// A reliable message that a port's XPUB could not take yet.
struct HeldMsg {
    arrived: Instant,
    bytes: usize,
    frames: Vec<Frame>,
}

/// One node's held messages, in order, and since when the first of them
/// has waited for room. The stall limit counts from then, so that a
/// backlog that drains, however long, loses nothing, while a connection
/// that takes nothing for the stall limit has that message dropped.
struct Chain {
    msgs: VecDeque<HeldMsg>,
    head_since: Instant,
}

/// The reliable messages one port holds. libzmq's XPUB with
/// `XPUB_NODROP` takes a message for every connection that wants it or,
/// when one of those is full, for none; a message refused so waits here
/// rather than in the plane's thread, and messages that no full
/// connection wants go on at once. A node's later messages wait behind
/// its held ones, so that every connection gets them in order (a
/// node's history replies with its samples too): a stalled client delays
/// only the nodes whose publications it reads, for the clients that read
/// them too, and at most the stall limit, until the plane holds
/// [`HoldLimits::pause_bytes`] and stops reading every publisher.
#[derive(Default)]
struct Held {
    /// By the publisher node in the messages' header (`None`: messages
    /// without one).
    chains: HashMap<Option<[u8; 16]>, Chain>,
    bytes: usize,
    count: usize,
    /// Until when a message that finds a connection full waits only
    /// [`LOSSY_GRACE`]: a stall limit after the last message dropped for a
    /// full connection (it waited the whole stall limit, or the port held
    /// too much).
    lossy_until: Option<Instant>,
}

impl Held {
    fn push(&mut self, origin: Option<[u8; 16]>, m: HeldMsg, now: Instant) {
        self.bytes += m.bytes;
        self.count += 1;
        self.chains
            .entry(origin)
            .or_insert_with(|| Chain {
                msgs: VecDeque::new(),
                head_since: now,
            })
            .msgs
            .push_back(m);
    }

    /// Takes the first held message of `origin`: its next one, if any, is
    /// first now and waits from `now`.
    fn take(&mut self, origin: Option<[u8; 16]>, now: Instant) -> Option<HeldMsg> {
        let chain = self.chains.get_mut(&origin)?;
        let m = chain.msgs.pop_front()?;
        chain.head_since = now;
        if chain.msgs.is_empty() {
            self.chains.remove(&origin);
        }
        self.bytes -= m.bytes;
        self.count -= 1;
        Some(m)
    }

    /// Puts `m`, refused again, back in front of its node's messages,
    /// waiting since `since`.
    fn restore(&mut self, origin: Option<[u8; 16]>, m: HeldMsg, since: Instant) {
        self.bytes += m.bytes;
        self.count += 1;
        let chain = self.chains.entry(origin).or_insert_with(|| Chain {
            msgs: VecDeque::new(),
            head_since: since,
        });
        chain.head_since = since;
        chain.msgs.push_front(m);
    }

    /// The node whose first held message came first.
    fn oldest(&self) -> Option<Option<[u8; 16]>> {
        self.chains
            .iter()
            .filter_map(|(o, c)| c.msgs.front().map(|m| (m.arrived, *o)))
            .min_by_key(|(t, _)| *t)
            .map(|(_, o)| o)
    }

    fn lossy(&self, now: Instant) -> bool {
        self.lossy_until.is_some_and(|t| now < t)
    }

    /// Whether nothing is held or remembered: the port's entry can go.
    fn idle(&self, now: Instant) -> bool {
        self.count == 0 && !self.lossy(now)
    }
}

/// What became of a message offered to a reliable XPUB.
enum Offer {
    /// Taken (or lost to a socket error, as any send can be).
    Done,
    /// A connection that wants it is full: taken by none.
    Full(Vec<Frame>),
}

/// Offers a whole message to a reliable XPUB without waiting. libzmq
/// judges the connections' room at the first frame (a connection's queue
/// counts whole messages), so the rest follow; should one not, it waits
/// as long as the socket's send timeout (the stall limit).
fn offer(sock: &mut zmq::Socket, frames: Vec<Frame>) -> Offer {
    let n = frames.len();
    let mut it = frames.into_iter();
    let Some(first) = it.next() else {
        return Offer::Done;
    };
    let more = if n > 1 { zmq::SNDMORE } else { 0 };
    match first.send(sock, more | zmq::DONTWAIT) {
        Ok(()) => {}
        Err((f, zmq::Error::EAGAIN)) => {
            let mut v = Vec::with_capacity(n);
            v.push(f);
            v.extend(it);
            return Offer::Full(v);
        }
        Err(_) => return Offer::Done,
    }
    for (i, f) in it.enumerate() {
        let flags = if i + 2 < n { zmq::SNDMORE } else { 0 };
        if f.send(sock, flags).is_err() {
            break;
        }
    }
    Offer::Done
}

/// Sends a whole reliable message to the connections that have room; a
/// full one drops it and its subscriber sees the gap (repaired from
/// history or reported lost).
fn send_dropping(sock: &mut zmq::Socket, frames: Vec<Frame>) {
    let _ = zmq_io::set_xpub_nodrop(sock, false);
    send_frames(sock, frames);
    let _ = zmq_io::set_xpub_nodrop(sock, true);
}

/// Most messages read from one socket before the others get a turn.
const BURST: usize = 256;

/// The publisher node id in a data frame's header, if it has one.
fn origin(first: &[u8]) -> Option<[u8; 16]> {
    use milonga_wire::frame::offset::NODE_ID;
    let nul = first
        .iter()
        .take(milonga_wire::key::MAX_KEY_BYTES + 1)
        .position(|b| *b == 0)?;
    let at = nul + 1 + NODE_ID;
    first.get(at..at + 16)?.try_into().ok()
}

fn new_xsub(ctx: &ContextRef, cfg: &Config, v6: bool, ep: &str) -> Result<zmq::Socket, OpenError> {
    let err = sock_err(ep);
    let mut s = ctx.socket(zmq::XSUB)?;
    zmq_io::apply_common(&s, cfg).map_err(&err)?;
    zmq_io::apply_receiving(&mut s, cfg).map_err(&err)?;
    zmq_io::apply_relaying(&mut s).map_err(&err)?;
    s.set_ipv6(v6).map_err(&err)?;
    Ok(s)
}

fn new_xpub(
    ctx: &ContextRef,
    cfg: &Config,
    v6: bool,
    ep: &str,
    plane: Plane,
    stall_ms: u64,
    verbose: bool,
) -> Result<zmq::Socket, OpenError> {
    let err = sock_err(ep);
    let mut s = ctx.socket(zmq::XPUB)?;
    zmq_io::apply_common(&s, cfg).map_err(&err)?;
    zmq_io::apply_sending(&mut s).map_err(&err)?;
    s.set_ipv6(v6).map_err(&err)?;
    // Every subscribe and unsubscribe goes upstream, where the XSUBs
    // count them: a topic stays subscribed upstream while one connection
    // here holds it. A link's XPUB has one connection, the peer's XSUB,
    // which sends every subscribe but only the last unsubscribe of a
    // topic: there the XPUB passes only the first subscribe and the last
    // unsubscribe, so the counts upstream stay exact.
    if verbose {
        zmq_io::set_xpub_verboser(&mut s).map_err(&err)?;
    }
    s.set_maxmsgsize(crate::engine::history::MAX_QUERY_BYTES as i64)
        .map_err(&err)?;
    match plane {
        // A reliable publisher's small high-water mark makes it batch
        // (docs/protocol.md §4); here the queue per client is the usual
        // one, and a full one holds the plane up to the stall limit.
        Plane::Reliable => {
            zmq_io::set_xpub_nodrop(&mut s, true).map_err(&err)?;
            s.set_sndtimeo(i32::try_from(stall_ms).unwrap_or(i32::MAX))
                .map_err(&err)?;
        }
        // Heartbeats are small and the goodbye must get through.
        Plane::Liveliness => s.set_sndhwm(1000).map_err(&err)?,
        Plane::BestEffort => {}
    }
    Ok(s)
}

impl PlaneIo {
    fn open(
        ctx: &ContextRef,
        spec: &BrokerSpec,
        host: &str,
        plane: Plane,
        counters: &Arc<BrokerCounters>,
        stop: &Stop,
    ) -> Result<(PlaneIo, [String; 3]), OpenError> {
        let cfg = &spec.cfg;
        let ep = format!("tcp://{host}:*");
        // A listening socket with IPv6 on names IPv4 peers and its own
        // endpoint in IPv6 form: on only for an IPv6 address.
        let v6 = host.starts_with('[');
        let from_clients = new_xsub(ctx, cfg, v6, &ep)?;
        // It connects to publishers, which may be at IPv6 addresses.
        let from_domain = new_xsub(ctx, cfg, true, &ep)?;
        if let Some(sec) = &spec.security {
            // It connects only to nodes of the broker's own key (its
            // domain's `refresh`).
            let own = sec.guard.identity.public();
            crate::backend::p2p::curve::ClientKeys::new(&sec.guard.identity, own)
                .apply(&from_domain)
                .map_err(sock_err(&ep))?;
        }
        // As a subscription's: no PINGs to the nodes' liveliness sockets,
        // whose heartbeats are the lease (docs/protocol.md §1).
        if plane == Plane::Liveliness {
            zmq_io::set_pings(&from_domain, cfg, false).map_err(sock_err(&ep))?;
        }
        let mut to_clients = new_xpub(ctx, cfg, v6, &ep, plane, spec.stall_ms, true)?;
        let mut to_domain = new_xpub(ctx, cfg, v6, &ep, plane, spec.stall_ms, true)?;
        let mut from_clients = from_clients;
        for s in [&mut from_clients, &mut to_clients, &mut to_domain] {
            secure(spec, s, &ep)?;
        }
        let fc = zmq_io::bind(&from_clients, &ep)?;
        let tc = zmq_io::bind(&to_clients, &ep)?;
        let td = zmq_io::bind(&to_domain, &ep)?;
        Ok((
            PlaneIo {
                me: String::new(),
                plane,
                from_clients,
                from_domain,
                to_clients,
                to_domain,
                links: BTreeMap::new(),
                seen: Seen::default(),
                clients_interest: Interest::default(),
                domain_interest: Interest::default(),
                wanted: Arc::new(Mutex::new(Wanted::default())),
                asked: Arc::default(),
                asked_changed: false,
                asked_at: Instant::now(),
                bound: Arc::default(),
                shown: Arc::default(),
                registered: Arc::default(),
                dedupe_domain: false,
                host: host.to_owned(),
                ctx: ContextRef::acquire(),
                spec_cfg: cfg.clone(),
                applied: 0,
                connected: BTreeSet::new(),
                domain_redeclare: Vec::new(),
                stall: Duration::from_millis(spec.stall_ms.min(MAX_STALL_MS)),
                held: HashMap::new(),
                hold: HoldLimits::of_mib(spec.hold_mib),
                held_told: (0, 0),
                counters: counters.clone(),
                stop: stop.clone(),
                security: spec.security.clone(),
            },
            [fc, tc, td],
        ))
    }

    fn run(mut self) {
        while !self.stop.now() {
            self.reconcile();
            self.retire();
            self.redeclare();
            self.tell_asked();
            // Publishers are not read while the ports hold too much.
            let paused = self.backlogged();
            let mut what: Vec<(Port, bool)> = Vec::new();
            let mut items = Vec::new();
            if !paused {
                items.push(self.from_clients.as_poll_item(zmq::POLLIN));
                what.push((Port::Clients, true));
                items.push(self.from_domain.as_poll_item(zmq::POLLIN));
                what.push((Port::Domain, true));
            }
            items.push(self.to_clients.as_poll_item(zmq::POLLIN));
            what.push((Port::Clients, false));
            items.push(self.to_domain.as_poll_item(zmq::POLLIN));
            what.push((Port::Domain, false));
            for (id, l) in &self.links {
                if !paused {
                    items.push(l.inp.as_poll_item(zmq::POLLIN));
                    what.push((Port::Link(id.clone()), true));
                }
                items.push(l.out.as_poll_item(zmq::POLLIN));
                what.push((Port::Link(id.clone()), false));
            }
            let wait = if self.held.values().any(|h| h.count > 0) {
                HELD_RETRY_MS
            } else {
                50
            };
            let polled = zmq::poll(&mut items, wait);
            let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
            drop(items);
            self.offer_held();
            self.tell_held();
            if !matches!(polled, Ok(n) if n > 0) {
                continue;
            }
            for ((port, down), ready) in what.into_iter().zip(ready) {
                match (ready, down) {
                    (false, _) => {}
                    (true, true) => self.down(&port),
                    (true, false) => self.up(&port),
                }
            }
        }
        // What it held goes with it (a domain closed, or the broker
        // stopping): the gauges no longer count it.
        self.held.clear();
        self.tell_held();
    }

    /// Tells the control thread what the clients ask now, if it changed,
    /// at most every [`ASKED_EVERY`].
    fn tell_asked(&mut self) {
        let now = Instant::now();
        if !self.asked_changed || now < self.asked_at + ASKED_EVERY {
            return;
        }
        self.asked_changed = false;
        self.asked_at = now;
        let asked = Asked::of(self.clients_interest.topics.keys());
        let mut told = lock(&self.asked);
        if **told != asked {
            *told = Arc::new(asked);
        }
    }

    /// Connects the peer-to-peer XSUB to the endpoints wanted now, and
    /// makes or drops links.
    fn reconcile(&mut self) {
        let w = lock(&self.wanted);
        if w.generation == self.applied {
            return;
        }
        self.applied = w.generation;
        let wanted = w.endpoints.clone();
        let links = w.links.clone();
        let link_keys = w.link_keys.clone();
        self.shown = w.shown.clone();
        self.registered = w.registered.clone();
        self.dedupe_domain = w.lingering;
        drop(w);
        for ep in self.connected.difference(&wanted) {
            let _ = self.from_domain.disconnect(ep);
        }
        let mut new = false;
        for ep in wanted.difference(&self.connected) {
            if let Err(e) = self.from_domain.connect(ep) {
                tracing::warn!(endpoint = %ep, err = %e, "the broker cannot connect to a publisher of its domain");
            }
            new = true;
        }
        if new {
            // The filter declarations already made reach the publishers
            // connected now too (those that keep them ignore them).
            self.domain_redeclare = redeclare_times();
        }
        self.connected = wanted;
        let gone: Vec<String> = self
            .links
            .keys()
            .filter(|id| !links.contains_key(*id))
            .cloned()
            .collect();
        let now = Instant::now();
        for id in gone {
            if let Some(l) = self.links.get_mut(&id) {
                l.retire_at.get_or_insert(now + LINK_LINGER);
            }
        }
        for (id, peer_out) in links {
            if let Some(l) = self.links.get_mut(&id) {
                l.retire_at = None;
            } else {
                if let Err(e) = self.add_link(&id) {
                    tracing::warn!(peer = %id, err = %e, "the broker cannot open a link's sockets");
                    continue;
                }
            }
            let Some(l) = self.links.get_mut(&id) else {
                continue;
            };
            if l.peer_out != peer_out {
                tracing::debug!(broker = %self.me, plane = ?self.plane, peer = %id, from = ?l.peer_out, to = ?peer_out, "a link's XSUB connects");
                if let Some(old) = l.peer_out.take() {
                    let _ = l.inp.disconnect(&old);
                }
                if let (Some(_), Some(sec)) = (&peer_out, &self.security) {
                    // Reached with the key of the peer's messages: it
                    // holds the link's other end.
                    let keys = link_keys
                        .get(&id)
                        .and_then(|k| crate::backend::p2p::curve::PublicKey::from_z85(k).ok())
                        .map(|k| {
                            crate::backend::p2p::curve::ClientKeys::new(&sec.guard.identity, k)
                        });
                    match keys.map(|k| k.apply(&l.inp)) {
                        Some(Ok(())) => {}
                        Some(Err(e)) => {
                            tracing::warn!(peer = %id, err = %e, "the broker cannot secure a link");
                            continue;
                        }
                        None => {
                            tracing::warn!(peer = %id, "a link's peer has no key known yet: not connected");
                            continue;
                        }
                    }
                }
                if let Some(ep) = &peer_out {
                    if let Err(e) = l.inp.connect(ep) {
                        tracing::warn!(endpoint = %ep, err = %e, "the broker cannot connect to a federated broker");
                    }
                    l.redeclare = redeclare_times();
                }
                l.peer_out = peer_out;
            }
        }
    }

    /// Opens a link's sockets; its XSUB subscribes to what every other
    /// port's subscribers asked for.
    fn add_link(&mut self, id: &str) -> Result<(), OpenError> {
        let ep = format!("tcp://{}:*", self.host);
        let v6 = self.host.starts_with('[');
        let stall_ms = u64::try_from(self.stall.as_millis()).unwrap_or(u64::MAX);
        let inp = new_xsub(&self.ctx, &self.spec_cfg, true, &ep)?;
        let mut out = new_xpub(
            &self.ctx,
            &self.spec_cfg,
            v6,
            &ep,
            self.plane,
            stall_ms,
            false,
        )?;
        if let Some(sec) = &self.security {
            // Trusted keys only; the peer broker's is one (it links only
            // once designated, the control thread's `refused`).
            sec.secure(&mut out, &ep)?;
        }
        let bound = zmq_io::bind(&out, &ep)?;
        let others = std::iter::once(&self.clients_interest)
            .chain(std::iter::once(&self.domain_interest))
            .chain(self.links.values().map(|l| &l.interest));
        // Each topic any port asked for, once ([`Interest::note`]).
        let topics: BTreeSet<&Vec<u8>> = others.flat_map(|i| i.topics.keys()).collect();
        for topic in topics {
            let mut m = vec![1u8];
            m.extend_from_slice(topic);
            let _ = inp.send(&m[..], zmq::DONTWAIT);
        }
        tracing::debug!(broker = %self.me, plane = ?self.plane, peer = %id, out = %bound, "a link opens");
        lock(&self.bound).insert(id.to_owned(), bound);
        self.links.insert(
            id.to_owned(),
            LinkIo {
                inp,
                out,
                peer_out: None,
                interest: Interest::default(),
                redeclare: Vec::new(),
                retire_at: None,
            },
        );
        Ok(())
    }

    /// Closes the links out of the tree for `LINK_LINGER`.
    fn retire(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .links
            .iter()
            .filter(|(_, l)| l.retire_at.is_some_and(|t| t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.drop_link(&id);
        }
    }

    /// Closes a link: what its subscribers asked for is withdrawn
    /// upstream.
    fn drop_link(&mut self, id: &str) {
        tracing::debug!(broker = %self.me, plane = ?self.plane, peer = %id, "a link closes");
        lock(&self.bound).remove(id);
        if let Some(h) = self.held.remove(&Port::Link(id.to_owned())) {
            // What it held for the link goes with it, counted.
            self.counters
                .reliable_dropped
                .fetch_add(h.count as u64, Ordering::Relaxed);
        }
        let Some(l) = self.links.remove(id) else {
            return;
        };
        let _ = l.inp.set_linger(0);
        let _ = l.out.set_linger(0);
        // Withdrawn where no other port still asks for it.
        let gone = Port::Link(id.to_owned());
        for topic in l.interest.topics.keys() {
            let mut m = vec![0u8];
            m.extend_from_slice(topic);
            if !self.held_elsewhere(topic, &gone, &Port::Clients) {
                let _ = self.from_clients.send(&m[..], zmq::DONTWAIT);
            }
            if !self.held_elsewhere(topic, &gone, &Port::Domain) {
                let _ = self.from_domain.send(&m[..], zmq::DONTWAIT);
            }
            for (oid, o) in &self.links {
                if !self.held_elsewhere(topic, &gone, &Port::Link(oid.clone())) {
                    let _ = o.inp.send(&m[..], zmq::DONTWAIT);
                }
            }
        }
    }

    /// Tells the filter declarations of every other port to the links
    /// whose connection was being made, and to the domain's publishers
    /// when new ones were connected.
    fn redeclare(&mut self) {
        let now = Instant::now();
        if self.domain_redeclare.first().is_some_and(|t| *t <= now) {
            self.domain_redeclare.remove(0);
            let mut decls = self.clients_interest.live_decls();
            for l in self.links.values_mut() {
                decls.extend(l.interest.live_decls());
            }
            for d in &decls {
                let _ = self.from_domain.send(&d[..], zmq::DONTWAIT);
            }
        }
        let due: Vec<String> = self
            .links
            .iter()
            .filter(|(_, l)| l.redeclare.first().is_some_and(|t| *t <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let mut decls = self.clients_interest.live_decls();
            decls.extend(self.domain_interest.live_decls());
            for (other, l) in &mut self.links {
                if *other != id {
                    decls.extend(l.interest.live_decls());
                }
            }
            if let Some(l) = self.links.get_mut(&id) {
                l.redeclare.remove(0);
                for d in &decls {
                    let _ = l.inp.send(&d[..], zmq::DONTWAIT);
                }
            }
        }
    }

    fn in_socket(&mut self, p: &Port) -> Option<&mut zmq::Socket> {
        match p {
            Port::Clients => Some(&mut self.from_clients),
            Port::Domain => Some(&mut self.from_domain),
            Port::Link(id) => self.links.get_mut(id).map(|l| &mut l.inp),
        }
    }

    fn out_socket(&mut self, p: &Port) -> Option<&mut zmq::Socket> {
        match p {
            Port::Clients => Some(&mut self.to_clients),
            Port::Domain => Some(&mut self.to_domain),
            Port::Link(id) => self.links.get_mut(id).map(|l| &mut l.out),
        }
    }

    /// Whether a port other than `but` that feeds `target`'s socket its
    /// subscriptions (every port but `target` itself; the clients' own
    /// too, for their publishers) has asked for `topic`: then `target`
    /// heard it from there already, or still needs it.
    fn held_elsewhere(&self, topic: &[u8], but: &Port, target: &Port) -> bool {
        let feeds = |p: &Port| p != but && (p != target || *p == Port::Clients);
        let is = |p: &Port, id: &str| matches!(p, Port::Link(l) if l == id);
        (feeds(&Port::Clients) && self.clients_interest.topics.contains_key(topic))
            || (feeds(&Port::Domain) && self.domain_interest.topics.contains_key(topic))
            || self.links.iter().any(|(id, l)| {
                // A link feeds every socket but its own.
                !is(but, id) && !is(target, id) && l.interest.topics.contains_key(topic)
            })
    }

    /// The links other than `but`; those leaving the tree too only if
    /// `retiring`.
    fn other_links(&self, but: &Port, retiring: bool) -> impl Iterator<Item = Port> + '_ {
        let but = match but {
            Port::Link(id) => Some(id.clone()),
            _ => None,
        };
        self.links
            .iter()
            .filter(move |(id, l)| Some(*id) != but.as_ref() && (retiring || l.retire_at.is_none()))
            .map(|(id, _)| Port::Link(id.clone()))
    }

    /// Whether `p` is a link leaving the tree.
    fn retiring(&self, p: &Port) -> bool {
        match p {
            Port::Link(id) => self.links.get(id).is_some_and(|l| l.retire_at.is_some()),
            _ => false,
        }
    }

    /// Data frames that came in on `src`: a client's go to the clients,
    /// the domain and the links; the domain's to the clients and the
    /// links; a link's to the clients, the other links, and the domain
    /// when this broker shows their publisher there. The same frames are
    /// shared between the sockets, not copied.
    fn down(&mut self, src: &Port) {
        for _ in 0..BURST {
            if self.stop.now() || self.backlogged() {
                return;
            }
            let Some(sock) = self.in_socket(src) else {
                return;
            };
            let Ok(frames) = recv_frames(sock) else {
                return;
            };
            if let (Port::Clients, Some(sec)) = (src, &self.security) {
                let first = frames.first();
                let origin = first.and_then(|f| origin(f.bytes()));
                if !sec.vouches(origin, first.and_then(Frame::user_id)) {
                    let n = self
                        .counters
                        .frames_unattributed
                        .fetch_add(1, Ordering::Relaxed)
                        + 1;
                    let who = origin.map(|o| milonga_wire::NodeId(o).to_hex());
                    log_drop(
                        n,
                        "a client's frame",
                        &format_args!(
                            "it names node {} and came on a connection of another key",
                            who.as_deref().unwrap_or("(none)")
                        ),
                    );
                    continue;
                }
            }
            // In a federation, a frame no newer than one forwarded is
            // dropped, whichever path it came by ([`Seen`]): a publisher of
            // this host reached both directly and through a link sends on
            // both, and the path that lags may be either. A link leaving
            // the tree carries only what can be told apart from its copies,
            // so that nothing goes round a cycle of old and new links.
            let mut tellable = true;
            if !self.links.is_empty() || self.dedupe_domain {
                let first = frames.first().map(|f| f.bytes()).unwrap_or_default();
                let stream = stream_of(first);
                tellable = stream.is_some();
                if stream.is_some_and(|st| self.seen.stale(st))
                    || stream.is_none() && self.retiring(src)
                {
                    self.counters
                        .duplicates_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let mut targets = vec![Port::Clients];
            match src {
                Port::Clients => targets.push(Port::Domain),
                Port::Domain => {}
                Port::Link(_) => {
                    if frames
                        .first()
                        .and_then(|f| origin(f.bytes()))
                        .is_some_and(|o| self.shown.contains(&o))
                    {
                        targets.push(Port::Domain);
                    }
                }
            }
            let registered = *src == Port::Domain
                && !self.registered.is_empty()
                && frames
                    .first()
                    .and_then(|f| origin(f.bytes()))
                    .is_some_and(|o| self.registered.contains(&o));
            if !registered {
                targets.extend(self.other_links(src, tellable));
            }
            self.fan_out(targets, frames, |me, t, f| me.send(t, f));
        }
    }

    /// Sends `frames` to each of `targets` with `send`, sharing them.
    fn fan_out(
        &mut self,
        targets: Vec<Port>,
        mut frames: Vec<Frame>,
        send: impl Fn(&mut Self, &Port, Vec<Frame>),
    ) {
        let n = targets.len();
        for (i, t) in targets.iter().enumerate() {
            if i + 1 == n {
                send(self, t, frames);
                return;
            }
            let Ok(shared) = frames
                .iter_mut()
                .map(Frame::share)
                .collect::<zmq::Result<Vec<_>>>()
            else {
                return;
            };
            send(self, t, shared);
        }
    }

    /// Sends `frames` on the XPUB of `to`. Best effort never waits: a
    /// full connection drops them. Reliable: see [`Held`].
    fn send(&mut self, to: &Port, frames: Vec<Frame>) {
        let bytes: usize = frames.iter().map(Frame::len).sum();
        if self.plane != Plane::Reliable {
            let counters = self.counters.clone();
            if let Some(sock) = self.out_socket(to) {
                send_frames(sock, frames);
                counters.frames_forwarded.fetch_add(1, Ordering::Relaxed);
                counters
                    .bytes_forwarded
                    .fetch_add(bytes as u64, Ordering::Relaxed);
            }
            return;
        }
        let now = Instant::now();
        let from = frames.first().and_then(|f| origin(f.bytes()));
        let msg = HeldMsg {
            arrived: now,
            bytes,
            frames,
        };
        let mut held = match self.held.is_empty() {
            true => Held::default(),
            false => self.held.remove(to).unwrap_or_default(),
        };
        let msg = if held.chains.contains_key(&from) {
            // Behind its node's held messages, in order.
            Some(msg)
        } else {
            self.deliver(to, &mut held.lossy_until, msg, now, now)
        };
        if let Some(msg) = msg {
            self.counters
                .reliable_stalls
                .fetch_add(1, Ordering::Relaxed);
            held.push(from, msg, now);
        }
        self.settle(to, held, now);
    }

    /// Offers `msg` to `to`'s XPUB: sent; dropped for the full connections
    /// if it has waited (since `waiting_since`) the stall limit, or
    /// [`LOSSY_GRACE`] while the port is lossy (`lossy_until`); or handed
    /// back, to be held.
    fn deliver(
        &mut self,
        to: &Port,
        lossy_until: &mut Option<Instant>,
        msg: HeldMsg,
        waiting_since: Instant,
        now: Instant,
    ) -> Option<HeldMsg> {
        let stall = self.stall;
        let counters = self.counters.clone();
        let sock = self.out_socket(to)?;
        let HeldMsg {
            arrived,
            bytes,
            frames,
        } = msg;
        let lossy = lossy_until.is_some_and(|t| now < t);
        let limit = if lossy { LOSSY_GRACE.min(stall) } else { stall };
        match offer(sock, frames) {
            Offer::Done => {}
            Offer::Full(frames) if now >= waiting_since + limit => {
                send_dropping(sock, frames);
                *lossy_until = Some(now + stall);
                counters.reliable_dropped.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("a reliable message found a client full past the stall limit and was dropped for it");
            }
            Offer::Full(frames) => {
                return Some(HeldMsg {
                    arrived,
                    bytes,
                    frames,
                })
            }
        }
        counters.frames_forwarded.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_forwarded
            .fetch_add(bytes as u64, Ordering::Relaxed);
        None
    }

    /// Drops the oldest held messages for the full connections while the
    /// port holds more than its limit, and keeps `held` for `to` if it is
    /// not idle.
    fn settle(&mut self, to: &Port, mut held: Held, now: Instant) {
        let limits = self.hold;
        // One message alone stays, however large: it waits its turn.
        while held.count > 1 && (held.bytes > limits.max_bytes || held.count > limits.max_messages)
        {
            let Some(m) = held.oldest().and_then(|o| held.take(o, now)) else {
                break;
            };
            held.lossy_until = Some(now + self.stall);
            self.counters
                .reliable_dropped
                .fetch_add(1, Ordering::Relaxed);
            if let Some(sock) = self.out_socket(to) {
                send_dropping(sock, m.frames);
            }
        }
        if !held.idle(now) {
            self.held.insert(to.clone(), held);
        }
    }

    /// Offers the held messages again: a round offers each node's first
    /// one, the node that has waited longest first, and rounds go on while
    /// one delivers something, so that a client that reads gives every
    /// node its turn (a node served first until refused would take all the
    /// room a slow reader frees, and another's first message would wait
    /// out the stall limit while that client reads).
    fn offer_held(&mut self) {
        let ports: Vec<Port> = self.held.keys().cloned().collect();
        for to in ports {
            let Some(mut held) = self.held.remove(&to) else {
                continue;
            };
            let now = Instant::now();
            let mut order: Vec<(Instant, Option<[u8; 16]>)> = held
                .chains
                .iter()
                .map(|(o, c)| (c.head_since, *o))
                .collect();
            order.sort_unstable_by_key(|(since, _)| *since);
            let mut open: Vec<Option<[u8; 16]>> = order.into_iter().map(|(_, o)| o).collect();
            while !open.is_empty() {
                let mut next = Vec::with_capacity(open.len());
                for o in open {
                    let Some(since) = held.chains.get(&o).map(|c| c.head_since) else {
                        continue;
                    };
                    let Some(m) = held.take(o, now) else {
                        continue;
                    };
                    match self.deliver(&to, &mut held.lossy_until, m, since, now) {
                        Some(m) => held.restore(o, m, since),
                        None if held.chains.contains_key(&o) => next.push(o),
                        None => {}
                    }
                }
                open = next;
            }
            self.settle(&to, held, now);
        }
    }

    /// Tells the counters what the ports hold now (gauges shared by every
    /// plane: each adds what changed since it last told).
    fn tell_held(&mut self) {
        let now = self.held.values().fold((0u64, 0u64), |(n, b), h| {
            (n + h.count as u64, b + h.bytes as u64)
        });
        if now != self.held_told {
            // Wrapping: a decrease adds its two's complement.
            let c = &self.counters;
            c.reliable_held
                .fetch_add(now.0.wrapping_sub(self.held_told.0), Ordering::Relaxed);
            c.reliable_held_bytes
                .fetch_add(now.1.wrapping_sub(self.held_told.1), Ordering::Relaxed);
            self.held_told = now;
        }
    }

    /// Whether the ports hold so much that the plane stops reading its
    /// publishers ([`HoldLimits::pause_bytes`]).
    fn backlogged(&self) -> bool {
        if self.held.is_empty() {
            return false;
        }
        let (bytes, n) = self
            .held
            .values()
            .fold((0, 0), |(b, n), h| (b + h.bytes, n + h.count));
        bytes > self.hold.pause_bytes || n > self.hold.pause_messages
    }

    /// Subscriptions, queries and declarations from the subscribers on
    /// `src`'s XPUB: to the XSUBs of every other port (a client's to the
    /// clients' too, since clients subscribe to each other), each noted
    /// for the links made later.
    fn up(&mut self, src: &Port) {
        for _ in 0..BURST {
            let Some(sock) = self.out_socket(src) else {
                return;
            };
            let Ok(frames) = recv_frames(sock) else {
                return;
            };
            // Shared-memory markers (docs/shared-memory.md) stay here: a
            // broker holds a prefix once for all the clients behind it,
            // so a publisher seeing its marker could not tell that a
            // remote client wants the prefix too. Publishers send the
            // broker the bytes, whoever its clients are.
            if matches!(&frames[..], [only] if matches!(only.bytes(), [0 | 1, milonga_wire::shm::MARKER_BYTE, ..]))
            {
                continue;
            }
            // Subscriptions cross a link leaving the tree (they are
            // counted, and withdrawn when it closes); queries and
            // declarations, which nothing tells apart from their copies,
            // do not.
            let subscription =
                matches!(&frames[..], [only] if matches!(only.bytes().first(), Some(0 | 1)));
            if !subscription && self.retiring(src) {
                continue;
            }
            self.counters
                .upstream_messages
                .fetch_add(1, Ordering::Relaxed);
            let mut edge = None;
            if let [only] = &frames[..] {
                let interest = match src {
                    Port::Clients => Some(&mut self.clients_interest),
                    Port::Domain => Some(&mut self.domain_interest),
                    Port::Link(id) => self.links.get_mut(id).map(|l| &mut l.interest),
                };
                if let Some(i) = interest {
                    match i.note(only.bytes()) {
                        Pass::Skip => continue,
                        Pass::Edge => edge = only.bytes().get(1..).map(<[u8]>::to_vec),
                        Pass::Always => {}
                    }
                    self.asked_changed |= *src == Port::Clients;
                    if let Some((&b @ (0 | 1), topic)) = only.bytes().split_first() {
                        tracing::debug!(broker = %self.me, plane = ?self.plane, from = ?src, subscribe = b == 1, topic = %String::from_utf8_lossy(topic), "upstream");
                    }
                }
            }
            let mut targets = vec![Port::Clients];
            if *src != Port::Domain {
                targets.push(Port::Domain);
            }
            targets.extend(self.other_links(src, subscription));
            if let Some(topic) = edge {
                targets.retain(|t| !self.held_elsewhere(&topic, src, t));
                if targets.is_empty() {
                    continue;
                }
            }
            self.fan_out(targets, frames, |me, t, f| {
                if let Some(s) = me.in_socket(t) {
                    send_frames(s, f);
                }
            });
        }
    }
}

/// Reads one whole message without waiting.
fn recv_frames(sock: &mut zmq::Socket) -> zmq::Result<Vec<Frame>> {
    let first = Frame::recv(sock, zmq::DONTWAIT)?;
    let mut more = first.more();
    let mut frames = vec![first];
    while more {
        let f = Frame::recv(sock, 0)?;
        more = f.more();
        frames.push(f);
    }
    Ok(frames)
}

/// Sends a whole message without waiting (upstream: a full connection
/// drops it, as libzmq's XSUB does).
fn send_frames(sock: &mut zmq::Socket, frames: Vec<Frame>) {
    let n = frames.len();
    for (i, f) in frames.into_iter().enumerate() {
        let flags = if i + 1 < n { zmq::SNDMORE } else { 0 } | zmq::DONTWAIT;
        if f.send(sock, flags).is_err() {
            return;
        }
    }
}

/// Reads one whole message without waiting (the calls plane's).
fn recv_all(sock: &zmq::Socket) -> zmq::Result<Vec<zmq::Message>> {
    let first = sock.recv_msg(zmq::DONTWAIT)?;
    let mut more = first.get_more();
    let mut frames = vec![first];
    while more {
        let m = sock.recv_msg(0)?;
        more = m.get_more();
        frames.push(m);
    }
    Ok(frames)
}

/// A client the broker serves.
struct Client {
    /// Its announcement, as it attached it.
    announcement: Announcement,
    /// The bytes of its announcement (as JSON), counted in
    /// [`MAX_CLIENT_BYTES`].
    bytes: usize,
    /// The client key it first attached with: later attaches and its
    /// detach must carry the same.
    key: Option<String>,
    /// When it last attached, and the time before.
    seen: Instant,
    previous_seen: Option<Instant>,
    /// When it first attached.
    since: Instant,
    /// Its last two reports, with when they came.
    report: Option<(Instant, ClientReport)>,
    previous: Option<(Instant, ClientReport)>,
}

impl Client {
    /// What `clients` tells of it.
    fn info(&self, now: Instant) -> ClientInfo {
        let mut rates = BTreeMap::new();
        if let (Some((t1, r1)), Some((t0, r0))) = (&self.report, &self.previous) {
            let dt = t1.duration_since(*t0).as_secs_f64();
            if dt > 0.0 {
                for k in ["samples_sent", "samples_received", "samples_lost"] {
                    let d = r1
                        .stats
                        .get(k)
                        .copied()
                        .unwrap_or(0)
                        .saturating_sub(r0.stats.get(k).copied().unwrap_or(0));
                    rates.insert(format!("{k}_per_s"), d as f64 / dt);
                }
            }
        }
        let r = self.report.as_ref().map(|(_, r)| r);
        ClientInfo {
            node_id: self.announcement.node_id.clone(),
            name: self.announcement.name.clone(),
            attached_s: now.duration_since(self.since).as_secs_f64(),
            last_attach_ms: u64::try_from(now.duration_since(self.seen).as_millis())
                .unwrap_or(u64::MAX),
            subscriptions: r.map(|r| r.subscriptions.clone()).unwrap_or_default(),
            stats: r.map(|r| r.stats.clone()).unwrap_or_default(),
            rates,
        }
    }
}

/// One domain: its node, its planes' endpoints, its clients and the view
/// the clients are told.
struct Domain {
    host: Box<dyn DomainHost>,
    hello: BrokerHello,
    /// The peer-to-peer nodes that use this broker as their registry.
    registry: Table,
    /// The broker's key (Z85) when its security is on: its clients are
    /// shown to the domain `via` it, only host nodes of that key are
    /// brought in, and its clients and the registered nodes are not shown
    /// to each other (docs/broker.md "Security").
    key: Option<String>,
    /// The registered nodes as the clients are told them, read when the
    /// table or what the clients ask last changed (at this key: the
    /// table's version, and what is asked on each data plane).
    registry_nodes: Vec<RegistryNode>,
    /// Registered nodes left out at the last refresh (past
    /// `max_registered_connected` endpoints).
    registered_unconnected: usize,
    /// The most endpoints of registered nodes connected to.
    max_registered_connected: usize,
    /// The registered nodes connected to at the last refresh: they keep
    /// their places.
    admitted: HashSet<String>,
    registry_read: Option<(u64, [Arc<Asked>; 2])>,
    /// `to_domain` endpoints: best effort, reliable, liveliness.
    to_domain: [String; 3],
    /// Each plane's wanted peer-to-peer endpoints, links and shown nodes.
    wanted: [Arc<Mutex<Wanted>>; 3],
    /// What the clients ask on each data plane (best effort, reliable).
    asked: [Arc<Mutex<Arc<Asked>>>; 2],
    /// Each plane's link XPUBs, by peer broker.
    bound: [Arc<Mutex<BTreeMap<String, String>>>; 3],
    /// The other brokers' nodes this broker shows to its domain.
    shown: BTreeMap<String, Announcement>,
    /// What it reaches without another broker (its record's part).
    direct: Vec<Announcement>,
    /// Each plane's peer-to-peer endpoints wanted at the last refresh,
    /// and those no longer wanted, kept connected until then.
    lingering: [(BTreeSet<String>, HashMap<String, Instant>); 3],
    /// The peer-to-peer services calls are relayed to.
    services: Arc<Mutex<ServiceTable>>,
    clients: HashMap<String, Client>,
    /// The bytes of its clients' announcements (their `bytes`).
    client_bytes: usize,
    /// The domain's nodes as the clients are told them, by node id.
    others: BTreeMap<String, Announcement>,
    /// The peer-to-peer nodes of the host's directory that serve
    /// something of their own (an endpoint not a broker's): no client
    /// may attach under their ids.
    peer_to_peer: HashSet<String>,
    view_version: u64,
    /// Shared by every reply that carries it (no copy per client).
    view: bytes::Bytes,
    dirty: bool,
    /// Set to end its threads (see [`Stop`]).
    closed: Arc<AtomicBool>,
    /// Its threads, when opened on request (the control thread's to
    /// join); those of the domains given at the start are the broker's.
    threads: Vec<JoinHandle<()>>,
    /// Opened on request (a broker serving every domain): closed when
    /// idle.
    on_request: bool,
    /// Since when it has had no client, no registered node and no
    /// federated broker naming it.
    idle_since: Option<Instant>,
}

impl Drop for Domain {
    /// Ends its threads and waits for them (a poll turn, at most 50 ms),
    /// before its node closes (the `host` field, dropped after this).
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Most data endpoints of one registered node the broker connects to.
const MAX_REGISTERED_ENDPOINTS: usize = 8;

/// A node registered with the broker, as its clients are told it.
struct RegistryNode {
    id: String,
    /// At the broker's sockets.
    told: Announcement,
    /// The endpoints to connect to on each plane (0, 1, 2), for what the
    /// clients ask.
    wanted: Vec<(usize, String)>,
    /// Its id, if connected to (its frames go to no link).
    registered: Option<[u8; 16]>,
    /// Its services: tag and endpoint.
    services: Vec<(String, String)>,
}

/// `endpoint#id` for a node served at `base`.
fn tagged(base: &str, id: &str) -> String {
    format!("{base}#{id}")
}

impl Domain {
    /// `a`'s data and liveliness endpoints moved to the broker's
    /// `[best effort, reliable, liveliness]` sockets, tagged with its id.
    fn at(a: &Announcement, eps: [&str; 3]) -> Announcement {
        let mut a = a.clone();
        // Reached through this broker: whoever showed it before does not
        // vouch for it here (the host's view sets its own, `Domain::key`).
        a.via = None;
        let id = a.node_id.clone();
        a.data_best_effort = a.data_best_effort.as_ref().map(|_| tagged(eps[0], &id));
        a.data_reliable = a.data_reliable.as_ref().map(|_| tagged(eps[1], &id));
        a.liveliness = a.liveliness.as_ref().map(|_| tagged(eps[2], &id));
        for p in &mut a.publications {
            if p.endpoint.is_some() {
                let i = match p.reliability {
                    crate::model::qos::Reliability::BestEffort => 0,
                    crate::model::qos::Reliability::Reliable => 1,
                };
                p.endpoint = Some(tagged(eps[i], &id));
            }
        }
        a
    }

    fn out(&self) -> [&str; 3] {
        let h = &self.hello;
        [
            h.data_best_effort_out.as_str(),
            h.data_reliable_out.as_str(),
            h.liveliness_out.as_str(),
        ]
    }

    /// Takes in what discovery shows of the domain now, and what the
    /// federation reaches: the nodes the clients are told, the endpoints
    /// the planes connect to, the links they use, the nodes shown to the
    /// domain.
    fn refresh(&mut self, fed: &Federation, tree: &BTreeSet<String>) {
        // The broker's nodes are of this process.
        let my_pid = std::process::id();
        let me = self.host.node_id();
        let domain = self.hello.domain.clone();
        // What the other brokers reach directly: each node with the
        // smallest broker id that lists it (where it enters the
        // federation), and the brokers' own nodes.
        let mut listed: BTreeMap<String, (String, Announcement)> = BTreeMap::new();
        let mut broker_nodes: HashMap<String, String> = HashMap::new();
        for l in fed.others() {
            let Some(d) = l.domains.get(&domain) else {
                continue;
            };
            broker_nodes.insert(d.node_id.clone(), l.broker.clone());
            for a in &d.nodes {
                match listed.get(&a.node_id) {
                    Some((b, _)) if *b <= l.broker => {}
                    _ => {
                        listed.insert(a.node_id.clone(), (l.broker.clone(), a.clone()));
                    }
                }
            }
        }
        let peers = self.host.peers();
        // A client attaching here whose entry in the host's directory
        // another process wrote (a broker of the host it attached to
        // before, frozen and woken, showed it again from attaches it had
        // queued): shown again here, at this broker's sockets, or the
        // host's nodes would follow the other broker's entry, then lose
        // the client when that broker forgets it (and removes its file).
        // A broker the client no longer attaches to does not show it
        // again (it shows a client when an attach changes it).
        // Attaching here: its last attach within two intervals, and half
        // an interval or more after the one before (attaches it queued
        // for a frozen broker come at once when that broker wakes: they
        // do not make the client that broker's).
        let interval = Duration::from_millis(self.hello.attach_interval_ms.max(10));
        let now = Instant::now();
        let attaching = |c: &Client| {
            now.duration_since(c.seen) <= 2 * interval
                && c.previous_seen
                    .is_some_and(|p| c.seen.duration_since(p) >= interval / 2)
        };
        for a in peers.iter().filter(|a| a.pid != my_pid) {
            let Some(c) = self.clients.get(&a.node_id).filter(|c| attaching(c)) else {
                continue;
            };
            let td = self.to_domain.each_ref().map(String::as_str);
            let mut shown = Domain::at(&c.announcement, td);
            shown.via.clone_from(&self.key);
            tracing::info!(node = %a.node_id, other_pid = a.pid, "a client's entry in the host's directory was another process's: shown again at this broker");
            self.host.show(&shown);
        }
        // The brokers of the federation that share this domain's local
        // directory (their nodes are among the peers), with their pid: of
        // them, the one of smallest id brings the domain's peer-to-peer
        // nodes into the federation and shows the federation's nodes to
        // the domain; each shows its own clients.
        let colocated: HashMap<&str, u32> = peers
            .iter()
            .filter_map(|a| Some((broker_nodes.get(&a.node_id)?.as_str(), a.pid)))
            .collect();
        let gateway = !colocated.keys().any(|b| *b < fed.me.as_str());
        let mut others = BTreeMap::new();
        let mut wanted: [BTreeSet<String>; 3] = Default::default();
        let mut table = HashMap::new();
        // Security on: the key each relayed service is reached with.
        let mut servers = HashMap::new();
        let mut direct = Vec::new();
        let local: HashSet<String> = peers.iter().map(|a| a.node_id.clone()).collect();
        // A node that announces an endpoint of its own (not a broker's,
        // tagged) is a peer-to-peer node, whose file in the directory is
        // its own: a connection claiming its id as a client would have
        // the broker overwrite that file, then remove it. (A client another
        // broker of this host served is announced at that broker's tagged
        // endpoints, or at none: it may move here.)
        self.peer_to_peer = peers
            .iter()
            .filter(|a| {
                let own = |e: &str| !e.contains('#');
                a.data_endpoints().any(own)
                    || a.liveliness.as_deref().is_some_and(own)
                    || a.services.iter().any(|s| own(&s.endpoint))
            })
            .map(|a| a.node_id.clone())
            .collect();
        for a in peers {
            // The broker's own node, its clients, and what it announced for
            // a client it no longer serves or for another broker's node (at
            // its own sockets).
            let ours = |e: &String| self.to_domain.iter().any(|t| uplink::untagged(e) == t);
            if a.node_id == me
                || self.clients.contains_key(&a.node_id)
                || a.data_endpoints().any(|e| ours(&e.to_owned()))
                || a.liveliness.as_ref().is_some_and(ours)
                || broker_nodes.contains_key(&a.node_id)
            {
                continue;
            }
            // Security on: only the host's nodes of the broker's own key
            // (its identity: the same principal) are brought in; the
            // broker vouches for their frames to its clients.
            if self.key.is_some() && a.key != self.key {
                continue;
            }
            let brokered = a.data_endpoints().any(|e| e.contains('#'))
                || a.liveliness.as_ref().is_some_and(|e| e.contains('#'));
            // A node another broker serves comes through the federation if
            // that broker is of it; a peer-to-peer node enters the
            // federation at the broker of smallest id that sees it.
            // (a node served by a broker outside the federation is taken in
            // like a peer-to-peer one).
            let in_direct = !(brokered && colocated.values().any(|pid| *pid == a.pid));
            let import =
                in_direct && gateway && listed.get(&a.node_id).is_none_or(|(b, _)| *b > fed.me);
            if import && !a.publications.is_empty() {
                // An inproc endpoint is reached from this process only;
                // a tagged one (another broker's) once per untagged one.
                let inproc = |e: &&String| !e.starts_with("inproc://") || a.pid == my_pid;
                for p in &a.publications {
                    let i = match p.reliability {
                        crate::model::qos::Reliability::BestEffort => 0,
                        crate::model::qos::Reliability::Reliable => 1,
                    };
                    if let Some(ep) = a.publication_endpoint(p).map(str::to_owned) {
                        if inproc(&&ep) {
                            wanted[i].insert(uplink::untagged(&ep).to_owned());
                        }
                    }
                }
                if let Some(ep) = a.liveliness.as_ref().filter(inproc) {
                    wanted[2].insert(uplink::untagged(ep).to_owned());
                }
            }
            let mut told = Domain::at(&a, self.out());
            // Each service is relayed by this broker: to its endpoint, or
            // (one of another broker, `<calls>#<tag>`) to that broker.
            told.services
                .retain(|s| !s.endpoint.starts_with("inproc://") || a.pid == my_pid);
            for s in &mut told.services {
                let tag = service_tag(&a.node_id, &s.endpoint);
                table.insert(tag.clone(), s.endpoint.clone());
                if let (Some(_), Some(k)) = (&self.key, &a.key) {
                    servers.insert(tag.clone(), k.clone());
                }
                s.endpoint = tagged(&self.hello.calls, &tag);
            }
            if in_direct {
                // The federation reaches its services through this broker.
                let mut d = a.clone();
                d.services.clone_from(&told.services);
                direct.push(d);
            }
            others.insert(a.node_id.clone(), told);
        }
        // The nodes registered with this broker (registry mode), not of
        // its host's directory nor known otherwise (a registration cannot
        // stand in for a node of the federation): told to the clients, and
        // their publishers connected to only for what a client asks (a
        // registry may hold thousands of nodes; most of them nobody here
        // wants). They are not brought into the federation. With no
        // client, nobody is told them: nothing to do (a pure registry of
        // thousands costs nothing here).
        let mut registered = HashSet::new();
        if !self.clients.is_empty() && self.key.is_none() {
            self.read_registry();
        }
        let registry_nodes: &[RegistryNode] = if self.clients.is_empty() || self.key.is_some() {
            &[]
        } else {
            &self.registry_nodes
        };
        // Each endpoint is a connection (a file descriptor, libzmq's
        // buffers): a client that asks for everything must not make the
        // broker connect to every publisher of a registry of thousands.
        // Past the most, a node is neither connected to nor told (a
        // client would see a publisher whose samples never come).
        // Those connected before keep their places (the registry's order
        // changes with every registration: a node admitted must not be
        // displaced by another, connections churning and publishers
        // coming and going for the clients), then the others by id.
        let mut connected = 0usize;
        let mut unconnected = 0usize;
        let mut admitted = HashSet::new();
        let was = &self.admitted;
        let order = registry_nodes
            .iter()
            .filter(|r| was.contains(&r.id))
            .chain(registry_nodes.iter().filter(|r| !was.contains(&r.id)));
        for r in order {
            if local.contains(&r.id)
                || self.clients.contains_key(&r.id)
                || listed.contains_key(&r.id)
                || broker_nodes.contains_key(&r.id)
            {
                continue;
            }
            for (tag, ep) in &r.services {
                table.insert(tag.clone(), ep.clone());
            }
            let new = r
                .wanted
                .iter()
                .filter(|(i, ep)| !wanted[*i].contains(ep))
                .count();
            if new > 0 && connected + new > self.max_registered_connected {
                // Told without its publications (none would come), its
                // services still relayed.
                unconnected += 1;
                let mut told = r.told.clone();
                told.publications.clear();
                others.insert(r.id.clone(), told);
                continue;
            }
            if new > 0 {
                admitted.insert(r.id.clone());
            }
            connected += new;
            for (i, ep) in &r.wanted {
                wanted[*i].insert(ep.clone());
            }
            if let Some(id) = r.registered {
                registered.insert(id);
            }
            others.insert(r.id.clone(), r.told.clone());
        }
        self.admitted = admitted;
        if unconnected > 0 && self.registered_unconnected == 0 {
            limited!(warn, domain = %self.hello.domain, unconnected, limit = self.max_registered_connected, "the broker's clients ask for the publishers of more registered nodes than it connects to: those are left out (registered_unconnected)");
        }
        self.registered_unconnected = unconnected;
        // The federation's other nodes: told to the clients at this
        // broker's sockets, and shown to the domain by its gateway.
        let td = self.to_domain.each_ref().map(String::as_str);
        let mut shown = BTreeMap::new();
        for (id, (owner, a)) in &listed {
            if self.clients.contains_key(id) || others.contains_key(id) {
                continue;
            }
            let mut told = Domain::at(a, self.out());
            // Its services are at the calls socket of the broker that
            // lists it: relayed there, straight from this broker.
            told.services.retain(|s| s.endpoint.starts_with("tcp://"));
            for s in &mut told.services {
                let tag = service_tag(id, &s.endpoint);
                table.insert(tag.clone(), s.endpoint.clone());
                if let Some(k) = fed.broker_key(owner) {
                    servers.insert(tag.clone(), k.to_owned());
                }
                s.endpoint = tagged(&self.hello.calls, &tag);
            }
            // A co-located broker shows its own clients.
            if gateway && !colocated.contains_key(owner.as_str()) {
                let mut s = Domain::at(a, td);
                s.via.clone_from(&self.key);
                s.services.clone_from(&told.services);
                shown.insert(id.clone(), s);
            }
            others.insert(id.clone(), told);
        }
        for (id, a) in &shown {
            if self.shown.get(id) != Some(a) {
                self.host.show(a);
            }
        }
        for id in self.shown.keys() {
            if !shown.contains_key(id) && !self.clients.contains_key(id) {
                self.host.hide(id);
            }
        }
        let registered = Arc::new(registered);
        let shown_ids: Arc<HashSet<[u8; 16]>> = Arc::new(
            shown
                .keys()
                .filter_map(|id| milonga_wire::frame::NodeId::from_hex(id).map(|n| n.0))
                .collect(),
        );
        self.shown = shown;
        // The clients' services are at this broker's calls socket already.
        direct.extend(self.clients.values().map(|c| c.announcement.clone()));
        self.direct = direct;
        let mut t = lock(&self.services);
        if t.endpoints != table || t.servers != servers {
            t.endpoints = table;
            t.servers = servers;
            t.generation += 1;
        }
        drop(t);
        for (i, (w, mut set)) in self.wanted.iter().zip(wanted).enumerate() {
            // A publisher no longer taken from the domain (it comes through
            // the federation now, or it left) stays connected for
            // LINK_LINGER: the path that replaces it may not be connected
            // yet (a frame that comes both ways is forwarded once,
            // [`Seen`]).
            let (previous, lingering) = &mut self.lingering[i];
            for ep in previous.iter() {
                if !set.contains(ep) {
                    lingering.entry(ep.clone()).or_insert(now + LINK_LINGER);
                }
            }
            lingering.retain(|ep, until| *until > now && !set.contains(ep));
            previous.clone_from(&set);
            let lingers = !lingering.is_empty();
            set.extend(lingering.keys().cloned());
            let links: BTreeMap<String, Option<String>> = tree
                .iter()
                .map(|p| {
                    let ep = fed.peer_out(p, &domain).map(|e| e[i].clone());
                    (p.clone(), ep.filter(|e| e.starts_with("tcp://")))
                })
                .collect();
            let link_keys: BTreeMap<String, String> = tree
                .iter()
                .filter_map(|p| Some((p.clone(), fed.peer_key(p)?.to_owned())))
                .collect();
            let mut w = lock(w);
            if w.endpoints != set
                || w.links != links
                || w.link_keys != link_keys
                || *w.shown != *shown_ids
                || *w.registered != *registered
                || w.lingering != lingers
            {
                w.endpoints = set;
                w.links = links;
                w.link_keys = link_keys;
                w.shown = shown_ids.clone();
                w.registered = registered.clone();
                w.lingering = lingers;
                w.generation += 1;
            }
        }
        if others != self.others {
            self.others = others;
            self.dirty = true;
        }
    }

    /// Reads the registered nodes again if the table or what the clients
    /// ask changed since the last time (`registry_nodes`).
    fn read_registry(&mut self) {
        let asked = [lock(&self.asked[0]).clone(), lock(&self.asked[1]).clone()];
        let version = self.registry.version();
        // The `Asked` read last are held here, so a new one is another
        // allocation.
        if self.registry_read.as_ref().is_some_and(|(v, a)| {
            *v == version && Arc::ptr_eq(&a[0], &asked[0]) && Arc::ptr_eq(&a[1], &asked[1])
        }) {
            return;
        }
        self.registry_read = Some((version, asked.clone()));
        let me = self.host.node_id();
        // The broker's own sockets, which no registration may name.
        let h = &self.hello;
        let own: HashSet<&str> = self
            .to_domain
            .iter()
            .map(String::as_str)
            .chain([
                h.data_best_effort_in.as_str(),
                h.data_reliable_in.as_str(),
                h.liveliness_in.as_str(),
                h.data_best_effort_out.as_str(),
                h.data_reliable_out.as_str(),
                h.liveliness_out.as_str(),
                h.calls.as_str(),
                h.services_in.as_str(),
            ])
            .collect();
        // Registered nodes are on other hosts (or found here through the
        // local directory too): tcp only, and a registration cannot make
        // the broker connect to a local socket, nor to itself.
        let reachable = |e: &str| e.starts_with("tcp://") && !own.contains(uplink::untagged(e));
        let mut nodes = Vec::new();
        for a in self.registry.registered() {
            let Some(node) = milonga_wire::frame::NodeId::from_hex(&a.node_id) else {
                continue;
            };
            if a.node_id == me || a.domain != h.domain {
                continue;
            }
            let mut wanted = Vec::new();
            for p in &a.publications {
                let i = match p.reliability {
                    crate::model::qos::Reliability::BestEffort => 0,
                    crate::model::qos::Reliability::Reliable => 1,
                };
                if let Some(ep) = a.publication_endpoint(p).filter(|e| reachable(e)) {
                    let ep = uplink::untagged(ep);
                    // A node has a few data sockets: one that names more
                    // is not followed past them.
                    let new = !wanted
                        .iter()
                        .any(|(j, e): &(usize, String)| *j == i && e == ep);
                    if new && wanted.len() < MAX_REGISTERED_ENDPOINTS && asked[i].covers(&p.key) {
                        wanted.push((i, ep.to_owned()));
                    }
                }
            }
            let any = !wanted.is_empty();
            if let Some(ep) = a.liveliness.as_deref().filter(|e| any && reachable(e)) {
                wanted.push((2, uplink::untagged(ep).to_owned()));
            }
            let mut told = Domain::at(a, self.out());
            told.services
                .retain(|s| !s.endpoint.contains('#') && reachable(&s.endpoint));
            let mut services = Vec::new();
            for s in &mut told.services {
                let tag = service_tag(&a.node_id, &s.endpoint);
                services.push((tag.clone(), s.endpoint.clone()));
                s.endpoint = tagged(&self.hello.calls, &tag);
            }
            nodes.push(RegistryNode {
                id: a.node_id.clone(),
                told,
                wanted,
                registered: any.then_some(node.0),
                services,
            });
        }
        // By id: the order in which nodes past `max_registered_connected`
        // are left out, the same at every refresh (the table's own order
        // changes with every registration).
        nodes.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        self.registry_nodes = nodes;
    }

    /// This broker's link XPUBs for `peer` in this domain, once the
    /// three planes have them.
    fn link_out(&self, peer: &str) -> Option<[String; 3]> {
        let get = |i: usize| lock(&self.bound[i]).get(peer).cloned();
        Some([get(0)?, get(1)?, get(2)?])
    }

    /// The view's version and JSON, rebuilt if anything changed.
    fn view(&mut self) -> (u64, bytes::Bytes) {
        if self.dirty {
            self.dirty = false;
            self.view_version += 1;
            // A client is told as it attached, not as another broker of
            // this host announces it. Its clients first: a flood of
            // registered or host nodes cannot push them out.
            let all = self.clients.values().map(|c| &c.announcement).chain(
                self.others
                    .values()
                    .filter(|a| !self.clients.contains_key(&a.node_id)),
            );
            let (v, left_out) = view_of(all, VIEW_LIMIT);
            if left_out > 0 {
                limited!(warn, left_out, limit = VIEW_LIMIT, "the view sent to this broker's clients leaves nodes out: it would pass its limit (clients take messages of at most 64 MiB)");
            }
            self.view = v.into();
        }
        (self.view_version, self.view.clone())
    }

    /// Attaches (or renews) a client, or says why not: its node id is
    /// attached with another client key (another connection claims to be
    /// it), or is a node of the domain that is not a client, or its
    /// announcement would pass [`MAX_CLIENT_BYTES`] (`all_bytes`: its
    /// broker's clients' announcements in all domains; an attached
    /// client stays, with the announcement it had).
    fn attach(
        &mut self,
        a: Announcement,
        report: Option<ClientReport>,
        key: Option<String>,
        all_bytes: usize,
        now: Instant,
    ) -> Result<(), String> {
        if self.clients.get(&a.node_id).is_some_and(|c| c.key != key) {
            return Err(format!(
                "node id {} is attached to this broker with another client key",
                a.node_id
            ));
        }
        if !self.clients.contains_key(&a.node_id)
            && (a.node_id == self.hello.node_id
                || self.peer_to_peer.contains(&a.node_id)
                || self.registry.is_registered(&a.node_id))
        {
            return Err(format!(
                "node id {} is a node of this domain that is not a client (the broker's, a peer-to-peer node of its host, or one registered)",
                a.node_id
            ));
        }
        // At this broker's endpoints, whatever the client last knew (it
        // may have come from another broker). Its services are reached
        // through this broker only, under tags of its own node id: an
        // endpoint that is not such a tag is not shown (it would send
        // every caller elsewhere).
        let mut a = Domain::at(&a, self.out());
        let own = format!("{}/", a.node_id);
        a.services.retain(|s| {
            s.endpoint
                .split_once('#')
                .is_some_and(|(_, tag)| tag.starts_with(&own) && tag.len() > own.len())
        });
        for s in &mut a.services {
            if let Some((_, tag)) = s.endpoint.split_once('#') {
                s.endpoint = tagged(&self.hello.calls, tag);
            }
        }
        let changed = self
            .clients
            .get(&a.node_id)
            .is_none_or(|c| c.announcement != a);
        let bytes = if changed { a.to_json().len() } else { 0 };
        if changed {
            let old = self.clients.get(&a.node_id).map_or(0, |c| c.bytes);
            if all_bytes - old + bytes > MAX_CLIENT_BYTES {
                if let Some(c) = self.clients.get_mut(&a.node_id) {
                    c.seen = now;
                }
                return Err(format!(
                    "this broker holds {} MiB of its clients' announcements, its most ({} MiB)",
                    all_bytes >> 20,
                    MAX_CLIENT_BYTES >> 20
                ));
            }
            let td = self.to_domain.each_ref().map(String::as_str);
            let mut shown = Domain::at(&a, td);
            shown.via.clone_from(&self.key);
            self.host.show(&shown);
            self.dirty = true;
        }
        // The registered nodes see it too (at the same sockets): put again
        // until the table takes it.
        if self.key.is_none() && (changed || !self.registry.holds(&a.node_id)) {
            let td = self.to_domain.each_ref().map(String::as_str);
            if self.registry.hold(&Domain::at(&a, td), now).is_err() {
                limited!(warn, node = %a.node_id, "a broker client is not shown to the registered nodes: the registry holds its most");
            }
        }
        if !self.clients.contains_key(&a.node_id) {
            if let Some(k) = &key {
                lock(&self.services)
                    .keys
                    .insert(a.node_id.clone(), k.clone());
            }
        }
        let c = self
            .clients
            .entry(a.node_id.clone())
            .or_insert_with(|| Client {
                announcement: a.clone(),
                bytes: 0,
                key,
                seen: now,
                previous_seen: None,
                since: now,
                report: None,
                previous: None,
            });
        c.previous_seen = Some(c.seen);
        c.seen = now;
        if changed {
            c.announcement = a;
            self.client_bytes = self.client_bytes - c.bytes + bytes;
            c.bytes = bytes;
        }
        if let Some(mut r) = report {
            r.subscriptions.truncate(256);
            c.previous = c.report.replace((now, r));
        }
        Ok(())
    }

    /// Detaches the client `id` if `key` is the one it attached with;
    /// whether there was such a client (`Err`: it has another key).
    fn detach_keyed(&mut self, id: &str, key: Option<&str>) -> Result<bool, ()> {
        match self.clients.get(id) {
            Some(c) if c.key.as_deref() != key => Err(()),
            Some(_) => Ok(self.detach(id)),
            None => Ok(false),
        }
    }

    fn detach(&mut self, id: &str) -> bool {
        if let Some(c) = self.clients.remove(id) {
            self.client_bytes -= c.bytes;
            lock(&self.services).keys.remove(id);
            self.host.hide(id);
            self.registry.release(id, Instant::now());
            self.dirty = true;
            return true;
        }
        false
    }

    /// Forgets the clients silent for `lease`; how many.
    fn expire(&mut self, now: Instant, lease: Duration) -> usize {
        let gone: Vec<String> = self
            .clients
            .iter()
            .filter(|(_, c)| now.duration_since(c.seen) > lease)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            tracing::info!(node = %id, domain = %self.hello.domain, "a broker client stopped attaching: forgotten");
            self.detach(id);
        }
        gone.len()
    }
}

/// Most bytes of registry pages sent in one turn of the control thread.
const REGISTRY_BUDGET: usize = 8 << 20;

/// How long a domain that could not open is refused before it is tried
/// again.
const FAILED_RETRY: Duration = Duration::from_secs(10);

/// Domains that could not open remembered at most (past that, a failure
/// is still told, but tried again at the next request).
const MAX_FAILED_DOMAINS: usize = 1024;

/// The control thread: answers clients, follows the domains.
struct Control {
    router: zmq::Socket,
    /// The monitor of `router`: failed handshakes and accepts.
    monitor: zmq::Socket,
    domains: Vec<Domain>,
    fed: Federation,
    spec: BrokerSpec,
    counters: Arc<BrokerCounters>,
    stop: Arc<AtomicBool>,
    /// Set when it serves every domain asked for: opens the next.
    open_domain: Option<OpenDomain>,
    /// What opening a domain needs: the context, the listen host, the
    /// endpoints shared with [`Running`].
    ctx: ContextRef,
    host: String,
    hellos: Arc<Mutex<Vec<BrokerHello>>>,
    /// Domains that could not open, with when to try again and why:
    /// requests naming them meanwhile get the same answer at no cost.
    failed: HashMap<String, (Instant, String)>,
}

impl Drop for Control {
    /// Stops the listen socket's monitor before the sockets close (fields
    /// drop after this): libzmq would block on a monitor event that
    /// nobody reads.
    fn drop(&mut self) {
        zmq_io::stop_monitor(&mut self.router);
    }
}

impl Control {
    fn run(mut self) {
        let lease = Duration::from_millis(self.spec.lease_ms);
        let mut next_refresh = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let mut items = vec![
                self.router.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
            ];
            items.extend(self.fed.poll_items());
            let _ = zmq::poll(&mut items, 20);
            let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
            drop(items);
            let now = Instant::now();
            if ready[1] {
                self.count_monitor_events();
            }
            self.counters
                .handshakes_failed
                .fetch_add(self.fed.handshake_failures(), Ordering::Relaxed);
            if let Some(sec) = &self.spec.security {
                // Keys added to or removed from the trust directory count
                // for new connections (at most once a second).
                sec.guard.refresh();
            }
            for _ in 0..BURST {
                let Ok(mut msgs) = recv_all(&self.router) else {
                    break;
                };
                // The key the connection was admitted with (security
                // on) comes with the frames it sent, not the ROUTER's
                // identity frame.
                let user = msgs
                    .get_mut(1)
                    .and_then(|m| m.gets("User-Id"))
                    .map(str::to_owned);
                let frames = msgs.iter().map(|m| m.to_vec()).collect();
                self.serve(frames, user, now);
            }
            self.registry_pages();
            for (i, r) in ready.iter().skip(2).enumerate() {
                if *r {
                    let bad = self.fed.read_dealer(i, now);
                    self.counters
                        .requests_malformed
                        .fetch_add(bad, Ordering::Relaxed);
                }
            }
            if now >= next_refresh {
                next_refresh = now + Duration::from_millis(100);
                self.open_federation_domains();
                self.close_idle_domains(now);
                // The tree of the records held now, for every domain.
                let tree = self.fed.tree_links();
                for d in &mut self.domains {
                    let n = d.expire(now, lease);
                    self.counters
                        .clients_expired
                        .fetch_add(n as u64, Ordering::Relaxed);
                    let n = d.registry.expire(now);
                    self.counters
                        .registry_expired
                        .fetch_add(n as u64, Ordering::Relaxed);
                    d.refresh(&self.fed, &tree);
                }
                let direct = self
                    .domains
                    .iter()
                    .map(|d| {
                        let ld = LsaDomain {
                            node_id: d.hello.node_id.clone(),
                            nodes: d.direct.clone(),
                        };
                        (d.hello.domain.clone(), ld)
                    })
                    .collect();
                let domains = &self.domains;
                self.fed
                    .tick(now, direct, |peer| link_out_all(domains, peer));
                let n: usize = self.domains.iter().map(|d| d.clients.len()).sum();
                self.counters.clients.store(n as u64, Ordering::Relaxed);
                let n: usize = self
                    .domains
                    .iter()
                    .map(|d| d.registry.registered_len())
                    .sum();
                self.counters.registered.store(n as u64, Ordering::Relaxed);
                let n: usize = self.domains.iter().map(|d| d.registered_unconnected).sum();
                self.counters
                    .registered_unconnected
                    .store(n as u64, Ordering::Relaxed);
                self.counters
                    .links
                    .store(self.fed.links_up() as u64, Ordering::Relaxed);
                self.counters
                    .federation_brokers
                    .store(self.fed.known() as u64, Ordering::Relaxed);
                *lock(&self.counters.tree) = tree.into_iter().collect();
            }
        }
        for d in &mut self.domains {
            let ids: Vec<String> = d.clients.keys().cloned().collect();
            for id in ids {
                d.detach(&id);
            }
            for id in std::mem::take(&mut d.shown).into_keys() {
                d.host.hide(&id);
            }
        }
    }

    /// Counts and logs what the listen socket's monitor reported.
    fn count_monitor_events(&mut self) {
        use crate::backend::p2p::control::{ACCEPT_FAILED, HANDSHAKE_FAILED};
        while let Ok(frames) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            let (event, value) = zmq_io::monitor_event(&frames);
            let peer = frames
                .get(1)
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .unwrap_or_default();
            let (counter, what) = if event & HANDSHAKE_FAILED != 0 {
                (
                    &self.counters.handshakes_failed,
                    "dropped a connection to the listen port whose peer does not speak ZMTP correctly, or not within handshake_timeout_ms".to_owned(),
                )
            } else if event & ACCEPT_FAILED != 0 {
                let err = std::io::Error::from_raw_os_error(value as i32);
                (
                    &self.counters.accepts_failed,
                    format!("cannot accept a connection on the listen port: {err}"),
                )
            } else {
                continue;
            };
            let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
            if n <= 10 || n % 1000 == 0 {
                tracing::warn!(endpoint = %peer, so_far = n, "{what}");
            }
        }
    }

    /// The index of `domain` in [`Control::domains`], opened now if this
    /// broker serves every domain asked for; else the error to tell the
    /// client.
    fn domain_index(&mut self, domain: &str) -> Result<usize, String> {
        if let Some(i) = self.domains.iter().position(|d| d.hello.domain == domain) {
            return Ok(i);
        }
        let Some(open) = self.open_domain.as_mut() else {
            let served: Vec<&str> = self
                .domains
                .iter()
                .map(|d| d.hello.domain.as_str())
                .collect();
            return Err(format!(
                "this broker does not serve domain {domain} (it serves {})",
                served.join(", ")
            ));
        };
        if self.domains.len() >= self.spec.max_domains {
            self.counters
                .domains_refused
                .fetch_add(1, Ordering::Relaxed);
            limited!(warn, %domain, max = self.spec.max_domains, "refused to open a domain: this broker serves its most");
            return Err(format!(
                "this broker serves {} domains, its most (--max-domains); not {domain}",
                self.domains.len()
            ));
        }
        let now = Instant::now();
        if let Some((until, why)) = self.failed.get(domain) {
            if now < *until {
                return Err(why.clone());
            }
        }
        // A failure is told, counted and logged once, then remembered for
        // FAILED_RETRY: a client retrying, or a federation record naming
        // the domain every 100 ms, costs nothing more meanwhile.
        let failed = |me: &mut Self, e: String| {
            me.counters.domains_refused.fetch_add(1, Ordering::Relaxed);
            limited!(warn, %domain, error = %e, "could not open a domain a request named");
            let why = format!("this broker cannot serve domain {domain}: {e}");
            if me.failed.len() >= MAX_FAILED_DOMAINS {
                me.failed.retain(|_, (until, _)| *until > now);
            }
            if me.failed.len() < MAX_FAILED_DOMAINS {
                me.failed
                    .insert(domain.to_owned(), (now + FAILED_RETRY, why.clone()));
            }
            why
        };
        let host_of_domain = match open(domain) {
            Ok(h) => h,
            Err(e) => return Err(failed(self, e.to_string())),
        };
        let (mut d, work) = match open_domain_io(
            &self.ctx,
            &self.spec,
            &self.host,
            &self.fed.me,
            &self.counters,
            &self.stop,
            host_of_domain,
        ) {
            Ok(x) => x,
            Err(e) => return Err(failed(self, e.to_string())),
        };
        d.on_request = true;
        for (name, f) in work {
            match spawn_named(name, f) {
                Ok(t) => d.threads.push(t),
                Err(e) => {
                    // Dropping it ends and joins the threads started (the
                    // domain is not tried again for FAILED_RETRY).
                    drop(d);
                    return Err(failed(self, e.to_string()));
                }
            }
        }
        self.failed.remove(domain);
        lock(&self.hellos).push(d.hello.clone());
        tracing::info!(%domain, "serving a domain a request named");
        self.domains.push(d);
        self.counters
            .domains
            .store(self.domains.len() as u64, Ordering::Relaxed);
        Ok(self.domains.len() - 1)
    }

    /// A broker serving every domain opens the domains its federation's
    /// other brokers serve, so that it carries them between its links.
    fn open_federation_domains(&mut self) {
        if self.open_domain.is_none() {
            return;
        }
        for d in self.named_by_federation() {
            if self.domains.len() >= self.spec.max_domains {
                break;
            }
            let _ = self.domain_index(&d);
        }
    }

    /// The domains in which another broker of the federation reaches a
    /// node (a client, or a peer-to-peer node it sees): those worth
    /// carrying. A broker lists every domain it has open, so counting the
    /// empty ones would have brokers serving every domain keep each
    /// other's idle domains open for good.
    fn named_by_federation(&self) -> BTreeSet<String> {
        self.fed
            .others()
            .flat_map(|l| {
                l.domains
                    .iter()
                    .filter(|(_, d)| !d.nodes.is_empty())
                    .map(|(name, _)| name.clone())
            })
            .collect()
    }

    /// Closes the domains opened on request that have had no client, no
    /// registered node and no federated broker naming them for
    /// `spec.domain_idle`, so that names made up, or no longer used, do
    /// not keep their slots (`--max-domains`) until the broker stops. A
    /// request naming one again opens it again.
    fn close_idle_domains(&mut self, now: Instant) {
        if self.open_domain.is_none() {
            return;
        }
        let named = self.named_by_federation();
        let idle = self.spec.domain_idle;
        let mut closing = Vec::new();
        for (i, d) in self.domains.iter_mut().enumerate() {
            let busy = !d.on_request
                || !d.clients.is_empty()
                || d.registry.registered_len() > 0
                || named.contains(&d.hello.domain);
            if busy {
                d.idle_since = None;
                continue;
            }
            let since = *d.idle_since.get_or_insert(now);
            if now.duration_since(since) >= idle {
                closing.push(i);
            }
        }
        for i in closing.into_iter().rev() {
            let mut d = self.domains.remove(i);
            for id in std::mem::take(&mut d.shown).into_keys() {
                d.host.hide(&id);
            }
            lock(&self.hellos).retain(|h| h.domain != d.hello.domain);
            tracing::info!(domain = %d.hello.domain, idle_ms = idle.as_millis() as u64, "closed a domain without clients");
            // Its threads end, then its node closes.
            drop(d);
            self.counters.domains_closed.fetch_add(1, Ordering::Relaxed);
        }
        self.counters
            .domains
            .store(self.domains.len() as u64, Ordering::Relaxed);
    }

    /// Sends the registry pages due, at most [`REGISTRY_BUDGET`] bytes a
    /// turn over all domains (a thousand nodes joining at once must not
    /// queue a gigabyte of pages).
    fn registry_pages(&mut self) {
        let mut left = REGISTRY_BUDGET;
        let now = Instant::now();
        for d in &mut self.domains {
            for (who, frames) in d.registry.pages(left, now) {
                left = left.saturating_sub(frames.iter().map(Vec::len).sum());
                let mut msg: Vec<&[u8]> = vec![&who];
                msg.extend(frames.iter().map(Vec::as_slice));
                // Dropped on a full queue: the node's next renewal says what
                // it holds, and the page goes again.
                if self.router.send_multipart(msg, zmq::DONTWAIT).is_err() {
                    self.counters
                        .replies_dropped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// With security on, why a request of the connection admitted with
    /// `user` is refused: an attach must name a node id its key gives
    /// and be sent with that key; a broker (`peer`) or a registry
    /// request is not served with security on in this version.
    fn refused(&self, req: &BrokerRequest, user: Option<&str>) -> Option<String> {
        self.spec.security.as_ref()?;
        match req {
            BrokerRequest::Attach { announcement, .. } => {
                if announcement.key.as_deref() != user {
                    return Some(format!(
                        "node {} announces a key that is not its connection's (security on: a client attaches under its own key)",
                        announcement.node_id
                    ));
                }
                crate::backend::p2p::curve::attributed(announcement).err()
            }
            BrokerRequest::Register {
                header,
                announcement,
            } => {
                // A node registers and renews only itself, under its own
                // key (as a client attaches).
                if let Some(json) = announcement {
                    let a = Announcement::from_json(json).map_err(|e| e.to_string());
                    let a = match a {
                        Ok(a) => a,
                        Err(e) => return Some(e),
                    };
                    if a.node_id != header.node_id || a.key.as_deref() != user {
                        return Some(format!(
                            "node {} registers an announcement of another node or key (security on: a node registers under its own key)",
                            header.node_id
                        ));
                    }
                    return crate::backend::p2p::curve::attributed(&a).err();
                }
                self.registered_by_another(&header.domain, &header.node_id, user)
            }
            BrokerRequest::Unregister { domain, node_id } => {
                self.registered_by_another(domain, node_id, user)
            }
            BrokerRequest::Peer { header, .. } => (!self.fed.designated(user)).then(|| {
                format!(
                    "broker {} links with a key this broker does not name as a peer broker (security on: each of two linked brokers names the other's key, or both hold one identity)",
                    header.broker
                )
            }),
            _ => None,
        }
    }

    /// Security on: why a `register` without an announcement, or an
    /// `unregister`, of node `id` in `domain` that came with key `user` is
    /// refused: that node registered under another key (a trusted node
    /// could otherwise keep a dead node registered, or remove a live one).
    fn registered_by_another(&self, domain: &str, id: &str, user: Option<&str>) -> Option<String> {
        let d = self.domains.iter().find(|d| d.hello.domain == domain)?;
        let key = d.registry.key_of(id)?;
        (key != user).then(|| {
            format!("node {id} is registered under another key (security on: a node renews and removes only itself)")
        })
    }

    /// Security on: notes that node `a` attached with its key, so that
    /// the planes forward its frames from connections of that key. Past
    /// twice the most clients, the node ids no longer attached are
    /// forgotten.
    fn note_key(&self, a: &Announcement) {
        let Some(sec) = &self.spec.security else {
            return;
        };
        let (Some(id), Some(k)) = (milonga_wire::NodeId::from_hex(&a.node_id), &a.key) else {
            return;
        };
        let mut keys = sec.keys.write().unwrap_or_else(|e| e.into_inner());
        if keys.len() >= 2 * self.spec.max_clients.max(1024) {
            let attached: HashSet<[u8; 16]> = self
                .domains
                .iter()
                .flat_map(|d| d.clients.keys())
                .filter_map(|id| milonga_wire::NodeId::from_hex(id))
                .map(|id| id.0)
                .collect();
            keys.retain(|id, _| attached.contains(id));
        }
        keys.insert(id.0, k.as_str().into());
    }

    fn serve(&mut self, frames: Vec<Vec<u8>>, user: Option<String>, now: Instant) {
        let Some((who, rest)) = frames.split_first() else {
            return;
        };
        let counters = self.counters.clone();
        let reply = |router: &mut zmq::Socket, parts: &[&[u8]]| {
            send_reply(router, &counters, who, parts, None);
        };
        let req = match BrokerRequest::decode(rest) {
            Ok(r) => r,
            Err(err) => {
                let n = self
                    .counters
                    .requests_malformed
                    .fetch_add(1, Ordering::Relaxed)
                    + 1;
                if n <= 10 || n % 1000 == 0 {
                    tracing::warn!(dropped_so_far = n, %err, "dropped a malformed broker request");
                }
                return;
            }
        };
        if let Some(text) = self.refused(&req, user.as_deref()) {
            let n = self
                .counters
                .requests_refused
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            log_drop(n, "a request", &text);
            reply(
                &mut self.router,
                &[wire::MAGIC, wire::ERROR, text.as_bytes()],
            );
            return;
        }
        match req {
            BrokerRequest::Hello { domain } => match self.domain_index(&domain) {
                Ok(i) => {
                    let body = serde_json::to_vec(&self.domains[i].hello).unwrap_or_default();
                    reply(&mut self.router, &[wire::MAGIC, wire::HELLO, &body]);
                }
                Err(text) => reply(
                    &mut self.router,
                    &[wire::MAGIC, wire::ERROR, text.as_bytes()],
                ),
            },
            BrokerRequest::Clients { domain } => {
                let infos: Vec<ClientInfo> = self
                    .domains
                    .iter()
                    .filter(|d| d.hello.domain == domain)
                    .flat_map(|d| d.clients.values().map(|c| c.info(now)))
                    .collect();
                let body = serde_json::to_vec(&infos).unwrap_or_default();
                reply(&mut self.router, &[wire::MAGIC, wire::CLIENTS, &body]);
            }
            BrokerRequest::Attach {
                announcement,
                view,
                report,
                key,
            } => {
                // Security on: the node id is its connection's key's
                // (checked in `refused`), whose frames it may send.
                self.note_key(&announcement);
                let total: usize = self.domains.iter().map(|d| d.clients.len()).sum();
                let all_bytes: usize = self.domains.iter().map(|d| d.client_bytes).sum();
                let d = match self.domain_index(&announcement.domain) {
                    Ok(i) => &mut self.domains[i],
                    Err(text) => {
                        reply(
                            &mut self.router,
                            &[wire::MAGIC, wire::ERROR, text.as_bytes()],
                        );
                        return;
                    }
                };
                if total >= self.spec.max_clients && !d.clients.contains_key(&announcement.node_id)
                {
                    self.counters
                        .clients_refused
                        .fetch_add(1, Ordering::Relaxed);
                    let text = format!("this broker serves {total} clients, its most");
                    reply(
                        &mut self.router,
                        &[wire::MAGIC, wire::ERROR, text.as_bytes()],
                    );
                    return;
                }
                // A client this broker does not hold (new, back after its
                // lease, or come from another broker, whose versions are
                // its own) gets the whole view, whatever version it names.
                let first = !d.clients.contains_key(&announcement.node_id);
                if let Err(text) = d.attach(*announcement, report, key, all_bytes, now) {
                    let n = self
                        .counters
                        .requests_refused
                        .fetch_add(1, Ordering::Relaxed)
                        + 1;
                    log_drop(n, "an attach", &text);
                    reply(
                        &mut self.router,
                        &[wire::MAGIC, wire::ERROR, text.as_bytes()],
                    );
                    return;
                }
                let (version, body) = d.view();
                let v = version.to_string();
                if version == view && !first {
                    reply(&mut self.router, &[wire::MAGIC, wire::SAME, v.as_bytes()]);
                } else {
                    send_reply(
                        &mut self.router,
                        &counters,
                        who,
                        &[wire::MAGIC, wire::VIEW, v.as_bytes()],
                        Some(body),
                    );
                }
            }
            BrokerRequest::Detach { node_id, key } => {
                for d in &mut self.domains {
                    if d.detach_keyed(&node_id, key.as_deref()).is_err() {
                        let n = self
                            .counters
                            .requests_refused
                            .fetch_add(1, Ordering::Relaxed)
                            + 1;
                        let why = format!("node {node_id} is attached with another client key");
                        log_drop(n, "a detach", &why);
                    }
                }
            }
            BrokerRequest::Register {
                header,
                announcement,
            } => {
                let total = self.domains.iter().fold((0, 0), |(n, b), d| {
                    (n + d.registry.len(), b + d.registry.bytes())
                });
                let d = match self.domain_index(&header.domain) {
                    Ok(i) => &mut self.domains[i],
                    Err(text) => {
                        reply(
                            &mut self.router,
                            &[wire::MAGIC, wire::ERROR, text.as_bytes()],
                        );
                        return;
                    }
                };
                let registered = d
                    .registry
                    .register_in(who, &header, announcement, total, now);
                let text = match registered {
                    Ok(true) => return,
                    Ok(false) => {
                        reply(&mut self.router, &[wire::MAGIC, wire::ANNOUNCE]);
                        return;
                    }
                    Err(Refused::Full) => {
                        limited!(warn, node = %header.node_id, "refused a registration: the registry holds its most nodes or bytes");
                        format!(
                            "this registry holds {} nodes and {} bytes of announcements, its most (20,000 nodes, 256 MiB)",
                            total.0, total.1
                        )
                    }
                    Err(Refused::Taken) => {
                        limited!(warn, node = %header.node_id, "refused a registration: the node id is a client's of this broker");
                        format!("node id {} is a client's of this broker", header.node_id)
                    }
                };
                self.counters
                    .registry_refused
                    .fetch_add(1, Ordering::Relaxed);
                reply(
                    &mut self.router,
                    &[wire::MAGIC, wire::ERROR, text.as_bytes()],
                );
            }
            BrokerRequest::Unregister { domain, node_id } => {
                for d in self.domains.iter_mut().filter(|d| d.hello.domain == domain) {
                    d.registry.unregister(&node_id, now);
                }
            }
            BrokerRequest::Peer { header, lsas } => {
                let peer = header.broker.clone();
                if !self.fed.take(header, lsas, now, user) {
                    return;
                }
                let out = link_out_all(&self.domains, &peer);
                let (msg, told) = self.fed.message_for(Some(&peer), &out);
                let mut parts: Vec<&[u8]> = vec![who];
                parts.extend(msg.iter().map(Vec::as_slice));
                if self.router.send_multipart(parts, zmq::DONTWAIT).is_ok() {
                    self.fed.told(&peer, told);
                } else {
                    self.counters
                        .replies_dropped
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Most answers queued for one connection to the listen port: a peer
/// that asks and never reads holds at most this many (a view each is
/// shared, not copied), and the rest are dropped and counted
/// (`replies_dropped`).
const CONTROL_HWM: i32 = 16;

/// Sends the answer `[who, parts..., body]` without waiting, the body (a
/// view) shared rather than copied; counted in `replies_dropped` when
/// the connection's queue is full or the peer is gone.
fn send_reply(
    router: &mut zmq::Socket,
    counters: &BrokerCounters,
    who: &[u8],
    parts: &[&[u8]],
    body: Option<bytes::Bytes>,
) {
    let has_body = body.is_some();
    let send = || -> zmq::Result<()> {
        router.send(who, zmq::SNDMORE | zmq::DONTWAIT)?;
        for (i, p) in parts.iter().enumerate() {
            let more = if i + 1 < parts.len() || has_body {
                zmq::SNDMORE
            } else {
                0
            };
            router.send(*p, more | zmq::DONTWAIT)?;
        }
        if let Some(b) = body {
            zmq_io::send_bytes(router, b, zmq::DONTWAIT)?;
        }
        Ok(())
    };
    if send().is_err() {
        counters.replies_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// This broker's link XPUBs for `peer`, by domain.
fn link_out_all(domains: &[Domain], peer: &str) -> BTreeMap<String, [String; 3]> {
    domains
        .iter()
        .filter_map(|d| Some((d.hello.domain.clone(), d.link_out(peer)?)))
        .collect()
}

/// A domain's sockets, opened, and its threads' work, to be started
/// under these names.
type DomainThreads = Vec<(String, Box<dyn FnOnce() + Send>)>;

/// Opens the sockets of one domain (three planes and the calls relay):
/// its [`Domain`] for the control thread, and the work of its threads.
fn open_domain_io(
    ctx: &ContextRef,
    spec: &BrokerSpec,
    host: &str,
    broker_id: &str,
    counters: &Arc<BrokerCounters>,
    stop: &Arc<AtomicBool>,
    host_of_domain: Box<dyn DomainHost>,
) -> Result<(Domain, DomainThreads), OpenError> {
    let domain = host_of_domain.domain().to_owned();
    let stop = &Stop {
        broker: stop.clone(),
        domain: Arc::new(AtomicBool::new(false)),
    };
    let mut threads: DomainThreads = Vec::new();
    let mut eps: Vec<[String; 3]> = Vec::new();
    let mut wanted = Vec::new();
    let mut asked = Vec::new();
    let mut bound = Vec::new();
    for plane in [Plane::BestEffort, Plane::Reliable, Plane::Liveliness] {
        let (mut io, e) = PlaneIo::open(ctx, spec, host, plane, counters, stop)?;
        io.me = broker_id[..8].to_owned();
        wanted.push(io.wanted.clone());
        asked.push(io.asked.clone());
        bound.push(io.bound.clone());
        eps.push(e);
        let name = format!("milonga-broker-{:?} {domain}", io.plane).to_lowercase();
        threads.push((name, Box::new(move || io.run())));
    }
    let (mut calls, [calls_ep, services_ep]) = CallPlane::open(ctx, spec, host, counters, stop)?;
    calls.me = broker_id.to_owned();
    let services = calls.table.clone();
    threads.push((
        format!("milonga-broker-calls {domain}"),
        Box::new(move || calls.run()),
    ));
    let hello = BrokerHello {
        domain,
        node_id: host_of_domain.node_id(),
        data_best_effort_in: eps[0][0].clone(),
        data_reliable_in: eps[1][0].clone(),
        liveliness_in: eps[2][0].clone(),
        data_best_effort_out: eps[0][1].clone(),
        data_reliable_out: eps[1][1].clone(),
        liveliness_out: eps[2][1].clone(),
        calls: calls_ep,
        services_in: services_ep,
        attach_interval_ms: spec.attach_interval_ms,
        lease_ms: spec.lease_ms,
    };
    let [w0, w1, w2]: [Arc<Mutex<Wanted>>; 3] = wanted
        .try_into()
        .unwrap_or_else(|_| unreachable!("three planes"));
    let [b0, b1, b2]: [Arc<Mutex<BTreeMap<String, String>>>; 3] = bound
        .try_into()
        .unwrap_or_else(|_| unreachable!("three planes"));
    let [a0, a1, _]: [Arc<Mutex<Arc<Asked>>>; 3] = asked
        .try_into()
        .unwrap_or_else(|_| unreachable!("three planes"));
    let d = Domain {
        host: host_of_domain,
        hello,
        to_domain: [eps[0][2].clone(), eps[1][2].clone(), eps[2][2].clone()],
        wanted: [w0, w1, w2],
        asked: [a0, a1],
        bound: [b0, b1, b2],
        shown: BTreeMap::new(),
        direct: Vec::new(),
        lingering: Default::default(),
        services,
        clients: HashMap::new(),
        client_bytes: 0,
        others: BTreeMap::new(),
        peer_to_peer: HashSet::new(),
        view_version: 0,
        view: bytes::Bytes::new(),
        dirty: true,
        registry: Table::new(Duration::from_millis(spec.lease_ms)),
        key: spec
            .security
            .as_ref()
            .map(|s| s.guard.identity.public().to_z85()),
        registry_nodes: Vec::new(),
        registered_unconnected: 0,
        max_registered_connected: spec.max_registered_connected,
        admitted: HashSet::new(),
        registry_read: None,
        closed: stop.domain.clone(),
        threads: Vec::new(),
        on_request: false,
        idle_since: None,
    };
    Ok((d, threads))
}

/// A monitor of the broker's listen socket: failed handshakes and
/// accepts. (Its other sockets, a domain's, are not watched: a monitor
/// takes two of libzmq's 1,023 sockets a process, and a domain already
/// takes about thirty; libzmq closes a bad connection to them all the same.)
fn listen_monitor(ctx: &ContextRef, router: &mut zmq::Socket) -> Result<zmq::Socket, OpenError> {
    use crate::backend::p2p::control::{ACCEPT_FAILED, HANDSHAKE_FAILED};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ep = format!(
        "inproc://milonga-broker-mon-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let err = sock_err(&ep);
    router
        .monitor(&ep, HANDSHAKE_FAILED | ACCEPT_FAILED)
        .map_err(&err)?;
    let reader = || -> Result<zmq::Socket, OpenError> {
        let pair = ctx.socket(zmq::PAIR)?;
        pair.set_linger(0).map_err(&err)?;
        zmq_io::unbounded_monitor_queue(&pair).map_err(&err)?;
        pair.connect(&ep).map_err(&err)?;
        Ok(pair)
    };
    reader().inspect_err(|_| zmq_io::stop_monitor(router))
}

fn spawn_named(name: String, f: Box<dyn FnOnce() + Send>) -> Result<JoinHandle<()>, OpenError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(OpenError::Thread)
}

/// Starts a broker serving `domains`, and with `open_domain` every other
/// domain a request names (at most `spec.max_domains` in all).
pub(crate) fn start(
    spec: BrokerSpec,
    domains: Vec<Box<dyn DomainHost>>,
    open_domain: Option<OpenDomain>,
) -> Result<Running, OpenError> {
    let ctx = ContextRef::acquire();
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(BrokerCounters::default());
    let host = host_of(&spec.listen)
        .ok_or_else(|| OpenError::Config {
            key: "listen".into(),
            why: format!("{}: expected tcp://HOST:PORT", spec.listen),
        })?
        .to_owned();
    if spec.security.is_some() {
        // The handler that admits the trusted keys (RFC 27).
        ctx.ensure_zap()?;
    }
    let mut router = ctx.socket(zmq::ROUTER)?;
    let listen_ep = spec.listen.clone();
    let err = sock_err(&listen_ep);
    zmq_io::apply_common(&router, &spec.cfg).map_err(&err)?;
    zmq_io::apply_leased(&mut router, &spec.cfg).map_err(&err)?;
    router
        .set_maxmsgsize(wire::MAX_REQUEST_BYTES as i64)
        .map_err(&err)?;
    // A full connection's answer fails (counted) rather than being
    // dropped unseen, and a connection queues few.
    router.set_router_mandatory(true).map_err(&err)?;
    router.set_sndhwm(CONTROL_HWM).map_err(&err)?;
    // And reads few ahead from each: a peer that sends requests faster
    // than they are answered is held back (its connection is not read)
    // rather than queued here, a thousand of up to a few MiB each.
    router.set_rcvhwm(CONTROL_HWM).map_err(&err)?;
    router.set_ipv6(host.starts_with('[')).map_err(&err)?;
    secure(&spec, &mut router, &listen_ep)?;
    let listen = zmq_io::bind(&router, &spec.listen)?;
    let broker_id = crate::backend::p2p::federation::new_id()?;
    let mut work: DomainThreads = Vec::new();
    let mut ds = Vec::new();
    let mut hellos = Vec::new();
    for host_of_domain in domains {
        let (d, t) = open_domain_io(
            &ctx,
            &spec,
            &host,
            &broker_id,
            &counters,
            &stop,
            host_of_domain,
        )?;
        hellos.push(d.hello.clone());
        ds.push(d);
        work.extend(t);
    }
    counters.domains.store(ds.len() as u64, Ordering::Relaxed);
    let hellos = Arc::new(Mutex::new(hellos));
    let mut running = Running {
        stop: stop.clone(),
        threads: Vec::new(),
        listen,
        counters: counters.clone(),
        hellos: hellos.clone(),
        broker_id: String::new(),
        security: spec.security.clone(),
    };
    let mut threads = Vec::new();
    for (name, f) in work {
        threads.push(spawn_named(name, f)?);
    }
    let fed = Federation::new(
        broker_id,
        &running.listen,
        &spec.peers,
        &spec.cfg,
        Duration::from_millis(spec.lease_ms),
        Duration::from_millis(spec.attach_interval_ms),
        spec.security.as_ref().map(|s| &*s.guard),
    )?;
    running.broker_id = fed.me.clone();
    // Last before the control thread: from here `Control`'s drop stops
    // the monitor, whatever ends it.
    let monitor = listen_monitor(&ctx, &mut router)?;
    let control = Control {
        router,
        monitor,
        domains: ds,
        fed,
        spec,
        counters,
        stop,
        open_domain,
        ctx,
        host,
        hellos,
        failed: HashMap::new(),
    };
    threads.push(spawn_named(
        "milonga-broker".into(),
        Box::new(move || control.run()),
    )?);
    running.threads = threads;
    Ok(running)
}

/// Most bytes of its clients' announcements a broker holds, over all its
/// domains (10,000 clients of 256 KiB each would be 2.5 GiB, and as many
/// files in its host's runtime directory); an attach past it is refused.
const MAX_CLIENT_BYTES: usize = 256 << 20;

/// Most DEALERs the calls relay holds to peer-to-peer services (and other
/// brokers' calls sockets) at once.
const MAX_RELAY_DEALERS: usize = 256;

/// How long a relay DEALER must have carried no call and no reply before
/// it may be closed for another.
const RELAY_IDLE: Duration = Duration::from_secs(10);

/// Where the calls plane relays a call to a peer-to-peer service: by
/// its tag (`<node id>/e<hash of its endpoint>`), its endpoint.
#[derive(Default)]
struct ServiceTable {
    generation: u64,
    endpoints: HashMap<String, String>,
    /// Security on: the key (Z85) each relayed service is reached with, by
    /// tag: another broker's service, that broker's (its record's); a host
    /// node's, the node's.
    servers: HashMap<String, String>,
    /// The client key of each client that attached with one, by node
    /// id: its services' identities at `services` end with it.
    keys: HashMap<String, String>,
}

/// The tag of a peer-to-peer service at `endpoint` of node `id`.
fn service_tag(id: &str, endpoint: &str) -> String {
    format!("{id}/e{:016x}", crate::util::fnv1a64(endpoint.as_bytes()))
}

/// One domain's calls: callers' DEALERs connect to `calls` with an
/// identity `<tag>|<n>`; a call for a client's service goes to its
/// ROUTER, connected to `services` with the identity `<tag>`; one for a
/// peer-to-peer service goes out on a DEALER to it. Each request gets an
/// envelope naming its caller, which the server sends back with the
/// reply (docs/protocol.md §4.5).
struct CallPlane {
    /// Its broker's id: its DEALERs to another broker's calls socket name
    /// themselves `<tag>|<id>`.
    me: String,
    calls: zmq::Socket,
    services: zmq::Socket,
    /// DEALERs to peer-to-peer services, by tag: at most
    /// [`MAX_RELAY_DEALERS`], the least recently used closed for a new one.
    out: HashMap<String, zmq::Socket>,
    /// When each DEALER of `out` last relayed a call.
    used: HashMap<String, Instant>,
    /// The key each DEALER of `out` reached its server with (security on).
    out_keys: HashMap<String, String>,
    /// With security on: the broker's identity, which its DEALERs to
    /// other brokers' calls sockets present.
    security: Option<BrokerSecurity>,
    table: Arc<Mutex<ServiceTable>>,
    applied: u64,
    cfg: Config,
    counters: Arc<BrokerCounters>,
    stop: Stop,
    // Declared last: the sockets above close before the context goes.
    ctx: ContextRef,
}

impl CallPlane {
    fn open(
        ctx: &ContextRef,
        spec: &BrokerSpec,
        host: &str,
        counters: &Arc<BrokerCounters>,
        stop: &Stop,
    ) -> Result<(CallPlane, [String; 2]), OpenError> {
        let ep = format!("tcp://{host}:*");
        let err = sock_err(&ep);
        let router = || -> Result<zmq::Socket, OpenError> {
            let s = ctx.socket(zmq::ROUTER)?;
            zmq_io::apply_common(&s, &spec.cfg).map_err(&err)?;
            s.set_ipv6(host.starts_with('[')).map_err(&err)?;
            // An unknown or gone identity is an error, not a silent drop.
            s.set_router_mandatory(true).map_err(&err)?;
            // A service or caller that reconnects before its old
            // connection is gone takes its identity over.
            s.set_router_handover(true).map_err(&err)?;
            Ok(s)
        };
        let mut calls = router()?;
        let mut services = router()?;
        secure(spec, &mut calls, &ep)?;
        secure(spec, &mut services, &ep)?;
        let c = zmq_io::bind(&calls, &ep)?;
        let s = zmq_io::bind(&services, &ep)?;
        Ok((
            CallPlane {
                me: String::new(),
                calls,
                services,
                out: HashMap::new(),
                used: HashMap::new(),
                out_keys: HashMap::new(),
                security: spec.security.clone(),
                table: Arc::new(Mutex::new(ServiceTable::default())),
                applied: 0,
                cfg: spec.cfg.clone(),
                counters: counters.clone(),
                stop: stop.clone(),
                ctx: ContextRef::acquire(),
            },
            [c, s],
        ))
    }

    fn run(mut self) {
        while !self.stop.now() {
            self.reconcile();
            let tags: Vec<String> = self.out.keys().cloned().collect();
            let mut items = vec![
                self.calls.as_poll_item(zmq::POLLIN),
                self.services.as_poll_item(zmq::POLLIN),
            ];
            items.extend(tags.iter().map(|t| self.out[t].as_poll_item(zmq::POLLIN)));
            if !matches!(zmq::poll(&mut items, 50), Ok(n) if n > 0) {
                continue;
            }
            let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
            drop(items);
            if ready[0] {
                self.requests();
            }
            if ready[1] {
                for _ in 0..BURST {
                    let Ok(mut frames) = recv_all(&self.services) else {
                        break;
                    };
                    // [server, envelope, reply...]
                    frames.remove(0);
                    self.reply(frames);
                }
            }
            for (tag, r) in tags.iter().zip(&ready[2..]) {
                if !r {
                    continue;
                }
                for _ in 0..BURST {
                    let Some(Ok(frames)) = self.out.get(tag).map(recv_all) else {
                        break;
                    };
                    if let Some(t) = self.used.get_mut(tag) {
                        *t = Instant::now();
                    }
                    self.reply(frames);
                }
            }
        }
    }

    /// Drops the DEALERs of services no longer announced.
    fn reconcile(&mut self) {
        let t = lock(&self.table);
        if t.generation == self.applied {
            return;
        }
        self.applied = t.generation;
        // A service gone, or at a broker of another key now.
        let keys = &mut self.out_keys;
        self.out
            .retain(|tag, _| t.endpoints.contains_key(tag) && t.servers.get(tag) == keys.get(tag));
        keys.retain(|tag, _| self.out.contains_key(tag));
        let out = &self.out;
        self.used.retain(|tag, _| out.contains_key(tag));
    }

    /// Relays what callers sent: `[caller, request...]`.
    fn requests(&mut self) {
        for _ in 0..BURST {
            let Ok(mut frames) = recv_all(&self.calls) else {
                return;
            };
            // [caller, request (1 or 2 frames)], or from another broker
            // [caller, its envelope, request].
            let relayed = frames.get(1).is_some_and(|f| f.starts_with(ENVELOPE));
            let request = frames.len() - 1 - usize::from(relayed);
            // An identity with a NUL could not be told from a nested
            // envelope's (below).
            if !(1..=2).contains(&request) || frames[0].contains(&0) {
                self.counters
                    .requests_malformed
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let caller = frames.remove(0);
            let mut envelope = ENVELOPE.to_vec();
            envelope.extend_from_slice(&caller);
            if relayed {
                // Ours names the broker that relayed it, then a NUL, then
                // the envelope it put (which names its caller).
                envelope.push(0);
                envelope.extend_from_slice(&frames.remove(0));
            }
            let tag = caller.split(|b| *b == b'|').next().unwrap_or_default();
            let tag = String::from_utf8_lossy(tag).into_owned();
            if envelope.len() > crate::backend::p2p::serve_link::MAX_ENVELOPE {
                self.counters
                    .requests_malformed
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let mut msg = vec![zmq::Message::from(&envelope[..])];
            msg.extend(frames);
            let sent = if tag
                .rsplit_once('/')
                .is_some_and(|(_, n)| n.starts_with('s'))
            {
                // A client's service: its ROUTER is connected here, with
                // the tag and its client's key as identity (the tag alone
                // for a client that attached without a key).
                let node = tag.split('/').next().unwrap_or_default();
                let identity = match lock(&self.table).keys.get(node) {
                    Some(key) => format!("{tag}/{key}"),
                    None => tag.clone(),
                };
                let mut with_id = vec![zmq::Message::from(identity.as_bytes())];
                with_id.extend(msg);
                send_all_checked(&self.services, with_id)
            } else {
                let sent = match self.dealer(&tag) {
                    Some(d) => send_all_checked(d, msg),
                    None => false,
                };
                if let Some(t) = self.used.get_mut(&tag) {
                    *t = Instant::now();
                }
                sent
            };
            if !sent {
                self.counters
                    .calls_unroutable
                    .fetch_add(1, Ordering::Relaxed);
                limited!(info, service = %tag, "a call for a service the broker cannot reach now: not relayed (the caller's deadline ends it)");
            }
        }
    }

    /// The DEALER to the peer-to-peer service tagged `tag`, connected on
    /// first use.
    fn dealer(&mut self, tag: &str) -> Option<&zmq::Socket> {
        if !self.out.contains_key(tag) {
            let (endpoint, key) = {
                let t = lock(&self.table);
                (t.endpoints.get(tag).cloned()?, t.servers.get(tag).cloned())
            };
            if self.security.is_some() && key.is_none() {
                // Its key not known yet: not reachable now.
                return None;
            }
            // Each DEALER is a socket of the process (libzmq has 1,023)
            // and a connection: a client calling ever new services (a
            // registered node can announce thousands) must not take them
            // all. Past the most, the one used least recently goes, if
            // no call or reply crossed it for RELAY_IDLE (a reply still
            // due on it would be lost); else this call is not relayed
            // (counted). Chosen before, closed once the new one is made.
            let evict = if self.out.len() >= MAX_RELAY_DEALERS {
                let now = Instant::now();
                Some(
                    self.used
                        .iter()
                        .min_by_key(|(_, t)| **t)
                        .filter(|(_, t)| now.duration_since(**t) >= RELAY_IDLE)
                        .map(|(tag, _)| tag.clone())?,
                )
            } else {
                None
            };
            let s = self.ctx.socket(zmq::DEALER).ok()?;
            zmq_io::apply_common(&s, &self.cfg).ok()?;
            s.set_ipv6(true).ok()?;
            if let Some(sec) = &self.security {
                // Another broker's calls socket (the key its record tells)
                // or a host node's service (its key); none known yet: not
                // reachable now.
                let key = crate::backend::p2p::curve::PublicKey::from_z85(key.as_deref()?).ok()?;
                crate::backend::p2p::curve::ClientKeys::new(&sec.guard.identity, key)
                    .apply(&s)
                    .ok()?;
            }
            // Another broker's service: its calls socket, as a caller of
            // that tag (§11.4).
            let endpoint = match endpoint.split_once('#') {
                Some((base, theirs)) => {
                    s.set_identity(format!("{theirs}|{}", self.me).as_bytes())
                        .ok()?;
                    base.to_owned()
                }
                None => endpoint,
            };
            s.connect(&endpoint).ok()?;
            if let Some(lru) = evict {
                limited!(info, service = %lru, "the calls relay closed its connection to the service it used least recently: it holds {MAX_RELAY_DEALERS}");
                self.out.remove(&lru);
                self.out_keys.remove(&lru);
                self.used.remove(&lru);
            }
            self.out.insert(tag.to_owned(), s);
            self.used.insert(tag.to_owned(), Instant::now());
            if let Some(k) = key {
                self.out_keys.insert(tag.to_owned(), k);
            }
        }
        self.out.get(tag)
    }

    /// A reply `[envelope, reply...]`, back to the caller it names.
    fn reply(&mut self, mut frames: Vec<zmq::Message>) {
        if frames.len() < 2 {
            self.counters
                .requests_malformed
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let envelope = frames.remove(0);
        let Some(caller) = envelope.strip_prefix(ENVELOPE) else {
            self.counters
                .requests_malformed
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        // A call another broker relayed: back to it, with its envelope.
        let mut msg = match caller.iter().position(|b| *b == 0) {
            Some(nul) => vec![
                zmq::Message::from(&caller[..nul]),
                zmq::Message::from(&caller[nul + 1..]),
            ],
            None => vec![zmq::Message::from(caller)],
        };
        msg.extend(frames);
        // A caller that has gone (or is full): counted, as a node counts
        // the replies it cannot deliver.
        if !send_all_checked(&self.calls, msg) {
            self.counters
                .replies_undeliverable
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sends a whole message without waiting; whether it went.
fn send_all_checked(sock: &zmq::Socket, frames: Vec<zmq::Message>) -> bool {
    let n = frames.len();
    for (i, m) in frames.into_iter().enumerate() {
        let flags = if i + 1 < n { zmq::SNDMORE } else { 0 };
        if sock.send(m, flags | zmq::DONTWAIT).is_err() {
            return false;
        }
    }
    true
}

/// Most bytes of the view a broker sends its clients: under the 64 MiB a
/// client takes in one message (docs/broker.md "Limits").
const VIEW_LIMIT: usize = 60 << 20;

/// The view sent to clients, a JSON array of `anns` in that order, as many
/// as fit in `limit` bytes; and how many were left out.
fn view_of<'a>(anns: impl Iterator<Item = &'a Announcement>, limit: usize) -> (Vec<u8>, usize) {
    let mut v = b"[".to_vec();
    let mut left_out = 0;
    for a in anns {
        let json = a.to_json();
        // The comma before it and the closing bracket.
        if v.len() + json.len() + 2 > limit {
            left_out += 1;
            continue;
        }
        if v.len() > 1 {
            v.push(b',');
        }
        v.extend_from_slice(&json);
    }
    v.push(b']');
    (v, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use milonga_wire::frame::{self, Encoding, Header, Kind, NodeId};
    use milonga_wire::key::Key;

    /// A held message of `bytes` bytes (no frames: the bookkeeping alone).
    fn msg(arrived: Instant, bytes: usize) -> HeldMsg {
        HeldMsg {
            arrived,
            bytes,
            frames: Vec::new(),
        }
    }

    #[test]
    fn the_view_never_passes_its_limit_and_says_what_it_left_out() {
        use crate::engine::routes::test_announcement;
        let anns: Vec<_> = (1..=10u8).map(|n| test_announcement(n, 1, &[])).collect();
        let (all, none) = view_of(anns.iter(), usize::MAX);
        assert_eq!(none, 0);
        let parsed: serde_json::Value = serde_json::from_slice(&all).unwrap();
        assert_eq!(parsed.as_array().unwrap().len(), 10);
        // Room for about four: the first four in, the rest counted.
        let one = anns[0].to_json().len() + 1;
        let (some, left_out) = view_of(anns.iter(), 4 * one + 2);
        assert!(some.len() <= 4 * one + 2);
        let parsed: serde_json::Value = serde_json::from_slice(&some).unwrap();
        let kept = parsed.as_array().unwrap().len();
        assert_eq!((kept, left_out), (4, 6));
        assert_eq!(parsed[0]["node_id"], serde_json::json!(anns[0].node_id));
        let (empty, left_out) = view_of(anns.iter(), 3);
        assert_eq!((&empty[..], left_out), (&b"[]"[..], 10));
    }

    #[test]
    fn held_messages_leave_each_node_in_order_and_the_counts_balance() {
        let t0 = Instant::now();
        let (a, b) = (Some([1u8; 16]), Some([2u8; 16]));
        let mut h = Held::default();
        h.push(a, msg(t0, 10), t0);
        h.push(b, msg(t0 + Duration::from_millis(1), 20), t0);
        h.push(a, msg(t0 + Duration::from_millis(2), 30), t0);
        assert_eq!((h.bytes, h.count), (60, 3));
        // The node whose first message came first.
        assert_eq!(h.oldest(), Some(a));
        // Taken first to last; the next one waits from when it was taken.
        let t1 = t0 + Duration::from_millis(5);
        let first = h.take(a, t1).unwrap();
        assert_eq!(first.bytes, 10);
        assert_eq!(h.chains[&a].head_since, t1);
        assert_eq!(h.oldest(), Some(b));
        // Refused again: back in front, waiting since it did.
        h.restore(a, first, t0);
        assert_eq!(h.chains[&a].head_since, t0);
        assert_eq!((h.bytes, h.count), (60, 3));
        let order: Vec<usize> = std::iter::from_fn(|| h.take(a, t1))
            .map(|m| m.bytes)
            .collect();
        assert_eq!(order, [10, 30]);
        assert!(!h.chains.contains_key(&a), "an empty chain goes");
        assert_eq!(h.take(b, t1).map(|m| m.bytes), Some(20));
        assert_eq!((h.bytes, h.count), (0, 0));
        assert!(h.idle(t1));
        h.lossy_until = Some(t1 + Duration::from_secs(1));
        assert!(!h.idle(t1), "a lossy port is remembered");
    }

    #[test]
    fn hold_limits_grow_with_the_mib_asked_and_never_are_zero() {
        let l = HoldLimits::of_mib(16);
        assert_eq!((l.pause_bytes, l.pause_messages), (16 << 20, 16_384));
        assert_eq!((l.max_bytes, l.max_messages), (64 << 20, 65_536));
        assert_eq!(HoldLimits::of_mib(0).pause_bytes, 1 << 20);
    }

    #[test]
    fn what_is_asked_covers_keys_as_the_subscription_prefixes_do() {
        let topics: Vec<Vec<u8>> = [
            &b"sr/a\0"[..],
            b"sr/b/",
            b"@f/0123/pc/",
            b"@hb\0",
            b"@r/tok\0",
        ]
        .iter()
        .map(|t| t.to_vec())
        .collect();
        let a = Asked::of(topics.iter());
        assert!(a.covers("sr/a"));
        assert!(
            !a.covers("sr/ab"),
            "a literal subscription is the key alone"
        );
        assert!(a.covers("sr/b/c/d"));
        assert!(!a.covers("sr/b"));
        assert!(a.covers("pc/1"), "a filtered subscription's keys");
        assert!(!a.covers("hb"));
        assert!(!Asked::default().covers("sr/a"));
        let all = [Vec::new()];
        assert!(Asked::of(all.iter()).covers("anything"));
    }

    fn frame(kind: Kind, node: u8, key: &str, seq: u64) -> Vec<u8> {
        let header = Header {
            kind,
            flags: 0,
            encoding: Encoding::Cbor,
            domain_tag: frame::domain_tag("lab"),
            schema_id: 0,
            node_id: NodeId([node; 16]),
            seq,
            timestamp_ns: 1,
        };
        frame::encode(&Key::new(key).unwrap(), &header, b"\x01")
    }

    #[test]
    fn a_frame_no_newer_than_one_forwarded_is_stale_by_publisher_key_and_number() {
        let mut s = Seen::default();
        let mut stale = |kind, node, key: &str, seq| {
            s.stale(stream_of(&frame(kind, node, key, seq)).expect("a stream"))
        };
        assert!(!stale(Kind::Sample, 1, "a", 1));
        assert!(stale(Kind::Sample, 1, "a", 1), "the same again");
        assert!(!stale(Kind::Sample, 2, "a", 1), "another publisher");
        assert!(!stale(Kind::Sample, 1, "b", 1), "another key");
        assert!(!stale(Kind::Sample, 1, "a", 5));
        // One path overtook another: what the lagging path brings now
        // would reach the subscribers out of order (they see a gap).
        assert!(stale(Kind::Sample, 1, "a", 3), "late");
        assert!(stale(Kind::Batch, 1, "a", 5), "a batch starting there");
        assert!(!stale(Kind::Batch, 1, "a", 6), "the next batch");
        assert!(!stale(Kind::Heartbeat, 1, "hb", 5));
        // Once 500 is forwarded, 5 is stale however it comes (a copy
        // that went round a cycle of links).
        assert!(!stale(Kind::Sample, 1, "a", 500));
        assert!(stale(Kind::Sample, 1, "a", 5));
        // Frames nothing tells from their copies: history replies,
        // filtered samples (numbered again from 1 when a filter is
        // declared again), garbage.
        assert!(stream_of(&frame(Kind::History, 1, "r/x", 1)).is_none());
        let mut filtered = frame(Kind::Sample, 1, "x", 1);
        filtered.splice(0..1, b"@f/0123456789abcdef/".iter().copied());
        assert!(stream_of(&filtered).is_none());
        assert!(stream_of(b"garbage").is_none());
        assert!(stream_of(b"k\0short").is_none());
    }

    #[test]
    fn a_port_keeps_the_counts_and_live_declarations_its_subscribers_asked_for() {
        let mut i = Interest::default();
        // The first subscriber and the last to leave go on; the others
        // are counted here only.
        assert_eq!(i.note(b"\x01a"), Pass::Edge);
        assert_eq!(i.note(b"\x01a"), Pass::Skip);
        assert_eq!(i.note(b"\x01a"), Pass::Skip);
        assert_eq!(i.note(b"\x00a"), Pass::Skip);
        assert_eq!(i.note(b"\x00a"), Pass::Skip);
        assert_eq!(i.topics.get(&b"a"[..]), Some(&1));
        assert_eq!(i.note(b"\x00a"), Pass::Edge);
        assert!(i.topics.is_empty());
        assert_eq!(
            i.note(b"\x00never"),
            Pass::Skip,
            "a stray unsubscribe withdraws nothing"
        );
        assert!(
            i.topics.is_empty(),
            "an unsubscribe of nothing changes nothing"
        );
        let long = [&[1u8][..], &[b'x'; 2000][..]].concat();
        assert_eq!(i.note(&long), Pass::Always, "too long to track");
        assert_eq!(i.note(&long), Pass::Always);
        assert!(i.topics.is_empty());
        // Its two unsubscribes go on as they came; a third is a stray.
        let unlong = [&[0u8][..], &[b'x'; 2000][..]].concat();
        assert_eq!(i.note(&unlong), Pass::Always);
        assert_eq!(i.note(&unlong), Pass::Always);
        assert_eq!(i.note(&unlong), Pass::Skip);
        let d = milonga_wire::filter::Declaration {
            node: "00".repeat(16),
            socket: "reliable".into(),
            keys: "sr/**".into(),
            filter: milonga_wire::filter::Filter {
                expr: Some("value > 1".into()),
                ..Default::default()
            },
        };
        let id = d.filter.id_for(&d.keys);
        i.note(&d.encode());
        assert!(
            i.live_decls().is_empty(),
            "its filtered keys are not subscribed"
        );
        i.note(d.encode().as_slice());
        i.note(format!("\x01@f/{id}/sr/").as_bytes());
        assert_eq!(i.live_decls(), vec![d.encode()]);
    }

    /// Declarations flooded in (ever new filters, huge ones) are kept
    /// within [`MAX_TRACKED_DECLS`] of at most [`MAX_TRACKED_DECL_BYTES`]
    /// (65,536 of up to 256 KiB were kept, and pruned only when a link
    /// or publisher connected), and a live one still gets a place.
    #[test]
    fn a_flood_of_declarations_is_kept_within_bounds_and_a_live_one_gets_in() {
        let decl = |expr: String| milonga_wire::filter::Declaration {
            node: "00".repeat(16),
            socket: "reliable".into(),
            keys: "sr/**".into(),
            filter: milonga_wire::filter::Filter {
                expr: Some(expr),
                ..Default::default()
            },
        };
        let mut i = Interest::default();
        let huge = decl(format!("value > 1 or value < {}", "9".repeat(8000)));
        assert!(huge.encode().len() > MAX_TRACKED_DECL_BYTES);
        assert_eq!(i.note(&huge.encode()), Pass::Always, "forwarded");
        assert!(i.decls.is_empty(), "not kept");
        for n in 0..2 * MAX_TRACKED_DECLS {
            assert_eq!(i.note(&decl(format!("value > {n}")).encode()), Pass::Always);
            assert!(i.decls.len() <= MAX_TRACKED_DECLS);
        }
        // One whose filtered samples are subscribed to: kept, the stale
        // ones pruned to make room.
        let live = decl("value > -1".into());
        let id = live.filter.id_for(&live.keys);
        i.note(format!("\x01@f/{id}/sr/").as_bytes());
        i.note(&live.encode());
        assert_eq!(i.live_decls(), vec![live.encode()]);
    }
}
