//! Control messages (docs/protocol.md §9.1): a node's control socket (a
//! ROUTER) answers `[MAGIC, INFO]` with `[MAGIC, INFO, NodeInfo]`, where
//! NodeInfo is a JSON object `{"announcement": ..., "stats": {...},
//! "peers": [...]}` (the announcement of [`crate::announce`], the node's
//! counters by name, and the control endpoints of the other nodes it
//! knows). `[MAGIC, GOSSIP, control endpoint, domain]` asks the same and
//! also says where the asker answers, so that a node given one peer
//! learns the rest and is learned by them (§9.4). These are the frames
//! after the ROUTER's identity frame.

/// First frame of every control request and reply.
pub const MAGIC: &[u8] = b"MILONGA-CTL/1";
/// "Who are you, and how are you doing".
pub const INFO: &[u8] = b"info";
/// "Who are you, and whom do you know; I answer at this endpoint".
pub const GOSSIP: &[u8] = b"gossip";
/// Longest control endpoint a gossip request may carry (bytes).
pub const MAX_GOSSIP_ENDPOINT: usize = 256;
/// Longest domain a gossip request may carry (bytes).
pub const MAX_GOSSIP_DOMAIN: usize = 255;

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
    /// A gossip request whose endpoint or domain is not acceptable.
    #[error("bad gossip request: {0}")]
    BadGossip(&'static str),
}

/// A control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `info`: the node's announcement and counters.
    Info,
    /// `gossip`: `info`, from a node of `domain` that answers at `control`
    /// (a `tcp://` endpoint).
    Gossip {
        /// The asker's control endpoint.
        control: String,
        /// The asker's domain.
        domain: String,
    },
}

impl Request {
    /// The request's frames.
    pub fn frames(&self) -> Vec<&[u8]> {
        match self {
            Request::Info => vec![MAGIC, INFO],
            Request::Gossip { control, domain } => {
                vec![MAGIC, GOSSIP, control.as_bytes(), domain.as_bytes()]
            }
        }
    }

    /// Reads a request's frames.
    pub fn decode<F: AsRef<[u8]>>(frames: &[F]) -> Result<Request, ControlError> {
        let expected = match frames.get(1).map(AsRef::as_ref) {
            Some(GOSSIP) => 4,
            _ => 2,
        };
        if frames.len() != expected {
            return Err(ControlError::FrameCount(frames.len(), expected));
        }
        if frames[0].as_ref() != MAGIC {
            return Err(ControlError::BadMagic);
        }
        match frames[1].as_ref() {
            INFO => Ok(Request::Info),
            GOSSIP => {
                let control = std::str::from_utf8(frames[2].as_ref())
                    .map_err(|_| ControlError::BadGossip("the endpoint is not UTF-8"))?;
                let domain = std::str::from_utf8(frames[3].as_ref())
                    .map_err(|_| ControlError::BadGossip("the domain is not UTF-8"))?;
                if control.len() > MAX_GOSSIP_ENDPOINT || !control.starts_with("tcp://") {
                    return Err(ControlError::BadGossip(
                        "the endpoint is not a tcp:// endpoint of at most 256 bytes",
                    ));
                }
                if domain.is_empty() || domain.len() > MAX_GOSSIP_DOMAIN {
                    return Err(ControlError::BadGossip(
                        "the domain is empty or longer than 255 bytes",
                    ));
                }
                Ok(Request::Gossip {
                    control: control.to_owned(),
                    domain: domain.to_owned(),
                })
            }
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
