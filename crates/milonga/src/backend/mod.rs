//! Below the engine: what carries frames between nodes. A locator picks
//! the backend; today the only one is peer-to-peer over ZeroMQ
//! ([`p2p`]), and it is the only code that uses ZeroMQ.

pub(crate) mod file;
pub(crate) mod p2p;
