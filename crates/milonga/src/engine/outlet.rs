//! What the publishers of one data socket share, apart from the socket:
//! the subscriptions its subscribers hold, the batch waiting for room,
//! the samples kept for history, the filters subscribers declared, and
//! the rate at which history queries are answered. It reads the messages
//! subscribers send upstream and says what to send back; the backend
//! sends it.

use std::collections::HashMap;

use milonga_wire::cbor::Encoded;
use milonga_wire::history::Reply;

use super::batch::Pending;
use super::filters::PubFilter;
use super::history::{Answer, Kept, QueryBudget};
use super::Me;
use crate::model::qos::Reliability;
use crate::util::stats;

/// The state of one data socket's publications (see the module comment).
pub(crate) struct Outlet {
    /// Subscription prefix -> number of subscribers holding it.
    pub(super) subscriptions: HashMap<Vec<u8>, u32>,
    /// Samples of a reliable publisher waiting for the socket as one batch.
    pub(super) pending: Option<Pending>,
    /// The socket's name in history queries and filter declarations: its
    /// reliability's, or for another socket of that reliability (access
    /// control) `<reliability>/<number>`.
    pub(crate) name: String,
    /// Samples kept per key, for publishers with history.
    pub(super) histories: HashMap<String, Kept>,
    /// Filters declared by subscribers, by id.
    pub(super) filters: HashMap<String, PubFilter>,
    /// History replies sent, numbered from 1 (their header's seq).
    pub(super) replies: u64,
    /// How many history queries this socket may still answer this second.
    pub(super) query_budget: QueryBudget,
    /// The schemas of its publications (docs/schemas.md), by id: the
    /// encoded schema, sent to a query that asks for it, and the plan that
    /// reads its samples (for filters). Kept for the socket's life (a
    /// history entry may name a dropped publisher's), at most
    /// [`MAX_SOCKET_SCHEMAS`].
    pub(super) schemas: HashMap<u32, (milonga_wire::Bytes, milonga_wire::schema::Plan)>,
    /// The zstd dictionaries its publishers trained (docs/compression.md,
    /// "Dictionaries"), by id, sent to a query that asks for one. At most
    /// [`MAX_SOCKET_DICTIONARIES`]: beyond, the oldest is forgotten (a
    /// subscriber that still needs it finds the frames it cannot inflate
    /// counted).
    pub(super) dictionaries: HashMap<u32, milonga_wire::Bytes>,
    /// Dictionary ids in the order they came, to forget the oldest.
    dictionary_order: std::collections::VecDeque<u32>,
    /// Shared-memory markers (docs/shared-memory.md) unsubscribed so far:
    /// a subscription that left may leave slots awaiting it.
    pub(crate) marker_departures: u64,
    /// Shared-memory markers subscribed so far: a subscription that came
    /// while a reference was being sent may have got it uncounted.
    pub(crate) marker_arrivals: u64,
}

/// Most distinct schemas one data socket keeps.
pub(crate) const MAX_SOCKET_SCHEMAS: usize = 1024;

/// Most dictionaries one data socket keeps (one per key that trained one;
/// at most 16 KiB each).
pub(crate) const MAX_SOCKET_DICTIONARIES: usize = 1024;

/// What one message from a subscriber asks of the socket.
pub(crate) enum Upstream {
    /// Nothing more (a subscription counted, a filter declared, a query
    /// refused or not for this socket: each counted where it belongs).
    Done,
    /// The last subscriber of a prefix of `usize` bytes (with its leading
    /// byte) left: ZeroMQ let its memory go.
    Freed(usize),
    /// A history query to answer: send its replies in order, each made by
    /// [`Outlet::reply_frame`], and stop at the first the socket refuses.
    Answer(Answer),
    /// Not a message a subscriber sends (counted as `frames_malformed`).
    Unknown,
}

impl Outlet {
    /// The outlet of the node's first data socket of `reliability`.
    pub(crate) fn new(reliability: Reliability) -> Self {
        Self::named(reliability.as_str().to_owned())
    }

    /// The outlet of a data socket named `name` in queries.
    pub(crate) fn named(name: String) -> Self {
        Outlet {
            subscriptions: HashMap::new(),
            pending: None,
            name,
            histories: HashMap::new(),
            filters: HashMap::new(),
            replies: 0,
            query_budget: QueryBudget::default(),
            schemas: HashMap::new(),
            dictionaries: HashMap::new(),
            dictionary_order: std::collections::VecDeque::new(),
            marker_departures: 0,
            marker_arrivals: 0,
        }
    }

    /// Handles one message read from the socket (docs/protocol.md §4).
    pub(crate) fn upstream(&mut self, me: &Me, msg: &[u8]) -> Upstream {
        let counters = me.counters;
        match msg.first() {
            Some(&milonga_wire::history::QUERY_TAG) => {
                // Over this second's budget: refused without decoding.
                if self.query_budget.exhausted() {
                    super::history::refuse(me, "over the rate a data socket answers");
                    Upstream::Done
                } else {
                    super::history::answer(self, me, msg).map_or(Upstream::Done, Upstream::Answer)
                }
            }
            Some(&milonga_wire::filter::DECLARE_TAG) => {
                super::filters::declare(self, me, msg);
                Upstream::Done
            }
            Some(1) => {
                if msg.get(1) == Some(&milonga_wire::shm::MARKER_BYTE) {
                    self.marker_arrivals += 1;
                }
                *self.subscriptions.entry(msg[1..].to_vec()).or_insert(0) += 1;
                stats::inc(&counters.subscription_messages);
                Upstream::Done
            }
            Some(0) => {
                stats::inc(&counters.subscription_messages);
                let Some(n) = self.subscriptions.get_mut(&msg[1..]) else {
                    return Upstream::Done;
                };
                *n -= 1;
                if msg.get(1) == Some(&milonga_wire::shm::MARKER_BYTE) {
                    self.marker_departures += 1;
                }
                if *n > 0 {
                    return Upstream::Done;
                }
                self.subscriptions.remove(&msg[1..]);
                if !self.filters.is_empty() {
                    super::filters::prune(self);
                }
                Upstream::Freed(msg.len())
            }
            _ => Upstream::Unknown,
        }
    }

    /// The frame of one reply of `answer`, numbered in this socket's
    /// sequence of replies and counted in this second's budget; `None`
    /// once this second's bytes of replies are spent (64 MiB: an answer
    /// admitted may be larger, up to what its histories keep), so that
    /// the rest of the answer is not sent.
    pub(crate) fn reply_frame(
        &mut self,
        me: &Me,
        answer: &Answer,
        reply: &Reply,
    ) -> Option<Vec<u8>> {
        if self.query_budget.bytes_spent() {
            return None;
        }
        self.replies += 1;
        let f = answer.frame(me, self.replies, reply);
        self.query_budget.spend(f.len());
        Some(f)
    }

    /// The last frame of an answer that [`Outlet::reply_frame`] cut short:
    /// an empty reply marked done (a few bytes, past the budget), so that
    /// the asking subscription ends its wait at once and reports what it
    /// misses, rather than waiting out its join as for no answer.
    pub(crate) fn cut_frame(&mut self, me: &Me, answer: &Answer) -> Vec<u8> {
        self.replies += 1;
        let first = answer.replies.first();
        let done = Reply {
            socket: first.map(|r| r.socket.clone()).unwrap_or_default(),
            id: first.and_then(|r| r.id),
            done: true,
            ..Reply::default()
        };
        answer.frame(me, self.replies, &done)
    }

    /// Subscribers whose subscription lets `frame_prefix` (key + NUL)
    /// through. A filtered subscription (prefix `@f/<id>/...`) counts when
    /// what follows its filter prefix lets the key through.
    pub(crate) fn subscribers_of(&self, frame_prefix: &[u8]) -> u32 {
        let filtered = milonga_wire::filter::FILTERED_KEY_PREFIX.as_bytes();
        self.subscriptions
            .iter()
            .filter(|(p, _)| {
                let p = match p.strip_prefix(filtered) {
                    // `<16 hex digits>/`, then the subscription's own prefix.
                    Some(rest) if rest.len() >= 17 && rest[16] == b'/' => &rest[17..],
                    _ => &p[..],
                };
                frame_prefix.starts_with(p)
            })
            .map(|(_, n)| *n)
            .sum()
    }

    /// How many subscriptions want a sample whose frame starts with
    /// `frame_prefix` (key + NUL), if every one of them also holds its
    /// shared-memory marker (`marker` ‖ prefix, docs/protocol.md §4.6):
    /// then all are on this host and the payload may go through shared
    /// memory. `None` if one is not, or none wants it. A subscription
    /// that holds two prefixes the key matches counts twice (its slot
    /// then waits for the hold time).
    pub(crate) fn shared_memory_readers(&self, frame_prefix: &[u8], marker: &[u8]) -> Option<u32> {
        let mut readers = 0u32;
        let mut marked = Vec::with_capacity(marker.len() + 64);
        for (p, &n) in &self.subscriptions {
            if p.first() == Some(&milonga_wire::shm::MARKER_BYTE) || !frame_prefix.starts_with(p) {
                continue;
            }
            marked.clear();
            marked.extend_from_slice(marker);
            marked.extend_from_slice(p);
            if self.subscriptions.get(&marked) != Some(&n) {
                return None;
            }
            readers = readers.saturating_add(n);
        }
        (readers > 0).then_some(readers)
    }

    /// The batch waiting for room, if any.
    pub(crate) fn pending(&mut self) -> &mut Option<Pending> {
        &mut self.pending
    }

    /// Starts keeping the last `depth` samples of `key` (a publisher with
    /// history was declared; `replayed`: it republishes a recording).
    pub(crate) fn keep_history(&mut self, key: &str, depth: usize, replayed: bool) {
        self.histories
            .insert(key.to_owned(), Kept::new(depth, replayed));
    }

    /// The keys whose samples are kept here that `expr` matches: what a
    /// history query of `expr` to this socket would be answered with.
    pub(crate) fn kept_keys(&self, expr: &milonga_wire::KeyExpr) -> Vec<String> {
        self.histories
            .keys()
            .filter(|k| expr.matches(k))
            .cloned()
            .collect()
    }

    /// Keeps a publisher's trained dictionary under its id, for the
    /// queries that ask for it (the oldest forgotten beyond
    /// [`MAX_SOCKET_DICTIONARIES`]; a publisher that still uses one adds
    /// it again with its next sample).
    pub(crate) fn add_dictionary(&mut self, id: u32, bytes: &milonga_wire::Bytes) {
        if self.dictionaries.contains_key(&id) {
            return;
        }
        self.dictionaries.insert(id, bytes.clone());
        self.dictionary_order.push_back(id);
        while self.dictionary_order.len() > MAX_SOCKET_DICTIONARIES {
            if let Some(old) = self.dictionary_order.pop_front() {
                self.dictionaries.remove(&old);
            }
        }
    }

    /// Keeps a publication's schema, encoded, under its id, for the queries
    /// that ask for it. Refused when another schema has that id (two
    /// schemas whose FNV-1a 32 collide: rename one) or the socket keeps
    /// [`MAX_SOCKET_SCHEMAS`] already.
    pub(crate) fn add_schema(
        &mut self,
        id: u32,
        encoded: &[u8],
        schema: &milonga_wire::schema::Schema,
    ) -> Result<(), String> {
        match self.schemas.get(&id) {
            Some((b, _)) if b.as_ref() == encoded => Ok(()),
            Some(_) => Err(format!(
                "schema id {id:#010x} is taken by another schema of this node's data socket"
            )),
            None if self.schemas.len() >= MAX_SOCKET_SCHEMAS => Err(format!(
                "a data socket keeps at most {MAX_SOCKET_SCHEMAS} schemas"
            )),
            None => {
                self.schemas.insert(
                    id,
                    (
                        milonga_wire::Bytes::copy_from_slice(encoded),
                        milonga_wire::schema::Plan::identity(schema),
                    ),
                );
                Ok(())
            }
        }
    }

    /// Stops keeping samples of `key` (its publisher was dropped).
    pub(crate) fn forget_history(&mut self, key: &str) {
        self.histories.remove(key);
    }

    /// Whether samples of `key` are kept for history here.
    pub(crate) fn keeps_history(&self, key: &str) -> bool {
        !self.histories.is_empty() && self.histories.contains_key(key)
    }

    /// Records sample `seq` of `key`, accepted by the socket or a batch:
    /// kept in its history if it has one, and the frames of the filters it
    /// passes returned, to be sent after it.
    pub(crate) fn accepted(
        &mut self,
        me: &Me,
        key: &str,
        enc: &Encoded,
        st: Stamp,
    ) -> Vec<Vec<u8>> {
        // Most sockets keep no history: their puts skip the hash lookup.
        if !self.histories.is_empty() {
            if let Some(k) = self.histories.get_mut(key) {
                k.push(st.seq, st.timestamp_ns, enc, st.schema_id);
            }
        }
        if self.filters.is_empty() {
            return Vec::new();
        }
        super::filters::apply(self, me, key, st.timestamp_ns, enc, st.schema_id, st.flags)
    }
}

/// The header fields of one accepted sample that are not its key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    pub(crate) seq: u64,
    pub(crate) timestamp_ns: u64,
    pub(crate) schema_id: u32,
    /// The publisher's flags that every frame of it carries (replayed).
    pub(crate) flags: u8,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use milonga_wire::cbor::encode_payload;
    use milonga_wire::filter::{Declaration, Filter};
    use milonga_wire::history::Query;
    use milonga_wire::{NodeId, Value};

    use super::*;
    use crate::util::stats::Counters;

    fn me(counters: &Counters) -> Me<'_> {
        Me {
            id: NodeId([7; 16]),
            domain_tag: milonga_wire::frame::domain_tag("lab"),
            max_message_bytes: 1 << 20,
            counters,
        }
    }

    fn sub(prefix: &str) -> Vec<u8> {
        let mut m = vec![1];
        m.extend(prefix.as_bytes());
        m
    }

    fn unsub(prefix: &str) -> Vec<u8> {
        let mut m = vec![0];
        m.extend(prefix.as_bytes());
        m
    }

    fn put(o: &mut Outlet, me: &Me, key: &str, seq: u64, v: f64) -> Vec<Vec<u8>> {
        let enc = encode_payload(&Value::Float(v), 1 << 20).unwrap();
        o.accepted(
            me,
            key,
            &enc,
            Stamp {
                seq,
                timestamp_ns: 1000 + seq,
                schema_id: 0,
                flags: 0,
            },
        )
    }

    #[test]
    fn subscriptions_are_counted_and_the_last_to_leave_frees_the_prefix() {
        let c = Counters::default();
        let me = me(&c);
        let mut o = Outlet::new(Reliability::BestEffort);
        assert!(matches!(o.upstream(&me, &sub("a/b\0")), Upstream::Done));
        assert!(matches!(o.upstream(&me, &sub("a/b\0")), Upstream::Done));
        assert!(matches!(o.upstream(&me, &sub("a/")), Upstream::Done));
        assert_eq!(o.subscribers_of(b"a/b\0"), 3);
        assert_eq!(o.subscribers_of(b"a/c\0"), 1);
        assert_eq!(o.subscribers_of(b"b\0"), 0);
        assert!(matches!(o.upstream(&me, &unsub("a/b\0")), Upstream::Done));
        match o.upstream(&me, &unsub("a/b\0")) {
            Upstream::Freed(n) => assert_eq!(n, 5, "the message, its leading byte included"),
            _ => panic!("the last subscriber of a/b left"),
        }
        // A prefix nobody holds: counted, nothing freed.
        assert!(matches!(o.upstream(&me, &unsub("zz")), Upstream::Done));
        assert_eq!(o.subscribers_of(b"a/b\0"), 1);
        assert_eq!(c.subscription_messages.load(Relaxed), 6);
        // Not a subscriber's message.
        assert!(matches!(o.upstream(&me, &[9, 1, 2]), Upstream::Unknown));
        assert!(matches!(o.upstream(&me, &[]), Upstream::Unknown));
    }

    #[test]
    fn a_filtered_subscription_counts_for_the_keys_after_its_filter_prefix() {
        let c = Counters::default();
        let me = me(&c);
        let mut o = Outlet::new(Reliability::BestEffort);
        o.upstream(&me, &sub("@f/0123456789abcdef/sr/"));
        assert_eq!(o.subscribers_of(b"sr/ps/1\0"), 1);
        assert_eq!(o.subscribers_of(b"xy/ps/1\0"), 0);
    }

    #[test]
    fn a_history_query_is_answered_for_a_token_subscribed_here_only() {
        let c = Counters::default();
        let me = me(&c);
        let mut o = Outlet::new(Reliability::Reliable);
        o.keep_history("sr/k", 2, false);
        for seq in 1..=3 {
            assert!(put(&mut o, &me, "sr/k", seq, seq as f64).is_empty());
        }
        // No history kept for a key that did not ask for it.
        put(&mut o, &me, "sr/other", 1, 0.0);
        let q = Query {
            node: me.id.to_hex(),
            socket: "reliable".into(),
            token: "t1".into(),
            expr: "sr/**".into(),
            last: 5,
            since: vec![],
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        assert!(matches!(o.upstream(&me, &q.encode()), Upstream::Done));
        assert_eq!(
            c.history_queries_refused.load(Relaxed),
            1,
            "t1 is not subscribed"
        );
        o.upstream(&me, &sub("@r/t1\0"));
        let Upstream::Answer(a) = o.upstream(&me, &q.encode()) else {
            panic!("an answer for a subscribed token");
        };
        assert_eq!(a.token, "t1");
        let keys: Vec<_> = a.replies.iter().flat_map(|r| &r.keys).collect();
        assert_eq!(keys.len(), 1, "sr/other keeps nothing");
        let seqs: Vec<u64> = keys[0].entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [2, 3], "the last two kept");
        assert!(a.replies.last().unwrap().done);
        // Replies are numbered per socket.
        for (i, r) in a.replies.iter().enumerate() {
            let f = o.reply_frame(&me, &a, r).unwrap();
            let h = milonga_wire::frame::decode(&f).unwrap().header;
            assert_eq!(h.seq, i as u64 + 1);
            assert_eq!(h.node_id, me.id);
        }
        // A query for another node, or the other socket, is not ours.
        let other = Query {
            node: NodeId([8; 16]).to_hex(),
            ..q.clone()
        };
        assert!(matches!(o.upstream(&me, &other.encode()), Upstream::Done));
        let be = Query {
            socket: "best_effort".into(),
            ..q
        };
        assert!(matches!(o.upstream(&me, &be.encode()), Upstream::Done));
        assert_eq!(c.history_queries_answered.load(Relaxed), 1);
        assert_eq!(c.history_queries_refused.load(Relaxed), 1);
        // A publisher dropped: nothing kept any more.
        o.forget_history("sr/k");
        let Upstream::Answer(a) = o.upstream(&me, &other_token(&me)) else {
            panic!("an answer");
        };
        assert!(a.replies.iter().all(|r| r.keys.is_empty()));
    }

    #[test]
    fn an_answer_stops_where_the_second_s_bytes_of_replies_are_spent() {
        // 100 MiB of history answered at once: the frames stop after the
        // 64 MiB a socket answers a second (it sent them all).
        let c = Counters::default();
        let me = me(&c);
        let mut o = Outlet::new(Reliability::BestEffort);
        o.keep_history("sr/big", 200, false);
        let payload = bytes::Bytes::from(vec![7u8; 512 << 10]);
        for seq in 1..=200 {
            let enc = encode_payload(&Value::Bytes(payload.clone()), 1 << 20).unwrap();
            let stamp = Stamp {
                seq,
                timestamp_ns: seq,
                schema_id: 0,
                flags: 0,
            };
            o.accepted(&me, "sr/big", &enc, stamp);
        }
        o.upstream(&me, &sub("@r/t1\0"));
        let q = Query {
            node: me.id.to_hex(),
            socket: "best_effort".into(),
            token: "t1".into(),
            expr: "sr/**".into(),
            last: 200,
            since: vec![],
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        let Upstream::Answer(a) = o.upstream(&me, &q.encode()) else {
            panic!("an answer");
        };
        let frames = a.replies.len();
        assert_eq!(frames, 200, "a frame a sample");
        let mut bytes = 0;
        let mut sent = 0;
        for r in &a.replies {
            let Some(f) = o.reply_frame(&me, &a, r) else {
                break;
            };
            bytes += f.len();
            sent += 1;
        }
        assert!(sent < frames, "all {frames} sent");
        assert!(
            (64 << 20..(64 << 20) + (1 << 20)).contains(&bytes),
            "{bytes} bytes in {sent} frames"
        );
        // Its end: an empty reply marked done, numbered next.
        let f = o.cut_frame(&me, &a);
        let d = milonga_wire::frame::decode(&f).unwrap();
        assert_eq!(d.header.seq, sent as u64 + 1);
        let r = Reply::decode(&bytes::Bytes::copy_from_slice(d.body)).unwrap();
        assert!(r.done && r.keys.is_empty(), "{r:?}");
        assert_eq!(r.socket, "best_effort");
    }

    fn other_token(me: &Me) -> Vec<u8> {
        Query {
            node: me.id.to_hex(),
            socket: "reliable".into(),
            token: "t1".into(),
            expr: "**".into(),
            last: 1,
            since: vec![],
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        }
        .encode()
    }

    #[test]
    fn a_declared_filter_yields_a_frame_for_the_samples_that_pass_until_nobody_holds_it() {
        let c = Counters::default();
        let me = me(&c);
        let mut o = Outlet::new(Reliability::BestEffort);
        let filter = Filter {
            expr: Some("value > 10".into()),
            ..Filter::default()
        };
        let d = Declaration {
            node: me.id.to_hex(),
            socket: "best_effort".into(),
            keys: "sr/**".into(),
            filter: filter.clone(),
        };
        let prefix = format!("@f/{}/sr/", filter.id_for("sr/**"));
        o.upstream(&me, &sub(&prefix));
        assert!(matches!(o.upstream(&me, &d.encode()), Upstream::Done));
        assert_eq!(c.filters_declared.load(Relaxed), 1);
        assert!(
            put(&mut o, &me, "sr/a", 1, 5.0).is_empty(),
            "5 does not pass"
        );
        let frames = put(&mut o, &me, "sr/a", 2, 12.0);
        assert_eq!(frames.len(), 1);
        let v = milonga_wire::frame::decode(&frames[0]).unwrap();
        assert_eq!(v.key, format!("{prefix}a"));
        assert_eq!(v.header.seq, 1, "numbered per filter and key");
        assert!(
            put(&mut o, &me, "other/a", 3, 12.0).is_empty(),
            "not a key it selects"
        );
        assert_eq!(c.filter_evaluations.load(Relaxed), 2);
        // The last subscription holding its prefix left: the filter goes.
        assert!(matches!(
            o.upstream(&me, &unsub(&prefix)),
            Upstream::Freed(_)
        ));
        assert!(put(&mut o, &me, "sr/a", 4, 12.0).is_empty());
    }
}
