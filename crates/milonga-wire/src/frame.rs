//! Data frames of protocol v1 (normative text: docs/protocol.md).
//!
//! A data message is one or two ZeroMQ frames. The first frame is
//!
//! ```text
//! key (UTF-8, 1..=512 bytes) | 0x00 | header (44 bytes) | body
//! ```
//!
//! so that ZeroMQ prefix subscriptions select on the key. All integers are
//! little-endian. The header:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | protocol version (1) |
//! | 1 | 1 | kind: 1 sample, 2 batch, 3 heartbeat, 4 history, 5 request, 6 reply |
//! | 2 | 1 | flags: bit 0 = the payload continues in a second frame; bit 1 = republished from a recording; bit 2 = the body is compressed |
//! | 3 | 1 | encoding: 0 raw bytes, 1 CBOR, 2 JSON, 3 compact (schema'd CBOR) |
//! | 4 | 4 | domain tag (FNV-1a 32 of the domain name) |
//! | 8 | 4 | schema id (0 = none) |
//! | 12 | 16 | publisher node id |
//! | 28 | 8 | sequence number of the (first) sample |
//! | 36 | 8 | source timestamp, ns since the Unix epoch |
//!
//! For a sample, the body is the payload, or its first part when flag bit 0
//! is set (the second ZeroMQ frame then holds the rest). For a batch, the body
//! is one or more entries `u32 length | u64 timestamp_ns | payload`; entry
//! `i` has sequence number `seq + i`, and every entry shares the header's
//! encoding and schema id. With flag bit 2, the body (a sample's payload or
//! a batch's entries) is compressed: `compressor u8 | size u32 | data`
//! ([`Compressed`]).

use crate::key::{Key, KeyError, MAX_KEY_BYTES};

/// The protocol version this crate reads and writes.
pub const PROTOCOL_VERSION: u8 = 1;
/// Size of the fixed header that follows the key and its NUL terminator.
pub const HEADER_LEN: usize = 44;
/// Size of a batch entry's own header (`u32` length, `u64` timestamp).
pub const BATCH_ENTRY_HEADER_LEN: usize = 12;
/// Where each field of the fixed header lies, from the header's first byte
/// (which follows the key and its NUL); all integers little-endian
/// (docs/protocol.md §4). Engines that patch a header in place (the
/// sequence number and timestamp of a pre-built frame, a batch's kind) use
/// these, never their own numbers.
pub mod offset {
    /// `u8`: the protocol version.
    pub const VERSION: usize = 0;
    /// `u8`: the frame kind.
    pub const KIND: usize = 1;
    /// `u8`: the flags.
    pub const FLAGS: usize = 2;
    /// `u8`: the payload encoding.
    pub const ENCODING: usize = 3;
    /// `u32`: the domain tag.
    pub const DOMAIN_TAG: usize = 4;
    /// `u32`: the schema id.
    pub const SCHEMA_ID: usize = 8;
    /// 16 bytes: the publisher's node id.
    pub const NODE_ID: usize = 12;
    /// `u64`: the sequence number.
    pub const SEQ: usize = 28;
    /// `u64`: the source timestamp, ns since the Unix epoch.
    pub const TIMESTAMP_NS: usize = 36;
}

/// Flag bit 0: the payload continues in a second ZeroMQ frame.
pub const FLAG_PAYLOAD_FRAME: u8 = 0x01;
/// Flag bit 1: a sample republished from a recording (`milonga replay`):
/// its timestamp is the original source timestamp.
pub const FLAG_REPLAYED: u8 = 0x02;
/// Flag bit 2: the body is compressed ([`Compressed`]); only on samples
/// and batches, never with [`FLAG_PAYLOAD_FRAME`].
pub const FLAG_COMPRESSED: u8 = 0x04;
/// Flag bit 3: the payload is in the publisher's shared-memory segment
/// ([`crate::shm::SharedRef`], docs/protocol.md §4.6); only on one-frame
/// samples, and only to subscriptions on the publisher's host that asked
/// for it. A receiver resolves it before it reads the frame; a frame that
/// still carries it is not one this version decodes ([`KNOWN_FLAGS`]).
pub const FLAG_SHARED_MEMORY: u8 = 0x08;
/// Every flag bit this version decodes (a shared-memory reference is
/// resolved into a payload frame first).
pub const KNOWN_FLAGS: u8 = FLAG_PAYLOAD_FRAME | FLAG_REPLAYED | FLAG_COMPRESSED;

/// What compressed a body (flag bit 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Compressor {
    /// An LZ4 block (no frame, no size prefix).
    Lz4 = 1,
    /// A Zstandard frame.
    Zstd = 2,
}

impl Compressor {
    /// From its byte.
    pub fn from_u8(b: u8) -> Option<Compressor> {
        match b {
            1 => Some(Compressor::Lz4),
            2 => Some(Compressor::Zstd),
            _ => None,
        }
    }
}

/// Bytes before a compressed body's data: the compressor and the size.
pub const COMPRESSED_HEAD_LEN: usize = 5;

/// Bytes before the data of a body compressed with a dictionary: the
/// compressor byte [`DICTIONARY_COMPRESSOR`], the size, the dictionary's id.
pub const DICTIONARY_HEAD_LEN: usize = 9;

/// The compressor byte of a Zstandard frame made with a dictionary
/// (docs/protocol.md §4): its head carries the dictionary's id after the
/// size.
pub const DICTIONARY_COMPRESSOR: u8 = 3;

/// A compressed body, read: `compressor u8 | size u32 | data`, where
/// `size` is the length of the body once inflated; compressor
/// [`DICTIONARY_COMPRESSOR`] is a Zstandard frame made with a dictionary,
/// `3 | size u32 | dictionary id u32 | data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressed<'a> {
    /// What compressed it.
    pub compressor: Compressor,
    /// Its length once inflated.
    pub size: usize,
    /// The dictionary it was compressed with (zstd only): its id, the
    /// content id ([`crate::content_id`]) of the dictionary's bytes.
    pub dictionary: Option<u32>,
    /// The compressed bytes.
    pub data: &'a [u8],
}

impl<'a> Compressed<'a> {
    /// Reads a compressed body.
    pub fn read(body: &'a [u8]) -> Result<Compressed<'a>, FrameError> {
        let [c, s0, s1, s2, s3, data @ ..] = body else {
            return Err(FrameError::BadCompressed("shorter than its 5-byte head"));
        };
        let size = u32::from_le_bytes([*s0, *s1, *s2, *s3]) as usize;
        if size == 0 {
            return Err(FrameError::BadCompressed("an empty body is not compressed"));
        }
        if *c == DICTIONARY_COMPRESSOR {
            let [d0, d1, d2, d3, data @ ..] = data else {
                return Err(FrameError::BadCompressed(
                    "shorter than its 9-byte head (compressor 3)",
                ));
            };
            return Ok(Compressed {
                compressor: Compressor::Zstd,
                size,
                dictionary: Some(u32::from_le_bytes([*d0, *d1, *d2, *d3])),
                data,
            });
        }
        let compressor =
            Compressor::from_u8(*c).ok_or(FrameError::BadCompressed("unknown compressor"))?;
        Ok(Compressed {
            compressor,
            size,
            dictionary: None,
            data,
        })
    }

    /// The head of a body compressed with dictionary `id`:
    /// `3 | size | id`.
    pub fn dictionary_head(size: u32, id: u32) -> [u8; DICTIONARY_HEAD_LEN] {
        let s = size.to_le_bytes();
        let d = id.to_le_bytes();
        [
            DICTIONARY_COMPRESSOR,
            s[0],
            s[1],
            s[2],
            s[3],
            d[0],
            d[1],
            d[2],
            d[3],
        ]
    }

    /// The head of a compressed body: `compressor | size`.
    pub fn head(compressor: Compressor, size: u32) -> [u8; COMPRESSED_HEAD_LEN] {
        let s = size.to_le_bytes();
        [compressor as u8, s[0], s[1], s[2], s[3]]
    }
}

/// What a data frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// One sample.
    Sample = 1,
    /// Consecutive samples of one key from one publisher.
    Batch = 2,
    /// A node's heartbeat, on its liveliness socket under the key
    /// [`HEARTBEAT_KEY`]; the body is a CBOR map (see docs/protocol.md).
    Heartbeat = 3,
    /// Kept samples sent to one subscription in answer to its query, under
    /// the key `@r/<token>`; the body is a CBOR map (see
    /// [`crate::history::Reply`]).
    History = 4,
    /// A service call, from a caller's DEALER to a server's ROUTER, under
    /// the service's key; `seq` is the call id and the body the request's
    /// payload (see [`crate::service`]).
    Request = 5,
    /// The answer to a call: same key and `seq` as the request, the server's
    /// node id; the body is a status byte, then the payload (see
    /// [`crate::service::ReplyStatus`]).
    Reply = 6,
    /// A publisher refused a subscription or a history query (access
    /// control, docs/security.md), sent to that subscriber alone under the
    /// key `@r/<token>` ([`crate::history::REPLY_KEY_PREFIX`], docs/protocol.md
    /// §2.2); the body is a JSON
    /// [`Denied`].
    Denied = 7,
}

/// The body of a [`Kind::Denied`] frame: what was refused and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Denied {
    /// `subscribe` or `history`.
    pub operation: String,
    /// The subscription prefix or the history query's key expression.
    pub what: String,
    /// Why, naming the rules file.
    pub reason: String,
}

/// The key heartbeats are sent under.
pub const HEARTBEAT_KEY: &str = "@hb";

/// How a payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Encoding {
    /// Opaque bytes, passed through untouched.
    Raw = 0,
    /// CBOR (RFC 8949) with RFC 8746 typed arrays.
    Cbor = 1,
    /// UTF-8 JSON text, for debugging tools.
    Json = 2,
    /// CBOR written by position under the schema the header's schema id
    /// names (docs/protocol.md §5.1, [`crate::schema`]).
    Compact = 3,
}

impl Encoding {
    /// The encoding for a wire byte, if this version knows it.
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Cbor),
            2 => Some(Encoding::Json),
            3 => Some(Encoding::Compact),
            _ => None,
        }
    }
}

/// A node's 128-bit identity: random, or with security on bound to the
/// node's key ([`NodeId::keyed`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub [u8; 16]);

/// What the hash of a keyed node id starts with (docs/protocol.md §9.2).
const KEYED_ID_CONTEXT: &[u8] = b"milonga node id v1\0";

impl NodeId {
    /// The node id of a secured node: the first 16 bytes of SHA-256 over
    /// `"milonga node id v1\0"`, its CURVE public key (32 bytes) and a
    /// random `salt` of 16 bytes (announced as `id_salt`, docs/protocol.md
    /// §9.2). Finding a salt that gives a chosen id with another key is a
    /// preimage of SHA-256: a peer cannot claim a node id of someone else's
    /// key.
    pub fn keyed(key: &[u8; 32], salt: &[u8; 16]) -> NodeId {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(KEYED_ID_CONTEXT);
        h.update(key);
        h.update(salt);
        let d = h.finalize();
        let mut id = [0u8; 16];
        id.copy_from_slice(&d[..16]);
        NodeId(id)
    }

    /// Lower-case hexadecimal, 32 characters.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hexadecimal characters.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut id = [0u8; 16];
        for (i, b) in id.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(NodeId(id))
    }
}

impl std::fmt::Debug for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeId({})", self.to_hex())
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The domain tag carried in every data frame: FNV-1a (32 bit) of the
/// domain name's UTF-8 bytes. A frame whose tag differs from the receiver's
/// domain is dropped and counted.
pub fn domain_tag(domain: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in domain.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The fixed header of a data frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame carries.
    pub kind: Kind,
    /// Flag bits; see [`FLAG_PAYLOAD_FRAME`].
    pub flags: u8,
    /// Payload encoding.
    pub encoding: Encoding,
    /// [`domain_tag`] of the publisher's domain.
    pub domain_tag: u32,
    /// Schema id, 0 when none.
    pub schema_id: u32,
    /// The publishing node.
    pub node_id: NodeId,
    /// Per-(publisher, key) sequence number of the (first) sample; starts at 1.
    pub seq: u64,
    /// Source timestamp in nanoseconds since the Unix epoch.
    pub timestamp_ns: u64,
}

impl Header {
    /// Writes the 44 header bytes.
    pub fn write(&self, out: &mut [u8; HEADER_LEN]) {
        use offset as o;
        out[o::VERSION] = PROTOCOL_VERSION;
        out[o::KIND] = self.kind as u8;
        out[o::FLAGS] = self.flags;
        out[o::ENCODING] = self.encoding as u8;
        out[o::DOMAIN_TAG..o::DOMAIN_TAG + 4].copy_from_slice(&self.domain_tag.to_le_bytes());
        out[o::SCHEMA_ID..o::SCHEMA_ID + 4].copy_from_slice(&self.schema_id.to_le_bytes());
        out[o::NODE_ID..o::NODE_ID + 16].copy_from_slice(&self.node_id.0);
        out[o::SEQ..o::SEQ + 8].copy_from_slice(&self.seq.to_le_bytes());
        out[o::TIMESTAMP_NS..o::TIMESTAMP_NS + 8].copy_from_slice(&self.timestamp_ns.to_le_bytes());
    }

    /// Reads a header, checking version, kind, flags and encoding.
    pub fn read(b: &[u8]) -> Result<Self, FrameError> {
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated {
                needed: HEADER_LEN,
                got: b.len(),
            });
        }
        use offset as o;
        if b[o::VERSION] != PROTOCOL_VERSION {
            return Err(FrameError::UnsupportedVersion(b[o::VERSION]));
        }
        let kind = match b[o::KIND] {
            1 => Kind::Sample,
            2 => Kind::Batch,
            3 => Kind::Heartbeat,
            4 => Kind::History,
            5 => Kind::Request,
            6 => Kind::Reply,
            7 => Kind::Denied,
            k => return Err(FrameError::UnknownKind(k)),
        };
        let flags = b[o::FLAGS];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(FrameError::UnknownFlags(flags));
        }
        if kind == Kind::Batch && flags & FLAG_PAYLOAD_FRAME != 0 {
            return Err(FrameError::BadBatch("a batch cannot have a payload frame"));
        }
        if flags & FLAG_COMPRESSED != 0
            && (!matches!(kind, Kind::Sample | Kind::Batch) || flags & FLAG_PAYLOAD_FRAME != 0)
        {
            return Err(FrameError::BadCompressed(
                "only a one-frame sample or batch is compressed",
            ));
        }
        if matches!(kind, Kind::Heartbeat | Kind::History | Kind::Denied)
            && flags & FLAG_PAYLOAD_FRAME != 0
        {
            return Err(FrameError::BadHeartbeat(
                "a heartbeat or history frame cannot have a payload frame",
            ));
        }
        let encoding =
            Encoding::from_u8(b[o::ENCODING]).ok_or(FrameError::UnknownEncoding(b[o::ENCODING]))?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(Header {
            kind,
            flags,
            encoding,
            domain_tag: u32_at(o::DOMAIN_TAG),
            schema_id: u32_at(o::SCHEMA_ID),
            node_id: NodeId(b[o::NODE_ID..o::NODE_ID + 16].try_into().expect("16 bytes")),
            seq: u64_at(o::SEQ),
            timestamp_ns: u64_at(o::TIMESTAMP_NS),
        })
    }
}

/// Why a data frame was refused. Receivers drop the frame, count it and log
/// this message; they never stop on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The frame ends before a complete header.
    #[error("truncated frame: needed {needed} bytes, got {got}")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// No NUL within the first `MAX_KEY_BYTES + 1` bytes.
    #[error("no key terminator within {} bytes", MAX_KEY_BYTES + 1)]
    NoKeyTerminator,
    /// The key is not a valid published key.
    #[error("bad key: {0}")]
    BadKey(#[from] KeyError),
    /// The version byte is not 1.
    #[error("unsupported protocol version {0} (this node speaks version {PROTOCOL_VERSION})")]
    UnsupportedVersion(u8),
    /// The kind byte is not one this version knows.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A flag bit this version does not know is set.
    #[error("unknown flag bits in {0:#04x}")]
    UnknownFlags(u8),
    /// The encoding byte is not one this version knows.
    #[error("unknown encoding {0}")]
    UnknownEncoding(u8),
    /// A batch body is malformed.
    #[error("malformed batch: {0}")]
    BadBatch(&'static str),
    /// A heartbeat is malformed.
    #[error("malformed heartbeat: {0}")]
    BadHeartbeat(&'static str),
    /// A compressed body is malformed, or does not inflate as its head
    /// says.
    #[error("malformed compressed body: {0}")]
    BadCompressed(&'static str),
    /// The payload-frame flag and the presence of a second frame disagree.
    #[error("payload frame flag is {flag} but the message has {frames} frame(s)")]
    FrameCount {
        /// Whether the flag was set.
        flag: bool,
        /// How many frames the message had.
        frames: usize,
    },
}

/// Bytes of the first frame before the body: key, NUL and header.
pub fn head_len(key: &Key) -> usize {
    key.as_str().len() + 1 + HEADER_LEN
}

/// Writes `key | 0 | header` into the start of `out`, which must hold at
/// least [`head_len`] bytes; returns the number of bytes written.
pub fn write_head(key: &Key, header: &Header, out: &mut [u8]) -> usize {
    let k = key.as_str().as_bytes();
    out[..k.len()].copy_from_slice(k);
    out[k.len()] = 0;
    let h: &mut [u8; HEADER_LEN] = (&mut out[k.len() + 1..k.len() + 1 + HEADER_LEN])
        .try_into()
        .expect("slice of HEADER_LEN");
    header.write(h);
    k.len() + 1 + HEADER_LEN
}

/// Encodes a whole single-frame message into a new vector.
pub fn encode(key: &Key, header: &Header, body: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; head_len(key) + body.len()];
    let n = write_head(key, header, &mut out);
    out[n..].copy_from_slice(body);
    out
}

/// A decoded first frame, borrowing from the frame bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameView<'a> {
    /// The key (validated).
    pub key: &'a str,
    /// The header.
    pub header: Header,
    /// Offset of the body within the frame.
    pub body_offset: usize,
    /// The body.
    pub body: &'a [u8],
}

/// Decodes the first frame of a data message.
pub fn decode(frame: &'_ [u8]) -> Result<FrameView<'_>, FrameError> {
    let search = &frame[..frame.len().min(MAX_KEY_BYTES + 1)];
    let nul = search
        .iter()
        .position(|b| *b == 0)
        .ok_or(if frame.len() <= MAX_KEY_BYTES {
            FrameError::Truncated {
                needed: frame.len() + 1 + HEADER_LEN,
                got: frame.len(),
            }
        } else {
            FrameError::NoKeyTerminator
        })?;
    let key_bytes = &frame[..nul];
    let key = std::str::from_utf8(key_bytes).map_err(|e| {
        FrameError::BadKey(KeyError::BadUtf8 {
            offset: e.valid_up_to(),
        })
    })?;
    // Validate without allocating on the hot path: only a bad key (which
    // then fails) goes through `Key::new`.
    let b = key.as_bytes();
    let mut suspicious = b.is_empty() || b[0] == b'/' || b[b.len() - 1] == b'/';
    let mut prev = 0u8;
    for &c in b {
        // `*`, `//`, a C0 control or DEL, a C1 control (UTF-8 C2 80..9F).
        if c == b'*'
            || c < 0x20
            || c == 0x7f
            || prev == b'/' && c == b'/'
            || prev == 0xc2 && (0x80..0xa0).contains(&c)
        {
            suspicious = true;
            break;
        }
        prev = c;
    }
    if suspicious {
        Key::new(key)?;
    }
    let header = Header::read(&frame[nul + 1..])?;
    let body_offset = nul + 1 + HEADER_LEN;
    let body = &frame[body_offset..];
    if header.flags & FLAG_COMPRESSED != 0 {
        // Its entries are checked once inflated.
        Compressed::read(body)?;
    } else if header.kind == Kind::Batch {
        BatchEntries::new(body)?.try_for_each(|e| e.map(|_| ()))?;
    }
    Ok(FrameView {
        key,
        header,
        body_offset,
        body,
    })
}

/// One entry of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry<'a> {
    /// Source timestamp of this sample.
    pub timestamp_ns: u64,
    /// Offset of the payload within the batch body.
    pub offset: usize,
    /// The payload.
    pub payload: &'a [u8],
}

/// Iterates over the entries of a batch body.
#[derive(Debug, Clone)]
pub struct BatchEntries<'a> {
    body: &'a [u8],
    pos: usize,
}

impl<'a> BatchEntries<'a> {
    /// Starts iterating; an empty body is an error.
    pub fn new(body: &'a [u8]) -> Result<Self, FrameError> {
        if body.is_empty() {
            return Err(FrameError::BadBatch("a batch has at least one entry"));
        }
        Ok(BatchEntries { body, pos: 0 })
    }
}

impl<'a> Iterator for BatchEntries<'a> {
    type Item = Result<BatchEntry<'a>, FrameError>;
    fn next(&mut self) -> Option<Self::Item> {
        let rest = &self.body[self.pos..];
        if rest.is_empty() {
            return None;
        }
        if rest.len() < BATCH_ENTRY_HEADER_LEN {
            self.pos = self.body.len();
            return Some(Err(FrameError::BadBatch("truncated entry header")));
        }
        let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let timestamp_ns = u64::from_le_bytes(rest[4..12].try_into().expect("8 bytes"));
        if rest.len() - BATCH_ENTRY_HEADER_LEN < len {
            self.pos = self.body.len();
            return Some(Err(FrameError::BadBatch("entry longer than the frame")));
        }
        let offset = self.pos + BATCH_ENTRY_HEADER_LEN;
        self.pos = offset + len;
        Some(Ok(BatchEntry {
            timestamp_ns,
            offset,
            payload: &self.body[offset..offset + len],
        }))
    }
}

/// Appends one batch entry to `out`.
pub fn push_batch_entry(out: &mut Vec<u8>, timestamp_ns: u64, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("batch entries are smaller than 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&timestamp_ns.to_le_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {

    /// The worked example of docs/protocol.md §9.2 (computed there with
    /// Python's hashlib too).
    #[test]
    fn a_keyed_node_id_is_the_head_of_sha256_over_context_key_and_salt() {
        let key: [u8; 32] = std::array::from_fn(|i| i as u8);
        let id = NodeId::keyed(&key, &[0xaa; 16]);
        assert_eq!(id.to_hex(), "0b12ea8a738f74f7ff4c74a9205b8bca");
    }
    use super::*;

    /// The offsets say where `Header::write` puts each field, so that an
    /// engine patching a frame in place patches the right bytes.
    #[test]
    fn the_offsets_are_where_the_header_puts_each_field() {
        let h = Header {
            kind: Kind::Batch,
            flags: 0,
            encoding: Encoding::Raw,
            domain_tag: 0x0403_0201,
            schema_id: 0x0807_0605,
            node_id: NodeId([0xaa; 16]),
            seq: 0x1112_1314_1516_1718,
            timestamp_ns: 0x2122_2324_2526_2728,
        };
        let mut b = [0u8; HEADER_LEN];
        h.write(&mut b);
        use offset as o;
        assert_eq!(b[o::VERSION], PROTOCOL_VERSION);
        assert_eq!(b[o::KIND], Kind::Batch as u8);
        assert_eq!(b[o::FLAGS], 0);
        assert_eq!(b[o::ENCODING], Encoding::Raw as u8);
        assert_eq!(
            b[o::DOMAIN_TAG..o::DOMAIN_TAG + 4],
            h.domain_tag.to_le_bytes()
        );
        assert_eq!(b[o::SCHEMA_ID..o::SCHEMA_ID + 4], h.schema_id.to_le_bytes());
        assert_eq!(b[o::NODE_ID..o::NODE_ID + 16], [0xaa; 16]);
        assert_eq!(b[o::SEQ..o::SEQ + 8], h.seq.to_le_bytes());
        assert_eq!(
            b[o::TIMESTAMP_NS..o::TIMESTAMP_NS + 8],
            h.timestamp_ns.to_le_bytes()
        );
        assert_eq!(
            o::TIMESTAMP_NS + 8,
            HEADER_LEN,
            "the last field ends the header"
        );
        assert_eq!(Header::read(&b).unwrap(), h);
    }

    fn header() -> Header {
        Header {
            kind: Kind::Sample,
            flags: 0,
            encoding: Encoding::Raw,
            domain_tag: domain_tag("lab"),
            schema_id: 7,
            node_id: NodeId([0xab; 16]),
            seq: 42,
            timestamp_ns: 1_700_000_000_000_000_000,
        }
    }

    #[test]
    fn round_trip() {
        let key = Key::new("sr/ps/1/current").unwrap();
        let bytes = encode(&key, &header(), b"hello");
        assert_eq!(bytes.len(), head_len(&key) + 5);
        let v = decode(&bytes).unwrap();
        assert_eq!(v.key, "sr/ps/1/current");
        assert_eq!(v.header, header());
        assert_eq!(v.body, b"hello");
    }

    #[test]
    fn refuses_bad_frames() {
        let key = Key::new("a").unwrap();
        let good = encode(&key, &header(), b"x");
        assert!(matches!(
            decode(&good[..10]),
            Err(FrameError::Truncated { .. })
        ));
        assert!(matches!(decode(b"abc"), Err(FrameError::Truncated { .. })));
        assert_eq!(decode(&[b'a'; 600]), Err(FrameError::NoKeyTerminator));
        let mut v = good.clone();
        v[2] = 9;
        assert_eq!(decode(&v), Err(FrameError::UnsupportedVersion(9)));
        let mut v = good.clone();
        v[3] = 77;
        assert_eq!(decode(&v), Err(FrameError::UnknownKind(77)));
        let mut v = good.clone();
        v[4] = 0x80;
        assert_eq!(decode(&v), Err(FrameError::UnknownFlags(0x80)));
        // The replayed flag is known.
        let mut v = good.clone();
        v[4] = FLAG_REPLAYED;
        assert_eq!(decode(&v).unwrap().header.flags, FLAG_REPLAYED);
        let mut v = good.clone();
        v[5] = 200;
        assert_eq!(decode(&v), Err(FrameError::UnknownEncoding(200)));
        let mut v = good.clone();
        v[0] = b'*';
        assert!(matches!(decode(&v), Err(FrameError::BadKey(_))));
        let mut v = good;
        v[0] = 0xff;
        assert!(matches!(
            decode(&v),
            Err(FrameError::BadKey(KeyError::BadUtf8 { .. }))
        ));
    }

    #[test]
    fn a_compressed_body_is_checked_for_its_head_only_and_only_where_allowed() {
        let key = Key::new("a").unwrap();
        let mut body = Compressed::head(Compressor::Zstd, 1000).to_vec();
        body.extend_from_slice(b"not checked here");
        let h = Header {
            flags: FLAG_COMPRESSED,
            ..header()
        };
        let v = encode(&key, &h, &body);
        let view = decode(&v).unwrap();
        let c = Compressed::read(view.body).unwrap();
        assert_eq!((c.compressor, c.size), (Compressor::Zstd, 1000));
        assert_eq!(c.dictionary, None);
        // Compressor 3: zstd with a dictionary, its id after the size.
        let mut d = Compressed::dictionary_head(1000, 0xdead_beef).to_vec();
        d.extend_from_slice(b"zz");
        let dc = Compressed::read(&d).unwrap();
        assert_eq!(
            (dc.compressor, dc.size, dc.dictionary, dc.data),
            (Compressor::Zstd, 1000, Some(0xdead_beef), &b"zz"[..])
        );
        assert!(Compressed::read(&d[..8]).is_err(), "a 9-byte head");
        assert_eq!(c.data, b"not checked here");
        // A batch's entries are not checked while compressed.
        let batch = Header {
            kind: Kind::Batch,
            ..h
        };
        assert!(decode(&encode(&key, &batch, &body)).is_ok());
        // Refused: an unknown compressor, a short head, a size of 0, a
        // heartbeat, and a second frame.
        let mut bad = body.clone();
        bad[0] = 9;
        let refused = |h: &Header, b: &[u8]| {
            matches!(
                decode(&encode(&key, h, b)),
                Err(FrameError::BadCompressed(_))
            )
        };
        assert!(refused(&h, &bad));
        assert!(refused(&h, &body[..4]));
        assert!(refused(&h, &Compressed::head(Compressor::Lz4, 0)));
        let hb = Header {
            kind: Kind::Heartbeat,
            ..h
        };
        assert!(refused(&hb, &body));
        let two = Header {
            flags: FLAG_COMPRESSED | FLAG_PAYLOAD_FRAME,
            ..h
        };
        assert!(refused(&two, &body));
    }

    #[test]
    fn batch_entries() {
        let key = Key::new("a/b").unwrap();
        let mut body = Vec::new();
        push_batch_entry(&mut body, 1, b"one");
        push_batch_entry(&mut body, 2, b"");
        push_batch_entry(&mut body, 3, b"three");
        let h = Header {
            kind: Kind::Batch,
            ..header()
        };
        let bytes = encode(&key, &h, &body);
        let v = decode(&bytes).unwrap();
        let entries: Vec<_> = BatchEntries::new(v.body)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[2].payload, b"three");
        assert_eq!(entries[1].timestamp_ns, 2);
        let truncated = encode(&key, &h, &body[..body.len() - 1]);
        assert!(matches!(decode(&truncated), Err(FrameError::BadBatch(_))));
        let empty = encode(&key, &h, b"");
        assert!(matches!(decode(&empty), Err(FrameError::BadBatch(_))));
    }

    #[test]
    fn node_id_hex() {
        let id = NodeId([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 255]);
        assert_eq!(NodeId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(NodeId::from_hex("zz"), None);
    }

    #[test]
    fn domain_tags_differ() {
        assert_ne!(domain_tag("lab"), domain_tag("ops"));
        assert_eq!(domain_tag(""), 0x811c_9dc5);
    }
}
