//! The node: one process's membership in a domain.

use crate::util::lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use milonga_wire::frame::domain_tag;
use milonga_wire::{Key, KeyExpr, NodeId};

use crate::api::publisher::Publisher;
use crate::api::subscriber::{SubShared, Subscriber};
use crate::backend::p2p::control;
use crate::backend::p2p::data::{DataSock, DataSocket};
use crate::backend::p2p::zmq_io::{self, ContextRef};
use crate::discovery::{process_start_time, Announcement, LocalDir, PublicationInfo};
use crate::engine::batch::Pending;
use crate::model::config::{parse_locator, Config, Transport};
use crate::model::error::IntoTransport;
use crate::model::error::{OpenError, PublisherError, SubscribeError};
use crate::model::qos::{PublisherQos, Reliability, SubscriberQos};
use crate::model::sample::Event;
use crate::util::stats::{Counters, NodeStats};

#[derive(Default)]
pub(crate) struct NodeState {
    /// Declared publications: key -> (reliability, history depth).
    pub publications: BTreeMap<String, (Reliability, usize)>,
    /// Services served, by key.
    pub services: BTreeMap<String, crate::api::service::ServiceInfo>,
    pub data_best_effort: Option<Arc<DataSocket>>,
    pub data_reliable: Option<Arc<DataSocket>>,
    pub subs: Vec<Weak<SubShared>>,
    /// Live peers by node id (hex), this node included.
    pub peers: BTreeMap<String, Announcement>,
    pub announce_dirty: bool,
    /// Last sequence number of keys whose publisher was dropped.
    pub last_seq: HashMap<String, u64>,
    /// The sequence counters of the live publishers, by key: a goodbye
    /// tells subscribers the last sequence number of each key.
    pub pub_seqs: HashMap<String, Arc<AtomicU64>>,
    /// Monitors of data sockets created since the node thread last looked.
    pub new_monitors: Vec<(&'static str, zmq::Socket)>,
    /// Monitors of subscriptions declared since the node thread last
    /// looked: it watches them and tells each subscription of closed
    /// connections.
    pub new_sub_monitors: Vec<(Weak<SubShared>, crate::backend::p2p::sub_link::Monitor)>,
    /// Monitors of services started since the node thread last looked.
    pub new_svc_monitors: Vec<crate::backend::p2p::control::SvcMonitor>,
}

/// Shared by the node handle, its publishers, subscribers and its thread.
pub(crate) struct NodeInner {
    pub id: NodeId,
    pub name: String,
    pub domain: String,
    pub domain_tag: u32,
    pub cfg: Config,
    pub counters: Counters,
    pub closed: AtomicBool,
    /// A reliable publisher left a batch for the node thread to send.
    pub batch_pending: AtomicBool,
    pub state: Mutex<NodeState>,
    pub local: Option<Mutex<LocalDir>>,
    pub control_endpoint: String,
    /// Where the node thread publishes heartbeats.
    pub liveliness_endpoint: String,
    pub host: String,
    pub start_time: u64,
    next_sub_id: AtomicU64,
    next_service_id: AtomicU64,
    /// Calls: the servers discovery knows, and their connections.
    pub callers: crate::api::call::Callers,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Wakes the node thread (see [`NodeInner::wake`]).
    wake_tx: Mutex<zmq::Socket>,
    // Declared last: sockets above are closed before the context goes.
    pub ctx: ContextRef,
}

/// A node: opens sockets in a domain, declares publishers and subscribers.
///
/// ```no_run
/// let node = milonga::Node::open("milonga:///lab", "power-supply")?;
/// let current = node.publisher("sr/ps/1/current")?;
/// current.put(12.5)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Dropping the node closes it ([`Node::close`]).
pub struct Node {
    pub(crate) inner: Arc<NodeInner>,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}

impl NodeInner {
    /// A number for the next service's endpoint.
    pub(crate) fn next_service_id(&self) -> u64 {
        self.next_service_id.fetch_add(1, Ordering::Relaxed)
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

    /// This node as the engine sees it.
    pub(crate) fn me(&self) -> crate::engine::Me<'_> {
        crate::engine::Me {
            id: self.id,
            domain_tag: self.domain_tag,
            max_message_bytes: self.cfg.max_message_bytes,
            counters: &self.counters,
        }
    }

    /// Wakes the node thread now rather than at its next turn: a batch
    /// started waiting.
    pub(crate) fn wake(&self) {
        let _ = lock(&self.wake_tx).send(&[][..], zmq::DONTWAIT);
    }

    /// The endpoint to bind for a new socket of role `role` (`c`, `be`, `r`).
    pub(crate) fn endpoint_for(&self, role: &str, fixed: Option<&String>) -> String {
        if let Some(e) = fixed {
            return e.clone();
        }
        let short = &self.id.to_hex()[..12];
        match self.cfg.transport {
            Transport::Tcp => format!("tcp://{}:*", self.cfg.tcp_host),
            Transport::Ipc => {
                let dir = self.cfg.runtime_root().join(&self.domain);
                format!("ipc://{}/{short}-{role}.sock", dir.display())
            }
            Transport::Inproc => format!("inproc://milonga-{}-{role}", self.id.to_hex()),
        }
    }

    pub(crate) fn bind(&self, sock: &zmq::Socket, endpoint: &str) -> Result<String, OpenError> {
        sock.bind(endpoint)
            .map_err(|source: zmq::Error| OpenError::Socket {
                action: "bind",
                endpoint: endpoint.to_owned(),
                source: source.transport(),
            })?;
        Ok(sock
            .get_last_endpoint()
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| endpoint.to_owned()))
    }

    /// The data socket for `reliability`, created on first use.
    pub(crate) fn data_socket(
        &self,
        reliability: Reliability,
    ) -> Result<Arc<DataSocket>, OpenError> {
        let mut st = lock(&self.state);
        let existing = match reliability {
            Reliability::BestEffort => &st.data_best_effort,
            Reliability::Reliable => &st.data_reliable,
        };
        if let Some(d) = existing {
            return Ok(d.clone());
        }
        let mut sock = self.ctx.socket(zmq::XPUB)?;
        let fixed = match reliability {
            Reliability::BestEffort => self.cfg.data_endpoint.as_ref(),
            Reliability::Reliable => self.cfg.reliable_data_endpoint.as_ref(),
        };
        let role: &'static str = match reliability {
            Reliability::BestEffort => "be",
            Reliability::Reliable => "r",
        };
        let endpoint = self.endpoint_for(role, fixed);
        let opt_err = |source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: endpoint.clone(),
            source: source.transport(),
        };
        zmq_io::apply_common(&sock, &self.cfg).map_err(opt_err)?;
        // Subscriptions and history queries are small; refuse anything
        // large on this side.
        sock.set_maxmsgsize(crate::engine::history::MAX_QUERY_BYTES as i64)
            .map_err(opt_err)?;
        sock.set_linger(self.cfg.close_linger_ms).map_err(opt_err)?;
        zmq_io::set_xpub_verboser(&mut sock).map_err(opt_err)?;
        if reliability == Reliability::Reliable {
            zmq_io::set_xpub_nodrop(&mut sock, true).map_err(opt_err)?;
            sock.set_sndhwm(self.cfg.reliable_send_hwm)
                .map_err(opt_err)?;
        }
        let bound = self.bind(&sock, &endpoint)?;
        let monitor = control::monitor(self, &sock, role)?;
        st.new_monitors.push((role, monitor));
        // From now on the node thread reads this socket every turn.
        self.wake();
        let d = Arc::new(DataSocket {
            sock: Mutex::new(DataSock::new(sock, reliability)),
            endpoint: bound,
        });
        match reliability {
            Reliability::BestEffort => st.data_best_effort = Some(d.clone()),
            Reliability::Reliable => st.data_reliable = Some(d.clone()),
        }
        st.announce_dirty = true;
        Ok(d)
    }

    pub(crate) fn announcement(&self, st: &NodeState) -> Announcement {
        Announcement {
            protocol: milonga_wire::frame::PROTOCOL_VERSION,
            domain: self.domain.clone(),
            node_id: self.id.to_hex(),
            name: self.name.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            start_time: self.start_time,
            control: self.control_endpoint.clone(),
            data_best_effort: st.data_best_effort.as_ref().map(|d| d.endpoint.clone()),
            data_reliable: st.data_reliable.as_ref().map(|d| d.endpoint.clone()),
            liveliness: Some(self.liveliness_endpoint.clone()),
            publications: st
                .publications
                .iter()
                .map(|(k, (r, h))| PublicationInfo {
                    key: k.clone(),
                    reliability: *r,
                    history: *h,
                })
                .collect(),
            services: st.services.values().cloned().collect(),
        }
    }

    /// Publishes the current announcement: in the local directory, and in
    /// the peer table so that this node's own subscriptions see it.
    ///
    /// The directory lock is held from building to writing (lock order:
    /// directory, then state), so that two concurrent announcements cannot
    /// write an older one last, and none is written after `close`.
    pub(crate) fn announce(&self) {
        let dir = self.local.as_ref().map(lock);
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let a = {
            let mut st = lock(&self.state);
            st.announce_dirty = false;
            let a = self.announcement(&st);
            st.peers.insert(a.node_id.clone(), a.clone());
            a
        };
        if let Some(dir) = dir {
            if let Err(err) = dir.write(&a) {
                tracing::warn!(%err, "cannot write the local announcement");
            }
        }
        self.reconcile();
    }

    /// Connects every subscription to the data endpoints of the peers that
    /// publish keys it matches, and disconnects it from the others.
    ///
    /// Runs with the state lock held, so that a caller with an older view of
    /// the peers cannot overwrite a newer one (lock order: state, then a
    /// subscription's target; the subscription socket is only try-locked).
    pub(crate) fn reconcile(&self) {
        let mut st = lock(&self.state);
        st.subs.retain(|w| w.strong_count() > 0);
        let subs: Vec<_> = st.subs.iter().filter_map(Weak::upgrade).collect();
        self.callers.update(&st.peers.values().collect::<Vec<_>>());
        for s in subs {
            self.connect_subscription(&st, &s);
        }
    }

    /// Points one subscription at the data and liveliness endpoints of the
    /// peers in `st` that publish keys it matches.
    pub(crate) fn connect_subscription(&self, st: &NodeState, s: &SubShared) {
        let peers: Vec<&Announcement> = st.peers.values().collect();
        s.set_routes(crate::engine::routes::routes_for(&s.expr, &peers));
    }
}

impl Node {
    /// Opens a node on `locator` (`milonga:///lab`) named `name`, with the
    /// configuration from the environment (see docs/config.md):
    /// `MILONGA_LOCATOR`, when set, replaces `locator`.
    pub fn open(locator: &str, name: &str) -> Result<Node, OpenError> {
        Node::open_with(Config::from_env(locator, name)?)
    }

    /// Opens a node with an explicit configuration.
    pub fn open_with(cfg: Config) -> Result<Node, OpenError> {
        let loc = parse_locator(&cfg.locator)?;
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
            Some(Mutex::new(
                LocalDir::open(&root, &loc.domain, private).map_err(|source| {
                    OpenError::RuntimeDir {
                        path: root.display().to_string(),
                        source,
                    }
                })?,
            ))
        } else {
            None
        };
        for (key, v) in [
            ("send_hwm", cfg.send_hwm),
            ("reliable_send_hwm", cfg.reliable_send_hwm),
            ("recv_hwm", cfg.recv_hwm),
        ] {
            if v < 1 {
                return Err(OpenError::Config {
                    key: key.into(),
                    why: format!("{v} is not a number of messages (at least 1); libzmq would take 0 as no limit"),
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
        let ctx = ContextRef::acquire();
        let wake_ep = format!("inproc://milonga-nodewake-{}", NodeId(id));
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
        let mut inner = NodeInner {
            id: NodeId(id),
            name,
            domain_tag: domain_tag(&loc.domain),
            domain: loc.domain,
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            batch_pending: AtomicBool::new(false),
            state: Mutex::new(NodeState::default()),
            local,
            control_endpoint: String::new(),
            liveliness_endpoint: String::new(),
            host,
            start_time: process_start_time(pid).unwrap_or(0),
            next_sub_id: AtomicU64::new(1),
            next_service_id: AtomicU64::new(1),
            callers: crate::api::call::Callers::default(),
            thread: Mutex::new(None),
            wake_tx: Mutex::new(wake_tx),
            ctx,
            cfg,
        };
        let router = inner.ctx.socket(zmq::ROUTER)?;
        let ep = inner.endpoint_for("c", inner.cfg.control_endpoint.as_ref());
        zmq_io::apply_common(&router, &inner.cfg)
            .and_then(|_| router.set_maxmsgsize(65_536))
            .map_err(|source: zmq::Error| OpenError::Socket {
                action: "configure",
                endpoint: ep.clone(),
                source: source.transport(),
            })?;
        inner.control_endpoint = inner.bind(&router, &ep)?;
        let live = control::liveliness_socket(&inner)?;
        let ep = inner.endpoint_for("hb", None);
        inner.liveliness_endpoint = inner.bind(&live, &ep)?;
        let inner = Arc::new(inner);
        let monitor = control::monitor(&inner, &router, "control")?;
        let live_monitor = control::monitor(&inner, &live, "liveliness")?;
        lock(&inner.state)
            .new_monitors
            .push(("liveliness", live_monitor));
        // Find the peers that exist now, so that a subscription declared
        // right after `open` connects to them before it returns.
        let mut ctl = control::Control::new(inner.clone(), router, monitor, wake_rx, live);
        ctl.scan_local();
        inner.announce();
        match control::spawn(ctl) {
            Ok(th) => *lock(&inner.thread) = Some(th),
            Err(e) => {
                close(&inner);
                return Err(OpenError::Thread(e));
            }
        }
        tracing::debug!(node = %inner.name, id = %inner.id, domain = %inner.domain, "node open");
        Ok(Node { inner })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// This node's name, `name@host:pid`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.inner.domain
    }

    /// Declares a best-effort publisher of `key`.
    pub fn publisher(&self, key: &str) -> Result<Publisher, PublisherError> {
        self.publisher_with(key, PublisherQos::default())
    }

    /// Declares a publisher of `key` with `qos`.
    pub fn publisher_with(
        &self,
        key: &str,
        qos: PublisherQos,
    ) -> Result<Publisher, PublisherError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(PublisherError::Closed);
        }
        let key = Key::new(key)?;
        let data = self.inner.data_socket(qos.reliability)?;
        let last_seq = {
            let mut st = lock(&self.inner.state);
            if st.publications.contains_key(key.as_str()) {
                return Err(PublisherError::AlreadyDeclared(key.as_str().to_owned()));
            }
            st.publications
                .insert(key.as_str().to_owned(), (qos.reliability, qos.history));
            st.last_seq.get(key.as_str()).copied().unwrap_or(0)
        };
        // After the check (a refused second declaration must not touch the
        // first one's history), and not under the state lock: a reliable
        // put may hold the data socket while it waits.
        if qos.history > 0 {
            lock(&data.sock).out.keep_history(key.as_str(), qos.history);
        }
        let p = Publisher::new(self.inner.clone(), key, qos, data, last_seq);
        lock(&self.inner.state)
            .pub_seqs
            .insert(p.key().to_owned(), p.seq_counter());
        self.inner.announce();
        Ok(p)
    }

    /// Subscribes to `expr`; events queue for [`Subscriber::recv`].
    pub fn subscribe(&self, expr: &str) -> Result<Subscriber, SubscribeError> {
        self.subscribe_with(expr, SubscriberQos::default())
    }

    /// Subscribes to `expr` with `qos`; events queue for [`Subscriber::recv`].
    pub fn subscribe_with(
        &self,
        expr: &str,
        qos: SubscriberQos,
    ) -> Result<Subscriber, SubscribeError> {
        self.declare_subscriber(expr, qos, None)
    }

    /// Subscribes to `expr` with `qos`; `callback` runs for every event on a
    /// dispatcher thread of this subscription.
    pub fn subscribe_callback<F>(
        &self,
        expr: &str,
        qos: SubscriberQos,
        callback: F,
    ) -> Result<Subscriber, SubscribeError>
    where
        F: FnMut(Event) + Send + 'static,
    {
        self.declare_subscriber(expr, qos, Some(Box::new(callback)))
    }

    fn declare_subscriber(
        &self,
        expr: &str,
        qos: SubscriberQos,
        callback: Option<Box<dyn FnMut(Event) + Send>>,
    ) -> Result<Subscriber, SubscribeError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(SubscribeError::Closed);
        }
        let expr = KeyExpr::new(expr)?;
        if let Some(f) = &qos.filter {
            f.validate()?;
            if qos.last > 0 || qos.reliable {
                return Err(SubscribeError::Qos(
                    "a filter cannot be combined with last or reliable yet: history is kept unfiltered"
                        .into(),
                ));
            }
        }
        if qos
            .deadline
            .is_some_and(|d| d.is_zero() || d > Duration::from_secs(365 * 86_400))
        {
            return Err(SubscribeError::Qos(
                "a deadline must be longer than zero and at most a year".into(),
            ));
        }
        let id = self.inner.next_sub_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(SubShared::new(&self.inner, id, expr, &qos)?);
        {
            let mut st = lock(&self.inner.state);
            st.subs.push(Arc::downgrade(&shared));
            if let Some(m) = lock(&shared.monitor).take() {
                st.new_sub_monitors.push((Arc::downgrade(&shared), m));
                // The node thread may be asleep until its next timer; it
                // must watch the new monitor now.
                self.inner.wake();
            }
            // Connect to the publishers known now, before returning.
            self.inner.connect_subscription(&st, &shared);
        }
        Subscriber::start(self.inner.clone(), shared, callback)
    }

    /// Serves `key` with `handler` on a pool of worker threads (see
    /// [`ServeOptions`](crate::ServeOptions) for the defaults). The handler takes a request and
    /// returns the reply value or a [`ServiceError`](crate::ServiceError); a panic in it is
    /// answered as a remote error of kind `panic`, and the service goes on.
    /// Dropping the returned [`Service`](crate::Service) withdraws it.
    ///
    /// ```no_run
    /// use milonga::{Node, ServiceError, Value};
    /// let node = Node::open("milonga:///lab", "power-supply")?;
    /// let _svc = node.serve("sr/ps/1/set_current", |req| {
    ///     let amps = req.value.as_f64().ok_or("expected a number")?;
    ///     if amps > 500.0 {
    ///         return Err(ServiceError::new("out_of_range", format!("{amps} A is above 500 A")));
    ///     }
    ///     Ok(Value::from(amps))
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn serve<F>(&self, key: &str, handler: F) -> Result<crate::Service, crate::ServeError>
    where
        F: Fn(crate::Request) -> Result<milonga_wire::Value, crate::ServiceError>
            + Send
            + Sync
            + 'static,
    {
        self.serve_with(key, crate::ServeOptions::default(), handler)
    }

    /// Serves `key` with `handler` and `options`.
    pub fn serve_with<F>(
        &self,
        key: &str,
        options: crate::ServeOptions,
        handler: F,
    ) -> Result<crate::Service, crate::ServeError>
    where
        F: Fn(crate::Request) -> Result<milonga_wire::Value, crate::ServiceError>
            + Send
            + Sync
            + 'static,
    {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(crate::ServeError::Closed);
        }
        let key = Key::new(key)?;
        if lock(&self.inner.state).services.contains_key(key.as_str()) {
            return Err(crate::ServeError::AlreadyServed(key.as_str().to_owned()));
        }
        let svc = crate::Service::start(&self.inner, key, options, Box::new(handler))?;
        {
            let mut st = lock(&self.inner.state);
            if st.services.contains_key(svc.key()) {
                // Another thread served the same key meanwhile.
                drop(st);
                let k = svc.key().to_owned();
                drop(svc);
                return Err(crate::ServeError::AlreadyServed(k));
            }
            st.services.insert(svc.key().to_owned(), svc.info());
        }
        self.inner.announce();
        Ok(svc)
    }

    /// Calls the service `key` with `value`, waiting at most `timeout`.
    ///
    /// The server is the one, of those discovery knows, with the fewest
    /// calls in flight from this node (ties round robin). Any number of
    /// threads may call at once.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let node = milonga::Node::open("milonga:///lab", "gui")?;
    /// let reply = node.call("sr/ps/1/set_current", 12.5, Duration::from_secs(1))?;
    /// println!("{reply:?}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call(
        &self,
        key: &str,
        value: impl Into<milonga_wire::Value>,
        timeout: Duration,
    ) -> Result<milonga_wire::Value, crate::CallError> {
        crate::api::call::start(&self.inner, key, &value.into(), timeout)?.wait()
    }

    /// Sends a call and returns at once; [`crate::PendingCall::wait`] or
    /// `.await` gives its outcome. Errors known before sending (no server,
    /// bad key, too large) come back here. Awaiting uses a helper thread
    /// for the wait; dropping the future stops it within 50 ms.
    pub fn call_async(
        &self,
        key: &str,
        value: impl Into<milonga_wire::Value>,
        timeout: Duration,
    ) -> Result<crate::PendingCall, crate::CallError> {
        crate::api::call::start(&self.inner, key, &value.into(), timeout)
    }

    /// Calls every server of every key matching `expr` with `value` and
    /// gathers their outcomes, all within `timeout`. `NoServer` if none
    /// matches.
    pub fn call_all(
        &self,
        expr: &str,
        value: impl Into<milonga_wire::Value>,
        timeout: Duration,
    ) -> Result<Vec<crate::ServerReply>, crate::CallError> {
        let sent = crate::api::call::start_all(&self.inner, expr, &value.into(), timeout)?;
        Ok(crate::api::call::gather(sent))
    }

    /// The nodes this node currently knows in its domain, itself included.
    pub fn peers(&self) -> Vec<Announcement> {
        lock(&self.inner.state).peers.values().cloned().collect()
    }

    /// A snapshot of this node's counters.
    pub fn stats(&self) -> NodeStats {
        self.inner.counters.snapshot()
    }

    /// Closes the node: its publishers and subscribers stop (their calls
    /// return `Closed`), its announcement is withdrawn, and queued samples
    /// get up to `close_linger_ms` to leave. Idempotent.
    pub fn close(&self) {
        close(&self.inner);
    }
}

pub(crate) fn close(inner: &Arc<NodeInner>) {
    if inner.closed.swap(true, Ordering::AcqRel) {
        return;
    }
    inner.wake();
    if let Some(th) = lock(&inner.thread).take() {
        let _ = th.join();
    }
    // A batch still waiting gets the linger time to leave.
    let reliable = lock(&inner.state).data_reliable.clone();
    if let Some(d) = reliable {
        let mut g = lock(&d.sock);
        if g.out.pending().is_some() {
            // A negative linger waits as long as it takes, as libzmq's does.
            let _ = g.sock.set_sndtimeo(inner.cfg.close_linger_ms.max(-1));
            if g.send_pending(0, &inner.counters).is_err() {
                let n = g.out.pending().as_ref().map_or(0, Pending::samples);
                tracing::warn!(
                    samples = n,
                    "closing with a batch that no subscriber took within close_linger_ms"
                );
            }
        }
    }
    let subs: Vec<_> = {
        let mut st = lock(&inner.state);
        st.publications.clear();
        std::mem::take(&mut st.subs)
    };
    for s in subs.iter().filter_map(Weak::upgrade) {
        s.wake();
    }
    if let Some(dir) = &inner.local {
        let mut dir = lock(dir);
        let a = inner.announcement(&lock(&inner.state));
        crate::discovery::remove_ipc_files(&a, &dir.dir, true);
        dir.remove(&inner.id.to_hex());
    }
    tracing::debug!(node = %inner.name, "node closed");
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.inner.name)
            .field("id", &self.inner.id)
            .field("domain", &self.inner.domain)
            .finish()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        close(&self.inner);
    }
}
