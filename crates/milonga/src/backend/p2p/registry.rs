//! Registry mode (docs/protocol.md §11.6, docs/discovery.md "A registry"):
//! peer-to-peer nodes keep their announcements in a broker's table and
//! learn the others' from it, while their data flows directly between
//! them. One address (`registry = tcp://HOST:PORT`) replaces a list of
//! peers, and no node asks every other: the route to thousands of nodes.
//!
//! The broker's side is [`Table`]: each node registers its announcement
//! and renews it every lease/3; the table numbers every change with a
//! version and sends each node the changes it has not acknowledged, a page
//! at a time ([`MAX_PAGE_ENTRIES`], [`MAX_PAGE_BYTES`]), the next once it
//! acknowledged the last. A node that stops renewing is removed after the
//! lease. The node's side is [`RegistrySource`], one of the node's
//! discovery sources.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use milonga_wire::broker::{
    self as wire, EntriesHeader, RegisterHeader, MAX_PAGE_BYTES, MAX_PAGE_ENTRIES,
};

use crate::backend::p2p::{zmq_io, ContextRef};
use crate::discovery::{pace, Announcement, Source};
use crate::model::error::OpenError;
use crate::model::node::NodeCore;
use crate::util::stats;

/// Most nodes one registry holds, over all its domains' tables; a node
/// beyond is refused with an error it logs (`registry_refused`).
pub(crate) const MAX_NODES: usize = 20_000;
/// Most bytes of announcements a broker's tables hold, over all its
/// domains (registered nodes'; those of its clients that registered
/// nodes see are counted in their domain's table).
pub(crate) const MAX_TABLE_BYTES: usize = 256 << 20;
/// Most removals listed; beyond, the oldest is forgotten (and a view older
/// than it is sent the whole table again).
const MAX_REMOVED: usize = MAX_NODES;
/// A page unacknowledged for this long is taken as lost: the next
/// `register` (a renewal) lets it go again.
const PAGE_LOST_AFTER: Duration = Duration::from_secs(1);
/// How long a removed node is listed as removed (in leases); a node whose
/// view is older is sent the whole table again.
const REMOVED_KEPT_LEASES: u32 = 10;

/// One registered node.
struct Entry {
    json: Vec<u8>,
    /// `util::fnv1a64` of `json`, which a node's renewal names.
    hash: u64,
    version: u64,
    expires: Instant,
    /// `json` read, for the broker's own use (`None`: not an announcement).
    parsed: Option<Announcement>,
    /// Put by the broker for one of its clients ([`Table::hold`]): no
    /// lease, removed by [`Table::release`].
    held: bool,
}

/// One node that registered (by its connection), and what it holds.
struct Registrant {
    node_id: String,
    /// The version its view is at (valid when `fresh`).
    have: u64,
    /// Its view is of this epoch and not older than the removals listed.
    fresh: bool,
    /// A page was sent and not acknowledged yet, at this instant.
    in_flight: Option<Instant>,
    /// No page before this ([`pace`]: pages are paced).
    next_at: Instant,
    last: Instant,
    /// The last reset page sent to it: when, and the version it brings
    /// the view to.
    reset_sent: Option<(Instant, u64)>,
    /// When a reset page it acknowledged was sent: a view rebuilt from
    /// empty since then holds no node removed before, so it goes on from
    /// the version it reached even below `floor` (a reset of several pages
    /// otherwise started over at each page whose versions were below the
    /// floor, for ever), for as long as removals are remembered. A reset
    /// page that was lost is not acknowledged: the next is a reset again.
    rebuilt_at: Option<Instant>,
}

/// One domain's registry, in a broker.
pub(crate) struct Table {
    epoch: u64,
    version: u64,
    lease: Duration,
    entries: HashMap<String, Entry>,
    /// Each node's latest change (registered, changed or removed), by
    /// version.
    by_version: BTreeMap<u64, String>,
    /// Removed nodes: the version of their removal, and when.
    removed: HashMap<String, (u64, Instant)>,
    /// Removals at or below this version are no longer listed.
    floor: u64,
    bytes: usize,
    /// How many entries are held for the broker's clients.
    held: usize,
    registrants: HashMap<Vec<u8>, Registrant>,
    /// Where the next round of pages starts (fairness under the budget).
    rotate: usize,
}

/// What [`Table::register`] refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The table holds as many nodes or bytes as it may.
    Full,
    /// The node id is one of the broker's clients' ([`Table::hold`]).
    Taken,
}

impl Table {
    pub(crate) fn new(lease: Duration) -> Table {
        Table {
            // Another number at each start, so that nodes tell a restarted
            // registry from the one whose versions they hold.
            epoch: rand_epoch(),
            version: 0,
            lease,
            entries: HashMap::new(),
            by_version: BTreeMap::new(),
            removed: HashMap::new(),
            floor: 0,
            bytes: 0,
            held: 0,
            registrants: HashMap::new(),
            rotate: 0,
        }
    }

    /// The number of its latest change.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// How many nodes it holds.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The bytes of the announcements it holds.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    fn bump(&mut self, node_id: &str, old: Option<u64>) -> u64 {
        if let Some(v) = old {
            self.by_version.remove(&v);
        }
        self.version += 1;
        self.by_version.insert(self.version, node_id.to_owned());
        self.version
    }

    /// A `register` from connection `who`; `total` is how many nodes the
    /// broker's tables hold in all. `Ok(false)`: the node is not in the
    /// table and sent no announcement (it should, `announce`).
    #[cfg(test)]
    pub(crate) fn register(
        &mut self,
        who: &[u8],
        header: &RegisterHeader,
        announcement: Option<Vec<u8>>,
        total: usize,
        now: Instant,
    ) -> Result<bool, Refused> {
        let bytes = self.bytes;
        self.register_in(who, header, announcement, (total, bytes), now)
    }

    /// [`Table::register`], with `total` the nodes and the bytes of
    /// announcements the broker's tables hold in all.
    pub(crate) fn register_in(
        &mut self,
        who: &[u8],
        header: &RegisterHeader,
        announcement: Option<Vec<u8>>,
        (total, total_bytes): (usize, usize),
        now: Instant,
    ) -> Result<bool, Refused> {
        let id = &header.node_id;
        if !self.registrants.contains_key(who) && self.registrants.len() >= MAX_NODES {
            return Err(Refused::Full);
        }
        if self.entries.get(id).is_some_and(|e| e.held) {
            return Err(Refused::Taken);
        }
        if let Some(json) = announcement {
            match self
                .entries
                .get(id)
                .map(|e| (e.json == json, e.version, e.json.len()))
            {
                Some((true, _, _)) => {}
                Some((false, _, len)) if total_bytes - len + json.len() > MAX_TABLE_BYTES => {
                    return Err(Refused::Full)
                }
                None if total >= MAX_NODES || total_bytes + json.len() > MAX_TABLE_BYTES => {
                    return Err(Refused::Full)
                }
                _ => self.put(id, json, false, now),
            }
        }
        // Known, and holding the announcement the node holds (a change
        // whose message was lost on a broken connection is asked again).
        let known = match self.entries.get_mut(id) {
            Some(e) => {
                e.expires = now + self.lease;
                header.announced == 0 || header.announced == e.hash
            }
            // Not registered (and no announcement came): asked for it, and
            // no place taken among the registrants (a connection naming
            // fresh ids without ever announcing one would fill them, and
            // newcomers be refused).
            None => return Ok(false),
        };
        let kept = self.lease * REMOVED_KEPT_LEASES;
        let r = self
            .registrants
            .entry(who.to_vec())
            .or_insert_with(|| Registrant {
                node_id: id.clone(),
                have: 0,
                fresh: false,
                in_flight: None,
                next_at: now,
                last: now,
                reset_sent: None,
                rebuilt_at: None,
            });
        if let Some((at, to)) = r.reset_sent {
            if header.epoch == self.epoch && header.have == to {
                r.rebuilt_at = Some(at);
                r.reset_sent = None;
            }
        }
        let rebuilt = r.rebuilt_at.is_some_and(|t| now.duration_since(t) < kept);
        let fresh = header.epoch == self.epoch
            && header.have <= self.version
            && (header.have >= self.floor || rebuilt);
        r.node_id.clone_from(id);
        // An acknowledgement (the view moved), or a page gone too long:
        // the next may go. A renewal that crossed the page does not send
        // it twice.
        let moved = header.have != r.have || fresh != r.fresh;
        if moved
            || r.in_flight
                .is_some_and(|at| now.duration_since(at) >= PAGE_LOST_AFTER)
        {
            r.in_flight = None;
        }
        r.have = header.have;
        r.fresh = fresh;
        r.last = now;
        Ok(known)
    }

    fn remove(&mut self, id: &str, now: Instant) {
        if let Some(e) = self.entries.remove(id) {
            self.bytes -= e.json.len();
            self.held -= usize::from(e.held);
            let version = self.bump(id, Some(e.version));
            self.removed.insert(id.to_owned(), (version, now));
            if self.removed.len() > MAX_REMOVED {
                // The oldest removal listed goes; views older than it get
                // the whole table.
                let oldest = self
                    .by_version
                    .iter()
                    .find(|(_, id)| self.removed.contains_key(*id))
                    .map(|(v, id)| (*v, id.clone()));
                if let Some((v, id)) = oldest {
                    self.removed.remove(&id);
                    self.by_version.remove(&v);
                    self.floor = self.floor.max(v);
                }
            }
        }
    }

    /// An `unregister`: the node leaves now (not one of the broker's
    /// clients, which their broker withdraws).
    pub(crate) fn unregister(&mut self, node_id: &str, now: Instant) {
        if self.entries.get(node_id).is_some_and(|e| e.held) {
            return;
        }
        self.remove(node_id, now);
        self.registrants.retain(|_, r| r.node_id != node_id);
    }

    /// Puts (or changes) the announcement of one of the broker's clients,
    /// at the broker's sockets, so that the registered nodes see it; it
    /// stays until [`Table::release`], whatever the lease.
    pub(crate) fn hold(&mut self, a: &Announcement, now: Instant) -> Result<(), Refused> {
        let id = &a.node_id;
        let json = a.to_json();
        let old = self
            .entries
            .get(id)
            .map(|e| (e.json == json && e.held, e.json.len()));
        match old {
            Some((true, _)) => {}
            Some((false, len)) if self.bytes - len + json.len() > MAX_TABLE_BYTES => {
                return Err(Refused::Full)
            }
            None if self.entries.len() >= MAX_NODES
                || self.bytes + json.len() > MAX_TABLE_BYTES =>
            {
                return Err(Refused::Full)
            }
            _ => self.put(id, json, true, now),
        }
        Ok(())
    }

    /// Puts `json` as `id`'s announcement (replacing any), as a change of
    /// its own; a registered one is read, a held one need not be.
    fn put(&mut self, id: &str, json: Vec<u8>, held: bool, now: Instant) {
        let previous = match self.entries.remove(id) {
            Some(e) => {
                self.bytes -= e.json.len();
                self.held -= usize::from(e.held);
                Some(e.version)
            }
            None => self.removed.remove(id).map(|(v, _)| v),
        };
        let version = self.bump(id, previous);
        self.bytes += json.len();
        self.held += usize::from(held);
        let parsed = if held {
            None
        } else {
            Announcement::from_json(&json).ok()
        };
        self.entries.insert(
            id.to_owned(),
            Entry {
                hash: crate::util::fnv1a64(&json),
                json,
                version,
                expires: now,
                parsed,
                held,
            },
        );
    }

    /// The key the announcement registered for `node_id` names (`None`
    /// in it: none), or `None` if no node of that id is registered.
    pub(crate) fn key_of(&self, node_id: &str) -> Option<Option<&str>> {
        let e = self.entries.get(node_id)?;
        Some(e.parsed.as_ref().and_then(|a| a.key.as_deref()))
    }

    /// Whether it holds `node_id` for one of the broker's clients.
    pub(crate) fn holds(&self, node_id: &str) -> bool {
        self.entries.get(node_id).is_some_and(|e| e.held)
    }

    /// Whether `node_id` is a node that registered (not a client held).
    pub(crate) fn is_registered(&self, node_id: &str) -> bool {
        self.entries.get(node_id).is_some_and(|e| !e.held)
    }

    /// How many nodes registered (not counting the clients held).
    pub(crate) fn registered_len(&self) -> usize {
        self.entries.len() - self.held
    }

    /// Withdraws what [`Table::hold`] put for `node_id` (a client gone).
    pub(crate) fn release(&mut self, node_id: &str, now: Instant) {
        if self.entries.get(node_id).is_some_and(|e| e.held) {
            self.remove(node_id, now);
        }
    }

    /// The announcements the nodes registered (not those held for the
    /// broker's clients), as read.
    pub(crate) fn registered(&self) -> impl Iterator<Item = &Announcement> {
        self.entries
            .values()
            .filter(|e| !e.held)
            .filter_map(|e| e.parsed.as_ref())
    }

    /// Removes the nodes whose lease ran out and forgets old removals;
    /// how many nodes expired.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        let gone: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| !e.held && e.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            self.remove(id, now);
        }
        let lease = self.lease;
        self.registrants
            .retain(|_, r| now.duration_since(r.last) <= lease);
        let keep = lease * REMOVED_KEPT_LEASES;
        let old: Vec<(String, u64)> = self
            .removed
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) > keep)
            .map(|(id, (v, _))| (id.clone(), *v))
            .collect();
        for (id, v) in old {
            self.removed.remove(&id);
            self.by_version.remove(&v);
            self.floor = self.floor.max(v);
        }
        gone.len()
    }

    /// The pages due at `now`: to each registrant with changes it has not
    /// seen, no page unacknowledged and its pace kept, the next page, until
    /// about `budget` bytes are out. Each is `(connection, frames after
    /// it)`.
    pub(crate) fn pages(&mut self, budget: usize, now: Instant) -> Vec<(Vec<u8>, Vec<Vec<u8>>)> {
        let mut due: Vec<&Vec<u8>> = self
            .registrants
            .iter()
            .filter(|(_, r)| {
                r.in_flight.is_none() && now >= r.next_at && (!r.fresh || r.have < self.version)
            })
            .map(|(who, _)| who)
            .collect();
        if due.is_empty() {
            return Vec::new();
        }
        due.sort();
        let start = self.rotate % due.len();
        due.rotate_left(start);
        let due: Vec<Vec<u8>> = due.into_iter().cloned().collect();
        let mut out = Vec::new();
        let mut spent = 0;
        for who in due {
            if spent >= budget {
                break;
            }
            self.rotate += 1;
            let r = &self.registrants[&who];
            let reset = !r.fresh;
            let (frames, to) = self.page(r.fresh, r.have);
            spent += frames.iter().map(Vec::len).sum::<usize>();
            let (version, pace) = (self.version, pace(self.entries.len()));
            if let Some(r) = self.registrants.get_mut(&who) {
                if reset {
                    r.reset_sent = Some((now, to));
                }
                r.in_flight = Some(now);
                // The rest of what is there now follows at once; later
                // changes wait for the pace.
                r.next_at = if to < version { now } else { now + pace };
            }
            out.push((who, frames));
        }
        out
    }

    /// The page after `have` (or, not `fresh`, the first of a reset), and
    /// the version it brings the view to.
    fn page(&self, fresh: bool, have: u64) -> (Vec<Vec<u8>>, u64) {
        let after = if fresh { have } else { 0 };
        let mut header = EntriesHeader {
            epoch: self.epoch,
            from: after,
            to: self.version,
            reset: !fresh,
            removed: Vec::new(),
            lease_ms: self.lease.as_millis() as u64,
            latest: self.version,
        };
        let mut frames = vec![wire::MAGIC.to_vec(), wire::ENTRIES.to_vec(), Vec::new()];
        let mut bytes = 0;
        for (v, id) in self.by_version.range(after + 1..) {
            if frames.len() - 3 + header.removed.len() >= MAX_PAGE_ENTRIES
                || bytes >= MAX_PAGE_BYTES
            {
                header.to = v - 1;
                break;
            }
            match self.entries.get(id) {
                Some(e) if bytes == 0 || bytes + e.json.len() <= MAX_PAGE_BYTES => {
                    bytes += e.json.len();
                    frames.push(e.json.clone());
                }
                Some(_) => {
                    header.to = v - 1;
                    break;
                }
                // Listed as removed only to a view that may hold it.
                None if fresh => header.removed.push(id.clone()),
                None => {}
            }
        }
        frames[2] = serde_json::to_vec(&header).unwrap_or_default();
        (frames, header.to)
    }
}

/// A registry epoch: a random number, not 0 (which a node sends before it
/// has any).
fn rand_epoch() -> u64 {
    match crate::backend::p2p::federation::new_id() {
        Ok(id) => u64::from_str_radix(&id[..15], 16).unwrap_or(1).max(1),
        // No random bytes: the clock, which differs from start to start.
        Err(_) => crate::util::now_ns().max(1),
    }
}

/// The node's side: one connection to each registry of `registry`.
pub(crate) struct RegistrySource {
    core: Arc<NodeCore>,
    /// This node's security is on: its registries are reached over CURVE.
    secured: bool,
    conns: Vec<Conn>,
    announcement: Vec<u8>,
    /// `util::fnv1a64` of `announcement`, named in every `register`.
    hash: u64,
    version: u64,
    /// Replies may wait: read in the next turn.
    readable: bool,
    // Declared last: the sockets above close before the context goes.
    _ctx: ContextRef,
}

/// One registry, and the view it gave.
struct Conn {
    endpoint: String,
    sock: zmq::Socket,
    epoch: u64,
    have: u64,
    view: BTreeMap<String, Announcement>,
    /// A reset being filled (pages until `to` reaches `latest`): the view
    /// in use stays until it is complete, so that peers do not vanish
    /// and come back while it fills.
    filling: Option<BTreeMap<String, Announcement>>,
    /// The view of a registry that started again (another epoch), still
    /// shown until `carry_until`: the nodes take a renewal each to be in
    /// the new table, and are not dropped meanwhile.
    carry: BTreeMap<String, Announcement>,
    carry_until: Option<Instant>,
    /// When the registry was last heard from.
    heard: Option<Instant>,
    next_renew: Instant,
    renew_every: Duration,
    lease: Duration,
    /// The announcement version the registry holds (`None`: send it with
    /// the next `register`).
    sent: Option<u64>,
    refused_logged: bool,
}

impl RegistrySource {
    /// Connects to every registry of the configuration (`registry`,
    /// each `tcp://HOST:PORT` or `NAME@tcp://HOST:PORT`). With this node's
    /// security on (`guard`), each connection is a CURVE client naming the
    /// registry's key: the one `NAME` gives (a name of the trust directory
    /// or a key in Z85), else this node's own (docs/discovery.md).
    pub(crate) fn new(
        core: Arc<NodeCore>,
        guard: Option<&crate::backend::p2p::curve::Guard>,
    ) -> Result<RegistrySource, OpenError> {
        use crate::backend::p2p::curve;
        let ctx = ContextRef::acquire();
        let mut conns = Vec::new();
        for spec in &core.cfg.registry {
            let (who, endpoint) = curve::split_peer(spec);
            let endpoint = endpoint.to_owned();
            let bad = |why: String| OpenError::Config {
                key: "registry".into(),
                why: format!("{spec}: {why}"),
            };
            let mut sock = ctx.socket(zmq::DEALER)?;
            match (guard, who) {
                (None, Some(_)) => {
                    return Err(bad("names a key, but this node's security is off".into()))
                }
                (None, None) => {}
                (Some(g), who) => {
                    let key = match who {
                        Some(w) => curve::resolve_key(g, w).ok_or_else(|| {
                            bad(format!(
                                "no key named {w} in the trust directory {}",
                                g.trust_dir().display()
                            ))
                        })?,
                        None => g.identity.public(),
                    };
                    curve::secure_client_to(g, &sock, key).map_err(|e| bad(e.to_string()))?;
                }
            }
            let err = |source: zmq::Error| OpenError::Socket {
                action: "connect",
                endpoint: endpoint.clone(),
                source: crate::model::error::IntoTransport::transport(source),
            };
            zmq_io::apply_common(&sock, &core.cfg).map_err(err)?;
            zmq_io::apply_leased(&mut sock, &core.cfg).map_err(err)?;
            sock.set_ipv6(true).map_err(err)?;
            sock.set_maxmsgsize((MAX_PAGE_BYTES + wire::MAX_REQUEST_BYTES) as i64)
                .map_err(err)?;
            // The `unregister` of a closing node gets a moment to leave.
            sock.set_linger(200).map_err(err)?;
            sock.connect(&endpoint).map_err(err)?;
            conns.push(Conn {
                endpoint,
                sock,
                epoch: 0,
                have: 0,
                view: BTreeMap::new(),
                filling: None,
                carry: BTreeMap::new(),
                carry_until: None,
                heard: None,
                next_renew: Instant::now(),
                renew_every: Duration::from_millis(core.cfg.heartbeat_interval_ms.max(1) as u64),
                lease: Duration::from_millis(core.cfg.heartbeat_timeout_ms.max(1) as u64),
                sent: None,
                refused_logged: false,
            });
        }
        Ok(RegistrySource {
            secured: guard.is_some(),
            core,
            conns,
            announcement: Vec::new(),
            hash: 0,
            version: 0,
            readable: true,
            _ctx: ctx,
        })
    }

    /// The node's announcement version it holds.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The node's announcement changed: registered again at the next turn.
    pub(crate) fn set_announcement(&mut self, version: u64, json: Vec<u8>) {
        self.version = version;
        self.hash = crate::util::fnv1a64(&json);
        if json.len() > milonga_wire::broker::MAX_ANNOUNCEMENT_BYTES {
            tracing::warn!(
                bytes = json.len(),
                "this node's announcement is too large for a registry (256 KiB): not registered"
            );
            self.announcement = Vec::new();
            return;
        }
        self.announcement = json;
    }

    /// Registers and waits up to `wait` for every registry's view (all its
    /// pages), so that the node knows the domain when `open` returns.
    pub(crate) fn first_view(&mut self, version: u64, announcement: Vec<u8>, wait: Duration) {
        self.set_announcement(version, announcement);
        let deadline = Instant::now() + wait;
        self.turn(Instant::now());
        while self
            .conns
            .iter()
            .any(|c| c.heard.is_none() || c.filling.is_some())
        {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                match self.secured {
                    true => tracing::warn!("a registry sent nothing in time: the node starts without its view (this node's security is on: its registry must be a broker with security on, holding the key named in registry = NAME@tcp://HOST:PORT, or this node's own)"),
                    false => tracing::warn!("a registry sent nothing in time: the node starts without its view"),
                }
                return;
            };
            let mut items = self.poll_items();
            let ms = i64::try_from(left.as_millis()).unwrap_or(i64::MAX).max(1);
            if matches!(zmq::poll(&mut items, ms), Ok(n) if n > 0) {
                drop(items);
                self.readable = true;
                self.turn(Instant::now());
            }
        }
    }

    /// What the node thread polls.
    pub(crate) fn poll_items(&self) -> Vec<zmq::PollItem<'_>> {
        self.conns
            .iter()
            .map(|c| c.sock.as_poll_item(zmq::POLLIN))
            .collect()
    }

    /// A poll found a reply waiting.
    pub(crate) fn mark_readable(&mut self) {
        self.readable = true;
    }

    /// Tells every registry the node is leaving.
    pub(crate) fn leave(&self) {
        let id = self.core.id.to_hex();
        for c in &self.conns {
            let req: [&[u8]; 4] = [
                wire::MAGIC,
                wire::UNREGISTER,
                self.core.domain.as_bytes(),
                id.as_bytes(),
            ];
            let _ = c.sock.send_multipart(req, zmq::DONTWAIT);
        }
    }
}

impl Conn {
    /// Sends `register` naming the announcement held (`hash`), with it
    /// when `with` is given.
    fn register(&mut self, core: &NodeCore, hash: u64, with: Option<&[u8]>) -> bool {
        let header = RegisterHeader {
            domain: core.domain.clone(),
            node_id: core.id.to_hex(),
            epoch: self.epoch,
            have: self.have,
            announced: hash,
        };
        let h = serde_json::to_vec(&header).unwrap_or_default();
        let mut req: Vec<&[u8]> = vec![wire::MAGIC, wire::REGISTER, &h];
        req.extend(with);
        self.sock.send_multipart(req, zmq::DONTWAIT).is_ok()
    }

    /// Applies one message; whether the view changed.
    fn read(&mut self, core: &NodeCore, hash: u64, frames: &[Vec<u8>], now: Instant) -> bool {
        let c = &core.counters;
        let (Some(m), Some(cmd)) = (frames.first(), frames.get(1)) else {
            stats::inc(&c.control_malformed);
            return false;
        };
        if m != wire::MAGIC {
            stats::inc(&c.control_malformed);
            return false;
        }
        if cmd == wire::ANNOUNCE {
            self.heard = Some(now);
            self.sent = None;
            self.next_renew = now;
            return false;
        }
        if cmd == wire::ERROR {
            self.heard = Some(now);
            if !self.refused_logged {
                self.refused_logged = true;
                let text = frames
                    .get(2)
                    .map(|t| String::from_utf8_lossy(t).into_owned());
                tracing::warn!(registry = %self.endpoint, why = ?text, "the registry refused this node");
            }
            return false;
        }
        let header = match frames
            .get(2)
            .map(|h| serde_json::from_slice::<EntriesHeader>(h))
        {
            Some(Ok(h)) if cmd == wire::ENTRIES => h,
            _ => {
                stats::inc(&c.control_malformed);
                return false;
            }
        };
        self.heard = Some(now);
        if header.lease_ms > 0 {
            self.renew_every = Duration::from_millis((header.lease_ms / 3).max(1)).min(
                Duration::from_millis(core.cfg.heartbeat_interval_ms.max(1) as u64),
            );
        }
        let continues = header.epoch == self.epoch && header.from == self.have;
        if !header.reset && !continues {
            // A page sent before the registry heard where this view is
            // (or of another epoch): the acknowledgement below says.
            self.register(core, hash, None);
            return false;
        }
        self.refused_logged = false;
        let mut changed = false;
        if header.reset {
            if header.epoch != self.epoch && self.epoch != 0 {
                // A registry that started again holds nothing of this node,
                // and only the nodes that renewed since: the view of before
                // stays shown for two leases, until they all have.
                self.sent = None;
                let old = std::mem::take(&mut self.view);
                self.carry.extend(old);
                self.carry_until = Some(now + 2 * self.lease);
            }
            self.epoch = header.epoch;
            self.filling = Some(BTreeMap::new());
        }
        let me = core.id.to_hex();
        let target = match &mut self.filling {
            Some(f) => f,
            None => &mut self.view,
        };
        for id in &header.removed {
            changed |= target.remove(id).is_some();
            changed |= self.carry.remove(id).is_some();
        }
        for raw in &frames[3..] {
            match Announcement::from_json(raw) {
                Ok(a) if a.domain != core.domain => stats::inc(&c.peers_foreign_domain),
                Ok(a) if a.node_id == me => {}
                Ok(mut a) => {
                    // A broker on a wildcard address holds its clients at
                    // its sockets, named with it and tagged with the
                    // client's id: reached at the address this node
                    // reached the registry at. (A peer-to-peer node's own
                    // endpoints, untagged, are left as it announced them.)
                    let tagged = |e: &str| e.contains('#');
                    if a.data_endpoints().any(tagged)
                        || a.liveliness.as_deref().is_some_and(tagged)
                        || a.services.iter().any(|s| tagged(&s.endpoint))
                    {
                        crate::backend::p2p::uplink::reached_all(&mut a, &self.endpoint);
                    }
                    if target.get(&a.node_id) != Some(&a) {
                        target.insert(a.node_id.clone(), a);
                        changed = true;
                    }
                }
                Err(_) => stats::inc(&c.announcements_malformed),
            }
        }
        self.have = header.to;
        if self.filling.is_some() {
            // Nothing shown changes until the reset is complete.
            changed = false;
            if header.to >= header.latest {
                let full = self.filling.take().unwrap_or_default();
                changed = full != self.view;
                self.view = full;
            }
        }
        // The acknowledgement: the next page comes after it.
        self.register(core, hash, None);
        changed
    }
}

impl Source for RegistrySource {
    fn turn(&mut self, now: Instant) -> bool {
        let mut changed = false;
        let readable = std::mem::take(&mut self.readable);
        for c in &mut self.conns {
            if readable {
                for _ in 0..64 {
                    let Ok(frames) = c.sock.recv_multipart(zmq::DONTWAIT) else {
                        break;
                    };
                    changed |= c.read(&self.core, self.hash, &frames, now);
                }
            }
            if c.carry_until.is_some_and(|t| now >= t) {
                c.carry_until = None;
                changed |= !c.carry.is_empty();
                c.carry.clear();
            }
            // The announcement goes only when the registry does not hold
            // this version: a renewal is its header alone.
            let announce = c.sent != Some(self.version);
            if (now >= c.next_renew || announce) && !self.announcement.is_empty() {
                let with = announce.then_some(self.announcement.as_slice());
                if c.register(&self.core, self.hash, with) && announce {
                    c.sent = Some(self.version);
                }
                c.next_renew = now + c.renew_every;
            }
        }
        changed
    }

    fn peers_into(&self, peers: &mut Vec<Announcement>) {
        for c in &self.conns {
            peers.extend(c.view.values().cloned());
            peers.extend(
                c.carry
                    .iter()
                    .filter(|(id, _)| !c.view.contains_key(*id))
                    .map(|(_, a)| a.clone()),
            );
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.conns
            .iter()
            .flat_map(|c| [Some(c.next_renew), c.carry_until])
            .flatten()
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(i: u32) -> (String, Vec<u8>) {
        let id = format!("{i:032x}");
        let json = format!(
            r#"{{"protocol":1,"domain":"lab","node_id":"{id}","name":"n{i}@h:1","host":"h","pid":1,"start_time":0,"control":"tcp://127.0.0.1:{}","publications":[]}}"#,
            1000 + i
        );
        (id, json.into_bytes())
    }

    fn header(t: &Table, id: &str, have: u64) -> RegisterHeader {
        RegisterHeader {
            domain: "lab".into(),
            node_id: id.into(),
            epoch: t.epoch,
            have,
            announced: 0,
        }
    }

    fn entries(frames: &[Vec<u8>]) -> (EntriesHeader, usize) {
        let h: EntriesHeader = serde_json::from_slice(&frames[2]).unwrap();
        (h, frames.len() - 3)
    }

    #[test]
    fn a_table_pages_its_changes_one_unacknowledged_page_at_a_time_and_lists_removals() {
        let now = Instant::now();
        let mut t = Table::new(Duration::from_secs(3));
        for i in 0..1000 {
            let (id, json) = ann(i);
            let who = id.as_bytes().to_vec();
            let mut h = header(&t, &id, 0);
            h.epoch = 0;
            t.register(&who, &h, Some(json), t.len(), now).unwrap();
        }
        assert_eq!(t.len(), 1000);
        // A newcomer that holds nothing gets a reset, page by page.
        let (me, json) = ann(5000);
        let who = b"me".to_vec();
        let mut h = header(&t, &me, 0);
        h.epoch = 0;
        t.register(&who, &h, Some(json), t.len(), now).unwrap();
        let mut seen = 0;
        let mut have = 0;
        let mut first = true;
        loop {
            let pages: Vec<_> = t
                .pages(usize::MAX, now)
                .into_iter()
                .filter(|(w, _)| *w == who)
                .collect();
            let Some((_, frames)) = pages.into_iter().next() else {
                break;
            };
            let (eh, n) = entries(&frames);
            assert_eq!(eh.reset, first);
            assert!(first || eh.from == have);
            assert!(n <= MAX_PAGE_ENTRIES);
            first = false;
            seen += n;
            have = eh.to;
            // Nothing more until acknowledged.
            assert!(t.pages(usize::MAX, now).iter().all(|(w, _)| *w != who));
            t.register(&who, &header(&t, &me, have), None, t.len(), now)
                .unwrap();
        }
        assert_eq!(seen, 1001);
        assert_eq!(have, t.version);
        // A removal is listed to a view that holds the node, once the pace
        // allows: not at once after a page that brought the view up to date.
        t.unregister(&ann(7).0, now);
        assert!(t.pages(usize::MAX, now).iter().all(|(w, _)| *w != who));
        let (_, frames) = t
            .pages(usize::MAX, now + pace(t.len()))
            .into_iter()
            .find(|(w, _)| *w == who)
            .unwrap();
        let (eh, n) = entries(&frames);
        assert_eq!((eh.removed, n), (vec![ann(7).0], 0));
        // An unchanged renewal is no change; a node that stops renewing is
        // removed after the lease.
        let v = t.version;
        t.register(&who, &header(&t, &me, v), Some(ann(5000).1), t.len(), now)
            .unwrap();
        assert_eq!(t.version, v);
        assert_eq!(t.expire(now + Duration::from_secs(4)), 1000);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_client_held_by_the_broker_is_paged_outlives_the_lease_and_leaves_when_released() {
        let now = Instant::now();
        let mut t = Table::new(Duration::from_secs(3));
        let (id, json) = ann(1);
        let who = id.as_bytes().to_vec();
        let mut h = header(&t, &id, 0);
        h.epoch = 0;
        t.register(&who, &h, Some(json), t.len(), now).unwrap();
        let client = Announcement::from_json(&ann(2).1).unwrap();
        t.hold(&client, now).unwrap();
        // Paged to the registered node, but not among the registered.
        let (_, frames) = t.pages(usize::MAX, now).into_iter().next().unwrap();
        assert_eq!(entries(&frames).1, 2);
        let have = entries(&frames).0.to;
        let registered: Vec<&str> = t.registered().map(|a| a.node_id.as_str()).collect();
        assert_eq!(registered, [id.as_str()]);
        // Holding it again unchanged is no change.
        let v = t.version;
        t.hold(&client, now).unwrap();
        assert_eq!(t.version, v);
        // The lease passes: the registered node goes, the held one stays
        // until released, and is then listed removed.
        let later = now + Duration::from_secs(4);
        assert_eq!(t.expire(later), 1);
        assert_eq!(t.len(), 1);
        let (id3, json3) = ann(3);
        let who3 = id3.as_bytes().to_vec();
        t.register(&who3, &header(&t, &id3, have), Some(json3), t.len(), later)
            .unwrap();
        t.release(&client.node_id, later);
        assert_eq!(t.len(), 1);
        let (_, frames) = t
            .pages(usize::MAX, later)
            .into_iter()
            .find(|(w, _)| *w == who3)
            .unwrap();
        assert!(entries(&frames).0.removed.contains(&client.node_id));
        // Releasing a registered node does nothing.
        t.release(&id3, later);
        assert_eq!(t.len(), 1);
        // Nobody registers in a client's place, nor unregisters it.
        t.hold(&client, later).unwrap();
        let h = header(&t, &client.node_id, 0);
        assert_eq!(
            t.register(b"x", &h, Some(ann(2).1), t.len(), later),
            Err(Refused::Taken)
        );
        t.unregister(&client.node_id, later);
        assert!(t.holds(&client.node_id));
        assert_eq!((t.len(), t.registered_len()), (2, 1));
    }

    #[test]
    fn a_full_table_refuses_and_a_stale_view_is_reset() {
        let now = Instant::now();
        let mut t = Table::new(Duration::from_secs(3));
        let (id, json) = ann(1);
        assert_eq!(
            t.register(
                b"a",
                &header(&t, &id, 0),
                Some(json.clone()),
                MAX_NODES,
                now
            ),
            Err(Refused::Full)
        );
        t.register(b"a", &header(&t, &id, 0), Some(json), 0, now)
            .unwrap();
        // Another epoch's view (a registry restarted): a reset.
        let mut h = header(&t, &id, 0);
        h.epoch = t.epoch + 1;
        assert_eq!(t.register(b"a", &h, None, 1, now), Ok(true));
        let (_, frames) = t.pages(usize::MAX, now).pop().unwrap();
        assert!(entries(&frames).0.reset);
        // A renewal without its announcement from a node the table does not
        // hold (removed, or never registered): it is asked for it.
        let (other, _) = ann(2);
        assert_eq!(
            t.register(b"b", &header(&t, &other, 0), None, 1, now),
            Ok(false)
        );
    }

    #[test]
    fn a_renewal_does_not_resend_a_page_in_flight_nor_hide_a_lost_change() {
        let now = Instant::now();
        let mut t = Table::new(Duration::from_secs(3));
        let (a, json_a) = ann(1);
        let (b, json_b) = ann(2);
        t.register(b"a", &header(&t, &a, 0), Some(json_a.clone()), 0, now)
            .unwrap();
        t.register(b"b", &header(&t, &b, 0), Some(json_b), 1, now)
            .unwrap();
        let sent = t.pages(usize::MAX, now);
        assert_eq!(sent.len(), 2);
        // a's renewal crosses its page: nothing goes twice, unless the
        // page has been out for PAGE_LOST_AFTER.
        let mut h = header(&t, &a, 0);
        h.epoch = 0;
        t.register(b"a", &h, None, 2, now).unwrap();
        assert!(t.pages(usize::MAX, now).is_empty());
        let later = now + PAGE_LOST_AFTER;
        t.register(b"a", &h, None, 2, later).unwrap();
        assert_eq!(t.pages(usize::MAX, later).len(), 1);
        // A renewal naming another announcement than the one held (a
        // change lost with its connection) is asked for it.
        let mut h = header(&t, &a, 0);
        h.announced = crate::util::fnv1a64(&json_a);
        assert_eq!(t.register(b"a", &h, None, 2, later), Ok(true));
        h.announced ^= 1;
        assert_eq!(t.register(b"a", &h, None, 2, later), Ok(false));
    }

    /// Renewals naming ids that are not registered, without ever an
    /// announcement, take no place among the registrants: past MAX_NODES
    /// of them, a real newcomer is still let in (it was refused `Full`).
    #[test]
    fn renewals_of_unknown_ids_take_no_place() {
        let now = Instant::now();
        let mut t = Table::new(Duration::from_secs(3));
        for i in 0..(MAX_NODES as u32 + 10) {
            let (id, _) = ann(i);
            let who = i.to_le_bytes();
            assert_eq!(
                t.register(&who, &header(&t, &id, 0), None, 0, now),
                Ok(false)
            );
        }
        assert!(t.registrants.is_empty());
        let (id, json) = ann(MAX_NODES as u32 + 20);
        assert_eq!(
            t.register(b"real", &header(&t, &id, 0), Some(json), 0, now),
            Ok(true)
        );
    }

    /// A newcomer to a table of more nodes than one page holds, once a
    /// removal was forgotten (`floor` above the stable nodes' versions),
    /// gets its whole view page by page: each page of its reset is
    /// acknowledged below the floor, and the next page goes on from there
    /// (it started the reset over, for ever).
    #[test]
    fn a_reset_of_several_pages_completes_below_the_floor() {
        let lease = Duration::from_secs(3);
        let now = Instant::now();
        let mut t = Table::new(lease);
        let n = MAX_PAGE_ENTRIES as u32 * 3;
        for i in 0..n {
            let (id, json) = ann(i);
            t.register(b"x", &header(&t, &id, 0), Some(json), i as usize, now)
                .unwrap();
        }
        // One leaves; ten leases later its removal is forgotten.
        let (gone, _) = ann(n);
        t.register(b"g", &header(&t, &gone, 0), Some(ann(n).1), n as usize, now)
            .unwrap();
        t.unregister(&gone, now);
        let later = now + lease * (REMOVED_KEPT_LEASES + 1);
        // (Those that stay renew.)
        for i in 0..n {
            let (id, _) = ann(i);
            t.register(b"x", &header(&t, &id, t.version), None, n as usize, later)
                .unwrap();
        }
        t.expire(later);
        assert!(t.floor > MAX_PAGE_ENTRIES as u64, "floor {}", t.floor);
        // The newcomer: acknowledges each page where it ends.
        let (me, json) = ann(n + 1);
        t.register(b"me", &header(&t, &me, 0), Some(json), n as usize, later)
            .unwrap();
        // Its first reset page is lost: it renews from where it was, and
        // gets a reset again (not pages after a view it never rebuilt).
        let first = t.pages(usize::MAX, later);
        assert!(first.iter().any(|(w, f)| w == b"me" && entries(f).0.reset));
        let later = later + PAGE_LOST_AFTER;
        t.register(b"me", &header(&t, &me, 0), None, n as usize, later)
            .unwrap();
        let (mut have, mut got, mut resets) = (0, 0, 0);
        for _ in 0..20 {
            let Some((_, frames)) = t
                .pages(usize::MAX, later)
                .into_iter()
                .find(|(who, _)| who == b"me")
            else {
                break;
            };
            let (h, k) = entries(&frames);
            if h.reset {
                resets += 1;
                got = 0;
            }
            got += k;
            have = h.to;
            t.register(b"me", &header(&t, &me, have), None, n as usize, later)
                .unwrap();
            if have >= h.latest {
                break;
            }
        }
        assert_eq!(resets, 1, "the reset started over");
        assert_eq!(have, t.version);
        assert_eq!(got, n as usize + 1, "every node, the newcomer too");
    }

    #[test]
    fn removals_and_bytes_stay_bounded_under_churn() {
        let now = Instant::now();
        let mut t = Table::new(Duration::from_secs(3));
        // A node that registers and leaves again and again under new ids
        // leaves at most MAX_REMOVED removals listed.
        for i in 0..(MAX_REMOVED as u32 + 100) {
            let (id, json) = ann(i);
            t.register(b"x", &header(&t, &id, 0), Some(json), 0, now)
                .unwrap();
            t.unregister(&id, now);
        }
        assert_eq!(t.removed.len(), MAX_REMOVED);
        assert!(t.floor > 0);
        // A registered node cannot grow its announcement past the table's
        // bytes: a change is held to the bound as a new node is.
        let (id, json) = ann(1);
        t.register(b"y", &header(&t, &id, 0), Some(json), 0, now)
            .unwrap();
        t.bytes = MAX_TABLE_BYTES - 10;
        let big = String::from_utf8(ann(1).1)
            .unwrap()
            .replace("n1@h:1", &"n".repeat(200));
        assert_eq!(
            t.register(b"y", &header(&t, &id, 0), Some(big.into_bytes()), 1, now),
            Err(Refused::Full)
        );
    }
}
