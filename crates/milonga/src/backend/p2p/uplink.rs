//! A node opened on `milonga://HOST:PORT/DOMAIN`: a broker client
//! (docs/broker.md). It binds no data or liveliness socket: its data and
//! liveliness XPUBs connect to the broker (which subscribes to them on
//! behalf of every interested subscriber), its subscriptions connect to
//! the broker's outgoing sockets, and its discovery is the broker's view
//! of the domain, asked for by [`BrokerSource`] (docs/protocol.md §11).
//!
//! Every node the broker speaks for is announced at the broker's shared
//! endpoints with a `#<node id>` tag, so that the engine, which follows
//! each node's endpoints, sees one endpoint per node; the subscription's
//! socket makes one connection per endpoint without its tag (see
//! [`untagged`]).

use std::time::{Duration, Instant};

use milonga_wire::announce::Announcement;
use milonga_wire::broker::{self as wire, BrokerHello};

use crate::backend::p2p::curve::{ClientKeys, Identity};
use crate::backend::p2p::zmq_io::ContextRef;
use crate::discovery::Source;
use crate::model::error::{IntoTransport, OpenError};
use crate::model::node::NodeCore;
use crate::util::stats;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The broker a client node is attached to, and where it serves the
/// node's domain.
#[derive(Debug, Clone)]
pub(crate) struct Uplink {
    /// The broker's ROUTER, `tcp://HOST:PORT`.
    pub(crate) broker: String,
    pub(crate) hello: BrokerHello,
    /// With security on, the keys every connection to it names (the
    /// broker's key as the server's).
    pub(crate) curve: Option<ClientKeys>,
}

/// A broker of the locator: its listen endpoint, and with security on the
/// keys a connection to it names.
#[derive(Debug, Clone)]
pub(crate) struct BrokerAt {
    pub(crate) endpoint: String,
    pub(crate) curve: Option<ClientKeys>,
}

/// The brokers of locator `loc`: with security on (`identity`, the node's
/// and its trust directory), each with the key it must hold: the one the
/// locator names (`NAME@HOST:PORT`, `NAME.pub` in the trust directory),
/// else the node's own (as for a static peer, docs/security.md).
pub(crate) fn brokers_of(
    loc: &crate::model::config::Locator,
    identity: Option<&(Identity, std::path::PathBuf)>,
) -> Result<Vec<BrokerAt>, OpenError> {
    let trust = match identity {
        Some((_, dir)) if loc.broker_keys.iter().any(Option::is_some) => {
            Some(crate::backend::p2p::curve::Trust::load(dir)?)
        }
        _ => None,
    };
    let mut out = Vec::new();
    for (i, endpoint) in loc.brokers.iter().enumerate() {
        let name = loc.broker_keys.get(i).cloned().flatten();
        let curve = match identity {
            None => None,
            Some((me, dir)) => {
                let server = match (&name, &trust) {
                    (Some(n), Some(t)) => t.key_of(n).ok_or_else(|| OpenError::Config {
                        key: "locator".into(),
                        why: format!(
                            "the broker {n}@{endpoint}: no key named {n} in the trust directory {} (copy the broker's {n}.pub there)",
                            dir.display()
                        ),
                    })?,
                    _ => me.public(),
                };
                Some(ClientKeys::new(me, server))
            }
        };
        if name.is_some() && identity.is_none() {
            tracing::warn!(broker = %endpoint, "a broker's key is named in the locator, but this node's security is off: the name is not used");
        }
        out.push(BrokerAt {
            endpoint: endpoint.clone(),
            curve,
        });
    }
    Ok(out)
}

/// Which of a node's sockets an endpoint is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plane {
    BestEffort,
    Reliable,
    Liveliness,
}

impl Uplink {
    /// Where a node's socket of `plane` connects, and the endpoint it is
    /// announced at (the broker's outgoing one, tagged with `id`).
    pub(crate) fn endpoints(&self, plane: Plane, id: &str) -> (&str, String) {
        let h = &self.hello;
        let (inn, out) = match plane {
            Plane::BestEffort => (&h.data_best_effort_in, &h.data_best_effort_out),
            Plane::Reliable => (&h.data_reliable_in, &h.data_reliable_out),
            Plane::Liveliness => (&h.liveliness_in, &h.liveliness_out),
        };
        (inn, format!("{out}#{id}"))
    }
}

impl Uplink {
    /// Every endpoint of the broker (as a socket connects to it).
    pub(crate) fn all_endpoints(&self) -> Vec<String> {
        let h = &self.hello;
        [
            &h.data_best_effort_in,
            &h.data_reliable_in,
            &h.liveliness_in,
            &h.data_best_effort_out,
            &h.data_reliable_out,
            &h.liveliness_out,
            &h.calls,
            &h.services_in,
        ]
        .into_iter()
        .cloned()
        .chain([self.broker.clone()])
        .collect()
    }

    /// Where service number `n` of node `id` connects, and the endpoint
    /// callers are told (the broker's, tagged `<node id>/s<n>`).
    pub(crate) fn service_endpoints(&self, id: &str, n: u64) -> (String, String) {
        let h = &self.hello;
        (h.services_in.clone(), format!("{}#{id}/s{n}", h.calls))
    }
}

/// `endpoint` as a client of the broker at `broker` (`tcp://HOST:PORT`)
/// reaches it: a broker listening on a wildcard address (`0.0.0.0`, `::`)
/// names its sockets with it, which means "this host" only on the
/// broker's; the client uses the address it reached the broker at.
pub(crate) fn reached(endpoint: &str, broker: &str) -> String {
    let host = |e: &str| -> Option<(String, String)> {
        let rest = e.strip_prefix("tcp://")?;
        let (h, p) = rest.rsplit_once(':')?;
        Some((h.to_owned(), p.to_owned()))
    };
    match (host(endpoint), host(broker)) {
        (Some((h, port)), Some((bh, _)))
            if ["0.0.0.0", "[::]", "*", "[::ffff:0.0.0.0]"].contains(&h.as_str()) =>
        {
            format!("tcp://{bh}:{port}")
        }
        _ => endpoint.to_owned(),
    }
}

/// [`reached`] for every endpoint of an announcement told by `broker`
/// (or by a registry at that endpoint: it holds its broker's clients at
/// the broker's sockets).
pub(crate) fn reached_all(a: &mut Announcement, broker: &str) {
    for e in [
        &mut a.data_best_effort,
        &mut a.data_reliable,
        &mut a.liveliness,
    ]
    .into_iter()
    .flatten()
    {
        *e = reached(e, broker);
    }
    for p in &mut a.publications {
        if let Some(e) = &mut p.endpoint {
            *e = reached(e, broker);
        }
    }
    for s in &mut a.services {
        s.endpoint = reached(&s.endpoint, broker);
    }
}

/// An endpoint without its `#<node id>` tag: what a socket connects to.
pub(crate) fn untagged(endpoint: &str) -> &str {
    endpoint.split_once('#').map_or(endpoint, |(e, _)| e)
}

/// A DEALER to `broker` with the options every broker client socket has
/// (a CURVE client with `curve`).
fn dealer(
    ctx: &ContextRef,
    core_cfg: &crate::Config,
    broker: &str,
    curve: Option<&ClientKeys>,
) -> Result<zmq::Socket, OpenError> {
    let sock = dealer_unconnected(ctx, core_cfg, broker, curve)?;
    connect(&sock, broker)?;
    Ok(sock)
}

fn connect(sock: &zmq::Socket, broker: &str) -> Result<(), OpenError> {
    sock.connect(broker).map_err(|source| OpenError::Socket {
        action: "connect",
        endpoint: broker.to_owned(),
        source: source.transport(),
    })
}

/// [`dealer`] before its `connect` (a monitor must be there first to see
/// the handshake).
fn dealer_unconnected(
    ctx: &ContextRef,
    core_cfg: &crate::Config,
    broker: &str,
    curve: Option<&ClientKeys>,
) -> Result<zmq::Socket, OpenError> {
    let mut sock = ctx.socket(zmq::DEALER)?;
    let err = |source: zmq::Error| OpenError::Socket {
        action: "connect",
        endpoint: broker.to_owned(),
        source: source.transport(),
    };
    if let Some(c) = curve {
        c.apply(&sock).map_err(err)?;
    }
    crate::backend::p2p::zmq_io::apply_common(&sock, core_cfg).map_err(err)?;
    crate::backend::p2p::zmq_io::apply_leased(&mut sock, core_cfg).map_err(err)?;
    sock.set_maxmsgsize(64 << 20).map_err(err)?;
    // A broker may be at an IPv6 address.
    sock.set_ipv6(true).map_err(err)?;
    sock.set_sndhwm(16).map_err(err)?;
    sock.set_linger(0).map_err(err)?;
    Ok(sock)
}

/// A hello's DEALER and the reader of its handshake monitor: the
/// monitor stops before the reader goes, whichever way the hello ends
/// (libzmq's I/O thread would block for good on an event for a reader
/// gone: see `zmq_io::stop_monitor`).
struct Asking {
    sock: zmq::Socket,
    monitor: zmq::Socket,
}

impl Drop for Asking {
    fn drop(&mut self) {
        crate::backend::p2p::zmq_io::stop_monitor(&mut self.sock);
    }
}

/// How long, once a broker answered, the answer of one listed before it
/// is awaited (the locator's order is the order of preference).
const PREFERENCE_WAIT: Duration = Duration::from_millis(50);

/// Asks every broker of `brokers` at once where it serves `domain`,
/// waiting up to `wait` in all: the node's is the first in the list of
/// those that answered (a later one is taken once none listed before it
/// answered within [`PREFERENCE_WAIT`] of it), so that a dead broker
/// listed first costs no more than the wait for the others.
pub(crate) fn hello(
    cfg: &crate::Config,
    brokers: &[BrokerAt],
    domain: &str,
    wait: Duration,
) -> Result<Uplink, OpenError> {
    let ctx = ContextRef::acquire();
    let mut why = String::new();
    // A broker said something (`why` is its answer), rather than a
    // handshake cut short or silence.
    let mut answered = false;
    let mut socks = Vec::new();
    for b in brokers {
        let sock = dealer_unconnected(&ctx, cfg, &b.endpoint, b.curve.as_ref())?;
        // A handshake that fails says why the broker does not answer (the
        // monitor first, so that it sees the first handshake).
        let monitor = handshake_monitor(&ctx, &sock)?;
        let mut asking = Asking { sock, monitor };
        connect(&asking.sock, &b.endpoint)?;
        let req: [&[u8]; 3] = [wire::MAGIC, wire::HELLO, domain.as_bytes()];
        if asking.sock.send_multipart(req, zmq::DONTWAIT).is_ok() {
            socks.push((b, asking));
        } else {
            crate::backend::p2p::zmq_io::stop_monitor(&mut asking.sock);
        }
    }
    let start = Instant::now();
    let mut deadline = start + wait;
    // The answers, by place in the list.
    let mut found: Vec<Option<Uplink>> = (0..socks.len()).map(|_| None).collect();
    let mut settled = vec![false; socks.len()];
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        // Every broker refused or failed the handshake: no use waiting.
        if settled.iter().all(|s| *s) && found.iter().all(Option::is_none) {
            break;
        }
        // The first listed that answered, if every one before it gave up.
        if let Some(i) = found.iter().position(Option::is_some) {
            if settled[..i].iter().all(|s| *s) {
                return Ok(found.swap_remove(i).expect("found"));
            }
        }
        let mut items: Vec<zmq::PollItem> = socks
            .iter()
            .flat_map(|(_, a)| {
                [
                    a.sock.as_poll_item(zmq::POLLIN),
                    a.monitor.as_poll_item(zmq::POLLIN),
                ]
            })
            .collect();
        let ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX).max(1);
        if !matches!(zmq::poll(&mut items, ms), Ok(n) if n > 0) {
            continue;
        }
        let ready: Vec<bool> = items.iter().map(zmq::PollItem::is_readable).collect();
        drop(items);
        for (i, (b, Asking { sock, monitor })) in socks.iter().enumerate() {
            let broker = &b.endpoint;
            if ready[2 * i + 1] {
                // A refused key or another mechanism is an answer; a
                // handshake cut short (a broker dying, a connection
                // dropped) is only said if nothing else answers.
                if let Some((failed, answer)) = handshake_failure(monitor, b) {
                    if answer || !answered {
                        why = failed;
                    }
                    answered |= answer;
                    settled[i] |= answer;
                }
            }
            if !ready[2 * i] {
                continue;
            }
            let Ok(frames) = sock.recv_multipart(zmq::DONTWAIT) else {
                continue;
            };
            match frames.as_slice() {
                [m, c, body] if m == wire::MAGIC && c == wire::HELLO => {
                    match serde_json::from_slice::<BrokerHello>(body) {
                        Ok(mut hello) if hello.domain == domain => {
                            for e in [
                                &mut hello.data_best_effort_in,
                                &mut hello.data_reliable_in,
                                &mut hello.liveliness_in,
                                &mut hello.data_best_effort_out,
                                &mut hello.data_reliable_out,
                                &mut hello.liveliness_out,
                                &mut hello.calls,
                                &mut hello.services_in,
                            ] {
                                *e = reached(e, broker);
                            }
                            found[i] = Some(Uplink {
                                broker: broker.clone(),
                                hello,
                                curve: b.curve.clone(),
                            });
                            // Those listed before it get a moment more.
                            deadline = deadline.min(Instant::now() + PREFERENCE_WAIT);
                        }
                        Ok(h) => {
                            why = format!(" ({broker} answered for domain {})", h.domain);
                            answered = true;
                        }
                        Err(e) => {
                            why = format!(" ({broker} sent a bad hello: {e})");
                            answered = true;
                        }
                    }
                    settled[i] = true;
                }
                [m, c, text] if m == wire::MAGIC && c == wire::ERROR => {
                    why = format!(" ({broker}: {})", String::from_utf8_lossy(text));
                    answered = true;
                    settled[i] = true;
                }
                _ => {}
            }
        }
    }
    // Time is up: the first listed that answered.
    if let Some(i) = found.iter().position(Option::is_some) {
        return Ok(found.swap_remove(i).expect("found"));
    }
    Err(OpenError::BrokerUnreachable {
        brokers: brokers
            .iter()
            .map(|b| b.endpoint.as_str())
            .collect::<Vec<_>>()
            .join(","),
        domain: domain.to_owned(),
        waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        why,
        answered,
    })
}

/// Asks the broker at `broker` whom it serves in `domain` (its clients,
/// with their last reports); `None` without an answer within `wait`.
pub(crate) fn clients(
    cfg: &crate::Config,
    up: &Uplink,
    domain: &str,
    wait: Duration,
) -> Option<Vec<wire::ClientInfo>> {
    let ctx = ContextRef::acquire();
    let sock = dealer(&ctx, cfg, &up.broker, up.curve.as_ref()).ok()?;
    let req: [&[u8]; 3] = [wire::MAGIC, wire::CLIENTS, domain.as_bytes()];
    sock.send_multipart(req, zmq::DONTWAIT).ok()?;
    let mut items = [sock.as_poll_item(zmq::POLLIN)];
    let ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX).max(1);
    if !matches!(zmq::poll(&mut items, ms), Ok(n) if n > 0) {
        return None;
    }
    match sock.recv_multipart(zmq::DONTWAIT).ok()?.as_slice() {
        [m, c, body] if m == wire::MAGIC && c == wire::CLIENTS => serde_json::from_slice(body).ok(),
        _ => None,
    }
}

/// Discovery through the broker: attaches the node's announcement every
/// `attach_interval_ms` and keeps the view the broker answers with.
///
/// Failover: a broker whose connection closes (its process died), or
/// that leaves attaches unanswered for [`FAILOVER_AFTER`] intervals, is
/// left for the next of the locator's brokers that answers (the same one
/// again if it is the only one, or the only one back): the node thread
/// then moves the node's sockets there ([`BrokerSource::take_move`]).
/// Until a broker answers, the last view stands for the broker's lease;
/// then it empties, and with it the node's peers.
pub(crate) struct BrokerSource {
    core: Arc<NodeCore>,
    sock: zmq::Socket,
    /// The reader of `sock`'s monitor: a closed connection.
    monitor: zmq::Socket,
    /// The locator's brokers, and which one is the node's.
    brokers: Vec<BrokerAt>,
    current: Uplink,
    /// A move the node thread has not made yet: from, to.
    moved: Option<(String, Uplink)>,
    /// The broker was lost: when to look for another next.
    lost_since: Option<Instant>,
    next_try: Instant,
    interval: Duration,
    lease: Duration,
    /// The announcement to attach, and its version.
    announcement: Vec<u8>,
    version: u64,
    /// The version last attached.
    sent: u64,
    next_attach: Instant,
    /// When a broker last answered (a hello of the one moved to counts):
    /// silence past `FAILOVER_AFTER` attaches looks for another.
    last_heard: Instant,
    /// When an attach was last answered: the view stands for the lease
    /// after that, then empties (a broker that answers hellos but no
    /// attach keeps no dead broker's view alive).
    view_heard: Instant,
    view_version: u64,
    view: Vec<Announcement>,
    /// The report sent with every [`REPORT_EVERY`]th attach, and how many
    /// attaches were sent.
    report: Vec<u8>,
    attaches: u64,
    /// Its client key (docs/protocol.md §11.2): random, kept for the
    /// node's life and across brokers, so that no other connection can
    /// attach or detach this node.
    key: String,
    // Declared last: the sockets close before the context goes.
    ctx: ContextRef,
}

/// Every how many attaches a client reports its subscriptions and
/// counters (once a second by default).
pub(crate) const REPORT_EVERY: u64 = 4;

/// Attach intervals without an answer after which a broker is left.
pub(crate) const FAILOVER_AFTER: u32 = 4;

/// How long a failover waits for the brokers' hellos.
const FAILOVER_HELLO: Duration = Duration::from_millis(250);

/// A DEALER to `up`'s broker and the reader of its monitor.
fn attach_socket(
    ctx: &ContextRef,
    core: &NodeCore,
    up: &Uplink,
) -> Result<(zmq::Socket, zmq::Socket), OpenError> {
    let sock = dealer(ctx, &core.cfg, &up.broker, up.curve.as_ref())?;
    // The detach at close gets a moment to leave.
    let _ = sock.set_linger(200);
    let err = |source: zmq::Error| OpenError::Socket {
        action: "monitor",
        endpoint: up.broker.clone(),
        source: source.transport(),
    };
    let mut r = [0u8; 8];
    let _ = getrandom::fill(&mut r);
    let ep = format!(
        "inproc://milonga-brokermon-{}-{}",
        core.id,
        u64::from_le_bytes(r)
    );
    sock.monitor(&ep, zmq_sys::ZMQ_EVENT_DISCONNECTED as i32)
        .map_err(err)?;
    let monitor = ctx.socket(zmq::PAIR)?;
    monitor.set_linger(0).map_err(err)?;
    crate::backend::p2p::zmq_io::unbounded_monitor_queue(&monitor).map_err(err)?;
    monitor.connect(&ep).map_err(err)?;
    Ok((sock, monitor))
}

/// A monitor of `sock`'s failed handshakes (a broker that refuses the
/// node's key, or holds another, or runs with the other security).
pub(crate) fn handshake_monitor(
    ctx: &ContextRef,
    sock: &zmq::Socket,
) -> Result<zmq::Socket, OpenError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let ep = format!(
        "inproc://milonga-hellomon-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let err = |source: zmq::Error| OpenError::Socket {
        action: "monitor",
        endpoint: ep.clone(),
        source: source.transport(),
    };
    sock.monitor(&ep, crate::backend::p2p::control::HANDSHAKE_FAILED)
        .map_err(err)?;
    let monitor = ctx.socket(zmq::PAIR)?;
    monitor.set_linger(0).map_err(err)?;
    crate::backend::p2p::zmq_io::unbounded_monitor_queue(&monitor).map_err(err)?;
    monitor.connect(&ep).map_err(err)?;
    Ok(monitor)
}

/// Why the handshake with `b` failed, if its monitor says it did, and
/// whether that is the broker's answer (it refused the key, or speaks
/// another mechanism) rather than a handshake cut short.
fn handshake_failure(monitor: &zmq::Socket, b: &BrokerAt) -> Option<(String, bool)> {
    let ev = monitor.recv_multipart(zmq::DONTWAIT).ok()?;
    let first = ev.first().filter(|f| f.len() >= 2)?;
    let event = u32::from(u16::from_le_bytes([first[0], first[1]]));
    let answer = matches!(
        event,
        zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
    );
    let broker = &b.endpoint;
    let why = match (&b.curve, event) {
        (Some(_), zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) => format!(
            " ({broker} refused this node's key: it is not in the broker's trust directory)"
        ),
        (Some(c), _) => format!(
            " (the secured handshake with {broker} failed: is its security on, and does it hold the key {}? Name the broker's key NAME@HOST:PORT in the locator; docs/broker.md)",
            c.server.fingerprint()
        ),
        (None, zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) => format!(
            " (the handshake with {broker} was cut short: it may be stopping, or its security may be on while this node's is off; docs/broker.md)"
        ),
        (None, _) => format!(
            " (the handshake with {broker} failed: its security may be on while this node's is off; docs/broker.md)"
        ),
    };
    Some((why, answer))
}

/// A new client key: 128 random bits as 32 lower-case hex digits.
pub(crate) fn client_key() -> String {
    let mut r = [0u8; 16];
    // Without the OS's randomness (never seen on Linux), a key of the
    // clock and the process still differs from every other client's.
    if getrandom::fill(&mut r).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        r = (t ^ (u128::from(std::process::id()) << 96)).to_le_bytes();
    }
    r.iter().map(|b| format!("{b:02x}")).collect()
}

impl BrokerSource {
    pub(crate) fn new(
        core: Arc<NodeCore>,
        up: Uplink,
        brokers: Vec<BrokerAt>,
        key: String,
    ) -> Result<BrokerSource, OpenError> {
        let ctx = ContextRef::acquire();
        let (sock, monitor) = attach_socket(&ctx, &core, &up)?;
        let now = Instant::now();
        Ok(BrokerSource {
            sock,
            monitor,
            brokers,
            moved: None,
            lost_since: None,
            next_try: now,
            // Within bounds whatever a broker says (a hostile one's hello
            // must not overflow the clock arithmetic below).
            interval: Duration::from_millis(up.hello.attach_interval_ms.clamp(10, 60_000)),
            lease: Duration::from_millis(up.hello.lease_ms.clamp(100, 3_600_000)),
            current: up,
            core,
            announcement: Vec::new(),
            version: 0,
            sent: 0,
            next_attach: now,
            last_heard: now,
            view_heard: now,
            view_version: 0,
            view: Vec::new(),
            report: Vec::new(),
            attaches: 0,
            key,
            ctx,
        })
    }

    /// Whether the next attach, due by `now`, carries a report: the node
    /// thread then gives it one ([`BrokerSource::set_report`]).
    pub(crate) fn report_due(&self, now: Instant) -> bool {
        now >= self.next_attach && self.attaches % REPORT_EVERY == 0
    }

    /// The report the next attach carries.
    pub(crate) fn set_report(&mut self, json: Vec<u8>) {
        self.report = json;
    }

    /// A move to another broker the node thread has to make: the broker
    /// left, and the one now used.
    pub(crate) fn take_move(&mut self) -> Option<(String, Uplink)> {
        self.moved.take()
    }

    /// Whether the broker's connection closed, or it stopped answering.
    fn broker_lost(&mut self, now: Instant) -> bool {
        let mut closed = false;
        while let Ok(ev) = self.monitor.recv_multipart(zmq::DONTWAIT) {
            closed |= ev.first().filter(|f| f.len() >= 2).is_some_and(|f| {
                u32::from(u16::from_le_bytes([f[0], f[1]])) & zmq_sys::ZMQ_EVENT_DISCONNECTED != 0
            });
        }
        closed || now.duration_since(self.last_heard) > self.interval * FAILOVER_AFTER
    }

    /// Looks for a broker that answers, the current one's successors
    /// first and the current one last; moves there if one does.
    fn fail_over(&mut self, now: Instant) {
        if now < self.next_try {
            return;
        }
        let i = self
            .brokers
            .iter()
            .position(|b| b.endpoint == self.current.broker)
            .unwrap_or(0);
        let n = self.brokers.len().max(1);
        let order: Vec<BrokerAt> = (1..=n)
            .filter_map(|k| self.brokers.get((i + k) % n).cloned())
            .collect();
        let found = hello(&self.core.cfg, &order, &self.core.domain, FAILOVER_HELLO);
        // The next ask counted from this one's end: a hello that waits
        // for brokers that are all down takes up to FAILOVER_HELLO of the
        // node thread, which must get its other work done between asks.
        self.next_try = Instant::now() + FAILOVER_HELLO;
        let up = match found {
            Ok(up) => up,
            Err(e) => {
                limited!(warn, %e, "no broker answers: the node keeps trying");
                return;
            }
        };
        match attach_socket(&self.ctx, &self.core, &up) {
            Ok((sock, monitor)) if up.hello == self.current.hello => {
                // The same broker (it was silent, not gone): the node's
                // sockets stay; it attaches again.
                crate::backend::p2p::zmq_io::stop_monitor(&mut self.sock);
                self.sock = sock;
                self.monitor = monitor;
                self.lost_since = None;
                self.sent = 0;
                self.next_attach = now;
                self.last_heard = now;
                self.follow(&up);
            }
            Ok((sock, monitor)) => {
                tracing::warn!(from = %self.current.broker, to = %up.broker, "the broker was lost: the node moves to another");
                crate::backend::p2p::zmq_io::stop_monitor(&mut self.sock);
                self.sock = sock;
                self.monitor = monitor;
                self.follow(&up);
                let from = std::mem::replace(&mut self.current, up.clone());
                self.moved = Some((from.broker, up));
                self.lost_since = None;
                // Its view starts afresh.
                self.view_version = 0;
                self.sent = 0;
                self.next_attach = now;
                self.last_heard = now;
            }
            Err(e) => tracing::warn!(err = %e, "cannot connect to the broker that answered"),
        }
    }

    /// Takes the attach interval and lease of the broker now used (each
    /// broker says its own in its hello).
    fn follow(&mut self, up: &Uplink) {
        self.interval = Duration::from_millis(up.hello.attach_interval_ms.clamp(10, 60_000));
        self.lease = Duration::from_millis(up.hello.lease_ms.clamp(100, 3_600_000));
    }

    /// The version of the announcement it attaches.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The node's announcement changed: attached at the next turn.
    pub(crate) fn set_announcement(&mut self, version: u64, json: Vec<u8>) {
        self.version = version;
        self.announcement = json;
    }

    /// Attaches `announcement` (version `version`) and waits up to `wait`
    /// for the broker's view, so that a node opened on a broker knows the
    /// domain when `open` returns, as a peer-to-peer node knows its local
    /// peers.
    pub(crate) fn first_view(&mut self, version: u64, announcement: Vec<u8>, wait: Duration) {
        self.set_announcement(version, announcement);
        let deadline = Instant::now() + wait;
        self.turn(Instant::now());
        while self.view_version == 0 {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                tracing::warn!("the broker sent no view in time: the node starts without peers");
                return;
            };
            let mut items = [self.sock.as_poll_item(zmq::POLLIN)];
            let ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX).max(1);
            if matches!(zmq::poll(&mut items, ms), Ok(n) if n > 0) {
                self.turn(Instant::now());
            }
        }
    }

    /// Tells the broker the node is leaving (its closing).
    pub(crate) fn leave(&self) {
        let id = self.core.id.to_hex();
        let req: [&[u8]; 4] = [
            wire::MAGIC,
            wire::DETACH,
            id.as_bytes(),
            self.key.as_bytes(),
        ];
        let _ = self.sock.send_multipart(req, zmq::DONTWAIT);
    }

    /// Reads one reply; whether the view changed.
    fn read(&mut self, frames: &[Vec<u8>], now: Instant) -> bool {
        let c = &self.core.counters;
        match frames {
            [m, c1, v] if m == wire::MAGIC && c1 == wire::SAME => {
                if std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    == Some(self.view_version)
                {
                    self.last_heard = now;
                    self.view_heard = now;
                }
                false
            }
            [m, c1, v, body] if m == wire::MAGIC && c1 == wire::VIEW => {
                let version = std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok());
                let view = serde_json::from_slice::<Vec<serde_json::Value>>(body);
                let (Some(version), Ok(view)) = (version, view) else {
                    stats::inc(&c.control_malformed);
                    return false;
                };
                self.last_heard = now;
                self.view_heard = now;
                self.view_version = version;
                let me = self.core.id.to_hex();
                let mut peers = Vec::with_capacity(view.len());
                for a in view {
                    let Ok(mut a) = serde_json::to_vec(&a)
                        .map_err(|_| ())
                        .and_then(|j| Announcement::from_json(&j).map_err(|_| ()))
                    else {
                        stats::inc(&c.announcements_malformed);
                        continue;
                    };
                    reached_all(&mut a, &self.current.broker);
                    if a.domain != self.core.domain {
                        stats::inc(&c.peers_foreign_domain);
                    } else if a.node_id != me {
                        peers.push(a);
                    }
                }
                let changed = peers != self.view;
                self.view = peers;
                changed
            }
            [m, c1, text] if m == wire::MAGIC && c1 == wire::ERROR => {
                // An attach refused (another connection holds this node's
                // id, or the broker serves its most clients): said, and
                // tried again at the next attach.
                limited!(warn, broker = %self.current.broker, "the broker refused this node: {}", String::from_utf8_lossy(text));
                false
            }
            _ => {
                c.control_malformed.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }
}

impl Source for BrokerSource {
    fn turn(&mut self, now: Instant) -> bool {
        let mut changed = false;
        while let Ok(frames) = self.sock.recv_multipart(zmq::DONTWAIT) {
            changed |= self.read(&frames, now);
        }
        if self.lost_since.is_none() && self.broker_lost(now) {
            self.lost_since = Some(now);
        }
        if self.lost_since.is_some() {
            self.fail_over(now);
        }
        if now >= self.next_attach || self.sent != self.version {
            let view = self.view_version.to_string();
            let mut req: Vec<&[u8]> = vec![
                wire::MAGIC,
                wire::ATTACH,
                &self.announcement,
                view.as_bytes(),
            ];
            // The report (or an empty frame: none this time), the key.
            if self.attaches % REPORT_EVERY == 0 {
                req.push(&self.report);
            } else {
                req.push(b"");
            }
            req.push(self.key.as_bytes());
            if !self.announcement.is_empty() && self.sock.send_multipart(req, zmq::DONTWAIT).is_ok()
            {
                self.sent = self.version;
                self.attaches += 1;
            }
            self.next_attach = now + self.interval;
        }
        if now.duration_since(self.view_heard) > self.lease && !self.view.is_empty() {
            // No broker answers: everything the last one showed is gone.
            tracing::warn!(broker = %self.current.broker, "no broker has answered for the lease: its nodes are gone from view");
            self.view.clear();
            self.view_version = 0;
            changed = true;
        }
        changed
    }

    fn peers_into(&self, peers: &mut Vec<Announcement>) {
        peers.extend(self.view.iter().cloned());
    }

    fn next_due(&self) -> Option<Instant> {
        Some(match self.lost_since {
            Some(_) => self.next_attach.min(self.next_try),
            None => self.next_attach,
        })
    }
}

impl Drop for BrokerSource {
    fn drop(&mut self) {
        // Before the monitor's reader goes (see zmq_io::stop_monitor).
        crate::backend::p2p::zmq_io::stop_monitor(&mut self.sock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_endpoint_is_reached_at_the_brokers_address_and_a_tag_is_dropped_to_connect() {
        let b = "tcp://10.0.0.5:7447";
        assert_eq!(reached("tcp://0.0.0.0:4001", b), "tcp://10.0.0.5:4001");
        assert_eq!(
            reached("tcp://[::]:4001#00ff", b),
            "tcp://10.0.0.5:4001#00ff"
        );
        assert_eq!(reached("tcp://127.0.0.1:4001", b), "tcp://127.0.0.1:4001");
        assert_eq!(
            reached("tcp://0.0.0.0:4001", "tcp://[fd00::1]:7447"),
            "tcp://[fd00::1]:4001"
        );
        assert_eq!(untagged("tcp://10.0.0.5:4001#00ff"), "tcp://10.0.0.5:4001");
        assert_eq!(untagged("tcp://10.0.0.5:4001"), "tcp://10.0.0.5:4001");
    }

    /// A broker that answers every hello for `domain`, on a thread.
    fn answering_broker(domain: &str) -> (String, std::thread::JoinHandle<()>) {
        let ctx = ContextRef::acquire();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let ep = router.get_last_endpoint().unwrap().unwrap();
        let at = ep.clone();
        let hello = serde_json::to_vec(&serde_json::json!({
            "domain": domain, "node_id": "00".repeat(16),
            "data_best_effort_in": at, "data_reliable_in": at, "liveliness_in": at,
            "data_best_effort_out": at, "data_reliable_out": at, "liveliness_out": at,
            "calls": at, "services_in": at, "attach_interval_ms": 250, "lease_ms": 1000
        }))
        .unwrap();
        let t = std::thread::spawn(move || {
            let _ctx = ctx;
            // Two hellos (one from each `hello` below), then done.
            for _ in 0..2 {
                let Ok(mut f) = router.recv_multipart(0) else {
                    return;
                };
                f.truncate(3);
                f.push(hello.clone());
                let _ = router.send_multipart(f, 0);
            }
        });
        (ep, t)
    }

    #[test]
    fn a_handshake_failing_after_a_hello_returned_leaves_the_io_thread_running() {
        // The second broker listed accepts the connection and says
        // nothing; the first answers, so `hello` returns while the second
        // one's handshake is under way. That connection is then reset:
        // libzmq reports the failed handshake to the hello's monitor from
        // its I/O thread, with a blocking send. Were the monitor's reader
        // gone with the monitor still on, that send would never return
        // and every socket of the process would stop (seen in a failover
        // test: the client never reached the next broker).
        let (good, answering) = answering_broker("lab");
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_ep = format!("tcp://{}", silent.local_addr().unwrap());
        let cfg = crate::Config::new("milonga:///lab", "hs-test");
        let brokers = [
            BrokerAt {
                endpoint: good.clone(),
                curve: None,
            },
            BrokerAt {
                endpoint: silent_ep,
                curve: None,
            },
        ];
        let up = hello(&cfg, &brokers, "lab", Duration::from_secs(10)).expect("the first answers");
        assert_eq!(up.broker, good);
        // The second's connection, accepted and mid-handshake, reset.
        silent.set_nonblocking(true).unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        let conn = loop {
            match silent.accept() {
                Ok((c, _)) => break c,
                Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => panic!("the hello never connected to the second broker: {e}"),
            }
        };
        socket2::SockRef::from(&conn)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(conn);
        // Nothing outside libzmq sees the failed handshake's event (its
        // monitor is what is under test), so no condition tells when the
        // I/O thread has read the reset: a fixed moment for it to do so
        // first, then a hello with its own deadline. (With the stop
        // removed, this failed: "no answer after the reset".)
        std::thread::sleep(Duration::from_millis(200));
        // The I/O thread still runs: another hello is answered.
        let again = hello(&cfg, &brokers[..1], "lab", Duration::from_secs(5));
        assert!(again.is_ok(), "no answer after the reset: {again:?}");
        answering.join().unwrap();
    }
}
