//! One node's state, shared by its handle, publishers, subscribers,
//! services and thread: who it is ([`NodeCore`]), what it declared, the
//! peers discovery shows, its call routes, and its backend. Every field is
//! private: the handles reach it through the methods below. Who may touch
//! what, and the lock order: docs/internals.md.

pub(crate) mod callers;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use milonga_wire::{KeyExpr, NodeId};

use crate::backend::p2p::control::{self, Host};
use crate::backend::p2p::data::DataSocket;
use crate::backend::p2p::P2p;
use crate::discovery::local::LocalSource;
use crate::discovery::{process_start_time, Announcement, LocalDir, PublicationInfo};
use crate::engine::routes::Routes;
use crate::model::config::{parse_locator, Config, Transport};
use crate::model::error::OpenError;
use crate::model::node::NodeCore;
use crate::model::qos::Reliability;
use crate::util::lock;
use crate::util::stats::Counters;
use callers::Callers;
use milonga_wire::announce::ServiceInfo;

/// What the node asks of each of its subscriptions when the peers change.
pub(crate) trait RouteTarget: Send + Sync {
    /// The key expression it follows.
    fn expr(&self) -> &KeyExpr;
    /// Where it should be connected and which publishers it follows.
    fn set_routes(&self, routes: Routes);
    /// Wakes a thread blocked on it (the node closed).
    fn wake(&self);
    /// A node refused this node before any route to it was known (its
    /// control socket refused this node's key): told as
    /// `Event::PermissionDenied`, once per endpoint.
    fn denied(&self, ev: crate::model::sample::PermissionDenied);
    /// An event from the node itself (its broker changed).
    fn inject(&self, ev: crate::model::sample::Event);
    /// Events received and not yet taken by the application (its queue
    /// policy's queue and what a receive has decoded ahead), as far as it
    /// can tell without waiting for a receiving thread.
    fn queued(&self) -> usize {
        0
    }
}

/// Keys a node keeps the last sequence numbers of after their publisher
/// went (docs/guarantees.md, "Resources"); declared again later, a key
/// let go starts over at 1.
const MAX_RETIRED_SEQS: usize = 65_536;

/// What [`NodeInner::state`] guards.
#[derive(Default)]
struct NodeState {
    /// Declared publications, by key, as announced.
    publications: BTreeMap<String, PublicationInfo>,
    /// Services served, by key.
    services: BTreeMap<String, ServiceInfo>,
    subs: Vec<Weak<dyn RouteTarget>>,
    /// Live peers by node id (hex), this node included.
    peers: BTreeMap<String, Announcement>,
    /// The announcement changed since it was last published.
    announce_dirty: bool,
    /// Last sequence number of keys whose publisher was dropped, and when
    /// (a count of drops): a key declared again goes on from there. At
    /// most [`MAX_RETIRED_SEQS`] and a quarter, the longest retired then
    /// let go (a gateway retiring keys for months grew this for ever).
    last_seq: HashMap<String, (u64, u64)>,
    /// Drops counted, for `last_seq`'s order.
    retirements: u64,
    /// The sequence counters of the live publishers, by key: a goodbye
    /// tells subscribers the last sequence number of each key.
    pub_seqs: HashMap<String, Arc<AtomicU64>>,
    /// Bytes of `publications` in the announcement's JSON.
    publication_bytes: usize,
}

/// What an announcement holds besides its publications, at most (ids,
/// names, endpoints, services): the budget left to publications is
/// discovery's limit less this.
const ANNOUNCEMENT_ROOM: usize = 32 << 10;

/// Bytes `info` takes in an announcement's JSON (and a comma).
fn publication_bytes(info: &PublicationInfo) -> usize {
    serde_json::to_vec(info).map_or(0, |v| v.len()) + 1
}

/// Shared by the node handle, its publishers, subscribers and its thread.
pub(crate) struct NodeInner {
    core: Arc<NodeCore>,
    /// Lock order: the local directory, then this, then a subscription's
    /// target, then the backend's sockets.
    state: Mutex<NodeState>,
    local: Option<Arc<Mutex<LocalDir>>>,
    control_endpoint: String,
    host: String,
    start_time: u64,
    next_sub_id: AtomicU64,
    next_service_id: AtomicU64,
    /// Counts announcements (scouting's hellos name it: a change makes the
    /// other hosts ask again).
    announced: AtomicU64,
    /// Calls: the servers discovery knows, and their connections.
    callers: Callers,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Where the node thread publishes heartbeats.
    liveliness_endpoint: String,
    // Declared last: sockets above are closed before the context goes.
    p2p: P2p,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}

/// Refuses a configuration that cannot work, before anything is bound.
fn check(cfg: &Config) -> Result<(), OpenError> {
    for (key, v) in [
        ("send_hwm", cfg.send_hwm),
        ("reliable_send_hwm", cfg.reliable_send_hwm),
        ("recv_hwm", cfg.recv_hwm),
    ] {
        if v < 1 {
            return Err(OpenError::Config {
                key: key.into(),
                why: format!(
                    "{v} is not a number of messages (at least 1); ZeroMQ would take 0 as no limit"
                ),
            });
        }
    }
    if cfg.heartbeat_interval_ms < 1 || cfg.heartbeat_timeout_ms <= cfg.heartbeat_interval_ms {
        return Err(OpenError::Config {
            key: "heartbeat_timeout_ms".into(),
            why: format!(
                "the lease ({} ms) must be longer than the heartbeat interval ({} ms), which must be at least 1 ms",
                cfg.heartbeat_timeout_ms, cfg.heartbeat_interval_ms
            ),
        });
    }
    // A PING's time to live travels in tenths of a second, 16 bits: a
    // best-effort connection whose PINGs come further apart than 65.5 s
    // is closed between them.
    if cfg.heartbeat_interval_ms > 65_500 {
        return Err(OpenError::Config {
            key: "heartbeat_interval_ms".into(),
            why: format!(
                "{} ms: at most 65500 (a heartbeat's time to live is carried in 16 bits of tenths of a second)",
                cfg.heartbeat_interval_ms
            ),
        });
    }
    if cfg.handshake_timeout_ms < 1 {
        return Err(OpenError::Config {
            key: "handshake_timeout_ms".into(),
            why: format!(
                "{} ms: at least 1 (ZeroMQ's 0, no limit, would let a peer that never completes its handshake hold a connection)",
                cfg.handshake_timeout_ms
            ),
        });
    }
    Ok(())
}

impl NodeInner {
    /// Opens a node: checks the configuration, binds its sockets, starts
    /// its thread, which finds the peers that exist now and announces it.
    pub(crate) fn open(mut cfg: Config) -> Result<Arc<NodeInner>, OpenError> {
        let loc = parse_locator(&cfg.locator)?;
        if !loc.brokers.is_empty() {
            // A broker client: the broker is its discovery and its
            // connections (docs/broker.md). Its security follows the
            // brokers' addresses: on when one is not on loopback (or a key
            // is given), as a node's follows its own address.
            if cfg.security == crate::Security::Auto {
                let remote = loc
                    .brokers
                    .iter()
                    .any(|b| !crate::model::config::is_loopback_endpoint(b));
                cfg.security = match remote || cfg.key_file.is_some() {
                    true => crate::Security::On,
                    false => crate::Security::Off,
                };
            }
            cfg.local_discovery = false;
            cfg.scouting = false;
            cfg.peers.clear();
            cfg.transport = Transport::Tcp;
        }
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).map_err(|e| OpenError::Config {
            key: "node id".into(),
            why: format!("no randomness available: {e}"),
        })?;
        let host = hostname();
        let pid = std::process::id();
        let name = format!("{}@{host}:{pid}", cfg.name);
        let local = if cfg.local_discovery || cfg.transport == Transport::Ipc {
            let (root, private) = cfg.runtime_root_checked();
            let dir = LocalDir::open(&root, &loc.domain, private).map_err(|source| {
                OpenError::RuntimeDir {
                    path: root.display().to_string(),
                    source,
                }
            })?;
            Some(Arc::new(Mutex::new(dir)))
        } else {
            None
        };
        check(&cfg)?;
        let mut other_hosts = Vec::new();
        if cfg.tcp_host == "auto" {
            let addrs = crate::discovery::interfaces::pick(&cfg.interfaces).map_err(|why| {
                OpenError::Config {
                    key: "tcp_host".into(),
                    why,
                }
            })?;
            cfg.tcp_host = addrs[0].to_string();
            other_hosts = addrs[1..].to_vec();
        }
        // With security on the id is bound to the key: a peer holding
        // another key cannot claim it (docs/protocol.md §9.2).
        let identity = crate::backend::p2p::load_identity(&cfg)?;
        let mut salt = None;
        if let Some((me, _)) = &identity {
            let mut s = [0u8; 16];
            getrandom::fill(&mut s).map_err(|e| OpenError::Config {
                key: "node id".into(),
                why: format!("no randomness available: {e}"),
            })?;
            id = NodeId::keyed(me.public().as_bytes(), &s).0;
            salt = Some(s);
        }
        let mut core = NodeCore::new(NodeId(id), name, loc.domain.clone(), cfg);
        core.other_hosts = other_hosts;
        core.id_salt = salt;
        let core = Arc::new(core);
        let brokers = crate::backend::p2p::uplink::brokers_of(&loc, identity.as_ref())?;
        let uplink = match brokers.is_empty() {
            true => None,
            false => Some(crate::backend::p2p::uplink::hello(
                &core.cfg,
                &brokers,
                &core.domain,
                std::time::Duration::from_millis(core.cfg.handshake_timeout_ms.max(1) as u64),
            )?),
        };
        let (p2p, wake_rx) = P2p::new(core.clone(), identity, uplink, brokers)?;
        let socks = control::bind_node(&p2p)?;
        let inner = Arc::new(NodeInner {
            core: core.clone(),
            state: Mutex::new(NodeState::default()),
            local: local.clone(),
            control_endpoint: socks.control_endpoint.clone(),
            liveliness_endpoint: socks.liveliness_endpoint.clone(),
            host,
            start_time: process_start_time(pid).unwrap_or(0),
            next_sub_id: AtomicU64::new(1),
            next_service_id: AtomicU64::new(1),
            announced: AtomicU64::new(0),
            callers: Callers::default(),
            thread: Mutex::new(None),
            p2p,
        });
        let local = local.map(|dir| LocalSource::new(core, dir));
        match control::start(&inner, socks, wake_rx, local) {
            Ok(th) => *lock(&inner.thread) = Some(th),
            Err(e) => {
                inner.close();
                return Err(e);
            }
        }
        tracing::debug!(node = %inner.core.name, id = %inner.core.id, domain = %inner.core.domain, "node open");
        Ok(inner)
    }

    /// Who this node is, its configuration and counters.
    pub(crate) fn core(&self) -> &NodeCore {
        &self.core
    }

    pub(crate) fn id(&self) -> NodeId {
        self.core.id
    }

    pub(crate) fn cfg(&self) -> &Config {
        &self.core.cfg
    }

    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.core.counters
    }

    /// Whether the node is closing or closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// The peer-to-peer backend's resources.
    pub(crate) fn backend(&self) -> &P2p {
        &self.p2p
    }

    pub(crate) fn callers(&self) -> &Callers {
        &self.callers
    }

    /// The control endpoint (peer-to-peer).
    pub(crate) fn control_endpoint(&self) -> &str {
        &self.control_endpoint
    }

    /// A number for the next subscription.
    pub(crate) fn next_sub_id(&self) -> u64 {
        self.next_sub_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A number for the next service's endpoint.
    pub(crate) fn next_service_id(&self) -> u64 {
        self.next_service_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The peers discovery shows now, this node included.
    pub(crate) fn peers(&self) -> Vec<Announcement> {
        lock(&self.state).peers.values().cloned().collect()
    }

    /// How many peers discovery shows now.
    pub(crate) fn peer_count(&self) -> usize {
        lock(&self.state).peers.len()
    }

    /// Whether discovery shows node `id` now.
    pub(crate) fn knows_peer(&self, id: NodeId) -> bool {
        lock(&self.state).peers.contains_key(&id.to_hex())
    }

    /// The data socket serving a publication of `key` with `reliability`,
    /// created on first use (the announcement then names it).
    pub(crate) fn data_socket(
        &self,
        reliability: Reliability,
        key: &str,
    ) -> Result<Arc<DataSocket>, OpenError> {
        let (d, created) = self.p2p.data_socket(reliability, key)?;
        if created {
            lock(&self.state).announce_dirty = true;
        }
        Ok(d)
    }

    /// Declares a publication of `key`: `None` if one is declared already,
    /// else the last sequence number an earlier publisher of `key` in this
    /// node sent (0 if none), which the new one continues.
    pub(crate) fn declare_publication(
        &self,
        key: &str,
        reliability: Reliability,
        history: usize,
        schema: Option<u32>,
        data: &DataSocket,
    ) -> Result<u64, crate::PublisherError> {
        let mut st = lock(&self.state);
        if st.publications.contains_key(key) {
            return Err(crate::PublisherError::AlreadyDeclared(key.to_owned()));
        }
        let own = !data.first;
        let info = PublicationInfo {
            key: key.to_owned(),
            reliability,
            history,
            endpoint: own.then(|| data.endpoint.clone()),
            socket: own.then(|| data.name.clone()),
            schema,
        };
        // Past what discovery takes, peers would drop the node's whole
        // announcement: refused here, where it can be said.
        let limit = self.announcement_limit();
        let bytes = publication_bytes(&info);
        if st.publication_bytes + bytes + ANNOUNCEMENT_ROOM > limit {
            return Err(crate::PublisherError::TooManyPublications {
                publications: st.publications.len(),
                bytes: st.publication_bytes,
                limit,
            });
        }
        st.publication_bytes += bytes;
        st.publications.insert(key.to_owned(), info);
        Ok(st.last_seq.get(key).map_or(0, |(seq, _)| *seq))
    }

    /// The largest announcement every discovery this node uses takes: a
    /// broker's (a client's attach, a registration) or the local
    /// directory's.
    fn announcement_limit(&self) -> usize {
        if self.p2p.uplink().is_some() || !self.core.cfg.registry.is_empty() {
            milonga_wire::broker::MAX_ANNOUNCEMENT_BYTES
        } else {
            crate::discovery::MAX_ANNOUNCEMENT_BYTES as usize
        }
    }

    /// The publisher of `key` is ready: its sequence counter goes into the
    /// goodbye, and the announcement names it.
    pub(crate) fn publisher_started(&self, key: &str, seq: Arc<AtomicU64>) {
        self.publisher_ready(key, seq);
        self.announce();
    }

    /// As [`NodeInner::publisher_started`], without announcing: the
    /// caller announces once for many ([`crate::Node::publishers_with`]).
    pub(crate) fn publisher_ready(&self, key: &str, seq: Arc<AtomicU64>) {
        let mut st = lock(&self.state);
        // Declared again: its counter goes on from the number kept (read
        // at its declaration), which `last_seq` no longer needs to hold.
        st.last_seq.remove(key);
        st.pub_seqs.insert(key.to_owned(), seq);
    }

    /// The publisher of `key` went, having sent up to `last`. Announced by
    /// the node thread at its next turn (woken now), once for every
    /// publisher dropped meanwhile: each announcement names every
    /// publication, so dropping thousands one announcement each took time
    /// in the square of their number.
    pub(crate) fn undeclare_publication(&self, key: &str, last: u64) {
        let removed = {
            let mut st = lock(&self.state);
            st.retirements += 1;
            let when = st.retirements;
            st.last_seq.insert(key.to_owned(), (last, when));
            st.pub_seqs.remove(key);
            if st.last_seq.len() > MAX_RETIRED_SEQS + MAX_RETIRED_SEQS / 4 {
                // The longest retired go (those declared now stay).
                let mut retired: Vec<(u64, String)> = st
                    .last_seq
                    .iter()
                    .filter(|(k, _)| !st.pub_seqs.contains_key(*k))
                    .map(|(k, (_, when))| (*when, k.clone()))
                    .collect();
                retired.sort_unstable();
                let excess = st.last_seq.len().saturating_sub(MAX_RETIRED_SEQS);
                for (_, k) in retired.into_iter().take(excess) {
                    st.last_seq.remove(&k);
                }
            }
            match st.publications.remove(key) {
                Some(info) => {
                    st.publication_bytes -= publication_bytes(&info);
                    st.announce_dirty = true;
                    true
                }
                None => false,
            }
        };
        if removed && !self.is_closed() {
            self.p2p.wake();
        }
    }

    /// Whether a service of `key` is served by this node.
    pub(crate) fn serves(&self, key: &str) -> bool {
        lock(&self.state).services.contains_key(key)
    }

    /// Adds the service `info` to the announcement, unless `key` is served
    /// already (another thread served it meanwhile): whether it was added.
    pub(crate) fn declare_service(&self, info: ServiceInfo) -> bool {
        {
            let mut st = lock(&self.state);
            if st.services.contains_key(&info.key) {
                return false;
            }
            st.services.insert(info.key.clone(), info);
        }
        self.announce();
        true
    }

    /// Removes the service of `key` at `endpoint` from the announcement
    /// (its handle was dropped).
    pub(crate) fn withdraw_service(&self, key: &str, endpoint: &str) {
        let removed = {
            let mut st = lock(&self.state);
            let mine = st.services.get(key).is_some_and(|s| s.endpoint == endpoint);
            mine && st.services.remove(key).is_some()
        };
        if removed {
            self.announce();
        }
    }

    /// Adds a subscription, connected before this returns to the
    /// publishers known now.
    pub(crate) fn add_subscription(&self, sub: Weak<dyn RouteTarget>) {
        let mut st = lock(&self.state);
        if let Some(s) = sub.upgrade() {
            connect_subscription(&st, &*s);
        }
        // Those closed since go now, not at the next change of peers: a
        // quiet domain and a program that subscribes and closes for each
        // read grew this for ever.
        st.subs.retain(|w| w.strong_count() > 0);
        st.subs.push(sub);
    }

    /// The announcement of this node as `st` describes it.
    fn announcement_of(&self, st: &NodeState) -> Announcement {
        let [best_effort, reliable] = self.p2p.data_endpoints();
        Announcement {
            protocol: milonga_wire::frame::PROTOCOL_VERSION,
            domain: self.core.domain.clone(),
            node_id: self.core.id.to_hex(),
            name: self.core.name.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            start_time: self.start_time,
            control: self.control_endpoint.clone(),
            data_best_effort: best_effort,
            data_reliable: reliable,
            liveliness: Some(
                self.p2p
                    .announced_at(crate::backend::p2p::uplink::Plane::Liveliness)
                    .unwrap_or_else(|| self.liveliness_endpoint.clone()),
            ),
            publications: st.publications.values().cloned().collect(),
            services: st
                .services
                .values()
                .cloned()
                .map(|mut s| {
                    // A broker client's: at its current broker's.
                    if let (Some(up), Some((_, tag))) =
                        (self.p2p.uplink(), s.endpoint.split_once('#'))
                    {
                        s.endpoint = format!("{}#{tag}", up.hello.calls);
                    }
                    s
                })
                .collect(),
            key: self.p2p.public_key().map(|k| k.to_z85()),
            id_salt: self
                .core
                .id_salt
                .map(|s| s.iter().map(|b| format!("{b:02x}")).collect()),
            via: None,
        }
    }

    /// The subscriptions still alive (taken out of the state lock, so that
    /// they can be told something without it).
    fn live_subs(&self) -> Vec<Arc<dyn RouteTarget>> {
        lock(&self.state)
            .subs
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Writes the announcement of a node this one speaks for (a broker's
    /// client) in the local directory, as a node of this process, so that
    /// it is taken for gone when this process is. Nothing without local
    /// discovery.
    pub(crate) fn show_local(&self, a: &Announcement) {
        // Files are named after node ids: only a real one names a file.
        if NodeId::from_hex(&a.node_id).is_none_or(|id| id.to_hex() != a.node_id) {
            return;
        }
        let Some(dir) = self.local.as_deref().map(lock) else {
            return;
        };
        if self.is_closed() {
            return;
        }
        let mut a = a.clone();
        a.host = self.host.clone();
        a.pid = std::process::id();
        a.start_time = self.start_time;
        if let Err(err) = dir.write(&a) {
            tracing::warn!(%err, node = %a.name, "cannot write a client's announcement in the local directory");
        }
    }

    /// Removes what [`NodeInner::show_local`] wrote.
    pub(crate) fn hide_local(&self, node_id: &str) {
        if NodeId::from_hex(node_id).is_none_or(|id| id.to_hex() != node_id) {
            return;
        }
        if let Some(mut dir) = self.local.as_deref().map(lock) {
            // Only a file this process wrote: another broker of this host
            // may announce the node now (it moved there).
            dir.remove_if_of(node_id, std::process::id());
        }
    }

    /// Publishes the current announcement: in the local directory, and in
    /// the peer table so that this node's own subscriptions see it.
    ///
    /// The directory lock is held from building to writing (lock order:
    /// directory, then state), so that two concurrent announcements cannot
    /// write an older one last, and none is written after `close`.
    pub(crate) fn announce(&self) {
        let dir = self.local.as_deref().map(lock);
        if self.is_closed() {
            return;
        }
        let a = {
            let mut st = lock(&self.state);
            st.announce_dirty = false;
            self.announced.fetch_add(1, Ordering::Relaxed);
            let a = self.announcement_of(&st);
            st.peers.insert(a.node_id.clone(), a.clone());
            a
        };
        if let Some(dir) = dir {
            if let Err(err) = dir.write(&a) {
                tracing::warn!(%err, "cannot write the local announcement");
            }
        }
        self.reconcile(&mut lock(&self.state));
    }

    /// Connects every subscription to the data endpoints of the peers that
    /// publish keys it matches, and disconnects it from the others; updates
    /// the call routes.
    ///
    /// Runs with the state lock held (`st`), so that a caller with an older
    /// view of the peers cannot overwrite a newer one, and so that nobody
    /// sees peers whose services the call routes do not have yet (lock
    /// order: state, then a subscription's target; the subscription socket
    /// is only try-locked).
    fn reconcile(&self, st: &mut NodeState) {
        st.subs.retain(|w| w.strong_count() > 0);
        let subs: Vec<_> = st.subs.iter().filter_map(Weak::upgrade).collect();
        self.callers.update(&st.peers.values().collect::<Vec<_>>());
        for s in subs {
            connect_subscription(st, &*s);
        }
    }

    /// Closes the node (idempotent): stops its thread (which says goodbye),
    /// gives a waiting reliable batch the linger time, wakes its
    /// subscriptions and withdraws its announcement.
    pub(crate) fn close(&self) {
        if self.core.mark_closed() {
            return;
        }
        self.p2p.wake();
        if let Some(th) = lock(&self.thread).take() {
            let _ = th.join();
        }
        self.p2p.flush_at_close();
        let subs: Vec<_> = {
            let mut st = lock(&self.state);
            st.publications.clear();
            std::mem::take(&mut st.subs)
        };
        for s in subs.iter().filter_map(Weak::upgrade) {
            s.wake();
        }
        if let Some(dir) = &self.local {
            let mut dir = lock(dir);
            let a = self.announcement_of(&lock(&self.state));
            crate::discovery::remove_ipc_files(&a, &dir.dir, true);
            dir.remove(&self.core.id.to_hex());
        }
        tracing::debug!(node = %self.core.name, "node closed");
    }
}

/// Points one subscription at the data and liveliness endpoints of the
/// peers in `st` that publish keys it matches.
fn connect_subscription(st: &NodeState, s: &dyn RouteTarget) {
    let peers: Vec<&Announcement> = st.peers.values().collect();
    s.set_routes(crate::engine::routes::routes_for(s.expr(), &peers));
}

impl Host for NodeInner {
    fn p2p(&self) -> &P2p {
        &self.p2p
    }

    fn announcement(&self) -> Announcement {
        self.announcement_of(&lock(&self.state))
    }

    fn reannounce(&self, only_if_changed: bool) {
        if !only_if_changed || lock(&self.state).announce_dirty {
            NodeInner::announce(self);
        }
    }

    fn set_peers(&self, mut peers: BTreeMap<String, Announcement>) {
        let mut st = lock(&self.state);
        let me = self.announcement_of(&st);
        peers.insert(me.node_id.clone(), me);
        if st.peers != peers {
            st.peers = peers;
            // Under the same lock: `Node::peers` never shows a service
            // that a call would not find yet.
            self.reconcile(&mut st);
        }
    }

    fn announcement_version(&self) -> u64 {
        self.announced.load(Ordering::Relaxed)
    }

    fn broker_report(&self) -> Vec<u8> {
        // Within what a broker takes (docs/protocol.md §11.2): at most
        // 256 expressions of at most 512 bytes, in at most 192 KiB with
        // the counters (160 KiB for the expressions as JSON writes them).
        let mut room = 160usize << 10;
        let subscriptions: Vec<String> = lock(&self.state)
            .subs
            .iter()
            .filter_map(Weak::upgrade)
            .map(|s| s.expr().as_str().to_owned())
            .filter(|e| e.len() <= milonga_wire::key::MAX_KEY_BYTES)
            .take_while(|e| {
                let json = serde_json::to_string(e).map_or(usize::MAX, |j| j.len() + 1);
                let fits = json <= room;
                room = room.saturating_sub(json);
                fits
            })
            .take(milonga_wire::broker::MAX_REPORT_SUBSCRIPTIONS)
            .collect();
        let mut stats: std::collections::BTreeMap<String, u64> =
            match serde_json::to_value(self.core.counters.snapshot()) {
                Ok(serde_json::Value::Object(m)) => m
                    .into_iter()
                    .filter_map(|(k, v)| v.as_u64().map(|v| (k, v)))
                    .collect(),
                _ => Default::default(),
            };
        // Not a counter: how far the application is behind now.
        let queued: usize = self.live_subs().iter().map(|s| s.queued()).sum();
        stats.insert("queued".into(), queued as u64);
        serde_json::to_vec(&milonga_wire::broker::ClientReport {
            subscriptions,
            stats,
        })
        .unwrap_or_default()
    }

    fn broker_changed(&self, from: &str, to: &str) {
        // Announced at the new broker's endpoints.
        self.announce();
        for s in self.live_subs() {
            s.inject(crate::model::sample::Event::BrokerChanged(
                crate::model::sample::BrokerChanged {
                    from: from.to_owned(),
                    to: to.to_owned(),
                },
            ));
        }
    }

    fn peer_refused(&self, endpoint: &str, node: Option<NodeId>, status: u32) {
        for s in self.live_subs() {
            s.denied(crate::model::sample::PermissionDenied {
                endpoint: endpoint.to_owned(),
                publisher: node,
                reason: format!("its node refused this node's key (ZAP status {status}) when asked for its announcement: it is not in that node's trust directory"),
            });
        }
    }

    /// The last sequence number of each key, for a goodbye: the keys
    /// declared now first (by key), then those retired, the latest first
    /// (a goodbye carries 8,192: retired keys pushed declared ones out).
    fn last_seqs(&self) -> Vec<(String, u64)> {
        let st = lock(&self.state);
        let mut declared: Vec<(String, u64)> = st
            .pub_seqs
            .iter()
            .map(|(k, s)| (k.clone(), s.load(Ordering::Relaxed)))
            .collect();
        declared.sort_unstable();
        let mut retired: Vec<(u64, &String, u64)> = st
            .last_seq
            .iter()
            .filter(|(k, _)| !st.pub_seqs.contains_key(*k))
            .map(|(k, (seq, when))| (*when, k, *seq))
            .collect();
        retired.sort_unstable_by_key(|r| std::cmp::Reverse(r.0));
        declared.extend(retired.into_iter().map(|(_, k, seq)| (k.clone(), seq)));
        declared
    }
}
