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
