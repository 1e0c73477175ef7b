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
// `unsafe` lives in the two FFI modules alone: sys (the C library) and
// zmq_io (libzmq's calls the zmq crate does not wrap).
#![deny(unsafe_code)]

#[macro_use]
mod log_limit;
mod batch;
mod call;
mod config;
mod control;
mod discovery;
mod error;
mod filters;
mod history;
mod node;
mod publisher;
mod qos;
mod queue;
mod sample;
mod seq;
mod service;
mod stats;
mod subscriber;
#[allow(unsafe_code)]
mod sys;
#[allow(unsafe_code)]
mod zmq_io;

pub use call::{PendingCall, ServerReply};
pub use config::{Config, ConfigValue, Transport, MAX_DOMAIN_BYTES};
pub use control::{NodeInfo, CONTROL_INFO, CONTROL_MAGIC};
pub use discovery::{Announcement, PublicationInfo};
pub use error::{
    CallError, OpenError, PublisherError, PutError, RecvError, ServeError, SubscribeError,
    TransportError,
};
pub use node::Node;
pub use publisher::Publisher;
pub use qos::{PublisherQos, Reliability, SubscriberQos};
pub use queue::QueuePolicy;
pub use sample::{
    DeadlineMissed, Event, IncompatibleQos, LostReason, LostSamples, PublisherAlive, PublisherLost,
    QosPolicy, Sample,
};
pub use service::{Request, ServeOptions, Service, ServiceError, ServiceInfo};
pub use stats::NodeStats;
pub use subscriber::{Iter, Subscriber};

pub use milonga_wire as wire;
pub use milonga_wire::filter::{Filter, FilterError};
pub use milonga_wire::{
    Bytes, ElementType, Encoding, Key, KeyError, KeyExpr, NodeId, TypedArray, Value,
};
