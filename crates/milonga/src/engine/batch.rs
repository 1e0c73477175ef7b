//! Opportunistic batching of a reliable publisher's samples.
//!
//! When a reliable data socket cannot take a sample at once (a subscriber's
//! queue is full), waiting in `put` would leave the socket idle the moment
//! room appears, and every later sample would pay the full per-message cost
//! of ZeroMQ. Instead the sample starts a *batch* (a v1 frame of kind 2):
//! later samples of the same key join it, and the whole batch leaves as one
//! ZeroMQ message as soon as the socket takes it, tried at every put and by
//! the node thread every millisecond. A sample never waits for a batch to
//! fill: a batch exists only while the socket is busy, so it delays nothing
//! that could have left earlier (seed 000, section 5.1). A batch is bounded
//! (`MAX_BATCH_BYTES`); when it is full, `put` waits as before.

use bytes::BytesMut;
use milonga_wire::frame::{Kind, BATCH_ENTRY_HEADER_LEN};

/// Largest batch frame, in bytes.
pub(crate) const MAX_BATCH_BYTES: usize = 128 << 10;
/// Largest sample payload that joins a batch; larger ones go alone.
pub(crate) const MAX_ENTRY_BYTES: usize = 16 << 10;

use milonga_wire::frame::offset::{ENCODING, KIND, SCHEMA_ID as SCHEMA};
use milonga_wire::frame::HEADER_LEN as HEADER;

/// A batch waiting for the socket.
#[derive(Debug)]
pub(crate) struct Pending {
    /// `key | 0 | header (kind 2) | entries`.
    frame: BytesMut,
    /// How far the frame's buffer has been written (entries, or zeros
    /// ahead of them: see [`Pending::push`]).
    touched: usize,
    /// Length of the key.
    key_len: usize,
    samples: u64,
    /// Samples added since the socket was last offered the batch.
    since_offer: u32,
    /// Largest frame: `MAX_BATCH_BYTES`, or `max_message_bytes` if smaller.
    limit: usize,
}

/// A busy socket is offered the batch again after this many more samples
/// (and by the node thread every millisecond): each offer costs about as
/// much as sending a small message, and a few samples' delay is a few
/// microseconds.
const OFFER_EVERY: u32 = 16;

/// Bytes of a batch's buffer zeroed at a time ahead of its entries.
///
/// A batch's buffer is new memory, often last touched by the ZeroMQ I/O
/// thread that sent an earlier batch on another core. Written an entry at
/// a time, each new cache line is a miss that the next atomic instruction
/// of `put` (a lock, a counter) waits for: a `perf annotate` of a 92-byte
/// flood put 26% of the publisher's time on one such instruction. Zeroing
/// a few pages ahead in one `memset` fetches the lines together, before the
/// entries are written (docs/benchmarks.md, "Reliable throughput").
const TOUCH_AHEAD: usize = 8 << 10;

impl Pending {
    /// A batch holding one sample. `head` is the sample's own `key | 0 |
    /// header`, complete (encoding, schema, sequence number, timestamp).
    pub(crate) fn start(head: &[u8], timestamp_ns: u64, payload: &[u8], limit: usize) -> Pending {
        let key_len = head.len() - HEADER - 1;
        let mut frame = BytesMut::with_capacity(limit.min(head.len() + 64 * (payload.len() + 12)));
        frame.extend_from_slice(head);
        frame[key_len + 1 + KIND] = Kind::Batch as u8;
        let mut p = Pending {
            touched: frame.len(),
            frame,
            key_len,
            samples: 0,
            since_offer: 0,
            limit,
        };
        p.push(timestamp_ns, payload);
        p
    }

    /// Whether a sample of `key` with this encoding, schema id and payload
    /// length can join.
    pub(crate) fn accepts(
        &self,
        key: &[u8],
        encoding: u8,
        schema_id: u32,
        payload_len: usize,
    ) -> bool {
        let h = self.key_len + 1;
        self.is_key(key)
            && self.frame[h + ENCODING] == encoding
            && self.frame[h + SCHEMA..h + SCHEMA + 4] == schema_id.to_le_bytes()
            && payload_len <= MAX_ENTRY_BYTES
            && self.frame.len() + BATCH_ENTRY_HEADER_LEN + payload_len <= self.limit
    }

    /// Whether the batch holds samples of `key`.
    pub(crate) fn is_key(&self, key: &[u8]) -> bool {
        key == &self.frame[..self.key_len]
    }

    /// Appends a sample; its sequence number is the next of the batch.
    /// Returns whether it is time to offer the batch to the socket again.
    pub(crate) fn push(&mut self, timestamp_ns: u64, payload: &[u8]) -> bool {
        let len = u32::try_from(payload.len()).expect("entries are at most MAX_ENTRY_BYTES");
        let need = BATCH_ENTRY_HEADER_LEN + payload.len();
        if self.frame.len() + need > self.frame.capacity() {
            // A batch that outgrows its first buffer is a flood's: it
            // grows to the largest frame at once (one copy, not one per
            // doubling, and no more than that: `reserve` would double);
            // the new buffer is untouched past the entries.
            let mut grown = BytesMut::with_capacity(self.limit.max(self.frame.len() + need));
            grown.extend_from_slice(&self.frame);
            self.frame = grown;
            self.touched = self.frame.len();
        }
        if self.frame.len() + need > self.touched {
            // `touched` is within the capacity: `from <= to <= spare.len()`.
            let from = self.touched - self.frame.len();
            let spare = self.frame.spare_capacity_mut();
            let to = spare.len().min(from + need.max(TOUCH_AHEAD));
            for b in &mut spare[from..to] {
                b.write(0);
            }
            self.touched = self.frame.len() + to;
        }
        debug_assert!(self.frame.len() + need <= self.touched);
        debug_assert!(self.touched <= self.frame.capacity());
        self.frame.extend_from_slice(&len.to_le_bytes());
        self.frame.extend_from_slice(&timestamp_ns.to_le_bytes());
        self.frame.extend_from_slice(payload);
        self.samples += 1;
        self.since_offer += 1;
        if self.since_offer >= OFFER_EVERY {
            self.since_offer = 0;
            true
        } else {
            false
        }
    }

    /// Number of samples in the batch.
    pub(crate) fn samples(&self) -> u64 {
        self.samples
    }

    /// The key and the sequence number of the first sample waiting.
    pub(crate) fn first(&self) -> (&[u8], u64) {
        let at = self.key_len + 1 + milonga_wire::frame::offset::SEQ;
        let seq = u64::from_le_bytes(self.frame[at..at + 8].try_into().expect("8 bytes"));
        (&self.frame[..self.key_len], seq)
    }

    /// Tries to send the batch with `send`, which must release the frame
    /// when it fails. On success the batch is gone; on failure it stays,
    /// untouched, for the next try.
    pub(crate) fn send<E>(
        slot: &mut Option<Pending>,
        send: impl FnOnce(bytes::Bytes) -> Result<(), E>,
    ) -> Result<(), E> {
        let Some(p) = slot.as_mut() else {
            return Ok(());
        };
        let frame = std::mem::take(&mut p.frame).freeze();
        match send(frame.clone()) {
            Ok(()) => {
                *slot = None;
                Ok(())
            }
            Err(e) => {
                // The refused message released its reference: ours is the
                // only one, and the buffer comes back without a copy.
                p.frame = frame
                    .try_into_mut()
                    .unwrap_or_else(|f| BytesMut::from(&f[..]));
                // The same buffer, or, while another reference to the
                // frame remains, a copy untouched past the entries.
                p.touched = p.touched.min(p.frame.capacity());
                debug_assert!(p.frame.len() <= p.touched);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use milonga_wire::frame::{self, decode, domain_tag, BatchEntries, Encoding, Header, NodeId};
    use milonga_wire::Key;

    fn head(key: &str, seq: u64, ts: u64, encoding: Encoding) -> Vec<u8> {
        let k = Key::new(key).unwrap();
        let h = Header {
            kind: Kind::Sample,
            flags: 0,
            encoding,
            domain_tag: domain_tag("d"),
            schema_id: 0,
            node_id: NodeId([1; 16]),
            seq,
            timestamp_ns: ts,
        };
        let mut out = vec![0; frame::head_len(&k)];
        frame::write_head(&k, &h, &mut out);
        out
    }

    #[test]
    fn a_batch_is_a_valid_v1_frame() {
        let mut p = Pending::start(
            &head("a/b", 7, 100, Encoding::Raw),
            100,
            b"one",
            MAX_BATCH_BYTES,
        );
        assert!(p.accepts(b"a/b", 0, 0, 3));
        assert!(!p.accepts(b"a/c", 0, 0, 3), "another key");
        assert!(!p.accepts(b"a/bc", 0, 0, 3), "a longer key");
        assert!(!p.accepts(b"a/b", 1, 0, 3), "another encoding");
        assert!(!p.accepts(b"a/b", 0, 5, 3), "another schema");
        assert!(!p.accepts(b"a/b", 0, 0, MAX_ENTRY_BYTES + 1));
        p.push(101, b"two");
        p.push(102, b"");
        let f = p.frame.clone().freeze();
        let v = decode(&f).unwrap();
        assert_eq!(v.header.kind, Kind::Batch);
        assert_eq!(v.header.seq, 7);
        let e: Vec<_> = BatchEntries::new(v.body)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(e.len(), 3);
        assert_eq!((e[1].payload, e[1].timestamp_ns), (&b"two"[..], 101));
        assert_eq!(p.samples(), 3);
    }

    #[test]
    fn a_batch_is_bounded() {
        let payload = vec![0u8; MAX_ENTRY_BYTES];
        let h = head("k", 1, 1, Encoding::Raw);
        let mut p = Pending::start(&h, 1, &payload, MAX_BATCH_BYTES);
        let mut n = 1;
        while p.accepts(b"k", 0, 0, payload.len()) {
            p.push(1, &payload);
            n += 1;
        }
        assert!(p.frame.len() <= MAX_BATCH_BYTES);
        assert_eq!(n, MAX_BATCH_BYTES / (MAX_ENTRY_BYTES + 12));
    }

    /// A flood's batch outgrows its first buffer and the zeroed stretch
    /// ahead of its entries many times, and is refused by a full socket
    /// on the way (its buffer given back, or copied when the refused frame
    /// is still referenced): every entry reads back as written, within the
    /// largest frame.
    #[test]
    fn a_full_batch_keeps_every_entry() {
        for limit in [MAX_BATCH_BYTES, 4096] {
            for copied in [false, true] {
                full_batch(limit, copied);
            }
        }
    }

    fn full_batch(limit: usize, copied: bool) {
        let entry = |i: u64| vec![(i % 251) as u8; (i as usize * 37) % 300];
        let h = head("k", 1, 1, Encoding::Raw);
        let mut p = Pending::start(&h, 0, &entry(0), limit);
        let mut n = 1u64;
        let mut kept = None;
        while p.accepts(b"k", 0, 0, entry(n).len()) {
            p.push(n, &entry(n));
            assert!(
                p.frame.capacity() <= limit,
                "{} > {limit}",
                p.frame.capacity()
            );
            n += 1;
            if n == 10 || n == 500 {
                let mut slot = Some(p);
                let refused: Result<(), ()> = Pending::send(&mut slot, |f| {
                    // A reference kept: the batch gets a copy back.
                    if copied {
                        kept = Some(f);
                    }
                    Err(())
                });
                assert!(refused.is_err());
                p = slot.expect("a refused batch stays");
            }
        }
        assert!(n > 10, "{n} entries");
        drop(kept);
        let mut slot = Some(p);
        let mut sent = None;
        Pending::send(&mut slot, |f| {
            sent = Some(f);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert!(slot.is_none());
        let f = sent.unwrap();
        assert!(f.len() <= limit);
        let v = decode(&f).unwrap();
        let e: Vec<_> = BatchEntries::new(v.body)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(e.len() as u64, n);
        for (i, x) in e.iter().enumerate() {
            assert_eq!(
                (x.payload, x.timestamp_ns),
                (&entry(i as u64)[..], i as u64)
            );
        }
    }
}
