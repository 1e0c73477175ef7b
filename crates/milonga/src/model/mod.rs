//! What the application and the wire agree on, with no behaviour of its
//! own: configuration, quality of service, samples and events, errors.

pub(crate) mod acl;
pub(crate) mod compression;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod node;
pub(crate) mod qos;
pub(crate) mod sample;
