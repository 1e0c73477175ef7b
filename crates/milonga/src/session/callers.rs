//! A node's call routes: the servers discovery knows for each service
//! key, with the connections of calls that ended, kept for the next. The
//! calling itself is `api::call`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use milonga_wire::{Key, KeyExpr, NodeId};

use crate::backend::p2p::call_link::CallLink;
use crate::discovery::Announcement;
use crate::util::lock;

/// Idle connections kept per server; more are closed after use.
const MAX_IDLE: usize = 64;

/// One server of one service, as discovery announced it.
pub(crate) struct Target {
    /// Checked when discovery brought it: a bad key in an announcement is
    /// skipped, never called.
    pub(crate) key: Key,
    pub(crate) endpoint: String,
    pub(crate) node: NodeId,
    pub(crate) server: String,
    pub(crate) max_request_bytes: usize,
    /// Calls in flight from this node.
    outstanding: AtomicUsize,
    /// Connections whose call ended, for the next calls.
    idle: Mutex<Vec<CallLink>>,
}

impl Target {
    /// A connection left by an earlier call, if any.
    pub(crate) fn idle_channel(&self) -> Option<CallLink> {
        lock(&self.idle).pop()
    }

    /// A call to this server started.
    pub(crate) fn started(&self) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
    }

    /// A call to this server ended; its connection, if still up, serves
    /// the next (up to [`MAX_IDLE`] are kept).
    pub(crate) fn finished(&self, channel: Option<CallLink>) {
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        if let Some(ch) = channel {
            let mut idle = lock(&self.idle);
            if idle.len() < MAX_IDLE {
                idle.push(ch);
            }
        }
    }
}

/// Every node's calling state.
#[derive(Default)]
pub(crate) struct Callers {
    /// Service key -> its servers, rebuilt when discovery changes.
    routes: RwLock<HashMap<String, Arc<[Arc<Target>]>>>,
    next_call: AtomicU64,
    next_channel: AtomicU64,
    round_robin: AtomicUsize,
}

impl Callers {
    /// A number for the next call, unique in this node.
    pub(crate) fn next_call_id(&self) -> u64 {
        self.next_call.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A number for the next connection.
    pub(crate) fn next_channel(&self) -> u64 {
        self.next_channel.fetch_add(1, Ordering::Relaxed)
    }

    /// Rebuilds the routes from the peers' announcements, keeping the
    /// connections of servers that are still there.
    pub(crate) fn update(&self, peers: &[&Announcement]) {
        let me = std::process::id();
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let mut old: HashMap<String, Arc<Target>> = routes
            .drain()
            .flat_map(|(_, ts)| ts.iter().cloned().collect::<Vec<_>>())
            .map(|t| (t.endpoint.clone(), t))
            .collect();
        let mut by_key: HashMap<String, Vec<Arc<Target>>> = HashMap::new();
        for a in peers {
            let Some(node) = a.id() else { continue };
            for s in &a.services {
                if s.endpoint.starts_with("inproc://") && a.pid != me {
                    continue;
                }
                let key = match Key::new(&s.key) {
                    Ok(k) => k,
                    Err(err) => {
                        limited!(warn, peer = %a.name, key = %s.key, %err, "ignoring a service with a bad key");
                        continue;
                    }
                };
                let t = match old.remove(&s.endpoint) {
                    Some(t) if t.key == key && t.node == node => t,
                    _ => Arc::new(Target {
                        key: key.clone(),
                        endpoint: s.endpoint.clone(),
                        node,
                        server: a.name.clone(),
                        max_request_bytes: s.max_request_bytes,
                        outstanding: AtomicUsize::new(0),
                        idle: Mutex::new(Vec::new()),
                    }),
                };
                by_key.entry(key.as_str().to_owned()).or_default().push(t);
            }
        }
        *routes = by_key.into_iter().map(|(k, v)| (k, v.into())).collect();
    }

    pub(crate) fn servers_of(&self, key: &str) -> Option<Arc<[Arc<Target>]>> {
        self.routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    pub(crate) fn servers_matching(&self, expr: &KeyExpr) -> Vec<Arc<Target>> {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<Arc<Target>> = routes
            .iter()
            .filter(|(k, _)| expr.matches(k))
            .flat_map(|(_, ts)| ts.iter().cloned())
            .collect();
        out.sort_by(|a, b| (&a.key, &a.server).cmp(&(&b.key, &b.server)));
        out
    }

    /// The server with the fewest calls in flight from this node.
    pub(crate) fn choose(&self, servers: &[Arc<Target>]) -> Arc<Target> {
        let start = self.round_robin.fetch_add(1, Ordering::Relaxed);
        let n = servers.len();
        (0..n)
            .map(|i| &servers[(start + i) % n])
            .min_by_key(|t| t.outstanding.load(Ordering::Relaxed))
            .expect("at least one server")
            .clone()
    }
}
