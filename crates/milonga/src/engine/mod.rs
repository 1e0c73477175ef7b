//! The protocol's state, with no I/O of its own: sequence numbers and
//! gaps, the application queue, kept history, filters applied at the
//! source, batches, the calling side of a service call. Frames go in and
//! out; the sockets are the backend's.

pub(crate) mod batch;
pub(crate) mod call;
pub(crate) mod compress;
pub(crate) mod filters;
pub(crate) mod history;
pub(crate) mod outlet;
pub(crate) mod queue;
pub(crate) mod routes;
pub(crate) mod seq;
pub(crate) mod serve;
pub(crate) mod subscription;

use milonga_wire::NodeId;

use crate::model::node::NodeCore;
use crate::util::stats::Counters;

/// What the engine needs to know of the node it works for: who it is in
/// the frames it writes, the largest message it may send, and where it
/// counts what happens.
pub(crate) struct Me<'a> {
    pub(crate) id: NodeId,
    pub(crate) domain_tag: u32,
    pub(crate) max_message_bytes: usize,
    pub(crate) counters: &'a Counters,
}

impl<'a> From<&'a NodeCore> for Me<'a> {
    fn from(node: &'a NodeCore) -> Me<'a> {
        Me {
            id: node.id,
            domain_tag: node.domain_tag,
            max_message_bytes: node.cfg.max_message_bytes,
            counters: &node.counters,
        }
    }
}
