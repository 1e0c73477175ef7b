//! Publishers: put samples of one key.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use milonga_wire::cbor::{encode_payload, to_cbor, Encoded};
use milonga_wire::frame::{
    self, Encoding, Header, Kind, BATCH_ENTRY_HEADER_LEN, FLAG_PAYLOAD_FRAME,
};
use milonga_wire::{Bytes, Key, Value};

use crate::api::node::NodeInner;
use crate::backend::p2p::data::{DataSock, DataSocket};
use crate::backend::p2p::zmq_io;
use crate::engine::batch::{Pending, MAX_BATCH_BYTES, MAX_ENTRY_BYTES};
use crate::model::error::IntoTransport;
use crate::model::error::PutError;
use crate::model::qos::{PublisherQos, Reliability};
use crate::util::lock;
use crate::util::stats;

/// A declared publisher of one key. `Send + Sync`: share it between threads
/// (puts are serialised; sequence numbers follow the order of sends).
/// Dropping it withdraws the publication.
pub struct Publisher {
    key: Key,
    qos: PublisherQos,
    data: Arc<DataSocket>,
    /// `key | 0 | header` with the fields that never change filled in.
    template: Vec<u8>,
    /// Last sequence number sent; only written with the data socket
    /// locked. Shared with the node's state, for its goodbye.
    seq: Arc<std::sync::atomic::AtomicU64>,
    /// Declared last: dropped after `data`, so that if this holds the last
    /// reference to the node, its socket is closed before the context is
    /// terminated (which waits for every socket).
    node: Arc<NodeInner>,
}

#[derive(Clone, Copy)]
enum Wait {
    /// `try_put`: fail at once.
    No,
    /// Wait without a limit.
    Forever,
    /// Wait at most this long.
    For(Duration),
}

impl Publisher {
    /// `last_seq` continues the sequence of an earlier publisher of the same
    /// key in this node, so that subscribers see no false duplicates.
    pub(crate) fn new(
        node: Arc<NodeInner>,
        key: Key,
        qos: PublisherQos,
        data: Arc<DataSocket>,
        last_seq: u64,
    ) -> Self {
        let header = Header {
            kind: Kind::Sample,
            flags: 0,
            encoding: Encoding::Raw,
            domain_tag: node.domain_tag,
            schema_id: 0,
            node_id: node.id,
            seq: 0,
            timestamp_ns: 0,
        };
        let mut template = vec![0u8; frame::head_len(&key)];
        frame::write_head(&key, &header, &mut template);
        Publisher {
            node,
            key,
            qos,
            data,
            template,
            seq: Arc::new(last_seq.into()),
        }
    }

    /// The sequence counter, shared with the node for its goodbye.
    pub(crate) fn seq_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.seq.clone()
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.key.as_str()
    }

    /// The QoS.
    pub fn qos(&self) -> &PublisherQos {
        &self.qos
    }

    /// Puts a value. Best effort never waits; reliable waits for room up to
    /// the QoS `put_timeout`.
    pub fn put(&self, value: impl Into<Value>) -> Result<(), PutError> {
        let enc = encode_payload(&value.into(), self.node.cfg.zero_copy_threshold_bytes)?;
        self.send(enc, 0, self.default_wait())
    }

    /// Puts a value, failing with [`PutError::WouldBlock`] at once instead of
    /// waiting when a reliable publisher's subscriber is full.
    pub fn try_put(&self, value: impl Into<Value>) -> Result<(), PutError> {
        let enc = encode_payload(&value.into(), self.node.cfg.zero_copy_threshold_bytes)?;
        self.send(enc, 0, Wait::No)
    }

    /// Puts a value, waiting at most `timeout` for room (reliable only).
    pub fn put_timeout(&self, value: impl Into<Value>, timeout: Duration) -> Result<(), PutError> {
        let enc = encode_payload(&value.into(), self.node.cfg.zero_copy_threshold_bytes)?;
        self.send(enc, 0, Wait::For(timeout))
    }

    /// Puts a user type serialized with serde as CBOR, with `schema_id` in
    /// the header (0 = none).
    pub fn put_serde<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
        schema_id: u32,
    ) -> Result<(), PutError> {
        let enc = Encoded {
            encoding: Encoding::Cbor,
            head: Bytes::from(to_cbor(value)?),
            tail: None,
        };
        self.send(enc, schema_id, self.default_wait())
    }

    fn default_wait(&self) -> Wait {
        self.qos.put_timeout.map_or(Wait::Forever, Wait::For)
    }

    /// How many subscriptions currently match this key, as far as this
    /// publisher's socket has heard (subscriptions travel asynchronously).
    pub fn subscriber_count(&self) -> u32 {
        let mut d = lock(&self.data.sock);
        d.drain_subscriptions(&self.node);
        d.out
            .subscribers_of(&self.template[..self.key.as_str().len() + 1])
    }

    fn send(&self, enc: Encoded, schema_id: u32, wait: Wait) -> Result<(), PutError> {
        if self.node.closed.load(Ordering::Acquire) {
            return Err(PutError::Closed);
        }
        let tail_len = enc.tail.as_ref().map_or(0, Bytes::len);
        let size = self.template.len() + enc.head.len() + tail_len;
        if size > self.node.cfg.max_message_bytes {
            return Err(PutError::TooLarge {
                size,
                limit: self.node.cfg.max_message_bytes,
            });
        }
        let started = Instant::now();
        let reliable = self.qos.reliability == Reliability::Reliable;
        let batch_limit = MAX_BATCH_BYTES.min(self.node.cfg.max_message_bytes);
        let batchable = reliable
            && enc.tail.is_none()
            && enc.head.len() <= MAX_ENTRY_BYTES
            && self.template.len() + BATCH_ENTRY_HEADER_LEN + enc.head.len() <= batch_limit;
        // Built before taking the lock, except on a reliable socket, where
        // the sample may join a batch instead.
        let mut msg = (!reliable).then(|| self.build(&enc, schema_id));
        let mut d = lock(&self.data.sock);
        // `close` may have run while we waited for the lock; after it, no
        // batch would ever be sent.
        if self.node.closed.load(Ordering::Acquire) {
            return Err(PutError::Closed);
        }
        // Sequence number and timestamp are taken under the lock, so that
        // both follow the order in which samples leave.
        let seq = self.seq.load(Ordering::Relaxed) + 1;
        let timestamp_ns = crate::util::now_ns();

        // A batch from earlier puts of this key: this sample joins it, or it
        // leaves first. (A batch of another key need not: sequence numbers
        // are per key, and this key's subscribers may have room.)
        let key = self.key.as_str().as_bytes();
        if let Some(p) = d.out.pending().as_mut().filter(|p| p.is_key(key)) {
            if batchable && p.accepts(key, enc.encoding as u8, schema_id, enc.head.len()) {
                if p.push(timestamp_ns, &enc.head) {
                    let _ = d.send_pending(zmq::DONTWAIT, &self.node.counters);
                }
                self.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
                return self.accepted(seq);
            }
            if d.send_pending(zmq::DONTWAIT, &self.node.counters).is_err() {
                self.wait(&mut d, wait, started, |d, flags| {
                    d.send_pending(flags, &self.node.counters)
                })?;
            }
        }
        let mut msg = msg.take().unwrap_or_else(|| self.build(&enc, schema_id));
        self.stamp(&mut msg, seq, timestamp_ns);
        let head_len = self.template.len();

        let more = if enc.tail.is_some() { zmq::SNDMORE } else { 0 };
        match d.sock.send(msg, zmq::DONTWAIT | more) {
            Ok(()) => {}
            // Only a reliable (XPUB_NODROP) socket refuses a message.
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR)
                if batchable && d.out.pending().is_none() =>
            {
                let mut m = self.build(&enc, schema_id);
                self.stamp(&mut m, seq, timestamp_ns);
                *d.out.pending() = Some(Pending::start(
                    &m[..head_len],
                    timestamp_ns,
                    &enc.head,
                    batch_limit,
                ));
                self.node.batch_pending.store(true, Ordering::Release);
                self.node.wake();
                self.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
                return self.accepted(seq);
            }
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {
                // The `zmq` crate consumed the refused message: each retry
                // builds it again.
                self.wait(&mut d, wait, started, |d, flags| {
                    let mut m = self.build(&enc, schema_id);
                    self.stamp(&mut m, seq, timestamp_ns);
                    d.sock.send(m, flags | more)
                })?;
            }
            Err(e) => return Err(PutError::Socket(e.transport())),
        }
        if let Some(tail) = enc.tail.clone() {
            // The first frame is out: the payload frame must follow, or the
            // next message would be glued to this one. libzmq accepts it
            // (the high-water mark counts whole messages); only a signal
            // can interrupt it.
            loop {
                match zmq_io::send_bytes(&mut d.sock, tail.clone(), 0) {
                    Ok(()) => break,
                    Err(zmq::Error::EINTR | zmq::Error::EAGAIN) => continue,
                    Err(e) => {
                        self.seq.store(seq, Ordering::Relaxed);
                        return Err(PutError::Socket(e.transport()));
                    }
                }
            }
        }
        // After the whole message: filtered copies are messages of their own.
        self.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
        // Stored before the lock goes: another thread's put takes the
        // next number, never this one again.
        let r = self.accepted(seq);
        drop(d);
        r
    }

    /// Keeps sample `seq` in the history, if this publisher keeps one, and
    /// sends it to the filters it passes, if subscribers declared any.
    fn keep(&self, d: &mut DataSock, seq: u64, timestamp_ns: u64, enc: &Encoded, schema_id: u32) {
        let me = self.node.me();
        let filtered = d
            .out
            .accepted(&me, self.key.as_str(), seq, timestamp_ns, enc, schema_id);
        if !filtered.is_empty() {
            d.send_filtered(filtered, me.counters);
        }
    }

    /// Records that sample `seq` was taken by the socket or a batch.
    fn accepted(&self, seq: u64) -> Result<(), PutError> {
        self.seq.store(seq, Ordering::Relaxed);
        stats::inc(&self.node.counters.samples_sent);
        Ok(())
    }

    /// Retries `attempt` (which must not consume what it sends on failure)
    /// with blocking sends until it succeeds, `wait` runs out, or the node
    /// closes. libzmq wakes a blocked send when a subscriber has read enough
    /// (XPUB's POLLOUT does not reflect the high-water mark); the wait is
    /// cut in slices so that a close or a deadline is noticed.
    fn wait(
        &self,
        d: &mut DataSock,
        wait: Wait,
        started: Instant,
        attempt: impl FnMut(&mut DataSock, i32) -> zmq::Result<()>,
    ) -> Result<(), PutError> {
        // Every put that finds no room is counted, with the time it waits,
        // whether it then gets through or not.
        let c = &self.node.counters;
        stats::inc(&c.puts_blocked);
        let since = Instant::now();
        let r = self.wait_for_room(d, wait, started, attempt);
        stats::add(&c.puts_blocked_us, since.elapsed().as_micros() as u64);
        r
    }

    fn wait_for_room(
        &self,
        d: &mut DataSock,
        wait: Wait,
        started: Instant,
        mut attempt: impl FnMut(&mut DataSock, i32) -> zmq::Result<()>,
    ) -> Result<(), PutError> {
        loop {
            let left = match wait {
                Wait::No => {
                    // A writer learns that a pipe was read from libzmq's
                    // commands, which a send processes only now and then
                    // (at most once a millisecond or so): a pipe drained
                    // since may still look full. Look once more after
                    // processing them (ZMQ_EVENTS does) before saying so.
                    let _ = d.sock.get_events();
                    return match attempt(d, zmq::DONTWAIT) {
                        Ok(()) => Ok(()),
                        Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => Err(PutError::WouldBlock),
                        Err(e) => Err(PutError::Socket(e.transport())),
                    };
                }
                Wait::Forever => Duration::MAX,
                Wait::For(t) => t.saturating_sub(started.elapsed()),
            };
            if left.is_zero() {
                let Wait::For(t) = wait else {
                    unreachable!("only a bounded wait runs out")
                };
                return Err(PutError::Timeout(t));
            }
            if self.node.closed.load(Ordering::Acquire) {
                return Err(PutError::Closed);
            }
            let slice = left.min(Duration::from_millis(100));
            d.sock
                .set_sndtimeo(slice.as_millis().max(1) as i32)
                .map_err(|e| PutError::Socket(e.transport()))?;
            match attempt(d, 0) {
                Ok(()) => return Ok(()),
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {}
                Err(e) => return Err(PutError::Socket(e.transport())),
            }
        }
    }

    /// The first frame: `key | 0 | header | head of the payload`. Built
    /// again for a retry after EAGAIN, because the `zmq` crate consumes the
    /// message even when the send fails.
    fn build(&self, enc: &Encoded, schema_id: u32) -> zmq::Message {
        let h = self.key.as_str().len() + 1;
        let mut msg = zmq::Message::with_size(self.template.len() + enc.head.len());
        let (head, body) = msg.split_at_mut(self.template.len());
        head.copy_from_slice(&self.template);
        body.copy_from_slice(&enc.head);
        use frame::offset::{ENCODING, FLAGS, SCHEMA_ID};
        head[h + FLAGS] = if enc.tail.is_some() {
            FLAG_PAYLOAD_FRAME
        } else {
            0
        };
        head[h + ENCODING] = enc.encoding as u8;
        head[h + SCHEMA_ID..h + SCHEMA_ID + 4].copy_from_slice(&schema_id.to_le_bytes());
        msg
    }

    /// Writes the sequence number and source timestamp into a built frame.
    fn stamp(&self, msg: &mut zmq::Message, seq: u64, timestamp_ns: u64) {
        let h = self.key.as_str().len() + 1;
        use frame::offset::{SEQ, TIMESTAMP_NS};
        msg[h + SEQ..h + SEQ + 8].copy_from_slice(&seq.to_le_bytes());
        msg[h + TIMESTAMP_NS..h + TIMESTAMP_NS + 8].copy_from_slice(&timestamp_ns.to_le_bytes());
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("key", &self.key.as_str())
            .field("qos", &self.qos)
            .finish()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if self.qos.history > 0 {
            lock(&self.data.sock).out.forget_history(self.key.as_str());
        }
        let removed = {
            let mut st = lock(&self.node.state);
            st.last_seq.insert(
                self.key.as_str().to_owned(),
                self.seq.load(Ordering::Relaxed),
            );
            st.pub_seqs.remove(self.key.as_str());
            st.publications.remove(self.key.as_str()).is_some()
        };
        if removed && !self.node.closed.load(Ordering::Acquire) {
            self.node.announce();
        }
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Publisher>();
}
