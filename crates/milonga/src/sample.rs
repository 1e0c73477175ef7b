//! What a subscription delivers: samples and status events.

use milonga_wire::cbor::{from_cbor, DecodeError};
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
}

impl Sample {
    /// Deserializes the value into a user type (serde), for samples put with
    /// [`crate::Publisher::put_serde`] or any CBOR value of that shape.
    pub fn deserialize<T: serde::de::DeserializeOwned>(&self) -> Result<T, DecodeError> {
        let mut buf = Vec::new();
        milonga_wire::cbor::encode_cbor(&self.value, &mut buf)
            .map_err(|e| DecodeError::Serde(e.to_string()))?;
        from_cbor(&buf)
    }

    /// The payload bytes when the value is a byte string.
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

/// What `recv` and callbacks deliver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A sample.
    Sample(Sample),
    /// Samples were lost before the next one delivered.
    Lost(LostSamples),
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
