//! Brokers linked in a federation (docs/broker.md "Federation",
//! docs/protocol.md §11.5).
//!
//! Each broker floods a link-state record ([`Lsa`]): its links up and the
//! nodes it reaches without another broker (its clients, the
//! peer-to-peer nodes it sees). From the records every broker computes
//! the same spanning tree of the links (breadth first from the smallest
//! broker id, neighbours in id order), and data and subscriptions cross
//! only the links of that tree: a sample reaches each broker once, by the
//! one path the tree has, so no loop or duplicate can form in any graph
//! of links. A node that several brokers reach directly (brokers of one
//! host) enters the federation at the one of smallest id.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use milonga_wire::broker::{self as wire, Lsa, LsaDomain, PeerHeader};

use crate::backend::p2p::zmq_io::{self, ContextRef};
use crate::model::config::Config;
use crate::model::error::OpenError;

/// A link to a peer broker, up while its messages come.
struct Link {
    heard: Instant,
    /// Its public key (Z85), security on: the key of the connection its
    /// messages came on (the one named for it, for a dealer's answers),
    /// which its link sockets are reached with.
    key: Option<String>,
    /// The sequence number of each record last sent to it.
    told: BTreeMap<String, u64>,
    /// Its link XPUBs for this broker, by domain.
    their_out: BTreeMap<String, [String; 3]>,
}

/// A record of another broker, and when its number last grew.
struct Known {
    lsa: Lsa,
    fresh: Instant,
}

/// A DEALER to a `--peer-broker` this broker links to.
struct Dealer {
    addr: String,
    sock: zmq::Socket,
    /// The key it is reached with (Z85), security on.
    key: Option<String>,
    /// Security on: the reader of its handshake failures (a peer that
    /// refuses this broker's key, holds another, or has security off),
    /// which are otherwise silent retries.
    monitor: Option<zmq::Socket>,
    /// The broker that answered there last.
    peer: Option<String>,
}

/// This broker's part of a federation: its links, the records it knows,
/// the tree.
pub(crate) struct Federation {
    pub(crate) me: String,
    listen: String,
    lease: Duration,
    interval: Duration,
    dealers: Vec<Dealer>,
    links: BTreeMap<String, Link>,
    lsdb: BTreeMap<String, Known>,
    mine: Lsa,
    /// Security on: the keys (Z85) a broker's `peer` messages must come
    /// with: this broker's own and those its `--peer-broker`s name.
    designated: Option<BTreeSet<String>>,
    bumped: Instant,
    next_send: Instant,
    // Declared last: the sockets above close before the context goes.
    _ctx: ContextRef,
}

/// A new broker id: 32 random hex digits.
pub(crate) fn new_id() -> Result<String, OpenError> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id).map_err(|e| OpenError::Config {
        key: "broker id".into(),
        why: format!("no random bytes: {e}"),
    })?;
    Ok(milonga_wire::frame::NodeId(id).to_hex())
}

/// Most links a broker keeps up at once (a peer beyond is not answered).
const MAX_LINKS: usize = 64;

/// `tcp://HOST:PORT` from `HOST:PORT` or itself.
fn tcp(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("tcp://{addr}")
    }
}

/// A `--peer-broker` as the key it names, if any (`NAME@` or `KEY@`, as
/// a static peer's, docs/security.md), and its listen endpoint.
pub(crate) fn peer_spec(spec: &str) -> (Option<String>, String) {
    use crate::backend::p2p::curve::{PublicKey, Z85_KEY_CHARS};
    // A Z85 key may hold '@', ':' and '/': it is known by its length.
    let key = spec.get(..Z85_KEY_CHARS).filter(|k| {
        spec.as_bytes().get(Z85_KEY_CHARS) == Some(&b'@') && PublicKey::from_z85(k).is_ok()
    });
    let (who, ep) = match key {
        Some(k) => (Some(k), &spec[Z85_KEY_CHARS + 1..]),
        // A name has no '@', nor an endpoint.
        None => match spec.split_once('@') {
            Some((who, ep)) if !who.contains("://") => (Some(who), ep),
            _ => (None, spec),
        },
    };
    (who.map(str::to_owned), tcp(ep))
}

impl Federation {
    /// A federation member with links to `peers` (`tcp://HOST:PORT` or
    /// `HOST:PORT`, their listen endpoints).
    ///
    /// With security on (`guard`, the broker's), each is reached with the
    /// key it names (`NAME@HOST:PORT`, a name of the trust directory or a
    /// key in Z85), else with this broker's own, and only those keys may
    /// link to this broker (docs/broker.md "Federation with security").
    pub(crate) fn new(
        me: String,
        listen: &str,
        peers: &[String],
        cfg: &Config,
        lease: Duration,
        interval: Duration,
        guard: Option<&crate::backend::p2p::curve::Guard>,
    ) -> Result<Federation, OpenError> {
        use crate::backend::p2p::curve::{resolve_key, ClientKeys};
        let ctx = ContextRef::acquire();
        let mut dealers = Vec::new();
        let own = guard.map(|g| g.identity.public().to_z85());
        let mut designated = own.iter().cloned().collect::<BTreeSet<String>>();
        for p in peers {
            let (who, addr) = peer_spec(p);
            let bad = |why: String| OpenError::Config {
                key: "peer-broker".into(),
                why: format!("{p}: {why}"),
            };
            let key = match (guard, who) {
                (None, Some(_)) => {
                    return Err(bad("names a key, but this broker's security is off".into()))
                }
                (None, None) => None,
                (Some(g), None) => Some(g.identity.public()),
                (Some(g), Some(who)) => Some(resolve_key(g, &who).ok_or_else(|| {
                    bad(format!(
                        "no key named {who} in the trust directory {}",
                        g.trust_dir().display()
                    ))
                })?),
            };
            let err = |source: zmq::Error| OpenError::Socket {
                action: "connect to a peer broker at",
                endpoint: addr.clone(),
                source: crate::model::error::IntoTransport::transport(source),
            };
            let mut sock = ctx.socket(zmq::DEALER)?;
            let mut monitor = None;
            if let (Some(g), Some(k)) = (guard, key) {
                ClientKeys::new(&g.identity, k).apply(&sock).map_err(err)?;
                designated.insert(k.to_z85());
                // Before the connect, so that no failure goes unseen.
                monitor = Some(crate::backend::p2p::uplink::handshake_monitor(&ctx, &sock)?);
            }
            zmq_io::apply_common(&sock, cfg).map_err(err)?;
            zmq_io::apply_leased(&mut sock, cfg).map_err(err)?;
            sock.set_maxmsgsize(wire::MAX_REQUEST_BYTES as i64)
                .map_err(err)?;
            // A message for a peer that is not there is not kept for it:
            // the next one says all there is to say.
            sock.set_immediate(true).map_err(err)?;
            sock.set_sndhwm(4).map_err(err)?;
            sock.set_ipv6(true).map_err(err)?;
            sock.connect(&addr).map_err(err)?;
            dealers.push(Dealer {
                addr,
                sock,
                key: key.map(|k| k.to_z85()),
                monitor,
                peer: None,
            });
        }
        let now = Instant::now();
        Ok(Federation {
            mine: Lsa {
                broker: me.clone(),
                seq: 1,
                key: own,
                ..Lsa::default()
            },
            designated: guard.is_some().then_some(designated),
            me,
            listen: listen.to_owned(),
            lease,
            interval,
            dealers,
            links: BTreeMap::new(),
            lsdb: BTreeMap::new(),
            bumped: now,
            next_send: now,
            _ctx: ctx,
        })
    }

    /// The DEALERs to poll for answers.
    pub(crate) fn poll_items(&self) -> Vec<zmq::PollItem<'_>> {
        self.dealers
            .iter()
            .map(|d| d.sock.as_poll_item(zmq::POLLIN))
            .collect()
    }

    /// Reads the answers waiting on dealer `i`; how many were malformed.
    pub(crate) fn read_dealer(&mut self, i: usize, now: Instant) -> u64 {
        let mut malformed = 0;
        for _ in 0..64 {
            let Some(d) = self.dealers.get(i) else {
                return malformed;
            };
            let Ok(frames) = d.sock.recv_multipart(zmq::DONTWAIT) else {
                return malformed;
            };
            match wire::BrokerRequest::decode(&frames) {
                Ok(wire::BrokerRequest::Peer { header, lsas }) => {
                    let mut key = None;
                    if let Some(d) = self.dealers.get_mut(i) {
                        d.peer = Some(header.broker.clone());
                        key.clone_from(&d.key);
                    }
                    let _ = self.take(header, lsas, now, key);
                }
                Ok(_) | Err(_) => malformed += 1,
            }
        }
        malformed
    }

    /// Whether a `peer` message that came with `user` (the key of its
    /// connection, security on) may be taken: security off, any; on, only
    /// a key this broker names as a peer broker, or its own.
    pub(crate) fn designated(&self, user: Option<&str>) -> bool {
        match &self.designated {
            None => true,
            Some(keys) => user.is_some_and(|u| keys.contains(u)),
        }
    }

    /// Takes a peer's message in (a request on the listen ROUTER, or the
    /// answer to one of ours), that came with `key` (its connection's,
    /// security on); whether it is a peer to answer.
    pub(crate) fn take(
        &mut self,
        header: PeerHeader,
        lsas: Vec<Lsa>,
        now: Instant,
        key: Option<String>,
    ) -> bool {
        if header.broker == self.me {
            // A broker listed as its own peer.
            return false;
        }
        if !self.links.contains_key(&header.broker) && self.links.len() >= MAX_LINKS {
            limited!(warn, peer = %header.broker, "a broker with {MAX_LINKS} federation links refused another");
            return false;
        }
        let link = self
            .links
            .entry(header.broker.clone())
            .or_insert_with(|| {
                tracing::info!(peer = %header.broker, listen = %header.listen, "a federation link is up");
                Link {
                    heard: now,
                    key: None,
                    told: BTreeMap::new(),
                    their_out: BTreeMap::new(),
                }
            });
        link.heard = now;
        if key.is_some() {
            link.key = key;
        }
        link.their_out = header.links;
        for l in lsas {
            // What the peer told need not be told back to it (at most
            // what a message carries; pruned in `tick`).
            if link.told.len() < 4 * wire::MAX_LSAS || link.told.contains_key(&l.broker) {
                link.told.insert(l.broker.clone(), l.seq);
            }
            if l.broker == self.me {
                continue;
            }
            // Its own record and these fit in one message.
            let room = self.lsdb.len() < wire::MAX_LSAS - 1;
            match self.lsdb.get_mut(&l.broker) {
                Some(k) if k.lsa.seq >= l.seq => {}
                Some(k) => {
                    k.lsa = l;
                    k.fresh = now;
                }
                None if room => {
                    self.lsdb
                        .insert(l.broker.clone(), Known { lsa: l, fresh: now });
                }
                None => {
                    limited!(
                        warn,
                        "a federation of more brokers than a broker keeps: a record was dropped"
                    );
                }
            }
        }
        true
    }

    /// The message for `peer` (unknown yet: everything): its header with
    /// this broker's link XPUBs for it (`out`, by domain), and the records
    /// it was not told yet; and what to note as told once it is sent
    /// ([`Federation::told`]).
    pub(crate) fn message_for(
        &self,
        peer: Option<&str>,
        out: &BTreeMap<String, [String; 3]>,
    ) -> (Vec<Vec<u8>>, Vec<(String, u64)>) {
        let header = PeerHeader {
            broker: self.me.clone(),
            listen: self.listen.clone(),
            links: out.clone(),
        };
        let mut frames = vec![
            wire::MAGIC.to_vec(),
            wire::PEER.to_vec(),
            serde_json::to_vec(&header).unwrap_or_default(),
        ];
        let all = std::iter::once(&self.mine).chain(self.lsdb.values().map(|k| &k.lsa));
        let told = peer.and_then(|p| self.links.get(p)).map(|l| &l.told);
        let mut sent = Vec::new();
        for l in all {
            if Some(l.broker.as_str()) == peer
                || told.is_some_and(|t| t.get(&l.broker) == Some(&l.seq))
            {
                continue;
            }
            let json = serde_json::to_vec(l).unwrap_or_default();
            if json.len() > wire::MAX_REQUEST_BYTES {
                limited!(warn, broker = %l.broker, bytes = json.len(), "a link-state record is over 1 MiB (its announcements): not sent, the federation does not see those nodes");
                continue;
            }
            frames.push(json);
            sent.push((l.broker.clone(), l.seq));
        }
        (frames, sent)
    }

    /// Notes that `peer` was sent these records.
    pub(crate) fn told(&mut self, peer: &str, sent: Vec<(String, u64)>) {
        if let Some(l) = self.links.get_mut(peer) {
            l.told.extend(sent);
        }
    }

    /// Keeps time: forgets silent links and records, renews this broker's
    /// record with `domains` (what it reaches directly), and sends each
    /// peer it dials its message (`out(peer)`: the link XPUBs for it).
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        domains: BTreeMap<String, LsaDomain>,
        out: impl Fn(&str) -> BTreeMap<String, [String; 3]>,
    ) {
        let lease = self.lease;
        self.links.retain(|id, l| {
            let up = now.duration_since(l.heard) <= lease;
            if !up {
                tracing::warn!(peer = %id, "a federation link went silent: down");
            }
            up
        });
        self.lsdb
            .retain(|_, k| now.duration_since(k.fresh) <= lease);
        // What each peer was told of brokers no longer known goes too (a
        // peer naming ever new brokers must not grow it without end).
        let (me, lsdb) = (&self.me, &self.lsdb);
        for l in self.links.values_mut() {
            l.told.retain(|b, _| b == me || lsdb.contains_key(b));
        }
        let neighbors: Vec<String> = self.links.keys().cloned().collect();
        if neighbors != self.mine.neighbors
            || domains != self.mine.domains
            || now.duration_since(self.bumped) >= lease / 3
        {
            self.mine.neighbors = neighbors;
            self.mine.domains = domains;
            self.mine.seq += 1;
            self.bumped = now;
        }
        if now < self.next_send {
            return;
        }
        self.next_send = now + self.interval;
        for i in 0..self.dealers.len() {
            let peer = self.dealers[i].peer.clone();
            let eps = peer.as_deref().map(&out).unwrap_or_default();
            let (msg, sent) = self.message_for(peer.as_deref(), &eps);
            let d = &self.dealers[i];
            if d.sock.send_multipart(msg, zmq::DONTWAIT).is_err() {
                tracing::trace!(peer = %d.addr, "a peer broker is not reachable now");
            } else if let Some(p) = peer {
                self.told(&p, sent);
            }
        }
    }

    /// Reads the handshake failures of the dials to peer brokers (security
    /// on), logs them (rate-limited) with what they likely mean, and
    /// returns how many there were.
    pub(crate) fn handshake_failures(&self) -> u64 {
        let mut n = 0;
        for d in &self.dealers {
            let Some(m) = &d.monitor else { continue };
            while let Ok(frames) = m.recv_multipart(zmq::DONTWAIT) {
                let (event, _) = zmq_io::monitor_event(&frames);
                let why = match u32::try_from(event).unwrap_or(0) {
                    zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH => {
                        "it refused this broker's key (not in its trust directory)"
                    }
                    _ => "is its security on, and does it hold the key named for it (NAME@ in --peer-broker)?",
                };
                n += 1;
                limited!(warn, peer = %d.addr, "the secured handshake with a peer broker failed: {why}");
            }
        }
        n
    }

    /// The key of peer `peer`'s link sockets (Z85), security on.
    pub(crate) fn peer_key(&self, peer: &str) -> Option<&str> {
        self.links.get(peer)?.key.as_deref()
    }

    /// The key broker `id` of the federation told in its record (Z85),
    /// security on: its calls socket's.
    pub(crate) fn broker_key(&self, id: &str) -> Option<&str> {
        self.lsdb.get(id)?.lsa.key.as_deref()
    }

    /// The links up now, with the XPUBs each peer told for `domain`.
    pub(crate) fn peer_out(&self, peer: &str, domain: &str) -> Option<&[String; 3]> {
        self.links.get(peer)?.their_out.get(domain)
    }

    /// How many links are up.
    pub(crate) fn links_up(&self) -> usize {
        self.links.len()
    }

    /// How many other brokers' records it keeps.
    pub(crate) fn known(&self) -> usize {
        self.lsdb.len()
    }

    /// The links of the spanning tree at this broker: to its parent and
    /// its children, among the links up.
    pub(crate) fn tree_links(&self) -> BTreeSet<String> {
        let mut lists: BTreeMap<&str, &[String]> = self
            .lsdb
            .values()
            .map(|k| (k.lsa.broker.as_str(), k.lsa.neighbors.as_slice()))
            .collect();
        lists.insert(&self.me, &self.mine.neighbors);
        tree_neighbors(&self.me, &lists)
    }

    /// The other brokers' records, freshest known.
    pub(crate) fn others(&self) -> impl Iterator<Item = &Lsa> {
        self.lsdb.values().map(|k| &k.lsa)
    }
}

impl Drop for Dealer {
    /// Before its monitor's reader closes, whatever drops it (the
    /// federation, or an error while it is built): libzmq's I/O thread
    /// sends monitor events with a blocking send.
    fn drop(&mut self) {
        if self.monitor.is_some() {
            zmq_io::stop_monitor(&mut self.sock);
        }
    }
}

/// The neighbours of `me` in the spanning tree of the graph whose
/// vertices are the brokers of `lists` and whose edges are the links both
/// ends list: breadth first from the smallest id of `me`'s component,
/// neighbours taken in id order. Every broker with the same records
/// computes the same tree.
fn tree_neighbors(me: &str, lists: &BTreeMap<&str, &[String]>) -> BTreeSet<String> {
    let linked = |a: &str, b: &str| {
        lists.get(a).is_some_and(|l| l.iter().any(|x| x == b))
            && lists.get(b).is_some_and(|l| l.iter().any(|x| x == a))
    };
    let neighbours = |a: &str| -> Vec<String> {
        let mut n: Vec<String> = lists
            .get(a)
            .map(|l| l.iter().filter(|b| linked(a, b)).cloned().collect())
            .unwrap_or_default();
        n.sort();
        n.dedup();
        n
    };
    // The component of `me`, then its smallest id.
    let mut seen = BTreeSet::from([me.to_owned()]);
    let mut queue = VecDeque::from([me.to_owned()]);
    while let Some(a) = queue.pop_front() {
        for b in neighbours(&a) {
            if seen.insert(b.clone()) {
                queue.push_back(b);
            }
        }
    }
    let Some(root) = seen.iter().next().cloned() else {
        return BTreeSet::new();
    };
    let mut parent: BTreeMap<String, String> = BTreeMap::new();
    let mut visited = BTreeSet::from([root.clone()]);
    let mut queue = VecDeque::from([root]);
    while let Some(a) = queue.pop_front() {
        for b in neighbours(&a) {
            if visited.insert(b.clone()) {
                parent.insert(b.clone(), a.clone());
                queue.push_back(b);
            }
        }
    }
    let mut out: BTreeSet<String> = parent
        .iter()
        .filter(|(_, p)| p.as_str() == me)
        .map(|(c, _)| c.clone())
        .collect();
    if let Some(p) = parent.get(me) {
        out.insert(p.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `--peer-broker` names a key by a name or a Z85 key before `@`,
    /// with or without the scheme; without `@`, none.
    #[test]
    fn a_peer_broker_names_its_key_before_the_at_sign() {
        let key = crate::backend::p2p::curve::Identity::generate("k")
            .unwrap()
            .public()
            .to_z85();
        let cases = [
            ("h:7447", None, "tcp://h:7447"),
            ("tcp://h:7447", None, "tcp://h:7447"),
            ("site-b@h:7447", Some("site-b"), "tcp://h:7447"),
            ("site-b@tcp://h:7447", Some("site-b"), "tcp://h:7447"),
            (&format!("{key}@h:7447"), Some(key.as_str()), "tcp://h:7447"),
            (
                &format!("{key}@tcp://[::1]:7447"),
                Some(key.as_str()),
                "tcp://[::1]:7447",
            ),
        ];
        for (spec, who, ep) in cases {
            assert_eq!(
                peer_spec(spec),
                (who.map(str::to_owned), ep.to_owned()),
                "{spec}"
            );
        }
    }

    /// The tree edges of a graph given as `a-b` pairs, from every vertex's
    /// own computation.
    fn tree(edges: &[(&str, &str)]) -> BTreeSet<(String, String)> {
        let mut adj: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (a, b) in edges {
            adj.entry(a).or_default().push((*b).to_owned());
            adj.entry(b).or_default().push((*a).to_owned());
        }
        let lists: BTreeMap<&str, &[String]> =
            adj.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let mut out = BTreeSet::new();
        for v in lists.keys() {
            for n in tree_neighbors(v, &lists) {
                // Each end must agree the edge is in the tree.
                assert!(
                    tree_neighbors(&n, &lists).contains(*v),
                    "{v} takes {n}-{v} as a tree edge, {n} does not"
                );
                let (a, b) = if *v < n.as_str() {
                    (v.to_string(), n)
                } else {
                    (n, v.to_string())
                };
                out.insert((a, b));
            }
        }
        out
    }

    #[test]
    fn every_broker_computes_the_same_spanning_tree_of_a_triangle_a_ring_and_a_mesh() {
        let t = tree(&[("a", "b"), ("b", "c"), ("c", "a")]);
        assert_eq!(t.len(), 2, "{t:?}");
        assert!(t.contains(&("a".into(), "b".into())) && t.contains(&("a".into(), "c".into())));
        let ring = tree(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]);
        assert_eq!(ring.len(), 3, "a tree of 4 vertices: {ring:?}");
        let mesh: Vec<(&str, &str)> = ["a", "b", "c", "d", "e"]
            .iter()
            .flat_map(|x| ["a", "b", "c", "d", "e"].iter().map(move |y| (*x, *y)))
            .filter(|(x, y)| x < y)
            .collect();
        let m = tree(&mesh);
        assert_eq!(m.len(), 4, "{m:?}");
        // Every vertex is in it (connected, 4 edges on 5 vertices).
        let touched: BTreeSet<&String> = m.iter().flat_map(|(a, b)| [a, b]).collect();
        assert_eq!(touched.len(), 5);
    }

    #[test]
    fn a_link_only_one_end_lists_is_not_in_the_tree() {
        let a = vec!["b".to_owned()];
        let b: Vec<String> = Vec::new();
        let lists: BTreeMap<&str, &[String]> =
            BTreeMap::from([("a", a.as_slice()), ("b", b.as_slice())]);
        assert!(tree_neighbors("a", &lists).is_empty());
        assert!(tree_neighbors("b", &lists).is_empty());
    }

    #[test]
    fn a_broken_ring_is_a_line_and_two_parts_are_two_trees() {
        let line = tree(&[("a", "b"), ("b", "c"), ("c", "d")]);
        assert_eq!(line.len(), 3);
        let two = tree(&[("a", "b"), ("c", "d")]);
        assert_eq!(two.len(), 2, "{two:?}");
    }
}
