//! Service calls: requests (kind 5) and replies (kind 6).
//!
//! A caller sends a request to the ROUTER socket a server announces for the
//! service: one data frame (plus a payload frame for a large payload, as a
//! sample has) under the service's key, with the caller's node id and a call
//! id in `seq`, unique among the caller's calls. The server answers on the
//! same connection with a reply frame under the same key and the same `seq`,
//! carrying its own node id. A reply's body is one status byte, then:
//!
//! | status | meaning | rest of the body |
//! |---|---|---|
//! | 0 | ok | the reply value, in the header's encoding |
//! | 1 | the handler failed | CBOR map `{"kind": text, "message": text}` |
//! | 2 | rejected (overload, size) | CBOR map `{"kind": text, "message": text}` |
//! | 3 | the server does not serve this key | CBOR map `{"kind": text, "message": text}` |
//!
//! A caller matches replies to calls by `seq` and drops a reply for a call
//! that has already ended, so a late reply never completes another call.

use serde::{Deserialize, Serialize};

use crate::cbor::{self, DecodeError};

/// The first byte of a reply's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReplyStatus {
    /// The handler returned a value.
    Ok = 0,
    /// The handler returned an error, or panicked.
    Error = 1,
    /// The server refused the call without running the handler.
    Rejected = 2,
    /// The server has no service of this key (withdrawn since announced).
    NoSuchService = 3,
}

impl ReplyStatus {
    /// The status for a wire byte, if this version knows it.
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            0 => Some(ReplyStatus::Ok),
            1 => Some(ReplyStatus::Error),
            2 => Some(ReplyStatus::Rejected),
            3 => Some(ReplyStatus::NoSuchService),
            _ => None,
        }
    }
}

/// Why a call failed on the server: the body after a non-zero status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// A short machine-readable kind (`"panic"`, `"overload"`, or the
    /// handler's own, such as `"out_of_range"`).
    pub kind: String,
    /// What went wrong, for a person.
    pub message: String,
}

impl Failure {
    /// The CBOR encoding of the failure.
    pub fn encode(&self) -> Vec<u8> {
        cbor::to_cbor(self).expect("two strings always encode")
    }

    /// Decodes a failure body.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        cbor::from_cbor(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_unknown_ones_are_refused() {
        for s in [
            ReplyStatus::Ok,
            ReplyStatus::Error,
            ReplyStatus::Rejected,
            ReplyStatus::NoSuchService,
        ] {
            assert_eq!(ReplyStatus::from_u8(s as u8), Some(s));
        }
        assert_eq!(ReplyStatus::from_u8(4), None);
    }

    #[test]
    fn failures_round_trip() {
        let f = Failure {
            kind: "out_of_range".into(),
            message: "current 900 A above 500 A".into(),
        };
        assert_eq!(Failure::decode(&f.encode()).unwrap(), f);
        assert!(Failure::decode(b"\x01").is_err());
    }
}
