//! The local source: the announcements in this host's domain directory
//! ([`LocalDir`]), re-read when the directory changes, with the peers'
//! processes checked often enough to catch a node killed with -9.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Announcement, LocalDir, Source};
use crate::model::node::NodeCore;
use crate::util::lock;
use crate::util::stats;

/// How often the known peers' processes are checked (one `poll` of their
/// pidfds, or a `kill(pid, 0)` each where there are none).
const ALIVE_EVERY: Duration = Duration::from_millis(250);
/// How often the directory is re-read though nothing said it changed (a
/// recycled pid is told by its start time).
const FULL_EVERY: Duration = Duration::from_secs(5);

/// The peers of the domain directory, as of the last scan.
pub(crate) struct LocalSource {
    node: Arc<NodeCore>,
    /// Shared with the session, which writes this node's announcement.
    dir: Arc<Mutex<LocalDir>>,
    /// The peers found, this node and other domains' aside.
    found: BTreeMap<String, Announcement>,
    last_scan: Option<Instant>,
    last_alive_check: Option<Instant>,
    /// The peers' processes, to see one end (a zombie included).
    pidfds: crate::util::sys::Pidfds,
}

impl LocalSource {
    pub(crate) fn new(node: Arc<NodeCore>, dir: Arc<Mutex<LocalDir>>) -> LocalSource {
        LocalSource {
            node,
            dir,
            found: BTreeMap::new(),
            last_scan: None,
            last_alive_check: None,
            pidfds: crate::util::sys::Pidfds::default(),
        }
    }

    /// The directory's inotify descriptor, if any: readable when a file
    /// changed.
    pub(crate) fn watch_fd(&self) -> Option<std::os::fd::RawFd> {
        lock(&self.dir).watch.as_ref().map(super::Watch::fd)
    }
}

impl Source for LocalSource {
    /// Re-reads the directory when it changed; every [`ALIVE_EVERY`],
    /// checks that the known peers' processes exist and re-reads if one is
    /// gone; every [`FULL_EVERY`], re-reads anyway. Re-reading every file
    /// on a timer would cost each node O(nodes) parses, the whole host
    /// O(nodes^2).
    fn turn(&mut self, now: Instant) -> bool {
        let first = self.last_scan.is_none();
        let full_due = self.last_scan.is_none_or(|t| now - t >= FULL_EVERY);
        let alive_due = self.last_alive_check.is_none_or(|t| now - t >= ALIVE_EVERY);
        let mut dir = lock(&self.dir);
        if full_due {
            dir.mark_all_dirty();
        }
        if !full_due && !dir.changed() {
            drop(dir);
            let ended = if alive_due {
                self.last_alive_check = Some(now);
                let pids: Vec<u32> = self.found.values().map(|a| a.pid).collect();
                self.pidfds.ended(&pids)
            } else {
                Vec::new()
            };
            if ended.is_empty() {
                return false;
            }
            dir = lock(&self.dir);
            dir.recheck_processes(ended);
        }
        self.last_scan = Some(now);
        self.last_alive_check = Some(now);
        let mut bad = 0;
        let found = dir.scan(&mut bad);
        drop(dir);
        let c = &self.node.counters;
        stats::add(&c.announcements_malformed, bad);
        let me = self.node.id.to_hex();
        let found: BTreeMap<String, Announcement> = found
            .into_iter()
            .filter(|(_, a)| {
                if a.node_id == me {
                    return false;
                }
                if a.domain != self.node.domain {
                    stats::inc(&c.peers_foreign_domain);
                    return false;
                }
                true
            })
            .collect();
        if found != self.found || first {
            self.found = found;
            return true;
        }
        false
    }

    fn peers_into(&self, peers: &mut Vec<Announcement>) {
        peers.extend(self.found.values().cloned());
    }

    fn next_due(&self) -> Option<Instant> {
        Some(
            self.last_alive_check
                .map_or_else(Instant::now, |t| t + ALIVE_EVERY),
        )
    }
}
