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
    /// The last full scan (every file read, every process checked):
    /// every [`FULL_EVERY`], however often the directory changes.
    last_full: Option<Instant>,
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
            last_full: None,
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
        let full_due = self.last_full.is_none_or(|t| now - t >= FULL_EVERY);
        let alive_due = self.last_alive_check.is_none_or(|t| now - t >= ALIVE_EVERY);
        // The known peers' processes, every ALIVE_EVERY whatever else the
        // directory does (a scan of changed files does not look at the
        // processes of the others).
        let ended = if alive_due && !full_due {
            self.last_alive_check = Some(now);
            let pids: Vec<u32> = self.found.values().map(|a| a.pid).collect();
            self.pidfds.ended(&pids)
        } else {
            Vec::new()
        };
        let mut dir = lock(&self.dir);
        if full_due {
            // Checks every process: the next poll is an interval away.
            dir.mark_all_dirty();
            self.last_alive_check = Some(now);
            self.last_full = Some(now);
        } else if ended.is_empty() && !dir.changed() {
            return false;
        }
        dir.recheck_processes(ended);
        self.last_scan = Some(now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::process_start_time;
    use crate::discovery::tests::{announcement, temp_dir};

    /// A peer killed with -9 while other nodes keep rewriting their
    /// announcements is seen gone within a poll interval or two, not at
    /// the next full scan: a scan of the files that changed does not look
    /// at the others' processes, the poll of their pidfds does.
    #[test]
    fn a_killed_peer_is_seen_gone_while_the_directory_keeps_changing() {
        let root = temp_dir("churn");
        let dir = Arc::new(Mutex::new(LocalDir::open(&root, "d", false).unwrap()));
        let cfg = crate::Config::new("milonga:///d", "me");
        let me = Arc::new(NodeCore::new(
            milonga_wire::NodeId([1; 16]),
            "me".into(),
            "d".into(),
            cfg,
        ));
        let mut source = LocalSource::new(me, dir.clone());
        /// The peer's process, killed and reaped however the test ends.
        struct Peer(std::process::Child);
        impl Drop for Peer {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Peer(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        let peer = announcement(
            &"ab".repeat(16),
            pid,
            process_start_time(pid).unwrap(),
            "tcp://127.0.0.1:9",
        );
        lock(&dir).write(&peer).unwrap();
        let t0 = Instant::now();
        assert!(source.turn(t0));
        let mut peers = Vec::new();
        source.peers_into(&mut peers);
        assert_eq!(peers.len(), 1);
        crate::util::sys::testing::kill(pid, libc::SIGKILL);
        // Not reaped: a zombie, which only the pidfd (or /proc) tells.
        // Turns 50 ms apart (on the clock passed in), each after another
        // node rewrote its announcement.
        let me_pid = std::process::id();
        let mut gone_at = None;
        for i in 1..=100u32 {
            let mut other = announcement(&"cd".repeat(16), me_pid, 0, "tcp://127.0.0.1:9");
            other.name = format!("rewrite-{i}");
            lock(&dir).write(&other).unwrap();
            // The kernel's own time to make the pidfd readable.
            std::thread::sleep(Duration::from_millis(5));
            let _ = source.turn(t0 + Duration::from_millis(50) * i);
            peers.clear();
            source.peers_into(&mut peers);
            if !peers.iter().any(|a| a.pid == pid) {
                gone_at = Some(Duration::from_millis(50) * i);
                break;
            }
        }
        drop(child);
        let gone_at = gone_at.expect("the killed peer was never seen gone");
        assert!(
            gone_at <= ALIVE_EVERY * 2,
            "seen gone {gone_at:?} after the kill, not within two polls"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
