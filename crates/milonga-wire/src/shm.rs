//! Shared-memory references (docs/protocol.md §4.6): the body of a sample
//! whose payload frame a publisher wrote into its shared-memory segment
//! instead of sending it. The reference names the segment, the slot and
//! the slot's stamp; the bytes that would have led the payload frame's
//! body (a typed array's CBOR heads) follow it.

/// Bytes a reference takes at the start of the body.
pub const REF_LEN: usize = 32;

/// The first byte of a shared-memory marker subscription and of a
/// reference frame (never the first byte of a key: 0xFF is not UTF-8).
pub const MARKER_BYTE: u8 = 0xFF;

/// Length of a marker's head, `0xFF "s/" <16 hex digits> "/"`, which a
/// marker subscription puts before a key prefix and a reference frame
/// before its key.
pub const MARKER_HEAD_LEN: usize = 20;

/// Whether `b` starts with a well-formed marker head (any host).
pub fn is_marker_head(b: &[u8]) -> bool {
    b.len() >= MARKER_HEAD_LEN
        && b[0] == MARKER_BYTE
        && &b[1..3] == b"s/"
        && b[3..19]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        && b[19] == b'/'
}

/// Where a sample's payload frame lies in a publisher's segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedRef {
    /// The segment's number among the publishing process's segments.
    pub segment: u32,
    /// The publishing process's id (the segment's file name holds it).
    pub pid: u32,
    /// The slot in the segment's slot table.
    pub slot: u32,
    /// The slot's stamp when the payload was written: even, never 0.
    pub stamp: u64,
    /// The payload frame's length in bytes.
    pub len: u64,
}

impl SharedRef {
    /// The reference's [`REF_LEN`] bytes (little-endian fields, four
    /// reserved bytes of zero after the slot).
    pub fn encode(&self) -> [u8; REF_LEN] {
        let mut b = [0u8; REF_LEN];
        b[0..4].copy_from_slice(&self.segment.to_le_bytes());
        b[4..8].copy_from_slice(&self.pid.to_le_bytes());
        b[8..12].copy_from_slice(&self.slot.to_le_bytes());
        b[16..24].copy_from_slice(&self.stamp.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// The reference at the start of `body` and the bytes after it, or
    /// `None` if `body` is shorter than [`REF_LEN`], the reserved bytes
    /// are not zero, or the stamp is odd or zero.
    pub fn decode(body: &[u8]) -> Option<(SharedRef, &[u8])> {
        let (b, rest) = body.split_at_checked(REF_LEN)?;
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let r = SharedRef {
            segment: u32_at(0),
            pid: u32_at(4),
            slot: u32_at(8),
            stamp: u64_at(16),
            len: u64_at(24),
        };
        (u32_at(12) == 0 && r.stamp != 0 && r.stamp % 2 == 0).then_some((r, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_reads_back_and_bad_ones_are_refused() {
        let r = SharedRef {
            segment: 3,
            pid: 4242,
            slot: 17,
            stamp: 88,
            len: 1 << 20,
        };
        let mut body = r.encode().to_vec();
        body.extend_from_slice(&[0xd8, 0x56]);
        assert_eq!(SharedRef::decode(&body), Some((r, &[0xd8, 0x56][..])));
        assert_eq!(SharedRef::decode(&body[..REF_LEN - 1]), None);
        let mut odd = body.clone();
        odd[16] = 89;
        assert_eq!(
            SharedRef::decode(&odd),
            None,
            "an odd stamp is a slot being written"
        );
        let mut reserved = body.clone();
        reserved[12] = 1;
        assert_eq!(SharedRef::decode(&reserved), None);
    }
}
