//! The node: one process's membership in a domain.

use std::sync::Arc;
use std::time::Duration;

use milonga_wire::{Key, KeyExpr, NodeId};

use crate::api::file_node::FileNode;
use crate::api::publisher::Publisher;
use crate::api::subscriber::{SubShared, Subscriber};
use crate::discovery::Announcement;
use crate::model::config::Config;
use crate::model::error::{OpenError, PublisherError, SubscribeError};
use crate::model::qos::{PublisherQos, SubscriberQos};
use crate::model::sample::Event;
use crate::session::{NodeInner, RouteTarget};
use crate::util::lock;
use crate::util::stats::NodeStats;

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
    /// With a `file:///` locator: the recording (api/file_node.rs).
    pub(crate) file: Option<Arc<FileNode>>,
}

impl Node {
    /// Opens a node on `locator` (`milonga:///lab`) named `name`, with the
    /// configuration from the environment (see docs/config.md):
    /// `MILONGA_LOCATOR`, when set, replaces `locator`.
    pub fn open(locator: &str, name: &str) -> Result<Node, OpenError> {
        Node::open_with(Config::from_env(locator, name)?)
    }

    /// Opens a node with an explicit configuration. A `file:///PATH`
    /// locator opens the recording at PATH (docs/recording.md): it must be
    /// one, or not exist yet in a directory that does.
    pub fn open_with(mut cfg: Config) -> Result<Node, OpenError> {
        let loc = crate::model::config::parse_locator(&cfg.locator)?;
        // A field set directly is checked as `set` checks the key.
        if !matches!(cfg.compression.as_str(), "none" | "lz4" | "zstd") {
            return Err(OpenError::Config {
                key: "compression".into(),
                why: format!("{:?}: expected none, lz4 or zstd", cfg.compression),
            });
        }
        let Some(path) = loc.file else {
            return Ok(Node {
                inner: NodeInner::open(cfg)?,
                file: None,
            });
        };
        let speed = crate::model::config::parse_speed(&cfg.file_speed).map_err(|why| {
            OpenError::Config {
                key: "file_speed".into(),
                why,
            }
        })?;
        check_recording(&path)?;
        // The node underneath stays within this process.
        cfg.transport = crate::Transport::Inproc;
        cfg.security = crate::Security::Off;
        cfg.local_discovery = false;
        cfg.scouting = false;
        cfg.peers.clear();
        let inner = NodeInner::open(cfg)?;
        let file = FileNode::new(path, speed, inner.id(), &inner.core().name);
        Ok(Node {
            inner,
            file: Some(Arc::new(file)),
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.inner.id()
    }

    /// This node's name, `name@host:pid`.
    pub fn name(&self) -> &str {
        &self.inner.core().name
    }

    /// The domain.
    pub fn domain(&self) -> &str {
        &self.inner.core().domain
    }

    /// Whether this node's connections are secured (docs/security.md):
    /// `On` or `Off` (`Auto` resolved at open).
    pub fn security(&self) -> crate::Security {
        self.inner.core().cfg.effective_security()
    }

    /// The broker this node is attached to now (`tcp://HOST:PORT`), when
    /// it was opened on `milonga://HOST:PORT/DOMAIN` (docs/broker.md).
    pub fn broker(&self) -> Option<String> {
        self.inner.backend().uplink().map(|u| u.broker)
    }

    /// This node's CURVE public key, when its security is on.
    pub fn public_key(&self) -> Option<crate::security::PublicKey> {
        self.inner.backend().public_key()
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
        let p = self.declare_publisher(key, qos)?;
        self.inner.publisher_started(p.key(), p.seq_counter());
        Ok(p)
    }

    /// Declares a publisher of each of `keys` with `qos`, as
    /// [`Node::publisher_with`] does one, announced once for all: each
    /// declaration announces the node's every publication, so declaring
    /// thousands one by one costs time in the square of their number (a
    /// replay of a recording of many keys). On an error, the publishers
    /// declared so far are withdrawn.
    pub fn publishers_with<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k str>,
        qos: PublisherQos,
    ) -> Result<Vec<Publisher>, PublisherError> {
        let mut out = Vec::new();
        let declare = || -> Result<(), PublisherError> {
            for key in keys {
                let p = self.declare_publisher(key, qos.clone())?;
                self.inner.publisher_ready(p.key(), p.seq_counter());
                out.push(p);
            }
            Ok(())
        };
        let declared = declare();
        if declared.is_err() {
            // Withdrawn (announced by the node thread, once).
            out.clear();
        } else {
            self.inner.announce();
        }
        declared.map(|()| out)
    }

    fn declare_publisher(&self, key: &str, qos: PublisherQos) -> Result<Publisher, PublisherError> {
        if self.inner.is_closed() {
            return Err(PublisherError::Closed);
        }
        let key = Key::new(key)?;
        let data = self.inner.data_socket(qos.reliability, key.as_str())?;
        // The schema is checked and kept by the data socket (for the
        // queries that ask for it) before the publication is announced.
        let schema = match &qos.schema {
            Some(s) => {
                let bytes = s.encode()?;
                let id = crate::Schema::id_of(&bytes);
                lock(&data.sock)
                    .out
                    .add_schema(id, &bytes, s)
                    .map_err(|why| PublisherError::Schema(crate::SchemaError::Invalid(why)))?;
                Some(id)
            }
            None => None,
        };
        let last_seq = self.inner.declare_publication(
            key.as_str(),
            qos.reliability,
            qos.history,
            schema,
            &data,
        )?;
        // After the check (a refused second declaration must not touch the
        // first one's history), and not under the state lock: a reliable
        // put may hold the data socket while it waits.
        if qos.history > 0 {
            lock(&data.sock)
                .out
                .keep_history(key.as_str(), qos.history, qos.replayed);
        }
        let mut p = Publisher::new(self.inner.clone(), key, qos, data, last_seq, schema);
        p.file = self.file.clone();
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
        if self.inner.is_closed() {
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
        if let Some(s) = &qos.schema {
            s.encode()
                .map_err(|e| SubscribeError::Qos(format!("the reader's schema: {e}")))?;
        }
        // The transport takes a queue of 0 for one without a bound: refused.
        if let Some(q) = qos.queue_depth.filter(|q| *q < 1) {
            return Err(SubscribeError::Qos(format!(
                "queue_depth {q}: at least 1 (messages per publisher)"
            )));
        }
        if qos
            .deadline
            .is_some_and(|d| d.is_zero() || d > Duration::from_secs(365 * 86_400))
        {
            return Err(SubscribeError::Qos(
                "a deadline must be longer than zero and at most a year".into(),
            ));
        }
        let id = self.inner.next_sub_id();
        let shared = Arc::new(SubShared::new(&self.inner, id, expr, &qos)?);
        let routed: Arc<dyn RouteTarget> = shared.clone();
        self.inner.add_subscription(Arc::downgrade(&routed));
        // The monitors of its sockets: the first, and those made by the
        // connections just made; later ones are handed over as made.
        let _ = shared.this.set(Arc::downgrade(&shared));
        let monitors = std::mem::take(&mut *lock(&shared.monitors));
        for m in monitors {
            let watcher: Arc<dyn crate::backend::p2p::sub_link::ConnectionWatcher> = shared.clone();
            self.inner
                .backend()
                .watch_subscription(Arc::downgrade(&watcher), m);
        }
        if let Some(file) = &self.file {
            file.feed(shared.clone(), shared.core.expr.clone())?;
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
        if self.inner.is_closed() {
            return Err(crate::ServeError::Closed);
        }
        let key = Key::new(key)?;
        if self.inner.serves(key.as_str()) {
            return Err(crate::ServeError::AlreadyServed(key.as_str().to_owned()));
        }
        let svc = crate::Service::start(&self.inner, key, options, Box::new(handler))?;
        if !self.inner.declare_service(svc.info()) {
            // Another thread served the same key meanwhile.
            let k = svc.key().to_owned();
            drop(svc);
            return Err(crate::ServeError::AlreadyServed(k));
        }
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
        self.inner.peers()
    }

    /// How many peers discovery shows now: [`Node::peers`]'s length,
    /// without copying a thousand announcements to count them.
    pub fn peer_count(&self) -> usize {
        self.inner.peer_count()
    }

    /// A snapshot of this node's counters.
    pub fn stats(&self) -> NodeStats {
        self.inner.counters().snapshot()
    }

    /// Closes the node: its publishers and subscribers stop (their calls
    /// return `Closed`), its announcement is withdrawn, and queued samples
    /// get up to `close_linger_ms` to leave. Idempotent.
    pub fn close(&self) {
        if let Some(f) = &self.file {
            f.close();
        }
        self.inner.close();
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name())
            .field("id", &self.id())
            .field("domain", &self.domain())
            .finish()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.close();
    }
}

/// A `file:///` path must be a recording, or not exist yet in a
/// directory that does.
fn check_recording(path: &std::path::Path) -> Result<(), OpenError> {
    let bad = |why: String| OpenError::BadLocator {
        locator: format!("file://{}", path.display()),
        why,
    };
    if path.exists() {
        let mut r =
            crate::backend::file::RecordReader::open(path).map_err(|e| bad(e.to_string()))?;
        r.next_entry().map_err(|e| bad(e.to_string()))?;
        return Ok(());
    }
    match path.parent() {
        Some(dir) if dir.is_dir() => Ok(()),
        _ => Err(bad(
            "no such recording, nor a directory to make it in".into()
        )),
    }
}
