//! The handles an application holds: a node, its publishers,
//! subscribers, services and calls. They check their arguments, encode and
//! decode values, and hand frames to the layers below.

pub mod broker;
pub(crate) mod call;
pub(crate) mod file_node;
pub(crate) mod node;
pub mod p2p;
pub(crate) mod publisher;
pub mod recording;
pub mod security;
pub(crate) mod service;
pub(crate) mod subscriber;
