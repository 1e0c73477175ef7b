//! What exists only in the peer-to-peer deployment (`milonga:///domain`):
//! the endpoints a node's sockets are bound to and the control protocol
//! that `milonga ls` speaks (docs/protocol.md §9). Tools and tests that
//! talk to a node's sockets directly use these; an application needs none
//! of them, and a node reached through a broker or a file has no such
//! endpoints.
//!
//! ```no_run
//! use milonga::p2p::{NodeExt, ServiceExt};
//!
//! let node = milonga::Node::open("milonga:///lab", "tool")?;
//! println!("static peers can name {}", node.control_endpoint());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

pub use crate::backend::p2p::control::{NodeInfo, CONTROL_INFO, CONTROL_MAGIC};
use crate::{Node, Service};

/// A node's peer-to-peer endpoints and control queries.
pub trait NodeExt {
    /// The control endpoint static peers can be given.
    fn control_endpoint(&self) -> &str;

    /// Asks the node at `control_endpoint` for its announcement and
    /// counters; `None` if it does not answer within `timeout`.
    fn query(&self, control_endpoint: &str, timeout: Duration) -> Option<NodeInfo>;

    /// Asks every node of `control_endpoints` for its announcement and
    /// counters at once, waiting at most `timeout` in all; `None` for those
    /// that do not answer in time.
    fn query_many(&self, control_endpoints: &[String], timeout: Duration) -> Vec<Option<NodeInfo>>;

    /// The nodes discovery shows that this node does not connect to, and
    /// why: a key not in its trust directory, no key while its security is
    /// on, or a key while its security is off (docs/security.md). They are
    /// not among [`crate::Node::peers`].
    fn excluded_peers(&self) -> Vec<(crate::Announcement, String)>;
}

impl NodeExt for Node {
    fn control_endpoint(&self) -> &str {
        self.inner.control_endpoint()
    }

    fn query(&self, control_endpoint: &str, timeout: Duration) -> Option<NodeInfo> {
        crate::backend::p2p::control::query(self.inner.backend(), control_endpoint, timeout)
    }

    fn query_many(&self, control_endpoints: &[String], timeout: Duration) -> Vec<Option<NodeInfo>> {
        crate::backend::p2p::control::query_many(self.inner.backend(), control_endpoints, timeout)
    }

    fn excluded_peers(&self) -> Vec<(crate::Announcement, String)> {
        self.inner.backend().excluded_peers()
    }
}

/// A service's peer-to-peer endpoint.
pub trait ServiceExt {
    /// The endpoint callers connect to.
    fn endpoint(&self) -> &str;
}

impl ServiceExt for Service {
    fn endpoint(&self) -> &str {
        self.bound_endpoint()
    }
}
