//! Publishers: put samples of one key.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use milonga_wire::cbor::{encode_payload, to_cbor, Encoded};
use milonga_wire::frame::{self, Encoding, Header, Kind};
use milonga_wire::{Bytes, Key, Value};

use crate::backend::p2p::data::{DataSocket, Put, Wait};
use crate::model::error::PutError;
use crate::model::qos::{PublisherQos, Reliability};
use crate::session::NodeInner;
use crate::util::lock;

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
    /// With a `file:///` locator: samples go into the recording instead.
    pub(crate) file: Option<Arc<crate::api::file_node::FileNode>>,
    /// The QoS's compression, else the node's.
    compression: crate::Compression,
    /// Its zstd dictionary, trained from its first samples, when its
    /// compression asks for one.
    dictionary: Option<crate::engine::compress::Dictionary>,
    /// The QoS's schema's id and writer, when it has one: samples are
    /// written with it (encoding 3).
    schema: Option<(u32, milonga_wire::schema::CompactWriter)>,
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
        schema_id: Option<u32>,
    ) -> Self {
        let header = Header {
            kind: Kind::Sample,
            flags: if qos.replayed {
                frame::FLAG_REPLAYED
            } else {
                0
            },
            encoding: Encoding::Raw,
            domain_tag: node.core().domain_tag,
            schema_id: 0,
            node_id: node.id(),
            seq: 0,
            timestamp_ns: 0,
        };
        let mut template = vec![0u8; frame::head_len(&key)];
        frame::write_head(&key, &header, &mut template);
        let compression = qos.compression.unwrap_or_else(|| node.cfg().compression());
        let schema = schema_id.zip(qos.schema.as_ref().map(|s| s.writer()));
        let dictionary = (compression.dictionary
            && compression.compressor == Some(crate::model::compression::Compressor::Zstd))
        .then(crate::engine::compress::Dictionary::default);
        Publisher {
            schema,
            dictionary,
            compression,
            node,
            key,
            qos,
            data,
            template,
            seq: Arc::new(last_seq.into()),
            file: None,
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
        let (enc, schema_id) = self.encode(&value.into())?;
        self.send(enc, schema_id, self.default_wait())
    }

    /// The value ready for the wire, and its schema id: with a schema,
    /// written by position (encoding 3); else CBOR, raw bytes, or a typed
    /// array's own frame. A `file:///` publisher records the plain value.
    fn encode(&self, value: &Value) -> Result<(Encoded, u32), PutError> {
        if let Some((id, writer)) = &self.schema {
            let mut out = Vec::new();
            writer.write(value, &mut out)?;
            if self.file.is_none() {
                return Ok((Self::compact(out), *id));
            }
            // A recording holds the plain value, checked all the same.
        }
        Ok((
            encode_payload(value, self.node.cfg().zero_copy_threshold_bytes)?,
            0,
        ))
    }

    /// Puts a value with its source timestamp given (ns since the Unix
    /// epoch): when the value was measured, or, replaying a recording, when
    /// it was first published. Otherwise as [`Publisher::put`], which
    /// stamps the time of the put.
    pub fn put_at(&self, value: impl Into<Value>, timestamp_ns: u64) -> Result<(), PutError> {
        let (enc, schema_id) = self.encode(&value.into())?;
        self.send_at(enc, schema_id, self.default_wait(), Some(timestamp_ns))
    }

    /// [`Publisher::try_put`] with a source timestamp given, as
    /// [`Publisher::put_at`].
    pub fn try_put_at(&self, value: impl Into<Value>, timestamp_ns: u64) -> Result<(), PutError> {
        let (enc, schema_id) = self.encode(&value.into())?;
        self.send_at(enc, schema_id, Wait::No, Some(timestamp_ns))
    }

    /// [`Publisher::put_timeout`] with a source timestamp given, as
    /// [`Publisher::put_at`].
    pub fn put_at_timeout(
        &self,
        value: impl Into<Value>,
        timestamp_ns: u64,
        timeout: Duration,
    ) -> Result<(), PutError> {
        let (enc, schema_id) = self.encode(&value.into())?;
        self.send_at(enc, schema_id, Wait::For(timeout), Some(timestamp_ns))
    }

    /// Leaves out the next `n` sequence numbers: each subscriber counts
    /// `n` samples of this publisher lost there, at its next sample or
    /// heartbeat (a [`crate::Event::Lost`]; a reliable subscriber of a
    /// publisher with history first asks for them, in vain, as for
    /// samples the history no longer holds, and such queries are limited
    /// to ten a second per subscription). This is how `milonga replay`
    /// carries a recording's losses to its subscribers; an ordinary
    /// publisher has no use for it. A reliable publisher's batch of
    /// waiting samples leaves first, waiting for room as
    /// [`Publisher::put`] does. Subscriptions with a filter at the source
    /// do not see the gap (their samples are numbered per filter). At most
    /// 2^32 - 1 at once ([`PutError::SkipTooLarge`]): a larger jump is
    /// taken by subscribers as corrupt, not as a loss.
    pub fn skip(&self, n: u64) -> Result<(), PutError> {
        if n == 0 {
            return Ok(());
        }
        let limit = crate::engine::seq::MAX_SEQ_JUMP - 1;
        let room = u64::MAX / 2
            - self
                .seq
                .load(std::sync::atomic::Ordering::Relaxed)
                .min(u64::MAX / 2);
        if n > limit || n > room {
            return Err(PutError::SkipTooLarge {
                count: n,
                limit: limit.min(room),
            });
        }
        if let Some(f) = &self.file {
            f.skip(&self.seq, n);
            return Ok(());
        }
        self.data
            .skip(&self.put_args(None, None), n, self.default_wait())
    }

    /// Puts a value, failing with [`PutError::WouldBlock`] at once instead of
    /// waiting when a reliable publisher's subscriber is full.
    pub fn try_put(&self, value: impl Into<Value>) -> Result<(), PutError> {
        let (enc, schema_id) = self.encode(&value.into())?;
        self.send(enc, schema_id, Wait::No)
    }

    /// Puts a value, waiting at most `timeout` for room (reliable only).
    pub fn put_timeout(&self, value: impl Into<Value>, timeout: Duration) -> Result<(), PutError> {
        let (enc, schema_id) = self.encode(&value.into())?;
        self.send(enc, schema_id, Wait::For(timeout))
    }

    /// Puts a user type serialized with serde as CBOR, with `schema_id` in
    /// the header (0 = none). A publisher with a schema writes it with
    /// its schema instead (`schema_id` is then the schema's).
    pub fn put_serde<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
        schema_id: u32,
    ) -> Result<(), PutError> {
        if let Some((id, writer)) = &self.schema {
            let mut out = Vec::new();
            writer.write_serde(value, &mut out)?;
            if self.file.is_none() {
                return self.send(Self::compact(out), *id, self.default_wait());
            }
        }
        let enc = Encoded {
            encoding: Encoding::Cbor,
            head: Bytes::from(to_cbor(value)?),
            tail: None,
        };
        self.send(enc, schema_id, self.default_wait())
    }

    /// Puts a value of a type that derives [`Compact`](crate::Compact)
    /// (docs/schemas.md, "Derived types"). On a publisher declared with
    /// the type's own schema (`PublisherQos::schema(T::record_schema()?
    /// .schema.clone())`) the value is written by the type's derived code,
    /// with no schema walked: the fastest way to publish a record. Any
    /// other publisher puts the value's map of fields as [`Publisher::put`]
    /// does (a schema'd one checks it against its own schema).
    pub fn put_compact<T: crate::CompactRecord>(&self, value: &T) -> Result<(), PutError> {
        let mine = T::record_schema()?;
        if let Some((id, _)) = &self.schema {
            if *id == mine.id && self.file.is_none() {
                let mut out = Vec::with_capacity(128);
                value.write_compact(&mut out);
                return self.send(Self::compact(out), *id, self.default_wait());
            }
        }
        let v = mine
            .schema
            .read_compact(&Bytes::from(milonga_wire::compact::to_vec(value)))?;
        let (enc, schema_id) = self.encode(&v)?;
        self.send(enc, schema_id, self.default_wait())
    }

    fn compact(payload: Vec<u8>) -> Encoded {
        Encoded {
            encoding: Encoding::Compact,
            head: Bytes::from(payload),
            tail: None,
        }
    }

    fn default_wait(&self) -> Wait {
        self.qos.put_timeout.map_or(Wait::Forever, Wait::For)
    }

    /// How many subscriptions currently match this key, as far as this
    /// publisher's socket has heard (subscriptions travel asynchronously).
    /// Each peer-to-peer subscriber counts once. A broker counts once for
    /// all the subscribers behind it (its clients, its host's nodes, the
    /// brokers it links to): it passes a subscription on when the first
    /// of them asks and withdraws it when the last leaves, so a count of 1
    /// through a broker tells that the first is in place, not the others
    /// (docs/broker.md, "Quality of service through a broker"; their list
    /// with their subscriptions: [`crate::broker::clients`]).
    pub fn subscriber_count(&self) -> u32 {
        let mut d = lock(&self.data.sock);
        d.drain_subscriptions(self.node.core());
        d.out
            .subscribers_of(&self.template[..self.key.as_str().len() + 1])
    }

    /// A buffer of `len` bytes to fill and publish with
    /// [`Publisher::put_loan`]: a slot of the publisher's shared-memory
    /// segment when its samples can go through shared memory
    /// (docs/shared-memory.md: `len` at least `shm_threshold_bytes`, a
    /// slot free), else memory of its own. Filled in place, a shared loan
    /// is published without a copy to the subscriptions on this host; it
    /// is sent through the socket, like any sample, where one of them is
    /// elsewhere. Its content is unspecified (a shared slot holds what it
    /// held): write all of it. Return it promptly: while a shared loan is
    /// out, slots after it in the ring are not reused.
    pub fn loan(&self, len: usize) -> Loan {
        if self.file.is_none() && self.schema.is_none() {
            if let Some(r) = lock(&self.data.sock).reserve(self.node.core(), len) {
                return Loan(LoanBuf::Shared(r));
            }
        }
        Loan(LoanBuf::Own(vec![0; len]))
    }

    /// Puts a filled [`Loan`] as a byte string, as [`Publisher::put`]
    /// would put `Value::Bytes` of its content.
    pub fn put_loan(&self, loan: Loan) -> Result<(), PutError> {
        self.send_loan(loan, &LoanLayout::Bytes, self.default_wait())
            .map_err(|e| e.error)
    }

    /// Puts a filled [`Loan`] as a typed array of `element` (its length a
    /// multiple of the element's size, little-endian elements), as
    /// [`Publisher::put`] would put `Value::Typed`.
    pub fn put_loan_typed(
        &self,
        loan: Loan,
        element: milonga_wire::ElementType,
    ) -> Result<(), PutError> {
        self.send_loan(loan, &LoanLayout::Typed(element), self.default_wait())
            .map_err(|e| e.error)
    }

    /// Puts a filled [`Loan`] laid out as `layout` says, waiting at most
    /// `timeout` for room (a reliable publisher; zero: not at all). A loan
    /// it could not put comes back in the error, unchanged, to be put
    /// again: how a caller that must do something between waits (a
    /// Python binding checking for Ctrl-C) waits for room without copying
    /// the loan.
    pub fn put_loan_timeout(
        &self,
        loan: Loan,
        layout: &LoanLayout,
        timeout: Duration,
    ) -> Result<(), LoanNotPut> {
        let wait = match timeout.is_zero() {
            true => Wait::No,
            false => Wait::For(timeout),
        };
        self.send_loan(loan, layout, wait)
    }

    fn send_loan(&self, loan: Loan, layout: &LoanLayout, wait: Wait) -> Result<(), LoanNotPut> {
        let claim = match &loan.0 {
            LoanBuf::Shared(r) => Some(r.claim),
            LoanBuf::Own(_) => None,
        };
        // The message holds the loan through a second reference: once a
        // put that failed has dropped it, the loan can be handed back.
        let held = Arc::new(loan.0);
        let bytes = Bytes::from_owner(LoanBytes(held.clone()));
        let put = || {
            let typed = |e: milonga_wire::ElementType, bytes| {
                milonga_wire::TypedArray::from_bytes(e, bytes)
                    .map_err(|e| milonga_wire::cbor::EncodeError::Serde(e.to_string()))
            };
            let value = match layout {
                LoanLayout::Bytes => Value::Bytes(bytes),
                LoanLayout::Typed(e) => Value::Typed(typed(*e, bytes)?),
                LoanLayout::Array(e, shape) => {
                    let t = typed(*e, bytes)?;
                    if shape.iter().try_fold(1usize, |n, d| n.checked_mul(*d)) != Some(t.len()) {
                        let why =
                            format!("a shape of {shape:?} does not hold {} elements", t.len());
                        return Err(milonga_wire::cbor::EncodeError::Serde(why).into());
                    }
                    if shape.len() == 1 {
                        Value::Typed(t)
                    } else {
                        let dims = shape.iter().map(|d| Value::Int(*d as i128)).collect();
                        Value::Tagged(
                            milonga_wire::cbor::TAG_NDARRAY,
                            Box::new(Value::Array(vec![Value::Array(dims), Value::Typed(t)])),
                        )
                    }
                }
            };
            let (enc, schema_id) = self.encode(&value)?;
            drop(value);
            // Only a payload frame can be the loan's slot.
            let claim = claim.filter(|_| enc.tail.is_some());
            self.send_full(enc, schema_id, wait, None, claim)
        };
        put().map_err(|error| LoanNotPut {
            error,
            loan: Arc::try_unwrap(held).ok().map(|l| Box::new(Loan(l))),
        })
    }

    fn send(&self, enc: Encoded, schema_id: u32, wait: Wait) -> Result<(), PutError> {
        self.send_at(enc, schema_id, wait, None)
    }

    fn send_at(
        &self,
        enc: Encoded,
        schema_id: u32,
        wait: Wait,
        timestamp_ns: Option<u64>,
    ) -> Result<(), PutError> {
        self.send_full(enc, schema_id, wait, timestamp_ns, None)
    }

    fn send_full(
        &self,
        enc: Encoded,
        schema_id: u32,
        wait: Wait,
        timestamp_ns: Option<u64>,
        claim: Option<crate::backend::p2p::shm::Claim>,
    ) -> Result<(), PutError> {
        if let Some(f) = &self.file {
            let replayed = self.qos.replayed;
            return f.put(
                self.key.as_str(),
                &self.seq,
                enc,
                schema_id,
                timestamp_ns,
                replayed,
            );
        }
        self.data
            .put(&self.put_args(timestamp_ns, claim), enc, schema_id, wait)
    }

    /// What the data socket needs of this publisher for a put (or a skip).
    fn put_args(
        &self,
        timestamp_ns: Option<u64>,
        claim: Option<crate::backend::p2p::shm::Claim>,
    ) -> Put<'_> {
        Put {
            timestamp_ns,
            p2p: self.node.backend(),
            key: &self.key,
            template: &self.template,
            seq: &self.seq,
            reliable: self.qos.reliability == Reliability::Reliable,
            compression: &self.compression,
            dictionary: self.dictionary.as_ref(),
            claim,
        }
    }
}

/// A buffer lent by [`Publisher::loan`], filled through `DerefMut<[u8]>`
/// and published with [`Publisher::put_loan`]. Dropped unpublished, it
/// goes back to the publisher.
pub struct Loan(LoanBuf);

enum LoanBuf {
    /// A slot of the publisher's shared-memory segment.
    Shared(crate::backend::p2p::shm::Reserved),
    /// Memory of its own (shared memory could not carry it).
    Own(Vec<u8>),
}

impl Loan {
    /// Whether it is a slot of shared memory (else memory of its own).
    pub fn is_shared(&self) -> bool {
        matches!(self.0, LoanBuf::Shared(_))
    }
}

/// How [`Publisher::put_loan_timeout`] publishes a loan's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoanLayout {
    /// A byte string (`Value::Bytes`), as [`Publisher::put_loan`].
    Bytes,
    /// A typed array of this element (`Value::Typed`; the loan's length a
    /// multiple of its size, little-endian), as [`Publisher::put_loan_typed`].
    Typed(milonga_wire::ElementType),
    /// A row-major array of this element and shape (RFC 8746's tag 40,
    /// `40([shape, typed array])`, as a numpy array of more than one
    /// dimension is sent; of one dimension, a typed array); the shape must
    /// hold every element.
    Array(milonga_wire::ElementType, Vec<usize>),
}

/// A loan's bytes as a message's payload frame, the loan held for as long
/// as the message (see `Publisher::send_loan`).
struct LoanBytes(Arc<LoanBuf>);

impl AsRef<[u8]> for LoanBytes {
    fn as_ref(&self) -> &[u8] {
        match &*self.0 {
            LoanBuf::Shared(r) => r.window.as_slice(),
            LoanBuf::Own(v) => v,
        }
    }
}

/// Why [`Publisher::put_loan_timeout`] did not put a loan, and the loan,
/// to put again (`None` if the transport still held it).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct LoanNotPut {
    /// Why.
    pub error: PutError,
    /// The loan, unchanged (boxed: a loan is larger than the error).
    pub loan: Option<Box<Loan>>,
}

impl std::ops::Deref for Loan {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            LoanBuf::Shared(r) => r.window.as_slice(),
            LoanBuf::Own(v) => v,
        }
    }
}

impl std::ops::DerefMut for Loan {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            LoanBuf::Shared(r) => r.window.as_mut_slice(),
            LoanBuf::Own(v) => v,
        }
    }
}

impl std::fmt::Debug for Loan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loan")
            .field("len", &self.len())
            .field("shared", &self.is_shared())
            .finish()
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
        self.node
            .undeclare_publication(self.key.as_str(), self.seq.load(Ordering::Relaxed));
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Publisher>();
}
