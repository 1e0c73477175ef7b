//! `discovery = etcd` (docs/discovery.md "etcd"): a site that runs etcd
//! keeps the nodes' announcements there instead of in a registry of
//! Milonga's own. Each node puts its announcement under
//! `milonga/<domain>/<node id>`, attached to a lease of its own that it
//! keeps alive (so a killed node's key goes when the lease ends: the lease
//! is the node's liveness), and watches the prefix for the others'.
//!
//! It speaks etcd's v3 JSON gateway (`/v3/kv/...`, `/v3/lease/...`,
//! `/v3/watch`) over plain HTTP with `ureq`: two threads per node, one
//! that writes (lease, announcement, keep-alive) and one that reads (a
//! range of the prefix, then a watch from the revision after it).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value as Json};

use crate::discovery::{Announcement, Source};
use crate::model::node::NodeCore;
use crate::util::lock;

/// Most nodes a view holds; more are dropped and counted in
/// `scout_nodes_dropped` (the counter of nodes a view had no room for).
const MAX_VIEW: usize = 20_000;
/// How long one watch request lasts before it is made again (from the
/// revision after the last seen): bounds how long a closed node's reader
/// lives on.
const WATCH_SPAN: Duration = Duration::from_secs(5);
/// Wait after a failed request before the next.
const RETRY: Duration = Duration::from_millis(500);
/// Keys a range request asks for at once: the prefix is read in pages,
/// the first of 32 (an answer of at most about 45 MiB with announcements
/// of up to 1 MiB, in base64), the next sized by the largest value seen
/// so far to about half of [`MAX_ANSWER`], up to 1,024 keys (20,000
/// nodes of a few KiB: 20 requests, not 625).
const PAGE: usize = 32;
const MAX_PAGE: usize = 1024;
/// The largest answer read (a page, or a line of a watch).
const MAX_ANSWER: u64 = 64 << 20;

/// Wakes the node thread (a change of the view is looked at at once).
pub(crate) type Wake = Box<dyn Fn() + Send + Sync>;

/// What the node thread and the two etcd threads share.
struct Shared {
    stop: AtomicBool,
    wake_node: Wake,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// The node's announcement and its version.
    announcement: Vec<u8>,
    version: u64,
    /// The others, by node id.
    view: BTreeMap<String, Announcement>,
    /// Grows with each change of `view`.
    generation: u64,
    /// The first range was read.
    loaded: bool,
    /// The announcement version in etcd, once one is.
    put: Option<u64>,
    /// The writer has revoked the lease and ended.
    done: bool,
    /// Grows each time the reader sees the node's own key gone from etcd
    /// or holding another value (an operator's delete, a restored
    /// snapshot, an overwrite): the writer puts it again.
    repairs: u64,
}

/// The node's side of `discovery = etcd`.
pub(crate) struct EtcdSource {
    shared: Arc<Shared>,
    seen: u64,
    /// No view taken before this ([`crate::discovery::pace`]).
    next_take: Instant,
    /// The view changed since it was last taken.
    pending: bool,
    view: Vec<Announcement>,
    version: u64,
}

/// HTTP to the first of `endpoints` that answers.
struct Client {
    agent: ureq::Agent,
    endpoints: Vec<String>,
    at: usize,
}

impl Client {
    /// A client whose every request ends within `per_call` (a member
    /// partitioned away or black-holed must not hold a thread longer).
    fn new(endpoints: &[String], per_call: Duration) -> Client {
        let config = ureq::Agent::config_builder()
            .timeout_connect(Some(per_call.min(Duration::from_secs(2))))
            .timeout_per_call(Some(per_call))
            .http_status_as_error(false)
            .build();
        Client {
            agent: config.into(),
            endpoints: endpoints
                .iter()
                .map(|e| e.trim_end_matches('/').to_owned())
                .collect(),
            at: 0,
        }
    }

    /// POSTs `body` to `path` of one endpoint after another until one
    /// answers; the response.
    fn send(
        &mut self,
        path: &str,
        body: &Json,
    ) -> Result<ureq::http::Response<ureq::Body>, String> {
        let bytes = body.to_string();
        let mut last = String::from("no etcd endpoint configured (etcd_endpoints)");
        for _ in 0..self.endpoints.len() {
            let url = format!("{}{path}", self.endpoints[self.at]);
            match self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(bytes.as_bytes())
            {
                Ok(r) if r.status().is_success() => return Ok(r),
                Ok(mut r) => {
                    let text = r.body_mut().read_to_string().unwrap_or_default();
                    let status = r.status();
                    last = format!("{url}: HTTP {status}: {text}");
                    // A member that cannot serve (no leader, overloaded):
                    // the next one is tried. A refusal of the request
                    // itself (4xx) would be the same everywhere.
                    if !status.is_server_error() {
                        return Err(last);
                    }
                    self.at = (self.at + 1) % self.endpoints.len();
                }
                Err(e) => {
                    last = format!("{url}: {e}");
                    self.at = (self.at + 1) % self.endpoints.len();
                }
            }
        }
        Err(last)
    }

    /// A JSON request and its JSON answer.
    fn call(&mut self, path: &str, body: &Json) -> Result<Json, String> {
        let mut r = self.send(path, body)?;
        let text = r
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_vec()
            .map_err(|e| format!("{path}: {e}"))?;
        serde_json::from_slice(&text).map_err(|e| format!("{path}: {e}"))
    }
}

/// An int64 of the gateway's JSON (a string) or a number.
fn int(v: &Json) -> Option<i64> {
    match v {
        Json::String(s) => s.parse().ok(),
        v => v.as_i64(),
    }
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// The end of the range of keys starting with `prefix` (its last byte
/// plus one).
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

impl EtcdSource {
    /// Starts the threads; the node's announcement comes with
    /// [`EtcdSource::first_view`].
    pub(crate) fn new(core: Arc<NodeCore>, wake_node: Wake) -> EtcdSource {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake_node,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let prefix = format!("milonga/{}/", core.domain);
        let me = core.id.to_hex();
        let ttl_s = (i64::from(core.cfg.heartbeat_timeout_ms) + 999) / 1000;
        // etcd refuses a lease much shorter than its election timeout.
        let ttl_s = ttl_s.max(2);
        {
            let (shared, endpoints, key) = (
                shared.clone(),
                core.cfg.etcd_endpoints.clone(),
                format!("{prefix}{me}"),
            );
            let spawned = std::thread::Builder::new()
                .name("milonga-etcd-writer".into())
                .spawn(move || write(&shared, &endpoints, &key, ttl_s));
            if let Err(e) = spawned {
                tracing::warn!(err = %e, "cannot start the etcd writer thread: this node is not in etcd");
            }
        }
        {
            let (shared, core) = (shared.clone(), core.clone());
            let spawned = std::thread::Builder::new()
                .name("milonga-etcd-watch".into())
                .spawn(move || watch(&shared, &core, &prefix, &me));
            if let Err(e) = spawned {
                tracing::warn!(err = %e, "cannot start the etcd watch thread: this node sees nobody in etcd");
            }
        }
        EtcdSource {
            shared,
            seen: 0,
            next_take: Instant::now(),
            pending: false,
            view: Vec::new(),
            version: 0,
        }
    }

    /// The node's announcement version it holds.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The node's announcement changed: put at once by the writer.
    pub(crate) fn set_announcement(&mut self, version: u64, json: Vec<u8>) {
        self.version = version;
        let mut s = lock(&self.shared.state);
        s.announcement = json;
        s.version = version;
        self.shared.wake.notify_all();
    }

    /// Sets the announcement and waits up to `wait` until it is in etcd and
    /// the first view is read, so that when `open` returns the node is
    /// found and finds the others (as with local discovery).
    pub(crate) fn first_view(&mut self, version: u64, json: Vec<u8>, wait: Duration) {
        self.set_announcement(version, json);
        let s = lock(&self.shared.state);
        let (s, timeout) = self
            .shared
            .wake
            .wait_timeout_while(s, wait, |s| !s.loaded || s.put != Some(version))
            .unwrap_or_else(|e| e.into_inner());
        drop(s);
        if timeout.timed_out() {
            tracing::warn!("etcd gave no view in time: the node starts without it");
        }
        self.next_take = Instant::now();
        self.turn(Instant::now());
    }

    /// Revokes the node's lease (its key goes at once) and stops the
    /// threads; waits up to a second for the revocation.
    pub(crate) fn leave(&self) {
        let s = self.stop();
        // (`stop` is set under the lock the writer waits with: the
        // notification cannot fall between its check and its wait.)
        let _ = self
            .shared
            .wake
            .wait_timeout_while(s, Duration::from_secs(1), |s| !s.done);
    }
}

impl EtcdSource {
    /// Sets `stop` under the state's lock and wakes the writer; the lock.
    fn stop(&self) -> std::sync::MutexGuard<'_, State> {
        let s = lock(&self.shared.state);
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
        s
    }
}

impl Drop for EtcdSource {
    fn drop(&mut self) {
        drop(self.stop());
    }
}

impl Source for EtcdSource {
    fn turn(&mut self, now: Instant) -> bool {
        let s = lock(&self.shared.state);
        if s.generation == self.seen {
            return false;
        }
        if now < self.next_take {
            self.pending = true;
            return false;
        }
        self.seen = s.generation;
        self.view = s.view.values().cloned().collect();
        self.next_take = now + crate::discovery::pace(self.view.len());
        self.pending = false;
        true
    }

    fn peers_into(&self, peers: &mut Vec<Announcement>) {
        peers.extend(self.view.iter().cloned());
    }

    fn next_due(&self) -> Option<Instant> {
        // The watcher wakes the node thread when the view changes; a
        // change held back by the pace is taken when it allows.
        self.pending.then_some(self.next_take)
    }
}

/// Counts a thread's failed requests and logs the first few of a run of
/// them, then every hundredth, and the end of the run.
struct Failures {
    count: u64,
}

impl Failures {
    fn new() -> Failures {
        Failures { count: 0 }
    }

    fn failed(&mut self, what: &str, e: &str) {
        self.count += 1;
        if self.count <= 3 || self.count % 100 == 0 {
            tracing::warn!(failures = self.count, err = %e, "etcd: {what} failed");
        }
    }

    fn worked(&mut self, what: &str) {
        if self.count > 0 {
            tracing::info!(failures = self.count, "etcd: {what} works again");
            self.count = 0;
        }
    }
}

/// The writer: a lease of `ttl_s` seconds, the announcement put under
/// `key` with it whenever it changes (or the reader finds it gone), the
/// lease kept alive every third of its time, before anything else (a put
/// that keeps failing, of an announcement etcd refuses, must not let the
/// lease, and the node's entry already there, end); at stop, the lease
/// revoked.
fn write(shared: &Shared, endpoints: &[String], key: &str, ttl_s: i64) {
    let keep_every = Duration::from_millis(ttl_s as u64 * 1000 / 3);
    // Grants, puts (of up to 1 MiB) and the revocation.
    let mut c = Client::new(endpoints, Duration::from_secs(5));
    // Keep-alives end well inside the lease: a member that does not
    // answer is left for the next in time.
    let mut keeper = Client::new(endpoints, (keep_every / 2).max(Duration::from_millis(250)));
    let mut lease: Option<i64> = None;
    // The announcement version put under the current lease.
    let mut put: Option<u64> = None;
    let mut repairs = 0;
    let mut next_keep = Instant::now();
    // A run of failures per request, ended by that request's success.
    let (mut grants, mut keeps, mut puts) = (Failures::new(), Failures::new(), Failures::new());
    while !shared.stop.load(Ordering::Relaxed) {
        let (announcement, version) = {
            let s = lock(&shared.state);
            if s.repairs != repairs {
                repairs = s.repairs;
                put = None;
            }
            (s.announcement.clone(), s.version)
        };
        let now = Instant::now();
        let mut wait = RETRY;
        match lease {
            None => match c.call("/v3/lease/grant", &json!({ "TTL": ttl_s })) {
                Ok(r) => match int(&r["ID"]) {
                    Some(id) => {
                        grants.worked("taking a lease");
                        lease = Some(id);
                        put = None;
                        next_keep = Instant::now() + keep_every;
                        continue;
                    }
                    None => grants.failed("a lease grant", &format!("no lease id in {r}")),
                },
                Err(e) => grants.failed("a lease grant", &e),
            },
            Some(id) if now >= next_keep => {
                match keeper.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() })) {
                    Ok(r) if int(&r["result"]["TTL"]).unwrap_or(0) > 0 => {
                        keeps.worked("keeping the lease alive");
                        next_keep = now + keep_every;
                    }
                    // Expired (the node was stopped, or etcd out of reach,
                    // longer than the lease): its key is gone; put again
                    // under a new one.
                    Ok(_) => {
                        limited!(warn, ttl_s, "etcd: this node's lease ended (the node was stopped, or etcd out of reach, longer than it): its entry is put again under a new one");
                        lease = None;
                    }
                    Err(e) => {
                        // Tried again after a pause, not at once.
                        next_keep = now + RETRY;
                        keeps.failed("a keep-alive", &e);
                    }
                }
                continue;
            }
            Some(id) if put != Some(version) && !announcement.is_empty() => {
                let body = json!({ "key": b64(key.as_bytes()), "value": b64(&announcement), "lease": id.to_string() });
                match c.call("/v3/kv/put", &body) {
                    Ok(_) => {
                        puts.worked("putting this node's announcement");
                        put = Some(version);
                        lock(&shared.state).put = put;
                        shared.wake.notify_all();
                        continue;
                    }
                    Err(e) => {
                        // The lease may have ended meanwhile: take another.
                        if e.contains("lease not found") {
                            lease = None;
                        }
                        puts.failed("a put", &e);
                        wait = RETRY.min(next_keep.saturating_duration_since(now));
                    }
                }
            }
            Some(_) => wait = next_keep - now,
        }
        let s = lock(&shared.state);
        let _ = shared.wake.wait_timeout_while(s, wait, |s| {
            s.version == version && s.repairs == repairs && !shared.stop.load(Ordering::Relaxed)
        });
    }
    if let Some(id) = lease {
        let _ = c.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }));
    }
    lock(&shared.state).done = true;
    shared.wake.notify_all();
}

/// Tells the writer to put the node's announcement again if `value` (its
/// key's value in etcd; `None`: deleted) is not the one it put.
fn check_own(shared: &Shared, value: Option<&[u8]>) {
    let mut s = lock(&shared.state);
    if s.put.is_some() && value != Some(&s.announcement[..]) {
        s.repairs += 1;
        shared.wake.notify_all();
    }
}

/// The whole prefix at one revision, in pages of [`PAGE`] keys: each key
/// and value given to `each`, and the revision. Stops early, `Ok(false)`
/// with it, once `each` says so.
fn read_all(
    c: &mut Client,
    prefix: &str,
    end: &[u8],
    mut each: impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<(i64, bool), String> {
    let mut from = prefix.as_bytes().to_vec();
    let mut at: Option<i64> = None;
    let (mut page, mut largest) = (PAGE, 0usize);
    loop {
        let mut body = json!({
            "key": b64(&from),
            "range_end": b64(end),
            "limit": page.to_string(),
        });
        if let Some(rev) = at {
            // The next pages at the first one's revision: one snapshot.
            body["revision"] = json!(rev.to_string());
        }
        let r = c.call("/v3/kv/range", &body)?;
        let rev = match at {
            Some(rev) => rev,
            None => int(&r["header"]["revision"])
                .ok_or_else(|| format!("no revision in the answer to a range: {}", r["header"]))?,
        };
        at = Some(rev);
        let kvs = r["kvs"].as_array().map(Vec::as_slice).unwrap_or_default();
        let mut last = None;
        for kv in kvs {
            let Some(k) = decoded(kv, "key") else {
                continue;
            };
            let v = decoded(kv, "value").unwrap_or_default();
            largest = largest.max(k.len() + v.len());
            if !each(&k, &v) {
                return Ok((rev, false));
            }
            last = Some(k);
        }
        // base64 makes 4 of 3 bytes; a few hundred more of JSON a key.
        let per_key = largest / 3 * 4 + 512;
        page = (MAX_ANSWER as usize / 2 / per_key).clamp(PAGE, MAX_PAGE);
        match last {
            // The next page starts just after this one's last key.
            Some(mut k) if r["more"].as_bool() == Some(true) => {
                k.push(0);
                from = k;
            }
            _ => return Ok((rev, true)),
        }
    }
}

/// A base64 field of a key-value of the gateway's JSON, decoded.
fn decoded(kv: &Json, field: &str) -> Option<Vec<u8>> {
    B64.decode(kv[field].as_str().unwrap_or_default()).ok()
}

/// The reader: the prefix's keys, then the changes from the revision
/// after, for as long as the node runs.
fn watch(shared: &Shared, core: &NodeCore, prefix: &str, me: &str) {
    let endpoints = &core.cfg.etcd_endpoints;
    let mut c = Client::new(endpoints, WATCH_SPAN);
    let (mut reads, mut watches) = (Failures::new(), Failures::new());
    // The revision the view is at; None: read the whole prefix.
    let mut at: Option<i64> = None;
    let end = range_end(prefix);
    let is_me = |k: &[u8]| {
        std::str::from_utf8(k)
            .ok()
            .and_then(|k| k.strip_prefix(prefix))
            == Some(me)
    };
    // What another node's key `k` and its value `v` (`None`: deleted) say
    // of the view: whether they changed it.
    let take = |view: &mut BTreeMap<String, Announcement>, k: &[u8], v: Option<&[u8]>| -> bool {
        let Some(id) = std::str::from_utf8(k)
            .ok()
            .and_then(|k| k.strip_prefix(prefix))
        else {
            crate::util::stats::inc(&core.counters.announcements_malformed);
            return false;
        };
        let Some(v) = v else {
            return view.remove(id).is_some();
        };
        // At most the size every discovery takes (unread past it).
        if v.len() as u64 > crate::discovery::MAX_ANNOUNCEMENT_BYTES {
            crate::util::stats::inc(&core.counters.announcements_malformed);
            return false;
        }
        match Announcement::from_json(v) {
            Ok(a) if a.node_id == id && a.domain == core.domain => {
                if view.len() >= MAX_VIEW && !view.contains_key(id) {
                    crate::util::stats::inc(&core.counters.scout_nodes_dropped);
                    return false;
                }
                view.insert(id.to_owned(), a);
                true
            }
            _ => {
                crate::util::stats::inc(&core.counters.announcements_malformed);
                false
            }
        }
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let Some(rev) = at else {
            let mut view = BTreeMap::new();
            let mut own = None;
            // Past twice the view's room, the rest is not read (counted in
            // `scout_nodes_dropped` as far as read).
            let mut keys = 0usize;
            let read = read_all(&mut c, prefix, &end, |k, v| {
                keys += 1;
                if is_me(k) {
                    own = Some(v.to_vec());
                } else {
                    take(&mut view, k, Some(v));
                }
                keys < 2 * MAX_VIEW
            });
            match read {
                Ok((rev, whole)) => {
                    reads.worked("reading the nodes");
                    if whole {
                        check_own(shared, own.as_deref());
                    }
                    at = Some(rev);
                    let mut s = lock(&shared.state);
                    s.view = view;
                    s.generation += 1;
                    s.loaded = true;
                    shared.wake.notify_all();
                    drop(s);
                    (shared.wake_node)();
                }
                Err(e) => {
                    reads.failed("reading the nodes", &e);
                    std::thread::sleep(RETRY);
                }
            }
            continue;
        };
        let body = json!({ "create_request": {
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&end),
            "start_revision": (rev + 1).to_string(),
        }});
        let started = Instant::now();
        let stream = match c.send("/v3/watch", &body) {
            Ok(r) => r,
            Err(e) => {
                watches.failed("watching the nodes", &e);
                std::thread::sleep(RETRY);
                at = None;
                continue;
            }
        };
        // One JSON message a line, until the span ends (an error here).
        let mut reader = BufReader::new(stream.into_body().into_reader());
        let mut line = Vec::new();
        loop {
            line.clear();
            match std::io::Read::take(&mut reader, MAX_ANSWER).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if !line.ends_with(b"\n") && line.len() as u64 >= MAX_ANSWER => {
                    // Too long to hold: what it said is read again whole.
                    watches.failed("watching the nodes", "an answer of more than 64 MiB");
                    at = None;
                    break;
                }
                Ok(_) => {}
            }
            let Ok(msg) = serde_json::from_slice::<Json>(&line) else {
                continue;
            };
            let r = &msg["result"];
            // A store behind the view (etcd restored from a snapshot, or
            // started again on empty data): a watch from a revision it has
            // not reached would say nothing until it did, missing every
            // change meanwhile; read it all again.
            let behind = int(&r["header"]["revision"]).is_some_and(|now| now < rev);
            if r["canceled"].as_bool() == Some(true)
                || int(&r["compact_revision"]).unwrap_or(0) > 0
                || behind
            {
                // Compacted past the view, or behind it: read it all again.
                if behind {
                    tracing::warn!(at = rev, "etcd is at an older revision than this view (restored?): reading the nodes again");
                }
                at = None;
                break;
            }
            watches.worked("watching the nodes");
            let mut events = Vec::new();
            for ev in r["events"].as_array().into_iter().flatten() {
                let kv = &ev["kv"];
                let Some(k) = decoded(kv, "key") else {
                    continue;
                };
                let deleted = ev["type"].as_str() == Some("DELETE");
                let v = (!deleted).then(|| decoded(kv, "value").unwrap_or_default());
                events.push((k, v));
                // The next watch starts after the last change applied.
                if let Some(rev) = int(&kv["mod_revision"]) {
                    at = Some(at.map_or(rev, |a| a.max(rev)));
                }
            }
            let mut own = None;
            let mut changed = false;
            let mut s = lock(&shared.state);
            for (k, v) in events {
                if is_me(&k) {
                    own = Some(v);
                } else {
                    changed |= take(&mut s.view, &k, v.as_deref());
                }
            }
            if changed {
                s.generation += 1;
            }
            drop(s);
            if let Some(v) = own {
                check_own(shared, v.as_deref());
            }
            if changed {
                (shared.wake_node)();
            }
            if shared.stop.load(Ordering::Relaxed) {
                return;
            }
        }
        // A watch that ended at once (a proxy that closes it) is not made
        // again in a busy loop.
        if started.elapsed() < RETRY {
            std::thread::sleep(RETRY);
        }
    }
}
