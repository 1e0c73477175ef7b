//! Milonga: event and messaging middleware for control systems, physics
//! data acquisition and lab automation, over ZeroMQ.
//!
//! A [`Node`] joins a domain named by a locator (`milonga:///lab`). It
//! declares [`Publisher`]s of keys (`sr/ps/1/current`) and [`Subscriber`]s
//! of key expressions (`sr/*/1/**`). Nodes of one host find each other with
//! no configuration; nodes of other hosts are given by their control
//! endpoints (`MILONGA_PEERS`). No daemon runs anywhere.
//!
//! ```no_run
//! use std::time::Duration;
//! use milonga::{Node, Event};
//!
//! let node = Node::open("milonga:///lab", "monitor")?;
//! let sub = node.subscribe("sr/ps/**")?;
//! let ps = node.publisher("sr/ps/1/current")?;
//! ps.put(12.5)?;
//! match sub.recv_timeout(Duration::from_secs(1)) {
//!     Ok(Event::Sample(s)) => println!("{} = {:?} (seq {})", s.key, s.value, s.seq),
//!     Ok(Event::Lost(l)) => println!("lost {} samples of {}", l.count, l.key),
//!     Ok(_) => {}
//!     Err(e) => println!("nothing: {e}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Delivery is [`Reliability::BestEffort`] (drops at the high-water mark,
//! each reported to the subscriber that lost it as [`Event::Lost`]) or
//! [`Reliability::Reliable`] (the publisher waits; nothing is dropped).
#![deny(missing_docs)]
#![deny(unsafe_code)]

// The layers, from the application down (docs/internals.md): `api` uses
// `session` (one node's state), `discovery`, `engine` and `backend`; `engine` does no I/O; `model` and
// `util` depend on no other layer. `unsafe` lives in two FFI modules
// alone: util::sys (the C library) and the peer-to-peer backend's FFI
// module (ZeroMQ's calls that its Rust crate does not wrap).
#[macro_use]
mod util;
mod api;
mod backend;
mod discovery;
mod engine;
mod model;
mod session;

pub use api::broker;
pub use api::call::{PendingCall, ServerReply};
pub use api::node::Node;
pub use api::p2p;
pub use api::publisher::{Loan, LoanLayout, LoanNotPut, Publisher};
pub use api::recording;
pub use api::security;
pub use api::service::{Request, ServeOptions, Service, ServiceError, ServiceInfo};
pub use api::subscriber::{Iter, Subscriber};
pub use discovery::{Announcement, PublicationInfo};
pub use engine::queue::QueuePolicy;
pub use model::compression::{
    train_dictionary, Compression, Compressor, DICTIONARY_TRAINING_SAMPLES, MAX_DICTIONARY_BYTES,
};
pub use model::config::{Config, ConfigValue, Security, Transport, MAX_DOMAIN_BYTES};
pub use model::error::{
    CallError, OpenError, PublisherError, PutError, RecvError, SecurityError, ServeError,
    SubscribeError, TransportError,
};
pub use model::qos::{PublisherQos, Reliability, SubscriberQos};
pub use model::sample::CompactReader;
pub use model::sample::{
    BrokerChanged, DeadlineMissed, Event, IncompatibleQos, LostReason, LostSamples,
    PermissionDenied, PublisherAlive, PublisherLost, QosPolicy, Sample,
};
pub use util::stats::NodeStats;

pub use milonga_derive::Compact;
pub use milonga_wire as wire;
pub use milonga_wire::compact::{Compact, CompactRecord};
pub use milonga_wire::filter::{Filter, FilterError};
pub use milonga_wire::schema::{Field, Incompatible, Schema, SchemaError, Type as FieldType};
pub use milonga_wire::{
    Bytes, ElementType, Encoding, Key, KeyError, KeyExpr, NodeId, TypedArray, Value,
};
