//! The peer-to-peer backend: every node binds its own ZeroMQ sockets
//! (data XPUBs, a liveliness XPUB, a control ROUTER, services' ROUTERs),
//! and the node thread polls them (docs/internals.md).

pub(crate) mod call_link;
pub(crate) mod control;
pub(crate) mod data;
pub(crate) mod serve_link;
pub(crate) mod sub_link;
// libzmq's calls that the zmq crate does not wrap.
#[allow(unsafe_code)]
pub(crate) mod zmq_io;

use std::sync::Mutex;

use milonga_wire::NodeId;

use crate::model::error::{IntoTransport, OpenError};
pub(crate) use zmq_io::ContextRef;

/// Wakes the node thread: one end of an inproc PAIR.
pub(crate) struct NodeWaker(Mutex<zmq::Socket>);

/// The node thread's end of the pair.
pub(crate) struct WakeRx(pub(crate) zmq::Socket);

impl NodeWaker {
    /// The pair of node `id`.
    pub(crate) fn pair(ctx: &ContextRef, id: NodeId) -> Result<(NodeWaker, WakeRx), OpenError> {
        let wake_ep = format!("inproc://milonga-nodewake-{id}");
        let wake_rx = ctx.socket(zmq::PAIR)?;
        let wake_tx = ctx.socket(zmq::PAIR)?;
        let wake_err = |source: zmq::Error| OpenError::Socket {
            action: "bind or connect",
            endpoint: wake_ep.clone(),
            source: source.transport(),
        };
        wake_rx.set_linger(0).map_err(wake_err)?;
        wake_tx.set_linger(0).map_err(wake_err)?;
        wake_rx.bind(&wake_ep).map_err(wake_err)?;
        wake_tx.connect(&wake_ep).map_err(wake_err)?;
        Ok((NodeWaker(Mutex::new(wake_tx)), WakeRx(wake_rx)))
    }

    /// Wakes the node thread now rather than at its next turn.
    pub(crate) fn wake(&self) {
        let _ = crate::util::lock(&self.0).send(&[][..], zmq::DONTWAIT);
    }
}
