//! Discovery: how nodes learn of each other.
//!
//! Every node has an [`Announcement`]: its identity, endpoints and
//! publications. Two backends deliver announcements:
//!
//! - `local`: each node writes its announcement as a JSON file
//!   `<runtime dir>/<domain>/<node id>.json` (atomically: write, then
//!   rename). Peers notice the directory's modification time change and
//!   re-read it. A file whose process is gone (by pid and process start
//!   time, so a recycled pid does not fool it) is stale and removed by
//!   whoever finds it; so a node killed with -9 leaves nothing that misleads.
//! - `static`: the node asks each configured control endpoint for its
//!   announcement (see docs/protocol.md, control messages) and forgets a
//!   peer that stops answering.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use milonga_wire::NodeId;
use serde::{Deserialize, Serialize};

use crate::qos::Reliability;

/// One publication in an announcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicationInfo {
    /// The published key.
    pub key: String,
    /// The publisher's reliability.
    pub reliability: Reliability,
    /// Samples it keeps per key for late joiners and repair.
    #[serde(default)]
    pub history: usize,
}

/// What a node tells its domain about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announcement {
    /// Protocol version (1).
    pub protocol: u8,
    /// The domain.
    pub domain: String,
    /// The node id, 32 hex digits.
    pub node_id: String,
    /// Readable name, `name@host:pid`.
    pub name: String,
    /// Host name.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Process start time (clock ticks after boot, from /proc), to tell a
    /// recycled pid from the node's process.
    pub start_time: u64,
    /// The control endpoint (ROUTER).
    pub control: String,
    /// Data endpoint of best-effort publications, once one exists.
    pub data_best_effort: Option<String>,
    /// Data endpoint of reliable publications, once one exists.
    pub data_reliable: Option<String>,
    /// Liveliness endpoint: the node's heartbeats (XPUB, key `@hb`).
    #[serde(default)]
    pub liveliness: Option<String>,
    /// Publications.
    pub publications: Vec<PublicationInfo>,
    /// Services.
    #[serde(default)]
    pub services: Vec<crate::service::ServiceInfo>,
}

impl Announcement {
    /// The node id, if well formed.
    pub fn id(&self) -> Option<NodeId> {
        NodeId::from_hex(&self.node_id)
    }

    /// The data endpoint serving publications of `reliability`.
    pub fn data_endpoint(&self, reliability: Reliability) -> Option<&str> {
        match reliability {
            Reliability::BestEffort => self.data_best_effort.as_deref(),
            Reliability::Reliable => self.data_reliable.as_deref(),
        }
    }
}

/// The start time of process `pid` (field 22 of /proc/pid/stat), or None
/// if there is no such process.
pub(crate) fn process_start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: skip past
    // the last ')'.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    // A zombie (killed, not yet reaped by its parent) runs no more.
    if matches!(fields.next()?, "Z" | "X" | "x") {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Whether a process `pid` exists (it may be another process that got a
/// recycled pid: [`is_alive`] tells them apart).
pub(crate) fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists and
    // may be signalled; it has no memory preconditions.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether the process that wrote `a` still runs. Without /proc there is no
/// telling, and a node is then taken to be alive.
pub(crate) fn is_alive(a: &Announcement) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    match process_start_time(a.pid) {
        Some(t) => t == a.start_time,
        None => false,
    }
}

/// An inotify watch on a domain directory, so that the node thread learns
/// of a written, renamed or removed announcement at once and need not look
/// at the directory on a timer.
#[derive(Debug)]
pub(crate) struct Watch(std::os::fd::OwnedFd);

impl Watch {
    /// A watch on `dir`, or `None` where inotify is not available (the
    /// directory's modification time is then compared on every turn).
    fn new(dir: &Path) -> Option<Watch> {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: inotify_init1 has no memory preconditions; a non-negative
        // result is a new descriptor, owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is fresh and owned by nobody else.
        let w = Watch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let mask = libc::IN_MOVED_TO | libc::IN_MOVED_FROM | libc::IN_DELETE | libc::IN_CLOSE_WRITE;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(w.fd(), path.as_ptr(), mask) };
        (wd >= 0).then_some(w)
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    /// Reads the pending events; whether there were any.
    fn drain(&self) -> bool {
        let mut buf = [0u8; 4096];
        let mut any = false;
        loop {
            // SAFETY: reads at most `buf.len()` bytes into `buf`; the
            // descriptor is non-blocking.
            let n = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return any;
            }
            any = true;
        }
    }
}

/// The local discovery directory of one domain.
#[derive(Debug)]
pub(crate) struct LocalDir {
    pub dir: PathBuf,
    last_mtime: Option<SystemTime>,
    /// Set up before the first scan, so that no change goes unseen.
    pub watch: Option<Watch>,
}

impl LocalDir {
    /// Opens (creating, mode 0700) `<root>/<domain>`. When `root` is the
    /// default shared location (`private_root`), it must belong to this user
    /// and be closed to others: otherwise another user could plant
    /// announcements.
    pub(crate) fn open(root: &Path, domain: &str, private_root: bool) -> io::Result<LocalDir> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let mut b = fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        b.create(root)?;
        if private_root {
            let m = fs::metadata(root)?;
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            if m.uid() != uid || m.mode() & 0o077 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} must belong to uid {uid} with mode 0700 (it has uid {} and mode {:o})",
                        root.display(),
                        m.uid(),
                        m.mode() & 0o777
                    ),
                ));
            }
        }
        let dir = root.join(domain);
        b.create(&dir)?;
        Ok(LocalDir {
            watch: Watch::new(&dir),
            dir,
            last_mtime: None,
        })
    }

    fn file_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes (or replaces) this node's announcement atomically.
    pub(crate) fn write(&self, a: &Announcement) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{}.tmp", a.node_id));
        fs::write(
            &tmp,
            serde_json::to_vec_pretty(a).map_err(io::Error::other)?,
        )?;
        fs::rename(&tmp, self.file_of(&a.node_id))
    }

    /// Removes this node's announcement.
    pub(crate) fn remove(&self, id: &str) {
        let _ = fs::remove_file(self.file_of(id));
    }

    /// Whether the directory changed since the last [`LocalDir::scan`].
    pub(crate) fn changed(&self) -> bool {
        if let Some(w) = &self.watch {
            return w.drain();
        }
        let m = fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        m.is_none() || m != self.last_mtime
    }

    /// Reads every live announcement; removes stale ones (and their ipc
    /// socket files). Unreadable files are skipped and counted.
    pub(crate) fn scan(&mut self, bad_files: &mut u64) -> BTreeMap<String, Announcement> {
        self.last_mtime = fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        let mut out = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return out;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let Ok(text) = fs::read(&path) else { continue };
            match serde_json::from_slice::<Announcement>(&text) {
                Ok(a) if is_alive(&a) => {
                    out.insert(a.node_id.clone(), a);
                }
                Ok(a) => {
                    tracing::info!(node = %a.name, "removing the announcement of a node that is gone");
                    remove_ipc_files(&a, &self.dir);
                    let _ = fs::remove_file(&path);
                }
                Err(err) => {
                    *bad_files += 1;
                    tracing::warn!(file = %path.display(), %err, "ignoring an unreadable announcement");
                }
            }
        }
        out
    }
}

/// Deletes the socket files of a dead node's ipc endpoints, only those
/// inside `within` (the domain directory, where Milonga puts them).
pub(crate) fn remove_ipc_files(a: &Announcement, within: &Path) {
    for ep in [&a.data_best_effort, &a.data_reliable, &a.liveliness]
        .into_iter()
        .flatten()
        .chain(std::iter::once(&a.control))
        .chain(a.services.iter().map(|s| &s.endpoint))
    {
        if let Some(path) = ep.strip_prefix("ipc://").map(Path::new) {
            if path.parent() == Some(within) {
                let _ = fs::remove_file(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_a_recycled_pid_is_not() {
        let pid = std::process::id();
        let t = process_start_time(pid).expect("own /proc entry");
        let mut a = Announcement {
            protocol: 1,
            domain: "d".into(),
            node_id: "00".repeat(16),
            name: "n".into(),
            host: "h".into(),
            pid,
            start_time: t,
            control: "inproc://x".into(),
            data_best_effort: None,
            data_reliable: None,
            liveliness: None,
            publications: vec![],
            services: vec![],
        };
        assert!(is_alive(&a));
        a.start_time += 1;
        assert!(!is_alive(&a), "same pid, other start time: another process");
        a.pid = u32::MAX - 1;
        assert!(!is_alive(&a));
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();
        assert!(process_start_time(pid).is_some());
        // SAFETY: signals our own child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        // Not reaped yet: a zombie until `wait`.
        let start = std::time::Instant::now();
        while process_start_time(pid).is_some() {
            assert!(start.elapsed().as_secs() < 5, "the child never died");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(pid_exists(pid), "a zombie still has its pid");
        child.wait().expect("reap");
    }
}
