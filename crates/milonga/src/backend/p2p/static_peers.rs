//! The static discovery source: the control endpoints given in the
//! configuration (`peers`), each asked for its announcement every
//! `static_query_interval_ms` (docs/protocol.md §9.4) and forgotten when it
//! stops answering. With `gossip` on (the default), the node asks with
//! `gossip` (saying where it answers) instead of `info`, and also asks the
//! nodes that its configured peers (its seeds) list in their replies and
//! the nodes that ask it: one seed given, the rest are learned. What a
//! learned node lists is not followed (a node that merely asked cannot
//! point this one at other addresses). A learned node is dropped
//! altogether when it stops answering. It speaks the control protocol over
//! ZeroMQ DEALERs, so it belongs to this backend.

use std::sync::Arc;
use std::time::{Duration, Instant};

use milonga_wire::control::Request;

use crate::backend::p2p::control::{NodeInfo, MAX_TOLD};
use crate::backend::p2p::curve::{resolve_key, secure_client, split_peer, Guard};
use crate::backend::p2p::{zmq_io, ContextRef};
use crate::discovery::{reached_at, Announcement, Source};
use crate::model::error::{IntoTransport, OpenError};
use crate::model::node::NodeCore;
use crate::util::stats;

/// Most nodes learned by gossip; more are ignored, counted
/// (`gossip_dropped`) and logged once. Each costs a socket and about two
/// file descriptors (libzmq's default limit is 1,023 sockets a process).
pub(crate) const MAX_LEARNED: usize = 256;
/// Most nodes learned at one IP address (one host's nodes), so that one
/// host cannot take every place.
pub(crate) const MAX_LEARNED_PER_ADDRESS: usize = 64;
/// Most endpoints remembered as aliases (another address of a known node,
/// or of this one); each is forgotten after [`ALIAS_TTL`].
const MAX_ALIASES: usize = 1024;
/// How long an alias is not learned again.
const ALIAS_TTL: Duration = Duration::from_secs(60);
/// Largest reply taken from a peer (an announcement, the counters and up
/// to [`crate::backend::p2p::control::MAX_TOLD`] endpoints).
const MAX_REPLY_BYTES: i64 = 1 << 20;
/// Gossip requests a configured peer leaves unanswered before it is asked
/// with `info` (a node of an older release drops `gossip`).
const GOSSIP_TRIES: u32 = 3;

struct StaticPeer {
    endpoint: String,
    /// When it was learned by gossip (`None`: configured, never dropped).
    learned: Option<Instant>,
    sock: zmq::Socket,
    /// With security on: the monitor of `sock`, which tells a key the peer
    /// refused (libzmq does not reconnect after that: the socket is made
    /// again, so that a key trusted later gets in).
    mon: Option<zmq::Socket>,
    last_reply: Option<Instant>,
    announcement: Option<Announcement>,
    warned_domain: bool,
    /// Requests sent before any reply came (see [`GOSSIP_TRIES`]).
    unanswered: u32,
    /// It answered as this node or as a node known elsewhere: a learned
    /// one is dropped.
    alias: bool,
}

/// The configured peers and what they last answered.
pub(crate) struct StaticPeers {
    ctx: ContextRef,
    /// The node's security, when on: a peer is connected to with its key.
    guard: Option<Arc<Guard>>,
    node: Arc<NodeCore>,
    peers: Vec<StaticPeer>,
    last_query: Option<Instant>,
    /// The node thread's poll saw a reply waiting: read in the next turn
    /// (an empty socket is not read every turn).
    readable: bool,
    /// What is sent to each peer: `gossip` with this node's control
    /// endpoint, or `info` (gossip off, or a control endpoint that is not
    /// tcp).
    request: Request,
    /// This node's control endpoint (never learned as a peer).
    own_control: String,
    /// A node was ignored because [`MAX_LEARNED`] were known (logged once).
    warned_full: bool,
    /// Peers that refused this node's key (control endpoint, ZAP status),
    /// for the node thread to tell the subscriptions.
    refusals: Vec<(String, u32)>,
    /// Numbers the monitors' endpoints.
    sockets_made: u64,
    /// Learned endpoints that answered as this node, or as a node known
    /// at another endpoint (other addresses of nodes on several
    /// networks), and when: not learned again for [`ALIAS_TTL`] (at most
    /// [`MAX_ALIASES`]).
    aliases: std::collections::HashMap<String, Instant>,
}

impl StaticPeers {
    /// Connects to every configured peer (a bad endpoint is logged and
    /// skipped); `own_control` is this node's control endpoint.
    pub(crate) fn new(
        node: Arc<NodeCore>,
        own_control: &str,
        guard: Option<Arc<Guard>>,
    ) -> StaticPeers {
        let request = if node.cfg.gossip && own_control.starts_with("tcp://") {
            Request::Gossip {
                control: own_control.to_owned(),
                domain: node.domain.clone(),
            }
        } else {
            Request::Info
        };
        let mut s = StaticPeers {
            ctx: ContextRef::acquire(),
            guard,
            node,
            peers: Vec::new(),
            last_query: None,
            // Replies may wait before the first poll.
            readable: true,
            request,
            own_control: own_control.to_owned(),
            warned_full: false,
            refusals: Vec::new(),
            sockets_made: 0,
            aliases: std::collections::HashMap::new(),
        };
        for spec in s.node.cfg.peers.clone() {
            let (who, ep) = split_peer(&spec);
            let ep = ep.to_owned();
            if let Some(g) = &s.guard {
                match (who, who.and_then(|w| resolve_key(g, w))) {
                    (_, Some(key)) => g.set_configured_key(&ep, key),
                    (Some(w), None) => {
                        tracing::warn!(peer = %spec, name = %w, "ignoring a static peer: its key is named by neither a .pub file of the trust directory nor a Z85 key");
                        continue;
                    }
                    // No key named: the peer is taken to have this node's
                    // own identity (one user's default identity on several
                    // hosts); a peer with another fails the handshake.
                    (None, None) => {
                        tracing::info!(peer = %spec, "a static peer without a key named: expecting this node's own identity there (name another as NAME@tcp://HOST:PORT)")
                    }
                }
            }
            match s.connect(&ep) {
                Ok((sock, mon)) => s.peers.push(StaticPeer::new(ep, sock, mon, None)),
                Err(err) => tracing::warn!(peer = %ep, %err, "ignoring a static peer"),
            }
        }
        s
    }

    /// Adds `told`, an endpoint told by gossip, to the nodes asked (unless
    /// it is known, this node, an alias, not a `tcp://` endpoint of at most
    /// 256 bytes, or gossip is off); asks it at once. Whether it was added.
    /// With security on, `told` is `KEY@tcp://…` and the key must be
    /// trusted; with it off, a keyed endpoint (a secured node's) is not
    /// learned.
    pub(crate) fn learn(&mut self, told: &str, now: Instant) -> bool {
        let (who, endpoint) = split_peer(told);
        let key = match (&self.guard, who) {
            (Some(g), Some(who)) => match resolve_key(g, who).filter(|k| g.trusted(k).is_some()) {
                Some(key) => Some(key),
                None => return false,
            },
            (None, None) => None,
            _ => return false,
        };
        if !self.node.cfg.gossip
            || endpoint == self.own_control
            || endpoint.len() > milonga_wire::control::MAX_GOSSIP_ENDPOINT
            || !endpoint.starts_with("tcp://")
            || self.aliases.contains_key(endpoint)
            || self.peers.iter().any(|p| p.endpoint == endpoint)
        {
            return false;
        }
        let host = |ep: &str| ep.rsplit_once(':').map(|(h, _)| h.to_owned());
        let at = host(endpoint);
        let (learned, here) = self
            .peers
            .iter()
            .filter(|p| p.learned.is_some())
            .fold((0, 0), |(n, h), p| {
                (n + 1, h + usize::from(host(&p.endpoint) == at))
            });
        if learned >= MAX_LEARNED || here >= MAX_LEARNED_PER_ADDRESS {
            stats::inc(&self.node.counters.gossip_dropped);
            if !std::mem::replace(&mut self.warned_full, true) {
                tracing::warn!(
                    peer = %endpoint,
                    "ignoring nodes learned by gossip: this node already asks {MAX_LEARNED} (or {MAX_LEARNED_PER_ADDRESS} at one address); counted in gossip_dropped"
                );
            }
            return false;
        }
        if let (Some(g), Some(key)) = (&self.guard, key) {
            g.set_static_key(endpoint, key);
        }
        match self.connect(endpoint) {
            Ok((sock, mon)) => {
                tracing::debug!(peer = %endpoint, "learned a node by gossip");
                let _ = sock.send_multipart(self.request.frames(), zmq::DONTWAIT);
                self.peers
                    .push(StaticPeer::new(endpoint.to_owned(), sock, mon, Some(now)));
                true
            }
            Err(err) => {
                limited!(warn, peer = %endpoint, %err, "ignoring a node learned by gossip");
                false
            }
        }
    }

    /// A DEALER connected to the control endpoint `ep`, and its monitor
    /// with security on.
    fn connect(&mut self, ep: &str) -> Result<(zmq::Socket, Option<zmq::Socket>), OpenError> {
        self.sockets_made += 1;
        let mon = self.guard.is_some().then(|| {
            format!(
                "inproc://milonga-staticmon-{}-{}",
                self.node.id, self.sockets_made
            )
        });
        connect(
            &self.ctx,
            &self.node,
            self.guard.as_deref(),
            ep,
            mon.as_deref(),
        )
    }

    /// The peers that refused this node's key since the last call.
    pub(crate) fn take_refusals(&mut self) -> Vec<(String, u32)> {
        std::mem::take(&mut self.refusals)
    }

    /// This node's control endpoint.
    pub(crate) fn own_control(&self) -> &str {
        &self.own_control
    }

    /// The endpoints at which peers answered with an announcement of this
    /// domain: told to gossip askers (what was checked, not what an
    /// announcement claims).
    pub(crate) fn answered(&self) -> impl Iterator<Item = &str> {
        self.peers
            .iter()
            .filter(|p| p.announcement.is_some())
            .map(|p| p.endpoint.as_str())
    }

    /// Their sockets, for the node thread's poll ([`StaticPeers::sockets`]
    /// of them).
    pub(crate) fn poll_items(&self) -> impl Iterator<Item = zmq::PollItem<'_>> {
        self.peers.iter().map(|p| p.sock.as_poll_item(zmq::POLLIN))
    }

    pub(crate) fn sockets(&self) -> usize {
        self.peers.len()
    }

    /// The poll found a reply waiting.
    pub(crate) fn mark_readable(&mut self) {
        self.readable = true;
    }

    fn every(&self) -> Duration {
        Duration::from_millis(self.node.cfg.static_query_interval_ms.max(10))
    }

    /// Reads the replies that arrived; whether an announcement changed.
    /// The nodes the replies list are added to `told`.
    fn read(&mut self, now: Instant, told: &mut Vec<String>) -> bool {
        let domain = &self.node.domain;
        let c = &self.node.counters;
        let own_id = self.node.id.to_hex();
        // Which endpoint each node is known at, kept up to date below.
        let mut asked_at: std::collections::HashMap<String, String> = self
            .peers
            .iter()
            .filter_map(|p| Some((p.announcement.as_ref()?.node_id.clone(), p.endpoint.clone())))
            .collect();
        let aliases = &mut self.aliases;
        let mut changed = false;
        for p in &mut self.peers {
            while let Ok(frames) = p.sock.recv_multipart(zmq::DONTWAIT) {
                let parsed = milonga_wire::control::decode_info_reply(&frames)
                    .ok()
                    .and_then(|body| serde_json::from_slice::<NodeInfo>(body).ok());
                let Some(mut info) = parsed else {
                    stats::inc(&c.control_malformed);
                    limited!(warn, peer = %p.endpoint, "dropped a malformed reply from a static peer");
                    continue;
                };
                if info.announcement.domain != *domain {
                    stats::inc(&c.peers_foreign_domain);
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
                let id = &info.announcement.node_id;
                let elsewhere = asked_at.get(id).is_some_and(|ep| *ep != p.endpoint);
                if *id == own_id || (p.learned.is_some() && elsewhere) {
                    // This node, or a node already asked at another
                    // endpoint, at another of its addresses (a node on
                    // several networks, told by gossip how others reach
                    // it): the address this node uses stays, and the
                    // alias is not learned again for a while.
                    if aliases.len() < MAX_ALIASES {
                        aliases.insert(p.endpoint.clone(), now);
                    }
                    p.alias = true;
                    continue;
                }
                p.last_reply = Some(now);
                p.unanswered = 0;
                asked_at
                    .entry(id.clone())
                    .or_insert_with(|| p.endpoint.clone());
                // Only seeds (configured peers) are followed, and only as
                // far as one reply may list.
                if p.learned.is_none() {
                    told.extend(info.peers.drain(..).take(MAX_TOLD));
                }
                reached_at(&mut info.announcement, &p.endpoint);
                if p.announcement.as_ref() != Some(&info.announcement) {
                    p.announcement = Some(info.announcement);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Drops the learned peers that turned out to be this node, or a node
    /// known at another endpoint; forgets old aliases.
    fn drop_aliases(&mut self, now: Instant) {
        self.aliases.retain(|_, at| now < *at + ALIAS_TTL);
        let aliases = &self.aliases;
        self.peers
            .retain(|p| p.learned.is_none() || !(p.alias || aliases.contains_key(&p.endpoint)));
    }

    /// Asks every peer again when a query is due, and forgets those that
    /// have not answered for three intervals (at least the lease); whether
    /// one was forgotten.
    fn query(&mut self, now: Instant) -> bool {
        let every = self.every();
        if self.last_query.is_some_and(|t| now < t + every) {
            return false;
        }
        self.last_query = Some(now);
        let expiry = (every * 3).max(Duration::from_millis(
            self.node.cfg.heartbeat_timeout_ms as u64,
        ));
        let mut changed = false;
        // Refused keys: told, and the socket made again (libzmq gives up
        // after a refusal; the peer may trust this key later).
        for i in 0..self.peers.len() {
            let Some(status) = self.peers[i].refused() else {
                continue;
            };
            stats::inc(&self.node.counters.auth_rejected);
            let ep = self.peers[i].endpoint.clone();
            limited!(warn, peer = %ep, status, "a static peer refused this node's key: it is not in that node's trust directory");
            self.refusals.push((ep.clone(), status));
            match self.connect(&ep) {
                Ok((sock, mon)) => self.peers[i].replace(sock, mon),
                Err(err) => {
                    limited!(warn, peer = %ep, %err, "cannot connect to a static peer again")
                }
            }
        }
        let request = self.request.frames();
        let info = Request::Info.frames();
        self.peers.retain_mut(|p| {
            // A configured peer that never answered `gossip` may be of an
            // older release, which drops it: asked with `info` from then.
            let old = p.learned.is_none() && p.last_reply.is_none() && p.unanswered >= GOSSIP_TRIES;
            let _ = p
                .sock
                .send_multipart(if old { &info } else { &request }, zmq::DONTWAIT);
            p.unanswered = p.unanswered.saturating_add(1);
            let silent = p.last_reply.or(p.learned).is_none_or(|t| now - t > expiry);
            if !silent {
                return true;
            }
            if p.announcement.take().is_some() {
                tracing::info!(peer = %p.endpoint, "peer stopped answering");
                changed = true;
            }
            // A learned node is dropped (gossip may tell it again); a
            // configured one is asked forever.
            p.learned.is_none()
        });
        changed
    }
}

/// A DEALER connected to the control endpoint `ep`, with the reader of
/// its monitor at `monitor` (refused handshakes), if asked.
fn connect(
    ctx: &ContextRef,
    node: &NodeCore,
    guard: Option<&Guard>,
    ep: &str,
    monitor: Option<&str>,
) -> Result<(zmq::Socket, Option<zmq::Socket>), OpenError> {
    let mut s = ctx.socket(zmq::DEALER)?;
    secure_client(guard, &s, ep).map_err(|source| OpenError::Socket {
        action: "secure a connection to",
        endpoint: ep.to_owned(),
        source,
    })?;
    let _ = zmq_io::apply_common(&s, &node.cfg);
    let _ = s.set_sndhwm(4);
    // Replies are small and one at a time is enough: a peer that pushes
    // more, or larger, costs nothing.
    let _ = s.set_rcvhwm(4);
    let _ = s.set_maxmsgsize(MAX_REPLY_BYTES);
    let _ = s.set_ipv6(true);
    let err = |action: &'static str| {
        move |source: zmq::Error| OpenError::Socket {
            action,
            endpoint: ep.to_owned(),
            source: source.transport(),
        }
    };
    let mon = match monitor {
        None => None,
        Some(m) => {
            s.monitor(m, zmq_io::AUTH_FAILED).map_err(err("monitor"))?;
            let r = ctx.socket(zmq::PAIR)?;
            let _ = r.set_linger(0);
            let _ = zmq_io::unbounded_monitor_queue(&r);
            if let Err(e) = r.connect(m) {
                zmq_io::stop_monitor(&mut s);
                return Err(err("monitor")(e));
            }
            Some(r)
        }
    };
    if let Err(e) = s.connect(ep) {
        if mon.is_some() {
            zmq_io::stop_monitor(&mut s);
        }
        return Err(err("connect")(e));
    }
    Ok((s, mon))
}

impl StaticPeer {
    fn new(
        endpoint: String,
        sock: zmq::Socket,
        mon: Option<zmq::Socket>,
        learned: Option<Instant>,
    ) -> StaticPeer {
        StaticPeer {
            endpoint,
            learned,
            sock,
            mon,
            last_reply: None,
            announcement: None,
            warned_domain: false,
            unanswered: 0,
            alias: false,
        }
    }

    /// The ZAP status with which the peer refused this node's key since
    /// the last look, if it did.
    fn refused(&self) -> Option<u32> {
        zmq_io::auth_refusal(self.mon.as_ref()?)
    }

    /// Puts a new socket (and monitor) in place of the old ones.
    fn replace(&mut self, sock: zmq::Socket, mon: Option<zmq::Socket>) {
        if self.mon.is_some() {
            zmq_io::stop_monitor(&mut self.sock);
        }
        self.sock = sock;
        self.mon = mon;
    }
}

impl Drop for StaticPeer {
    fn drop(&mut self) {
        // Before the monitor's reader goes (see `zmq_io::stop_monitor`).
        if self.mon.is_some() {
            zmq_io::stop_monitor(&mut self.sock);
        }
    }
}

impl Source for StaticPeers {
    fn turn(&mut self, now: Instant) -> bool {
        if self.peers.is_empty() {
            return false;
        }
        let mut told = Vec::new();
        let read = std::mem::take(&mut self.readable) && self.read(now, &mut told);
        if !self.aliases.is_empty() || self.peers.iter().any(|p| p.alias) {
            self.drop_aliases(now);
        }
        told.sort_unstable();
        told.dedup();
        for ep in told {
            self.learn(&ep, now);
        }
        self.query(now) | read
    }

    /// Configured peers first, then learned ones: the first entry of a
    /// node wins where they are merged, so its address does not change
    /// with the order replies come in.
    fn peers_into(&self, peers: &mut Vec<Announcement>) {
        peers.extend(
            self.peers
                .iter()
                .filter_map(|p| p.announcement.as_ref())
                .cloned(),
        );
    }

    fn next_due(&self) -> Option<Instant> {
        if self.peers.is_empty() {
            return None;
        }
        Some(
            self.last_query
                .map_or_else(Instant::now, |t| t + self.every()),
        )
    }
}
