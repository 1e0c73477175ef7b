//! A subscription's sequence rules, without sockets: for each stream
//! (publisher node, key), the last sequence number held, and what a new
//! one means (the next, a gap, a duplicate, a frame that goes back or
//! jumps). The subscription turns each [`Step`] into counters, loss events
//! and history repairs (subscription.rs); the rules themselves live here,
//! with their unit tests.

use std::collections::HashMap;

use milonga_wire::NodeId;

/// Most keys of one publisher node whose sequence numbers a subscription
/// follows; samples of further keys are dropped and counted.
pub(crate) const MAX_KEYS_PER_PUBLISHER: usize = 1 << 16;

/// A sequence number further ahead than this of the last one held is
/// corrupt or forged, not a loss: counted in `sequence_jumps`.
pub(crate) const MAX_SEQ_JUMP: u64 = 1 << 32;

/// What a sample's sequence number means for its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A node of which nothing is known and that the domain does not show:
    /// dropped (a forged id would otherwise cost state).
    Unknown,
    /// A new key of a node that already has [`MAX_KEYS_PER_PUBLISHER`]
    /// that it still announces: dropped.
    OverKeyLimit,
    /// The first sample of a stream: the count starts here (joining
    /// mid-stream is no loss).
    First,
    /// The one after the last held.
    Next,
    /// `lost` samples, from `first_seq`, never came before this one.
    Gap { lost: u64, first_seq: u64 },
    /// A gap the caller asked to repair: the last held stays `last`, and
    /// the sample waits for what history brings.
    Repair { last: u64 },
    /// The last one held again, or one of the [`RECENT`] before it that
    /// was delivered (a late copy: the same publisher reached on two
    /// paths): dropped.
    Duplicate,
    /// Lower than the last held and not delivered recently (a publisher's
    /// sequence never goes back: corrupt or forged): the count starts over
    /// from it.
    Back { from: u64 },
    /// More than [`MAX_SEQ_JUMP`] ahead (corrupt or forged, not a loss):
    /// the count starts over from it.
    Jump { from: u64 },
}

/// How many sequence numbers below the last held a stream remembers as
/// delivered: a late copy of one of them is a duplicate.
pub(crate) const RECENT: u64 = 128;

/// The last sequence number held of a stream, and which of the [`RECENT`]
/// before it were delivered (bit `i`: `last - 1 - i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    last: u64,
    recent: u128,
}

impl Held {
    fn at(last: u64) -> Held {
        Held { last, recent: 0 }
    }

    /// Moves on to `seq` (above `last`): `last` was delivered, the ones in
    /// between were not.
    fn advance(&mut self, seq: u64) {
        let shift = seq - self.last;
        self.recent = if shift > RECENT {
            0
        } else {
            (self.recent << (shift - 1) << 1) | (1u128 << (shift - 1))
        };
        self.last = seq;
    }

    /// Whether `seq` (below `last`) is one of the recent ones delivered.
    fn delivered(&self, seq: u64) -> bool {
        let d = self.last - seq;
        d <= RECENT && self.recent & (1u128 << (d - 1)) != 0
    }
}

/// The last sequence number seen on one stream.
#[derive(Debug)]
struct Stream {
    node: NodeId,
    key: String,
    held: Held,
}

/// The last sequence number held of every stream of a subscription.
#[derive(Debug, Default)]
pub(crate) struct SeqBook {
    last: HashMap<NodeId, HashMap<String, Held>>,
    /// The stream of the last sample, kept out of `last`: most traffic
    /// repeats the same stream, and this spares a hash lookup per sample.
    current: Option<Stream>,
}

impl SeqBook {
    /// Whether (`node`, `key`) is the stream of the last sample (the fast
    /// path: the caller does its per-stream work only for another one).
    pub(crate) fn is_current(&self, node: NodeId, key: &str) -> bool {
        self.current
            .as_ref()
            .is_some_and(|s| s.node == node && s.key == key)
    }

    /// What sample `seq` of (`node`, `key`) means, and the stream's state
    /// updated for it. `member` says whether the domain shows `node` (asked
    /// only for a node of which nothing is held); `repair` whether a gap
    /// should wait for a history repair (asked only for a gap);
    /// `announced` whether the node still announces a key (asked only when
    /// a new key finds the node at [`MAX_KEYS_PER_PUBLISHER`]: the state
    /// of the keys it retired makes room, or a node publishing for months,
    /// keys coming and going, had every new key's samples dropped).
    pub(crate) fn check(
        &mut self,
        node: NodeId,
        key: &str,
        seq: u64,
        member: impl FnOnce() -> bool,
        repair: impl FnOnce() -> bool,
        announced: impl Fn(&str) -> bool,
    ) -> Step {
        if !self.is_current(node, key) {
            self.park();
            let known = self.last.get_mut(&node);
            let keys = known.as_ref().map_or(0, |m| m.len());
            let remembered = known.is_some();
            match known.and_then(|m| m.remove_entry(key)) {
                Some((key, held)) => self.current = Some(Stream { node, key, held }),
                None if !remembered && !member() => return Step::Unknown,
                None if keys >= MAX_KEYS_PER_PUBLISHER
                    && self.last.get_mut(&node).is_none_or(|m| {
                        m.retain(|k, _| announced(k));
                        m.len() >= MAX_KEYS_PER_PUBLISHER
                    }) =>
                {
                    return Step::OverKeyLimit
                }
                None => {
                    self.current = Some(Stream {
                        node,
                        key: key.to_owned(),
                        held: Held::at(seq),
                    });
                    return Step::First;
                }
            }
        }
        let s = self.current.as_mut().expect("set above");
        let from = s.held.last;
        if seq == from || (seq < from && s.held.delivered(seq)) {
            return Step::Duplicate;
        }
        if seq < from {
            s.held = Held::at(seq);
            return Step::Back { from };
        }
        let lost = seq - from - 1;
        if lost >= MAX_SEQ_JUMP {
            s.held = Held::at(seq);
            return Step::Jump { from };
        }
        if lost == 0 {
            s.held.advance(seq);
            return Step::Next;
        }
        if repair() {
            return Step::Repair { last: from };
        }
        s.held.advance(seq);
        Step::Gap {
            lost,
            first_seq: from + 1,
        }
    }

    /// Moves the current stream into the map (its next sample takes the
    /// slow path).
    fn park(&mut self) {
        if let Some(old) = self.current.take() {
            self.last
                .entry(old.node)
                .or_default()
                .insert(old.key, old.held);
        }
    }

    /// Moves the current stream into the map if it is one of `node`'s, so
    /// that `node`'s next sample goes through the caller's slow path
    /// (which, say, reports it alive again).
    pub(crate) fn park_node(&mut self, node: NodeId) {
        self.park_if(|n| n == node);
    }

    /// Moves the current stream into the map if `f` says so of its node.
    pub(crate) fn park_if(&mut self, f: impl FnOnce(NodeId) -> bool) {
        if self.current.as_ref().is_some_and(|s| f(s.node)) {
            self.park();
        }
    }

    /// The last sequence number held of (`node`, `key`).
    pub(crate) fn held_at(&self, node: NodeId, key: &str) -> Option<u64> {
        match &self.current {
            Some(c) if c.node == node && c.key == key => Some(c.held.last),
            _ => self
                .last
                .get(&node)
                .and_then(|m| m.get(key))
                .map(|h| h.last),
        }
    }

    /// Whether sample `seq` of (`node`, `key`) is newer than what is held
    /// (the history join's rule: a kept sample the subscription already
    /// has, or a live one the reply already brought, is no new sample).
    pub(crate) fn is_new(&self, node: NodeId, key: &str, seq: u64) -> bool {
        self.held_at(node, key).is_none_or(|l| seq > l)
    }

    /// Sets the last sequence number held of (`node`, `key`) (after a
    /// history join or repair: which recent ones came is not kept, so a
    /// late copy of one of them is taken as going back, as before).
    pub(crate) fn set(&mut self, node: NodeId, key: String, seq: u64) {
        match &mut self.current {
            Some(c) if c.node == node && c.key == key => c.held = Held::at(seq),
            _ => {
                self.last
                    .entry(node)
                    .or_default()
                    .insert(key, Held::at(seq));
            }
        }
    }

    /// The last sequence number held of each key of `node`.
    pub(crate) fn held(&self, node: NodeId) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .last
            .get(&node)
            .map(|m| m.iter().map(|(k, h)| (k.clone(), h.last)).collect())
            .unwrap_or_default();
        if let Some(c) = self.current.as_ref().filter(|c| c.node == node) {
            v.push((c.key.clone(), c.held.last));
        }
        v
    }

    /// Whether anything is held of `node`.
    pub(crate) fn knows(&self, node: NodeId) -> bool {
        self.last.contains_key(&node) || self.current.as_ref().is_some_and(|s| s.node == node)
    }

    /// How many keys of `node` are held.
    pub(crate) fn keys_of(&self, node: NodeId) -> usize {
        self.last.get(&node).map_or(0, HashMap::len)
            + usize::from(self.current.as_ref().is_some_and(|s| s.node == node))
    }

    /// The nodes something is held of, in no order.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        let current = self
            .current
            .as_ref()
            .map(|s| s.node)
            .filter(|n| !self.last.contains_key(n));
        self.last.keys().copied().chain(current)
    }

    /// Forgets everything held of `node`; how many keys that was.
    pub(crate) fn forget(&mut self, node: NodeId) -> usize {
        self.park_node(node);
        self.last.remove(&node).map_or(0, |m| m.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u8) -> NodeId {
        NodeId([n; 16])
    }

    /// Whether the sample goes to the application now (subscription.rs's
    /// `check_seq`).
    fn delivers(step: Step) -> bool {
        !matches!(
            step,
            Step::Unknown | Step::OverKeyLimit | Step::Duplicate | Step::Repair { .. }
        )
    }

    /// Checks `seq` of (`n`, `key`) for a member node, repairing nothing.
    fn check(b: &mut SeqBook, n: u8, key: &str, seq: u64) -> Step {
        b.check(node(n), key, seq, || true, || false, |_| true)
    }

    #[test]
    fn a_stream_starts_where_it_is_joined_and_counts_gaps_exactly() {
        let mut b = SeqBook::default();
        assert_eq!(
            check(&mut b, 1, "k", 41),
            Step::First,
            "mid-stream is no loss"
        );
        assert_eq!(check(&mut b, 1, "k", 42), Step::Next);
        assert_eq!(
            check(&mut b, 1, "k", 45),
            Step::Gap {
                lost: 2,
                first_seq: 43
            }
        );
        assert_eq!(check(&mut b, 1, "k", 46), Step::Next);
        assert_eq!(b.held_at(node(1), "k"), Some(46));
    }

    #[test]
    fn a_duplicate_is_dropped_and_changes_nothing() {
        let mut b = SeqBook::default();
        check(&mut b, 1, "k", 7);
        assert_eq!(check(&mut b, 1, "k", 7), Step::Duplicate);
        assert!(!delivers(Step::Duplicate));
        assert_eq!(check(&mut b, 1, "k", 8), Step::Next);
    }

    /// Broken, a late copy of a delivered sample (the same publisher on
    /// two paths, one lagging) is delivered again as a sequence that went
    /// back.
    #[test]
    fn a_late_copy_of_a_recent_sample_is_a_duplicate_an_undelivered_one_goes_back() {
        let mut b = SeqBook::default();
        for seq in 1..=10 {
            assert!(delivers(check(&mut b, 1, "k", seq)));
        }
        for copy in [10, 9, 7, 1] {
            assert_eq!(check(&mut b, 1, "k", copy), Step::Duplicate, "{copy}");
        }
        assert_eq!(check(&mut b, 1, "k", 11), Step::Next, "nothing changed");
        // 12 to 19 never came (reported lost): one of them arriving is no
        // copy of a delivered sample, and the count starts over from it.
        assert_eq!(
            check(&mut b, 1, "k", 20),
            Step::Gap {
                lost: 8,
                first_seq: 12
            }
        );
        assert_eq!(check(&mut b, 1, "k", 11), Step::Duplicate);
        assert_eq!(check(&mut b, 1, "k", 15), Step::Back { from: 20 });
        // Beyond the window, a delivered one is taken as going back.
        let mut b = SeqBook::default();
        for seq in 1..=RECENT + 5 {
            check(&mut b, 2, "k", seq);
        }
        assert_eq!(check(&mut b, 2, "k", 5), Step::Duplicate, "RECENT back");
        assert_eq!(check(&mut b, 2, "k", 4), Step::Back { from: RECENT + 5 });
        // A jump as large as the window forgets it.
        let mut b = SeqBook::default();
        check(&mut b, 3, "k", 1);
        check(&mut b, 3, "k", 1 + RECENT + 1);
        assert_eq!(check(&mut b, 3, "k", 1), Step::Back { from: RECENT + 2 });
    }

    #[test]
    fn going_back_starts_the_count_over_and_is_no_loss() {
        let mut b = SeqBook::default();
        check(&mut b, 1, "k", 100);
        assert_eq!(check(&mut b, 1, "k", 3), Step::Back { from: 100 });
        assert_eq!(check(&mut b, 1, "k", 4), Step::Next, "counted from 3");
    }

    #[test]
    fn a_jump_of_2_to_the_32_is_forged_one_less_is_a_gap() {
        let mut b = SeqBook::default();
        check(&mut b, 1, "k", 1);
        // lost = seq - 1 - 1 = MAX_SEQ_JUMP - 1: a loss.
        assert_eq!(
            check(&mut b, 1, "k", MAX_SEQ_JUMP + 1),
            Step::Gap {
                lost: MAX_SEQ_JUMP - 1,
                first_seq: 2
            }
        );
        let from = MAX_SEQ_JUMP + 1;
        assert_eq!(
            check(&mut b, 1, "k", from + 1 + MAX_SEQ_JUMP),
            Step::Jump { from }
        );
        assert_eq!(check(&mut b, 1, "k", from + 2 + MAX_SEQ_JUMP), Step::Next);
        // u64::MAX after 0 neither overflows nor counts as a loss.
        let mut b = SeqBook::default();
        check(&mut b, 2, "k", 0);
        assert_eq!(check(&mut b, 2, "k", u64::MAX), Step::Jump { from: 0 });
    }

    #[test]
    fn streams_keep_their_own_state_when_samples_interleave() {
        let mut b = SeqBook::default();
        for seq in 1..=3 {
            assert!(delivers(check(&mut b, 1, "a", seq)));
            assert!(delivers(check(&mut b, 1, "b", seq * 10)));
            assert!(delivers(check(&mut b, 2, "a", seq + 100)));
        }
        assert_eq!(b.held_at(node(1), "a"), Some(3));
        assert_eq!(b.held_at(node(1), "b"), Some(30));
        assert_eq!(b.held_at(node(2), "a"), Some(103));
        assert_eq!(check(&mut b, 1, "a", 4), Step::Next);
        assert_eq!(
            check(&mut b, 1, "b", 32),
            Step::Gap {
                lost: 1,
                first_seq: 31
            }
        );
        let mut held = b.held(node(1));
        held.sort();
        assert_eq!(held, [("a".to_owned(), 4), ("b".to_owned(), 32)]);
        assert_eq!(b.keys_of(node(1)), 2);
        let mut nodes: Vec<NodeId> = b.nodes().collect();
        nodes.sort();
        assert_eq!(nodes, [node(1), node(2)]);
    }

    #[test]
    fn an_unknown_node_costs_no_state_unless_remembered() {
        let mut b = SeqBook::default();
        assert_eq!(
            b.check(node(9), "k", 1, || false, || false, |_| true),
            Step::Unknown
        );
        assert!(!b.knows(node(9)));
        // A node whose state is kept (absent from discovery, say) is
        // checked against it even while the domain does not show it.
        check(&mut b, 3, "k", 5);
        check(&mut b, 3, "other", 1);
        assert_eq!(
            b.check(node(3), "k", 8, || false, || false, |_| true),
            Step::Gap {
                lost: 2,
                first_seq: 6
            }
        );
        assert_eq!(
            b.check(node(3), "new", 1, || false, || false, |_| true),
            Step::First,
            "a known node's new key"
        );
    }

    #[test]
    fn a_node_holds_at_most_max_keys_per_publisher() {
        let mut b = SeqBook::default();
        for i in 0..MAX_KEYS_PER_PUBLISHER {
            assert_eq!(check(&mut b, 1, &format!("k{i}"), 1), Step::First);
        }
        // The current stream counts among the node's keys.
        assert_eq!(check(&mut b, 1, "one/more", 1), Step::OverKeyLimit);
        assert_eq!(check(&mut b, 2, "one/more", 1), Step::First, "per node");
        assert_eq!(check(&mut b, 1, "k0", 2), Step::Next, "known keys go on");
        // The node no longer announces its odd keys: they make room for
        // a new one, whose stream starts; the even ones go on.
        let even = |k: &str| {
            k.strip_prefix('k')
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n % 2 == 0)
                || k == "one/more"
        };
        assert_eq!(
            b.check(node(1), "one/more", 1, || true, || false, even),
            Step::First
        );
        assert_eq!(b.keys_of(node(1)), MAX_KEYS_PER_PUBLISHER / 2 + 1);
        assert_eq!(check(&mut b, 1, "k2", 2), Step::Next);
        assert_eq!(
            check(&mut b, 1, "k3", 5),
            Step::First,
            "forgotten: starts over"
        );
    }

    #[test]
    fn a_gap_to_repair_keeps_the_baseline_until_history_fills_it() {
        let mut b = SeqBook::default();
        check(&mut b, 1, "k", 10);
        let step = b.check(node(1), "k", 14, || true, || true, |_| true);
        assert_eq!(step, Step::Repair { last: 10 });
        assert!(!delivers(step), "the sample waits for the repair");
        assert_eq!(b.held_at(node(1), "k"), Some(10));
        // The repair brings 11..=13, then the sample that waited.
        for seq in 11..=14 {
            assert!(b.is_new(node(1), "k", seq));
            assert_eq!(check(&mut b, 1, "k", seq), Step::Next);
        }
    }

    /// The history join: what a node's query brings is delivered first,
    /// then the live samples that waited, each sequence number once even
    /// where the two overlap, and the join's gaps are real gaps.
    #[test]
    fn a_history_reply_and_the_live_samples_it_overlaps_deliver_each_once() {
        let mut b = SeqBook::default();
        let (kept, waited) = (3..=7u64, 6..=9u64);
        let mut delivered = Vec::new();
        for seq in kept.chain(waited) {
            if b.is_new(node(1), "k", seq) {
                let step = check(&mut b, 1, "k", seq);
                assert!(matches!(step, Step::First | Step::Next), "{seq}: {step:?}");
                delivered.push(seq);
            }
        }
        assert_eq!(delivered, [3, 4, 5, 6, 7, 8, 9]);
        // A second join (a reconnection) asking from 9 brings nothing old.
        assert!(!b.is_new(node(1), "k", 9));
        assert!(b.is_new(node(1), "k", 10));
    }

    #[test]
    fn forgetting_a_node_drops_its_streams_and_only_its() {
        let mut b = SeqBook::default();
        check(&mut b, 1, "a", 1);
        check(&mut b, 1, "b", 1);
        check(&mut b, 2, "a", 1);
        check(&mut b, 1, "a", 2); // node 1's stream is the current one
        assert_eq!(b.forget(node(1)), 2);
        assert!(!b.knows(node(1)));
        assert_eq!(b.held_at(node(2), "a"), Some(1));
        assert_eq!(
            b.check(node(1), "a", 3, || false, || false, |_| true),
            Step::Unknown
        );
        assert_eq!(check(&mut b, 1, "a", 3), Step::First, "starts over");
    }

    #[test]
    fn set_moves_a_stream_forward_in_the_map_and_in_the_cache() {
        let mut b = SeqBook::default();
        check(&mut b, 1, "a", 1);
        check(&mut b, 1, "b", 1);
        b.set(node(1), "a".into(), 5); // in the map
        b.set(node(1), "b".into(), 7); // the current stream
        assert_eq!(check(&mut b, 1, "a", 6), Step::Next);
        assert_eq!(check(&mut b, 1, "b", 8), Step::Next);
        b.park_node(node(1));
        assert!(!b.is_current(node(1), "b"));
        assert_eq!(b.held_at(node(1), "b"), Some(8));
    }
}
