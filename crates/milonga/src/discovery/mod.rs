//! Discovery: how nodes learn of each other.
//!
//! Every node has an [`Announcement`]: its identity, endpoints and
//! publications. A [`Source`] delivers the announcements of the peers it
//! sees; the node thread merges those of every source. Two exist:
//!
//! - `local` ([`local::LocalSource`]): each node writes its announcement as a JSON file
//!   `<runtime dir>/<domain>/<node id>.json` (atomically: write, then
//!   rename). Peers notice the directory's modification time change and
//!   re-read it. A file whose process is gone (by pid and process start
//!   time, so a recycled pid does not fool it) is stale and removed by
//!   whoever finds it; so a node killed with -9 leaves nothing that misleads.
//! - `static`: the node asks each configured control endpoint for its
//!   announcement (see docs/protocol.md, control messages) and forgets a
//!   peer that stops answering. It speaks the peer-to-peer control
//!   protocol, so it lives in that backend (`backend::p2p::static_peers`).
//! - `scout`: the node multicasts a hello (its id, control endpoint and
//!   announcement version) on its network and hears the others'
//!   ([`scout::Scout`]); a node heard is asked for its announcement over
//!   the control protocol (`backend::p2p::scout_peers`).
//! - `etcd` ([`etcd::EtcdSource`], `discovery = etcd`): announcements kept
//!   in etcd under a lease per node, watched.
//! - `registry` (`registry = tcp://...`): a broker's table of the domain's
//!   nodes (`backend::p2p::registry`).

pub(crate) mod etcd;
pub(crate) mod interfaces;
pub(crate) mod local;
pub(crate) mod scout;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

pub use milonga_wire::announce::{Announcement, PublicationInfo};

/// Least time between two views a registry gives a node while changes
/// come (a registry's pages to it, etcd's view taken by it), unless the
/// last left changes that were already there (a view being filled): one
/// millisecond per node of the domain, from 100 ms to 1 s. Each view costs
/// a node a merge of its whole peer table, so a node's cost of following
/// changes stays about the same whatever the size of the domain: a
/// thousand nodes joining cost each node at most one view a second, not a
/// thousand, and a change reaches every node within the pace and a round
/// trip.
pub(crate) fn pace(nodes: usize) -> std::time::Duration {
    std::time::Duration::from_millis(nodes.clamp(100, 1000) as u64)
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
    crate::util::sys::pid_exists(pid)
}

/// Whether the process that wrote `a` still runs. Without /proc there is no
/// telling, and a node is then taken to be alive. A `start_time` of 0 means
/// "not known" (docs/protocol.md §3): the pid alone decides.
pub(crate) fn is_alive(a: &Announcement) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    if a.start_time == 0 {
        return pid_exists(a.pid);
    }
    match process_start_time(a.pid) {
        Some(t) => t == a.start_time,
        None => false,
    }
}

/// Host (an IPv6 one in its brackets) and port of a `tcp://HOST:PORT`
/// endpoint.
pub(crate) fn tcp_host_port(endpoint: &str) -> Option<(&str, &str)> {
    endpoint.strip_prefix("tcp://")?.rsplit_once(':')
}

/// The IP address `host` names (brackets allowed), an IPv4-mapped IPv6
/// one as IPv4 (transport sockets with IPv6 on name IPv4 peers so); `None`
/// for a name, which is never resolved.
pub(crate) fn ip_of(host: &str) -> Option<std::net::IpAddr> {
    let ip: std::net::IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    Some(match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
        v4 => v4,
    })
}

/// `a` as seen by a node that reached it at `reached`, the endpoint of its
/// control socket that answered or that its hello named: when that is
/// its announced control port at another address, every tcp endpoint at
/// the announced address moves to that one. A node on several networks
/// binds the same ports on each and announces one address
/// (docs/protocol.md §9.5); each network reaches it at its own.
pub(crate) fn reached_at(a: &mut Announcement, reached: &str) {
    let (Some((host, port)), Some((announced, announced_port))) =
        (tcp_host_port(reached), tcp_host_port(&a.control))
    else {
        return;
    };
    // Addresses, compared as such: a name (a static peer given by DNS
    // name) is never put in place of an address.
    let (Some(reached_ip), Some(announced_ip)) = (ip_of(host), ip_of(announced)) else {
        return;
    };
    if port != announced_port || reached_ip == announced_ip {
        return;
    }
    let from = format!("tcp://{announced}:");
    let to = format!("tcp://{host}:");
    let endpoints = [
        Some(&mut a.control),
        a.data_best_effort.as_mut(),
        a.data_reliable.as_mut(),
        a.liveliness.as_mut(),
    ]
    .into_iter()
    .flatten()
    .chain(a.services.iter_mut().map(|s| &mut s.endpoint))
    .chain(
        a.publications
            .iter_mut()
            .filter_map(|p| p.endpoint.as_mut()),
    );
    for e in endpoints {
        if let Some(rest) = e.strip_prefix(from.as_str()) {
            *e = format!("{to}{rest}");
        }
    }
}

/// Largest announcement file read (bytes); larger ones are skipped and
/// counted, so that a huge file costs nobody its size in memory.
pub(crate) const MAX_ANNOUNCEMENT_BYTES: u64 = 1 << 20;

/// What identifies one version of a file: a changed file is read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileVersion {
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileVersion {
    fn of(m: &fs::Metadata) -> FileVersion {
        use std::os::unix::fs::MetadataExt;
        FileVersion {
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

/// What a scan found in one file.
#[derive(Debug)]
struct Cached {
    version: FileVersion,
    /// A digest of the content, when it could be read.
    digest: Option<u64>,
    announcement: Option<Announcement>,
}

/// A digest of a file's content (`DefaultHasher::new` has fixed keys: the
/// same in every scan of a process).
fn content_digest(text: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

/// Reads an announcement file without trusting it: no symbolic link is
/// followed, nothing but a regular file of this user is opened, a FIFO or
/// device never blocks the reader, and at most [`MAX_ANNOUNCEMENT_BYTES`]
/// are read.
fn read_announcement(path: &Path) -> Result<(FileVersion, Vec<u8>), String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot open it: {e}"))?;
    let m = f.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    check_file(&m)?;
    let mut buf = Vec::with_capacity(m.size().min(MAX_ANNOUNCEMENT_BYTES) as usize);
    f.take(MAX_ANNOUNCEMENT_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if buf.len() as u64 > MAX_ANNOUNCEMENT_BYTES {
        return Err(format!("larger than {MAX_ANNOUNCEMENT_BYTES} bytes"));
    }
    Ok((FileVersion::of(&m), buf))
}

/// Whether metadata `m` is that of a file this node may read as an
/// announcement: a regular file of this user, not too large.
fn check_file(m: &fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !m.file_type().is_file() {
        return Err("not a regular file".into());
    }
    let uid = crate::util::sys::uid();
    if m.uid() != uid {
        return Err(format!("owned by uid {}, not {uid}", m.uid()));
    }
    if m.size() > MAX_ANNOUNCEMENT_BYTES {
        return Err(format!("larger than {MAX_ANNOUNCEMENT_BYTES} bytes"));
    }
    Ok(())
}

/// Whether a unix socket is listening at `path` (from /proc/net/unix): a
/// socket file in use is never deleted, whatever a stale announcement says.
/// Without /proc, every socket counts as in use.
pub(crate) fn socket_in_use(path: &Path) -> bool {
    const ACCEPTING: u32 = 0x0001_0000;
    let Ok(table) = fs::read_to_string("/proc/net/unix") else {
        return true;
    };
    let want = path.to_string_lossy();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 8
            && f[7] == want
            && u32::from_str_radix(f[3], 16).is_ok_and(|flags| flags & ACCEPTING != 0)
    })
}

/// An inotify watch on a domain directory, so that the node thread learns
/// of a written, renamed or removed announcement at once and need not look
/// at the directory on a timer.
#[derive(Debug)]
pub(crate) struct Watch(crate::util::sys::Inotify, std::cell::Cell<bool>);

impl Watch {
    /// A watch on `dir`, or `None` where inotify is not available (the
    /// directory's modification time is then compared on every turn).
    fn new(dir: &Path) -> Option<Watch> {
        crate::util::sys::Inotify::watch(dir).map(|w| Watch(w, std::cell::Cell::new(false)))
    }

    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        self.0.fd()
    }

    /// Reads the pending events: whether any concerned an announcement
    /// (a `.json` file), and adds the names of those to `names` (`None` in
    /// it: the kernel's queue overflowed or the watch went, and any file
    /// may have changed).
    fn drain(&self, names: &mut std::collections::HashSet<Option<std::ffi::OsString>>) -> bool {
        use std::os::unix::ffi::OsStrExt;
        const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
        let mut buf = [0u8; 4096];
        let mut any = false;
        loop {
            let n = self.0.read(&mut buf);
            if n == 0 {
                return any;
            }
            // The kernel returns whole events: a header, then `len` bytes
            // of NUL-padded name.
            let mut at = 0;
            while at + HEAD <= n {
                let field = |o: usize| {
                    u32::from_ne_bytes(buf[at + o..at + o + 4].try_into().expect("4 bytes"))
                };
                let (mask, len) = (field(4), field(12) as usize);
                let name = &buf[(at + HEAD).min(n)..(at + HEAD + len).min(n)];
                let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
                if mask & libc::IN_Q_OVERFLOW != 0 || name.is_empty() {
                    // The queue overflowed, or the watch itself went (the
                    // directory was removed): anything may have changed.
                    names.insert(None);
                    any = true;
                    if mask & libc::IN_IGNORED != 0 {
                        self.1.set(true);
                    }
                } else if name.ends_with(b".json") {
                    // Not a node's temporary file, written before it is
                    // renamed into place (which names the .json).
                    names.insert(Some(std::ffi::OsStr::from_bytes(name).to_owned()));
                    any = true;
                }
                at += HEAD + len;
            }
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
    /// What each file held when last read, by file name: a scan reads only
    /// files that changed (a directory of 200 nodes churning would
    /// otherwise cost every node 200 reads and parses per change). A file
    /// that cannot be used is remembered too, so that it is counted and
    /// logged once per version, not on every scan.
    cache: std::collections::HashMap<std::ffi::OsString, Cached>,
    /// Files read and parsed so far (the cache spares the others).
    pub files_read: u64,
    /// Announcements whose process was checked so far.
    pub processes_checked: u64,
    /// Files inotify said changed since the last scan (`None`: any may
    /// have): read again whatever their metadata says, since an inode can
    /// be reused and timestamps are coarse.
    dirty: std::collections::HashSet<Option<std::ffi::OsString>>,
    /// The next scan checks the process of every announcement (its start
    /// time in /proc), not only of those read anew: set at first and by
    /// [`LocalDir::mark_all_dirty`]. An announcement found unchanged was
    /// alive at the last scan; its process ending is caught between scans
    /// (pidfds, see `discovery::local`), which names it in
    /// `recheck_pids`. Checking every process on every change would cost
    /// each node O(nodes) reads of /proc per change, a host of nodes
    /// starting or closing together O(nodes^3).
    recheck: bool,
    /// Processes the next scan checks, whatever else it does.
    recheck_pids: std::collections::HashSet<u32>,
}

/// Writes `bytes` to a new file at `path`, never through what is there:
/// whatever is at the name goes first, and the file is created exclusively
/// without following a link (`O_EXCL | O_NOFOLLOW`). A member of the
/// directory's group who put a link at this predictable name, to a file of
/// this user's, had `fs::write` write the announcement into that file.
fn write_fresh(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut last = None;
    // Someone who re-creates the name between the removal and the
    // creation is outlasted a few times, then refused.
    for _ in 0..3 {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o644)
            .open(path)
        {
            Ok(mut f) => return f.write_all(bytes),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("the name is taken")))
}

impl LocalDir {
    /// Opens (creating, mode 0700) `<root>/<domain>`. When `root` is the
    /// default shared location (`private_root`), it must belong to this user
    /// and be closed to others: otherwise another user could plant
    /// announcements. A root given (`runtime_dir`) must belong to this user
    /// or be a sticky directory (as /tmp), and not be writable by all
    /// unless sticky; the domain's directory must belong to this user and
    /// not be writable by all (another user who can write there could
    /// plant announcements, links where this node writes its own, or
    /// sockets in place of its ipc ones). Group write is let be: with a
    /// umask of 002 directories are made so, in the user's own group.
    pub(crate) fn open(root: &Path, domain: &str, private_root: bool) -> io::Result<LocalDir> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let mut b = fs::DirBuilder::new();
        b.recursive(true).mode(0o700);
        b.create(root)?;
        let uid = crate::util::sys::uid();
        let owned = |dir: &Path, closed: u32, want: &str| -> io::Result<()> {
            let m = fs::metadata(dir)?;
            let sticky = m.mode() & 0o1000 != 0;
            let ok = match closed {
                // A root given: this user's, or a sticky directory (others
                // cannot move or remove what this user makes in it).
                0o002 if dir == root => sticky || (m.uid() == uid && m.mode() & 0o002 == 0),
                _ => m.uid() == uid && m.mode() & closed == 0,
            };
            if !ok {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} must belong to uid {uid} with {want} (it has uid {} and mode {:o})",
                        dir.display(),
                        m.uid(),
                        m.mode() & 0o777
                    ),
                ));
            }
            Ok(())
        };
        if private_root {
            owned(root, 0o077, "mode 0700")?;
        } else {
            owned(
                root,
                0o002,
                "no write permission for all (unless sticky, as /tmp)",
            )?;
        }
        let dir = root.join(domain);
        b.create(&dir)?;
        owned(&dir, 0o002, "no write permission for all")?;
        Ok(LocalDir {
            watch: Watch::new(&dir),
            dir,
            last_mtime: None,
            cache: std::collections::HashMap::new(),
            files_read: 0,
            processes_checked: 0,
            dirty: std::collections::HashSet::new(),
            recheck: true,
            recheck_pids: std::collections::HashSet::new(),
        })
    }

    fn file_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes (or replaces) this node's announcement atomically. The
    /// directory is made again if a node that closed removed it.
    pub(crate) fn write(&self, a: &Announcement) -> io::Result<()> {
        let tmp = self.dir.join(format!(".{}.tmp", a.node_id));
        // Compact: the size a node checks its publications against
        // (`PublisherError::TooManyPublications`) is the file's.
        let text = serde_json::to_vec(a).map_err(io::Error::other)?;
        if let Err(e) = write_fresh(&tmp, &text) {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(e);
            }
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new().mode(0o700).create(&self.dir)?;
            write_fresh(&tmp, &text)?;
        }
        fs::rename(&tmp, self.file_of(&a.node_id))
    }

    /// Removes this node's announcement and the announcements of nodes
    /// that are gone (an observer that exits must not leave them for nobody
    /// to clean). The domain directory stays: removing it could race with a
    /// node opening in it (its watch, its ipc sockets).
    pub(crate) fn remove(&mut self, id: &str) {
        let _ = fs::remove_file(self.file_of(id));
        self.recheck = true;
        let mut bad = 0;
        let _ = self.scan(&mut bad);
    }

    /// Removes the announcement of node `id` if process `pid` wrote it
    /// (a broker withdrawing a client that another broker of this host
    /// may announce by now).
    pub(crate) fn remove_if_of(&mut self, id: &str, pid: u32) {
        let path = self.file_of(id);
        // Read as any announcement is (a FIFO or a link to /dev/zero put in
        // its place must not block or fill the broker that withdraws it).
        let ours = read_announcement(&path)
            .ok()
            .and_then(|(_, t)| Announcement::from_json(&t).ok())
            .is_some_and(|a| a.pid == pid);
        if ours {
            let _ = fs::remove_file(path);
        }
    }

    /// Whether the directory changed since the last [`LocalDir::scan`].
    pub(crate) fn changed(&mut self) -> bool {
        if let Some(w) = &self.watch {
            let changed = w.drain(&mut self.dirty);
            let lost = w.1.get();
            // Its directory was removed (and made again by a node's
            // write): watched again, and read whole.
            if lost && w.0.add(&self.dir) {
                w.1.set(false);
                self.dirty.insert(None);
                return true;
            }
            // Watching, or the directory is gone (and nothing in it can
            // change: a node's write makes it again, then it is watched).
            return changed;
        }
        let m = fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        let changed = m.is_none() || m != self.last_mtime;
        if changed {
            // Without inotify there is no telling which file changed.
            self.dirty.insert(None);
        }
        changed
    }

    /// Makes the next scan read every file again (the periodic full scan,
    /// which nothing can have slipped past). Files whose content did not
    /// change are not parsed or logged again.
    pub(crate) fn mark_all_dirty(&mut self) {
        self.dirty.insert(None);
        self.recheck = true;
    }

    /// Makes the next scan check the announcements of processes `pids`
    /// (seen ended).
    pub(crate) fn recheck_processes(&mut self, pids: impl IntoIterator<Item = u32>) {
        self.recheck_pids.extend(pids);
    }

    /// Reads every live announcement; removes stale ones (and their ipc
    /// socket files, unless in use). Files that cannot be used are skipped,
    /// and counted and logged once per version. Only files that changed
    /// since the last scan are read. By node id (a file not named after
    /// its node: by its own name).
    pub(crate) fn scan(&mut self, bad_files: &mut u64) -> BTreeMap<String, Announcement> {
        self.last_mtime = fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        let mut out = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&self.dir) else {
            self.cache.clear();
            return out;
        };
        // What inotify has to say that was not asked for yet: a file it
        // does not name below is trusted to be as last read.
        if let Some(w) = &self.watch {
            w.drain(&mut self.dirty);
        }
        let mut seen = std::collections::HashSet::new();
        let recheck = std::mem::take(&mut self.recheck);
        let recheck_pids = std::mem::take(&mut self.recheck_pids);
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let name = e.file_name();
            seen.insert(name.clone());
            let dirty = self.dirty.contains(&None) || self.dirty.contains(&Some(name.clone()));
            // A file inotify did not name is as it was read: not even
            // looked at (an lstat per file per change is O(nodes^2) for a
            // host of nodes starting together). Without inotify, its
            // metadata tells.
            // `None`: the file is as last read (its cache entry holds it).
            let fresh = if self.watch.is_some() && !dirty && self.cache.contains_key(&name) {
                None
            } else {
                // lstat: a link is not followed, a FIFO not opened.
                let Ok(m) = fs::symlink_metadata(&path) else {
                    continue;
                };
                let version = FileVersion::of(&m);
                let same = !dirty && self.cache.get(&name).is_some_and(|c| c.version == version);
                (!same).then_some((m, version))
            };
            // The process that wrote the file as last read: alive at that
            // scan (a dead one's file is removed, with its cache entry).
            let was = self
                .cache
                .get(&name)
                .and_then(|c| c.announcement.as_ref())
                .map(|a| (a.pid, a.start_time));
            let a = match fresh {
                None => self.cache.get(&name).and_then(|c| c.announcement.clone()),
                Some((m, version)) => {
                    let read = check_file(&m).and_then(|()| {
                        self.files_read += 1;
                        read_announcement(&path)
                    });
                    let digest = read.as_ref().ok().map(|(_, text)| content_digest(text));
                    let same = self
                        .cache
                        .get(&name)
                        .filter(|c| digest.is_some() && c.digest == digest)
                        .map(|c| c.announcement.clone());
                    if let Some(a) = same {
                        // Read again, found as it was: not parsed, nor
                        // counted and logged again.
                        if let Some(c) = self.cache.get_mut(&name) {
                            c.version = version;
                        }
                        a
                    } else {
                        let parsed = read.and_then(|(v, text)| {
                            Announcement::from_json(&text)
                                .map(|a| (v, a))
                                .map_err(|e| e.to_string())
                        });
                        match parsed {
                            Ok((v, a)) => {
                                self.cache.insert(
                                    name,
                                    Cached {
                                        version: v,
                                        digest,
                                        announcement: Some(a.clone()),
                                    },
                                );
                                Some(a)
                            }
                            // Removed since it was listed (its node closed,
                            // or a stale file was cleaned): not bad.
                            Err(_) if fs::symlink_metadata(&path).is_err() => continue,
                            Err(err) => {
                                *bad_files += 1;
                                tracing::warn!(file = %path.display(), %err, "ignoring an announcement file (logged once per version of the file)");
                                self.cache.insert(
                                    name,
                                    Cached {
                                        version,
                                        digest,
                                        announcement: None,
                                    },
                                );
                                None
                            }
                        }
                    }
                }
            };
            let Some(a) = a else { continue };
            // Unchanged, or rewritten by the same process (a node updating
            // its announcement): known alive unless asked to check.
            let known = was == Some((a.pid, a.start_time));
            let alive = (known && !recheck && !recheck_pids.contains(&a.pid)) || {
                self.processes_checked += 1;
                is_alive(&a)
            };
            if alive {
                // By node id when the file is named after it, as its node
                // writes it; a file of another name under its own name
                // after every id (`~` sorts after hex digits), so that it
                // cannot hide the node's own: the first entry of a node
                // stands (with security on the node thread sets aside one
                // whose id is not its key's).
                let own_file = e.file_name().to_str() == Some(&format!("{}.json", a.node_id));
                let slot = match own_file {
                    true => a.node_id.clone(),
                    false => format!("~{}", e.file_name().to_string_lossy()),
                };
                out.insert(slot, a);
            } else {
                tracing::info!(node = %a.name, "removing the announcement of a node that is gone");
                remove_ipc_files(&a, &self.dir, false);
                let _ = fs::remove_file(&path);
                self.cache.remove(e.file_name().as_os_str());
            }
        }
        self.cache.retain(|name, _| seen.contains(name));
        self.dirty.clear();
        out
    }
}

/// Deletes the socket files of a dead node's ipc endpoints, only those
/// inside `within` (the domain directory, where Milonga puts them). `own`:
/// the closing node's own, deleted even though still bound.
pub(crate) fn remove_ipc_files(a: &Announcement, within: &Path, own: bool) {
    for ep in a
        .data_endpoints()
        .chain(a.liveliness.as_deref())
        .chain(std::iter::once(a.control.as_str()))
        .chain(a.services.iter().map(|s| s.endpoint.as_str()))
    {
        if let Some(named_as) = ep.strip_prefix("ipc://").map(Path::new) {
            // Judged and removed under the name Milonga gives it (the
            // directory's path and the file's name), not as spelled: a
            // forged `DIR/./NAME` is the same file, which /proc/net/unix
            // lists as `DIR/NAME`.
            if named_as.parent() != Some(within) {
                continue;
            }
            let Some(name) = named_as.file_name() else {
                continue;
            };
            let path = &within.join(name);
            // Only a socket file in the domain directory, with the name
            // Milonga gives a node's sockets (`<first 12 hex digits of its
            // id>-<role>.sock`), and not in use: a stale or forged
            // announcement naming a live node's sockets deletes nothing.
            let named = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                // `get`: the id comes from a file and may not be ASCII.
                a.node_id
                    .get(..12)
                    .is_some_and(|short| n.starts_with(&format!("{short}-")))
            });
            let is_socket = fs::symlink_metadata(path).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            });
            if named && is_socket && (own || !socket_in_use(path)) {
                let _ = fs::remove_file(path);
            }
        }
    }
}

/// A source of peers' announcements.
pub(crate) trait Source {
    /// Reads what arrived and does what is due by `now` (queries, checks
    /// of the peers' processes); whether the peers it sees changed.
    fn turn(&mut self, now: Instant) -> bool;

    /// Adds the announcements of the peers it sees to `peers`, in the
    /// order it prefers them (the first of a node stands).
    fn peers_into(&self, peers: &mut Vec<Announcement>);

    /// When it next needs a turn though nothing arrived (`None`: only when
    /// something arrives).
    fn next_due(&self) -> Option<Instant>;
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
            key: None,
            id_salt: None,
            via: None,
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
        crate::util::sys::testing::kill(pid, libc::SIGKILL);
        // Not reaped yet: a zombie until `wait`.
        let start = std::time::Instant::now();
        while process_start_time(pid).is_some() {
            assert!(start.elapsed().as_secs() < 5, "the child never died");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(pid_exists(pid), "a zombie still has its pid");
        child.wait().expect("reap");
    }

    #[test]
    fn a_node_reached_at_another_of_its_addresses_is_used_there() {
        let mut a = announcement("00", 1, 0, "tcp://10.0.0.1:5000");
        a.control = "tcp://10.0.0.1:6000".into();
        a.liveliness = Some("tcp://10.0.0.1:6001".into());
        a.data_reliable = Some("ipc:///tmp/x.sock".into());
        let mut other = a.clone();
        // Another port: not its control socket that answered; unchanged.
        reached_at(&mut other, "tcp://10.1.0.1:7000");
        assert_eq!(other, a);
        reached_at(&mut other, "tcp://10.0.0.1:6000");
        assert_eq!(other, a, "the announced address itself");
        reached_at(&mut other, "tcp://host.example:6000");
        assert_eq!(other, a, "a name is never put in place of an address");
        reached_at(&mut other, "tcp://10.1.0.1:6000");
        assert_eq!(other.control, "tcp://10.1.0.1:6000");
        assert_eq!(
            other.data_best_effort.as_deref(),
            Some("tcp://10.1.0.1:5000")
        );
        assert_eq!(other.liveliness.as_deref(), Some("tcp://10.1.0.1:6001"));
        assert_eq!(other.data_reliable.as_deref(), Some("ipc:///tmp/x.sock"));
    }

    pub(crate) fn announcement(
        id: &str,
        pid: u32,
        start_time: u64,
        endpoint: &str,
    ) -> Announcement {
        Announcement {
            protocol: 1,
            domain: "d".into(),
            node_id: id.into(),
            name: format!("n-{id}"),
            host: "h".into(),
            pid,
            start_time,
            control: "tcp://127.0.0.1:9".into(),
            data_best_effort: Some(endpoint.into()),
            data_reliable: None,
            liveliness: None,
            publications: vec![],
            services: vec![],
            key: None,
            id_salt: None,
            via: None,
        }
    }

    pub(crate) fn temp_dir(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("mlg-disc-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    /// Issue 10, finding 9: a FIFO, a link to /dev/zero, a huge file and a
    /// file that is not JSON are skipped without blocking or reading them
    /// whole, each counted and logged once; unchanged files are not read
    /// again; a start time of 0 (not known) is judged by the pid alone.
    #[test]
    fn hostile_files_are_skipped_once_and_unchanged_ones_not_read_again() {
        let root = temp_dir("hostile");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        assert!(crate::util::sys::testing::mkfifo(
            &dir.dir.join("fifo.json")
        ));
        std::os::unix::fs::symlink("/dev/zero", dir.dir.join("zero.json")).unwrap();
        fs::File::create(dir.dir.join("huge.json"))
            .unwrap()
            .set_len(200 << 20)
            .unwrap();
        fs::write(dir.dir.join("junk.json"), b"{not json").unwrap();
        let me = announcement(&"ab".repeat(16), std::process::id(), 0, "tcp://127.0.0.1:9");
        dir.write(&me).unwrap();
        let mut bad = 0;
        let found = dir.scan(&mut bad);
        assert_eq!(bad, 4, "each hostile file counted");
        assert_eq!(found.len(), 1, "start_time 0: alive by its pid");
        assert_eq!(
            dir.files_read, 2,
            "only the junk file and the real one are opened"
        );
        let mut bad = 0;
        let again = dir.scan(&mut bad);
        assert_eq!((bad, again.len()), (0, 1), "counted once per version");
        assert_eq!(dir.files_read, 2, "nothing unchanged is read again");
        let _ = fs::remove_dir_all(&root);
    }

    /// A domain directory removed and made again (by a node's next write)
    /// is watched again: a file written after that is seen at once, not
    /// at the next full scan (the watch went with the directory).
    #[test]
    fn a_domain_directory_removed_and_made_again_is_watched_again() {
        let root = temp_dir("rewatch");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        assert!(dir.watch.is_some(), "inotify here");
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap();
        fs::remove_dir_all(&dir.dir).unwrap();
        dir.write(&announcement(
            &"a1".repeat(16),
            pid,
            start,
            "tcp://127.0.0.1:9",
        ))
        .unwrap();
        // Told once that the watch went: a full look.
        assert!(dir.changed());
        let mut bad = 0;
        assert_eq!(dir.scan(&mut bad).len(), 1);
        assert!(!dir.changed());
        dir.write(&announcement(
            &"b2".repeat(16),
            pid,
            start,
            "tcp://127.0.0.1:9",
        ))
        .unwrap();
        assert!(
            dir.changed(),
            "a file written after the directory came back"
        );
        assert_eq!(dir.scan(&mut bad).len(), 2);
        let _ = fs::remove_dir_all(&root);
    }

    /// A link planted at the name a node writes its announcement under
    /// first (`.<id>.tmp`, predictable; a member of the directory's group
    /// can) is replaced, never written through: the file it names stays as
    /// it was, the announcement is in place.
    #[test]
    fn an_announcement_is_never_written_through_a_planted_link() {
        let root = temp_dir("planted");
        let dir = LocalDir::open(&root, "d", false).unwrap();
        let victim = root.join("victim");
        fs::write(&victim, b"precious").unwrap();
        let id = "c3".repeat(16);
        std::os::unix::fs::symlink(&victim, dir.dir.join(format!(".{id}.tmp"))).unwrap();
        let pid = std::process::id();
        let start = process_start_time(pid).unwrap();
        dir.write(&announcement(&id, pid, start, "tcp://127.0.0.1:9"))
            .unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        let written = fs::read_to_string(dir.file_of(&id)).unwrap();
        assert!(written.contains(&id), "{written}");
        assert!(!fs::symlink_metadata(dir.file_of(&id))
            .unwrap()
            .file_type()
            .is_symlink());
        let _ = fs::remove_dir_all(&root);
    }

    /// A runtime directory given, or its domain's directory, that all may
    /// write to is refused with a clear error (another user could plant
    /// announcements, or links where the node writes its own); a sticky
    /// root (as /tmp) and group write (a umask of 002) are let be.
    #[test]
    fn a_runtime_directory_others_may_write_to_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = temp_dir("open-to-all");
        fs::create_dir_all(root.join("d")).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        let e = LocalDir::open(&root, "d", false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("no write permission for all"), "{e}");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o1777)).unwrap();
        fs::set_permissions(root.join("d"), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(LocalDir::open(&root, "d", false).is_err());
        fs::set_permissions(root.join("d"), fs::Permissions::from_mode(0o775)).unwrap();
        assert!(
            LocalDir::open(&root, "d", false).is_ok(),
            "sticky root, group write"
        );
        let _ = fs::remove_dir_all(&root);
    }

    /// A broker withdrawing a client whose announcement file was replaced
    /// by a FIFO or a link to /dev/zero neither blocks (it read the file
    /// with a plain open) nor reads without end, and removes neither; its
    /// own file it removes.
    #[test]
    fn withdrawing_a_client_reads_its_file_as_any_announcement() {
        let root = temp_dir("withdraw");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        let (fifo, zero) = ("f1".repeat(16), "f2".repeat(16));
        assert!(crate::util::sys::testing::mkfifo(&dir.file_of(&fifo)));
        std::os::unix::fs::symlink("/dev/zero", dir.file_of(&zero)).unwrap();
        let pid = std::process::id();
        dir.remove_if_of(&fifo, pid);
        dir.remove_if_of(&zero, pid);
        assert!(dir.file_of(&fifo).exists() && fs::symlink_metadata(dir.file_of(&zero)).is_ok());
        let mine = announcement(&"ab".repeat(16), pid, 0, "tcp://127.0.0.1:9");
        dir.write(&mine).unwrap();
        dir.remove_if_of(&mine.node_id, pid + 1);
        assert!(
            dir.file_of(&mine.node_id).exists(),
            "another process's: kept"
        );
        dir.remove_if_of(&mine.node_id, pid);
        assert!(!dir.file_of(&mine.node_id).exists());
        let _ = fs::remove_dir_all(&root);
    }

    /// A change in the directory checks the processes of the files that
    /// changed to name another process, not of every announcement; a known
    /// peer's process ending checks its own announcements, a full scan all
    /// of them.
    #[test]
    fn a_change_checks_only_the_processes_of_the_files_that_changed() {
        let root = temp_dir("recheck");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        let me = std::process::id();
        let start = process_start_time(me).unwrap();
        let mut bad = 0;
        for (i, id) in ["a1", "b2", "c3"].iter().enumerate() {
            let a = announcement(&id.repeat(16), me, start, "tcp://127.0.0.1:9");
            dir.write(&a).unwrap();
            let _ = dir.changed();
            assert_eq!(dir.scan(&mut bad).len(), i + 1);
            assert_eq!(dir.processes_checked, i as u64 + 1, "only the new file's");
        }
        // Rewritten by its node: not checked again.
        let mut a = announcement(&"a1".repeat(16), me, start, "tcp://127.0.0.1:9");
        a.name = "renamed".into();
        dir.write(&a).unwrap();
        let _ = dir.changed();
        assert_eq!(dir.scan(&mut bad)[&a.node_id].name, "renamed");
        assert_eq!(dir.processes_checked, 3, "the same process wrote it");
        // A new announcement of a process that is gone: checked as it is
        // read, and removed.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let dead = announcement(&"d4".repeat(16), gone, 1, "tcp://127.0.0.1:9");
        fs::write(
            dir.dir.join(format!("{}.json", dead.node_id)),
            serde_json::to_vec(&dead).unwrap(),
        )
        .unwrap();
        let _ = dir.changed();
        assert_eq!(dir.scan(&mut bad).len(), 3, "checked as it was read");
        assert_eq!(dir.processes_checked, 4);
        // Pids seen ended: the announcements of those pids are checked
        // (here the three of this process: checked, found alive).
        dir.recheck_processes([gone, me]);
        assert_eq!(dir.scan(&mut bad).len(), 3);
        assert_eq!(dir.processes_checked, 7, "the announcements of those pids");
        dir.recheck_processes([gone]);
        let _ = dir.scan(&mut bad);
        assert_eq!(
            dir.processes_checked, 7,
            "no announcement of that pid is left"
        );
        dir.mark_all_dirty();
        let _ = dir.scan(&mut bad);
        assert_eq!(dir.processes_checked, 10, "a full scan checks them all");
        let _ = fs::remove_dir_all(&root);
    }

    /// A stale announcement whose node id is not ASCII (byte 12 inside a
    /// character) is removed without a panic.
    #[test]
    fn a_stale_announcement_with_a_non_ascii_id_panics_nobody() {
        let root = temp_dir("nonascii");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let ep = format!("ipc://{}/x-be.sock", dir.dir.display());
        let a = announcement("a\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}", gone, 1, &ep);
        fs::write(dir.dir.join("odd.json"), serde_json::to_vec(&a).unwrap()).unwrap();
        let mut bad = 0;
        assert!(dir.scan(&mut bad).is_empty());
        assert!(
            !dir.dir.join("odd.json").exists(),
            "the stale file is removed"
        );
        let _ = fs::remove_dir_all(&root);
    }

    /// A file rewritten in place with the same size (its inode, size and,
    /// with coarse timestamps, modification time unchanged) is read again
    /// once inotify names it.
    #[test]
    fn a_file_rewritten_with_the_same_size_is_read_again() {
        let root = temp_dir("rewrite");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        let mut a = announcement(&"12".repeat(16), std::process::id(), 0, "tcp://127.0.0.1:9");
        a.publications = vec![PublicationInfo {
            key: "a/x".into(),
            reliability: crate::model::qos::Reliability::BestEffort,
            history: 0,
            endpoint: None,
            socket: None,
            schema: None,
        }];
        let file = dir.dir.join(format!("{}.json", a.node_id));
        fs::write(&file, serde_json::to_vec(&a).unwrap()).unwrap();
        let mut bad = 0;
        let _ = dir.changed();
        assert_eq!(dir.scan(&mut bad)[&a.node_id].publications[0].key, "a/x");
        a.publications[0].key = "a/y".into();
        fs::write(&file, serde_json::to_vec(&a).unwrap()).unwrap();
        assert!(dir.changed());
        assert_eq!(dir.scan(&mut bad)[&a.node_id].publications[0].key, "a/y");
        let _ = fs::remove_dir_all(&root);
    }

    /// Issue 10, finding 9: a stale announcement naming a live node's ipc
    /// sockets deletes none of them; a dead node's own socket files go.
    #[test]
    fn a_stale_announcement_never_deletes_a_socket_in_use() {
        let root = temp_dir("sockets");
        let mut dir = LocalDir::open(&root, "d", false).unwrap();
        let id = "cd".repeat(16);
        let live = dir.dir.join(format!("{}-be.sock", &id[..12]));
        let _listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
        let dead_id = "ef".repeat(16);
        let dead = dir.dir.join(format!("{}-be.sock", &dead_id[..12]));
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        assert!(dead.exists(), "a dropped listener leaves its file");
        // A process that is gone: a reaped child.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        // The live one also under another spelling of its path
        // (`DIR/./NAME`), which /proc/net/unix does not list.
        let respelled = dir.dir.join(".").join(live.file_name().unwrap());
        // (Another id whose first 12 digits name the same socket.)
        let twin = format!("{}{}", &id[..12], "00".repeat(10));
        for (node, sock) in [(&id, &live), (&dead_id, &dead), (&twin, &respelled)] {
            let a = announcement(node, gone, 1, &format!("ipc://{}", sock.display()));
            dir.write(&a).unwrap();
        }
        let mut bad = 0;
        assert!(dir.scan(&mut bad).is_empty());
        assert!(live.exists(), "a socket in use was deleted");
        assert!(!dead.exists(), "a dead node's socket file stayed");
        assert_eq!(
            fs::read_dir(&dir.dir).unwrap().count(),
            1,
            "stale announcements removed"
        );
        let _ = fs::remove_dir_all(&root);
    }
}
