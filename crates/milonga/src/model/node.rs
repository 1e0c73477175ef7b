//! Who a node is: its id, names, domain, configuration and counters. Set
//! once at open and read by every layer; nothing in it changes afterwards
//! but the counters (atomics) and the closing flag, so it is shared by
//! reference (`Arc`) rather than owned by one of them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use milonga_wire::NodeId;

use crate::model::config::Config;
use crate::util::stats::Counters;

/// A node's identity and configuration (see the module).
pub(crate) struct NodeCore {
    /// The node id, random at open; with security on, bound to its key
    /// by `id_salt` (`NodeId::keyed`).
    pub(crate) id: NodeId,
    /// With security on: the random salt that gives `id` with the key.
    pub(crate) id_salt: Option<[u8; 16]>,
    /// `name@host:pid`.
    pub(crate) name: String,
    /// The domain's name.
    pub(crate) domain: String,
    /// The domain's tag, in every frame's header.
    pub(crate) domain_tag: u32,
    /// The configuration it was opened with (`tcp_host = auto` resolved
    /// to the first address).
    pub(crate) cfg: Config,
    /// The other addresses `tcp_host = auto` chose: every tcp socket bound
    /// at `tcp_host` binds the same port on each of them.
    pub(crate) other_hosts: Vec<std::net::Ipv4Addr>,
    /// What happened to it, counted.
    pub(crate) counters: Arc<Counters>,
    /// Set once, by `close`.
    closed: AtomicBool,
}

impl NodeCore {
    pub(crate) fn new(id: NodeId, name: String, domain: String, cfg: Config) -> NodeCore {
        NodeCore {
            id,
            id_salt: None,
            name,
            domain_tag: milonga_wire::frame::domain_tag(&domain),
            domain,
            cfg,
            other_hosts: Vec::new(),
            counters: Arc::new(Counters::default()),
            closed: AtomicBool::new(false),
        }
    }

    /// Whether the node is closing or closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Marks the node closed; whether it already was.
    pub(crate) fn mark_closed(&self) -> bool {
        self.closed.swap(true, Ordering::AcqRel)
    }
}
