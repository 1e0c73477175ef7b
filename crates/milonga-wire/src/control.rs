//! Control messages (docs/protocol.md §9.1): a node's control socket (a
//! ROUTER) answers `[MAGIC, INFO]` with `[MAGIC, INFO, NodeInfo]`, where
//! NodeInfo is a JSON object `{"announcement": ..., "stats": {...}}` (the
//! announcement of [`crate::announce`], and the node's counters by name).
//! These are the frames after the ROUTER's identity frame.

/// First frame of every control request and reply.
pub const MAGIC: &[u8] = b"MILONGA-CTL/1";
/// The one request of protocol v1: "who are you, and how are you doing".
pub const INFO: &[u8] = b"info";

/// Why frames are not a control message of this version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not as many frames as the message has.
    #[error("{0} frames, expected {1}")]
    FrameCount(usize, usize),
    /// The first frame is not [`MAGIC`] (another protocol, or version).
    #[error("the first frame is not MILONGA-CTL/1")]
    BadMagic,
    /// A request this version does not know.
    #[error("unknown request {0:?}")]
    UnknownRequest(String),
}

/// A control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `info`: the node's announcement and counters.
    Info,
}

impl Request {
    /// The request's frames.
    pub fn frames(self) -> [&'static [u8]; 2] {
        match self {
            Request::Info => [MAGIC, INFO],
        }
    }

    /// Reads a request's frames.
    pub fn decode<F: AsRef<[u8]>>(frames: &[F]) -> Result<Request, ControlError> {
        if frames.len() != 2 {
            return Err(ControlError::FrameCount(frames.len(), 2));
        }
        if frames[0].as_ref() != MAGIC {
            return Err(ControlError::BadMagic);
        }
        match frames[1].as_ref() {
            INFO => Ok(Request::Info),
            other => Err(ControlError::UnknownRequest(
                String::from_utf8_lossy(other).into_owned(),
            )),
        }
    }
}

/// The frames of the reply to `info`, with `node_info` its JSON body.
pub fn info_reply(node_info: &[u8]) -> [&[u8]; 3] {
    [MAGIC, INFO, node_info]
}

/// The JSON body of a reply to `info`.
pub fn decode_info_reply<F: AsRef<[u8]>>(frames: &[F]) -> Result<&[u8], ControlError> {
    if frames.len() != 3 {
        return Err(ControlError::FrameCount(frames.len(), 3));
    }
    if frames[0].as_ref() != MAGIC {
        return Err(ControlError::BadMagic);
    }
    if frames[1].as_ref() != INFO {
        return Err(ControlError::UnknownRequest(
            String::from_utf8_lossy(frames[1].as_ref()).into_owned(),
        ));
    }
    Ok(frames[2].as_ref())
}
