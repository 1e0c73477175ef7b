//! What a node tells its domain about itself (docs/protocol.md §9.2): its
//! identity, endpoints, publications and services, as a JSON object. The
//! local discovery directory holds one per node, and a node's control
//! socket answers it inside `NodeInfo` (see [`crate::control`]).

use serde::{Deserialize, Serialize};

use crate::NodeId;

/// What a publisher does when a subscriber cannot keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reliability {
    /// Drop at the high-water mark; the subscriber that lost samples sees
    /// the gap in sequence numbers and reports it lost.
    #[default]
    BestEffort,
    /// Never drop: a put waits until the slowest subscriber has room (up
    /// to the publisher's put timeout).
    Reliable,
}

impl Reliability {
    /// `"best_effort"` or `"reliable"`, as in announcements.
    pub fn as_str(self) -> &'static str {
        match self {
            Reliability::BestEffort => "best_effort",
            Reliability::Reliable => "reliable",
        }
    }
}

impl std::str::FromStr for Reliability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "best-effort" | "best_effort" => Ok(Reliability::BestEffort),
            "reliable" => Ok(Reliability::Reliable),
            other => Err(format!(
                "unknown reliability {other:?}: expected reliable or best-effort"
            )),
        }
    }
}

/// One publication in an announcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicationInfo {
    /// The published key.
    pub key: String,
    /// The publisher's reliability.
    pub reliability: Reliability,
    /// Samples it keeps per key for late joiners and repair.
    #[serde(default)]
    pub history: usize,
    /// The data endpoint serving it when that is not the node's endpoint
    /// of its reliability: with access control, publications whose keys
    /// different `subscribe` rules cover are served on data sockets of
    /// their own (docs/protocol.md §2.2). Absent: the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The name history queries and filter declarations give that data
    /// socket (`socket`, docs/protocol.md §4.2, §4.4) when it has an
    /// endpoint of its own. Absent: the reliability's (`best_effort`,
    /// `reliable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// The id of the schema its samples are written with (encoding 3,
    /// docs/protocol.md §5.1): a subscriber asks for it on joining.
    /// Absent: plain samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<u32>,
}

impl PublicationInfo {
    /// The name of the data socket serving it, as queries give it.
    pub fn socket_name(&self) -> &str {
        self.socket.as_deref().unwrap_or(self.reliability.as_str())
    }
}

/// What a node tells its domain about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    /// Protocol version (1).
    pub protocol: u8,
    /// The domain.
    pub domain: String,
    /// The node id, 32 hex digits.
    pub node_id: String,
    /// Readable name, `name@host:pid`.
    pub name: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Process start time (clock ticks after boot, from /proc), to tell a
    /// recycled pid from the node's process.
    pub start_time: u64,
    /// The control endpoint (ROUTER).
    pub control: String,
    /// Data endpoint of best-effort publications, once one exists.
    pub data_best_effort: Option<String>,
    /// Data endpoint of reliable publications, once one exists.
    pub data_reliable: Option<String>,
    /// Liveliness endpoint: the node's heartbeats (XPUB, key `@hb`).
    #[serde(default)]
    pub liveliness: Option<String>,
    /// Publications.
    pub publications: Vec<PublicationInfo>,
    /// Services.
    #[serde(default)]
    pub services: Vec<ServiceInfo>,
    /// The node's CURVE public key (Z85, 40 characters) when its security
    /// is on: the server key of every socket it binds. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// With `key`: the 16 random bytes (32 hex digits) that, hashed with
    /// the key, give `node_id` ([`crate::NodeId::keyed`]). A secured node
    /// takes an announcement only if they do: it names a node of that key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_salt: Option<String>,
    /// A secured broker's key (Z85) when the broker shows this node, one of
    /// its clients, to the peer-to-peer nodes of its host: the node's
    /// frames come from the broker's sockets, which are reached with that
    /// key, and the broker vouches for them (docs/broker.md "Security").
    /// A secured node takes such a node only if it designates that key
    /// (its own identity's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

impl Announcement {
    /// The node id, if well formed.
    pub fn id(&self) -> Option<NodeId> {
        NodeId::from_hex(&self.node_id)
    }

    /// The data endpoint serving publications of `reliability`.
    pub fn data_endpoint(&self, reliability: Reliability) -> Option<&str> {
        match reliability {
            Reliability::BestEffort => self.data_best_effort.as_deref(),
            Reliability::Reliable => self.data_reliable.as_deref(),
        }
    }

    /// The data endpoint serving publication `p`: its own, else the
    /// node's of its reliability.
    pub fn publication_endpoint<'a>(&'a self, p: &'a PublicationInfo) -> Option<&'a str> {
        p.endpoint
            .as_deref()
            .or_else(|| self.data_endpoint(p.reliability))
    }

    /// Every data endpoint the announcement names: the node's two and
    /// those of publications served on sockets of their own.
    pub fn data_endpoints(&self) -> impl Iterator<Item = &str> {
        self.data_best_effort
            .as_deref()
            .into_iter()
            .chain(self.data_reliable.as_deref())
            .chain(
                self.publications
                    .iter()
                    .filter_map(|p| p.endpoint.as_deref()),
            )
    }

    /// The compact JSON form (fields in the order above).
    pub fn to_json(&self) -> Vec<u8> {
        // Strings, integers, options and vectors of them: cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads an announcement. Unknown fields are ignored (a newer peer's);
    /// `liveliness`, `services` and a publication's `history` may be
    /// missing (an older peer's); every other field is required.
    pub fn from_json(text: &[u8]) -> Result<Announcement, AnnounceError> {
        serde_json::from_slice(text).map_err(|e| AnnounceError(e.to_string()))
    }
}

/// Why bytes are not an announcement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an announcement: {0}")]
pub struct AnnounceError(pub String);

/// A service in an announcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    /// The service's key.
    pub key: String,
    /// Where callers connect (a ROUTER socket).
    pub endpoint: String,
    /// Worker threads.
    pub workers: usize,
    /// The largest request the server accepts, in bytes.
    pub max_request_bytes: usize,
}
