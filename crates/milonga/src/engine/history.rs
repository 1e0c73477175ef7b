//! What a publisher keeps for late joiners and repair, and how it answers
//! a history query (docs/protocol.md §4.2).
//!
//! A publisher with `PublisherQos::history(depth)` keeps its last `depth`
//! samples (their encoded payloads, shared, not copied) in its data
//! socket's state, so that a query read from that socket is answered under
//! the same lock as puts: the reply holds everything up to the last put, and
//! everything put afterwards reaches the asking subscriber live.

use std::collections::{HashMap, VecDeque};

use milonga_wire::cbor::Encoded;
use milonga_wire::frame::{self, Encoding, Header, Kind};
use milonga_wire::history::{Entry, KeyHistory, Query, Reply, REPLY_KEY_PREFIX};
use milonga_wire::{Bytes, Key, KeyExpr};

use super::outlet::Outlet;
use super::Me;
use crate::util::stats;

/// Largest history query a data socket accepts (its `ZMQ_MAXMSGSIZE`).
pub(crate) const MAX_QUERY_BYTES: usize = 256 << 10;
/// A reply frame is cut after about this many bytes of payload.
const REPLY_FRAME_BYTES: usize = 1 << 20;

/// History queries one data socket answers per second, over all
/// subscribers.
const QUERIES_PER_SECOND: u32 = 200;
/// History queries one subscription (token) gets answered per second.
const QUERIES_PER_TOKEN_PER_SECOND: u32 = 10;
/// Bytes of history replies one data socket sends per second.
const REPLY_BYTES_PER_SECOND: usize = 64 << 20;
/// Most tokens whose queries are counted within a second.
const MAX_TOKENS_PER_SECOND: usize = 4096;

/// What a data socket may still answer in the current second: a flood of
/// queries is refused and counted (`history_queries_refused`) instead of
/// freezing puts and heartbeats while it is answered.
#[derive(Debug, Default)]
pub(crate) struct QueryBudget {
    second: Option<std::time::Instant>,
    answered: u32,
    bytes: usize,
    per_token: HashMap<String, u32>,
}

impl QueryBudget {
    /// Starts a new second if the current one is over at `now`.
    fn roll(&mut self, now: std::time::Instant) {
        if self
            .second
            .is_none_or(|s| now.duration_since(s) >= std::time::Duration::from_secs(1))
        {
            *self = QueryBudget {
                second: Some(now),
                ..QueryBudget::default()
            };
        }
    }

    /// Counts `n` bytes of replies sent (or about to be) this second.
    pub(super) fn spend(&mut self, n: usize) {
        self.bytes = self.bytes.saturating_add(n);
    }

    /// Whether this second's bytes of replies are spent: the rest of an
    /// answer being sent is not (the subscriber reports what it misses).
    pub(crate) fn bytes_spent(&mut self) -> bool {
        self.roll(std::time::Instant::now());
        self.bytes >= REPLY_BYTES_PER_SECOND
    }

    /// Whether this second's budget is spent, whoever asks.
    pub(crate) fn exhausted(&mut self) -> bool {
        self.roll(std::time::Instant::now());
        self.answered >= QUERIES_PER_SECOND || self.bytes >= REPLY_BYTES_PER_SECOND
    }

    /// Whether a query of `token` may be answered now; counts it if so.
    fn admit(&mut self, token: &str) -> bool {
        self.admit_at(token, std::time::Instant::now())
    }

    /// [`QueryBudget::admit`] at `now`.
    fn admit_at(&mut self, token: &str, now: std::time::Instant) -> bool {
        self.roll(now);
        if self.answered >= QUERIES_PER_SECOND || self.bytes >= REPLY_BYTES_PER_SECOND {
            return false;
        }
        let full = self.per_token.len() >= MAX_TOKENS_PER_SECOND;
        match self.per_token.get_mut(token) {
            Some(n) if *n >= QUERIES_PER_TOKEN_PER_SECOND => return false,
            Some(n) => *n += 1,
            None if full => return false,
            None => {
                self.per_token.insert(token.to_owned(), 1);
            }
        }
        self.answered += 1;
        true
    }
}

/// Counts a refused query, logging the first ones and then one in 1,000.
pub(crate) fn refuse(me: &Me, why: &str) {
    let c = &me.counters.history_queries_refused;
    let n = c.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    stats::log_drop(n, "a history query", &why);
}

/// Counts a malformed query, logging the first ones and then one in 1,000.
fn malformed(me: &Me, err: &dyn std::fmt::Display) {
    let c = &me.counters.history_queries_malformed;
    let n = c.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    stats::log_drop(n, "a malformed history query", err);
}

/// One kept sample.
#[derive(Debug, Clone)]
struct KeptSample {
    seq: u64,
    timestamp_ns: u64,
    encoding: Encoding,
    schema_id: u32,
    head: Bytes,
    tail: Option<Bytes>,
}

impl KeptSample {
    fn len(&self) -> usize {
        self.head.len() + self.tail.as_ref().map_or(0, Bytes::len)
    }

    fn entry(&self) -> Entry {
        let payload = match &self.tail {
            None => self.head.clone(),
            Some(t) => {
                let mut v = Vec::with_capacity(self.len());
                v.extend_from_slice(&self.head);
                v.extend_from_slice(t);
                Bytes::from(v)
            }
        };
        Entry {
            seq: self.seq,
            timestamp_ns: self.timestamp_ns,
            encoding: self.encoding,
            schema_id: self.schema_id,
            payload,
        }
    }
}

/// The last samples of one key.
#[derive(Debug)]
pub(crate) struct Kept {
    depth: usize,
    /// Its publisher republishes a recording (`PublisherQos::replay`):
    /// answers say so, as its live samples' header does.
    replayed: bool,
    samples: VecDeque<KeptSample>,
    /// Last sequence number put on the key.
    last: u64,
}

impl Kept {
    pub(crate) fn new(depth: usize, replayed: bool) -> Kept {
        Kept {
            depth,
            replayed,
            samples: VecDeque::with_capacity(depth.min(1024)),
            last: 0,
        }
    }

    /// Keeps a sample that was just accepted (sent or batched).
    pub(crate) fn push(&mut self, seq: u64, timestamp_ns: u64, enc: &Encoded, schema_id: u32) {
        if self.samples.len() >= self.depth {
            self.samples.pop_front();
        }
        self.samples.push_back(KeptSample {
            seq,
            timestamp_ns,
            encoding: enc.encoding,
            schema_id,
            head: enc.head.clone(),
            tail: enc.tail.clone(),
        });
        self.last = seq;
    }

    /// What to send of this key: after `since`, or the `last` latest.
    /// Samples from `waiting` on are still in a batch that has not left:
    /// they will reach the subscriber live, so the answer stops before them.
    fn answer(&self, key: &str, since: Option<u64>, last: u64, waiting: Option<u64>) -> KeyHistory {
        let sent_last = waiting.map_or(self.last, |w| w.saturating_sub(1).min(self.last));
        let sent: Vec<&KeptSample> = self.samples.iter().filter(|k| k.seq <= sent_last).collect();
        let first = sent.first().map_or(sent_last + 1, |s| s.seq);
        let chosen: Vec<&KeptSample> = match since {
            Some(s) => sent.into_iter().filter(|k| k.seq > s).collect(),
            None => {
                let n = (last as usize).min(sent.len());
                sent[sent.len() - n..].to_vec()
            }
        };
        KeyHistory {
            key: key.to_owned(),
            first,
            last: sent_last,
            entries: chosen.into_iter().map(KeptSample::entry).collect(),
            replayed: self.replayed,
        }
    }
}

/// The replies to one history query, to be sent in order (see
/// [`Outlet::reply_frame`]).
pub(crate) struct Answer {
    /// `@r/<token>`: only the asking subscription receives them.
    reply_key: Key,
    /// The asking subscription's token, for the log.
    pub(crate) token: String,
    pub(crate) replies: Vec<Reply>,
}

impl Answer {
    /// The frame of `reply`, reply number `seq` of its socket.
    pub(super) fn frame(&self, me: &Me, seq: u64, reply: &Reply) -> Vec<u8> {
        let header = Header {
            kind: Kind::History,
            flags: 0,
            encoding: Encoding::Cbor,
            domain_tag: me.domain_tag,
            schema_id: 0,
            node_id: me.id,
            seq,
            timestamp_ns: crate::util::now_ns(),
        };
        frame::encode(&self.reply_key, &header, &reply.encode())
    }
}

/// Answers a history query read from data socket `d`, if it names this
/// socket's endpoint (a query reaches every publisher the subscription is
/// connected to). Malformed queries are counted and dropped.
pub(super) fn answer(d: &mut Outlet, me: &Me, msg: &[u8]) -> Option<Answer> {
    let c = &me.counters;
    let q = match Query::decode(msg) {
        Ok(q) => q,
        Err(err) => {
            malformed(me, &err);
            return None;
        }
    };
    if q.node != me.id.to_hex() || q.socket != d.name {
        return None;
    }
    // Only a token subscribed on this socket gets an answer: its replies
    // go to that subscriber alone, never to one named by someone else.
    let mut prefix = format!("{REPLY_KEY_PREFIX}{}", q.token).into_bytes();
    prefix.push(0);
    if !d.subscriptions.contains_key(&prefix) {
        refuse(me, "its token is not subscribed on this socket");
        return None;
    }
    if !d.query_budget.admit(&q.token) {
        refuse(me, "over the rate a data socket answers");
        return None;
    }
    let (expr, reply_key) = match (
        KeyExpr::new(q.expr.as_str()),
        Key::internal(format!("{REPLY_KEY_PREFIX}{}", q.token)),
    ) {
        (Ok(e), Ok(k)) => (e, k),
        (Err(err), _) | (_, Err(err)) => {
            malformed(me, &err);
            return None;
        }
    };
    let since: HashMap<&str, u64> = q.since.iter().map(|(k, s)| (k.as_str(), *s)).collect();
    let socket = d.name.clone();
    // The schemas asked for that this socket knows go in the first frame.
    let schemas = q
        .schemas
        .iter()
        .filter_map(|id| d.schemas.get(id).map(|(b, _)| (*id, b.clone())))
        .collect::<Vec<_>>();
    // And the dictionaries (docs/compression.md, "Dictionaries").
    let dictionaries = q
        .dictionaries
        .iter()
        .filter_map(|id| d.dictionaries.get(id).map(|b| (*id, b.clone())))
        .collect::<Vec<_>>();
    let schema_bytes: usize = schemas
        .iter()
        .chain(&dictionaries)
        .map(|(_, b)| b.len() + 8)
        .sum();
    let mut frames: Vec<Reply> = vec![Reply {
        socket: socket.clone(),
        id: q.id,
        schemas,
        dictionaries,
        ..Reply::default()
    }];
    let mut size = schema_bytes;
    let mut keys: Vec<&String> = d.histories.keys().filter(|k| expr.matches(k)).collect();
    keys.sort();
    let waiting = d.pending.as_ref().map(|p| {
        let (k, seq) = p.first();
        (k.to_vec(), seq)
    });
    // Frames of about REPLY_FRAME_BYTES: a key's entries may span several,
    // each repeating the key with its first and last.
    let limit = me.max_message_bytes.saturating_sub(4096);
    for key in keys {
        let waiting = waiting
            .as_ref()
            .filter(|(k, _)| k == key.as_bytes())
            .map(|(_, seq)| *seq);
        let kh = d.histories[key].answer(key, since.get(key.as_str()).copied(), q.last, waiting);
        let KeyHistory {
            key,
            first,
            last,
            entries,
            replayed,
        } = kh;
        let empty = || KeyHistory {
            key: key.clone(),
            first,
            last,
            entries: Vec::new(),
            replayed,
        };
        let mut chunk = empty();
        for e in entries {
            let bytes = e.payload.len() + 32;
            if bytes > limit {
                // Cannot travel in a frame the subscriber accepts: it will
                // see the gap and report it lost.
                stats::inc(&c.history_replies_dropped);
                continue;
            }
            if size > 0 && size + bytes > REPLY_FRAME_BYTES {
                let full = std::mem::replace(&mut chunk, empty());
                frames.last_mut().expect("one at least").keys.push(full);
                frames.push(Reply {
                    socket: socket.clone(),
                    id: q.id,
                    ..Reply::default()
                });
                size = 0;
            }
            size += bytes;
            chunk.entries.push(e);
        }
        frames.last_mut().expect("one at least").keys.push(chunk);
    }
    frames.last_mut().expect("one at least").done = true;
    stats::inc(&c.history_queries_answered);
    Some(Answer {
        reply_key,
        token: q.token,
        replies: frames,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use milonga_wire::cbor::encode_payload;
    use milonga_wire::Value;

    use super::*;

    #[test]
    fn a_token_gets_ten_answers_a_second_and_a_socket_two_hundred() {
        let mut b = QueryBudget::default();
        let t0 = Instant::now();
        for _ in 0..QUERIES_PER_TOKEN_PER_SECOND {
            assert!(b.admit_at("one", t0));
        }
        assert!(!b.admit_at("one", t0), "the 11th of one token");
        // Other tokens go on until the socket's 200.
        let mut admitted = QUERIES_PER_TOKEN_PER_SECOND;
        for i in 0..QUERIES_PER_SECOND * 2 {
            if !b.admit_at(&format!("t{i}"), t0) {
                break;
            }
            admitted += 1;
        }
        assert_eq!(admitted, QUERIES_PER_SECOND);
        // The next second starts over.
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.admit_at("one", t1));
    }

    #[test]
    fn a_token_table_full_of_strangers_refuses_new_tokens_not_known_ones() {
        let mut b = QueryBudget::default();
        let t0 = Instant::now();
        assert!(b.admit_at("known", t0));
        // Fill the table without spending the socket's budget (as a
        // flood of refused tokens cannot; this checks the cap alone).
        for i in 1..MAX_TOKENS_PER_SECOND {
            b.per_token.insert(format!("stranger{i}"), 1);
        }
        assert!(!b.admit_at("new", t0), "the table is full");
        assert!(b.admit_at("known", t0), "a token already counted goes on");
    }

    fn kept(depth: usize, seqs: std::ops::RangeInclusive<u64>) -> Kept {
        let mut k = Kept::new(depth, false);
        for seq in seqs {
            let enc = encode_payload(&Value::from(seq), usize::MAX).unwrap();
            k.push(seq, seq * 10, &enc, 0);
        }
        k
    }

    fn seqs(h: &KeyHistory) -> Vec<u64> {
        h.entries.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn history_keeps_the_last_depth_samples_and_answers_since_or_the_last_n() {
        let k = kept(5, 1..=12);
        let h = k.answer("k", None, 3, None);
        assert_eq!(seqs(&h), [10, 11, 12]);
        assert_eq!((h.first, h.last), (8, 12), "what is kept: 8..=12");
        assert_eq!(seqs(&k.answer("k", None, 100, None)), [8, 9, 10, 11, 12]);
        assert_eq!(seqs(&k.answer("k", Some(9), 0, None)), [10, 11, 12]);
        // A repair from before what is kept gets what is kept; `first`
        // tells the subscriber that 6 and 7 are gone.
        let h = k.answer("k", Some(5), 0, None);
        assert_eq!((seqs(&h), h.first), (vec![8, 9, 10, 11, 12], 8));
        assert!(k.answer("k", Some(12), 0, None).entries.is_empty());
        assert_eq!(k.answer("k", None, 0, None).entries.len(), 0);
    }

    #[test]
    fn history_stops_before_samples_still_waiting_in_a_batch() {
        // 11 and 12 are in a batch that has not left: they reach the
        // subscriber live, so the answer ends at 10 and says so.
        let k = kept(5, 1..=12);
        let h = k.answer("k", Some(8), 0, Some(11));
        assert_eq!(seqs(&h), [9, 10]);
        assert_eq!(h.last, 10);
        // Nothing sent yet at all.
        let h = kept(5, 1..=3).answer("k", None, 5, Some(1));
        assert!(h.entries.is_empty());
        assert_eq!((h.first, h.last), (1, 0));
    }

    #[test]
    fn an_empty_history_answers_nothing_and_says_where_it_starts() {
        let h = Kept::new(4, false).answer("k", None, 10, None);
        assert!(h.entries.is_empty());
        assert_eq!((h.first, h.last), (1, 0));
    }
}
