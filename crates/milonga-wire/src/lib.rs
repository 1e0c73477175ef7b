//! The Milonga wire protocol, version 1.
//!
//! Everything another implementation needs to speak to Milonga, and nothing
//! that does I/O: keys and key expressions ([`key`]), the data frame layout
//! ([`frame`]), values ([`value`]) and their CBOR encoding ([`cbor`]), history
//! queries and replies ([`history`]), heartbeats ([`heartbeat`]), filter
//! declarations ([`filter`]), schemas and the compact encoding ([`schema`]), service calls ([`service`]), control
//! messages ([`control`]) and announcements ([`announce`]). The normative
//! text is `docs/protocol.md`; the golden vectors in
//! `tests/vectors/` are checked against this crate.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod announce;
pub mod broker;
pub mod cbor;
pub mod compact;
mod compact_de;
mod compact_ser;
pub mod control;
pub mod filter;
pub mod frame;
pub mod heartbeat;
pub mod history;
pub mod key;
pub mod schema;
pub mod scout;
pub mod service;
pub mod shm;
pub mod value;
mod value_de;

pub use bytes::Bytes;

/// The id of a schema or a compression dictionary: FNV-1a 32 of its bytes,
/// never 0 (docs/protocol.md §5.1). It names content, so a receiver checks
/// what it is given against it; it does not resist a forger (a node that
/// may publish may lie anyway).
pub fn content_id(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.max(1)
}
pub use frame::{Encoding, FrameError, Header, Kind, NodeId};
pub use key::{Key, KeyError, KeyExpr};
pub use value::{Element, ElementType, TypedArray, Value};
