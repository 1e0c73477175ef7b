//! Typed errors, one enum per family of operations. Each variant says why.

use std::time::Duration;

use milonga_wire::cbor::EncodeError;
use milonga_wire::KeyError;

/// A failure of the transport below Milonga: what the operating system or
/// the messaging library said (the library is an implementation detail;
/// the message and the OS error number are what is kept).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    message: String,
    os_code: Option<i32>,
}

impl TransportError {
    pub(crate) fn new(message: String, os_code: Option<i32>) -> Self {
        TransportError { message, os_code }
    }

    /// What failed, in words.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The OS error number (errno), where the failure has one.
    pub fn os_code(&self) -> Option<i32> {
        self.os_code
    }
}

/// Turns the transport's errors into [`TransportError`] (crate-private, so
/// that no transport type shows in the public API).
pub(crate) trait IntoTransport {
    fn transport(self) -> TransportError;
}

/// Why a node could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The locator is malformed.
    #[error("bad locator {locator:?}: {why}")]
    BadLocator {
        /// The locator given.
        locator: String,
        /// What is wrong with it.
        why: String,
    },
    /// No broker of a `milonga://HOST:PORT/DOMAIN` locator answered, or
    /// none serves the domain (docs/broker.md).
    #[error("{}", unreachable_text(.brokers, .domain, *.waited_ms, .why, *.answered))]
    BrokerUnreachable {
        /// The brokers tried.
        brokers: String,
        /// The domain asked for.
        domain: String,
        /// How long the node waited for each.
        waited_ms: u64,
        /// What a broker said, or how its handshake failed (empty when
        /// nothing was heard).
        why: String,
        /// A broker answered (it serves another domain, refused the
        /// node's key, or sent an error), rather than staying silent.
        answered: bool,
    },
    /// The locator names a deployment this version does not provide.
    #[error("unsupported: {what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },
    /// A configuration value is invalid.
    #[error("invalid configuration {key}: {why}")]
    Config {
        /// The key or variable.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A socket could not be created or bound.
    #[error("cannot {action} {endpoint}: {source}")]
    Socket {
        /// What was attempted (bind, connect, create).
        action: &'static str,
        /// The endpoint.
        endpoint: String,
        /// What the transport said.
        source: TransportError,
    },
    /// The runtime directory for local discovery is not usable.
    #[error("runtime directory {path}: {source}")]
    RuntimeDir {
        /// The directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The node's control thread could not be started.
    #[error("cannot start the node thread: {0}")]
    Thread(std::io::Error),
    /// The node's key or trust directory cannot be used (docs/security.md).
    #[error("security: {0}")]
    Security(#[from] SecurityError),
}

/// Why a key, a key file or a trust directory cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// The file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A secret key file that others can read.
    #[error("{path}: a secret key must be readable by its owner only (mode {mode:o}; run chmod 600 on it)")]
    Permissions {
        /// The file.
        path: std::path::PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A secret key file another user owns: that user controls this
    /// node's identity.
    #[error("{path}: a secret key must belong to the user who uses it or to root (it belongs to uid {owner})")]
    Owner {
        /// The file.
        path: std::path::PathBuf,
        /// Its owner.
        owner: u32,
    },
    /// A trust directory another user may write to (anyone who can add a
    /// file there is trusted).
    #[error("{path}: a trust directory must be writable by its owner alone, this user or root (it has uid {owner} and mode {mode:o}: anyone who may write it can add a trusted key; chmod go-w it)")]
    TrustWritable {
        /// The directory.
        path: std::path::PathBuf,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a key file.
    #[error("{path}: not a Milonga (ZPL) key file: {why}")]
    Malformed {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A secret key file whose public key is not the secret key's.
    #[error("{path}: its public key does not belong to its secret key (corrupt or edited)")]
    Mismatch {
        /// The file.
        path: std::path::PathBuf,
    },
    /// A text that is not a Z85 key.
    #[error("not a CURVE key: {0}")]
    BadKey(String),
    /// A name a key file cannot have.
    #[error("bad key name {0:?}: 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'")]
    BadName(String),
    /// The file exists already (keygen never overwrites a key).
    #[error("{0} exists already: keys are never overwritten (remove it first)")]
    Exists(std::path::PathBuf),
    /// The transport library was built without CURVE (never with this build).
    #[error("the transport library has no CURVE support")]
    NoCurve,
}

/// Why a publisher could not be declared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublisherError {
    /// The key is not a valid published key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// This node already has a publisher for the key; sequence numbers are
    /// per (node, key), so there can be only one. Share the handle instead.
    #[error("this node already publishes {0:?}; share that Publisher instead")]
    AlreadyDeclared(String),
    /// The data socket could not be created.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The node is closed.
    #[error("the node is closed")]
    Closed,
    /// The QoS's schema is not valid, or its id is taken on this node's
    /// data socket by another schema (docs/schemas.md).
    #[error(transparent)]
    Schema(#[from] milonga_wire::schema::SchemaError),
    /// The node's announcement would pass what discovery takes (1 MiB;
    /// 256 KiB for a node on a broker or a registry): peers would not see
    /// the node at all. Publish from another node.
    #[error("this node announces {publications} publications in {bytes} bytes; one more would pass the {limit} bytes discovery takes (publish the rest from another node)")]
    TooManyPublications {
        /// Publications declared now.
        publications: usize,
        /// Their bytes in the announcement.
        bytes: usize,
        /// The most an announcement may hold here.
        limit: usize,
    },
}

/// Why a subscription could not be declared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubscribeError {
    /// The key expression is invalid.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A socket could not be created.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The dispatcher thread of a callback subscription could not start.
    #[error("cannot start the dispatcher thread: {0}")]
    Thread(std::io::Error),
    /// The node is closed.
    #[error("the node is closed")]
    Closed,
    /// A QoS setting is out of range.
    #[error("invalid subscriber QoS: {0}")]
    Qos(String),
    /// The filter does not parse or is out of range.
    #[error(transparent)]
    Filter(#[from] milonga_wire::filter::FilterError),
    /// A `file:///` node's recording cannot be read: there is none at its
    /// path (a mistyped path, or a new one before the node's first put
    /// creates it).
    #[error("cannot read the recording: {0}")]
    Recording(String),
}

/// Why a `put` did not send its sample.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PutError {
    /// The value cannot be encoded.
    #[error("cannot encode the value: {0}")]
    Encode(#[from] EncodeError),
    /// The encoded sample exceeds `max_message_bytes`.
    #[error("sample of {size} bytes exceeds the limit of {limit} bytes (max_message_bytes)")]
    TooLarge {
        /// Encoded size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// `try_put` on a reliable publisher whose slowest subscriber is full.
    #[error("would block: a subscriber's queue is full (reliable publisher)")]
    WouldBlock,
    /// A reliable `put` waited its whole timeout for a slow subscriber.
    #[error("timed out after {0:?} waiting for a slow subscriber (reliable publisher)")]
    Timeout(Duration),
    /// The node is closed.
    #[error("the node is closed")]
    Closed,
    /// The transport refused the message.
    #[error("send failed: {0}")]
    Socket(TransportError),
    /// With a `file:///` locator: the sample could not be written to the
    /// recording (a full disk among others); the text says which file
    /// and why.
    #[error("recording failed: {0}")]
    Recording(String),
    /// The value does not fit the publisher's schema: the field and why
    /// (docs/schemas.md).
    #[error("the value does not fit the publisher's schema: {0}")]
    Schema(#[from] milonga_wire::schema::SchemaError),
    /// `Publisher::skip` asked to leave out more sequence numbers than a
    /// subscriber takes as a loss (a larger jump is taken as corrupt or
    /// forged), or more than are left before the largest number.
    #[error("cannot leave out {count} sequence numbers: at most {limit} at once")]
    SkipTooLarge {
        /// How many were asked.
        count: u64,
        /// The most at once.
        limit: u64,
    },
}

/// Why `recv` returned no event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// Nothing arrived before the timeout.
    #[error("no event within the timeout")]
    Timeout,
    /// `try_recv` found nothing queued.
    #[error("no event queued")]
    Empty,
    /// The subscription delivers to a callback, not to `recv`.
    #[error("this subscription delivers to its callback; recv is not available")]
    CallbackMode,
    /// The node was closed.
    #[error("the node is closed")]
    Closed,
    /// The transport failed.
    #[error("receive failed: {0}")]
    Socket(TransportError),
    /// With a `file:///` locator: the recording was read to its end.
    #[error("the recording was read to its end")]
    EndOfRecording,
}

/// Why a service could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The key is not a valid key (services have concrete keys, no
    /// wildcards).
    #[error(transparent)]
    Key(#[from] KeyError),
    /// This node already serves the key.
    #[error("this node already serves {0:?}")]
    AlreadyServed(String),
    /// The options are out of range.
    #[error("invalid serve options: {0}")]
    Options(String),
    /// The socket could not be created or bound.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A worker thread could not start.
    #[error("cannot start a worker thread: {0}")]
    Thread(std::io::Error),
    /// The node is closed.
    #[error("the node is closed")]
    Closed,
}

/// Why a call returned no reply value. Every call ends with exactly one
/// outcome: a reply, or one of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The key (or key expression) is invalid.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The request value cannot be encoded.
    #[error("cannot encode the request: {0}")]
    Encode(#[from] EncodeError),
    /// Discovery knows no server of the key (or the server has withdrawn
    /// it). Returned at once, without waiting for the timeout.
    #[error("no server of {key:?} is known")]
    NoServer {
        /// The key or expression called.
        key: String,
    },
    /// No reply before the deadline.
    #[error("{server} did not answer {key:?} within {after:?}")]
    Timeout {
        /// The key called.
        key: String,
        /// The server the call went to.
        server: String,
        /// The timeout.
        after: Duration,
    },
    /// The handler returned an error, or panicked (kind `panic`).
    #[error("{server} failed: {kind}: {message}")]
    Remote {
        /// The server.
        server: String,
        /// The error's kind.
        kind: String,
        /// The error's message.
        message: String,
    },
    /// The connection to the server broke during the call: its process
    /// died, or its service was closed.
    #[error("lost {server} during the call")]
    ServerLost {
        /// The server.
        server: String,
    },
    /// The call was refused without running: `too_large` (here, before
    /// sending), `overload` (the server's queue is full), `bad_request`,
    /// `wrong_domain`.
    #[error("rejected{}: {kind}: {message}", server.as_ref().map(|s| format!(" by {s}")).unwrap_or_default())]
    Rejected {
        /// The server, or `None` when refused before sending.
        server: Option<String>,
        /// Why, in one word.
        kind: String,
        /// Why, for a person.
        message: String,
    },
    /// The server refused the caller (security on, docs/security.md).
    #[error("permission denied by {server}: {reason}")]
    PermissionDenied {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// The reply arrived but its value does not decode.
    #[error("the reply of {server} does not decode: {why}")]
    BadReply {
        /// The server.
        server: String,
        /// The decoding error.
        why: String,
    },
    /// A socket could not be created.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The transport refused to send.
    #[error("send failed: {0}")]
    Socket(TransportError),
    /// The helper thread of an awaited call could not start.
    #[error("cannot wait for the call: {0}")]
    Thread(String),
    /// The node is closed.
    #[error("the node is closed")]
    Closed,
}

/// [`OpenError::BrokerUnreachable`] in words: silence (with how a
/// handshake failed, if one did), or a broker's answer (`why`).
fn unreachable_text(
    brokers: &str,
    domain: &str,
    waited_ms: u64,
    why: &str,
    answered: bool,
) -> String {
    if answered {
        format!("no broker at {brokers} serves this node in domain {domain}{why}")
    } else {
        format!("no broker answered for domain {domain} at {brokers} within {waited_ms} ms{why}")
    }
}
