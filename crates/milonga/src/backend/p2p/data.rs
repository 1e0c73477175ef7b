//! A data socket: the XPUB that the publishers of one reliability share,
//! with the [`Outlet`] state they share with it. This module moves frames
//! between the two: what subscribers send upstream, waiting batches, the
//! frames of history replies and filters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use milonga_wire::cbor::Encoded;
use milonga_wire::frame::{self, BATCH_ENTRY_HEADER_LEN, FLAG_PAYLOAD_FRAME};
use milonga_wire::{Bytes, Key};

use crate::backend::p2p::curve::Guard;
use crate::backend::p2p::shm;
use crate::backend::p2p::zmq_io;
use crate::backend::p2p::P2p;
use crate::engine::batch::{Pending, MAX_BATCH_BYTES, MAX_ENTRY_BYTES};
use crate::engine::outlet::{Outlet, Stamp, Upstream};
use crate::engine::Me;
use crate::model::error::{IntoTransport, OpenError, PutError};
use crate::model::node::NodeCore;
use crate::model::qos::Reliability;
use crate::util::lock;
use crate::util::stats::{self, Counters};
use milonga_wire::shm::SharedRef;

/// A data socket (XPUB) shared by the publishers of one reliability.
pub(crate) struct DataSocket {
    pub(crate) sock: Mutex<DataSock>,
    pub(crate) endpoint: String,
    pub(crate) reliability: Reliability,
    /// Its name in history queries and filter declarations (its outlet's).
    pub(crate) name: String,
    /// Its place among the node's data sockets (its ZAP domain ends with it).
    pub(crate) number: u32,
    /// The node's first of its reliability: the one the announcement's
    /// `data_best_effort` / `data_reliable` names.
    pub(crate) first: bool,
    /// A broker client's move to another broker, left here when a put
    /// holds `sock` (`P2p::move_uplink`): shared with the [`DataSock`].
    pub(crate) moving: Arc<Mutex<Option<SocketMove>>>,
}

/// A broker client's data socket leaving its broker's endpoint for the
/// next broker's (`P2p::move_uplink`). Made by the node thread; applied by
/// whoever holds the socket: the node thread, or a reliable put that
/// waits for room. Such a put waits on the old broker's connection,
/// which libzmq keeps (full) while it tries to reconnect to a broker that
/// is gone: only the move frees it, so the put must not keep the node
/// thread from making it.
pub(crate) struct SocketMove {
    /// The endpoint to leave, if the socket was at a broker.
    pub(crate) from: Option<String>,
    pub(crate) to: String,
}

impl SocketMove {
    /// Disconnects `sock` from the old broker and connects it to the new.
    pub(crate) fn apply(self, p2p: &P2p, sock: &zmq::Socket) {
        if let Some(from) = &self.from {
            let _ = sock.disconnect(from);
        }
        if let Err(e) = p2p.secure_client(sock, &self.to) {
            tracing::warn!(err = %e, broker = %self.to, "a data socket cannot connect to the new broker");
        } else if let Err(e) = sock.connect(&self.to) {
            tracing::warn!(err = %e, broker = %self.to, "a data socket cannot connect to the new broker");
        }
    }
}

impl DataSocket {
    /// Binds data socket `number` of the node, of `reliability` (XPUB;
    /// reliable: with `XPUB_NODROP`): the socket and its monitor, for the
    /// node thread. The `first` of its reliability is bound at the
    /// configured endpoint, if any; the others (access control) at any port.
    pub(crate) fn open(
        p2p: &P2p,
        reliability: Reliability,
        number: u32,
        first: bool,
    ) -> Result<(DataSocket, crate::backend::p2p::control::NodeMonitor), OpenError> {
        let node = p2p.core();
        let mut sock = p2p.ctx().socket(zmq::XPUB)?;
        let fixed = match reliability {
            Reliability::BestEffort => node.cfg.data_endpoint.as_ref(),
            Reliability::Reliable => node.cfg.reliable_data_endpoint.as_ref(),
        };
        let role: &'static str = match reliability {
            Reliability::BestEffort => "be",
            Reliability::Reliable => "r",
        };
        let endpoint = match first {
            true => p2p.endpoint_for(role, fixed),
            false => p2p.endpoint_for(&format!("{role}{number}"), None),
        };
        let opt_err = |source: zmq::Error| OpenError::Socket {
            action: "configure",
            endpoint: endpoint.clone(),
            source: source.transport(),
        };
        zmq_io::apply_common(&sock, &node.cfg).map_err(opt_err)?;
        zmq_io::apply_sending(&mut sock).map_err(opt_err)?;
        // Subscriptions and history queries are small; refuse anything
        // large on this side.
        sock.set_maxmsgsize(crate::engine::history::MAX_QUERY_BYTES as i64)
            .map_err(opt_err)?;
        sock.set_linger(node.cfg.close_linger_ms).map_err(opt_err)?;
        zmq_io::set_xpub_verboser(&mut sock).map_err(opt_err)?;
        // A data socket admits only keys its rules let subscribe to
        // something (see `curve::admit`).
        p2p.secure_data_server(&mut sock, number)?;
        // With access control, history queries are checked (`DataSock::gate`).
        let gate = p2p.guard().filter(|g| g.has_acl());
        if reliability == Reliability::Reliable {
            zmq_io::set_xpub_nodrop(&mut sock, true).map_err(opt_err)?;
            sock.set_sndhwm(node.cfg.reliable_send_hwm.max(1))
                .map_err(opt_err)?;
        } else {
            // No subscriber holds a best-effort publisher back: its side
            // sends no PINGs of its own, and closes a connection whose
            // subscriber stops sending PINGs (frozen, or its host dead)
            // at their TTL (docs/protocol.md §1).
            zmq_io::answer_pings(&mut sock).map_err(opt_err)?;
        }
        let plane = match reliability {
            Reliability::BestEffort => crate::backend::p2p::uplink::Plane::BestEffort,
            Reliability::Reliable => crate::backend::p2p::uplink::Plane::Reliable,
        };
        let bound = p2p.place(&sock, &endpoint, plane)?;
        let monitor =
            crate::backend::p2p::control::monitor(p2p, &sock, &format!("{role}{number}"))?;
        let name = match first {
            true => reliability.as_str().to_owned(),
            false => format!("{}/{number}", reliability.as_str()),
        };
        let moving = Arc::new(Mutex::new(None));
        Ok((
            DataSocket {
                sock: Mutex::new(DataSock {
                    out: Outlet::named(name.clone()),
                    gate,
                    inproc: node.cfg.transport == crate::model::config::Transport::Inproc,
                    moving: moving.clone(),
                    ..DataSock::new(sock, reliability)
                }),
                endpoint: bound,
                reliability,
                name,
                number,
                first,
                moving,
            },
            (role, monitor),
        ))
    }

    /// Leaves out the next `n` sequence numbers of `put`'s key, so that
    /// its subscribers count `n` samples lost there (a recording's gap,
    /// replayed). A batch of that key still waiting leaves first, waiting
    /// for room as a put does: its entries' numbers run on without a hole.
    pub(crate) fn skip(&self, put: &Put<'_>, n: u64, wait: Wait) -> Result<(), PutError> {
        let started = matches!(wait, Wait::For(_)).then(Instant::now);
        let mut d = lock(&self.sock);
        if put.p2p.core().is_closed() {
            return Err(PutError::Closed);
        }
        let key = put.key.as_str().as_bytes();
        if d.out.pending().as_ref().is_some_and(|p| p.is_key(key))
            && d.send_pending(zmq::DONTWAIT, &put.p2p.core().counters)
                .is_err()
        {
            put.wait(&mut d, wait, started, |d, flags| {
                d.send_pending(flags, &put.p2p.core().counters)
            })?;
        }
        let seq = put.seq.load(Ordering::Relaxed);
        put.seq.store(seq.saturating_add(n), Ordering::Relaxed);
        Ok(())
    }

    /// Puts one encoded sample (see [`Put`]): it leaves at once, joins or
    /// starts a batch (reliable), or waits for room as `wait` says.
    pub(crate) fn put(
        &self,
        put: &Put<'_>,
        enc: Encoded,
        schema_id: u32,
        wait: Wait,
    ) -> Result<(), PutError> {
        if put.p2p.core().is_closed() {
            return Err(PutError::Closed);
        }
        let tail_len = enc.tail.as_ref().map_or(0, Bytes::len);
        let size = put.template.len() + enc.head.len() + tail_len;
        if size > put.p2p.core().cfg.max_message_bytes {
            return Err(PutError::TooLarge {
                size,
                limit: put.p2p.core().cfg.max_message_bytes,
            });
        }
        // A bounded put's wait counts from here; only it reads the clock
        // (a read costs as much as a fifth of a small put).
        let started = matches!(wait, Wait::For(_)).then(Instant::now);
        // Compressed on the wire when the publisher says and it shrinks
        // (docs/compression.md); history and filters keep the plain
        // payload, and a compressed sample never joins a batch.
        let parts = [&enc.head[..], enc.tail.as_deref().unwrap_or_default()];
        let n = if enc.tail.is_some() { 2 } else { 1 };
        let (deflated, dictionary) = match put.dictionary {
            Some(dict) => dict.deflate(put.compression, &parts[..n]),
            None => (put.compression.deflate(&parts[..n]), None),
        };
        let deflated = deflated.map(|body| Encoded {
            encoding: enc.encoding,
            head: Bytes::from(body),
            tail: None,
        });
        let (sent, flags) = match &deflated {
            Some(d) => (d, frame::FLAG_COMPRESSED),
            None => (&enc, 0),
        };
        let reliable = put.reliable;
        let batch_limit = MAX_BATCH_BYTES.min(put.p2p.core().cfg.max_message_bytes);
        let batchable = reliable
            && flags == 0
            && enc.tail.is_none()
            && enc.head.len() <= MAX_ENTRY_BYTES
            && put.template.len() + BATCH_ENTRY_HEADER_LEN + enc.head.len() <= batch_limit;
        // Built before taking the lock, except on a reliable socket, where
        // the sample may join a batch instead.
        let mut msg = (!reliable).then(|| put.build(sent, schema_id, flags));
        let mut d = lock(&self.sock);
        // The dictionary a body was made with is answered to queries
        // before that body leaves (added again if the socket forgot it).
        if let Some(t) = dictionary {
            d.out.add_dictionary(t.id, &t.bytes);
        }
        // `close` may have run while we waited for the lock; after it, no
        // batch would ever be sent.
        if put.p2p.core().is_closed() {
            return Err(PutError::Closed);
        }
        // Sequence number and timestamp are taken under the lock, so that
        // both follow the order in which samples leave.
        let seq = put.seq.load(Ordering::Relaxed) + 1;
        let timestamp_ns = put.timestamp_ns.unwrap_or_else(crate::util::now_ns);

        // A batch from earlier puts of this key: this sample joins it, or it
        // leaves first. (A batch of another key need not: sequence numbers
        // are per key, and this key's subscribers may have room.)
        let key = put.key.as_str().as_bytes();
        if let Some(p) = d.out.pending().as_mut().filter(|p| p.is_key(key)) {
            if batchable && p.accepts(key, enc.encoding as u8, schema_id, enc.head.len()) {
                if p.push(timestamp_ns, &enc.head) {
                    let _ = d.send_pending(zmq::DONTWAIT, &put.p2p.core().counters);
                }
                put.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
                return put.accepted(seq);
            }
            if d.send_pending(zmq::DONTWAIT, &put.p2p.core().counters)
                .is_err()
            {
                put.wait(&mut d, wait, started, |d, flags| {
                    d.send_pending(flags, &put.p2p.core().counters)
                })?;
            }
        }
        // Same-host shared memory: the payload frame written once into the
        // socket's segment, a reference sent instead, to the subscriptions
        // that asked (docs/shared-memory.md, docs/protocol.md §4.6).
        if let Some((body, r, arrivals)) = d.share(put, sent, flags) {
            let build = || put.build_reference(&body, sent.encoding, schema_id, seq, timestamp_ns);
            let done = match d.sock.send(build(), zmq::DONTWAIT) {
                Ok(()) => Ok(()),
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {
                    put.wait(&mut d, wait, started, |d, send_flags| {
                        d.sock.send(build(), send_flags)
                    })
                }
                Err(e) => Err(PutError::Socket(e.transport())),
            };
            if let Err(e) = done {
                d.unshare(&r);
                return Err(e);
            }
            d.shared_sent(put.p2p.core(), &r, arrivals);
            put.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
            stats::inc(&put.p2p.core().counters.shm_sent);
            let accepted = put.accepted(seq);
            drop(d);
            return accepted;
        }
        let mut msg = msg
            .take()
            .unwrap_or_else(|| put.build(sent, schema_id, flags));
        put.stamp(&mut msg, seq, timestamp_ns);
        let head_len = put.template.len();

        let more = if sent.tail.is_some() { zmq::SNDMORE } else { 0 };
        match d.sock.send(msg, zmq::DONTWAIT | more) {
            Ok(()) => {}
            // Only a reliable (XPUB_NODROP) socket refuses a message.
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR)
                if batchable && d.out.pending().is_none() =>
            {
                let mut m = put.build(&enc, schema_id, 0);
                put.stamp(&mut m, seq, timestamp_ns);
                *d.out.pending() = Some(Pending::start(
                    &m[..head_len],
                    timestamp_ns,
                    &enc.head,
                    batch_limit,
                ));
                put.p2p.note_batch_pending();
                put.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
                return put.accepted(seq);
            }
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {
                // The `zmq` crate consumed the refused message: each retry
                // builds it again.
                put.wait(&mut d, wait, started, |d, send_flags| {
                    let mut m = put.build(sent, schema_id, flags);
                    put.stamp(&mut m, seq, timestamp_ns);
                    d.sock.send(m, send_flags | more)
                })?;
            }
            Err(e) => return Err(PutError::Socket(e.transport())),
        }
        if let Some(tail) = sent.tail.clone() {
            // The first frame is out: the payload frame must follow, or the
            // next message would be glued to this one. libzmq accepts it
            // (the high-water mark counts whole messages); only a signal
            // can interrupt it.
            loop {
                match zmq_io::send_bytes(&mut d.sock, tail.clone(), 0) {
                    Ok(()) => break,
                    Err(zmq::Error::EINTR | zmq::Error::EAGAIN) => continue,
                    Err(e) => {
                        put.seq.store(seq, Ordering::Relaxed);
                        return Err(PutError::Socket(e.transport()));
                    }
                }
            }
        }
        // After the whole message: filtered copies are messages of their own.
        put.keep(&mut d, seq, timestamp_ns, &enc, schema_id);
        if flags != 0 {
            stats::inc(&put.p2p.core().counters.frames_deflated);
        }
        // Stored before the lock goes: another thread's put takes the
        // next number, never this one again.
        let r = put.accepted(seq);
        drop(d);
        r
    }
}

/// How long a put may wait for room.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// `try_put`: fail at once.
    No,
    /// Wait without a limit.
    Forever,
    /// Wait at most this long.
    For(Duration),
}

/// One publisher's part of a put: who puts, which key, and the frame
/// template and sequence counter it keeps.
pub(crate) struct Put<'a> {
    pub(crate) p2p: &'a P2p,
    pub(crate) key: &'a Key,
    /// `key | 0 | header` with the fields that never change filled in.
    pub(crate) template: &'a [u8],
    /// Last sequence number sent; only written with the data socket
    /// locked.
    pub(crate) seq: &'a AtomicU64,
    pub(crate) reliable: bool,
    /// The source timestamp the application gave (`put_at`), else the
    /// time of the put.
    pub(crate) timestamp_ns: Option<u64>,
    /// How its samples are compressed on the wire.
    pub(crate) compression: &'a crate::Compression,
    /// Its zstd dictionary, if its compression trains one.
    pub(crate) dictionary: Option<&'a crate::engine::compress::Dictionary>,
    /// A loan's slot, when the payload frame is a filled loan of the
    /// socket's segment (published in place instead of copied).
    pub(crate) claim: Option<shm::Claim>,
}

impl Put<'_> {
    /// Keeps sample `seq` in the history, if this publisher keeps one, and
    /// sends it to the filters it passes, if subscribers declared any.
    fn keep(&self, d: &mut DataSock, seq: u64, timestamp_ns: u64, enc: &Encoded, schema_id: u32) {
        let me = Me::from(self.p2p.core());
        // A loan's slot would stay held for as long as the history keeps
        // it, and stop the ring: the history keeps a copy.
        let copied;
        let enc = match (&self.claim, &enc.tail) {
            (Some(_), Some(tail)) if d.out.keeps_history(self.key.as_str()) => {
                copied = Encoded {
                    encoding: enc.encoding,
                    head: enc.head.clone(),
                    tail: Some(Bytes::copy_from_slice(tail)),
                };
                &copied
            }
            _ => enc,
        };
        let filtered = d.out.accepted(
            &me,
            self.key.as_str(),
            enc,
            Stamp {
                seq,
                timestamp_ns,
                schema_id,
                flags: self.flags(),
            },
        );
        if !filtered.is_empty() {
            d.send_filtered(filtered, me.counters);
        }
    }

    /// Records that sample `seq` was taken by the socket or a batch.
    fn accepted(&self, seq: u64) -> Result<(), PutError> {
        self.seq.store(seq, Ordering::Relaxed);
        stats::inc(&self.p2p.core().counters.samples_sent);
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
        started: Option<Instant>,
        attempt: impl FnMut(&mut DataSock, i32) -> zmq::Result<()>,
    ) -> Result<(), PutError> {
        // Every put that finds no room is counted, with the time it waits,
        // whether it then gets through or not.
        let c = &self.p2p.core().counters;
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
        started: Option<Instant>,
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
                Wait::For(t) => t.saturating_sub(started.map_or(Duration::ZERO, |s| s.elapsed())),
            };
            if left.is_zero() {
                let Wait::For(t) = wait else {
                    unreachable!("only a bounded wait runs out")
                };
                return Err(PutError::Timeout(t));
            }
            if self.p2p.core().is_closed() {
                return Err(PutError::Closed);
            }
            // A move to another broker, left for this put (which holds the
            // socket): the room it waits for may be on the old broker's
            // connection, which only the move lets go.
            let moved = lock(&d.moving).take();
            if let Some(m) = moved {
                m.apply(self.p2p, &d.sock);
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
    fn build(&self, enc: &Encoded, schema_id: u32, flags: u8) -> zmq::Message {
        let h = self.key.as_str().len() + 1;
        let mut msg = zmq::Message::with_size(self.template.len() + enc.head.len());
        let (head, body) = msg.split_at_mut(self.template.len());
        head.copy_from_slice(self.template);
        body.copy_from_slice(&enc.head);
        use frame::offset::{ENCODING, FLAGS, SCHEMA_ID};
        // The template's flags (replayed) and the payload's.
        head[h + FLAGS] = self.template[h + FLAGS]
            | flags
            | if enc.tail.is_some() {
                FLAG_PAYLOAD_FRAME
            } else {
                0
            };
        head[h + ENCODING] = enc.encoding as u8;
        head[h + SCHEMA_ID..h + SCHEMA_ID + 4].copy_from_slice(&schema_id.to_le_bytes());
        msg
    }

    /// A reference frame (docs/protocol.md §4.6): the host's marker head,
    /// then the first frame as [`Put::build`] makes it with flag bit 3 and
    /// `body` (the reference and the payload's head), stamped.
    fn build_reference(
        &self,
        body: &[u8],
        encoding: milonga_wire::frame::Encoding,
        schema_id: u32,
        seq: u64,
        timestamp_ns: u64,
    ) -> zmq::Message {
        let marker = shm::marker().unwrap_or_default();
        let (m, t) = (marker.len(), self.template.len());
        let mut msg = zmq::Message::with_size(m + t + body.len());
        msg[..m].copy_from_slice(marker);
        msg[m..m + t].copy_from_slice(self.template);
        msg[m + t..].copy_from_slice(body);
        let h = m + self.key.as_str().len() + 1;
        use frame::offset::{ENCODING, FLAGS, SCHEMA_ID, SEQ, TIMESTAMP_NS};
        msg[h + FLAGS] = self.template[h - m + FLAGS] | frame::FLAG_SHARED_MEMORY;
        msg[h + ENCODING] = encoding as u8;
        msg[h + SCHEMA_ID..h + SCHEMA_ID + 4].copy_from_slice(&schema_id.to_le_bytes());
        msg[h + SEQ..h + SEQ + 8].copy_from_slice(&seq.to_le_bytes());
        msg[h + TIMESTAMP_NS..h + TIMESTAMP_NS + 8].copy_from_slice(&timestamp_ns.to_le_bytes());
        msg
    }

    /// The flags every frame of this publisher carries (replayed).
    fn flags(&self) -> u8 {
        let h = self.key.as_str().len() + 1;
        self.template[h + frame::offset::FLAGS] & frame::FLAG_REPLAYED
    }

    /// Writes the sequence number and source timestamp into a built frame.
    fn stamp(&self, msg: &mut zmq::Message, seq: u64, timestamp_ns: u64) {
        let h = self.key.as_str().len() + 1;
        use frame::offset::{SEQ, TIMESTAMP_NS};
        msg[h + SEQ..h + SEQ + 8].copy_from_slice(&seq.to_le_bytes());
        msg[h + TIMESTAMP_NS..h + TIMESTAMP_NS + 8].copy_from_slice(&timestamp_ns.to_le_bytes());
    }
}

/// The socket and its publications' state, behind one lock.
pub(crate) struct DataSock {
    pub(crate) sock: zmq::Socket,
    pub(crate) out: Outlet,
    /// With access control: the node's security, whose rules decide each
    /// history query (subscriptions are decided per connection, at the
    /// handshake: `curve::admit`).
    gate: Option<Arc<Guard>>,
    /// The socket is inproc (no handshake, no key: the node's own process).
    inproc: bool,
    /// Its shared-memory segment, made on first use; `Err` once making
    /// one failed (logged; its samples then go through the socket).
    ring: Option<Result<shm::Ring, ()>>,
    /// The socket is reliable (`XPUB_NODROP`).
    reliable: bool,
    /// A move to another broker waiting for this socket's holder
    /// ([`SocketMove`]).
    moving: Arc<Mutex<Option<SocketMove>>>,
}

/// What the gate makes of one message from a subscriber.
enum Gate {
    /// On to the outlet, as without access control.
    Pass,
    /// Refused (and told): dropped here.
    Drop,
}

/// Most messages (subscriptions, queries, declarations) one call of
/// [`DataSock::drain_subscriptions`] reads: under a flood, the node thread
/// goes on to its other duties (heartbeats) and puts get the socket, then
/// comes back at once. libzmq's XPUB moves what peers send upstream into
/// an unbounded queue of its own, so reading fast is what bounds memory.
const MAX_DRAIN: usize = 65_536;

impl DataSock {
    pub(crate) fn new(sock: zmq::Socket, reliability: Reliability) -> Self {
        DataSock {
            sock,
            out: Outlet::new(reliability),
            gate: None,
            inproc: false,
            ring: None,
            reliable: reliability == Reliability::Reliable,
            moving: Arc::new(Mutex::new(None)),
        }
    }

    /// The reference frame's payload that replaces `enc` (a payload frame
    /// sent with `flags`), and the reference, when the payload goes through
    /// shared memory: large enough, not compressed, every subscription
    /// that wants it on this host (docs/shared-memory.md). Counted in
    /// `shm_fallbacks` when it could have and no slot was free.
    /// Also the socket's marker arrivals when the readers were counted.
    fn share(
        &mut self,
        put: &Put<'_>,
        enc: &Encoded,
        flags: u8,
    ) -> Option<(Vec<u8>, SharedRef, u64)> {
        let node = put.p2p.core();
        let cfg = &node.cfg;
        let tail = enc.tail.as_ref()?;
        if flags != 0 || self.inproc || !cfg.shared_memory || tail.len() < cfg.shm_threshold_bytes {
            return None;
        }
        let marker = shm::marker()?;
        // The subscriptions that came since the node thread last looked:
        // the decision below is as fresh as it can be (a subscription
        // libzmq takes during the send does not get the reference, which
        // goes to marker holders only; it starts with a later sample).
        self.drain_subscriptions(node);
        let readers = self.out.shared_memory_readers(put.template, marker)?;
        let (departures, arrivals) = (self.out.marker_departures, self.out.marker_arrivals);
        let written = match (self.ring(node), put.claim) {
            // A loan: the payload is in the ring already.
            (Some(ring), Some(claim)) => ring.commit(claim, readers, departures),
            (Some(ring), None) => ring.write(tail, readers, departures),
            (None, _) => None,
        };
        let Some(r) = written else {
            stats::inc(&node.counters.shm_fallbacks);
            return None;
        };
        Some((shm::reference_body(&r, &enc.head), r, arrivals))
    }

    /// The socket's segment, made on first use (`None` once that failed).
    fn ring(&mut self, node: &NodeCore) -> Option<&mut shm::Ring> {
        let cfg = &node.cfg;
        let reliable = self.reliable;
        self.ring
            .get_or_insert_with(|| {
                let hold = Duration::from_millis(u64::from(cfg.shm_hold_ms));
                shm::Ring::create(
                    &node.id,
                    cfg.shm_segment_bytes,
                    cfg.shm_threshold_bytes,
                    hold,
                    reliable,
                )
                .map_err(|e| {
                    tracing::warn!(
                        error = %e,
                        "no shared-memory segment: large samples go through the socket"
                    );
                })
            })
            .as_mut()
            .ok()
    }

    /// A slot of `len` bytes of the socket's segment for a publisher to
    /// fill (a loan, [`crate::Publisher::loan`]), when shared memory can
    /// carry a payload that large from this socket and a slot is free.
    pub(crate) fn reserve(&mut self, node: &NodeCore, len: usize) -> Option<shm::Reserved> {
        let cfg = &node.cfg;
        if self.inproc
            || !cfg.shared_memory
            || len < cfg.shm_threshold_bytes.max(cfg.zero_copy_threshold_bytes)
        {
            return None;
        }
        shm::marker()?;
        let departures = self.out.marker_departures;
        self.ring(node)?.reserve(len, departures)
    }

    /// The reference of `r` left: its readers are waited for from now.
    /// A marked subscription that came since the readers were counted
    /// (`arrivals` then; its subscription, read now, was taken by libzmq
    /// before or during the send) may have got it uncounted.
    fn shared_sent(&mut self, node: &NodeCore, r: &SharedRef, arrivals: u64) {
        self.drain_subscriptions(node);
        let uncertain = self.out.marker_arrivals > arrivals;
        if let Some(Ok(ring)) = self.ring.as_mut() {
            ring.sent(r, uncertain);
        }
    }

    /// Whether a reference this socket sent still awaits a reader.
    pub(crate) fn shared_memory_awaited(&self) -> bool {
        matches!(&self.ring, Some(Ok(ring)) if ring.awaited())
    }

    /// Gives back the slot of a reference that was not sent.
    fn unshare(&mut self, r: &SharedRef) {
        if let Some(Ok(ring)) = self.ring.as_mut() {
            ring.unsent(r);
        }
    }

    /// With access control, refuses the history queries the rules do not
    /// allow the asking key (the `User-Id` its connection was admitted
    /// with), telling the subscriber under its reply key (a `Denied` frame)
    /// and counting them (`acl_denied`). Subscriptions are not judged here:
    /// libzmq's XPUB cannot refuse one subscription of a connection soundly
    /// (docs/security.md); the ZAP handler admits to a data socket only keys
    /// the rules let subscribe to something.
    fn gate(&mut self, g: &Guard, me: &Me, msg: &mut zmq::Message) -> Gate {
        use crate::model::acl::Operation;
        let key = msg.gets("User-Id").map(str::to_owned);
        let key = key.as_deref().filter(|k| !k.is_empty());
        let bytes: &[u8] = msg;
        if bytes.first() != Some(&milonga_wire::history::QUERY_TAG) {
            return Gate::Pass;
        }
        let Ok(q) = milonga_wire::history::Query::decode(bytes) else {
            return Gate::Pass; // the outlet counts it malformed
        };
        if q.node != me.id.to_hex() {
            return Gate::Pass; // another node's: ignored there
        }
        let Ok(expr) = milonga_wire::KeyExpr::new(q.expr.as_str()) else {
            return Gate::Pass;
        };
        // Judged by what the answer would hold: each kept key of this
        // socket that the expression matches (a console allowed history
        // on `sr/ps/**` that asks for `sr/**` gets what it may read).
        let verdict = if self.inproc && key.is_none() {
            Ok(())
        } else {
            let kept = self.out.kept_keys(&expr);
            g.allowed(key, |acl, who| {
                kept.iter()
                    .try_fold(0, |_, k| acl.check(who, Operation::History, k))
            })
        };
        match verdict {
            Ok(()) => Gate::Pass,
            Err(reason) => {
                let to = format!("{}{}", milonga_wire::history::REPLY_KEY_PREFIX, q.token);
                self.refuse(me, "history", &q.expr, &reason, &to);
                Gate::Drop
            }
        }
    }

    /// Counts and logs a refusal, and sends the subscriber a `Denied`
    /// frame under the key `to` (its reply key, which it subscribes to).
    fn refuse(&mut self, me: &Me, operation: &str, what: &str, reason: &str, to: &str) {
        stats::inc(&me.counters.acl_denied);
        limited!(warn, %operation, %what, %reason, "access control refused a subscriber");
        let body = serde_json::to_vec(&milonga_wire::frame::Denied {
            operation: operation.into(),
            what: what.into(),
            reason: reason.into(),
        })
        .unwrap_or_default();
        let Ok(key) = Key::internal(to) else {
            return;
        };
        let header = frame::Header {
            kind: frame::Kind::Denied,
            flags: 0,
            encoding: milonga_wire::Encoding::Json,
            domain_tag: me.domain_tag,
            schema_id: 0,
            node_id: me.id,
            seq: 0,
            timestamp_ns: crate::util::now_ns(),
        };
        let f = frame::encode(&key, &header, &body);
        let _ = self.sock.send(f, zmq::DONTWAIT);
    }

    /// Reads the subscribe/unsubscribe messages and history queries queued
    /// on the XPUB socket, and answers the queries.
    /// Whether it stopped at [`MAX_DRAIN`] with more to read.
    pub(crate) fn drain_subscriptions(&mut self, node: &NodeCore) -> bool {
        let me = Me::from(node);
        for _ in 0..MAX_DRAIN {
            let Ok(mut msg) = self.sock.recv_msg(zmq::DONTWAIT) else {
                return false;
            };
            if let Some(g) = self.gate.clone() {
                if let Gate::Drop = self.gate(&g, &me, &mut msg) {
                    continue;
                }
            }
            match self.out.upstream(&me, &msg) {
                Upstream::Done => {}
                Upstream::Freed(bytes) => zmq_io::note_freed(bytes),
                Upstream::Answer(answer) => {
                    for r in &answer.replies {
                        let Some(f) = self.out.reply_frame(&me, &answer, r) else {
                            stats::inc(&me.counters.history_replies_dropped);
                            limited!(warn, token = %answer.token, "a history answer cut short: this data socket's 64 MiB of replies a second are spent; the subscriber reports what it misses");
                            // Its end, so that the subscriber does not
                            // wait for the rest.
                            let _ = self
                                .sock
                                .send(self.out.cut_frame(&me, &answer), zmq::DONTWAIT);
                            break;
                        };
                        if self.sock.send(f, zmq::DONTWAIT).is_err() {
                            stats::inc(&me.counters.history_replies_dropped);
                            limited!(warn, token = %answer.token, "could not send a history reply at once; the subscriber will go on live");
                            break;
                        }
                    }
                }
                Upstream::Unknown => {
                    let n = me.counters.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 10 || n % 1000 == 0 {
                        tracing::warn!(
                            len = msg.len(),
                            dropped_so_far = n,
                            "dropped a message sent to a data port that is not a subscription"
                        );
                    }
                }
            }
        }
        true
    }

    /// Tries to send the waiting batch, if any (see [`Pending::send`]).
    pub(crate) fn send_pending(&mut self, flags: i32, counters: &Counters) -> zmq::Result<()> {
        let pending = self.out.pending();
        let n = pending.as_ref().map_or(0, Pending::samples);
        let sock = &mut self.sock;
        Pending::send(pending, |frame| zmq_io::send_bytes(sock, frame, flags))?;
        if n > 0 {
            stats::inc(&counters.batches_sent);
            stats::add(&counters.samples_batched, n);
        }
        Ok(())
    }

    /// Gives the waiting batch, if any, `linger_ms` to leave (negative: as
    /// long as it takes, as libzmq's linger), at close.
    pub(crate) fn flush_at_close(&mut self, linger_ms: i32, counters: &Counters) {
        if self.out.pending().is_none() {
            return;
        }
        let _ = self.sock.set_sndtimeo(linger_ms.max(-1));
        if self.send_pending(0, counters).is_err() {
            let n = self.out.pending().as_ref().map_or(0, Pending::samples);
            tracing::warn!(
                samples = n,
                "closing with a batch that no subscriber took within close_linger_ms"
            );
        }
    }

    /// Sends the frames of the filters a sample passed (see
    /// [`Outlet::accepted`]); one the socket refuses is counted
    /// `filtered_dropped`.
    pub(crate) fn send_filtered(&mut self, frames: Vec<Vec<u8>>, counters: &Counters) {
        for f in frames {
            if self.sock.send(f, zmq::DONTWAIT).is_err() {
                stats::inc(&counters.filtered_dropped);
            }
        }
    }
}
