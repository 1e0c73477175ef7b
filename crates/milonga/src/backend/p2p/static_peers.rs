//! The static discovery source: the control endpoints given in the
//! configuration (`peers`), each asked for its announcement every
//! `static_query_interval_ms` (docs/protocol.md §9) and forgotten when it
//! stops answering. It speaks the control protocol over ZeroMQ DEALERs,
//! so it belongs to this backend.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::p2p::control::NodeInfo;
use crate::backend::p2p::{zmq_io, P2p};
use crate::discovery::{Announcement, Source};
use crate::model::error::{IntoTransport, OpenError};
use crate::model::node::NodeCore;
use crate::util::stats;

struct StaticPeer {
    endpoint: String,
    sock: zmq::Socket,
    last_reply: Option<Instant>,
    announcement: Option<Announcement>,
    warned_domain: bool,
}

/// The configured peers and what they last answered.
pub(crate) struct StaticPeers {
    node: Arc<NodeCore>,
    peers: Vec<StaticPeer>,
    last_query: Option<Instant>,
    /// The node thread's poll saw a reply waiting: read in the next turn
    /// (an empty socket is not read every turn).
    readable: bool,
}

impl StaticPeers {
    /// Connects to every configured peer (a bad endpoint is logged and
    /// skipped).
    pub(crate) fn new(p2p: &P2p, node: Arc<NodeCore>) -> StaticPeers {
        let mut peers = Vec::new();
        for ep in &node.cfg.peers {
            match p2p.ctx().socket(zmq::DEALER).and_then(|s| {
                let _ = zmq_io::apply_common(&s, &node.cfg);
                let _ = s.set_sndhwm(4);
                s.connect(ep)
                    .map_err(|source: zmq::Error| OpenError::Socket {
                        action: "connect",
                        endpoint: ep.clone(),
                        source: source.transport(),
                    })?;
                Ok(s)
            }) {
                Ok(sock) => peers.push(StaticPeer {
                    endpoint: ep.clone(),
                    sock,
                    last_reply: None,
                    announcement: None,
                    warned_domain: false,
                }),
                Err(err) => tracing::warn!(peer = %ep, %err, "ignoring a static peer"),
            }
        }
        StaticPeers {
            node,
            peers,
            last_query: None,
            // Replies may wait before the first poll.
            readable: true,
        }
    }

    /// Their sockets, for the node thread's poll ([`StaticPeers::sockets`]
    /// of them).
    pub(crate) fn poll_items(&self) -> impl Iterator<Item = zmq::PollItem<'_>> {
        self.peers.iter().map(|p| p.sock.as_poll_item(zmq::POLLIN))
    }

    pub(crate) fn sockets(&self) -> usize {
        self.peers.len()
    }

    /// The poll found a reply waiting.
    pub(crate) fn mark_readable(&mut self) {
        self.readable = true;
    }

    fn every(&self) -> Duration {
        Duration::from_millis(self.node.cfg.static_query_interval_ms.max(10))
    }

    /// Reads the replies that arrived; whether an announcement changed.
    fn read(&mut self, now: Instant) -> bool {
        let domain = &self.node.domain;
        let c = &self.node.counters;
        let mut changed = false;
        for p in &mut self.peers {
            while let Ok(frames) = p.sock.recv_multipart(zmq::DONTWAIT) {
                let parsed = milonga_wire::control::decode_info_reply(&frames)
                    .ok()
                    .and_then(|body| serde_json::from_slice::<NodeInfo>(body).ok());
                let Some(info) = parsed else {
                    stats::inc(&c.control_malformed);
                    limited!(warn, peer = %p.endpoint, "dropped a malformed reply from a static peer");
                    continue;
                };
                if info.announcement.domain != *domain {
                    stats::inc(&c.peers_foreign_domain);
                    if !p.warned_domain {
                        tracing::warn!(
                            peer = %p.endpoint,
                            their = %info.announcement.domain,
                            ours = %domain,
                            "ignoring a static peer of another domain"
                        );
                        p.warned_domain = true;
                    }
                    continue;
                }
                p.last_reply = Some(now);
                if p.announcement.as_ref() != Some(&info.announcement) {
                    p.announcement = Some(info.announcement);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Asks every peer again when a query is due, and forgets those that
    /// have not answered for three intervals (at least the lease); whether
    /// one was forgotten.
    fn query(&mut self, now: Instant) -> bool {
        let every = self.every();
        if self.last_query.is_some_and(|t| now < t + every) {
            return false;
        }
        self.last_query = Some(now);
        let expiry = (every * 3).max(Duration::from_millis(
            self.node.cfg.heartbeat_timeout_ms as u64,
        ));
        let mut changed = false;
        for p in &mut self.peers {
            let req = milonga_wire::control::Request::Info.frames();
            let _ = p.sock.send_multipart(req, zmq::DONTWAIT);
            if p.announcement.is_some() && p.last_reply.is_none_or(|t| now - t > expiry) {
                tracing::info!(peer = %p.endpoint, "static peer stopped answering");
                p.announcement = None;
                changed = true;
            }
        }
        changed
    }
}

impl Source for StaticPeers {
    fn turn(&mut self, now: Instant) -> bool {
        if self.peers.is_empty() {
            return false;
        }
        let read = std::mem::take(&mut self.readable) && self.read(now);
        self.query(now) | read
    }

    fn peers_into(&self, peers: &mut BTreeMap<String, Announcement>) {
        for a in self.peers.iter().filter_map(|p| p.announcement.as_ref()) {
            peers.insert(a.node_id.clone(), a.clone());
        }
    }

    fn next_due(&self) -> Option<Instant> {
        if self.peers.is_empty() {
            return None;
        }
        Some(
            self.last_query
                .map_or_else(Instant::now, |t| t + self.every()),
        )
    }
}
