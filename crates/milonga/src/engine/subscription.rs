//! A subscription's protocol state machine, with no I/O of its own: the
//! routes discovery gives it (connections to make, history queries and
//! filter declarations to send), every frame received (decoding, domain,
//! sequence numbers and gaps, history joins and repairs, heartbeats and
//! goodbyes), and time passing (leases, deadlines, departures, back-offs).
//! What it sends and connects goes through a [`Link`]; what it yields is
//! queued as [`Event`]s in its [`SubState`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use milonga_wire::cbor::decode_payload;
use milonga_wire::frame::{
    self, BatchEntries, FrameError, Kind, FLAG_COMPRESSED, FLAG_PAYLOAD_FRAME, FLAG_REPLAYED,
};
use milonga_wire::history::{KeyHistory, Query, Reply, REPLY_KEY_PREFIX};
use milonga_wire::schema::{Incompatible, Plan, Schema};
use milonga_wire::{Bytes, Encoding, KeyExpr, NodeId, Value};

use crate::engine::compress::Learned;
use crate::engine::routes::{MatchedPublication, Routes};
use crate::engine::seq::{SeqBook, Step, MAX_KEYS_PER_PUBLISHER, MAX_SEQ_JUMP};
use crate::model::error::TransportError;
use crate::model::qos::Reliability;
use crate::model::sample::{
    DeadlineMissed, Event, IncompatibleQos, LostReason, LostSamples, PermissionDenied,
    PublisherAlive, PublisherLost, QosPolicy, Sample,
};
use crate::util::lock;
use crate::util::stats::{self, log_drop, Counters};

/// What a subscription needs of its connections: a backend provides it
/// (the peer-to-peer one with an XSUB socket), a test with a recording.
pub(crate) trait Link {
    /// Connects to a publisher's endpoint; `pinged`: the connection sends
    /// ZMTP heartbeats, which a data socket needs to keep a subscriber
    /// that is not reading (it drops one that sends nothing: frozen, or
    /// its host dead); a liveliness socket never drops a silent
    /// subscriber, and PINGs on every connection would cost more than a
    /// host of many nodes has.
    fn connect(&mut self, endpoint: &str, pinged: bool) -> Result<(), TransportError>;
    /// Disconnects from an endpoint (nothing if not connected).
    fn disconnect(&mut self, endpoint: &str);
    /// Sends a message upstream to every connected publisher (a history
    /// query, a filter declaration), without waiting.
    fn send(&mut self, msg: Vec<u8>) -> Result<(), TransportError>;
    /// The time now: the engine reads no clock of its own, so that its
    /// tests set the time (messages handled, routes applied; timers take
    /// theirs as an argument). Read only where a message needs it (a
    /// heartbeat, a deadline, a join), never for a plain sample.
    fn now(&self) -> Instant;
}

/// A subscription's receive state and its link: everything the thread
/// receiving for it owns (`SubShared.io`).
pub(crate) struct SubState<L> {
    pub(crate) link: L,
    /// Calls left that go straight to a blocking receive: set when a
    /// non-blocking attempt found nothing, which means messages arrive one
    /// at a time and trying first only costs a system call.
    pub(crate) skip_try: u8,
    pub(crate) connected: BTreeSet<String>,
    pub(crate) applied: u64,
    /// The last sequence number held of each (publisher, key).
    seqs: SeqBook,
    /// Whether a key matches a wildcard expression (bounded memo).
    matches: HashMap<String, bool>,
    pub(crate) pending: VecDeque<Event>,
    /// The receive time of the events in `pending` (UNIX ns; 0: not
    /// read), when the receiving side asks for receive times: the clock is
    /// read only while `pending` is empty, so that they all share it.
    pub(crate) stamp: u64,
    /// Liveliness endpoint -> node, as last applied.
    liveliness: BTreeMap<String, NodeId>,
    /// Data endpoint -> its node, for the data endpoints connected. One
    /// stays connected while its node lives, even when the node no longer
    /// offers a matching key: a disconnect drops the messages that came on
    /// it and were not read yet (the last samples of a publisher that was
    /// just undeclared), and the node may offer the key again.
    data_nodes: BTreeMap<String, NodeId>,
    /// Data endpoints of nodes that left discovery, kept connected until
    /// their connection closes or the lease passes (the deadline): the last
    /// samples such a node put before closing may still be on their way,
    /// a large one half received, and a disconnect would drop them.
    lingering: HashMap<String, Instant>,
    /// Nodes that left discovery whose sequence state is kept, oldest
    /// first: a node out of sight for a while (a partition, a freeze longer
    /// than the lease) that comes back with the same id is checked against
    /// what was received before. At most [`MAX_ABSENT_PUBLISHERS`].
    absent: VecDeque<NodeId>,
    /// The last sequence number of each key that nodes said goodbye with
    /// (`leaving` heartbeats): once their data connections are gone, what
    /// did not arrive is reported lost.
    goodbyes: HashMap<NodeId, Vec<(String, u64)>>,
    /// Endpoints whose connection closed, and when they may be connected
    /// again (exponential back-off with jitter, 50 ms to 2 s).
    backoff: HashMap<String, Backoff>,
    /// Endpoints that refused this node's key, reported once each (at most
    /// [`MAX_REFUSED`]); forgotten when the endpoint is dropped.
    refused: BTreeSet<String>,
    /// Every node discovery shows in the domain, as last applied: samples
    /// of other nodes (unless remembered in `seqs` or
    /// `recently_gone`) are dropped.
    live: BTreeSet<NodeId>,
    /// Nodes that left discovery lately, oldest first (at most
    /// [`MAX_RECENTLY_GONE`]): samples they sent before leaving may still
    /// be read, a first one included.
    recently_gone: VecDeque<NodeId>,
    /// The keys of `recently_gone` nodes whose publication matching this
    /// subscription was reliable and kept history when they left: a gap
    /// their samples reveal before they are shown again can be repaired
    /// then (a key without history goes on at once).
    gone_repairable: BTreeSet<(NodeId, String)>,
    /// The key each node announced (security on), kept while the node is
    /// live or its data connection may still deliver (at most
    /// [`MAX_NODE_KEYS`] beyond those).
    node_keys: HashMap<NodeId, std::sync::Arc<str>>,
    /// The publisher nodes discovery shows for this subscription.
    publishers: HashMap<NodeId, PubState>,
    /// Per-key deadline state, when the QoS sets a deadline.
    deadlines: HashMap<String, KeyDeadline>,
    /// Keys every publisher undeclared while its node stays in view, and
    /// since when: their deadline watch ends a lease later, unless one
    /// comes back or its node leaves (see `retire_deadlines`).
    deadline_retiring: HashMap<String, (Instant, Vec<NodeId>)>,
    /// When a lease or a deadline may next run out (never later than the
    /// first that does).
    pub(crate) next_timer: Option<Instant>,
    /// Messages handled: timers are checked every 256 under a flood.
    pub(crate) handled: u32,
    /// The matching publications, as last applied.
    matched: BTreeMap<(NodeId, String), MatchedPublication>,
    /// History queries in flight, by publisher node: its samples wait.
    joins: HashMap<NodeId, Join>,
    /// Joins started by the first routes that are not finished.
    initial_joins: usize,
    /// The last history query's `id`.
    query_id: u64,
    /// Whether `SubscriptionLive` was queued (or is not wanted).
    live_sent: bool,
    /// Whether routes were applied once.
    routed: bool,
    /// The schemas learned (docs/schemas.md), by (publisher, schema id):
    /// how this subscription reads its samples, or why it cannot. At most
    /// [`MAX_SCHEMAS`].
    schemas: HashMap<(NodeId, u32), Result<Arc<Plan>, Incompatible>>,
    /// Schemas asked for, when and how often: asked again only after
    /// [`JOIN_TIMEOUT`], doubled at each time unanswered (at most 64 s).
    /// At most [`MAX_SCHEMAS`].
    schemas_asked: HashMap<(NodeId, u32), Asked>,
    /// Schemas compact samples needed while a query to their node was in
    /// flight: asked in one query when it ends (one query at a time per
    /// node, whatever a publisher sends). At most
    /// [`MAX_SCHEMAS_ASKED`](milonga_wire::history::MAX_SCHEMAS_ASKED) a node.
    schemas_wanted: HashMap<NodeId, BTreeMap<u32, String>>,
    /// The zstd dictionaries learned (docs/compression.md,
    /// "Dictionaries"), by (publisher, id). At most [`MAX_DICTIONARIES`].
    dictionaries: HashMap<(NodeId, u32), (Arc<Learned>, Instant)>,
    /// Dictionaries asked for, when and how often (as `schemas_asked`).
    /// At most [`MAX_DICTIONARIES`] * 4.
    dictionaries_asked: HashMap<(NodeId, u32), Asked>,
    /// Dictionaries frames named while a query to their node was in
    /// flight: asked when it ends, with the schemas wanted.
    dictionaries_wanted: HashMap<NodeId, BTreeMap<u32, String>>,
}

/// A schema asked for.
#[derive(Clone, Copy)]
struct Asked {
    at: Instant,
    times: u32,
}

/// Whether `id` of `node` (a schema or a dictionary, not `known`) may be
/// asked for at `now`: never asked, or asked [`JOIN_TIMEOUT`] ago, doubled
/// at each time unanswered (at most 64 s). If so, it is noted in `asked`,
/// which keeps at most `cap`: the one this node asked longest ago makes
/// room (another node's only if this one has none), so that a node cannot
/// push out the asks of others.
fn may_ask(
    asked: &mut HashMap<(NodeId, u32), Asked>,
    known: bool,
    (node, id): (NodeId, u32),
    now: Instant,
    cap: usize,
) -> bool {
    if known {
        return false;
    }
    let before = asked.get(&(node, id)).copied();
    if let Some(a) = before {
        if now < a.at + JOIN_TIMEOUT * (1 << a.times.min(5)) {
            return false;
        }
    } else if asked.len() >= cap {
        let oldest = |same: bool| {
            asked
                .iter()
                .filter(|((n, _), _)| !same || *n == node)
                .min_by_key(|(_, a)| a.at)
                .map(|(k, _)| *k)
        };
        if let Some(k) = oldest(true).or_else(|| oldest(false)) {
            asked.remove(&k);
        }
    }
    let times = before.map_or(0, |a| a.times + 1);
    asked.insert((node, id), Asked { at: now, times });
    true
}

impl<L> SubState<L> {
    /// Whether dictionary `id` of `node` may be asked for at `now` (see
    /// [`may_ask`]); if so, it is noted as asked.
    fn may_ask_dictionary(&mut self, node: NodeId, id: u32, now: Instant) -> bool {
        let known = self.dictionaries.contains_key(&(node, id));
        may_ask(
            &mut self.dictionaries_asked,
            known,
            (node, id),
            now,
            MAX_DICTIONARIES * 4,
        )
    }

    /// Whether schema `id` of `node` may be asked for at `now` (see
    /// [`may_ask`]); if so, it is noted as asked.
    fn may_ask_schema(&mut self, node: NodeId, id: u32, now: Instant) -> bool {
        let known = self.schemas.contains_key(&(node, id));
        may_ask(&mut self.schemas_asked, known, (node, id), now, MAX_SCHEMAS)
    }
}

/// A payload as a sample carries it until delivery: decoded, except a
/// compact one (encoding 3), kept as its bytes (frames joined) until its
/// schema reads it, once its sequence number is taken.
fn payload_value(
    encoding: Encoding,
    first: Bytes,
    second: Option<Bytes>,
) -> Result<Value, milonga_wire::cbor::DecodeError> {
    match (encoding, second) {
        (Encoding::Compact, None) => Ok(Value::Bytes(first)),
        (Encoding::Compact, Some(tail)) => {
            let mut v = Vec::with_capacity(first.len() + tail.len());
            v.extend_from_slice(&first);
            v.extend_from_slice(&tail);
            Ok(Value::Bytes(Bytes::from(v)))
        }
        (encoding, second) => decode_payload(encoding, first, second),
    }
}

/// The publications of `node` in a map keyed by (node, key), in key order.
fn of_node(
    map: &BTreeMap<(NodeId, String), MatchedPublication>,
    node: NodeId,
) -> impl Iterator<Item = (&String, &MatchedPublication)> {
    map.range((node, String::new())..)
        .take_while(move |((n, _), _)| *n == node)
        .map(|((_, k), p)| (k, p))
}

/// Most schemas a subscription keeps (and asks for at once): beyond, what
/// it learned is forgotten and asked again when a sample needs it.
const MAX_SCHEMAS: usize = 4096;

impl<L> SubState<L> {
    /// Makes sure the timers are looked at by `at` at the latest.
    pub(crate) fn arm(&mut self, at: Instant) {
        self.next_timer = Some(self.next_timer.map_or(at, |t| t.min(at)));
    }
}

/// A history query in flight to one publisher node: until it is answered
/// (or times out), that node's samples wait here, so that kept samples come
/// first and the live ones follow in order.
struct Join {
    /// Data sockets (`best_effort`, `reliable`) asked and not done
    /// answering.
    pending: BTreeSet<String>,
    replies: Vec<KeyHistory>,
    buffer: Vec<Sample>,
    started: Instant,
    /// Started by the subscription's first routes (`SubscriptionLive`
    /// waits for it).
    initial: bool,
    /// Per data socket, the `id`s of the queries in flight: a reply
    /// naming another answers a copy of an earlier query, late.
    ids: BTreeMap<String, Vec<u64>>,
    /// The queries sent again while their socket has sent no reply
    /// ([`RESEND_AFTER`]).
    again: Vec<Resend>,
    /// The sockets that sent a reply, done or not.
    heard: BTreeSet<String>,
    /// Started by the end of another join, for the schemas its samples
    /// needed meanwhile: it starts no further one (no chain of joins).
    chained: bool,
    /// Raw data messages of the node, from the first that named a
    /// dictionary this subscription does not know: they wait, in order,
    /// behind `buffer`, and go through [`Subscription::handle`] again
    /// when the join ends. At most [`MAX_HELD_FRAMES`] and
    /// [`MAX_HELD_BYTES`].
    held: Vec<(Bytes, Option<Bytes>)>,
    held_bytes: usize,
    /// The queries were sent again when the node's samples came after
    /// they had gone unanswered ([`Subscription::deliver`]): once a join.
    woken: bool,
    /// Opened by a sample of a node discovery no longer shows that
    /// revealed a gap its history may fill ([`Subscription::deliver`]):
    /// nothing is asked yet, and this is how long the samples wait for
    /// the node to be shown again (the lease, [`JOIN_TIMEOUT`] at least).
    /// The query that goes when it is (`apply`) takes the join over, its
    /// time starting then; if none goes by then, the samples go on and
    /// the gap is reported.
    out_of_view: Option<Instant>,
}

impl Join {
    /// A join begun at `now`, nothing asked yet.
    fn new(now: Instant, initial: bool, out_of_view: Option<Instant>) -> Join {
        Join {
            pending: BTreeSet::new(),
            replies: Vec::new(),
            buffer: Vec::new(),
            started: now,
            initial,
            ids: BTreeMap::new(),
            again: Vec::new(),
            heard: BTreeSet::new(),
            chained: false,
            held: Vec::new(),
            held_bytes: 0,
            woken: false,
            out_of_view,
        }
    }
}

/// Most raw messages a join holds for a dictionary.
const MAX_HELD_FRAMES: usize = 10_000;
/// Most bytes of raw messages a join holds for a dictionary.
const MAX_HELD_BYTES: usize = 64 << 20;
/// Most dictionaries a subscription keeps: beyond, the one of the same
/// node (else of any) learned longest ago is forgotten, and asked again
/// when a frame needs it.
const MAX_DICTIONARIES: usize = 256;

/// A query to send again while unanswered.
struct Resend {
    /// Its `id`: no copy goes once the reply naming it is done.
    id: u64,
    socket: String,
    msg: Vec<u8>,
    /// When it was first sent.
    at: Instant,
    /// How many of [`RESEND_AFTER`] have passed.
    copies: usize,
}

/// How long a history query may go unanswered.
const JOIN_TIMEOUT: Duration = Duration::from_secs(2);
/// When a query sent to a newly connected publisher is sent again, after
/// the first, while no reply began to answer it: the connection it went
/// on may have been made after it (a broker that connects to a publisher
/// once a client subscribes, a publisher whose connection was still being
/// made). Copies carry the query's `id`; a second answer is ignored.
/// Repairs, asked on a connection that just delivered, are not sent
/// again.
const RESEND_AFTER: [Duration; 2] = [Duration::from_millis(300), Duration::from_millis(900)];
/// Most live samples a node's join holds before it gives up waiting.
const MAX_JOIN_BUFFER: usize = 100_000;

/// What to do with a sample, from its sequence number.
enum Verdict {
    Deliver,
    Drop,
    /// A gap that history can repair: the last sequence number held.
    Repair(u64),
}

/// What a subscription knows of one publisher node's liveliness.
struct PubState {
    name: String,
    alive: bool,
    last_heard: Instant,
    /// When discovery stopped showing a matching publication of it:
    /// reported `undeclared` [`DEPARTURE_GRACE`] later, unless its
    /// goodbye (still on its way) or a closed connection comes first. A
    /// node that left the domain altogether waits for those (or its lease)
    /// instead, up to a lease; its liveliness connection is kept meanwhile.
    departing: Option<Instant>,
    /// It said goodbye: samples still on their way (a batch flushed at
    /// close) do not make it alive again.
    closed: bool,
    /// When its liveliness connection closed: reported `disconnected`
    /// after [`DISCONNECT_GRACE`], unless its goodbye arrives meanwhile.
    disconnected_at: Option<Instant>,
    /// Reported `undeclared` while the node itself lives on (its data
    /// connection is kept): the entry stays so that a publication it
    /// declares again is reported alive again.
    undeclared: bool,
    /// A sample of it arrived while `undeclared` (before discovery showed
    /// its new publication): it is reported alive when discovery does.
    sampled: bool,
}

/// How long a closed liveliness connection waits for a goodbye heartbeat
/// still on its way (ZeroMQ may report the close before the last message
/// is readable) before the publisher is reported `disconnected`. Closes are
/// read once the socket has nothing left, so the goodbye has been read
/// unless ZeroMQ was still handing it over.
const DISCONNECT_GRACE: Duration = Duration::from_millis(2);

/// How long after discovery stops showing a publication of a node that
/// discovery still shows it is reported `undeclared` (and then only once
/// the socket has nothing left to read): its goodbye or closed connection,
/// still on their way, win.
const DEPARTURE_GRACE: Duration = Duration::from_millis(10);

/// The same wait for a close noted while messages still queue (a flood):
/// the goodbye may be among them.
pub(crate) const FLOOD_GRACE: Duration = Duration::from_millis(50);

/// How long a node whose broker connection closed waits, before it is
/// reported `disconnected`, for its node to move to another broker
/// (docs/broker.md): the failover's own bound.
pub(crate) const BROKER_GRACE: Duration = Duration::from_secs(1);

/// A connection that stayed up this long since its last close starts its
/// back-off over.
const BACKOFF_RESET: Duration = Duration::from_secs(10);

/// When a closed endpoint may be connected again.
struct Backoff {
    /// Closes in a row, each less than [`BACKOFF_RESET`] after the last.
    failures: u32,
    last_close: Instant,
    /// Not before.
    next: Instant,
}

/// When a key last spoke, and when its deadline runs out.
struct KeyDeadline {
    last: Instant,
    due: Instant,
}

/// Most keys a subscription watches deadlines of.
const MAX_DEADLINE_KEYS: usize = 1 << 16;

/// Most publisher nodes absent from discovery whose sequence state a
/// subscription keeps (docs/guarantees.md); beyond, the longest absent is
/// forgotten and reported `PublisherLost` with reason `forgotten`.
pub(crate) const MAX_ABSENT_PUBLISHERS: usize = 256;

/// Most keys, over all absent publisher nodes, whose sequence state a
/// subscription keeps; beyond, absent nodes are forgotten as above.
pub(crate) const MAX_ABSENT_KEYS: usize = 1 << 16;

/// Most nodes that left discovery whose first samples a subscription still
/// accepts (see `SubState::recently_gone`).
const MAX_RECENTLY_GONE: usize = 1024;

/// Keys of nodes that are not live a subscription remembers beyond the
/// live ones' before it forgets those of nodes long gone.
const MAX_NODE_KEYS: usize = 4096;
/// Most refusing endpoints remembered (each reported once).
const MAX_REFUSED: usize = 1024;

/// Most goodbyes (nodes) whose last sequence numbers wait for their data
/// connections to close.
const MAX_GOODBYES: usize = 1024;

/// Most keys a wildcard subscription remembers the match of.
const MATCH_MEMO: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Target {
    routes: Routes,
    generation: u64,
}

/// What a subscription is, fixed at declaration, with what the node thread
/// and the handle also reach: the routes discovery sets, the losses the
/// handle reads.
pub(crate) struct Subscription {
    pub(crate) expr: KeyExpr,
    target: Mutex<Target>,
    pub(crate) lost_total: AtomicU64,
    pub(crate) lost_by_publisher: Mutex<HashMap<NodeId, u64>>,
    deadline: Option<Duration>,
    lease: Duration,
    /// Samples asked for on joining (`SubscriberQos::last`).
    last: usize,
    /// Whether gaps from reliable publishers with history are repaired.
    reliable: bool,
    /// This subscription's token: history replies come under `@r/<token>`.
    token: String,
    /// The filter publishers apply, and its key prefix `@f/<id>/`.
    filter: Option<(milonga_wire::filter::Filter, String)>,
    /// The domain's tag: frames of another domain are refused.
    domain_tag: u32,
    /// `max_message_bytes`: no compressed body inflates beyond it.
    max_bytes: usize,
    /// The reader's schema (`SubscriberQos::schema`).
    reader: Option<Schema>,
    /// Compact samples keep their payload for `Sample::deserialize`
    /// (`SubscriberQos::typed`).
    typed: bool,
    counters: Arc<Counters>,
}

/// What a subscription asks of its publishers (see [`Subscription::new`]).
pub(crate) struct Wants {
    pub(crate) deadline: Option<Duration>,
    pub(crate) lease: Duration,
    pub(crate) last: usize,
    pub(crate) reliable: bool,
    pub(crate) token: String,
    pub(crate) filter: Option<(milonga_wire::filter::Filter, String)>,
    /// `max_message_bytes`.
    pub(crate) max_bytes: usize,
    /// The reader's schema.
    pub(crate) schema: Option<Schema>,
    /// `SubscriberQos::typed`.
    pub(crate) typed: bool,
}

impl<L> SubState<L> {
    /// The data endpoints connected (liveliness ones aside).
    pub(crate) fn data_connections(&self) -> usize {
        self.connected
            .iter()
            .filter(|e| !self.liveliness.contains_key(*e))
            .count()
    }

    /// The state of a subscription that has seen nothing yet.
    pub(crate) fn new(link: L, last: usize) -> Self {
        SubState {
            link,
            skip_try: 0,
            connected: BTreeSet::new(),
            applied: 0,
            seqs: SeqBook::default(),
            matches: HashMap::new(),
            pending: VecDeque::new(),
            stamp: 0,
            liveliness: BTreeMap::new(),
            data_nodes: BTreeMap::new(),
            lingering: HashMap::new(),
            absent: VecDeque::new(),
            goodbyes: HashMap::new(),
            live: BTreeSet::new(),
            node_keys: HashMap::new(),
            recently_gone: VecDeque::new(),
            gone_repairable: BTreeSet::new(),
            backoff: HashMap::new(),
            refused: BTreeSet::new(),
            publishers: HashMap::new(),
            deadlines: HashMap::new(),
            deadline_retiring: HashMap::new(),
            next_timer: None,
            handled: 0,
            matched: BTreeMap::new(),
            joins: HashMap::new(),
            initial_joins: 0,
            query_id: 0,
            live_sent: last == 0,
            routed: false,
            schemas: HashMap::new(),
            schemas_asked: HashMap::new(),
            schemas_wanted: HashMap::new(),
            dictionaries: HashMap::new(),
            dictionaries_asked: HashMap::new(),
            dictionaries_wanted: HashMap::new(),
        }
    }
}

impl Subscription {
    pub(crate) fn new(
        expr: KeyExpr,
        wants: Wants,
        domain_tag: u32,
        counters: Arc<Counters>,
    ) -> Self {
        Subscription {
            expr,
            target: Mutex::new(Target::default()),
            lost_total: AtomicU64::new(0),
            lost_by_publisher: Mutex::new(HashMap::new()),
            deadline: wants.deadline,
            lease: wants.lease,
            last: wants.last,
            reliable: wants.reliable,
            token: wants.token,
            filter: wants.filter,
            max_bytes: wants.max_bytes,
            reader: wants.schema,
            typed: wants.typed,
            domain_tag,
            counters,
        }
    }

    /// Sets where the subscription should be connected and which
    /// publishers it follows: whether that changed (then [`apply`] must
    /// run).
    ///
    /// [`apply`]: Subscription::apply
    pub(crate) fn set_target(&self, routes: Routes) -> bool {
        let mut t = lock(&self.target);
        if t.routes == routes {
            return false;
        }
        t.routes = routes;
        t.generation += 1;
        true
    }

    /// The data endpoints the routes ask for (liveliness ones aside).
    pub(crate) fn target_data_endpoints(&self) -> usize {
        let t = lock(&self.target);
        t.routes.endpoints.len() - t.routes.liveliness.len()
    }

    pub(crate) fn apply<L: Link>(&self, io: &mut SubState<L>) {
        let t = lock(&self.target);
        if t.generation == io.applied {
            return;
        }
        io.applied = t.generation;
        let r = &t.routes;
        // Publishers that no longer offer a matching key depart: they are
        // reported a moment later (a closing node says goodbye before its
        // announcement goes, but discovery may be quicker than the
        // goodbye), and their liveliness connection is kept until then.
        let now = io.link.now();
        let mut departs = false;
        let mut back = Vec::new();
        for (id, p) in io.publishers.iter_mut() {
            if r.publishers.contains_key(id) {
                p.departing = None;
                if std::mem::take(&mut p.undeclared) && std::mem::take(&mut p.sampled) {
                    back.push(*id);
                }
            } else if p.departing.is_none() && !p.undeclared {
                p.departing = Some(now);
                departs = true;
            }
        }
        // Undeclared nodes that left the domain are forgotten.
        io.publishers
            .retain(|id, p| !p.undeclared || r.live.contains(id));
        for id in back {
            // Declared again, and its samples already came: alive again.
            self.note_alive(io, id, None);
        }
        if departs {
            io.arm(now + DEPARTURE_GRACE);
        }
        let mut liveliness = r.liveliness.clone();
        for (ep, id) in &io.liveliness {
            if io.publishers.get(id).is_some_and(|p| p.departing.is_some()) {
                liveliness.insert(ep.clone(), *id);
            }
        }
        // A node now reached at another liveliness endpoint (it moved to
        // another broker) is not disconnected by the close of the old one.
        let reached: std::collections::HashSet<NodeId> = liveliness.values().copied().collect();
        for (ep, id) in &io.liveliness {
            let moved = !liveliness.contains_key(ep) && reached.contains(id);
            if moved {
                if let Some(p) = io.publishers.get_mut(id) {
                    p.disconnected_at = None;
                }
            }
        }
        io.liveliness = liveliness;
        for (id, k) in &r.node_keys {
            if io.node_keys.get(id).is_none_or(|old| **old != **k) {
                io.node_keys.insert(*id, k.as_str().into());
            }
        }
        if io.node_keys.len() > MAX_NODE_KEYS {
            // Those of nodes long gone go; a lingering connection's stays.
            let (live, gone, data) = (&r.live, &io.recently_gone, &io.data_nodes);
            io.node_keys.retain(|id, _| {
                live.contains(id) || gone.contains(id) || data.values().any(|n| n == id)
            });
        }
        for ((node, _), p) in &r.publications {
            io.data_nodes.insert(p.endpoint.clone(), *node);
        }
        let gone: Vec<String> = io
            .connected
            .iter()
            .filter(|ep| {
                // A live node's data endpoint that it still announces
                // stays (it may publish a matching key again).
                let kept = io.data_nodes.get(*ep).is_some_and(|n| r.live.contains(n))
                    && r.announced.contains(*ep);
                !(r.endpoints.contains(*ep) || io.liveliness.contains_key(*ep) || kept)
            })
            .cloned()
            .collect();
        // A data endpoint wanted again stops lingering.
        io.lingering.retain(|ep, _| gone.contains(ep));
        // Data endpoints waiting out a back-off (not connected) whose node
        // left: forgotten now, or they would stay for ever.
        let stale: Vec<String> = io
            .data_nodes
            .keys()
            .filter(|ep| !io.connected.contains(*ep) && !r.endpoints.contains(*ep))
            .cloned()
            .collect();
        for ep in stale {
            if let Some(node) = io.data_nodes.remove(&ep) {
                io.backoff.remove(&ep);
                self.settle_goodbye(io, node);
            }
        }
        for ep in gone {
            // A live node's endpoint that it no longer announces moved (a
            // node on several networks, now known at another address):
            // closed at once, or each sample would arrive on both
            // connections. What was in flight on it is a gap of the new
            // one: reported lost, or repaired.
            let moved = io.data_nodes.get(&ep).is_some_and(|n| r.live.contains(n));
            if !moved && io.data_nodes.contains_key(&ep) {
                // Its node left discovery (it closed, died, or is out of
                // sight): the connection stays until it closes by itself
                // (read_closed_connections) or the lease passes.
                let until = now + self.lease;
                if let std::collections::hash_map::Entry::Vacant(e) = io.lingering.entry(ep) {
                    e.insert(until);
                    io.arm(until);
                }
                continue;
            }
            self.drop_connection(io, &ep);
        }
        let mut fresh = Vec::new();
        // Forget back-offs long settled (bounded by the endpoints seen).
        io.backoff.retain(|ep, b| {
            r.endpoints.contains(ep) && now.duration_since(b.last_close) < BACKOFF_RESET
        });
        for ep in r.endpoints.difference(&io.connected.clone()) {
            if let Some(b) = io.backoff.get(ep).filter(|b| b.next > now) {
                let at = b.next;
                io.arm(at);
                continue;
            }
            // Data connections send PINGs, liveliness ones do not.
            match io.link.connect(ep, !r.liveliness.contains_key(ep)) {
                Ok(()) => {
                    if io.backoff.contains_key(ep) {
                        stats::inc(&self.counters.reconnects);
                    }
                    io.connected.insert(ep.clone());
                    fresh.push(ep.clone());
                    tracing::debug!(expr = %self.expr, endpoint = %ep, "connected");
                }
                Err(err) => {
                    limited!(warn, expr = %self.expr, endpoint = %ep, %err, "cannot connect")
                }
            }
        }
        self.check_qos(io, r);
        for id in io.live.difference(&r.live) {
            for (k, _) in of_node(&io.matched, *id) {
                if self.repairable(&io.matched, *id, k) {
                    io.gone_repairable.insert((*id, k.clone()));
                }
            }
        }
        if self.deadline.is_some() {
            Self::retire_deadlines(io, r, now);
        }
        io.matched = r.publications.clone();
        // What was learned and asked of nodes gone from the domain goes
        // too (a restarted publisher is a new node): the caches hold the
        // living.
        io.schemas.retain(|(n, _), _| r.live.contains(n));
        io.schemas_asked.retain(|(n, _), _| r.live.contains(n));
        // Ask the publishers just connected for what they keep: the last
        // samples for a late joiner, what came after the last one held for
        // a subscriber that comes back.
        let initial = !io.routed;
        io.routed = true;
        let mut asked = BTreeSet::new();
        if self.last > 0 || self.reliable {
            // A publisher that appears after the subscription began (a
            // restarted one, say) put nothing this subscription has seen:
            // a reliable subscription asks for all it kept.
            let last = if self.reliable && !initial {
                u64::MAX
            } else {
                self.last as u64
            };
            // A node shown again whose samples came while it was out of
            // view, revealing a gap: asked on its connections kept too.
            let waiting: BTreeSet<NodeId> = io
                .joins
                .iter()
                .filter(|(_, j)| j.out_of_view.is_some())
                .map(|(id, _)| *id)
                .collect();
            for ((node, _), p) in &r.publications {
                let now_or_back = fresh.contains(&p.endpoint) || waiting.contains(node);
                if p.history > 0 && now_or_back && asked.insert(p.endpoint.clone()) {
                    let q = Query {
                        node: node.to_hex(),
                        socket: p.socket.clone(),
                        token: self.token.clone(),
                        expr: self.expr.as_str().to_owned(),
                        last,
                        since: self.held(io, *node),
                        id: None,
                        schemas: self.unknown_schemas(io, r, *node, &p.socket),
                        dictionaries: Vec::new(),
                    };
                    self.ask(io, *node, q, initial, true);
                }
            }
        }
        // Schemas of matching publications not learned yet, asked of each
        // data socket that no history query just asked: its samples wait
        // for the answer.
        for ((node, key), p) in &r.publications {
            if p.schema.is_some() && asked.insert(p.endpoint.clone()) {
                let ids = self.unknown_schemas(io, r, *node, &p.socket);
                if !ids.is_empty() {
                    self.ask_schemas(io, *node, &p.socket, key, ids, Vec::new());
                }
            }
        }
        if let Some((f, _)) = &self.filter {
            let mut declared = BTreeSet::new();
            for ((node, _), p) in &r.publications {
                if fresh.contains(&p.endpoint) && declared.insert(&p.endpoint) {
                    let d = milonga_wire::filter::Declaration {
                        node: node.to_hex(),
                        socket: p.socket.clone(),
                        keys: self.expr.as_str().to_owned(),
                        filter: f.clone(),
                    };
                    if let Err(err) = io.link.send(d.encode()) {
                        tracing::warn!(publisher = %node, %err, "cannot declare a filter");
                    }
                }
            }
        }
        if initial && io.initial_joins == 0 && !io.live_sent {
            io.live_sent = true;
            io.pending.push_back(Event::SubscriptionLive);
        }
        for (id, name) in &r.publishers {
            let p = io.publishers.entry(*id).or_insert_with(|| PubState {
                name: String::new(),
                alive: false,
                last_heard: now,
                departing: None,
                closed: false,
                disconnected_at: None,
                undeclared: false,
                sampled: false,
            });
            p.name.clone_from(name);
        }
        if let Some(d) = self.deadline {
            for k in &r.keys {
                if io.deadlines.len() >= MAX_DEADLINE_KEYS {
                    break;
                }
                if !io.deadlines.contains_key(k) {
                    io.deadlines.insert(
                        k.clone(),
                        KeyDeadline {
                            last: now,
                            due: now + d,
                        },
                    );
                    io.arm(now + d);
                }
            }
        }
        self.note_absences(io, r);
        io.live.clone_from(&r.live);
    }

    /// Keeps the sequence state of publisher nodes that left discovery, so
    /// that one coming back with the same id (after a partition or a freeze
    /// longer than the lease) is checked against what was received before:
    /// every sample delivered once or reported lost. At most
    /// [`MAX_ABSENT_PUBLISHERS`] absent nodes are remembered; the one absent
    /// longest is forgotten beyond, and reported so.
    fn note_absences<L: Link>(&self, io: &mut SubState<L>, r: &Routes) {
        // A node that left: its next sample takes the slow path.
        io.seqs.park_if(|n| !r.live.contains(&n));
        // Nodes that just left: their last samples may still be read.
        let left: Vec<NodeId> = io.live.difference(&r.live).copied().collect();
        for id in left {
            if !io.recently_gone.contains(&id) {
                io.recently_gone.push_back(id);
            }
        }
        io.recently_gone.retain(|id| !r.live.contains(id));
        while io.recently_gone.len() > MAX_RECENTLY_GONE {
            io.recently_gone.pop_front();
        }
        let gone = &io.recently_gone;
        io.gone_repairable.retain(|(id, _)| gone.contains(id));
        io.absent
            .retain(|id| !r.live.contains(id) && io.seqs.knows(*id));
        let mut newly: Vec<NodeId> = io
            .seqs
            .nodes()
            .filter(|id| !r.live.contains(id) && !io.absent.contains(id))
            .collect();
        newly.sort();
        io.absent.extend(newly);
        let mut keys: usize = io.absent.iter().map(|id| io.seqs.keys_of(*id)).sum();
        while io.absent.len() > MAX_ABSENT_PUBLISHERS || keys > MAX_ABSENT_KEYS {
            let Some(id) = io.absent.pop_front() else {
                break;
            };
            let gone = io.seqs.forget(id);
            keys -= gone;
            lock(&self.lost_by_publisher).remove(&id);
            let c = &self.counters;
            let n = c.publisher_states_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(
                n,
                "the sequence state of a publisher absent from discovery",
                &format_args!(
                    "{id} ({gone} keys): more than {MAX_ABSENT_PUBLISHERS} absent publishers or {MAX_ABSENT_KEYS} of their keys; if it comes back, what it sent meanwhile cannot be accounted for"
                ),
            );
            io.pending.push_back(Event::PublisherLost(PublisherLost {
                publisher: id,
                name: String::new(),
                reason: LostReason::Forgotten,
            }));
        }
    }

    /// Disconnects `ep` now and forgets it.
    fn drop_connection<L: Link>(&self, io: &mut SubState<L>, ep: &str) {
        io.link.disconnect(ep);
        io.connected.remove(ep);
        io.refused.remove(ep);
        io.lingering.remove(ep);
        let node = io.data_nodes.remove(ep);
        tracing::debug!(expr = %self.expr, endpoint = %ep, "disconnected");
        if let Some(node) = node {
            self.settle_goodbye(io, node);
        }
    }

    /// Once no data connection of `node` remains, reports lost what it said
    /// goodbye with and this subscription did not receive: the trailing
    /// losses that no later sample can reveal.
    fn settle_goodbye<L: Link>(&self, io: &mut SubState<L>, node: NodeId) {
        // A history query in flight holds samples of the node: they count
        // first (`finish_join` settles again).
        if !io.goodbyes.contains_key(&node)
            || io.data_nodes.values().any(|n| *n == node)
            || io.joins.contains_key(&node)
        {
            return;
        }
        let last = io.goodbyes.remove(&node).unwrap_or_default();
        let c = &self.counters;
        for (key, last) in last {
            let Some(held) = io.seqs.held_at(node, &key) else {
                continue;
            };
            if last - held.min(last) > MAX_SEQ_JUMP {
                let n = c.sequence_jumps.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a goodbye's last sequence number",
                    &format_args!(
                        "{key}: {last}, while {held} was received: corrupt or forged, not a loss"
                    ),
                );
                continue;
            }
            if last > held {
                let count = last - held;
                self.count_lost(c, node, count);
                io.pending.push_back(Event::Lost(LostSamples {
                    publisher: node,
                    key: key.clone(),
                    count,
                    first_seq: held + 1,
                }));
                io.seqs.set(node, key, last);
            }
        }
        // It closed and its connections are gone: it never comes back (a
        // node id is not reused), so what is known of it goes, rather than
        // take a place among the absent ones.
        io.seqs.forget(node);
        io.absent.retain(|id| *id != node);
        lock(&self.lost_by_publisher).remove(&node);
    }

    /// Reports the matching publications that offer less than asked, once
    /// each.
    fn check_qos<L: Link>(&self, io: &mut SubState<L>, r: &Routes) {
        for ((node, key), p) in &r.publications {
            if io.matched.contains_key(&(*node, key.clone())) {
                continue;
            }
            let mut report = |policy, detail: String| {
                io.pending
                    .push_back(Event::IncompatibleQos(IncompatibleQos {
                        publisher: *node,
                        key: key.clone(),
                        policy,
                        detail,
                    }));
            };
            if self.reliable && p.reliability == Reliability::BestEffort {
                report(
                    QosPolicy::Reliability,
                    "reliable asked, the publisher is best effort".into(),
                );
            }
            if self.last > p.history {
                report(
                    QosPolicy::History,
                    format!(
                        "last {} asked, the publisher keeps {}",
                        self.last, p.history
                    ),
                );
            }
        }
    }

    /// The last sequence number held of each key of `node`.
    fn held<L: Link>(&self, io: &SubState<L>, node: NodeId) -> Vec<(String, u64)> {
        let mut v = io.seqs.held(node);
        // A query must fit a data socket's message limit
        // (`MAX_QUERY_BYTES`): keys beyond are not repaired.
        let mut bytes = 0;
        v.retain(|(k, _)| {
            bytes += k.len() + 16;
            bytes < crate::engine::history::MAX_QUERY_BYTES / 2
        });
        v
    }

    /// Sends a history query to `endpoint` of `node` and holds that node's
    /// samples until it is answered.
    /// `again`: sent again while unanswered ([`RESEND_AFTER`]).
    fn ask<L: Link>(
        &self,
        io: &mut SubState<L>,
        node: NodeId,
        mut q: Query,
        initial: bool,
        again: bool,
    ) -> bool {
        io.query_id += 1;
        q.id = Some(io.query_id);
        let msg = q.encode();
        if let Err(err) = io.link.send(msg.clone()) {
            tracing::warn!(publisher = %node, %err, "cannot send a history query");
            return false;
        }
        let now = io.link.now();
        let j = io
            .joins
            .entry(node)
            .or_insert_with(|| Join::new(now, initial, None));
        if j.out_of_view.take().is_some() {
            j.started = now;
        }
        if j.pending.insert(q.socket.clone()) && initial && j.pending.len() == 1 {
            io.initial_joins += 1;
        }
        j.ids.entry(q.socket.clone()).or_default().push(io.query_id);
        j.heard.remove(&q.socket);
        if again {
            j.again.push(Resend {
                id: io.query_id,
                socket: q.socket,
                msg,
                at: now,
                copies: 0,
            });
            io.arm(now + RESEND_AFTER[0].min(JOIN_TIMEOUT));
        } else {
            io.arm(now + JOIN_TIMEOUT);
        }
        true
    }

    /// The schema ids `node` announces on data socket `socket` for
    /// matching publications that this subscription neither knows nor
    /// asked for lately; noted as asked.
    fn unknown_schemas<L: Link>(
        &self,
        io: &mut SubState<L>,
        r: &Routes,
        node: NodeId,
        socket: &str,
    ) -> Vec<u32> {
        let now = io.link.now();
        let mut ids: Vec<u32> = of_node(&r.publications, node)
            .filter(|(_, p)| p.socket == socket)
            .filter_map(|(_, p)| p.schema)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        // At most a query's worth, each noted as asked only if it goes
        // (the rest are asked by a later query).
        let mut asked = Vec::new();
        for id in ids {
            if asked.len() == milonga_wire::history::MAX_SCHEMAS_ASKED {
                break;
            }
            if io.may_ask_schema(node, id, now) {
                asked.push(id);
            }
        }
        asked
    }

    /// Asks `node`'s data socket `socket` for schemas `ids` (a query for
    /// `key` with nothing else asked); the node's samples wait for the
    /// answer, as for a history join.
    fn ask_schemas<L: Link>(
        &self,
        io: &mut SubState<L>,
        node: NodeId,
        socket: &str,
        key: &str,
        ids: Vec<u32>,
        dictionaries: Vec<u32>,
    ) {
        let q = Query {
            node: node.to_hex(),
            socket: socket.to_owned(),
            token: self.token.clone(),
            expr: key.to_owned(),
            last: 0,
            since: Vec::new(),
            id: None,
            schemas: ids,
            dictionaries,
        };
        self.ask(io, node, q, false, true);
    }

    /// A schema `node` sent: how this subscription reads its samples
    /// (the reader's schema resolved against it, or the writer's own
    /// fields), or why it cannot, reported once per matching key as
    /// `IncompatibleQos`. A schema that does not parse, or whose id is
    /// not its content's, is counted in `schemas_malformed`.
    fn learn_schema<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        id: u32,
        bytes: &[u8],
    ) {
        if io.schemas.contains_key(&(node, id)) {
            return;
        }
        let writer = match Schema::decode(bytes) {
            Ok(w) if Schema::id_of(bytes) == id => w,
            Ok(_) => {
                let n = c.schemas_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a schema",
                    &format_args!("id {id:#010x} is not its content's"),
                );
                return;
            }
            Err(err) => {
                let n = c.schemas_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(n, "a schema", &err);
                return;
            }
        };
        let plan = match &self.reader {
            Some(reader) => Plan::resolve(reader, &writer),
            None => Ok(Plan::identity(&writer)),
        };
        if let Err(why) = &plan {
            let keys: Vec<String> = io
                .matched
                .iter()
                .filter(|((n, _), p)| *n == node && p.schema == Some(id))
                .map(|((_, k), _)| k.clone())
                .collect();
            for key in keys {
                io.pending
                    .push_back(Event::IncompatibleQos(IncompatibleQos {
                        publisher: node,
                        key,
                        policy: QosPolicy::Schema,
                        detail: format!("schema {:?}: {why}", writer.name),
                    }));
            }
            tracing::warn!(expr = %self.expr, publisher = %node, %why, "a publisher's schema does not agree with the subscription's; its samples are refused");
        }
        if io.schemas.len() >= MAX_SCHEMAS {
            // One of this node's makes room (another's only if it has
            // none; asked again if a sample needs it).
            let k = io
                .schemas
                .keys()
                .find(|(n, _)| *n == node)
                .or_else(|| io.schemas.keys().next())
                .copied();
            if let Some(k) = k {
                io.schemas.remove(&k);
            }
        }
        stats::inc(&c.schemas_learned);
        io.schemas_asked.remove(&(node, id));
        io.schemas.insert((node, id), plan.map(Arc::new));
    }

    /// Reads a compact sample's value into the shape the subscription
    /// reads (a `typed` subscription keeps the payload and attaches the
    /// plan that `Sample::deserialize` reads it with); `false` (counted,
    /// logged) when its schema is unknown, does not agree with the
    /// reader's, or the payload does not fit it.
    fn read_compact<L: Link>(&self, io: &SubState<L>, c: &Counters, s: &mut Sample) -> bool {
        match io.schemas.get(&(s.publisher, s.schema_id)) {
            Some(Ok(plan)) => {
                if self.typed {
                    s.compact = Some(crate::model::sample::CompactReader(plan.clone()));
                    return true;
                }
                // `payload_value` kept the bytes; nothing else makes a
                // compact sample.
                let read = match &s.value {
                    Value::Bytes(payload) => plan.read(payload),
                    _ => Err(milonga_wire::schema::SchemaError::Invalid(
                        "not a payload".into(),
                    )),
                };
                match read {
                    Ok(v) => {
                        s.value = v;
                        true
                    }
                    Err(err) => {
                        let n = c.payloads_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        log_drop(n, "a compact sample that does not fit its schema", &err);
                        false
                    }
                }
            }
            Some(Err(_)) => {
                // Reported once when the schema came.
                stats::inc(&c.samples_schema_refused);
                false
            }
            None => {
                let n = c.samples_unknown_schema.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a compact sample",
                    &format_args!(
                        "schema {:#010x} of publisher {} is not known (asked, not answered)",
                        s.schema_id, s.publisher
                    ),
                );
                false
            }
        }
    }

    /// A compact sample arrived whose schema this subscription has not
    /// learned: unless it was asked for lately, the data socket of its
    /// publication (or, before discovery shows that one, of another of its
    /// node's) is asked for it; the node's samples wait for the answer.
    fn want_schema<L: Link>(&self, io: &mut SubState<L>, node: NodeId, key: &str, id: u32) {
        if io.schemas.contains_key(&(node, id)) {
            return;
        }
        if io.joins.contains_key(&node) {
            // One query at a time per node: this one goes when the
            // query in flight ends (its samples wait meanwhile).
            let w = io.schemas_wanted.entry(node).or_default();
            if w.len() < milonga_wire::history::MAX_SCHEMAS_ASKED {
                w.entry(id).or_insert_with(|| key.to_owned());
            }
            return;
        }
        self.ask_wanted(io, node, key, vec![id], Vec::new());
    }

    /// A data message of `node` (for `key`) compressed with dictionary
    /// `id`, which this subscription does not know (or, `None`, one that
    /// comes after such a message): it waits in the
    /// node's join (started for it if none is in flight, the dictionary
    /// asked of the key's data socket) with every later message of the
    /// node, and goes through [`Subscription::handle`] again when the
    /// join ends. Dropped and counted (`frames_unknown_dictionary`) when
    /// the join holds too much, or the dictionary was asked lately and
    /// did not come: the samples it held are then reported lost by the
    /// next that shows the gap.
    #[allow(clippy::too_many_arguments)]
    fn wait_for_dictionary<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        key: &str,
        id: Option<u32>,
        frame: Bytes,
        second: Option<Bytes>,
    ) {
        if let Some(id) = id.filter(|id| !io.dictionaries.contains_key(&(node, *id))) {
            if !io.joins.contains_key(&node) {
                self.ask_wanted(io, node, key, Vec::new(), vec![id]);
            } else if !io.dictionaries_asked.contains_key(&(node, id)) {
                // Asked when the query in flight ends.
                let w = io.dictionaries_wanted.entry(node).or_default();
                if w.len() < milonga_wire::history::MAX_DICTIONARIES_ASKED {
                    w.entry(id).or_insert_with(|| key.to_owned());
                }
            }
        }
        let size = frame.len() + second.as_ref().map_or(0, Bytes::len);
        match io.joins.get_mut(&node) {
            Some(j) if j.held.len() < MAX_HELD_FRAMES && j.held_bytes + size <= MAX_HELD_BYTES => {
                j.held.push((frame, second));
                j.held_bytes += size;
            }
            _ => {
                let n = c.frames_unknown_dictionary.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a compressed frame",
                    &format_args!(
                        "a dictionary of publisher {node} is not known (asked, not answered), or too much waits for it ({id:?})"
                    ),
                );
            }
        }
    }

    /// A dictionary `node` sent, if this subscription asked for it and its
    /// id is its content's; else counted (`frames_malformed`) and logged.
    fn learn_dictionary<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        id: u32,
        bytes: &[u8],
    ) {
        if io.dictionaries.contains_key(&(node, id)) {
            return;
        }
        let learned = match Learned::new(bytes) {
            Some(l) if milonga_wire::content_id(bytes) == id => l,
            _ => {
                let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a compression dictionary",
                    &format_args!(
                        "id {id:#010x}: not its content's, empty, too large or not loadable"
                    ),
                );
                return;
            }
        };
        if io.dictionaries.len() >= MAX_DICTIONARIES {
            let oldest = |same: bool| {
                io.dictionaries
                    .iter()
                    .filter(|((n, _), _)| !same || *n == node)
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| *k)
            };
            if let Some(k) = oldest(true).or_else(|| oldest(false)) {
                io.dictionaries.remove(&k);
            }
        }
        let now = io.link.now();
        io.dictionaries.insert((node, id), (Arc::new(learned), now));
        // Learned: a frame that needs it again once it is forgotten asks
        // at once.
        io.dictionaries_asked.remove(&(node, id));
        stats::inc(&c.dictionaries_learned);
    }

    /// Asks `node` for schemas `ids` that may be asked now, on the data
    /// socket of the publication announcing one of them, else of `key`'s,
    /// else of another of the node's publications.
    fn ask_wanted<L: Link>(
        &self,
        io: &mut SubState<L>,
        node: NodeId,
        key: &str,
        ids: Vec<u32>,
        dictionaries: Vec<u32>,
    ) {
        let pubs: Vec<(String, MatchedPublication)> = of_node(&io.matched, node)
            .map(|(k, p)| (k.clone(), p.clone()))
            .collect();
        // A dictionary is its key's publisher's: asked of that socket.
        let by_key = || pubs.iter().find(|(k, _)| k == key);
        let by_schema = || {
            pubs.iter()
                .find(|(_, p)| p.schema.is_some_and(|s| ids.contains(&s)))
        };
        let found = if dictionaries.is_empty() {
            by_schema().or_else(by_key)
        } else {
            by_key().or_else(by_schema)
        };
        let Some((key, p)) = found.or_else(|| pubs.first()).cloned() else {
            return;
        };
        let now = io.link.now();
        let ids: Vec<u32> = ids
            .into_iter()
            .filter(|id| io.may_ask_schema(node, *id, now))
            .collect();
        let dictionaries: Vec<u32> = dictionaries
            .into_iter()
            .filter(|id| io.may_ask_dictionary(node, *id, now))
            .collect();
        if !ids.is_empty() || !dictionaries.is_empty() {
            self.ask_schemas(io, node, &p.socket, &key, ids, dictionaries);
        }
    }

    /// A history frame: kept samples for this subscription.
    fn on_history<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        key: &str,
        body: &[u8],
    ) {
        if key.strip_prefix(REPLY_KEY_PREFIX) != Some(self.token.as_str()) {
            stats::inc(&c.frames_filtered);
            return;
        }
        let reply = match Reply::decode(&Bytes::copy_from_slice(body)) {
            Ok(r) => r,
            Err(err) => {
                let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(n, "a history frame", &err);
                return;
            }
        };
        // Only schemas asked for are learned (a reply cannot fill the
        // cache with others); one that comes late is still right.
        for (id, bytes) in reply
            .schemas
            .iter()
            .take(milonga_wire::history::MAX_SCHEMAS_ASKED)
        {
            if io.schemas_asked.contains_key(&(node, *id)) {
                self.learn_schema(io, c, node, *id, bytes);
            }
        }
        for (id, bytes) in reply
            .dictionaries
            .iter()
            .take(milonga_wire::history::MAX_DICTIONARIES_ASKED)
        {
            if io.dictionaries_asked.contains_key(&(node, *id)) {
                self.learn_dictionary(io, c, node, *id, bytes);
            }
        }
        let Some(j) = io.joins.get_mut(&node) else {
            return; // late: the query timed out
        };
        if !j.pending.contains(&reply.socket) {
            return;
        }
        // The answer to an earlier query's copy (an older subscriber's
        // publisher names none).
        if reply.id.is_some_and(|id| {
            j.ids
                .get(&reply.socket)
                .is_some_and(|want| !want.contains(&id))
        }) {
            return;
        }
        j.heard.insert(reply.socket.clone());
        // Only keys this subscription matches, valid as keys: a reply is
        // the publisher's word, and it may be hostile.
        let expr = &self.expr;
        let (kept, refused): (Vec<KeyHistory>, Vec<KeyHistory>) = reply
            .keys
            .into_iter()
            .partition(|k| milonga_wire::Key::new(k.key.as_str()).is_ok() && expr.matches(&k.key));
        if !refused.is_empty() {
            let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(
                n,
                "a history reply's keys",
                &format_args!(
                    "{} keys that are not keys or that {} does not match (first {:?})",
                    refused.len(),
                    self.expr,
                    refused[0].key
                ),
            );
        }
        j.replies.extend(kept);
        if reply.done {
            // A socket asked twice (a schema query after a join query) is
            // done when both are answered; a reply naming no query (an
            // older publisher) answers them all.
            if let Some(id) = reply.id {
                j.again.retain(|r| r.id != id);
            }
            let all = match (reply.id, j.ids.get_mut(&reply.socket)) {
                (Some(id), Some(ids)) => {
                    ids.retain(|x| *x != id);
                    ids.is_empty()
                }
                _ => true,
            };
            if all {
                j.pending.remove(&reply.socket);
                if j.pending.is_empty() {
                    self.finish_join(io, c, node, true);
                }
            }
        }
    }

    /// Delivers what a node's history query brought, then the samples of
    /// that node that waited for it.
    fn finish_join<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        answered: bool,
    ) {
        let Some(j) = io.joins.remove(&node) else {
            return;
        };
        // Schemas compact samples needed meanwhile are asked now: what
        // this join held then waits for that answer (in the new join's
        // buffer, in order), instead of being dropped as unknown. Not
        // from a join that is itself such a follow-up, nor from one that
        // gives up with a full buffer: at most one join follows another.
        let wanted = io.schemas_wanted.remove(&node).unwrap_or_default();
        let wanted_dicts = io.dictionaries_wanted.remove(&node).unwrap_or_default();
        let mut carried = false;
        if !j.chained && j.buffer.len() < MAX_JOIN_BUFFER {
            let mut ids = Vec::new();
            let mut dicts = Vec::new();
            let mut key = String::new();
            for (id, k) in wanted_dicts {
                if !io.dictionaries.contains_key(&(node, id)) {
                    dicts.push((id, k));
                }
            }
            for (id, k) in wanted {
                if !io.schemas.contains_key(&(node, id)) {
                    if ids.is_empty() {
                        key = k;
                    }
                    ids.push(id);
                }
            }
            if !ids.is_empty() || !dicts.is_empty() {
                // Schemas of the socket announcing them, each dictionary
                // of its own key's socket (one join takes several).
                if !ids.is_empty() {
                    self.ask_wanted(io, node, &key, ids, Vec::new());
                }
                for (id, k) in &dicts {
                    self.ask_wanted(io, node, k, Vec::new(), vec![*id]);
                }
                if let Some(next) = io.joins.get_mut(&node) {
                    next.chained = true;
                    // `SubscriptionLive` waits for the samples it holds.
                    next.initial |= j.initial;
                    carried = j.initial;
                }
            }
        }
        if j.out_of_view.is_some() {
            tracing::info!(expr = %self.expr, publisher = %node, "a publisher whose samples came while out of view was not shown again in time: its gap is reported");
        } else if !answered {
            stats::inc(&c.history_queries_unanswered);
            tracing::warn!(expr = %self.expr, publisher = %node, "a history query got no answer in time; going on live");
        }
        for kh in j.replies {
            for e in kh.entries {
                match payload_value(e.encoding, e.payload, None) {
                    Ok(value) => {
                        let s = Sample {
                            key: kh.key.clone(),
                            value,
                            publisher: node,
                            seq: e.seq,
                            timestamp_ns: e.timestamp_ns,
                            encoding: e.encoding,
                            schema_id: e.schema_id,
                            replayed: kh.replayed,
                            compact: None,
                        };
                        if io.seqs.is_new(node, &s.key, s.seq) {
                            stats::inc(&c.samples_replayed);
                            self.deliver(io, c, s, false);
                        }
                    }
                    Err(err) => {
                        let n = c.payloads_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        log_drop(n, "a kept sample whose payload does not decode", &err);
                    }
                }
            }
        }
        for s in j.buffer {
            // Live samples the reply already held are no duplicates.
            if !io.seqs.is_new(node, &s.key, s.seq) {
                continue;
            }
            // No new repair from these: a gap the reply could not fill
            // is gone, and asking again would loop.
            self.deliver(io, c, s, false);
        }
        // Then the messages that waited for a dictionary, in order: read
        // now if it came (or held again, by a follow-up join asking for
        // it), else counted.
        for (frame, second) in j.held {
            self.take(io, frame, second, None);
        }
        if j.initial && !carried {
            io.initial_joins = io.initial_joins.saturating_sub(1);
            if io.initial_joins == 0 && !io.live_sent {
                io.live_sent = true;
                io.pending.push_back(Event::SubscriptionLive);
            }
        }
        self.settle_goodbye(io, node);
    }

    /// A sample of `node`, whose join queries went unanswered past their
    /// first copy, came (it was just buffered): the node's connection is
    /// there now (a publisher that moved to this subscription's broker
    /// after it, or whose connection was made late), so the queries go
    /// again at once, and the join's time starts again from here (else it
    /// would give up, and report as lost what the publisher's history
    /// holds, if the publisher came after the last copy). Once a join.
    fn wake_join<L: Link>(&self, io: &mut SubState<L>, c: &Counters, node: NodeId) {
        let now = io.link.now();
        let Some(j) = io.joins.get_mut(&node).filter(|j| !j.woken) else {
            return;
        };
        let (pending, heard) = (&j.pending, &j.heard);
        let again: Vec<Vec<u8>> = j
            .again
            .iter()
            .filter(|r| r.copies >= 1 && pending.contains(&r.socket) && !heard.contains(&r.socket))
            .map(|r| r.msg.clone())
            .collect();
        if again.is_empty() {
            return;
        }
        j.woken = true;
        j.started = now;
        for msg in again {
            if io.link.send(msg).is_ok() {
                stats::inc(&c.history_queries_resent);
            }
        }
        io.arm(now + JOIN_TIMEOUT);
    }

    /// Passes a decoded sample through the sequence check and queues it;
    /// holds it if its node has a history query in flight, or asks for a
    /// repair if it reveals a gap history can fill (`repair`).
    fn deliver<L: Link>(&self, io: &mut SubState<L>, c: &Counters, mut s: Sample, repair: bool) {
        if repair && self.waits_for_view(io, &s) {
            let now = io.link.now();
            let until = now + self.lease.max(JOIN_TIMEOUT);
            tracing::debug!(expr = %self.expr, publisher = %s.publisher, key = %s.key, seq = s.seq,
                "a gap in the samples of a publisher out of view: they wait for it to be shown again");
            io.joins
                .insert(s.publisher, Join::new(now, false, Some(until)));
            io.arm(until);
        }
        if let Some(j) = io.joins.get_mut(&s.publisher) {
            if j.buffer.len() < MAX_JOIN_BUFFER {
                let node = s.publisher;
                j.buffer.push(s);
                self.wake_join(io, c, node);
                return;
            }
            let node = s.publisher;
            self.finish_join(io, c, node, false);
            // A follow-up join (schemas) holds what the full one held:
            // this sample goes after them.
            if let Some(j) = io.joins.get_mut(&node) {
                if j.buffer.len() < MAX_JOIN_BUFFER {
                    j.buffer.push(s);
                    return;
                }
            }
        }
        match self.check_seq(io, c, s.publisher, &s.key, s.seq, repair) {
            Verdict::Drop => {}
            Verdict::Deliver => {
                if s.encoding == Encoding::Compact && !self.read_compact(io, c, &mut s) {
                    return;
                }
                stats::inc(&c.samples_received);
                if let Some(d) = self.deadline {
                    Self::note_deadline(io, d, &s.key);
                }
                io.pending.push_back(Event::Sample(s));
            }
            Verdict::Repair(last) => {
                let socket = io
                    .matched
                    .get(&(s.publisher, s.key.clone()))
                    .map(|p| p.socket.clone());
                if let Some(socket) = socket {
                    let key = s.key.clone();
                    let q = Query {
                        node: s.publisher.to_hex(),
                        socket,
                        token: self.token.clone(),
                        expr: key.clone(),
                        last: 0,
                        since: vec![(key, last)],
                        id: None,
                        schemas: Vec::new(),
                        dictionaries: Vec::new(),
                    };
                    self.ask(io, s.publisher, q, false, false);
                }
                // The sample waits for the repair; if the query could not
                // be sent, it goes through and the gap is reported.
                self.deliver(io, c, s, false);
            }
        }
    }

    /// Whether `s`, of a node discovery no longer shows, reveals a gap that
    /// the node's history may fill once it is shown again (see
    /// [`Join::out_of_view`]).
    fn waits_for_view<L: Link>(&self, io: &SubState<L>, s: &Sample) -> bool {
        let node = s.publisher;
        // Not a node that said goodbye (it does not come back), nor a
        // jump no history holds (corrupt or forged: seq.rs says so).
        self.reliable
            && !io.live.contains(&node)
            && !io.joins.contains_key(&node)
            && !io.goodbyes.contains_key(&node)
            && io.gone_repairable.contains(&(node, s.key.clone()))
            && io
                .seqs
                .held_at(node, &s.key)
                .is_some_and(|held| s.seq > held.saturating_add(1) && s.seq - held <= MAX_SEQ_JUMP)
    }

    /// Whether a gap on (`node`, `key`) can be repaired: the subscription
    /// asks for reliability and the publication is reliable and keeps
    /// history.
    fn repairable(
        &self,
        matched: &BTreeMap<(NodeId, String), MatchedPublication>,
        node: NodeId,
        key: &str,
    ) -> bool {
        self.reliable
            && matched
                .get(&(node, key.to_owned()))
                .is_some_and(|p| p.reliability == Reliability::Reliable && p.history > 0)
    }

    /// Reports the publishers `departed` `undeclared` (unless they said
    /// goodbye or their connection closed meanwhile), and disconnects
    /// the liveliness endpoints no longer wanted.
    fn settle_departures<L: Link>(&self, io: &mut SubState<L>, departed: Vec<NodeId>) {
        for id in departed {
            self.mark_lost(io, id, LostReason::Undeclared);
            if io.live.contains(&id) {
                // The node lives on, its data connection with it: if it
                // declares a matching publication again, its samples may
                // come before discovery says so.
                if let Some(p) = io.publishers.get_mut(&id) {
                    p.departing = None;
                    p.undeclared = true;
                    p.sampled = false;
                }
            } else {
                io.publishers.remove(&id);
            }
        }
        let wanted = lock(&self.target).routes.liveliness.clone();
        // (A publisher still departing keeps its connection: its close or
        // goodbye is what reports it.)
        let stale: Vec<String> = io
            .liveliness
            .iter()
            .filter(|(ep, id)| {
                !wanted.contains_key(*ep)
                    && io.publishers.get(id).is_none_or(|p| p.departing.is_none())
            })
            .map(|(ep, _)| ep.clone())
            .collect();
        for ep in stale {
            io.liveliness.remove(&ep);
            if io.connected.remove(&ep) {
                io.link.disconnect(&ep);
            }
        }
    }

    /// Reports publisher `id` lost, if it was alive.
    fn mark_lost<L: Link>(&self, io: &mut SubState<L>, id: NodeId, reason: LostReason) {
        let Some(p) = io.publishers.get_mut(&id) else {
            return;
        };
        p.disconnected_at = None;
        if !p.alive {
            return;
        }
        p.alive = false;
        // Samples still queued from it (read after the close or the
        // goodbye) do not make it alive again; a heartbeat does.
        p.closed = matches!(reason, LostReason::Closed | LostReason::Disconnected);
        tracing::info!(expr = %self.expr, publisher = %id, name = %p.name, %reason, "publisher lost");
        io.pending.push_back(Event::PublisherLost(PublisherLost {
            publisher: id,
            name: p.name.clone(),
            reason,
        }));
        // Its next sample must go through the slow path, which reports it
        // alive again.
        io.seqs.park_node(id);
    }

    /// Reports publisher `id` alive, if it was not; `heard` refreshes its
    /// lease (heartbeats do, samples need not).
    fn note_alive<L: Link>(&self, io: &mut SubState<L>, id: NodeId, heard: Option<Instant>) {
        let Some(p) = io.publishers.get_mut(&id) else {
            return;
        };
        if p.undeclared {
            // Not alive again until discovery shows a publication of it.
            p.sampled |= heard.is_none();
            return;
        }
        if let Some(now) = heard {
            p.last_heard = now;
        }
        if p.alive || (p.closed && heard.is_none()) {
            return;
        }
        p.closed = false;
        p.alive = true;
        let now = heard.unwrap_or_else(|| io.link.now());
        p.last_heard = now;
        let name = p.name.clone();
        io.arm(now + self.lease);
        io.pending.push_back(Event::PublisherAlive(PublisherAlive {
            publisher: id,
            name,
        }));
    }

    /// Reports leases and deadlines that ran out by `now`, and sets when
    /// the next may.
    /// `drained`: nothing is left to read on the socket, so departures can
    /// be settled (the samples a departed publisher sent before its
    /// announcement went have been delivered first).
    pub(crate) fn check_timers<L: Link>(&self, io: &mut SubState<L>, now: Instant, drained: bool) {
        let mut next: Option<Instant> = None;
        let mut earliest = |t: Instant| next = Some(next.map_or(t, |n: Instant| n.min(t)));
        // Publishers: leases, closed connections and departures, each
        // reported once its time is up.
        let (mut expired, mut disconnected, mut departed) = (Vec::new(), Vec::new(), Vec::new());
        for (id, p) in &io.publishers {
            if let Some(t) = p.departing {
                if p.alive && !io.live.contains(id) && now < t + self.lease {
                    // The node left the domain, not just this key (it died,
                    // or it closed and its goodbye is on its way, or it is
                    // out of reach): its goodbye, its closed connection or
                    // its lease says which, not `undeclared`. Looked at
                    // again until one has; one still heard from a lease
                    // later is `undeclared` after all (discovery lost it
                    // while it lives).
                    earliest(now + DEPARTURE_GRACE);
                } else if now >= t + DEPARTURE_GRACE && drained {
                    departed.push(*id);
                } else {
                    earliest((t + DEPARTURE_GRACE).max(now + Duration::from_millis(1)));
                }
            }
            if !p.alive {
                continue;
            }
            if now >= p.last_heard + self.lease {
                expired.push(*id);
            } else {
                earliest(p.last_heard + self.lease);
            }
            if let Some(t) = p.disconnected_at {
                if now >= t + DISCONNECT_GRACE {
                    disconnected.push(*id);
                } else {
                    earliest(t + DISCONNECT_GRACE);
                }
            }
        }
        if let Some(d) = self.deadline {
            // Keys retired a lease ago: no longer watched.
            let lease = self.lease;
            let retired: Vec<String> = io
                .deadline_retiring
                .iter()
                .filter(|(_, (since, _))| now >= *since + lease)
                .map(|(k, _)| k.clone())
                .collect();
            for key in retired {
                io.deadline_retiring.remove(&key);
                io.deadlines.remove(&key);
            }
            for (key, k) in io.deadlines.iter_mut() {
                if now >= k.due {
                    io.pending.push_back(Event::DeadlineMissed(DeadlineMissed {
                        key: key.clone(),
                        silent_for: now - k.last,
                    }));
                    k.due = now + d;
                }
                earliest(k.due);
            }
            for (since, _) in io.deadline_retiring.values() {
                earliest(*since + lease);
            }
        }
        // A back-off ran out: `apply` connects again.
        let mut reconnect = false;
        for (ep, b) in &io.backoff {
            if b.next > now {
                earliest(b.next);
            } else if !io.connected.contains(ep) {
                reconnect = true;
            }
        }
        if reconnect {
            io.applied = io.applied.wrapping_sub(1);
        }
        let mut unlinger = Vec::new();
        for (ep, t) in &io.lingering {
            if now >= *t {
                unlinger.push(ep.clone());
            } else {
                earliest(*t);
            }
        }
        let mut late = Vec::new();
        let mut again = Vec::new();
        for (id, j) in &mut io.joins {
            let due = j.out_of_view.unwrap_or(j.started + JOIN_TIMEOUT);
            if now >= due {
                late.push(*id);
                continue;
            }
            earliest(due);
            let (pending, heard) = (&j.pending, &j.heard);
            for r in j
                .again
                .iter_mut()
                .filter(|r| pending.contains(&r.socket) && !heard.contains(&r.socket))
            {
                if let Some(after) = RESEND_AFTER.get(r.copies) {
                    if now >= r.at + *after {
                        r.copies += 1;
                        again.push(r.msg.clone());
                    }
                }
                if let Some(after) = RESEND_AFTER.get(r.copies) {
                    earliest(r.at + *after);
                }
            }
        }
        for msg in again {
            // A query that cannot go now is not tried again before the
            // join times out (and is reported unanswered).
            if io.link.send(msg).is_ok() {
                stats::inc(&self.counters.history_queries_resent);
            }
        }
        io.next_timer = next;
        for id in disconnected {
            self.mark_lost(io, id, LostReason::Disconnected);
        }
        for id in expired {
            self.mark_lost(io, id, LostReason::LeaseExpired);
        }
        if !departed.is_empty() {
            self.settle_departures(io, departed);
        }
        for id in late {
            self.finish_join(io, &self.counters, id, false);
        }
        for ep in unlinger {
            tracing::debug!(expr = %self.expr, endpoint = %ep, "a departed node's connection stayed open past the lease");
            self.drop_connection(io, &ep);
        }
    }

    /// A heartbeat: the node is alive, or leaving. A goodbye (`leaving`)
    /// may carry the last sequence number of each of its keys (`last`):
    /// what of them has not arrived once its data connections are gone is
    /// reported lost.
    fn on_heartbeat<L: Link>(&self, io: &mut SubState<L>, c: &Counters, node: NodeId, body: &[u8]) {
        use milonga_wire::heartbeat::{Heartbeat, Last};
        let Ok(hb) = Heartbeat::decode(body) else {
            let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(n, "a heartbeat", &"its body is not a CBOR map");
            return;
        };
        if !hb.leaving {
            let now = io.link.now();
            self.note_alive(io, node, Some(now));
            return;
        }
        // Sequence numbers of filtered copies are not the key's.
        let known = io.publishers.contains_key(&node);
        if let Last::NotAMap(v) = &hb.last {
            let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(
                n,
                "a goodbye's last sequence numbers",
                &format_args!("not a map: {v}"),
            );
        }
        if known && self.filter.is_none() {
            let mine = match hb.last {
                Last::Keys(keys) => Some(
                    keys.into_iter()
                        .filter(|(k, _)| self.expr.matches(k))
                        .collect(),
                ),
                Last::BadEntry => {
                    let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    log_drop(
                        n,
                        "a goodbye's last sequence numbers",
                        &"not text -> number",
                    );
                    Some(Vec::new())
                }
                Last::Absent | Last::NotAMap(_) => None,
            };
            if let Some(mine) = mine {
                if io.goodbyes.len() < MAX_GOODBYES {
                    io.goodbyes.insert(node, mine);
                }
            }
        }
        self.mark_lost(io, node, LostReason::Closed);
        self.settle_goodbye(io, node);
    }

    /// Notes each key that every publisher matched so far undeclared
    /// while its node stays in view: its deadline watch ends a lease
    /// later (in `check_timers`), the key retired, not silenced
    /// (reporting it missed each period for ever was noise, and a node
    /// retiring keys for months grew the watched keys). Not at once: a
    /// program that drops its publisher, then closes its node, shows the
    /// first before the second. A key announced again, or whose node
    /// closed or was lost meanwhile, stays watched: that silence is what
    /// a deadline is for.
    fn retire_deadlines<L: Link>(io: &mut SubState<L>, r: &Routes, now: Instant) {
        let mut publishers: HashMap<&str, Vec<NodeId>> = HashMap::new();
        for (node, key) in io.matched.keys() {
            if io.deadlines.contains_key(key) && !r.keys.contains(key) {
                publishers.entry(key.as_str()).or_default().push(*node);
            }
        }
        let retiring: Vec<(String, Vec<NodeId>)> = publishers
            .into_iter()
            .filter(|(_, nodes)| nodes.iter().all(|n| r.live.contains(n)))
            .map(|(k, nodes)| (k.to_owned(), nodes))
            .collect();
        // Announced again, or one of its nodes gone since: watched on.
        io.deadline_retiring.retain(|k, (_, nodes)| {
            !r.keys.contains(k) && nodes.iter().all(|n| r.live.contains(n))
        });
        for (key, nodes) in retiring {
            io.deadline_retiring.entry(key).or_insert((now, nodes));
        }
    }

    /// Notes that `key` spoke, for its deadline.
    fn note_deadline<L: Link>(io: &mut SubState<L>, d: Duration, key: &str) {
        let now = io.link.now();
        let full = io.deadlines.len() >= MAX_DEADLINE_KEYS;
        match io.deadlines.get_mut(key) {
            Some(k) => {
                k.last = now;
                k.due = now + d;
            }
            None if !full => {
                io.deadlines.insert(
                    key.to_owned(),
                    KeyDeadline {
                        last: now,
                        due: now + d,
                    },
                );
            }
            None => {}
        }
        io.arm(now + d);
    }

    /// The node moved to another broker: the nodes whose broker
    /// connection closed are reached through the new one, so none is
    /// reported `disconnected` for it (their leases still run).
    pub(crate) fn broker_changed<L: Link>(&self, io: &mut SubState<L>) {
        for p in io.publishers.values_mut() {
            p.disconnected_at = None;
        }
    }

    /// A closed liveliness connection: its node is reported `disconnected`
    /// after `grace`, unless its goodbye arrives first.
    pub(crate) fn note_liveliness_closed<L: Link>(
        &self,
        io: &mut SubState<L>,
        endpoint: &str,
        now: Instant,
        grace: Duration,
    ) {
        if let Some(id) = io.liveliness.get(endpoint).copied() {
            if let Some(p) = io.publishers.get_mut(&id).filter(|p| p.alive) {
                if p.disconnected_at
                    .is_none_or(|t| t + DISCONNECT_GRACE > now + grace)
                {
                    p.disconnected_at = Some(now + grace - DISCONNECT_GRACE);
                }
                io.arm(now + grace);
            }
        }
    }

    /// Checks one received message and queues the events it yields.
    #[cfg(test)]
    pub(crate) fn handle<L: Link>(
        &self,
        io: &mut SubState<L>,
        frame: Bytes,
        second: Option<Bytes>,
    ) {
        self.handle_from(io, frame, second, None);
    }

    /// [`Subscription::handle`] for a message that came on a connection
    /// to the holder of key `sender` (Z85; `None`: no handshake, security
    /// off or the node's own process): taken only if the node its header
    /// names announced that key (docs/security.md, "Authentic headers").
    pub(crate) fn handle_from<L: Link>(
        &self,
        io: &mut SubState<L>,
        frame: Bytes,
        second: Option<Bytes>,
        sender: Option<&str>,
    ) {
        stats::add(
            &self.counters.bytes_received,
            (frame.len() + second.as_ref().map_or(0, |m| m.len())) as u64,
        );
        self.take(io, frame, second, sender);
    }

    /// [`Subscription::handle_from`] past counting the bytes: also what a
    /// message that waited for a dictionary goes through again.
    fn take<L: Link>(
        &self,
        io: &mut SubState<L>,
        frame: Bytes,
        second: Option<Bytes>,
        sender: Option<&str>,
    ) {
        let c = &self.counters;
        let view = match frame::decode(&frame) {
            Ok(v) => v,
            Err(err) => {
                let counter = match err {
                    FrameError::UnsupportedVersion(_) => &c.frames_bad_version,
                    FrameError::UnknownKind(_) | FrameError::UnknownEncoding(_) => {
                        &c.frames_unknown_kind
                    }
                    _ => &c.frames_malformed,
                };
                let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(n, "a data frame", &err);
                return;
            }
        };
        let h = view.header;
        if h.domain_tag != self.domain_tag {
            let n = c.frames_foreign_domain.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(
                n,
                "a frame of another domain",
                &format_args!("key {}", view.key),
            );
            return;
        }
        if let Some(sender) = sender {
            if io.node_keys.get(&h.node_id).map(|k| &**k) != Some(sender) {
                let n = c.frames_unattributed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a frame whose node did not send it",
                    &format_args!(
                        "it names node {} and came from a connection to key {sender}, which that node does not announce",
                        h.node_id
                    ),
                );
                return;
            }
        }
        let has_flag = h.flags & FLAG_PAYLOAD_FRAME != 0;
        if has_flag != second.is_some() {
            let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
            let err = FrameError::FrameCount {
                flag: has_flag,
                frames: 1 + usize::from(second.is_some()),
            };
            log_drop(n, "a data message", &err);
            return;
        }
        match h.kind {
            Kind::Heartbeat => {
                self.on_heartbeat(io, c, h.node_id, view.body);
                return;
            }
            Kind::Denied => {
                self.on_denied(io, h.node_id, view.body);
                return;
            }
            Kind::History => {
                self.on_history(io, c, h.node_id, view.key, view.body);
                return;
            }
            Kind::Request | Kind::Reply => {
                let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a data message",
                    &"a service call frame on a data socket",
                );
                return;
            }
            Kind::Sample | Kind::Batch => {}
        }
        // A filtered sample: the key follows the filter's prefix.
        let user_key = match &self.filter {
            Some((_, fp)) => match view.key.strip_prefix(fp.as_str()) {
                Some(k) => k,
                None => {
                    stats::inc(&c.frames_filtered);
                    return;
                }
            },
            None => view.key,
        };
        if !self.key_matches(io, user_key) {
            // Prefix filtering lets through a superset; not an error.
            stats::inc(&c.frames_filtered);
            return;
        }
        let key = user_key.to_owned();
        // Messages of a node one of whose frames waits for a dictionary
        // wait behind it, in order (docs/compression.md, "Dictionaries").
        if io.joins.get(&h.node_id).is_some_and(|j| !j.held.is_empty()) {
            let id = match frame::Compressed::read(view.body) {
                Ok(frame::Compressed {
                    dictionary: Some(id),
                    ..
                }) if h.flags & FLAG_COMPRESSED != 0 => Some(id),
                _ => None,
            };
            self.wait_for_dictionary(io, c, h.node_id, &key, id, frame.clone(), second);
            return;
        }
        if h.flags & FLAG_COMPRESSED != 0 {
            if let Ok(frame::Compressed {
                dictionary: Some(id),
                ..
            }) = frame::Compressed::read(view.body)
            {
                if !io.dictionaries.contains_key(&(h.node_id, id)) {
                    self.wait_for_dictionary(
                        io,
                        c,
                        h.node_id,
                        &key,
                        Some(id),
                        frame.clone(),
                        second,
                    );
                    return;
                }
            }
        }
        // A compressed body is inflated before anything reads it: the
        // frame is then as it would have been sent plain.
        let (frame, body_offset) = if h.flags & FLAG_COMPRESSED != 0 {
            match self.inflated(io, h.node_id, &frame, view.body_offset, view.body) {
                Some(f) => f,
                None => return,
            }
        } else {
            (frame.clone(), view.body_offset)
        };
        let body = &frame[body_offset..];
        if h.encoding == Encoding::Compact {
            self.want_schema(io, h.node_id, &key, h.schema_id);
        }
        match h.kind {
            Kind::Sample => {
                let first = frame.slice(body_offset..);
                match payload_value(h.encoding, first, second) {
                    Ok(value) => {
                        let s = Sample {
                            key,
                            value,
                            publisher: h.node_id,
                            seq: h.seq,
                            timestamp_ns: h.timestamp_ns,
                            encoding: h.encoding,
                            schema_id: h.schema_id,
                            replayed: h.flags & FLAG_REPLAYED != 0,
                            compact: None,
                        };
                        self.deliver(io, c, s, true);
                    }
                    Err(err) => {
                        self.undecodable(io, c, h.node_id, &key, h.seq, &err);
                    }
                }
            }
            // Handled above, before key matching.
            Kind::Heartbeat | Kind::History | Kind::Request | Kind::Reply | Kind::Denied => {}
            Kind::Batch => {
                // `decode` has validated every entry.
                let entries = BatchEntries::new(body).into_iter().flatten().flatten();
                for (i, e) in entries.enumerate() {
                    let Some(seq) = h.seq.checked_add(i as u64) else {
                        let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                        log_drop(n, "a batch", &"sequence numbers overflow");
                        break;
                    };
                    let start = body_offset + e.offset;
                    let payload = frame.slice(start..start + e.payload.len());
                    match payload_value(h.encoding, payload, None) {
                        Ok(value) => {
                            let s = Sample {
                                key: key.clone(),
                                value,
                                publisher: h.node_id,
                                seq,
                                timestamp_ns: e.timestamp_ns,
                                encoding: h.encoding,
                                schema_id: h.schema_id,
                                replayed: h.flags & FLAG_REPLAYED != 0,
                                compact: None,
                            };
                            self.deliver(io, c, s, true);
                        }
                        Err(err) => {
                            self.undecodable(io, c, h.node_id, &key, seq, &err);
                        }
                    }
                }
            }
        }
    }

    /// The frame `frame` would have been uncompressed (its compressed
    /// body at `body_offset`), and its body's offset; `None` (counted in
    /// `frames_malformed`, logged) if it does not inflate within
    /// `max_message_bytes` or is not a valid frame once inflated.
    fn inflated<L: Link>(
        &self,
        io: &SubState<L>,
        node: NodeId,
        frame: &Bytes,
        body_offset: usize,
        body: &[u8],
    ) -> Option<(Bytes, usize)> {
        let c = &self.counters;
        let refuse = |err: &dyn std::fmt::Display| {
            let n = c.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
            log_drop(n, "a compressed frame", err);
        };
        let read = match frame::Compressed::read(body) {
            Ok(r) => r,
            Err(e) => {
                refuse(&e);
                return None;
            }
        };
        // The frame's head, then the body inflated straight after it.
        let mut out = Vec::new();
        out.extend_from_slice(&frame[..body_offset]);
        let flags = body_offset - frame::HEADER_LEN + frame::offset::FLAGS;
        out[flags] &= !FLAG_COMPRESSED;
        let dict = read
            .dictionary
            .and_then(|id| io.dictionaries.get(&(node, id)))
            .map(|(d, _)| &**d);
        if let Err(e) = crate::engine::compress::inflate_with(&read, dict, self.max_bytes, &mut out)
        {
            refuse(&e);
            return None;
        }
        // A batch's entries are checked now.
        if let Err(e) = frame::decode(&out) {
            refuse(&e);
            return None;
        }
        stats::inc(&c.frames_inflated);
        Some((Bytes::from(out), body_offset))
    }

    /// A sample whose payload does not decode: it goes through the
    /// sequence check (a gap before it is reported, its own number is
    /// taken), then is dropped and counted in `payloads_malformed`, as
    /// docs/protocol.md §7 orders (rows 12-14): it arrived, so it is not
    /// also reported lost. While a history query to its node is in flight,
    /// only the counter moves.
    fn undecodable<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        key: &str,
        seq: u64,
        err: &dyn std::fmt::Display,
    ) {
        let n = c.payloads_malformed.fetch_add(1, Ordering::Relaxed) + 1;
        log_drop(n, "a sample whose payload does not decode", err);
        if !io.joins.contains_key(&node) {
            let _ = self.check_seq(io, c, node, key, seq, false);
        }
    }

    /// Whether `key` matches the expression: ZeroMQ prefix filtering lets
    /// through a superset of the keys a wildcard selects.
    fn key_matches<L: Link>(&self, io: &mut SubState<L>, key: &str) -> bool {
        if self.expr.is_literal() {
            return self.expr.matches(key);
        }
        // Milonga's own keys (`@...`) are never a user's sample.
        if key.starts_with('@') {
            return false;
        }
        if let Some(m) = io.matches.get(key) {
            return *m;
        }
        let m = self.expr.matches(key);
        if io.matches.len() >= MATCH_MEMO {
            io.matches.clear();
        }
        io.matches.insert(key.to_owned(), m);
        m
    }

    /// Counts `n` samples of `node` lost: the node's counter, the
    /// subscription's total and its count per publisher.
    pub(crate) fn count_lost(&self, c: &Counters, node: NodeId, n: u64) {
        stats::add(&c.samples_lost, n);
        stats::add(&self.lost_total, n);
        let mut by = lock(&self.lost_by_publisher);
        let e = by.entry(node).or_insert(0);
        *e = e.saturating_add(n);
    }

    /// Whether sample `seq` of (`node`, `key`) is new (the rules are
    /// seq.rs's); counts and logs what it is not, and queues a
    /// [`Event::Lost`] when it reveals a gap, unless `repair` allows and
    /// the publication can fill it from history.
    fn check_seq<L: Link>(
        &self,
        io: &mut SubState<L>,
        c: &Counters,
        node: NodeId,
        key: &str,
        seq: u64,
        repair: bool,
    ) -> Verdict {
        if !io.seqs.is_current(node, key) {
            self.note_alive(io, node, None);
        }
        let (live, gone) = (&io.live, &io.recently_gone);
        let member = || live.contains(&node) || gone.contains(&node);
        let can_repair = || repair && self.repairable(&io.matched, node, key);
        let matched = &io.matched;
        let announced = |k: &str| matched.contains_key(&(node, k.to_owned()));
        match io.seqs.check(node, key, seq, member, can_repair, announced) {
            Step::Unknown => {
                let n = c.samples_unknown_publisher.fetch_add(1, Ordering::Relaxed) + 1;
                // At info: a subscription that starts while samples flow
                // (through a broker, ahead of the view that shows their
                // node) drops its first few here, before its stream
                // begins; counted all the same.
                crate::util::stats::log_drop_info(
                    n,
                    "a sample of a node that discovery does not show",
                    &format_args!("{key} from {node}"),
                );
                Verdict::Drop
            }
            Step::OverKeyLimit => {
                let n = c.samples_over_key_limit.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "a sample of one key too many",
                    &format_args!(
                        "{key} from {node}: already {MAX_KEYS_PER_PUBLISHER} keys of that publisher"
                    ),
                );
                Verdict::Drop
            }
            Step::Duplicate => {
                let n = c.samples_duplicate.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(n, "a duplicate sample", &format_args!("{key} seq {seq}"));
                Verdict::Drop
            }
            Step::Back { from } => {
                // A publisher's sequence never goes back; a frame that says
                // so is corrupt or forged. Start over from it rather than
                // let one bad frame mute the stream.
                let n = c.sequence_resets.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "the sequence baseline",
                    &format_args!("{key} went back from {from} to {seq}"),
                );
                Verdict::Deliver
            }
            Step::Jump { from } => {
                let n = c.sequence_jumps.fetch_add(1, Ordering::Relaxed) + 1;
                log_drop(
                    n,
                    "the sequence baseline",
                    &format_args!(
                        "{key} jumped from {from} to {seq}: corrupt or forged, not a loss"
                    ),
                );
                Verdict::Deliver
            }
            Step::Repair { last } => Verdict::Repair(last),
            Step::Gap { lost, first_seq } => {
                self.count_lost(c, node, lost);
                io.pending.push_back(Event::Lost(LostSamples {
                    publisher: node,
                    key: key.to_owned(),
                    count: lost,
                    first_seq,
                }));
                Verdict::Deliver
            }
            Step::First | Step::Next => Verdict::Deliver,
        }
    }

    /// Reports, once per endpoint, a publisher's node that refused this
    /// node's key (the node thread saw the handshake fail with ZAP status
    /// `status`). The connection then closes, and is made again like any
    /// other that closed: a key added to the publisher's trust lets it in.
    pub(crate) fn connection_refused<L: Link>(
        &self,
        io: &mut SubState<L>,
        endpoint: String,
        status: u32,
    ) {
        self.counters.auth_rejected.fetch_add(1, Ordering::Relaxed);
        // A history query to a data socket that refused this node gets no
        // answer: the node's other sockets (access control gives keys of
        // other rules sockets of their own) need not wait for it.
        let refusing: Vec<(NodeId, String)> = io
            .matched
            .iter()
            .filter(|(_, p)| p.endpoint == endpoint)
            .map(|((node, _), p)| (*node, p.socket.clone()))
            .collect();
        for (node, socket) in refusing {
            let done = io
                .joins
                .get_mut(&node)
                .is_some_and(|j| j.pending.remove(&socket) && j.pending.is_empty());
            if done {
                self.finish_join(io, &self.counters, node, true);
            }
        }
        if io.refused.len() >= MAX_REFUSED || !io.refused.insert(endpoint.clone()) {
            return;
        }
        tracing::warn!(expr = %self.expr, %endpoint, status, "a publisher's node refused this node: its key is not in that node's trust directory");
        io.pending.push_back(Event::PermissionDenied(PermissionDenied {
            publisher: io
                .data_nodes
                .get(&endpoint)
                .or_else(|| io.liveliness.get(&endpoint))
                .copied(),
            endpoint,
            reason: format!("refused this node's key (ZAP status {status}): it is not in that node's trust directory, or that node's access control rules do not let it subscribe to every key served at that endpoint"),
        }));
    }

    /// A publisher refused a subscription prefix or a history query of
    /// this subscription (its access control rules): reported once per
    /// (publisher, operation, what), as [`Event::PermissionDenied`].
    fn on_denied<L: Link>(&self, io: &mut SubState<L>, node: NodeId, body: &[u8]) {
        // Only from a node discovery shows (a refusal costs a place in
        // `refused` and an event).
        if !io.live.contains(&node) {
            stats::inc(&self.counters.samples_unknown_publisher);
            return;
        }
        let Ok(mut d) = serde_json::from_slice::<milonga_wire::frame::Denied>(body) else {
            let n = self
                .counters
                .frames_malformed
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            log_drop(n, "a refusal", &"its body is not the JSON of a refusal");
            return;
        };
        self.counters
            .acl_denied_here
            .fetch_add(1, Ordering::Relaxed);
        for field in [&mut d.operation, &mut d.what, &mut d.reason] {
            if field.len() > 512 {
                let mut end = 512;
                while !field.is_char_boundary(end) {
                    end -= 1;
                }
                field.truncate(end);
            }
        }
        let tag = format!("{node}:{}:{}", d.operation, d.what);
        if io.refused.len() >= MAX_REFUSED || !io.refused.insert(tag) {
            return;
        }
        let endpoint = io
            .data_nodes
            .iter()
            .find(|(_, n)| **n == node)
            .map(|(ep, _)| ep.clone())
            .unwrap_or_default();
        tracing::warn!(expr = %self.expr, publisher = %node, operation = %d.operation, what = %d.what, reason = %d.reason, "a publisher's access control refused this subscription");
        io.pending
            .push_back(Event::PermissionDenied(PermissionDenied {
                endpoint,
                publisher: Some(node),
                reason: format!("{} {} refused: {}", d.operation, d.what, d.reason),
            }));
    }

    /// Counts connections that closed (the node thread watches the socket
    /// monitor and reports each one), and connects again to an endpoint
    /// still wanted: ZeroMQ does not reconnect after a protocol error such
    /// as an over-size frame.
    pub(crate) fn connections_closed<L: Link>(
        &self,
        io: &mut SubState<L>,
        closed: Vec<String>,
        now: Instant,
    ) {
        self.connections_closed_with(io, closed, now, DISCONNECT_GRACE);
    }

    /// [`Subscription::connections_closed`], their nodes reported
    /// disconnected after `grace` unless heard of otherwise.
    pub(crate) fn connections_closed_with<L: Link>(
        &self,
        io: &mut SubState<L>,
        closed: Vec<String>,
        now: Instant,
        grace: Duration,
    ) {
        for endpoint in closed {
            let c = &self.counters;
            let n = c.connections_closed.fetch_add(1, Ordering::Relaxed) + 1;
            self.note_liveliness_closed(io, &endpoint, now, grace);
            if n <= 10 || n % 1000 == 0 {
                tracing::info!(
                    expr = %self.expr,
                    %endpoint,
                    closed_so_far = n,
                    "connection to a publisher closed (the peer went away, or sent a frame over max_message_bytes or broke ZMTP)"
                );
            }
            if io.lingering.contains_key(&endpoint) {
                // A departed node's connection, kept for its last samples:
                // everything that came on it has been read.
                self.drop_connection(io, &endpoint);
                continue;
            }
            if let Some(node) = io.data_nodes.remove(&endpoint) {
                self.settle_goodbye(io, node);
            }
            if io.connected.remove(&endpoint) {
                io.link.disconnect(&endpoint);
                // Connect again (in `apply`) after a back-off: a peer that
                // breaks every connection at once (an over-size frame to
                // each newcomer) must not make this spin.
                let b = io.backoff.entry(endpoint).or_insert(Backoff {
                    failures: 0,
                    last_close: now,
                    next: now,
                });
                if now.duration_since(b.last_close) > BACKOFF_RESET {
                    b.failures = 0;
                }
                b.failures = b.failures.saturating_add(1);
                b.last_close = now;
                let max = Duration::from_millis(2000);
                let base = (Duration::from_millis(100) * (1 << (b.failures - 1).min(5))).min(max);
                // Half the base, plus up to half at random: peers that lost
                // their connections together do not come back together.
                let jitter =
                    u64::from(getrandom::u32().unwrap_or(0)) % (base.as_micros() as u64 / 2 + 1);
                b.next = now + base / 2 + Duration::from_micros(jitter);
                let at = b.next;
                io.arm(at);
                // Make `apply` compare the target with what is connected.
                io.applied = io.applied.wrapping_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use milonga_wire::announce::Announcement;
    use milonga_wire::frame::{domain_tag, Header};
    use milonga_wire::history::{Entry, QUERY_TAG};
    use milonga_wire::{Encoding, Key, Value};

    use super::*;
    use crate::engine::routes::routes_for;

    /// A link that records what the subscription asks of it.
    struct Recorder {
        connected: Vec<String>,
        /// The endpoints connected with ZMTP heartbeats.
        pinged: Vec<String>,
        disconnected: Vec<String>,
        sent: Vec<Vec<u8>>,
        /// The time the engine reads: tests move it.
        now: Instant,
    }

    impl Default for Recorder {
        fn default() -> Recorder {
            Recorder {
                connected: Vec::new(),
                pinged: Vec::new(),
                disconnected: Vec::new(),
                sent: Vec::new(),
                now: Instant::now(),
            }
        }
    }

    impl Link for Recorder {
        fn connect(&mut self, endpoint: &str, pinged: bool) -> Result<(), TransportError> {
            self.connected.push(endpoint.to_owned());
            if pinged {
                self.pinged.push(endpoint.to_owned());
            }
            Ok(())
        }
        fn disconnect(&mut self, endpoint: &str) {
            self.disconnected.push(endpoint.to_owned());
        }
        fn send(&mut self, msg: Vec<u8>) -> Result<(), TransportError> {
            self.sent.push(msg);
            Ok(())
        }
        fn now(&self) -> Instant {
            self.now
        }
    }

    const PUBLISHER: NodeId = NodeId([5; 16]);
    const LEASE: Duration = Duration::from_millis(300);

    fn wants(last: usize, reliable: bool, deadline: Option<Duration>) -> Wants {
        Wants {
            deadline,
            lease: LEASE,
            last,
            reliable,
            token: "tok".into(),
            filter: None,
            schema: None,
            typed: false,
            max_bytes: 1 << 20,
        }
    }

    struct Fixture {
        core: Subscription,
        io: SubState<Recorder>,
        counters: Arc<Counters>,
    }

    fn fixture(expr: &str, w: Wants) -> Fixture {
        let counters = Arc::new(Counters::default());
        let last = w.last;
        Fixture {
            core: Subscription::new(
                KeyExpr::new(expr).unwrap(),
                w,
                domain_tag("lab"),
                counters.clone(),
            ),
            io: SubState::new(Recorder::default(), last),
            counters,
        }
    }

    /// The publisher's announcement: one publication of `key`; its best
    /// effort data endpoint is `BE`, its liveliness endpoint `LIVE`.
    fn announcement(key: &str, reliability: Reliability, history: usize) -> Announcement {
        publishing(&[(key, reliability, history)])
    }

    /// The test publisher node announcing `pubs`.
    fn publishing(pubs: &[(&str, Reliability, usize)]) -> Announcement {
        crate::engine::routes::test_announcement(5, 1, pubs)
    }

    const BE: &str = "tcp://127.0.0.1:5501";
    const LIVE: &str = "tcp://127.0.0.1:5503";

    impl Fixture {
        fn route(&mut self, a: &Announcement) {
            assert!(self.core.set_target(routes_for(&self.core.expr, &[a])));
            self.core.apply(&mut self.io);
        }

        fn receive(&mut self, frame: Vec<u8>) {
            self.core.handle(&mut self.io, Bytes::from(frame), None);
        }

        fn events(&mut self) -> Vec<Event> {
            self.io.pending.drain(..).collect()
        }
    }

    fn header(kind: Kind, seq: u64, tag: &str) -> Header {
        Header {
            kind,
            flags: 0,
            encoding: Encoding::Cbor,
            domain_tag: domain_tag(tag),
            schema_id: 0,
            node_id: PUBLISHER,
            seq,
            timestamp_ns: 1,
        }
    }

    /// A kept sample `seq` (its value `seq` as a float), as a history
    /// reply carries it.
    fn entry(seq: u64) -> Entry {
        Entry {
            seq,
            timestamp_ns: 1,
            encoding: Encoding::Cbor,
            schema_id: 0,
            payload: Bytes::from(cbor(&Value::Float(seq as f64))),
        }
    }

    fn cbor(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        milonga_wire::cbor::encode_cbor(v, &mut out).unwrap();
        out
    }

    fn sample(key: &str, seq: u64) -> Vec<u8> {
        let h = header(Kind::Sample, seq, "lab");
        frame::encode(
            &Key::new(key).unwrap(),
            &h,
            &cbor(&Value::Float(seq as f64)),
        )
    }

    /// A history reply `r` to the fixture's subscription (token `tok`).
    fn reply_frame(r: &Reply) -> Vec<u8> {
        let key = Key::internal("@r/tok").unwrap();
        frame::encode(&key, &header(Kind::History, 1, "lab"), &r.encode())
    }

    /// The whole answer to query `q`: `keys`, done.
    fn answer(q: &Query, keys: Vec<KeyHistory>) -> Vec<u8> {
        reply_frame(&Reply {
            socket: q.socket.clone(),
            keys,
            done: true,
            id: q.id,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        })
    }

    fn heartbeat(leaving: bool) -> Vec<u8> {
        let body = Value::Map(vec![(Value::from("leaving"), Value::Bool(leaving))]);
        let key = Key::internal(frame::HEARTBEAT_KEY).unwrap();
        frame::encode(&key, &header(Kind::Heartbeat, 1, "lab"), &cbor(&body))
    }

    fn seqs(events: &[Event]) -> Vec<u64> {
        events
            .iter()
            .filter_map(|e| e.as_sample().map(|s| s.seq))
            .collect()
    }

    #[test]
    fn with_security_a_frame_is_taken_only_from_the_key_its_node_announced() {
        let mut f = fixture("k", wants(0, false, None));
        let mut a = announcement("k", Reliability::BestEffort, 0);
        a.key = Some("publisher-key".into());
        f.route(&a);
        let take = |f: &mut Fixture, seq: u64, sender: Option<&str>| {
            f.core
                .handle_from(&mut f.io, Bytes::from(sample("k", seq)), None, sender);
            f.events()
                .iter()
                .filter(|e| matches!(e, Event::Sample(s) if s.seq == seq))
                .count()
        };
        // From a connection to its node's key: taken.
        assert_eq!(take(&mut f, 1, Some("publisher-key")), 1);
        // From another trusted key's connection, naming that node: not.
        assert_eq!(take(&mut f, 2, Some("someone-else")), 0);
        assert_eq!(f.counters.frames_unattributed.load(Relaxed), 1);
        // Without a handshake (security off, or inproc): as before.
        assert_eq!(take(&mut f, 3, None), 1);
        // A node discovery never showed: nobody's key is its.
        let mut h = header(Kind::Sample, 4, "lab");
        h.node_id = NodeId([7; 16]);
        let other = frame::encode(&Key::new("k").unwrap(), &h, &cbor(&Value::Float(4.0)));
        f.core
            .handle_from(&mut f.io, Bytes::from(other), None, Some("publisher-key"));
        assert_eq!(f.counters.frames_unattributed.load(Relaxed), 2);
    }

    #[test]
    fn routes_connect_to_the_publisher_and_its_liveliness_only_once() {
        let mut f = fixture("sr/**", wants(0, false, None));
        let a = announcement("sr/a", Reliability::BestEffort, 0);
        f.route(&a);
        let mut c = f.io.link.connected.clone();
        c.sort();
        assert_eq!(c, [BE, LIVE]);
        assert!(f.io.link.sent.is_empty(), "last 0: no history query");
        assert_eq!(f.io.data_connections(), 1);
        // The same routes again change nothing.
        assert!(!f.core.set_target(routes_for(&f.core.expr, &[&a])));
        assert!(f.events().is_empty());
    }

    /// Broken, a publisher known at a new address (a node on several
    /// networks) stays connected at the old one too, and every sample
    /// arrives twice, the lagging copy taken for a sequence that went back.
    #[test]
    fn a_live_publisher_known_at_another_address_is_followed_there_only() {
        let mut f = fixture("sr/**", wants(0, false, None));
        let a = announcement("sr/a", Reliability::BestEffort, 0);
        f.route(&a);
        let mut moved = a.clone();
        moved.data_best_effort = Some("tcp://10.0.0.1:5501".into());
        f.route(&moved);
        assert_eq!(
            f.io.link.disconnected,
            [BE],
            "the old address closed at once"
        );
        assert_eq!(f.io.data_connections(), 1);
        // A publication that ends keeps its node's connection (the node
        // still announces the endpoint).
        let mut quiet = moved.clone();
        quiet.publications.clear();
        f.core.set_target(routes_for(&f.core.expr, &[&quiet]));
        f.core.apply(&mut f.io);
        assert_eq!(f.io.link.disconnected, [BE]);
        assert_eq!(f.io.data_connections(), 1);
    }

    #[test]
    fn samples_in_order_are_delivered_and_a_gap_is_reported_lost_before_the_next() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        for seq in [1, 2, 5] {
            f.receive(sample("sr/a", seq));
        }
        let ev = f.events();
        assert_eq!(seqs(&ev), [1, 2, 5]);
        let lost: Vec<&LostSamples> = ev
            .iter()
            .filter_map(|e| match e {
                Event::Lost(l) => Some(l),
                _ => None,
            })
            .collect();
        assert_eq!(lost.len(), 1);
        assert_eq!(
            (lost[0].count, lost[0].first_seq, lost[0].publisher),
            (2, 3, PUBLISHER)
        );
        // The loss comes right before sample 5.
        let at = ev.iter().position(|e| matches!(e, Event::Lost(_))).unwrap();
        assert_eq!(ev[at + 1].as_sample().map(|s| s.seq), Some(5));
        assert_eq!(f.counters.samples_lost.load(Relaxed), 2);
        assert_eq!(f.core.lost_total.load(Relaxed), 2);
        assert_eq!(lock(&f.core.lost_by_publisher)[&PUBLISHER], 2);
    }

    #[test]
    fn a_duplicate_is_dropped_and_a_frame_of_another_domain_refused() {
        let mut f = fixture("sr/a", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 1));
        f.receive(sample("sr/a", 1));
        let h = header(Kind::Sample, 2, "other-domain");
        f.receive(frame::encode(
            &Key::new("sr/a").unwrap(),
            &h,
            &cbor(&Value::Null),
        ));
        f.receive(b"not a frame".to_vec());
        assert_eq!(seqs(&f.events()), [1]);
        assert_eq!(f.counters.frames_foreign_domain.load(Relaxed), 1);
        assert_eq!(f.counters.frames_malformed.load(Relaxed), 1);
    }

    #[test]
    fn a_key_the_expression_does_not_match_is_not_delivered() {
        let mut f = fixture("sr/*/current", wants(0, false, None));
        f.route(&announcement("sr/a/current", Reliability::BestEffort, 0));
        f.receive(sample("sr/a/current", 1));
        // Prefix filtering lets `sr/a/voltage` through; the check does not.
        f.receive(sample("sr/a/voltage", 1));
        assert_eq!(seqs(&f.events()), [1]);
    }

    #[test]
    fn a_heartbeat_makes_the_publisher_alive_and_its_goodbye_lost_closed() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(heartbeat(false));
        let ev = f.events();
        assert!(
            matches!(&ev[..], [Event::PublisherAlive(p)] if p.publisher == PUBLISHER),
            "{ev:?}"
        );
        f.receive(heartbeat(true));
        let ev = f.events();
        assert!(
            matches!(&ev[..], [Event::PublisherLost(p)] if p.reason == LostReason::Closed),
            "{ev:?}"
        );
    }

    #[test]
    fn what_a_goodbye_says_was_sent_and_never_came_is_reported_lost_when_its_connection_closes() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 1));
        f.receive(sample("sr/a", 2));
        let bye = milonga_wire::heartbeat::Heartbeat {
            leaving: true,
            last: milonga_wire::heartbeat::Last::Keys(vec![
                ("sr/a".into(), 4),
                ("elsewhere/b".into(), 9),
            ]),
        };
        let key = Key::internal(frame::HEARTBEAT_KEY).unwrap();
        f.receive(frame::encode(
            &key,
            &header(Kind::Heartbeat, 2, "lab"),
            &bye.encode(),
        ));
        assert_eq!(seqs(&f.events()), [1, 2]);
        // Samples 3 and 4 may still be on their way until the data
        // connection closes.
        assert_eq!(f.counters.samples_lost.load(Relaxed), 0);
        let now = f.io.link.now;
        f.core.connections_closed(&mut f.io, vec![BE.into()], now);
        let lost: Vec<(u64, u64)> = f
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Lost(l) if l.key == "sr/a" => Some((l.first_seq, l.count)),
                _ => None,
            })
            .collect();
        assert_eq!(
            lost,
            [(3, 2)],
            "3 and 4, and nothing of a key it does not match"
        );
        assert_eq!(f.counters.samples_lost.load(Relaxed), 2);
    }

    #[test]
    fn a_silent_publisher_is_lost_when_its_lease_runs_out() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        let t0 = f.io.link.now;
        f.receive(heartbeat(false));
        f.events();
        f.core.check_timers(&mut f.io, t0, true);
        assert!(f.events().is_empty(), "the lease still runs");
        let due = f.io.next_timer.expect("a lease to watch");
        assert_eq!(due, t0 + LEASE, "the lease counts from the heartbeat");
        f.core
            .check_timers(&mut f.io, due + Duration::from_millis(1), true);
        let ev = f.events();
        assert!(
            matches!(&ev[..], [Event::PublisherLost(p)] if p.reason == LostReason::LeaseExpired),
            "{ev:?}"
        );
    }

    #[test]
    fn a_key_silent_past_its_deadline_is_reported_each_period() {
        let d = Duration::from_millis(100);
        let mut f = fixture("sr/**", wants(0, false, Some(d)));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 1));
        f.events();
        let later = f.io.link.now + d + Duration::from_millis(5);
        f.core.check_timers(&mut f.io, later, true);
        let ev = f.events();
        assert!(
            matches!(&ev[..], [Event::DeadlineMissed(m)]
                if m.key == "sr/a" && m.silent_for == d + Duration::from_millis(5)),
            "{ev:?}"
        );
        // Not again before the next period.
        f.core.check_timers(&mut f.io, later + d / 2, true);
        assert!(f
            .events()
            .iter()
            .all(|e| !matches!(e, Event::DeadlineMissed(_))));
        f.core.check_timers(&mut f.io, later + d, true);
        assert_eq!(f.events().len(), 1);
    }

    #[test]
    fn a_key_its_publisher_undeclared_is_no_longer_watched_one_whose_publisher_was_lost_is() {
        let d = Duration::from_millis(100);
        let mut f = fixture("sr/**", wants(0, false, Some(d)));
        let both = publishing(&[
            ("sr/a", Reliability::BestEffort, 0),
            ("sr/b", Reliability::BestEffort, 0),
        ]);
        f.route(&both);
        assert_eq!(f.io.deadlines.len(), 2);
        // The node, still in view, no longer announces sr/b: retired a
        // lease later (reported missed until then).
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        let missed = |f: &mut Fixture| -> Vec<String> {
            let mut keys: Vec<String> = f
                .events()
                .into_iter()
                .filter_map(|e| match e {
                    Event::DeadlineMissed(m) => Some(m.key),
                    _ => None,
                })
                .collect();
            keys.sort();
            keys
        };
        let t0 = f.io.link.now;
        f.core.check_timers(&mut f.io, t0 + d * 2, true);
        assert_eq!(missed(&mut f), ["sr/a", "sr/b"], "within the lease");
        let lease = f.core.lease;
        f.core.check_timers(&mut f.io, t0 + lease + d, true);
        assert!(f.io.deadlines.contains_key("sr/a") && !f.io.deadlines.contains_key("sr/b"));
        assert_eq!(missed(&mut f), ["sr/a"]);
        // Undeclared, then its node closes within the lease (a program
        // that drops its publisher, then its node): watched on.
        let mut f = fixture("sr/**", wants(0, false, Some(d)));
        f.route(&both);
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        assert!(f.core.set_target(routes_for(&f.core.expr, &[])));
        f.core.apply(&mut f.io);
        let t0 = f.io.link.now;
        f.core.check_timers(&mut f.io, t0 + lease * 2, true);
        assert!(f.io.deadlines.contains_key("sr/a") && f.io.deadlines.contains_key("sr/b"));
        assert_eq!(missed(&mut f), ["sr/a", "sr/b"]);
    }

    #[test]
    fn a_publication_offering_less_than_asked_is_reported_once() {
        let mut f = fixture("sr/**", wants(5, true, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 2));
        let policies: Vec<QosPolicy> = f
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::IncompatibleQos(q) => Some(q.policy),
                _ => None,
            })
            .collect();
        assert_eq!(policies, [QosPolicy::Reliability, QosPolicy::History]);
    }

    #[test]
    fn a_late_joiner_gets_kept_samples_first_then_the_live_ones_it_held() {
        let mut f = fixture("sr/**", wants(2, false, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 10));
        // One history query, to the reliable socket of the publisher.
        assert_eq!(f.io.link.sent.len(), 1);
        let q = Query::decode(&f.io.link.sent[0]).unwrap();
        assert_eq!(f.io.link.sent[0][0], QUERY_TAG);
        assert_eq!(
            (q.node.as_str(), q.socket.as_str(), q.token.as_str(), q.last),
            (PUBLISHER.to_hex().as_str(), "reliable", "tok", 2)
        );
        // A live sample arrives before the answer: it waits.
        f.receive(sample("sr/a", 9));
        assert!(seqs(&f.events()).is_empty());
        let reply = Reply {
            socket: "reliable".into(),
            keys: vec![KeyHistory {
                key: "sr/a".into(),
                first: 1,
                last: 8,
                entries: vec![entry(7), entry(8)],
                replayed: false,
            }],
            done: true,
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        f.receive(reply_frame(&reply));
        let ev = f.events();
        assert_eq!(seqs(&ev), [7, 8, 9], "kept first, then the held live one");
        assert!(ev.iter().any(|e| matches!(e, Event::SubscriptionLive)));
        assert_eq!(f.counters.samples_lost.load(Relaxed), 0);
    }

    fn lost_reasons(ev: &[Event]) -> Vec<LostReason> {
        ev.iter()
            .filter_map(|e| match e {
                Event::PublisherLost(p) => Some(p.reason),
                _ => None,
            })
            .collect()
    }

    fn losses(ev: &[Event]) -> Vec<(u64, u64)> {
        ev.iter()
            .filter_map(|e| match e {
                Event::Lost(l) => Some((l.first_seq, l.count)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_withdrawn_publication_is_reported_undeclared_once_the_socket_is_drained() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(heartbeat(false));
        f.events();
        // The node lives on without the publication.
        f.route(&publishing(&[]));
        let t = f.io.link.now + DEPARTURE_GRACE;
        f.core.check_timers(&mut f.io, t, false);
        assert!(
            f.events().is_empty(),
            "samples may still wait in the socket"
        );
        f.core.check_timers(&mut f.io, t, true);
        assert_eq!(lost_reasons(&f.events()), [LostReason::Undeclared]);
        assert!(f.io.link.disconnected.contains(&LIVE.to_owned()));
        // Its data connection stays: the node lives, and may declare again.
        assert!(!f.io.link.disconnected.contains(&BE.to_owned()));
    }

    #[test]
    fn a_node_that_left_the_domain_keeps_its_data_connection_for_a_lease() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 1));
        f.events();
        let t0 = f.io.link.now;
        assert!(f.core.set_target(routes_for(&f.core.expr, &[])));
        f.core.apply(&mut f.io);
        assert!(
            f.io.link.disconnected.is_empty(),
            "its last samples may come"
        );
        // Samples already on their way are still delivered.
        f.receive(sample("sr/a", 2));
        assert_eq!(seqs(&f.events()), [2]);
        f.core
            .check_timers(&mut f.io, t0 + LEASE - Duration::from_millis(1), true);
        assert!(!f.io.link.disconnected.contains(&BE.to_owned()));
        f.core.check_timers(&mut f.io, t0 + LEASE, true);
        assert!(f.io.link.disconnected.contains(&BE.to_owned()));
    }

    #[test]
    fn a_closed_liveliness_connection_without_a_goodbye_is_reported_disconnected() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(heartbeat(false));
        f.events();
        let now = f.io.link.now;
        f.core.connections_closed(&mut f.io, vec![LIVE.into()], now);
        assert_eq!(f.counters.connections_closed.load(Relaxed), 1);
        f.core.check_timers(&mut f.io, now, true);
        assert!(f.events().is_empty(), "a goodbye may still come");
        assert_eq!(f.io.next_timer, Some(now + DISCONNECT_GRACE));
        f.core.check_timers(&mut f.io, now + DISCONNECT_GRACE, true);
        assert_eq!(lost_reasons(&f.events()), [LostReason::Disconnected]);
    }

    #[test]
    fn only_data_connections_send_pings() {
        // One publisher with a best-effort and a reliable key: three
        // connections (best effort, reliable, liveliness), two pinged.
        let mut f = fixture("sr/**", wants(0, true, None));
        let a = publishing(&[
            ("sr/a", Reliability::BestEffort, 0),
            ("sr/b", Reliability::Reliable, 0),
        ]);
        f.route(&a);
        let mut connected = f.io.link.connected.clone();
        connected.sort();
        assert_eq!(connected, [BE, "tcp://127.0.0.1:5502", LIVE]);
        let mut pinged = f.io.link.pinged.clone();
        pinged.sort();
        assert_eq!(pinged, [BE, "tcp://127.0.0.1:5502"]);
    }

    #[test]
    fn a_closed_data_connection_is_made_again_after_a_back_off() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        let now = f.io.link.now;
        f.core.connections_closed(&mut f.io, vec![BE.into()], now);
        assert_eq!(f.io.link.disconnected, [BE]);
        // The first back-off: 50 to 100 ms.
        let at = f.io.next_timer.expect("a back-off");
        assert!(
            at >= now + Duration::from_millis(50) && at <= now + Duration::from_millis(100),
            "{:?}",
            at - now
        );
        f.core.apply(&mut f.io);
        let count = |f: &Fixture| f.io.link.connected.iter().filter(|e| *e == BE).count();
        assert_eq!(count(&f), 1, "not before the back-off");
        f.io.link.now = at;
        f.core.check_timers(&mut f.io, at, true);
        f.core.apply(&mut f.io);
        assert_eq!(count(&f), 2, "connected again");
        // Closed again at once, each time: the back-off doubles from
        // 100 ms (half of it, plus up to half at random) up to 2 s.
        for k in 2..=8u32 {
            let now = f.io.link.now;
            f.core.connections_closed(&mut f.io, vec![BE.into()], now);
            let base = Duration::from_millis((100u64 << (k - 1).min(5)).min(2000));
            let at = f.io.backoff[BE].next;
            assert!(
                at >= now + base / 2 && at <= now + base,
                "close {k}: {:?} (base {base:?})",
                at - now
            );
            f.core.apply(&mut f.io);
            assert_eq!(count(&f), k as usize, "close {k}: not before the back-off");
            f.io.link.now = at;
            f.core.check_timers(&mut f.io, at, true);
            f.core.apply(&mut f.io);
            assert_eq!(count(&f), k as usize + 1, "close {k}: connected again");
        }
        // Up longer than BACKOFF_RESET since the last close: over again.
        let now = f.io.link.now + BACKOFF_RESET + Duration::from_secs(1);
        f.io.link.now = now;
        f.core.connections_closed(&mut f.io, vec![BE.into()], now);
        let at = f.io.backoff[BE].next;
        assert!(
            at >= now + Duration::from_millis(50) && at <= now + Duration::from_millis(100),
            "{:?}",
            at - now
        );
    }

    #[test]
    fn an_undecodable_payload_is_counted_and_takes_its_sequence_number() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 1));
        // 0xff: a CBOR "break" with nothing to end.
        let bad = frame::encode(
            &Key::new("sr/a").unwrap(),
            &header(Kind::Sample, 3, "lab"),
            &[0xff],
        );
        f.receive(bad);
        f.receive(sample("sr/a", 4));
        let ev = f.events();
        assert_eq!(seqs(&ev), [1, 4]);
        assert_eq!(losses(&ev), [(2, 1)], "2 is lost; 3 arrived, undecodable");
        assert_eq!(f.counters.payloads_malformed.load(Relaxed), 1);
    }

    #[test]
    fn malformed_frames_are_counted_and_dropped() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(b"not a frame".to_vec());
        // A service call on a data connection.
        f.receive(frame::encode(
            &Key::new("sr/a").unwrap(),
            &header(Kind::Request, 1, "lab"),
            &cbor(&Value::Null),
        ));
        // The header says a payload frame follows; none does.
        let mut h = header(Kind::Sample, 1, "lab");
        h.flags = FLAG_PAYLOAD_FRAME;
        f.receive(frame::encode(&Key::new("sr/a").unwrap(), &h, &[]));
        assert!(f.events().is_empty());
        assert_eq!(f.counters.frames_malformed.load(Relaxed), 3);
    }

    #[test]
    fn a_batch_is_delivered_entry_by_entry_with_consecutive_numbers() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 0));
        let mut body = Vec::new();
        for v in [10.0, 11.0, 12.0] {
            frame::push_batch_entry(&mut body, 7, &cbor(&Value::Float(v)));
        }
        f.receive(frame::encode(
            &Key::new("sr/a").unwrap(),
            &header(Kind::Batch, 10, "lab"),
            &body,
        ));
        let ev = f.events();
        assert_eq!(seqs(&ev), [10, 11, 12]);
        let values: Vec<f64> = ev
            .iter()
            .filter_map(|e| e.as_sample().and_then(|s| s.value.as_f64()))
            .collect();
        assert_eq!(values, [10.0, 11.0, 12.0]);
    }

    #[test]
    fn a_sequence_that_goes_back_or_jumps_is_counted_and_followed() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 5));
        f.receive(sample("sr/a", 2));
        let far = 2 + crate::engine::seq::MAX_SEQ_JUMP + 10;
        f.receive(sample("sr/a", far));
        f.receive(sample("sr/a", far + 1));
        let ev = f.events();
        assert_eq!(seqs(&ev), [5, 2, far, far + 1]);
        assert!(losses(&ev).is_empty(), "neither is a loss");
        assert_eq!(f.counters.sequence_resets.load(Relaxed), 1);
        assert_eq!(f.counters.sequence_jumps.load(Relaxed), 1);
    }

    #[test]
    fn a_sample_of_a_node_discovery_does_not_show_is_dropped() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.receive(sample("sr/a", 1));
        assert!(f.events().is_empty());
        assert_eq!(f.counters.samples_unknown_publisher.load(Relaxed), 1);
    }

    #[test]
    fn a_history_query_nothing_answered_is_sent_again_and_a_copy_s_answer_is_ignored() {
        let mut f = fixture("sr/**", wants(2, true, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 10));
        let t0 = f.io.link.now;
        assert_eq!(f.io.link.sent.len(), 1);
        let first = f.io.link.sent[0].clone();
        let id = Query::decode(&first)
            .unwrap()
            .id
            .expect("a query names itself");
        f.core.check_timers(
            &mut f.io,
            t0 + RESEND_AFTER[0] - Duration::from_millis(1),
            true,
        );
        assert_eq!(f.io.link.sent.len(), 1, "not yet");
        f.core.check_timers(&mut f.io, t0 + RESEND_AFTER[0], true);
        assert_eq!(f.io.link.sent.len(), 2, "sent again");
        assert_eq!(f.io.link.sent[1], first, "the same query, the same id");
        f.core.check_timers(&mut f.io, t0 + RESEND_AFTER[0], true);
        assert_eq!(f.io.link.sent.len(), 2, "once per step");
        let reply = |entries: Vec<u64>, done: bool, id: u64| Reply {
            socket: "reliable".into(),
            keys: vec![KeyHistory {
                key: "sr/a".into(),
                first: 7,
                last: 8,
                entries: entries.into_iter().map(entry).collect(),
                replayed: false,
            }],
            done,
            id: Some(id),
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        let send = |f: &mut Fixture, r: Reply| f.receive(reply_frame(&r));
        // An answer naming another query (a copy of an earlier one) is not
        // this join's: it neither fills nor ends it.
        send(&mut f, reply(vec![7, 8], true, id + 100));
        assert!(seqs(&f.events()).is_empty(), "still waiting");
        // A reply begins (not done): no third copy.
        send(&mut f, reply(vec![7], false, id));
        f.core.check_timers(&mut f.io, t0 + RESEND_AFTER[1], true);
        assert_eq!(f.io.link.sent.len(), 2, "a reply began: not sent again");
        send(&mut f, reply(vec![8], true, id));
        assert_eq!(seqs(&f.events()), [7, 8], "each kept sample once");
        assert_eq!(f.counters.history_queries_resent.load(Relaxed), 1);
        assert_eq!(f.counters.history_queries_unanswered.load(Relaxed), 0);
        // A repair (a gap on a live connection) is not sent again.
        f.receive(sample("sr/a", 11));
        let asked = f.io.link.sent.len();
        assert_eq!(asked, 3, "the repair of 9 and 10");
        let t1 = f.io.link.now;
        f.core.check_timers(&mut f.io, t1 + RESEND_AFTER[1], true);
        assert_eq!(f.io.link.sent.len(), asked, "a repair goes once");
    }

    /// A join whose query and its copies went where the publisher was not
    /// yet (a publisher that moves to this subscriber's broker a second
    /// after it) is asked again when the publisher's samples come, and
    /// given its time again from there: its history fills the gap, which
    /// was reported lost (the join gave up at 2 s, the last copy at
    /// 900 ms having found nobody).
    #[test]
    fn a_join_unanswered_is_asked_again_when_the_publishers_samples_come() {
        let mut f = fixture("sr/**", wants(2, true, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 10));
        let t0 = f.io.link.now;
        let first = f.io.link.sent[0].clone();
        let id = Query::decode(&first).unwrap().id.unwrap();
        f.core.check_timers(&mut f.io, t0 + RESEND_AFTER[0], true);
        f.core.check_timers(&mut f.io, t0 + RESEND_AFTER[1], true);
        assert_eq!(f.io.link.sent.len(), 3, "the query and its two copies");
        // The publisher is there 1.5 s after: its samples come, held.
        f.io.link.now = t0 + Duration::from_millis(1500);
        f.receive(sample("sr/a", 9));
        assert_eq!(f.io.link.sent.len(), 4, "asked again at once");
        assert_eq!(f.io.link.sent[3], first, "the same query, the same id");
        f.receive(sample("sr/a", 10));
        assert_eq!(f.io.link.sent.len(), 4, "once a join");
        assert!(seqs(&f.events()).is_empty(), "held for the reply");
        // Past the first 2 s: still waiting for the answer.
        f.core
            .check_timers(&mut f.io, t0 + Duration::from_millis(2500), true);
        assert!(f.events().is_empty(), "not given up");
        let reply = Reply {
            socket: "reliable".into(),
            keys: vec![KeyHistory {
                key: "sr/a".into(),
                first: 7,
                last: 10,
                entries: (7..=8).map(entry).collect(),
                replayed: false,
            }],
            done: true,
            id: Some(id),
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        f.receive(reply_frame(&reply));
        let ev = f.events();
        assert_eq!(seqs(&ev), [7, 8, 9, 10], "the kept ones, then the held");
        assert!(losses(&ev).is_empty(), "nothing reported lost");
        assert_eq!(f.counters.history_queries_resent.load(Relaxed), 3);
    }

    /// Out of view, only a key whose publication keeps history waits for
    /// the node to be shown again: a gap of its other keys is reported at
    /// once, their samples delivered.
    #[test]
    fn out_of_view_only_keys_with_history_wait() {
        let mut f = fixture("sr/**", wants(0, true, None));
        let a = publishing(&[
            ("sr/a", Reliability::Reliable, 10),
            ("sr/b", Reliability::Reliable, 0),
        ]);
        f.route(&a);
        for q in f.io.link.sent.clone() {
            f.receive(answer(&Query::decode(&q).unwrap(), Vec::new()));
        }
        f.receive(sample("sr/a", 1));
        f.receive(sample("sr/b", 1));
        f.events();
        assert!(f.core.set_target(routes_for(&f.core.expr, &[])));
        f.core.apply(&mut f.io);
        f.receive(sample("sr/b", 5));
        let ev = f.events();
        assert_eq!(seqs(&ev), [5], "no history: delivered at once");
        assert_eq!(losses(&ev), [(2, 3)]);
        f.receive(sample("sr/a", 5));
        let ev = f.events();
        assert!(seqs(&ev).is_empty() && losses(&ev).is_empty(), "{ev:?}");
    }

    /// A history reply's keys are the publisher's word: those the
    /// subscription does not match, or that are not keys (an escape
    /// sequence for the terminal that prints them), are dropped and
    /// counted, never delivered as samples.
    #[test]
    fn a_history_reply_delivers_only_keys_the_subscription_matches() {
        let mut f = fixture("sr/**", wants(5, false, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 10));
        let join = Query::decode(&f.io.link.sent[0]).unwrap();
        let kh = |key: &str| KeyHistory {
            key: key.into(),
            first: 1,
            last: 2,
            entries: (1..=2).map(entry).collect(),
            replayed: false,
        };
        f.receive(answer(
            &join,
            vec![kh("sr/a"), kh("other/x"), kh("sr/\u{1b}[2J")],
        ));
        let ev = f.events();
        let keys: Vec<&str> = ev
            .iter()
            .filter_map(|e| e.as_sample().map(|s| s.key.as_str()))
            .collect();
        assert_eq!(keys, ["sr/a", "sr/a"]);
        assert_eq!(f.counters.frames_malformed.load(Relaxed), 1);
    }

    /// A reliable subscription whose publisher left discovery (a broker
    /// or a partition out past the lease) and whose samples come again
    /// before discovery shows it (on a connection kept for its last
    /// samples, or through a broker that forwards before it tells): the
    /// sample that reveals a gap waits for the node to be shown again,
    /// and the gap is then repaired from its history rather than reported
    /// lost. One that is not shown again within the join's time goes on,
    /// the gap reported.
    #[test]
    fn a_gap_of_a_publisher_out_of_view_waits_for_it_to_be_shown_again_and_is_repaired() {
        const RE: &str = "tcp://127.0.0.1:5502";
        // Shown again with its connection kept, shown again after it
        // closed, never shown again.
        for case in ["kept", "closed", "never"] {
            let mut f = fixture("sr/**", wants(0, true, None));
            f.route(&announcement("sr/a", Reliability::Reliable, 10));
            let join = Query::decode(&f.io.link.sent[0]).unwrap();
            f.receive(answer(&join, Vec::new()));
            f.receive(sample("sr/a", 1));
            f.receive(sample("sr/a", 2));
            assert_eq!(seqs(&f.events()), [1, 2]);
            // Out of view; a sample in flight still comes.
            assert!(f.core.set_target(routes_for(&f.core.expr, &[])));
            f.core.apply(&mut f.io);
            f.receive(sample("sr/a", 3));
            assert_eq!(seqs(&f.events()), [3]);
            // Its samples come again, 4 to 8 missing: held, nothing lost.
            let t0 = f.io.link.now;
            f.receive(sample("sr/a", 9));
            f.receive(sample("sr/a", 10));
            let ev = f.events();
            assert!(seqs(&ev).is_empty() && losses(&ev).is_empty(), "{ev:?}");
            let sent = f.io.link.sent.len();
            if case == "never" {
                f.core.check_timers(&mut f.io, t0 + JOIN_TIMEOUT, true);
                let ev = f.events();
                assert_eq!(seqs(&ev), [9, 10], "given up: they go on");
                assert_eq!(losses(&ev), [(4, 5)], "and the gap is reported");
                assert_eq!(
                    f.io.link.sent.len(),
                    sent,
                    "nothing asked of a node out of view"
                );
                assert_eq!(f.counters.history_queries_unanswered.load(Relaxed), 0);
                continue;
            }
            if case == "closed" {
                f.core.connections_closed(&mut f.io, vec![RE.into()], t0);
                assert!(f.io.link.disconnected.contains(&RE.to_owned()));
            }
            // Shown again 1.5 s later: asked at once for what came after
            // 3, with 2 s of its own.
            f.io.link.now = t0 + Duration::from_millis(1500);
            f.route(&announcement("sr/a", Reliability::Reliable, 10));
            let connects = f.io.link.connected.iter().filter(|e| *e == RE).count();
            assert_eq!(connects, if case == "kept" { 1 } else { 2 }, "{case}");
            let q = Query::decode(f.io.link.sent.last().unwrap()).unwrap();
            assert_eq!(f.io.link.sent.len(), sent + 1);
            assert_eq!(q.since, [("sr/a".to_owned(), 3)]);
            f.core.check_timers(
                &mut f.io,
                t0 + JOIN_TIMEOUT + Duration::from_millis(100),
                true,
            );
            let ev = f.events();
            assert!(
                seqs(&ev).is_empty() && losses(&ev).is_empty(),
                "still waiting: {ev:?}"
            );
            let kept = KeyHistory {
                key: "sr/a".into(),
                first: 1,
                last: 10,
                entries: (4..=10).map(entry).collect(),
                replayed: false,
            };
            f.receive(answer(&q, vec![kept]));
            let ev = f.events();
            assert_eq!(seqs(&ev), [4, 5, 6, 7, 8, 9, 10], "{case}");
            assert!(losses(&ev).is_empty(), "{case}: {ev:?}");
        }
    }

    #[test]
    fn compressed_samples_and_batches_arrive_inflated_and_bad_ones_are_counted() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 0));
        let text = Value::from("beam current 12.5 mA; ".repeat(100));
        let zstd = crate::Compression::zstd();
        let compressed = |kind: Kind, seq: u64, plain: &[u8]| {
            let mut h = header(kind, seq, "lab");
            h.flags = FLAG_COMPRESSED;
            let body = zstd.deflate(&[plain]).expect("it shrinks");
            frame::encode(&Key::new("sr/a").unwrap(), &h, &body)
        };
        f.receive(compressed(Kind::Sample, 1, &cbor(&text)));
        let mut batch = Vec::new();
        for _ in 0..3 {
            frame::push_batch_entry(&mut batch, 7, &cbor(&text));
        }
        f.receive(compressed(Kind::Batch, 2, &batch));
        let ev = f.events();
        assert_eq!(seqs(&ev), [1, 2, 3, 4]);
        assert!(ev
            .iter()
            .filter_map(|e| e.as_sample())
            .all(|s| s.value == text));
        assert_eq!(f.counters.frames_inflated.load(Relaxed), 2);
        // One that would inflate past max_message_bytes, one whose data
        // are not zstd, a batch whose entries are bad once inflated: each
        // dropped and counted; the next sample shows the gap.
        let mut bomb = compressed(Kind::Sample, 5, &cbor(&text));
        let size_at = bomb.len() - (bomb.len() - frame::head_len(&Key::new("sr/a").unwrap())) + 1;
        bomb[size_at..size_at + 4].copy_from_slice(&(2u32 << 20).to_le_bytes());
        f.receive(bomb);
        let mut corrupt = compressed(Kind::Sample, 6, &cbor(&text));
        let n = corrupt.len();
        corrupt[n - 8..].copy_from_slice(&[0xff; 8]);
        f.receive(corrupt);
        f.receive(compressed(Kind::Batch, 7, &vec![0xee; 600]));
        assert_eq!(f.counters.frames_malformed.load(Relaxed), 3);
        assert_eq!(f.counters.frames_inflated.load(Relaxed), 2);
        f.receive(sample("sr/a", 8));
        assert_eq!(losses(&f.events()), [(5, 3)]);
    }

    /// A frame naming a dictionary the subscription does not know: the
    /// dictionary is asked of the key's socket, that frame and the node's
    /// later ones wait in order; a dictionary whose id is not its content's
    /// is refused; the right one lets them through. One that never comes:
    /// asked again after the timeout, then the frames are counted and the
    /// gap is reported.
    #[test]
    fn frames_wait_for_their_dictionary_in_order_and_are_counted_if_it_never_comes() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        let zstd = crate::Compression::zstd().dictionary().threshold(8);
        let dict = crate::engine::compress::Dictionary::default();
        let value = |i: u64| {
            Value::Map(vec![
                (Value::from("device"), Value::from("sr/ps/q17")),
                (Value::from("current"), Value::Float(120.0 + i as f64)),
            ])
        };
        // Train it, and keep the first body made with it.
        let mut trained = None;
        let mut body = None;
        for i in 0..crate::DICTIONARY_TRAINING_SAMPLES as u64 {
            let (b, t) = dict.deflate(&zstd, &[&cbor(&value(i))]);
            if t.is_some() {
                trained = t;
                body = b;
            }
        }
        let (trained, body) = (trained.expect("trained"), body.expect("it shrinks"));
        let with_dict = |seq: u64, body: &[u8]| {
            let mut h = header(Kind::Sample, seq, "lab");
            h.flags = FLAG_COMPRESSED;
            frame::encode(&Key::new("sr/a").unwrap(), &h, body)
        };
        let answer = |query: u64, id: u32, bytes: Bytes| {
            let r = Reply {
                socket: "best_effort".into(),
                keys: Vec::new(),
                done: true,
                id: Some(query),
                schemas: Vec::new(),
                dictionaries: vec![(id, bytes)],
            };
            reply_frame(&r)
        };
        let sent = f.io.link.sent.len();
        f.receive(with_dict(1, &body));
        f.receive(sample("sr/a", 2));
        assert!(f.events().is_empty(), "both wait for the dictionary");
        assert_eq!(f.io.link.sent.len(), sent + 1, "asked once");
        let q = Query::decode(&f.io.link.sent[sent]).unwrap();
        assert_eq!(
            (
                q.dictionaries.as_slice(),
                q.socket.as_str(),
                q.expr.as_str()
            ),
            (&[trained.id][..], "best_effort", "sr/a")
        );
        f.receive(answer(q.id.unwrap(), trained.id, trained.bytes.clone()));
        let ev = f.events();
        assert_eq!(seqs(&ev), [1, 2], "in order");
        let first = ev.iter().find_map(|e| e.as_sample()).unwrap();
        assert_eq!(first.value, value(127));
        assert_eq!(f.counters.dictionaries_learned.load(Relaxed), 1);
        assert_eq!(f.counters.frames_inflated.load(Relaxed), 1);
        // Known now: the next frame goes straight through.
        f.receive(with_dict(3, &body));
        assert_eq!(seqs(&f.events()), [3]);
        // An answer whose bytes are not its id's content: refused; the
        // frame that waited is counted, the gap reported by the next.
        let mut other = body.to_vec();
        other[5..9].copy_from_slice(&0x0bad_0bad_u32.to_le_bytes());
        f.receive(with_dict(4, &other));
        let q = Query::decode(f.io.link.sent.last().unwrap()).unwrap();
        assert_eq!(q.dictionaries, [0x0bad_0bad]);
        f.receive(answer(q.id.unwrap(), 0x0bad_0bad, trained.bytes.clone()));
        assert_eq!(f.counters.frames_malformed.load(Relaxed), 1);
        assert_eq!(f.counters.frames_unknown_dictionary.load(Relaxed), 1);
        f.receive(sample("sr/a", 5));
        let ev = f.events();
        assert_eq!((seqs(&ev), losses(&ev)), (vec![5], vec![(4, 1)]));
        // Asked lately: not asked again at once (the frame is counted);
        // after the back-off it is, and the frame waits; unanswered, it is
        // counted when the query times out.
        let sent = f.io.link.sent.len();
        f.receive(with_dict(6, &other));
        assert_eq!(f.io.link.sent.len(), sent, "not asked again yet");
        assert_eq!(f.counters.frames_unknown_dictionary.load(Relaxed), 2);
        let t = f.io.link.now + JOIN_TIMEOUT;
        f.io.link.now = t;
        f.receive(with_dict(7, &other));
        assert_eq!(f.io.link.sent.len(), sent + 1, "asked again");
        assert!(f.events().is_empty(), "7 waits");
        f.core.check_timers(&mut f.io, t + JOIN_TIMEOUT, true);
        assert_eq!(f.counters.frames_unknown_dictionary.load(Relaxed), 3);
        f.receive(sample("sr/a", 8));
        let ev = f.events();
        assert_eq!((seqs(&ev), losses(&ev)), (vec![8], vec![(6, 2)]));
    }

    #[test]
    fn an_unanswered_history_query_gives_up_and_goes_live() {
        let mut f = fixture("sr/**", wants(2, false, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 10));
        let t0 = f.io.link.now;
        f.receive(sample("sr/a", 9));
        assert!(seqs(&f.events()).is_empty(), "held for the answer");
        f.core.check_timers(
            &mut f.io,
            t0 + JOIN_TIMEOUT - Duration::from_millis(1),
            true,
        );
        assert!(seqs(&f.events()).is_empty());
        f.core.check_timers(&mut f.io, t0 + JOIN_TIMEOUT, true);
        let ev = f.events();
        assert_eq!(seqs(&ev), [9], "the held sample, once");
        assert!(ev.iter().any(|e| matches!(e, Event::SubscriptionLive)));
        assert_eq!(f.counters.history_queries_unanswered.load(Relaxed), 1);
    }

    #[test]
    fn a_deadline_counts_from_the_last_sample_of_its_key() {
        let d = Duration::from_millis(100);
        let mut f = fixture("sr/**", wants(0, false, Some(d)));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        f.receive(sample("sr/a", 1));
        f.io.link.now += Duration::from_millis(60);
        f.receive(sample("sr/a", 2));
        let t1 = f.io.link.now;
        f.core
            .check_timers(&mut f.io, t1 + d - Duration::from_millis(1), true);
        assert!(f
            .events()
            .iter()
            .all(|e| !matches!(e, Event::DeadlineMissed(_))));
        f.core.check_timers(&mut f.io, t1 + d, true);
        let ev = f.events();
        assert!(
            matches!(&ev[..], [Event::DeadlineMissed(m)] if m.silent_for == d),
            "{ev:?}"
        );
    }

    #[test]
    fn a_gap_history_can_fill_is_repaired_not_reported() {
        let mut f = fixture("sr/**", wants(0, true, None));
        f.route(&announcement("sr/a", Reliability::Reliable, 10));
        let reply = |entries: Vec<Entry>, last: u64| {
            let r = Reply {
                socket: "reliable".into(),
                keys: vec![KeyHistory {
                    key: "sr/a".into(),
                    first: 1,
                    last,
                    entries,
                    replayed: false,
                }],
                done: true,
                id: None,
                schemas: Vec::new(),
                dictionaries: Vec::new(),
            };
            reply_frame(&r)
        };
        // A reliable subscription joins first: nothing kept yet.
        assert_eq!(f.io.link.sent.len(), 1, "the join");
        f.receive(reply(Vec::new(), 0));
        f.receive(sample("sr/a", 1));
        f.receive(sample("sr/a", 3));
        assert_eq!(seqs(&f.events()), [1], "3 waits for the repair");
        assert_eq!(f.io.link.sent.len(), 2, "a repair query");
        let q = Query::decode(&f.io.link.sent[1]).unwrap();
        assert_eq!(q.since, [("sr/a".to_owned(), 1)]);
        let two = Entry {
            seq: 2,
            timestamp_ns: 1,
            encoding: Encoding::Cbor,
            schema_id: 0,
            payload: Bytes::from(cbor(&Value::Float(2.0))),
        };
        f.receive(reply(vec![two], 3));
        assert_eq!(seqs(&f.events()), [2, 3]);
        assert_eq!(f.counters.samples_lost.load(Relaxed), 0);
    }

    #[test]
    fn a_repair_asks_the_data_socket_the_publication_names() {
        // A publication on a data socket of its own (access control:
        // `reliable/2`): the repair named `reliable`, a socket that does
        // not keep its key, and the gap was reported lost.
        let mut f = fixture("sr/**", wants(0, true, None));
        let mut a = announcement("sr/a", Reliability::Reliable, 10);
        a.publications[0].socket = Some("reliable/2".into());
        a.publications[0].endpoint = Some("tcp://127.0.0.1:5599".into());
        f.route(&a);
        let reply = |entries: Vec<Entry>, last: u64| {
            reply_frame(&Reply {
                socket: "reliable/2".into(),
                keys: vec![KeyHistory {
                    key: "sr/a".into(),
                    first: 1,
                    last,
                    entries,
                    replayed: false,
                }],
                done: true,
                id: None,
                schemas: Vec::new(),
                dictionaries: Vec::new(),
            })
        };
        let join = Query::decode(&f.io.link.sent[0]).unwrap();
        assert_eq!(join.socket, "reliable/2");
        f.receive(reply(Vec::new(), 0));
        f.receive(sample("sr/a", 1));
        f.receive(sample("sr/a", 3));
        assert_eq!(f.io.link.sent.len(), 2, "a repair query");
        let q = Query::decode(&f.io.link.sent[1]).unwrap();
        assert_eq!(
            (q.socket.as_str(), q.since.as_slice()),
            ("reliable/2", &[("sr/a".to_owned(), 1)][..])
        );
        let two = Entry {
            seq: 2,
            timestamp_ns: 1,
            encoding: Encoding::Cbor,
            schema_id: 0,
            payload: Bytes::from(cbor(&Value::Float(2.0))),
        };
        f.receive(reply(vec![two], 3));
        assert_eq!(seqs(&f.events()), [1, 2, 3]);
        assert_eq!(f.counters.samples_lost.load(Relaxed), 0);
    }

    #[test]
    fn a_filtered_subscription_declares_its_filter_and_takes_only_filtered_frames() {
        let filter = milonga_wire::filter::Filter {
            abs_change: Some(1.0),
            ..Default::default()
        };
        let prefix = format!(
            "{}{}/",
            milonga_wire::filter::FILTERED_KEY_PREFIX,
            filter.id_for("sr/**")
        );
        let mut w = wants(0, false, None);
        w.filter = Some((filter.clone(), prefix.clone()));
        let mut f = fixture("sr/**", w);
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        let d = milonga_wire::filter::Declaration::decode(&f.io.link.sent[0]).unwrap();
        assert_eq!(
            (d.keys.as_str(), d.socket.as_str()),
            ("sr/**", "best_effort")
        );
        assert_eq!(d.filter, filter);
        // An unfiltered copy is not this subscription's.
        f.receive(sample("sr/a", 1));
        assert_eq!(f.counters.frames_filtered.load(Relaxed), 1);
        let key = Key::internal(format!("{prefix}sr/a")).unwrap();
        f.receive(frame::encode(
            &key,
            &header(Kind::Sample, 1, "lab"),
            &cbor(&Value::Float(1.0)),
        ));
        let ev = f.events();
        let keys: Vec<&str> = ev
            .iter()
            .filter_map(|e| e.as_sample().map(|s| s.key.as_str()))
            .collect();
        assert_eq!(keys, ["sr/a"], "under its own key");
    }

    #[test]
    fn a_heartbeat_that_is_not_a_map_and_a_forged_goodbye_are_counted_not_believed() {
        let mut f = fixture("sr/**", wants(0, false, None));
        f.route(&announcement("sr/a", Reliability::BestEffort, 0));
        let hb = Key::internal(frame::HEARTBEAT_KEY).unwrap();
        f.receive(frame::encode(
            &hb,
            &header(Kind::Heartbeat, 1, "lab"),
            &cbor(&Value::Float(1.0)),
        ));
        assert_eq!(f.counters.frames_malformed.load(Relaxed), 1);
        f.receive(sample("sr/a", 1));
        let bye = milonga_wire::heartbeat::Heartbeat {
            leaving: true,
            last: milonga_wire::heartbeat::Last::Keys(vec![(
                "sr/a".into(),
                2 + crate::engine::seq::MAX_SEQ_JUMP,
            )]),
        };
        f.receive(frame::encode(
            &hb,
            &header(Kind::Heartbeat, 2, "lab"),
            &bye.encode(),
        ));
        let now = f.io.link.now;
        f.core.connections_closed(&mut f.io, vec![BE.into()], now);
        assert!(losses(&f.events()).is_empty(), "no loss of 2^32 samples");
        assert_eq!(f.counters.sequence_jumps.load(Relaxed), 1);
    }

    #[test]
    fn an_unanswered_schema_or_dictionary_is_asked_again_after_a_doubling_back_off() {
        let mut asked = HashMap::new();
        let (a, b) = (NodeId([1; 16]), NodeId([2; 16]));
        let t0 = Instant::now();
        let mut at = t0;
        // Asked at once, then after JOIN_TIMEOUT x 1, 2, 4, 8, 16, 32, 32...
        for (n, wait) in [0u32, 1, 2, 4, 8, 16, 32, 32].into_iter().enumerate() {
            at += JOIN_TIMEOUT * wait;
            if wait > 0 {
                let early = at - Duration::from_millis(1);
                assert!(
                    !may_ask(&mut asked, false, (a, 7), early, 8),
                    "ask {n} early"
                );
            }
            assert!(may_ask(&mut asked, false, (a, 7), at, 8), "ask {n}");
            assert!(!may_ask(&mut asked, false, (a, 7), at, 8), "ask {n} twice");
        }
        // Known: never asked.
        assert!(!may_ask(&mut asked, true, (b, 1), t0, 8));
        // Full: this node's oldest ask makes room, never another node's
        // while this one has some.
        for id in 0..7 {
            assert!(may_ask(
                &mut asked,
                false,
                (b, id),
                t0 + Duration::from_millis(u64::from(id)),
                8
            ));
        }
        assert_eq!(asked.len(), 8);
        assert!(may_ask(&mut asked, false, (b, 100), at, 8));
        assert!(asked.contains_key(&(a, 7)) && !asked.contains_key(&(b, 0)));
        assert_eq!(asked.len(), 8);
    }

    /// Node `i` of [`many_nodes`].
    fn nth_node(i: u32) -> NodeId {
        let mut b = [7u8; 16];
        b[..4].copy_from_slice(&i.to_be_bytes());
        NodeId(b)
    }

    /// `n` nodes publishing `sr/a` best effort, each at endpoints of its
    /// own.
    fn many_nodes(n: u32) -> Vec<Announcement> {
        (0..n)
            .map(|i| {
                let mut a = announcement("sr/a", Reliability::BestEffort, 0);
                a.node_id = nth_node(i).to_hex();
                a.data_best_effort = Some(format!("tcp://127.0.0.1:{}", 10_000 + i));
                a.data_reliable = None;
                a.liveliness = Some(format!("tcp://127.0.0.1:{}", 30_000 + i));
                a
            })
            .collect()
    }

    #[test]
    fn at_most_1024_nodes_that_left_are_remembered_for_their_last_samples() {
        let mut f = fixture("sr/**", wants(0, false, None));
        let id = nth_node;
        let n = MAX_RECENTLY_GONE as u32 + 1;
        let nodes = many_nodes(n);
        let all: Vec<&Announcement> = nodes.iter().collect();
        assert!(f.core.set_target(routes_for(&f.core.expr, &all)));
        f.core.apply(&mut f.io);
        // The first leaves, then all the others: the first is let go.
        assert!(f.core.set_target(routes_for(&f.core.expr, &all[1..])));
        f.core.apply(&mut f.io);
        assert_eq!(f.io.recently_gone, [id(0)]);
        assert!(f.core.set_target(routes_for(&f.core.expr, &[])));
        f.core.apply(&mut f.io);
        assert_eq!(f.io.recently_gone.len(), MAX_RECENTLY_GONE);
        assert!(!f.io.recently_gone.contains(&id(0)));
        assert!(f.io.recently_gone.contains(&id(1)) && f.io.recently_gone.contains(&id(n - 1)));
    }

    #[test]
    fn past_the_limit_of_absent_publishers_the_oldest_is_forgotten_and_reported() {
        let mut f = fixture("sr/**", wants(0, false, None));
        let id = nth_node;
        let n = MAX_ABSENT_PUBLISHERS as u32 + 1;
        let nodes = many_nodes(n);
        let all: Vec<&Announcement> = nodes.iter().collect();
        assert!(f.core.set_target(routes_for(&f.core.expr, &all)));
        f.core.apply(&mut f.io);
        for i in 0..n {
            let mut h = header(Kind::Sample, 1, "lab");
            h.node_id = id(i);
            let key = Key::new("sr/a").unwrap();
            f.receive(frame::encode(&key, &h, &cbor(&Value::Float(1.0))));
        }
        assert_eq!(seqs(&f.events()).len(), n as usize);
        // All of them leave discovery: one too many to remember.
        assert!(f.core.set_target(routes_for(&f.core.expr, &[])));
        f.core.apply(&mut f.io);
        let forgotten: Vec<NodeId> = f
            .events()
            .iter()
            .filter_map(|e| match e {
                Event::PublisherLost(p) if p.reason == LostReason::Forgotten => Some(p.publisher),
                _ => None,
            })
            .collect();
        assert_eq!(forgotten, [id(0)], "the first in order, once");
        assert_eq!(f.counters.publisher_states_dropped.load(Relaxed), 1);
        assert_eq!(f.io.absent.len(), MAX_ABSENT_PUBLISHERS);
    }
}
