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
    /// Best effort or reliable (history queries name the socket by it).
    pub(super) reliability: Reliability,
    /// Samples kept per key, for publishers with history.
    pub(super) histories: HashMap<String, Kept>,
    /// Filters declared by subscribers, by id.
    pub(super) filters: HashMap<String, PubFilter>,
    /// History replies sent, numbered from 1 (their header's seq).
    pub(super) replies: u64,
    /// How many history queries this socket may still answer this second.
    pub(super) query_budget: QueryBudget,
}

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
    pub(crate) fn new(reliability: Reliability) -> Self {
        Outlet {
            subscriptions: HashMap::new(),
            pending: None,
            reliability,
            histories: HashMap::new(),
            filters: HashMap::new(),
            replies: 0,
            query_budget: QueryBudget::default(),
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
    /// sequence of replies and counted in this second's budget.
    pub(crate) fn reply_frame(&mut self, me: &Me, answer: &Answer, reply: &Reply) -> Vec<u8> {
        self.replies += 1;
        let f = answer.frame(me, self.replies, reply);
        self.query_budget.bytes = self.query_budget.bytes.saturating_add(f.len());
        f
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

    /// The batch waiting for room, if any.
    pub(crate) fn pending(&mut self) -> &mut Option<Pending> {
        &mut self.pending
    }

    /// Starts keeping the last `depth` samples of `key` (a publisher with
    /// history was declared).
    pub(crate) fn keep_history(&mut self, key: &str, depth: usize) {
        self.histories.insert(key.to_owned(), Kept::new(depth));
    }

    /// Stops keeping samples of `key` (its publisher was dropped).
    pub(crate) fn forget_history(&mut self, key: &str) {
        self.histories.remove(key);
    }

    /// Records sample `seq` of `key`, accepted by the socket or a batch:
    /// kept in its history if it has one, and the frames of the filters it
    /// passes returned, to be sent after it.
    pub(crate) fn accepted(
        &mut self,
        me: &Me,
        key: &str,
        seq: u64,
        timestamp_ns: u64,
        enc: &Encoded,
        schema_id: u32,
    ) -> Vec<Vec<u8>> {
        if let Some(k) = self.histories.get_mut(key) {
            k.push(seq, timestamp_ns, enc, schema_id);
        }
        if self.filters.is_empty() {
            return Vec::new();
        }
        super::filters::apply(self, me, key, timestamp_ns, enc, schema_id)
    }
}
