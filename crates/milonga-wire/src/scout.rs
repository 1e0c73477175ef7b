//! Scouting (docs/protocol.md §9.5): the UDP datagram a node multicasts
//! on its network so that nodes of other hosts find it with no
//! configuration. It names the node and its control endpoint, a version
//! of its announcement, and the announcement itself when it fits; a
//! receiver that has not seen that version takes it, or asks the control
//! endpoint for it (§9.1) when the hello could not carry it.
//!
//! ```text
//! offset size field
//!  0     4    magic "MLGS"
//!  4     1    version = 1
//!  5     1    flags: bit 0 leaving (the node closes), bit 1 ask (answer
//!             with your own hello: a node that just opened), bit 2 key
//!             (the node's security is on: its CURVE public key follows)
//!  6     2    reserved, 0
//!  8     4    domain tag (little endian, as in the frame header)
//! 12    16    node id
//! 28     8    announcement version (little endian): changes whenever the
//!             node's announcement does
//! 36     2    length N of the control endpoint (little endian), 1 to 255
//! 38     N    control endpoint, UTF-8, `tcp://ADDRESS:PORT`
//! 38+N   2    length M of the announcement (little endian), 0: none
//! 40+N   M    the announcement (JSON, [`crate::announce`]) of that version
//! 40+N+M 32   with flag bit 2 only: the node's CURVE public key, the server
//!             key of its control socket
//! ```
//!
//! Nothing else may follow; unknown flag bits are ignored. A sender includes
//! its announcement when the whole hello fits [`MAX_INLINE`] bytes (one
//! Ethernet frame), so that most nodes are known from their hello alone;
//! a receiver of a hello without one asks the control endpoint.

use crate::frame::NodeId;

/// The first bytes of every hello.
pub const MAGIC: &[u8; 4] = b"MLGS";
/// The version this crate writes and reads.
pub const VERSION: u8 = 1;
/// Flag: the node is leaving.
pub const FLAG_LEAVING: u8 = 1;
/// Flag: the sender asks every node that hears it to send its own hello.
pub const FLAG_ASK: u8 = 2;
/// Flag: the node's CURVE public key ends the hello.
pub const FLAG_KEY: u8 = 4;
/// Bytes of a CURVE public key.
pub const KEY_LEN: usize = 32;
/// Bytes before the endpoint.
pub const HEAD_LEN: usize = 38;
/// Longest control endpoint a hello carries.
pub const MAX_ENDPOINT: usize = 255;
/// Largest hello that carries its announcement: one Ethernet frame's
/// payload less the IP and UDP headers.
pub const MAX_INLINE: usize = 1472;

/// Why a datagram is not a hello of this version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScoutError {
    /// Shorter than a hello, or its length disagrees with its endpoint's.
    #[error("{0} bytes: not a whole hello")]
    Truncated(usize),
    /// Not a Milonga hello at all.
    #[error("not a Milonga hello (bad magic)")]
    BadMagic,
    /// A hello of another protocol version.
    #[error("hello version {0}, this node speaks {VERSION}")]
    Version(u8),
    /// The endpoint is empty, too long, not UTF-8 or not `tcp://`.
    #[error("bad control endpoint: {0}")]
    Endpoint(String),
}

/// A node's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The node is leaving: forget it.
    pub leaving: bool,
    /// The sender asks for the hellos of the nodes that hear it.
    pub ask: bool,
    /// The domain's tag ([`crate::frame::domain_tag`]).
    pub domain_tag: u32,
    /// The node.
    pub node_id: NodeId,
    /// Changes whenever the node's announcement does.
    pub version: u64,
    /// The node's control endpoint.
    pub control: String,
    /// The node's announcement of `version` (JSON), when it fits.
    pub announcement: Option<Vec<u8>>,
    /// The node's CURVE public key, when its security is on.
    pub key: Option<[u8; KEY_LEN]>,
}

impl Hello {
    /// The datagram. Panics if the endpoint is empty or longer than
    /// [`MAX_ENDPOINT`] (a node never announces such a one).
    pub fn encode(&self) -> Vec<u8> {
        let ep = self.control.as_bytes();
        assert!(
            (1..=MAX_ENDPOINT).contains(&ep.len()),
            "a control endpoint of 1 to {MAX_ENDPOINT} bytes"
        );
        let mut out = Vec::with_capacity(HEAD_LEN + ep.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(
            (u8::from(self.leaving) * FLAG_LEAVING)
                | (u8::from(self.ask) * FLAG_ASK)
                | (u8::from(self.key.is_some()) * FLAG_KEY),
        );
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.domain_tag.to_le_bytes());
        out.extend_from_slice(&self.node_id.0);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(ep.len() as u16).to_le_bytes());
        out.extend_from_slice(ep);
        let a = self.announcement.as_deref().unwrap_or_default();
        assert!(
            a.len() <= usize::from(u16::MAX),
            "an announcement of at most 65,535 bytes"
        );
        out.extend_from_slice(&(a.len() as u16).to_le_bytes());
        out.extend_from_slice(a);
        if let Some(k) = &self.key {
            out.extend_from_slice(k);
        }
        out
    }

    /// The datagram, with `announcement` included if the whole fits
    /// [`MAX_INLINE`] bytes.
    pub fn encode_with(&self, announcement: &[u8]) -> Vec<u8> {
        let key = if self.key.is_some() { KEY_LEN } else { 0 };
        let fits = HEAD_LEN + self.control.len() + 2 + announcement.len() + key <= MAX_INLINE;
        Hello {
            announcement: fits.then(|| announcement.to_vec()),
            ..self.clone()
        }
        .encode()
    }

    /// Reads a datagram.
    pub fn decode(b: &[u8]) -> Result<Hello, ScoutError> {
        if b.len() < HEAD_LEN {
            if b.len() >= 4 && &b[..4] != MAGIC {
                return Err(ScoutError::BadMagic);
            }
            return Err(ScoutError::Truncated(b.len()));
        }
        if &b[..4] != MAGIC {
            return Err(ScoutError::BadMagic);
        }
        if b[4] != VERSION {
            return Err(ScoutError::Version(b[4]));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let n = usize::from(u16_at(36));
        if n == 0 || n > MAX_ENDPOINT {
            return Err(ScoutError::Endpoint(format!("{n} bytes long")));
        }
        if b.len() < HEAD_LEN + n + 2 {
            return Err(ScoutError::Truncated(b.len()));
        }
        let m = usize::from(u16_at(HEAD_LEN + n));
        let flags = b[5];
        let key_len = if flags & FLAG_KEY != 0 { KEY_LEN } else { 0 };
        if b.len() != HEAD_LEN + n + 2 + m + key_len {
            return Err(ScoutError::Truncated(b.len()));
        }
        let control = std::str::from_utf8(&b[HEAD_LEN..HEAD_LEN + n])
            .map_err(|_| ScoutError::Endpoint("not UTF-8".into()))?;
        if !control.starts_with("tcp://") {
            return Err(ScoutError::Endpoint(format!("{control:?} is not tcp://")));
        }
        let end = HEAD_LEN + n + 2 + m;
        Ok(Hello {
            leaving: flags & FLAG_LEAVING != 0,
            ask: flags & FLAG_ASK != 0,
            domain_tag: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            node_id: NodeId(b[12..28].try_into().expect("16 bytes")),
            version: u64::from_le_bytes(b[28..36].try_into().expect("8 bytes")),
            control: control.to_owned(),
            announcement: (m > 0).then(|| b[HEAD_LEN + n + 2..end].to_vec()),
            key: (key_len > 0).then(|| b[end..].try_into().expect("32 bytes")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            leaving: false,
            ask: true,
            domain_tag: 0x0102_0304,
            node_id: NodeId([7; 16]),
            version: 42,
            control: "tcp://10.99.0.1:7100".into(),
            announcement: None,
            key: None,
        }
    }

    #[test]
    fn a_hello_round_trips_and_its_layout_is_the_documented_one() {
        let b = hello().encode();
        assert_eq!(&b[..6], b"MLGS\x01\x02");
        assert_eq!(&b[8..12], &[4, 3, 2, 1]);
        assert_eq!(&b[28..36], &42u64.to_le_bytes());
        let n = usize::from(u16::from_le_bytes([b[36], b[37]]));
        assert_eq!(&b[HEAD_LEN + n..], &[0, 0], "no announcement");
        assert_eq!(Hello::decode(&b).unwrap(), hello());
        let with = hello().encode_with(br#"{"node_id":"x"}"#);
        assert_eq!(
            Hello::decode(&with).unwrap().announcement.as_deref(),
            Some(&br#"{"node_id":"x"}"#[..])
        );
        // Too large to fit one frame: left out, to be asked for.
        let big = vec![b' '; MAX_INLINE];
        assert_eq!(
            Hello::decode(&hello().encode_with(&big))
                .unwrap()
                .announcement,
            None
        );
    }

    #[test]
    fn a_secured_nodes_hello_ends_with_its_key() {
        let keyed = Hello {
            key: Some([9; KEY_LEN]),
            ..hello()
        };
        let b = keyed.encode_with(br#"{"a":1}"#);
        assert_eq!(b[5] & FLAG_KEY, FLAG_KEY);
        assert_eq!(&b[b.len() - KEY_LEN..], &[9; KEY_LEN]);
        let back = Hello::decode(&b).unwrap();
        assert_eq!(back.key, Some([9; KEY_LEN]));
        assert_eq!(back.announcement.as_deref(), Some(&br#"{"a":1}"#[..]));
        // The flag without the 32 bytes is truncated.
        assert_eq!(
            Hello::decode(&b[..b.len() - 1]),
            Err(ScoutError::Truncated(b.len() - 1))
        );
        // A key counts toward the size that decides inlining.
        let almost = vec![b' '; MAX_INLINE - HEAD_LEN - keyed.control.len() - 2];
        assert!(Hello::decode(&hello().encode_with(&almost))
            .unwrap()
            .announcement
            .is_some());
        assert!(Hello::decode(&keyed.encode_with(&almost))
            .unwrap()
            .announcement
            .is_none());
    }

    #[test]
    fn bad_datagrams_are_refused_with_their_reason() {
        let good = hello().encode();
        assert_eq!(Hello::decode(&good[..20]), Err(ScoutError::Truncated(20)));
        assert_eq!(
            Hello::decode(b"GET / HTTP/1.1\r\n"),
            Err(ScoutError::BadMagic)
        );
        let mut v2 = good.clone();
        v2[4] = 2;
        assert_eq!(Hello::decode(&v2), Err(ScoutError::Version(2)));
        let mut long = good.clone();
        long.push(b'x');
        assert_eq!(Hello::decode(&long), Err(ScoutError::Truncated(long.len())));
        let mut udp = hello();
        udp.control = "udp://1.2.3.4:5".into();
        assert!(matches!(
            Hello::decode(&udp.encode()),
            Err(ScoutError::Endpoint(_))
        ));
        let mut huge = good[..HEAD_LEN].to_vec();
        huge[36..38].copy_from_slice(&300u16.to_le_bytes());
        huge.extend(std::iter::repeat_n(b'a', 300));
        assert!(matches!(Hello::decode(&huge), Err(ScoutError::Endpoint(_))));
        // An announcement length past the end.
        let mut short = good.clone();
        let at = short.len() - 2;
        short[at..].copy_from_slice(&10u16.to_le_bytes());
        assert_eq!(
            Hello::decode(&short),
            Err(ScoutError::Truncated(short.len()))
        );
    }
}
