//! One node's state, shared by its handle, publishers, subscribers,
//! services and thread: who it is, its configuration and counters, what it
//! declared, the peers discovery shows, and the backend's resources. Who
//! may touch what, and the lock order: docs/internals.md.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use milonga_wire::NodeId;

use crate::api::subscriber::SubShared;
use crate::backend::p2p::data::DataSocket;
use crate::backend::p2p::ContextRef;
use crate::backend::p2p::NodeWaker;
use crate::discovery::{Announcement, LocalDir, PublicationInfo};
use crate::model::config::{Config, Transport};
use crate::model::error::OpenError;
use crate::model::qos::Reliability;
use crate::util::lock;
use crate::util::stats::Counters;

#[derive(Default)]
pub(crate) struct NodeState {
    /// Declared publications: key -> (reliability, history depth).
    pub publications: BTreeMap<String, (Reliability, usize)>,
    /// Services served, by key.
    pub services: BTreeMap<String, crate::api::service::ServiceInfo>,
    pub data_best_effort: Option<Arc<DataSocket>>,
    pub data_reliable: Option<Arc<DataSocket>>,
    pub subs: Vec<Weak<SubShared>>,
    /// Live peers by node id (hex), this node included.
    pub peers: BTreeMap<String, Announcement>,
    pub announce_dirty: bool,
    /// Last sequence number of keys whose publisher was dropped.
    pub last_seq: HashMap<String, u64>,
    /// The sequence counters of the live publishers, by key: a goodbye
    /// tells subscribers the last sequence number of each key.
    pub pub_seqs: HashMap<String, Arc<AtomicU64>>,
    /// Monitors of data sockets created since the node thread last looked.
    pub new_monitors: Vec<crate::backend::p2p::control::NodeMonitor>,
    /// Monitors of subscriptions declared since the node thread last
    /// looked: it watches them and tells each subscription of closed
    /// connections.
    pub new_sub_monitors: Vec<(Weak<SubShared>, crate::backend::p2p::sub_link::Monitor)>,
    /// Monitors of services started since the node thread last looked.
    pub new_svc_monitors: Vec<crate::backend::p2p::control::SvcMonitor>,
}

/// Shared by the node handle, its publishers, subscribers and its thread.
pub(crate) struct NodeInner {
    pub id: NodeId,
    pub name: String,
    pub domain: String,
    pub domain_tag: u32,
    pub cfg: Config,
    pub counters: Arc<Counters>,
    pub closed: AtomicBool,
    /// A reliable publisher left a batch for the node thread to send.
    pub batch_pending: AtomicBool,
    pub state: Mutex<NodeState>,
    pub local: Option<Mutex<LocalDir>>,
    pub control_endpoint: String,
    /// Where the node thread publishes heartbeats.
    pub liveliness_endpoint: String,
    pub host: String,
    pub start_time: u64,
    pub(crate) next_sub_id: AtomicU64,
    pub(crate) next_service_id: AtomicU64,
    /// Calls: the servers discovery knows, and their connections.
    pub callers: crate::api::call::Callers,
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    /// Wakes the node thread (see [`NodeInner::wake`]).
    pub waker: NodeWaker,
    // Declared last: sockets above are closed before the context goes.
    pub ctx: ContextRef,
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned())
}

impl NodeInner {
    /// A number for the next service's endpoint.
    pub(crate) fn next_service_id(&self) -> u64 {
        self.next_service_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Removes the service of `key` at `endpoint` from the announcement
    /// (its handle was dropped).
    pub(crate) fn withdraw_service(&self, key: &str, endpoint: &str) {
        let removed = {
            let mut st = lock(&self.state);
            let mine = st.services.get(key).is_some_and(|s| s.endpoint == endpoint);
            mine && st.services.remove(key).is_some()
        };
        if removed {
            self.announce();
        }
    }

    /// This node as the engine sees it.
    pub(crate) fn me(&self) -> crate::engine::Me<'_> {
        crate::engine::Me {
            id: self.id,
            domain_tag: self.domain_tag,
            max_message_bytes: self.cfg.max_message_bytes,
            counters: &self.counters,
        }
    }

    /// Wakes the node thread now rather than at its next turn: a batch
    /// started waiting.
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// The endpoint to bind for a new socket of role `role` (`c`, `be`, `r`).
    pub(crate) fn endpoint_for(&self, role: &str, fixed: Option<&String>) -> String {
        if let Some(e) = fixed {
            return e.clone();
        }
        let short = &self.id.to_hex()[..12];
        match self.cfg.transport {
            Transport::Tcp => format!("tcp://{}:*", self.cfg.tcp_host),
            Transport::Ipc => {
                let dir = self.cfg.runtime_root().join(&self.domain);
                format!("ipc://{}/{short}-{role}.sock", dir.display())
            }
            Transport::Inproc => format!("inproc://milonga-{}-{role}", self.id.to_hex()),
        }
    }

    /// The data socket for `reliability`, created on first use.
    pub(crate) fn data_socket(
        &self,
        reliability: Reliability,
    ) -> Result<Arc<DataSocket>, OpenError> {
        let mut st = lock(&self.state);
        let existing = match reliability {
            Reliability::BestEffort => &st.data_best_effort,
            Reliability::Reliable => &st.data_reliable,
        };
        if let Some(d) = existing {
            return Ok(d.clone());
        }
        let (d, monitor) = DataSocket::open(self, reliability)?;
        st.new_monitors.push(monitor);
        // From now on the node thread reads this socket every turn.
        self.wake();
        let d = Arc::new(d);
        match reliability {
            Reliability::BestEffort => st.data_best_effort = Some(d.clone()),
            Reliability::Reliable => st.data_reliable = Some(d.clone()),
        }
        st.announce_dirty = true;
        Ok(d)
    }

    pub(crate) fn announcement(&self, st: &NodeState) -> Announcement {
        Announcement {
            protocol: milonga_wire::frame::PROTOCOL_VERSION,
            domain: self.domain.clone(),
            node_id: self.id.to_hex(),
            name: self.name.clone(),
            host: self.host.clone(),
            pid: std::process::id(),
            start_time: self.start_time,
            control: self.control_endpoint.clone(),
            data_best_effort: st.data_best_effort.as_ref().map(|d| d.endpoint.clone()),
            data_reliable: st.data_reliable.as_ref().map(|d| d.endpoint.clone()),
            liveliness: Some(self.liveliness_endpoint.clone()),
            publications: st
                .publications
                .iter()
                .map(|(k, (r, h))| PublicationInfo {
                    key: k.clone(),
                    reliability: *r,
                    history: *h,
                })
                .collect(),
            services: st.services.values().cloned().collect(),
        }
    }

    /// Publishes the current announcement: in the local directory, and in
    /// the peer table so that this node's own subscriptions see it.
    ///
    /// The directory lock is held from building to writing (lock order:
    /// directory, then state), so that two concurrent announcements cannot
    /// write an older one last, and none is written after `close`.
    pub(crate) fn announce(&self) {
        let dir = self.local.as_ref().map(lock);
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let a = {
            let mut st = lock(&self.state);
            st.announce_dirty = false;
            let a = self.announcement(&st);
            st.peers.insert(a.node_id.clone(), a.clone());
            a
        };
        if let Some(dir) = dir {
            if let Err(err) = dir.write(&a) {
                tracing::warn!(%err, "cannot write the local announcement");
            }
        }
        self.reconcile();
    }

    /// Connects every subscription to the data endpoints of the peers that
    /// publish keys it matches, and disconnects it from the others.
    ///
    /// Runs with the state lock held, so that a caller with an older view of
    /// the peers cannot overwrite a newer one (lock order: state, then a
    /// subscription's target; the subscription socket is only try-locked).
    pub(crate) fn reconcile(&self) {
        let mut st = lock(&self.state);
        st.subs.retain(|w| w.strong_count() > 0);
        let subs: Vec<_> = st.subs.iter().filter_map(Weak::upgrade).collect();
        self.callers.update(&st.peers.values().collect::<Vec<_>>());
        for s in subs {
            self.connect_subscription(&st, &s);
        }
    }

    /// Points one subscription at the data and liveliness endpoints of the
    /// peers in `st` that publish keys it matches.
    pub(crate) fn connect_subscription(&self, st: &NodeState, s: &SubShared) {
        let peers: Vec<&Announcement> = st.peers.values().collect();
        s.set_routes(crate::engine::routes::routes_for(s.expr(), &peers));
    }
}

pub(crate) fn close(inner: &Arc<NodeInner>) {
    if inner.closed.swap(true, Ordering::AcqRel) {
        return;
    }
    inner.wake();
    if let Some(th) = lock(&inner.thread).take() {
        let _ = th.join();
    }
    // A batch still waiting gets the linger time to leave.
    let reliable = lock(&inner.state).data_reliable.clone();
    if let Some(d) = reliable {
        lock(&d.sock).flush_at_close(inner.cfg.close_linger_ms, &inner.counters);
    }
    let subs: Vec<_> = {
        let mut st = lock(&inner.state);
        st.publications.clear();
        std::mem::take(&mut st.subs)
    };
    for s in subs.iter().filter_map(Weak::upgrade) {
        s.wake();
    }
    if let Some(dir) = &inner.local {
        let mut dir = lock(dir);
        let a = inner.announcement(&lock(&inner.state));
        crate::discovery::remove_ipc_files(&a, &dir.dir, true);
        dir.remove(&inner.id.to_hex());
    }
    tracing::debug!(node = %inner.name, "node closed");
}
