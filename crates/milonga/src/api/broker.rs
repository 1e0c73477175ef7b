//! The broker (docs/broker.md): serves nodes opened on
//! `milonga://HOST:PORT/DOMAIN`, and (with security off) is a node of
//! each domain it serves, so that its clients and the peer-to-peer nodes
//! of its host see each other's publications. With security on it serves
//! its clients only, each admitted by its key (docs/broker.md "Security").
//!
//! ```no_run
//! let broker = milonga::broker::Broker::start(milonga::broker::BrokerOptions {
//!     domains: vec!["lab".into()],
//!     ..Default::default()
//! })?;
//! let node = milonga::Node::open(&broker.locator("lab"), "gui")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use milonga_wire::announce::Announcement;

pub use crate::backend::p2p::broker::BrokerStats;
use crate::backend::p2p::broker::{self, BrokerSpec, DomainHost, Running};
use crate::model::config::Config;
use crate::model::error::OpenError;
use crate::Node;
pub use milonga_wire::broker::ClientInfo;

/// The port a broker listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 7447;

/// The most domains a broker serving every domain opens
/// ([`BrokerOptions::max_domains`] is taken down to it): each takes about
/// thirty of the 1,023 sockets the transport allows a process, and as many file
/// descriptors.
pub const MAX_DOMAINS: usize = 24;

/// How a broker runs.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// Where clients reach it: `tcp://HOST:PORT` (default
    /// `tcp://127.0.0.1:7447`; port 0 picks a free one). Its other sockets
    /// are bound at free ports of the same host, told to clients when
    /// they ask.
    pub listen: String,
    /// The domains it serves; none: every domain a client, a registered
    /// node or a federated broker names, each opened when first named
    /// (at most `max_domains`).
    pub domains: Vec<String>,
    /// Most domains served when `domains` is empty (default 16, at most
    /// [`MAX_DOMAINS`]): each costs a node, four threads and about thirty
    /// sockets, and a client could otherwise make the broker open domains
    /// without end.
    pub max_domains: usize,
    /// A domain opened when named (`domains` empty) closes after this
    /// long without a client, a registered node or a federated broker
    /// naming it (ms, default 60,000; at least `lease_ms`), and opens
    /// again when named again; domains given in `domains` stay open.
    pub domain_idle_ms: u64,
    /// How often clients attach (ms, default 250).
    pub attach_interval_ms: u64,
    /// A client that has not attached for this long is forgotten, and
    /// clients take a broker silent for this long as lost (ms, default
    /// 3000).
    pub lease_ms: u64,
    /// How long a reliable message waits for a client whose queue is full
    /// before it is dropped for that client (ms, default 1000); messages
    /// of publishers it does not read do not wait (docs/broker.md).
    pub stall_ms: u64,
    /// MiB of reliable messages the broker holds, per domain, for clients
    /// whose queue is full before it stops reading the publishers until
    /// they have room (default 16; docs/broker.md).
    pub hold_mib: u64,
    /// Most clients served at once (default 10,000).
    pub max_clients: usize,
    /// Registry mode: most endpoints of registered nodes' publishers the
    /// broker connects to for its clients, a domain (default 1,024; each
    /// a connection and a file descriptor). Past it, a registered node
    /// whose publications a client asks for is neither connected to nor
    /// told to the clients (counted in `registered_unconnected`).
    pub max_registered_connected: usize,
    /// The brokers it links to, by their listen endpoints
    /// (`tcp://HOST:PORT` or `HOST:PORT`): a federation (docs/broker.md).
    /// A link is two-way; one end naming the other is enough. With
    /// security on, `NAME@tcp://HOST:PORT` names the peer's key (a name of
    /// the trust directory, or a key in Z85; none: the broker's own), and
    /// a broker takes links only from the keys it names so.
    pub peers: Vec<String>,
    /// Serve with security off on an address other hosts can reach
    /// (docs/broker.md): only on a network where every host is trusted.
    /// It turns `Auto` security off; without it, such a `listen` with
    /// security off is refused.
    pub insecure: bool,
    /// Its security (docs/broker.md "Security"): `Auto` (the default)
    /// is on when `listen` is not on loopback or a key is given, as for a
    /// node. On: every connection a client makes to it is CURVE,
    /// admitted only for the keys of `trust_dir`, and a client's frames
    /// are forwarded only under node ids its key gives. `MILONGA_SECURITY`
    /// when left `Auto` here.
    pub security: crate::Security,
    /// Its secret key file (default: `MILONGA_KEY`, else the user's
    /// default identity, docs/security.md).
    pub key_file: Option<std::path::PathBuf>,
    /// The directory of the keys it admits (default: `MILONGA_TRUST`,
    /// else the user's default trust directory).
    pub trust_dir: Option<std::path::PathBuf>,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            listen: format!("tcp://127.0.0.1:{DEFAULT_PORT}"),
            domains: Vec::new(),
            attach_interval_ms: 250,
            lease_ms: 3000,
            stall_ms: 1000,
            hold_mib: 16,
            max_clients: 10_000,
            max_registered_connected: 1024,
            max_domains: 16,
            domain_idle_ms: 60_000,
            peers: Vec::new(),
            insecure: false,
            security: crate::Security::Auto,
            key_file: None,
            trust_dir: None,
        }
    }
}

/// A running broker; dropping it stops it.
pub struct Broker {
    running: Running,
    every_domain: bool,
    /// Its node in each domain given: closed after its threads stopped
    /// (a domain opened when named has its threads joined, then its node
    /// closed, by the control thread, when it closes the domain or ends).
    _nodes: Vec<std::sync::Arc<Node>>,
}

/// The clients of the broker `node` is attached to, in its domain, with
/// what they last reported (subscriptions, counters, rates): `None` if
/// `node` is not a broker client, or its broker did not answer within
/// `timeout`. `milonga ls` shows them.
pub fn clients(node: &Node, timeout: std::time::Duration) -> Option<Vec<ClientInfo>> {
    let up = node.inner.backend().uplink()?;
    crate::backend::p2p::uplink::clients(node.inner.cfg(), &up, node.domain(), timeout)
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("listen", &self.running.listen)
            .field("domains", &self.endpoints().len())
            .finish()
    }
}

/// Opens the broker's peer-to-peer node in `domain`, configured from the
/// environment (docs/config.md); with the broker's security (`secured`:
/// its configuration) when that is on: the node holds the broker's
/// identity and trust, and meets the host's nodes of that identity.
fn open_domain_node(
    domain: &str,
    secured: Option<&Config>,
) -> Result<std::sync::Arc<Node>, OpenError> {
    let locator = format!("milonga:///{domain}");
    let mut cfg = Config::from_env(&locator, "broker")?;
    if let Some(b) = secured {
        cfg.security = crate::Security::On;
        cfg.key_file.clone_from(&b.key_file);
        cfg.trust_dir.clone_from(&b.trust_dir);
    }
    // Its node is in the domain it serves, peer-to-peer, whatever
    // MILONGA_LOCATOR says (the environment's other settings hold); the
    // name is checked where the node opens.
    cfg.locator = locator;
    // Its clients are announced in the local directory.
    cfg.local_discovery = true;
    Ok(std::sync::Arc::new(Node::open_with(cfg)?))
}

/// The broker's security, when `cfg`'s is on: its identity, its trust
/// directory, and the ZAP handler that judges its clients' connections.
fn broker_security(cfg: &Config) -> Result<Option<broker::BrokerSecurity>, OpenError> {
    let Some((identity, trust_dir)) = crate::backend::p2p::load_identity(cfg)? else {
        return Ok(None);
    };
    let core = std::sync::Arc::new(crate::model::node::NodeCore::new(
        random_id()?,
        format!("broker@{}", std::process::id()),
        "broker".into(),
        cfg.clone(),
    ));
    let guard = crate::backend::p2p::curve::Guard::new(&core, identity, &trust_dir, None)?;
    Ok(Some(broker::BrokerSecurity {
        guard,
        core,
        keys: Default::default(),
    }))
}

/// A random id (the broker's own in a domain, or its guard's).
fn random_id() -> Result<milonga_wire::NodeId, OpenError> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| OpenError::Config {
        key: "node id".into(),
        why: format!("no randomness available: {e}"),
    })?;
    Ok(milonga_wire::NodeId(id))
}

/// The broker's node in one domain.
struct NodeHost(std::sync::Arc<Node>);

impl DomainHost for NodeHost {
    fn domain(&self) -> &str {
        self.0.domain()
    }
    fn node_id(&self) -> String {
        self.0.id().to_hex()
    }
    fn peers(&self) -> Vec<Announcement> {
        self.0.peers()
    }
    fn show(&self, a: &Announcement) {
        self.0.inner.show_local(a);
    }
    fn hide(&self, node_id: &str) {
        self.0.inner.hide_local(node_id);
    }
}

impl Broker {
    /// Opens the broker's node in each domain (with the configuration
    /// from the environment, docs/config.md) and starts serving; with no
    /// domain given, it serves every domain named to it, opening its node
    /// there when first named.
    pub fn start(opts: BrokerOptions) -> Result<Broker, OpenError> {
        let loopback = crate::model::config::is_loopback_endpoint(&opts.listen);
        let mut cfg = Config::from_env("milonga:///broker", "broker")?;
        if opts.security != crate::Security::Auto {
            cfg.security = opts.security;
        }
        if opts.key_file.is_some() {
            cfg.key_file = opts.key_file.clone();
        }
        if opts.trust_dir.is_some() {
            cfg.trust_dir = opts.trust_dir.clone();
        }
        if cfg.security == crate::Security::Auto {
            // `insecure` asks for security off on any address.
            cfg.security = match (!loopback || cfg.key_file.is_some()) && !opts.insecure {
                true => crate::Security::On,
                false => crate::Security::Off,
            };
        }
        let security = broker_security(&cfg)?;
        if security.is_none() && !loopback && !opts.insecure {
            return Err(OpenError::Config {
                key: "listen".into(),
                why: format!(
                    "{}: other hosts could reach this broker and its security is off; leave security on (the default there), listen on loopback, or accept that risk on a trusted network with --insecure (docs/broker.md)",
                    opts.listen
                ),
            });
        }
        let mut nodes = Vec::new();
        let mut hosts: Vec<Box<dyn DomainHost>> = Vec::new();
        // With security on, the broker's node in each domain holds its
        // identity (docs/broker.md "Security").
        let secured = security.is_some().then(|| cfg.clone());
        for d in &opts.domains {
            let node = open_domain_node(d, secured.as_ref())?;
            hosts.push(Box::new(NodeHost(node.clone())));
            nodes.push(node);
        }
        // Every domain: a domain's node opens when a request first names
        // it, and closes with the broker's control thread.
        let open_domain: Option<broker::OpenDomain> = match opts.domains.is_empty() {
            true => Some(Box::new(move |d: &str| {
                Ok(Box::new(NodeHost(open_domain_node(d, secured.as_ref())?))
                    as Box<dyn DomainHost>)
            })),
            false => None,
        };
        let spec = BrokerSpec {
            listen: opts.listen,
            attach_interval_ms: opts.attach_interval_ms.max(10),
            lease_ms: opts.lease_ms.max(100),
            stall_ms: opts.stall_ms,
            hold_mib: opts.hold_mib,
            max_clients: opts.max_clients,
            // A node needs two: a data endpoint and its liveliness one.
            max_registered_connected: opts.max_registered_connected.max(2),
            max_domains: opts.max_domains.clamp(1, MAX_DOMAINS),
            // Not under a lease: a client between its hello and its
            // first attach is not yet counted.
            domain_idle: std::time::Duration::from_millis(opts.domain_idle_ms.max(opts.lease_ms)),
            peers: opts.peers,
            cfg,
            security,
        };
        let running = broker::start(spec, hosts, open_domain)?;
        Ok(Broker {
            running,
            every_domain: opts.domains.is_empty(),
            _nodes: nodes,
        })
    }

    /// Where clients reach it, as bound: `tcp://HOST:PORT`.
    pub fn listen_endpoint(&self) -> &str {
        &self.running.listen
    }

    /// The locator of `domain` through this broker:
    /// `milonga://HOST:PORT/DOMAIN`.
    pub fn locator(&self, domain: &str) -> String {
        let hp = self
            .running
            .listen
            .strip_prefix("tcp://")
            .unwrap_or(&self.running.listen);
        format!("milonga://{hp}/{domain}")
    }

    /// The endpoints it serves each domain on (the domains opened so far,
    /// when it serves every domain).
    pub fn endpoints(&self) -> Vec<milonga_wire::broker::BrokerHello> {
        self.running
            .hellos
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether it serves every domain named to it (no domain was given).
    pub fn serves_every_domain(&self) -> bool {
        self.every_domain
    }

    /// Its id in a federation: 32 hex digits, new at each start.
    pub fn id(&self) -> &str {
        &self.running.broker_id
    }

    /// A snapshot of its counters.
    pub fn stats(&self) -> BrokerStats {
        self.running.stats()
    }

    /// Its public key when its security is on (what clients name in
    /// their locator, `NAME@HOST:PORT`, with `NAME.pub` in their trust
    /// directory).
    pub fn public_key(&self) -> Option<crate::security::PublicKey> {
        self.running.public_key()
    }

    /// Stops it: its clients are withdrawn from the domains, then its
    /// nodes close.
    pub fn stop(mut self) {
        self.running.stop();
    }
}
