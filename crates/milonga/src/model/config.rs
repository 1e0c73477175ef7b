//! Node configuration: one typed struct, units in the names.
//!
//! Values come from [`Config::default`], then the environment
//! ([`Config::from_env`]), then code. Every key is documented in
//! `docs/config.md`.

use std::path::PathBuf;
use std::time::Duration;

use crate::model::error::OpenError;

/// Which transport a node binds its sockets on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP on [`Config::tcp_host`], an ephemeral port unless an endpoint is given.
    Tcp,
    /// Unix-domain sockets in the runtime directory (same host only).
    Ipc,
    /// In-process: reachable only by nodes of the same process.
    Inproc,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "ipc" => Ok(Transport::Ipc),
            "inproc" => Ok(Transport::Inproc),
            other => Err(format!(
                "unknown transport {other:?}: expected tcp, ipc or inproc"
            )),
        }
    }
}

impl Transport {
    /// `tcp`, `ipc` or `inproc`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Ipc => "ipc",
            Transport::Inproc => "inproc",
        }
    }
}

/// Whether a node's connections are encrypted and authenticated with CURVE
/// (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Security {
    /// On when the node can be reached from other hosts (tcp on an
    /// address that is not loopback) or a `key_file` is given; off on
    /// loopback, ipc and inproc. The default.
    #[default]
    Auto,
    /// Plain ZMTP: anyone who reaches the node's ports may connect.
    Off,
    /// CURVE on every socket: the node has a key (`key_file`, else the
    /// user's default identity) and admits only the keys of its trust
    /// directory (`trust_dir`, else the user's default one).
    On,
}

impl std::str::FromStr for Security {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Security::Auto),
            "off" => Ok(Security::Off),
            "on" => Ok(Security::On),
            other => Err(format!(
                "unknown security {other:?}: expected auto, on or off"
            )),
        }
    }
}

impl Security {
    /// `auto`, `on` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            Security::Auto => "auto",
            Security::Off => "off",
            Security::On => "on",
        }
    }
}

/// A value for [`Config::set`], as the environment or a binding gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigValue {
    /// No value: the default of an optional key (an endpoint, the
    /// runtime directory).
    Unset,
    /// A flag.
    Bool(bool),
    /// A count, a size or a time (range-checked against the field).
    Int(i64),
    /// Text: a locator, a name, a transport, an address, an endpoint, a
    /// path.
    Text(String),
    /// Several texts (peers).
    List(Vec<String>),
    /// A path, kept exactly (it may not be UTF-8); as text elsewhere.
    Path(PathBuf),
    /// A value that could not be read (an environment variable that is
    /// not a number): why.
    Bad(String),
}

impl std::fmt::Display for ConfigValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigValue::Unset => f.write_str("no value"),
            ConfigValue::Bool(b) => write!(f, "the flag {b}"),
            ConfigValue::Int(i) => write!(f, "the number {i}"),
            ConfigValue::Text(t) => write!(f, "the text {t:?}"),
            ConfigValue::List(l) => write!(f, "the list {l:?}"),
            ConfigValue::Path(p) => write!(f, "the path {}", p.display()),
            ConfigValue::Bad(why) => f.write_str(why),
        }
    }
}

/// What kind of value a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Text,
    /// Text, or unset (the default).
    OptText,
    Bool,
    Int,
    /// Comma-separated in the environment.
    List,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::OptText => "text or nothing",
            Kind::Bool => "a flag (true or false)",
            Kind::Int => "a whole number",
            Kind::List => "a list of texts",
        }
    }

    /// The value an environment variable's text gives.
    fn read_text(self, text: &str) -> ConfigValue {
        match self {
            Kind::Text | Kind::OptText => ConfigValue::Text(text.to_owned()),
            Kind::Bool => flag(text).map_or_else(ConfigValue::Bad, ConfigValue::Bool),
            Kind::Int => text.trim().parse().map_or_else(
                |e| ConfigValue::Bad(format!("{text:?} is not a whole number: {e}")),
                ConfigValue::Int,
            ),
            // (Empty items, from a trailing comma, are not endpoints.)
            Kind::List => ConfigValue::List(
                text.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect(),
            ),
        }
    }
}

/// A flag's text, any case, spaces around ignored: `1`, `true`, `on`,
/// `yes` or `0`, `false`, `off`, `no` (anything else is refused: `False`
/// or `disabled` meant off, and turned the feature on).
fn flag(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err(format!(
            "{text:?} is not a flag: true/false, on/off, yes/no or 1/0"
        )),
    }
}

/// Environment variables of the key-named spelling (`MILONGA_` and the
/// key in capitals) taken for the three whose documented variable is
/// shorter: a misspelled security variable went unnoticed, the node
/// opening without the access control or identity it named.
const ALIASES: &[(&str, &str)] = &[
    ("MILONGA_KEY_FILE", "MILONGA_KEY"),
    ("MILONGA_TRUST_DIR", "MILONGA_TRUST"),
    ("MILONGA_ACL_FILE", "MILONGA_ACL"),
];

/// `MILONGA_*` variables that are not configuration: the command line's,
/// and the build's, tests' and benchmarks' own.
const NOT_CONFIG: &[&str] = &[
    "MILONGA_LOCATOR",
    "MILONGA_BENCH_",
    "MILONGA_CHAOS_",
    "MILONGA_DEP_",
    "MILONGA_BLESS_VECTORS",
    "MILONGA_GUARANTEES_RUNTIME_CHILD",
    "MILONGA_SKIP_MULTIHOST",
    "MILONGA_BIN",
];

/// The names among `vars` that start with `MILONGA_` and that no key,
/// alias or other use of Milonga's takes: a misspelling, said once at
/// open.
fn unknown_vars(vars: impl Iterator<Item = String>) -> Vec<String> {
    let mut unknown: Vec<String> = vars
        .filter(|v| v.starts_with("MILONGA_"))
        .filter(|v| !KEYS.iter().any(|k| k.env == Some(v.as_str())))
        .filter(|v| !ALIASES.iter().any(|(a, _)| a == v))
        .filter(|v| !NOT_CONFIG.iter().any(|n| v.starts_with(n)))
        .collect();
    unknown.sort();
    unknown
}

/// One configuration key: the field it sets, its environment variable and
/// the kind of value it takes.
#[derive(Debug)]
pub(crate) struct KeySpec {
    pub(crate) name: &'static str,
    pub(crate) env: Option<&'static str>,
    pub(crate) kind: Kind,
}

const fn key(name: &'static str, env: Option<&'static str>, kind: Kind) -> KeySpec {
    KeySpec { name, env, kind }
}

/// Every configuration key, in the order of docs/config.md (a test checks
/// the table against this, and that every field of [`Config`] is here).
/// The environment, [`Config::set`] and the Python binding all go through
/// it.
pub(crate) const KEYS: &[KeySpec] = &[
    key("locator", Some("MILONGA_LOCATOR"), Kind::Text),
    key("name", None, Kind::Text),
    key("transport", Some("MILONGA_TRANSPORT"), Kind::Text),
    key("tcp_host", Some("MILONGA_TCP_HOST"), Kind::Text),
    key(
        "data_endpoint",
        Some("MILONGA_DATA_ENDPOINT"),
        Kind::OptText,
    ),
    key(
        "reliable_data_endpoint",
        Some("MILONGA_RELIABLE_DATA_ENDPOINT"),
        Kind::OptText,
    ),
    key(
        "control_endpoint",
        Some("MILONGA_CONTROL_ENDPOINT"),
        Kind::OptText,
    ),
    key(
        "local_discovery",
        Some("MILONGA_LOCAL_DISCOVERY"),
        Kind::Bool,
    ),
    key("peers", Some("MILONGA_PEERS"), Kind::List),
    key("gossip", Some("MILONGA_GOSSIP"), Kind::Bool),
    key("registry", Some("MILONGA_REGISTRY"), Kind::List),
    key("discovery", Some("MILONGA_DISCOVERY"), Kind::Text),
    key("etcd_endpoints", Some("MILONGA_ETCD_ENDPOINTS"), Kind::List),
    key("interfaces", Some("MILONGA_INTERFACES"), Kind::List),
    key("scouting", Some("MILONGA_SCOUTING"), Kind::Bool),
    key("scout_group", Some("MILONGA_SCOUT_GROUP"), Kind::Text),
    key("scout_group6", Some("MILONGA_SCOUT_GROUP6"), Kind::Text),
    key(
        "scout_interval_ms",
        Some("MILONGA_SCOUT_INTERVAL_MS"),
        Kind::Int,
    ),
    key("runtime_dir", Some("MILONGA_RUNTIME_DIR"), Kind::OptText),
    key("discovery_interval_ms", None, Kind::Int),
    key("static_query_interval_ms", None, Kind::Int),
    key(
        "heartbeat_interval_ms",
        Some("MILONGA_HEARTBEAT_INTERVAL_MS"),
        Kind::Int,
    ),
    key(
        "heartbeat_timeout_ms",
        Some("MILONGA_HEARTBEAT_TIMEOUT_MS"),
        Kind::Int,
    ),
    key(
        "handshake_timeout_ms",
        Some("MILONGA_HANDSHAKE_TIMEOUT_MS"),
        Kind::Int,
    ),
    key(
        "max_message_bytes",
        Some("MILONGA_MAX_MESSAGE_BYTES"),
        Kind::Int,
    ),
    key("send_hwm", Some("MILONGA_SEND_HWM"), Kind::Int),
    key(
        "reliable_send_hwm",
        Some("MILONGA_RELIABLE_SEND_HWM"),
        Kind::Int,
    ),
    key("recv_hwm", Some("MILONGA_RECV_HWM"), Kind::Int),
    key("recv_spin_us", Some("MILONGA_RECV_SPIN_US"), Kind::Int),
    key("tcp_buffer_bytes", None, Kind::Int),
    key("close_linger_ms", None, Kind::Int),
    key("zero_copy_threshold_bytes", None, Kind::Int),
    key("shared_memory", Some("MILONGA_SHARED_MEMORY"), Kind::Bool),
    key("shm_threshold_bytes", None, Kind::Int),
    key("shm_segment_bytes", None, Kind::Int),
    key("shm_hold_ms", None, Kind::Int),
    key("security", Some("MILONGA_SECURITY"), Kind::Text),
    key("key_file", Some("MILONGA_KEY"), Kind::OptText),
    key("trust_dir", Some("MILONGA_TRUST"), Kind::OptText),
    key("acl_file", Some("MILONGA_ACL"), Kind::OptText),
    key("file_speed", Some("MILONGA_FILE_SPEED"), Kind::Text),
    key("compression", Some("MILONGA_COMPRESSION"), Kind::Text),
    key("compression_threshold_bytes", None, Kind::Int),
    key("compression_level", None, Kind::Int),
    key("compression_dictionary", None, Kind::Bool),
];

/// The name of every field of `c`: written out without `..`, so that a new
/// field does not compile until it is named here (and then in [`KEYS`], or
/// the test comparing them fails).
#[cfg(test)]
fn field_names(c: &Config) -> Vec<&'static str> {
    let Config {
        locator: _,
        name: _,
        transport: _,
        tcp_host: _,
        data_endpoint: _,
        reliable_data_endpoint: _,
        control_endpoint: _,
        local_discovery: _,
        peers: _,
        gossip: _,
        registry: _,
        discovery: _,
        etcd_endpoints: _,
        interfaces: _,
        scouting: _,
        scout_group: _,
        scout_group6: _,
        scout_interval_ms: _,
        runtime_dir: _,
        discovery_interval_ms: _,
        static_query_interval_ms: _,
        heartbeat_interval_ms: _,
        heartbeat_timeout_ms: _,
        handshake_timeout_ms: _,
        max_message_bytes: _,
        send_hwm: _,
        reliable_send_hwm: _,
        recv_hwm: _,
        recv_spin_us: _,
        tcp_buffer_bytes: _,
        close_linger_ms: _,
        zero_copy_threshold_bytes: _,
        shared_memory: _,
        shm_threshold_bytes: _,
        shm_segment_bytes: _,
        shm_hold_ms: _,
        security: _,
        key_file: _,
        trust_dir: _,
        acl_file: _,
        file_speed: _,
        compression: _,
        compression_threshold_bytes: _,
        compression_level: _,
        compression_dictionary: _,
    } = c;
    vec![
        "locator",
        "name",
        "transport",
        "tcp_host",
        "data_endpoint",
        "reliable_data_endpoint",
        "control_endpoint",
        "local_discovery",
        "peers",
        "gossip",
        "registry",
        "discovery",
        "etcd_endpoints",
        "interfaces",
        "scouting",
        "scout_group",
        "scout_group6",
        "scout_interval_ms",
        "runtime_dir",
        "discovery_interval_ms",
        "static_query_interval_ms",
        "heartbeat_interval_ms",
        "heartbeat_timeout_ms",
        "handshake_timeout_ms",
        "max_message_bytes",
        "send_hwm",
        "reliable_send_hwm",
        "recv_hwm",
        "recv_spin_us",
        "tcp_buffer_bytes",
        "close_linger_ms",
        "zero_copy_threshold_bytes",
        "shared_memory",
        "shm_threshold_bytes",
        "shm_segment_bytes",
        "shm_hold_ms",
        "security",
        "key_file",
        "trust_dir",
        "acl_file",
        "file_speed",
        "compression",
        "compression_threshold_bytes",
        "compression_level",
        "compression_dictionary",
    ]
}

/// Configuration of a node. Build it with [`Config::new`] or
/// [`Config::from_env`], change fields, then pass it to
/// [`crate::Node::open_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Where the domain is: `milonga:///lab` (peer-to-peer in domain `lab`).
    pub locator: String,
    /// Readable node name; `@host:pid` is appended.
    pub name: String,
    /// Transport of the sockets the node binds. Default tcp.
    pub transport: Transport,
    /// Interface the tcp sockets bind to, and the address announced.
    /// Default `127.0.0.1`; set a routable address for several hosts, or
    /// `auto` (every usable interface's address, the first announced, see
    /// `interfaces`).
    pub tcp_host: String,
    /// Fixed data endpoint for best-effort publications (default: ephemeral).
    pub data_endpoint: Option<String>,
    /// Fixed data endpoint for reliable publications (default: ephemeral).
    pub reliable_data_endpoint: Option<String>,
    /// Fixed control endpoint, which static peers query (default: ephemeral).
    pub control_endpoint: Option<String>,
    /// Use `local` discovery (announcement files in the runtime directory). Default true.
    pub local_discovery: bool,
    /// Control endpoints of nodes on other hosts (`static` discovery).
    pub peers: Vec<String>,
    /// Brokers (`tcp://HOST:PORT`, as `milonga broker --listen`) this
    /// peer-to-peer node registers with and learns the domain's nodes
    /// from, while its data flows directly (registry mode,
    /// docs/discovery.md "A registry"). Default none.
    pub registry: Vec<String>,
    /// `auto` (default): the sources the other keys configure; `etcd`:
    /// also keep the node's announcement in etcd and learn the others'
    /// there (`etcd_endpoints`; docs/discovery.md "etcd").
    pub discovery: String,
    /// etcd's client URLs (`http://HOST:2379`), for `discovery = etcd`.
    pub etcd_endpoints: Vec<String>,
    /// Learn the nodes that the static peers know, and tell them this
    /// node's control endpoint (a `tcp://` one), so that one peer given is
    /// enough to find the rest (docs/discovery.md). Default true.
    pub gossip: bool,
    /// With `tcp_host = "auto"`: the interfaces (names such as `eth0`, or
    /// CIDRs such as `10.0.0.0/8`) used. Default: every one that is up,
    /// multicast-capable and not loopback.
    pub interfaces: Vec<String>,
    /// Find the nodes of other hosts by UDP multicast (`scout`
    /// discovery, docs/protocol.md §9.5). Default true; it runs only when
    /// `tcp_host` is an address of this host that others reach (`auto`,
    /// or one given): a node on loopback, the default, does not scout.
    pub scouting: bool,
    /// The multicast group and port of scouting, `ADDRESS:PORT`. Default
    /// `239.255.77.77:7477`.
    pub scout_group: String,
    /// The IPv6 multicast group and port of scouting, `[ADDRESS]:PORT`,
    /// used when `tcp_host` is an IPv6 address. Default
    /// `[ff02::7477]:7477` (link-local scope: one network).
    pub scout_group6: String,
    /// How often a node multicasts its hello; a node not heard for three
    /// intervals (at least `heartbeat_timeout_ms`) is forgotten. Default
    /// 1000 ms.
    pub scout_interval_ms: u64,
    /// Directory for announcements and ipc sockets. Default
    /// `$XDG_RUNTIME_DIR/milonga`, else `/tmp/milonga-<uid>`.
    pub runtime_dir: Option<PathBuf>,
    /// How often the node looks for new or gone peers. Default 20 ms.
    pub discovery_interval_ms: u64,
    /// How often static peers are asked who they are. Default 500 ms.
    pub static_query_interval_ms: u64,
    /// How often the node sends a Milonga heartbeat to the subscribers of
    /// its publications, and the ZMTP heartbeat (PING) interval on the
    /// connections that send PINGs (docs/protocol.md §1: not
    /// subscriptions' liveliness connections, a best-effort data socket's
    /// side, nor a broker's lease sockets). Default 1000 ms.
    pub heartbeat_interval_ms: i32,
    /// The lease: a subscriber reports a publisher node lost
    /// (`lease_expired`) when no heartbeat came for this long, and a ZMTP
    /// connection silent this long after a PING is closed where that side
    /// times out (docs/protocol.md §1). Default 3000 ms.
    pub heartbeat_timeout_ms: i32,
    /// How long a new connection may take to complete the ZMTP handshake
    /// before it is closed (and counted in `handshakes_failed`): idle
    /// half-open connections must not hold file descriptors for long.
    /// Default 3000 ms; at least 1.
    pub handshake_timeout_ms: i32,
    /// Largest message a node sends or accepts, in bytes. Default 64 MiB.
    pub max_message_bytes: usize,
    /// Messages queued per subscriber connection by best-effort
    /// publishers; beyond it the subscriber loses samples. Default 1000.
    pub send_hwm: i32,
    /// Messages queued per subscriber connection by reliable publishers,
    /// beyond which `put` waits or samples queue up in a batch (a message is
    /// then a batch of at most 128 KiB). Small, so that samples behind a
    /// busy subscriber are batched early. Default 16.
    pub reliable_send_hwm: i32,
    /// Messages queued per publisher connection on the receiving side.
    /// Default 1000.
    pub recv_hwm: i32,
    /// Microseconds a subscription's `recv` keeps polling its socket
    /// before it blocks (docs/config.md: a low-latency mode that spends a
    /// core). Default 0: it blocks at once.
    pub recv_spin_us: u32,
    /// Kernel socket buffer sizes in bytes (0 = the OS default). Default 0.
    pub tcp_buffer_bytes: i32,
    /// How long closing the last node of a process waits for queued
    /// samples to leave. Default 1000 ms.
    pub close_linger_ms: i32,
    /// Payloads (whole byte strings or typed arrays) of at least this many
    /// bytes travel in their own frame without a copy. Default 64 KiB.
    pub zero_copy_threshold_bytes: usize,
    /// Same-host shared memory for large payloads (docs/shared-memory.md):
    /// a publisher writes a payload frame of at least
    /// [`Config::shm_threshold_bytes`] into a segment in `/dev/shm` when
    /// every subscription that wants it is on this host, and they read it
    /// in place. Default on.
    pub shared_memory: bool,
    /// Smallest payload frame sent through shared memory (payload frames
    /// exist from [`Config::zero_copy_threshold_bytes`] on). Default 64 KiB.
    pub shm_threshold_bytes: usize,
    /// Size of a publisher's segment, one per data socket that uses it: the
    /// most memory its payloads in flight take. Default 64 MiB.
    pub shm_segment_bytes: usize,
    /// How long a slot waits for a subscription that was sent its
    /// reference and did not read it (ended, or that far behind) before
    /// it is rewritten; a subscription that comes later finds it gone and
    /// counts the sample lost. Slots that a live process holds are never
    /// rewritten. Default 2000 ms.
    pub shm_hold_ms: u32,
    /// CURVE on every connection: `auto` (the default: on when the node
    /// can be reached from other hosts or a key is given), `on` or `off`
    /// (docs/security.md).
    pub security: Security,
    /// The node's secret key file (`NAME.key`, mode 0600, made by `milonga
    /// keygen`). Default, when security is on: the user's default
    /// identity (`$XDG_CONFIG_HOME/milonga/identity.key`, made if missing).
    pub key_file: Option<PathBuf>,
    /// The directory of trusted public keys (`*.pub`): only they may
    /// connect, and only to nodes announcing one of them does this node
    /// connect. Reloaded when it changes. Default, when security is on:
    /// `$XDG_CONFIG_HOME/milonga/trust` (made if missing, holding the
    /// default identity's public key).
    pub trust_dir: Option<PathBuf>,
    /// Access control rules (docs/security.md): with a file, every
    /// operation not allowed by a rule is denied. Needs `security` on.
    /// Reloaded when it changes.
    pub acl_file: Option<PathBuf>,
    /// With a `file:///` locator (docs/recording.md): how fast
    /// subscriptions read the recording back, `max` (the default: as fast
    /// as they take it) or a factor of the recorded pace (`1`, `2`, `0.5`).
    pub file_speed: String,
    /// How publishers compress their samples unless their QoS says
    /// (docs/compression.md): `none` (the default), `lz4` or `zstd`.
    pub compression: String,
    /// Payloads smaller than this are not compressed. Default 512.
    pub compression_threshold_bytes: usize,
    /// zstd's level (0: its default, 3), or LZ4's acceleration (0 or 1:
    /// its default). Default 0.
    pub compression_level: i32,
    /// zstd: a dictionary per key, trained from its first samples
    /// (`Compression::dictionary`). Default false.
    pub compression_dictionary: bool,
}

impl Config {
    /// The compression publishers use unless their QoS says
    /// (`compression`, `compression_threshold_bytes`, `compression_level`,
    /// `compression_dictionary`).
    pub fn compression(&self) -> crate::Compression {
        let c = match self.compression.as_str() {
            "lz4" => crate::Compression::lz4(),
            "zstd" => crate::Compression::zstd(),
            _ => crate::Compression::none(),
        };
        let mut c = c.threshold(self.compression_threshold_bytes);
        c.dictionary = self.compression_dictionary;
        if self.compression_level == 0 {
            c
        } else {
            c.level(self.compression_level)
        }
    }

    /// Defaults for `locator` and `name`.
    pub fn new(locator: &str, name: &str) -> Self {
        Config {
            locator: locator.to_owned(),
            name: name.to_owned(),
            transport: Transport::Tcp,
            tcp_host: "127.0.0.1".to_owned(),
            data_endpoint: None,
            reliable_data_endpoint: None,
            control_endpoint: None,
            local_discovery: true,
            peers: Vec::new(),
            registry: Vec::new(),
            discovery: "auto".into(),
            etcd_endpoints: Vec::new(),
            interfaces: Vec::new(),
            scouting: true,
            gossip: true,
            scout_group: "239.255.77.77:7477".to_owned(),
            scout_group6: "[ff02::7477]:7477".to_owned(),
            scout_interval_ms: 1000,
            runtime_dir: None,
            discovery_interval_ms: 20,
            static_query_interval_ms: 500,
            heartbeat_interval_ms: 1000,
            heartbeat_timeout_ms: 3000,
            handshake_timeout_ms: 3000,
            max_message_bytes: 64 << 20,
            send_hwm: 1000,
            reliable_send_hwm: 16,
            recv_hwm: 1000,
            recv_spin_us: 0,
            tcp_buffer_bytes: 0,
            close_linger_ms: 1000,
            zero_copy_threshold_bytes: 64 << 10,
            shared_memory: true,
            shm_threshold_bytes: 64 << 10,
            shm_segment_bytes: 64 << 20,
            shm_hold_ms: 2000,
            security: Security::Auto,
            key_file: None,
            trust_dir: None,
            acl_file: None,
            file_speed: "max".into(),
            compression: "none".into(),
            compression_threshold_bytes: crate::model::compression::DEFAULT_THRESHOLD_BYTES,
            compression_level: 0,
            compression_dictionary: false,
        }
    }

    /// Defaults, then the `MILONGA_*` environment variables of
    /// [`Config::keys`] (docs/config.md). `locator` is used when
    /// `MILONGA_LOCATOR` is unset; an empty variable counts as unset.
    pub fn from_env(locator: &str, name: &str) -> Result<Self, OpenError> {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            let unknown = unknown_vars(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()));
            if !unknown.is_empty() {
                tracing::warn!(
                    variables = %unknown.join(", "),
                    "ignoring MILONGA_ variables that no configuration key takes (misspelled? docs/config.md lists them)"
                );
            }
        });
        Config::from_lookup(locator, name, |k| {
            std::env::var(k).ok().filter(|v| !v.is_empty())
        })
    }

    /// [`Config::from_env`] with the variables that `var` gives.
    fn from_lookup(
        locator: &str,
        name: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, OpenError> {
        let mut c = Config::new(locator, name);
        for spec in KEYS {
            let Some(env) = spec.env else { continue };
            // The documented variable, else its key-named spelling.
            let found = var(env).map(|t| (env, t)).or_else(|| {
                ALIASES
                    .iter()
                    .filter(|(_, documented)| *documented == env)
                    .find_map(|(alias, _)| var(alias).map(|t| (*alias, t)))
            });
            if let Some((env, text)) = found {
                c.set(spec.name, spec.kind.read_text(&text))
                    .map_err(|e| match e {
                        // Named as the user wrote it.
                        OpenError::Config { why, .. } => OpenError::Config {
                            key: env.into(),
                            why,
                        },
                        other => other,
                    })?;
            }
        }
        Ok(c)
    }

    /// The configuration keys, in the order of docs/config.md: the names
    /// [`Config::set`] takes (and Python's `milonga.open` keyword
    /// arguments), each with its environment variable, if it has one.
    pub fn keys() -> impl Iterator<Item = (&'static str, Option<&'static str>)> {
        KEYS.iter().map(|k| (k.name, k.env))
    }

    /// Sets key `key` (a field's name) to `value`: what the environment
    /// and the bindings set, checked. An unknown key, a value of the wrong
    /// kind or out of the field's range is an [`OpenError::Config`] naming
    /// the key.
    pub fn set(&mut self, key: &str, value: ConfigValue) -> Result<(), OpenError> {
        use ConfigValue as V;
        let Some(spec) = KEYS.iter().find(|k| k.name == key) else {
            return Err(OpenError::Config {
                key: key.into(),
                why: format!("unknown config key {key:?} (docs/config.md lists the keys)"),
            });
        };
        let err = |why: String| OpenError::Config {
            key: key.into(),
            why,
        };
        let wrong = |v: &ConfigValue| err(format!("expects {}, not {v}", spec.kind.what()));
        // A path is text wherever it is one; `runtime_dir` keeps it exact.
        let value = match value {
            V::Path(p) if key != "runtime_dir" => match p.into_os_string().into_string() {
                Ok(t) => V::Text(t),
                Err(_) => return Err(err("expects UTF-8 text".into())),
            },
            v => v,
        };
        match (spec.kind, value) {
            (Kind::OptText, V::Path(p)) => self.runtime_dir = Some(p),
            (Kind::Text, V::Text(t)) => match key {
                "locator" => self.locator = t,
                "name" => self.name = t,
                "transport" => self.transport = t.parse().map_err(err)?,
                "tcp_host" => self.tcp_host = t,
                "scout_group" => self.scout_group = t,
                "scout_group6" => self.scout_group6 = t,
                "security" => self.security = t.parse().map_err(err)?,
                "discovery" => {
                    if !matches!(t.as_str(), "auto" | "etcd") {
                        return Err(err(format!("{t:?}: expected auto or etcd")));
                    }
                    self.discovery = t;
                }
                "file_speed" => {
                    parse_speed(&t).map_err(err)?;
                    self.file_speed = t;
                }
                "compression" => {
                    if !matches!(t.as_str(), "none" | "lz4" | "zstd") {
                        return Err(err(format!("{t:?}: expected none, lz4 or zstd")));
                    }
                    self.compression = t;
                }
                _ => unreachable!("a text key without a field: {key}"),
            },
            (Kind::OptText, v @ (V::Text(_) | V::Unset)) => {
                let t = match v {
                    V::Text(t) => Some(t),
                    _ => None,
                };
                match key {
                    "data_endpoint" => self.data_endpoint = t,
                    "reliable_data_endpoint" => self.reliable_data_endpoint = t,
                    "control_endpoint" => self.control_endpoint = t,
                    "runtime_dir" => self.runtime_dir = t.map(PathBuf::from),
                    "key_file" => self.key_file = t.map(PathBuf::from),
                    "trust_dir" => self.trust_dir = t.map(PathBuf::from),
                    "acl_file" => self.acl_file = t.map(PathBuf::from),
                    _ => unreachable!("an optional key without a field: {key}"),
                }
            }
            // A flag given as text (Python's `shared_memory="off"`).
            (Kind::Bool, V::Text(t)) => {
                return self.set(key, V::Bool(flag(&t).map_err(err)?));
            }
            (Kind::Bool, V::Bool(b)) => match key {
                "local_discovery" => self.local_discovery = b,
                "scouting" => self.scouting = b,
                "gossip" => self.gossip = b,
                "compression_dictionary" => self.compression_dictionary = b,
                "shared_memory" => self.shared_memory = b,
                _ => unreachable!("a bool key without a field: {key}"),
            },
            (Kind::List, V::List(l)) => match key {
                "peers" => self.peers = l,
                "registry" => self.registry = l,
                "etcd_endpoints" => self.etcd_endpoints = l,
                "interfaces" => self.interfaces = l,
                _ => unreachable!("a list key without a field: {key}"),
            },
            (Kind::Int, V::Int(i)) => {
                fn fit<T: TryFrom<i64>>(i: i64, key: &str) -> Result<T, OpenError> {
                    T::try_from(i).map_err(|_| OpenError::Config {
                        key: key.into(),
                        why: format!("{i} is out of range"),
                    })
                }
                match key {
                    "discovery_interval_ms" => self.discovery_interval_ms = fit(i, key)?,
                    "static_query_interval_ms" => self.static_query_interval_ms = fit(i, key)?,
                    "scout_interval_ms" => self.scout_interval_ms = fit(i, key)?,
                    "heartbeat_interval_ms" => self.heartbeat_interval_ms = fit(i, key)?,
                    "heartbeat_timeout_ms" => self.heartbeat_timeout_ms = fit(i, key)?,
                    "handshake_timeout_ms" => self.handshake_timeout_ms = fit(i, key)?,
                    "max_message_bytes" => self.max_message_bytes = fit(i, key)?,
                    "send_hwm" => self.send_hwm = fit(i, key)?,
                    "reliable_send_hwm" => self.reliable_send_hwm = fit(i, key)?,
                    "recv_hwm" => self.recv_hwm = fit(i, key)?,
                    "recv_spin_us" => self.recv_spin_us = fit(i, key)?,
                    "tcp_buffer_bytes" => self.tcp_buffer_bytes = fit(i, key)?,
                    "close_linger_ms" => self.close_linger_ms = fit(i, key)?,
                    "zero_copy_threshold_bytes" => self.zero_copy_threshold_bytes = fit(i, key)?,
                    "shm_threshold_bytes" => self.shm_threshold_bytes = fit(i, key)?,
                    "shm_segment_bytes" => self.shm_segment_bytes = fit(i, key)?,
                    "shm_hold_ms" => self.shm_hold_ms = fit(i, key)?,
                    "compression_threshold_bytes" => {
                        self.compression_threshold_bytes = fit(i, key)?
                    }
                    "compression_level" => self.compression_level = fit(i, key)?,
                    _ => unreachable!("an integer key without a field: {key}"),
                }
            }
            (_, V::Bad(why)) => return Err(err(why)),
            (_, v) => return Err(wrong(&v)),
        }
        Ok(())
    }

    /// The runtime directory, and whether it is the default shared
    /// location (which must then be private to this user).
    pub(crate) fn runtime_root_checked(&self) -> (PathBuf, bool) {
        (self.runtime_root(), self.runtime_dir.is_none())
    }

    pub(crate) fn runtime_root(&self) -> PathBuf {
        if let Some(d) = &self.runtime_dir {
            return d.clone();
        }
        if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
            return PathBuf::from(x).join("milonga");
        }
        let uid = crate::util::sys::uid();
        PathBuf::from(format!("/tmp/milonga-{uid}"))
    }

    /// Whether the node listens on tcp at an address other hosts may
    /// reach (not loopback): its `tcp_host`, or a fixed endpoint of its
    /// own (`control_endpoint` and the data endpoints bind where they say,
    /// `tcp://0.0.0.0:7447` among others, whatever `tcp_host` is).
    pub(crate) fn reachable(&self) -> bool {
        // `tcp_host` counts for the tcp transport; a fixed tcp endpoint is
        // bound as written whatever the transport.
        let host = self.tcp_host.trim_start_matches('[').trim_end_matches(']');
        let by_host = self.transport == Transport::Tcp
            && match host.parse::<std::net::IpAddr>() {
                Ok(ip) => !ip.is_loopback(),
                Err(_) => host != "localhost",
            };
        by_host
            || [
                &self.control_endpoint,
                &self.data_endpoint,
                &self.reliable_data_endpoint,
            ]
            .into_iter()
            .flatten()
            .any(|e| e.starts_with("tcp://") && !is_loopback_endpoint(e))
    }

    /// The security a node with this configuration runs with: `auto`
    /// resolved (on when a key is given, or when the node is
    /// [`Config::reachable`] from other hosts).
    pub(crate) fn effective_security(&self) -> Security {
        match self.security {
            Security::Auto => {
                if self.key_file.is_some() || self.reachable() {
                    Security::On
                } else {
                    Security::Off
                }
            }
            s => s,
        }
    }

    /// The directory of the user's default identity and trust directory:
    /// `$XDG_CONFIG_HOME/milonga`, else `$HOME/.config/milonga`.
    pub(crate) fn default_security_dir() -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|x| !x.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .map(|h| PathBuf::from(h).join(".config"))
            })?;
        Some(base.join("milonga"))
    }

    pub(crate) fn discovery_interval(&self) -> Duration {
        Duration::from_millis(self.discovery_interval_ms.max(1))
    }
}

/// Whether `name` can name a key (a key file's name without `.key` or
/// `.pub`): 1 to 64 ASCII letters, digits, '.', '_' and '-', not starting
/// with '.'.
pub(crate) fn valid_key_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `endpoint` (`tcp://HOST:PORT`) is on loopback (`localhost`, or
/// an address of 127.0.0.0/8 or `::1`).
pub(crate) fn is_loopback_endpoint(endpoint: &str) -> bool {
    endpoint
        .strip_prefix("tcp://")
        .and_then(|hp| hp.rsplit_once(':'))
        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
        .is_some_and(|h| {
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        })
}

/// A parsed locator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Locator {
    pub domain: String,
    /// `file:///PATH`: the recording.
    pub file: Option<PathBuf>,
    /// `milonga://HOST:PORT[,HOST:PORT...]/DOMAIN`: the brokers, in the
    /// order they are tried, as `tcp://HOST:PORT` (docs/broker.md).
    pub brokers: Vec<String>,
    /// For each broker, the name of its key in the trust directory when
    /// the locator gives one (`NAME@HOST:PORT`, docs/security.md).
    pub broker_keys: Vec<Option<String>>,
}

/// `file_speed`: `None` for `max`, else the factor of the recorded pace.
pub(crate) fn parse_speed(s: &str) -> Result<Option<f64>, String> {
    match s {
        "max" => Ok(None),
        // As `milonga replay --speed`: slower, a second recorded would
        // not fit a `Duration`.
        _ => match s.parse::<f64>() {
            Ok(v) if (0.001..=1_000_000.0).contains(&v) => Ok(Some(v)),
            _ => Err(format!(
                "{s:?}: max, or a factor of the recorded pace from 0.001 to 1000000"
            )),
        },
    }
}

/// The longest domain name.
pub const MAX_DOMAIN_BYTES: usize = 64;

pub(crate) fn parse_locator(s: &str) -> Result<Locator, OpenError> {
    let bad = |why: &str| OpenError::BadLocator {
        locator: s.to_owned(),
        why: why.to_owned(),
    };
    let (scheme, rest) = s
        .split_once("://")
        .ok_or_else(|| {
            bad("expected milonga:///DOMAIN (peer-to-peer), milonga://HOST:PORT/DOMAIN (through a broker) or file:///PATH (a recording)")
        })?;
    match scheme {
        "milonga" => {}
        "file" => {
            // file:///abs/path.mcap: the domain is private to the file.
            if rest.is_empty() || !rest.starts_with('/') {
                return Err(bad("expected file:///PATH (an absolute path)"));
            }
            let hash = crate::util::fnv1a64(rest.as_bytes());
            return Ok(Locator {
                domain: format!("file-{hash:016x}"),
                file: Some(PathBuf::from(rest)),
                brokers: Vec::new(),
                broker_keys: Vec::new(),
            });
        }
        _ => {
            return Err(bad(
                "the scheme must be milonga (a domain) or file (a recording)",
            ))
        }
    }
    let (authority, path) = rest.split_once('/').ok_or_else(|| {
        bad("no domain: expected milonga:///DOMAIN or milonga://HOST:PORT/DOMAIN")
    })?;
    let mut brokers = Vec::new();
    let mut broker_keys = Vec::new();
    if !authority.is_empty() {
        for b in authority.split(',') {
            // NAME@HOST:PORT: the broker holds the key NAME.pub of the
            // trust directory.
            let (key, b) = match b.split_once('@') {
                Some((name, b)) if valid_key_name(name) => {
                    (Some(name.to_owned()), b)
                }
                Some(_) => return Err(bad("a broker's key is named NAME@HOST:PORT, NAME a key of the trust directory (letters, digits, '.', '_', '-')")),
                None => (None, b),
            };
            broker_keys.push(key);
            let (host, port) = b.rsplit_once(':').ok_or_else(|| {
                bad("a broker is HOST:PORT, such as milonga://localhost:7447/lab")
            })?;
            let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0);
            let host_ok = !host.is_empty()
                && host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-.:".contains(&c));
            if !port_ok || !host_ok {
                return Err(bad("a broker is HOST:PORT with a port from 1 to 65535, such as milonga://localhost:7447/lab"));
            }
            brokers.push(format!("tcp://{b}"));
        }
    }
    if path.is_empty() || path.len() > MAX_DOMAIN_BYTES {
        return Err(bad("the domain name must have 1 to 64 characters"));
    }
    if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        || !path.as_bytes()[0].is_ascii_alphanumeric()
    {
        return Err(bad(
            "the domain name must start with an ASCII letter or digit and hold only letters, digits, '-', '_' and '.'",
        ));
    }
    Ok(Locator {
        domain: path.to_owned(),
        file: None,
        brokers,
        broker_keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `security = auto` is on wherever other hosts can reach the node:
    /// its `tcp_host`, or a fixed endpoint of its own on a network
    /// address (a node with `control_endpoint = tcp://0.0.0.0:7447` and
    /// the default `tcp_host` ran with security off, its samples read by
    /// plain peers from the network).
    #[test]
    fn auto_security_is_on_wherever_a_fixed_endpoint_is_reachable() {
        let c = |f: &dyn Fn(&mut Config)| {
            let mut c = Config::new("milonga:///lab", "n");
            f(&mut c);
            c.effective_security()
        };
        assert_eq!(c(&|_| {}), Security::Off, "loopback");
        assert_eq!(c(&|c| c.tcp_host = "10.0.0.5".into()), Security::On);
        for ep in [
            "tcp://0.0.0.0:7447",
            "tcp://*:7447",
            "tcp://10.0.0.5:7447",
            "tcp://[::]:7447",
        ] {
            assert_eq!(
                c(&|c| c.control_endpoint = Some(ep.into())),
                Security::On,
                "{ep}"
            );
            assert_eq!(
                c(&|c| c.data_endpoint = Some(ep.into())),
                Security::On,
                "{ep}"
            );
            assert_eq!(
                c(&|c| c.reliable_data_endpoint = Some(ep.into())),
                Security::On,
                "{ep}"
            );
        }
        for ep in [
            "tcp://127.0.0.1:7447",
            "tcp://localhost:7447",
            "tcp://[::1]:7447",
        ] {
            assert_eq!(
                c(&|c| c.control_endpoint = Some(ep.into())),
                Security::Off,
                "{ep}"
            );
        }
        assert_eq!(
            c(&|c| {
                c.transport = Transport::Ipc;
                c.tcp_host = "10.0.0.5".into();
            }),
            Security::Off,
            "ipc reaches no other host"
        );
        assert_eq!(
            c(&|c| {
                c.transport = Transport::Ipc;
                c.control_endpoint = Some("tcp://0.0.0.0:7447".into());
            }),
            Security::On,
            "a fixed tcp endpoint is bound whatever the transport"
        );
    }

    #[test]
    fn locators() {
        assert_eq!(parse_locator("milonga:///lab").unwrap().domain, "lab");
        let b = parse_locator("milonga://b1:7447,10.0.0.2:7448/lab").unwrap();
        assert_eq!(b.brokers, ["tcp://b1:7447", "tcp://10.0.0.2:7448"]);
        assert_eq!(b.domain, "lab");
        assert_eq!(b.broker_keys, [None, None]);
        let k = parse_locator("milonga://ctl-broker@b1:7447,b2:7447/lab").unwrap();
        assert_eq!(k.brokers, ["tcp://b1:7447", "tcp://b2:7447"]);
        assert_eq!(k.broker_keys, [Some("ctl-broker".to_owned()), None]);
        assert!(parse_locator("milonga:///lab").unwrap().brokers.is_empty());
        let f = parse_locator("file:///tmp/x.mcap").unwrap();
        assert_eq!(f.file, Some(PathBuf::from("/tmp/x.mcap")));
        assert!(f.domain.starts_with("file-"));
        assert!(matches!(
            parse_locator("file://x.mcap"),
            Err(OpenError::BadLocator { .. })
        ));
        for bad in [
            "lab",
            "milonga:///..",
            "milonga:///.x",
            "http:///lab",
            "milonga:///",
            "milonga:///a/b",
            "milonga://",
            "milonga://host/lab",
            "milonga://host:0/lab",
            "milonga://host:x/lab",
            "milonga://:7447/lab",
            "milonga://a:1,/lab",
            "milonga://@b1:7447/lab",
            "milonga://a b@b1:7447/lab",
        ] {
            assert!(
                matches!(parse_locator(bad), Err(OpenError::BadLocator { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_field_is_a_key_in_the_order_of_the_docs() {
        let names: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        assert_eq!(names, field_names(&Config::new("milonga:///x", "x")));
    }

    /// docs/config.md's table: one row per key, in order, each naming its
    /// environment variable (and none for a key without one).
    #[test]
    fn the_docs_table_lists_every_key_and_its_variable() {
        let doc = include_str!("../../../../docs/config.md");
        let rows: Vec<(&str, &str)> = doc
            .lines()
            .filter_map(|l| {
                let mut cells = l.strip_prefix("| `")?.splitn(3, '|');
                let name = cells.next()?.trim().strip_suffix('`')?;
                Some((name, cells.next()?))
            })
            .collect();
        let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let keys: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        assert_eq!(names, keys, "docs/config.md's rows against KEYS");
        for ((name, env_cell), spec) in rows.iter().zip(KEYS) {
            match spec.env {
                Some(env) => assert!(env_cell.contains(env), "{name}: {env} not in {env_cell:?}"),
                None => assert!(
                    !env_cell.contains("MILONGA_"),
                    "{name} has no variable, the docs say {env_cell:?}"
                ),
            }
        }
    }

    #[test]
    fn the_environment_sets_every_key_that_has_a_variable() {
        let vars: std::collections::HashMap<&str, &str> = [
            ("MILONGA_LOCATOR", "milonga:///from-env"),
            ("MILONGA_TRANSPORT", "ipc"),
            ("MILONGA_TCP_HOST", "10.0.0.1"),
            ("MILONGA_DATA_ENDPOINT", "tcp://10.0.0.1:7000"),
            ("MILONGA_RELIABLE_DATA_ENDPOINT", "tcp://10.0.0.1:7001"),
            ("MILONGA_CONTROL_ENDPOINT", "tcp://10.0.0.1:7002"),
            ("MILONGA_LOCAL_DISCOVERY", "off"),
            ("MILONGA_PEERS", "tcp://a:1, tcp://b:2,"),
            ("MILONGA_GOSSIP", "off"),
            ("MILONGA_REGISTRY", "tcp://r:7447"),
            ("MILONGA_DISCOVERY", "etcd"),
            ("MILONGA_ETCD_ENDPOINTS", "http://e1:2379, http://e2:2379"),
            ("MILONGA_INTERFACES", "eth0, 10.0.0.0/8"),
            ("MILONGA_SCOUTING", "no"),
            ("MILONGA_SCOUT_GROUP", "239.1.2.3:9000"),
            ("MILONGA_SCOUT_GROUP6", "[ff02::9]:9000"),
            ("MILONGA_SCOUT_INTERVAL_MS", "250"),
            ("MILONGA_RUNTIME_DIR", "/tmp/x"),
            ("MILONGA_HEARTBEAT_INTERVAL_MS", "100"),
            ("MILONGA_HEARTBEAT_TIMEOUT_MS", "500"),
            ("MILONGA_HANDSHAKE_TIMEOUT_MS", "700"),
            ("MILONGA_MAX_MESSAGE_BYTES", "65536"),
            ("MILONGA_SEND_HWM", "10"),
            ("MILONGA_RELIABLE_SEND_HWM", "2"),
            ("MILONGA_RECV_HWM", "30"),
            ("MILONGA_RECV_SPIN_US", "25"),
            ("MILONGA_SHARED_MEMORY", "off"),
            ("MILONGA_SECURITY", "on"),
            ("MILONGA_KEY", "/k/node.key"),
            ("MILONGA_TRUST", "/k/trust"),
            ("MILONGA_ACL", "/k/acl.rules"),
            ("MILONGA_FILE_SPEED", "2"),
            ("MILONGA_COMPRESSION", "zstd"),
        ]
        .into_iter()
        .collect();
        let with_env = KEYS.iter().filter_map(|k| k.env).count();
        assert_eq!(vars.len(), with_env, "a value for every variable");
        let c = Config::from_lookup("milonga:///given", "n", |k| {
            vars.get(k).map(|v| v.to_string())
        })
        .unwrap();
        assert_eq!(c.locator, "milonga:///from-env", "MILONGA_LOCATOR wins");
        assert_eq!(c.transport, Transport::Ipc);
        assert_eq!(c.tcp_host, "10.0.0.1");
        assert_eq!(c.data_endpoint.as_deref(), Some("tcp://10.0.0.1:7000"));
        assert_eq!(
            c.reliable_data_endpoint.as_deref(),
            Some("tcp://10.0.0.1:7001")
        );
        assert_eq!(c.control_endpoint.as_deref(), Some("tcp://10.0.0.1:7002"));
        assert!(!c.local_discovery);
        assert_eq!(c.peers, ["tcp://a:1", "tcp://b:2"]);
        assert!(!c.gossip);
        assert_eq!(c.registry, ["tcp://r:7447"]);
        assert_eq!(c.discovery, "etcd");
        assert_eq!(c.etcd_endpoints, ["http://e1:2379", "http://e2:2379"]);
        assert_eq!(c.interfaces, ["eth0", "10.0.0.0/8"]);
        assert!(!c.scouting, "on by default, off by the variable");
        assert!(!c.shared_memory, "on by default, off by the variable");
        assert_eq!(
            (
                c.scout_group.as_str(),
                c.scout_group6.as_str(),
                c.scout_interval_ms
            ),
            ("239.1.2.3:9000", "[ff02::9]:9000", 250)
        );
        assert_eq!(c.runtime_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(
            (
                c.heartbeat_interval_ms,
                c.heartbeat_timeout_ms,
                c.handshake_timeout_ms
            ),
            (100, 500, 700)
        );
        assert_eq!(c.max_message_bytes, 65536);
        assert_eq!((c.send_hwm, c.reliable_send_hwm, c.recv_hwm), (10, 2, 30));
        assert_eq!(c.recv_spin_us, 25);
        assert_eq!(c.security, Security::On);
        assert_eq!(c.key_file, Some(PathBuf::from("/k/node.key")));
        assert_eq!(c.trust_dir, Some(PathBuf::from("/k/trust")));
        assert_eq!(c.acl_file, Some(PathBuf::from("/k/acl.rules")));
        assert_eq!(c.file_speed, "2");
        assert_eq!(c.compression, "zstd");
        assert_eq!(c.compression().compressor, Some(crate::Compressor::Zstd));
        let none = Config::from_lookup("milonga:///given", "n", |_| None).unwrap();
        assert_eq!(none.locator, "milonga:///given");
    }

    #[test]
    fn flags_take_any_case_and_refuse_what_is_not_one_and_aliases_name_the_security_files() {
        let with = |vars: &[(&str, &str)]| {
            let vars: std::collections::HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            Config::from_lookup("milonga:///x", "n", |k| vars.get(k).cloned())
        };
        // `False` (Python's str(False)) and a trailing space meant off:
        // they turned scouting on.
        for off in ["False", "OFF", "off ", " no", "0"] {
            let c = with(&[("MILONGA_SCOUTING", off)]).unwrap();
            assert!(!c.scouting, "{off:?}");
        }
        for on in ["True", "ON", "yes", "1"] {
            let c = with(&[("MILONGA_SHARED_MEMORY", on)]).unwrap();
            assert!(c.shared_memory, "{on:?}");
        }
        for bad in ["disabled", "2", "nope"] {
            let e = with(&[("MILONGA_SHARED_MEMORY", bad)]).unwrap_err();
            assert!(
                matches!(&e, OpenError::Config { key, why } if key == "MILONGA_SHARED_MEMORY" && why.contains("not a flag")),
                "{bad:?}: {e}"
            );
        }
        // A flag given as text, as Python's keyword arguments may.
        let mut c = Config::new("milonga:///x", "n");
        c.set("shared_memory", ConfigValue::Text("off".into()))
            .unwrap();
        assert!(!c.shared_memory);
        assert!(c.set("gossip", ConfigValue::Text("maybe".into())).is_err());
        // The key-named spellings of the three security variables.
        let c = with(&[
            ("MILONGA_KEY_FILE", "/k/a.key"),
            ("MILONGA_TRUST_DIR", "/k/trust"),
            ("MILONGA_ACL_FILE", "/k/acl.rules"),
        ])
        .unwrap();
        assert_eq!(c.key_file, Some(PathBuf::from("/k/a.key")));
        assert_eq!(c.trust_dir, Some(PathBuf::from("/k/trust")));
        assert_eq!(c.acl_file, Some(PathBuf::from("/k/acl.rules")));
        // The documented one wins over its alias.
        let c = with(&[("MILONGA_ACL", "/k/one"), ("MILONGA_ACL_FILE", "/k/two")]).unwrap();
        assert_eq!(c.acl_file, Some(PathBuf::from("/k/one")));
        // Misspellings are named; Milonga's other variables are not.
        let unknown = unknown_vars(
            [
                "MILONGA_HEARTBEAT_TIMEOUT",
                "MILONGA_ACL_FILE",
                "MILONGA_SCOUTING",
                "MILONGA_LOCATOR",
                "MILONGA_BENCH_DEBUG",
                "MILONGA_SECURTY",
                "PATH",
            ]
            .into_iter()
            .map(str::to_owned),
        );
        assert_eq!(unknown, ["MILONGA_HEARTBEAT_TIMEOUT", "MILONGA_SECURTY"]);
    }

    #[test]
    fn a_bad_value_names_the_variable_or_the_key() {
        let e = Config::from_lookup("milonga:///x", "n", |k| {
            (k == "MILONGA_SEND_HWM").then(|| "lots".to_owned())
        })
        .unwrap_err();
        assert!(
            matches!(&e, OpenError::Config { key, why } if key == "MILONGA_SEND_HWM" && why.contains("\"lots\"")),
            "{e}"
        );
        let mut c = Config::new("milonga:///x", "n");
        let e = c
            .set("colour", ConfigValue::Text("red".into()))
            .unwrap_err();
        assert!(
            e.to_string().contains("unknown config key \"colour\""),
            "{e}"
        );
        let e = c
            .set("send_hwm", ConfigValue::Text("10".into()))
            .unwrap_err();
        assert!(e.to_string().contains("expects a whole number"), "{e}");
        let e = c.set("send_hwm", ConfigValue::Int(1 << 40)).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = c
            .set("transport", ConfigValue::Text("udp".into()))
            .unwrap_err();
        assert!(e.to_string().contains("transport"), "{e}");
        let e = c
            .set("security", ConfigValue::Text("maybe".into()))
            .unwrap_err();
        assert!(e.to_string().contains("expected auto, on or off"), "{e}");
        assert!(c.set("max_message_bytes", ConfigValue::Int(-1)).is_err());
        c.set("control_endpoint", ConfigValue::Text("tcp://h:1".into()))
            .unwrap();
        c.set("control_endpoint", ConfigValue::Unset).unwrap();
        assert_eq!(c.control_endpoint, None);
        assert!(
            c.set("tcp_host", ConfigValue::Unset).is_err(),
            "not optional"
        );
        c.set("close_linger_ms", ConfigValue::Int(-1)).unwrap();
        assert_eq!(
            c.close_linger_ms, -1,
            "a negative linger waits as long as it takes"
        );
    }

    /// Every key of the table takes a value of its kind (no key without a
    /// field in `set`: its `unreachable!` arms stay unreachable).
    #[test]
    fn every_key_takes_a_value_of_its_kind() {
        for spec in KEYS {
            let mut c = Config::new("milonga:///x", "n");
            let v = match (spec.kind, spec.name) {
                (Kind::Text, "transport") => ConfigValue::Text("ipc".into()),
                (Kind::Text, "security") => ConfigValue::Text("on".into()),
                (Kind::Text, "file_speed") => ConfigValue::Text("0.5".into()),
                (Kind::Text, "discovery") => ConfigValue::Text("etcd".into()),
                (Kind::Text, "compression") => ConfigValue::Text("lz4".into()),
                (Kind::Text | Kind::OptText, _) => ConfigValue::Text("tcp://h:1".into()),
                (Kind::Bool, _) => ConfigValue::Bool(false),
                (Kind::Int, _) => ConfigValue::Int(7),
                (Kind::List, _) => ConfigValue::List(vec!["tcp://h:1".into()]),
            };
            c.set(spec.name, v)
                .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
            if spec.kind == Kind::OptText {
                c.set(spec.name, ConfigValue::Unset).unwrap();
            }
        }
    }

    #[test]
    fn a_path_is_kept_exactly_for_the_runtime_dir_and_is_text_elsewhere() {
        use std::os::unix::ffi::OsStrExt;
        let odd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xff"));
        let mut c = Config::new("milonga:///x", "n");
        c.set("runtime_dir", ConfigValue::Path(odd.clone()))
            .unwrap();
        assert_eq!(c.runtime_dir, Some(odd.clone()), "not made UTF-8");
        c.set("tcp_host", ConfigValue::Path("10.0.0.2".into()))
            .unwrap();
        assert_eq!(c.tcp_host, "10.0.0.2");
        assert!(c.set("tcp_host", ConfigValue::Path(odd)).is_err());
        assert!(c.set("send_hwm", ConfigValue::Path("1".into())).is_err());
    }
}
