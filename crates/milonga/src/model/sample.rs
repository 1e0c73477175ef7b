//! What a subscription delivers: samples and status events.

use milonga_wire::cbor::DecodeError;
use milonga_wire::{Bytes, Encoding, NodeId, Value};

/// One event: a key, a value and its header.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The key it was published on.
    pub key: String,
    /// The decoded value. Byte strings and typed arrays are views of the
    /// received frame, not copies.
    pub value: Value,
    /// The publishing node.
    pub publisher: NodeId,
    /// Sequence number per (publisher, key), from 1.
    pub seq: u64,
    /// Source timestamp, ns since the Unix epoch.
    pub timestamp_ns: u64,
    /// Encoding used on the wire.
    pub encoding: Encoding,
    /// Schema id from the header (0 = none).
    pub schema_id: u32,
    /// Republished from a recording (`milonga replay`, a publisher with
    /// [`PublisherQos::replay`](crate::PublisherQos::replay)): `timestamp_ns`
    /// is when it was first published. Samples a publisher's history
    /// hands to a late joiner or a repair do not carry it yet.
    pub replayed: bool,
    /// Set on a compact sample that a
    /// [`typed`](crate::SubscriberQos#structfield.typed) subscription
    /// delivers undecoded (`value` holds the payload's bytes): how
    /// [`Sample::deserialize`] reads it. `None` otherwise.
    pub compact: Option<CompactReader>,
}

/// How a [`typed`](crate::SubscriberQos#structfield.typed) subscription's
/// compact sample is read: its writer's schema resolved against the
/// reader's, shared by every sample of that writer.
#[derive(Clone)]
pub struct CompactReader(pub(crate) std::sync::Arc<milonga_wire::schema::Plan>);

impl std::fmt::Debug for CompactReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompactReader")
    }
}

impl PartialEq for CompactReader {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Sample {
    /// Deserializes the value into a user type (serde), for samples put with
    /// [`crate::Publisher::put_serde`] or any CBOR value of that shape.
    /// Typed arrays read as sequences of numbers (a `Vec<f64>` field of a
    /// schema'd publisher's type arrives as one). A compact sample of a
    /// [`typed`](crate::SubscriberQos#structfield.typed) subscription is
    /// read straight from its payload, without a value map.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, DecodeError> {
        match (&self.compact, &self.value) {
            (Some(reader), Value::Bytes(payload)) => {
                reader.0.deserialize(payload).map_err(|e| match e {
                    milonga_wire::schema::SchemaError::Decode(d) => d,
                    other => DecodeError::Serde(other.to_string()),
                })
            }
            _ => milonga_wire::cbor::from_value(&self.value),
        }
    }

    /// Reads the value into a type that derives [`Compact`](crate::Compact)
    /// (docs/schemas.md, "Derived types"). A compact sample written with
    /// the type's own schema, delivered by a
    /// [`typed`](crate::SubscriberQos#structfield.typed) subscription, is
    /// read by the type's derived code, by position, with no schema walked.
    /// Any other sample is read as its value map (a typed one's through its
    /// plan: the subscription's schema, or else the writer's), which must
    /// fit the type's schema: to read another release of the type, declare
    /// the subscription with the type's schema
    /// ([`SubscriberQos::schema`](crate::SubscriberQos::schema)), whose
    /// plan converts each writer's fields (docs/schemas.md, "Evolution").
    pub fn read<T: crate::CompactRecord>(&self) -> Result<T, DecodeError> {
        let err = |e: milonga_wire::schema::SchemaError| match e {
            milonga_wire::schema::SchemaError::Decode(d) => d,
            other => DecodeError::Serde(other.to_string()),
        };
        let mine = T::record_schema().map_err(err)?;
        let converted;
        let value = match (&self.compact, &self.value) {
            (Some(_), Value::Bytes(payload)) if self.schema_id == mine.id => {
                return milonga_wire::compact::from_slice(payload).map_err(err);
            }
            (Some(reader), Value::Bytes(payload)) => {
                converted = reader.0.read(payload).map_err(err)?;
                &converted
            }
            (_, v) => v,
        };
        let mut out = Vec::with_capacity(128);
        mine.schema.write_compact(value, &mut out).map_err(err)?;
        milonga_wire::compact::from_slice(&out).map_err(err)
    }

    /// The payload bytes when the value is a byte string (also the compact
    /// payload of a [`typed`](crate::SubscriberQos#structfield.typed)
    /// subscription's schema'd sample: see [`Sample::compact`]).
    ///
    /// [`Sample::compact`]: Sample#structfield.compact
    pub fn bytes(&self) -> Option<&Bytes> {
        match &self.value {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// Samples a subscription did not receive: a gap in one publisher's
/// sequence numbers for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostSamples {
    /// The publisher that sent them.
    pub publisher: NodeId,
    /// The key.
    pub key: String,
    /// How many were lost.
    pub count: u64,
    /// The first missing sequence number.
    pub first_seq: u64,
}

/// A publisher node a subscription hears from (again): its first heartbeat
/// or sample, after it was unknown or lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherAlive {
    /// The node. A restarted process is a new node: a new id, with sequence
    /// numbers from 1 (a new epoch, not a gap).
    pub publisher: NodeId,
    /// Its name, `name@host:pid`, from discovery (empty if not known yet).
    pub name: String,
}

/// Why a subscription stopped hearing from a publisher node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The node closed and said so (its last heartbeat was `leaving`).
    Closed,
    /// Its connection closed without a goodbye: the process died (killed,
    /// crashed) or the connection broke.
    Disconnected,
    /// No heartbeat for longer than the lease (`heartbeat_timeout_ms`): the
    /// process is frozen or overloaded, or the network is cut.
    LeaseExpired,
    /// Discovery no longer shows a publication of the node that matches,
    /// while it still shows the node: it withdrew them. (A node that left
    /// the domain is reported `Closed`, `Disconnected` or `LeaseExpired`;
    /// one still heard from a lease after it left discovery, `Undeclared`.)
    Undeclared,
    /// The subscription dropped what it knew of the node (its sequence
    /// numbers) because more than 256 publisher nodes, or more than 65,536
    /// of their keys, were absent from discovery at once and this one had
    /// been absent longest. If it comes back, samples it sent while absent
    /// can no longer be accounted for.
    Forgotten,
}

impl LostReason {
    /// The name used in JSON output (`closed`, `disconnected`,
    /// `lease_expired`, `undeclared`, `forgotten`).
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Closed => "closed",
            LostReason::Disconnected => "disconnected",
            LostReason::LeaseExpired => "lease_expired",
            LostReason::Undeclared => "undeclared",
            LostReason::Forgotten => "forgotten",
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A subscription stopped hearing from a publisher node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherLost {
    /// The node.
    pub publisher: NodeId,
    /// Its name, as in [`PublisherAlive`].
    pub name: String,
    /// Why.
    pub reason: LostReason,
}

/// A key stayed silent longer than the subscription's deadline
/// ([`crate::SubscriberQos::deadline`]); repeated every deadline period
/// until the key speaks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineMissed {
    /// The silent key.
    pub key: String,
    /// How long it has been silent (since its last sample, or since the
    /// subscription learnt of the key).
    pub silent_for: std::time::Duration,
}

/// A QoS policy a subscription asked for and a publisher does not offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QosPolicy {
    /// Reliable delivery asked of a best-effort publisher.
    Reliability,
    /// More samples on joining than the publisher keeps.
    History,
    /// The publisher's schema does not agree with the subscription's
    /// (docs/schemas.md): its samples are refused.
    Schema,
}

impl QosPolicy {
    /// The name used in JSON output (`reliability`, `history`).
    pub fn as_str(self) -> &'static str {
        match self {
            QosPolicy::Reliability => "reliability",
            QosPolicy::History => "history",
            QosPolicy::Schema => "schema",
        }
    }
}

/// A matching publication offers less than the subscription asked for. It
/// is still delivered, with what it offers: never a silent downgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncompatibleQos {
    /// The publishing node.
    pub publisher: NodeId,
    /// The key.
    pub key: String,
    /// Which policy.
    pub policy: QosPolicy,
    /// What was asked and what is offered.
    pub detail: String,
}

/// A publisher's node refused this subscription (security on,
/// docs/security.md): nothing will come from it until that changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionDenied {
    /// The endpoint that refused.
    pub endpoint: String,
    /// The node behind it, when known.
    pub publisher: Option<NodeId>,
    /// Why, as far as this side can tell.
    pub reason: String,
}

/// What `recv` and callbacks deliver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A sample.
    Sample(Sample),
    /// Samples were lost before the next one delivered.
    Lost(LostSamples),
    /// A publisher node is alive: heard from for the first time, or again.
    PublisherAlive(PublisherAlive),
    /// A publisher node was lost.
    PublisherLost(PublisherLost),
    /// A key missed its deadline.
    DeadlineMissed(DeadlineMissed),
    /// A subscription with `last > 0` has received what the publishers it
    /// found when it was declared keep; what follows is live.
    SubscriptionLive,
    /// A matching publication offers less than the subscription asked for.
    IncompatibleQos(IncompatibleQos),
    /// A publisher's node refused the connection (reported once per
    /// endpoint; the subscription keeps trying, in case it is let in).
    PermissionDenied(PermissionDenied),
    /// A node opened on several brokers (`milonga://b1:7447,b2:7447/lab`)
    /// lost its broker and moved to another (docs/broker.md). What the
    /// subscription missed meanwhile follows as repairs or `Lost`.
    BrokerChanged(BrokerChanged),
}

/// The broker a node is attached to changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerChanged {
    /// The broker left (`tcp://HOST:PORT`).
    pub from: String,
    /// The broker now used.
    pub to: String,
}

impl Event {
    /// The sample, if this event is one.
    pub fn into_sample(self) -> Option<Sample> {
        match self {
            Event::Sample(s) => Some(s),
            _ => None,
        }
    }

    /// The sample, if this event is one.
    pub fn as_sample(&self) -> Option<&Sample> {
        match self {
            Event::Sample(s) => Some(s),
            _ => None,
        }
    }
}
