//! The engine's calls into the C library, each behind a safe function.
//! With the peer-to-peer backend's FFI module (ZeroMQ's calls), the only
//! module where `unsafe` is allowed (`#![deny(unsafe_code)]` at the crate
//! root); every block says why it is sound.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// This process's real user id.
pub(crate) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// Whether a process `pid` exists (it may be another process that got a
/// recycled pid).
pub(crate) fn pid_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists and
    // may be signalled; it has no memory preconditions.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Takes an exclusive advisory lock (`flock`) on `f` without waiting:
/// `false` if another open file description holds one. Released when `f`
/// (every descriptor of it) is closed.
/// Makes a directory's entries durable (a file created, linked or renamed
/// in it): the file's own sync does not. Best effort: said when it fails.
pub(crate) fn sync_dir(dir: &std::path::Path) {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let synced = std::fs::File::open(dir).and_then(|d| d.sync_all());
    if let Err(e) = synced {
        tracing::warn!(dir = %dir.display(), error = %e, "the directory's entries could not be synced: a power loss now may lose a recording's name");
    }
}

/// Opens `path` for reading if it is a regular file: opened without
/// waiting (`O_NONBLOCK`: a FIFO or a device at the path would block the
/// open, or every read, until a writer came), then refused unless it is a
/// regular file (`ErrorKind::InvalidInput`, "not a regular file"). The
/// flag changes nothing for a regular file's reads.
pub(crate) fn open_regular(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // A regular file's reads ignore the flag, but some network and FUSE
    // file systems pass it on: taken off again.
    // SAFETY: fcntl on a descriptor `f` owns, touching no memory of ours.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
    Ok(f)
}

pub(crate) fn try_lock(f: &std::fs::File) -> std::io::Result<bool> {
    // SAFETY: flock takes a descriptor `f` owns and open for its lifetime,
    // and no memory.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Most processes a [`Pidfds`] holds a descriptor of; the others are
/// checked with `kill(pid, 0)`.
pub(crate) const MAX_PIDFDS: usize = 64;

/// Descriptors of other processes (pidfds, Linux 5.3 and later): one
/// becomes readable when its process has ended, even before its parent
/// reaps it (a zombie, which `kill(pid, 0)` still finds).
#[derive(Debug, Default)]
pub(crate) struct Pidfds(std::collections::HashMap<u32, OwnedFd>);

impl Pidfds {
    /// Those of `pids` that have ended: by their pidfds (opened on first
    /// sight, at most [`MAX_PIDFDS`]), or by `kill(pid, 0)` where none can
    /// be had. Descriptors of processes no longer in `pids` are closed.
    pub(crate) fn ended(&mut self, pids: &[u32]) -> Vec<u32> {
        let wanted: std::collections::HashSet<u32> = pids.iter().copied().collect();
        self.0.retain(|p, _| wanted.contains(p));
        let mut ended = Vec::new();
        for &pid in &wanted {
            if self.0.contains_key(&pid) {
                continue;
            }
            if self.0.len() < MAX_PIDFDS {
                match pidfd_open(pid) {
                    Ok(fd) => {
                        self.0.insert(pid, fd);
                        continue;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                        ended.push(pid);
                        continue;
                    }
                    Err(_) => {}
                }
            }
            if !pid_exists(pid) {
                ended.push(pid);
            }
        }
        let (pids, mut items): (Vec<u32>, Vec<libc::pollfd>) = self
            .0
            .iter()
            .map(|(&pid, fd)| {
                let item = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                (pid, item)
            })
            .unzip();
        if items.is_empty() {
            return ended;
        }
        // SAFETY: poll reads and writes `items.len()` pollfds of a live
        // vector; a timeout of 0 never blocks.
        let n = unsafe { libc::poll(items.as_mut_ptr(), items.len() as libc::nfds_t, 0) };
        if n > 0 {
            let readable = items.iter().map(|i| i.revents != 0);
            ended.extend(
                pids.iter()
                    .zip(readable)
                    .filter(|(_, r)| *r)
                    .map(|(p, _)| *p),
            );
        }
        ended
    }
}

/// A pidfd of process `pid`.
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // (owned at once) or -1; it has no memory preconditions.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// An IPv4 address of a network interface of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ipv4Iface {
    pub(crate) name: String,
    pub(crate) addr: std::net::Ipv4Addr,
    /// The network's prefix length (from the netmask).
    pub(crate) prefix: u8,
    pub(crate) up: bool,
    pub(crate) multicast: bool,
    pub(crate) loopback: bool,
}

/// The IPv4 addresses of this host's interfaces, in the kernel's order
/// (getifaddrs); empty if it fails.
pub(crate) fn ipv4_interfaces() -> Vec<Ipv4Iface> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocates into `head`; on
    // success it is freed below with freeifaddrs, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid
        // until freeifaddrs; its name is a NUL-terminated string, and an
        // address of family AF_INET is a sockaddr_in (the netmask too).
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                let addr = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                let prefix = if ifa.ifa_netmask.is_null() {
                    32
                } else {
                    let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                    u32::from_be(m.sin_addr.s_addr).count_ones() as u8
                };
                let flags = ifa.ifa_flags;
                out.push(Ipv4Iface {
                    name: std::ffi::CStr::from_ptr(ifa.ifa_name)
                        .to_string_lossy()
                        .into_owned(),
                    addr,
                    prefix,
                    up: flags & libc::IFF_UP as u32 != 0,
                    multicast: flags & libc::IFF_MULTICAST as u32 != 0,
                    loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
                });
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: the list getifaddrs allocated above, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The index of the interface that has IPv6 address `addr`, if any.
pub(crate) fn ipv6_interface_index(addr: std::net::Ipv6Addr) -> Option<u32> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocates into `head`; on
    // success it is freed below with freeifaddrs, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() && found.is_none() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid
        // until freeifaddrs; an address of family AF_INET6 is a
        // sockaddr_in6, and the name a NUL-terminated string.
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET6 {
                let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                if std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr) == addr {
                    let index = libc::if_nametoindex(ifa.ifa_name);
                    found = (index != 0).then_some(index);
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: the list getifaddrs allocated above, freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// Gives the allocator's free memory back to the system (glibc keeps it
/// otherwise); nothing elsewhere.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// An inotify instance watching one directory (non-blocking, closed on
/// exec and when dropped).
#[derive(Debug)]
pub(crate) struct Inotify(OwnedFd);

impl Inotify {
    /// Watches `dir` for files moved in or out, deleted or closed after a
    /// write; `None` where inotify is not available.
    pub(crate) fn watch(dir: &Path) -> Option<Inotify> {
        // SAFETY: inotify_init1 has no memory preconditions; a non-negative
        // result is a new descriptor, owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is fresh and owned by nobody else.
        let w = Inotify(unsafe { OwnedFd::from_raw_fd(fd) });
        w.add(dir).then_some(w)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Watches `dir` again on this descriptor (the directory was removed
    /// and made again: its watch went with it); whether it could.
    pub(crate) fn add(&self, dir: &Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return false;
        };
        let mask = libc::IN_MOVED_TO | libc::IN_MOVED_FROM | libc::IN_DELETE | libc::IN_CLOSE_WRITE;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        unsafe { libc::inotify_add_watch(self.fd(), path.as_ptr(), mask) >= 0 }
    }

    /// Reads pending events into `buf`: the bytes read, 0 when none are
    /// pending (or on an error).
    pub(crate) fn read(&self, buf: &mut [u8]) -> usize {
        // SAFETY: reads at most `buf.len()` bytes into `buf`; the
        // descriptor is non-blocking.
        let n = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
        usize::try_from(n).unwrap_or(0)
    }
}

/// A file mapped shared into this process (a shared-memory segment in
/// `/dev/shm`, docs/shared-memory.md): other processes map the same file
/// and see every write. Reads and writes go through raw pointers and
/// atomics, never through a `&mut` to the mapping, so that this process
/// holds no exclusive reference to memory others write.
#[derive(Debug)]
pub(crate) struct SharedMap {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes anyway;
// every access goes through atomics or raw copies (see the methods).
unsafe impl Send for SharedMap {}
// SAFETY: as above: no method hands out a `&mut`, and the atomics are the
// synchronisation.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Maps `len` bytes of `file` (opened for reading and writing), shared.
    pub(crate) fn map(file: &std::fs::File, len: usize) -> std::io::Result<SharedMap> {
        if len == 0 {
            return Err(std::io::Error::other("an empty segment"));
        }
        // SAFETY: a new mapping at an address the kernel picks, of a file
        // descriptor that is open for the call; nothing else aliases it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap gave a null address"))?;
        Ok(SharedMap { ptr, len })
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `len` bytes at `offset` lie inside the mapping.
    fn holds(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The 64-bit atomic at `offset` (8-aligned, inside the mapping).
    pub(crate) fn atomic_u64(&self, offset: usize) -> Option<&std::sync::atomic::AtomicU64> {
        if offset % 8 != 0 || !self.holds(offset, 8) {
            return None;
        }
        // SAFETY: in bounds and aligned (the mapping is page-aligned);
        // `AtomicU64` has the layout of a `u64` and is only ever accessed
        // atomically by every process that maps the segment.
        Some(unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU64>()
        })
    }

    /// The 32-bit atomic at `offset` (4-aligned, inside the mapping).
    pub(crate) fn atomic_u32(&self, offset: usize) -> Option<&std::sync::atomic::AtomicU32> {
        if offset % 4 != 0 || !self.holds(offset, 4) {
            return None;
        }
        // SAFETY: as for `atomic_u64`.
        Some(unsafe {
            &*self
                .ptr
                .as_ptr()
                .add(offset)
                .cast::<std::sync::atomic::AtomicU32>()
        })
    }

    /// The bytes at `offset` (a reader, of a slot it leases).
    pub(crate) fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if !self.holds(offset, len) {
            return None;
        }
        // SAFETY: in bounds. The writer does not write a slot a reader
        // leases (docs/shared-memory.md, "Leases"); the bytes are plain
        // `u8`, valid whatever they hold.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; every
        // reference into it borrows `self`, so none outlives this.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Asks the kernel to start writing a range of `file` to its disk now
/// rather than when its dirty pages age or pile up (a recording: the sync
/// at its end then waits for the last chunk only, and a long one never
/// holds gigabytes of unwritten pages). It does not wait, unless the
/// device's queue is full (a disk slower than the stream slows the
/// writer); a failure only means the pages are written later.
pub fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (
        libc::off64_t::try_from(offset),
        libc::off64_t::try_from(len),
    ) else {
        return;
    };
    // SAFETY: `file` is open for the call; the flag only starts writeback
    // of the range and touches no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Allocates disk blocks for `len` bytes of `file` from `offset` on
/// without changing its size (`fallocate` with `FALLOC_FL_KEEP_SIZE`): a
/// file written in order then costs the kernel less per page (no delayed
/// allocation to reserve and convert). Blocks past the end are given back
/// by truncating the file to its size. Best effort: false if the file
/// system cannot (then writes allocate as usual).
pub fn preallocate(file: &std::fs::File, offset: u64, len: u64) -> bool {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return false;
    };
    // SAFETY: fallocate only reads its integer arguments; the descriptor
    // is open for the call.
    unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, offset, len) == 0 }
}

/// Allocates the `len` bytes of `file` from `offset` on
/// (`posix_fallocate`), so that a full file system is an error here rather
/// than a SIGBUS when a page of its mapping is first written.
pub(crate) fn allocate(file: &std::fs::File, offset: usize, len: usize) -> std::io::Result<()> {
    let too_large = |_| std::io::Error::other("too large");
    let offset = libc::off_t::try_from(offset).map_err(too_large)?;
    let len = libc::off_t::try_from(len).map_err(too_large)?;
    // SAFETY: posix_fallocate only reads its integer arguments; the
    // descriptor is open for the call.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), offset, len) } {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

/// A writable window of a [`SharedMap`]: a slot reserved for one owner
/// to fill (a publisher's loan, docs/shared-memory.md). Made only for a
/// range no other window covers and no reader leases (a reserved slot);
/// not `Clone`, so the `&mut` it gives is the only one.
#[derive(Debug)]
pub(crate) struct SharedWindow {
    map: std::sync::Arc<SharedMap>,
    offset: usize,
    len: usize,
}

impl SharedWindow {
    /// The window of `len` bytes at `offset`, if inside the mapping. The
    /// caller promises that it is the range's only window (see above).
    pub(crate) fn new(map: std::sync::Arc<SharedMap>, offset: usize, len: usize) -> Option<Self> {
        map.holds(offset, len)
            .then_some(SharedWindow { map, offset, len })
    }

    /// The mapping it is a window of.
    pub(crate) fn map(&self) -> &SharedMap {
        &self.map
    }

    /// Its bytes, to fill.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: in bounds (checked in `new`); the window is the range's
        // only one and `&mut self` makes this borrow exclusive within this
        // process; readers elsewhere do not read it before the owner
        // publishes it (its stamp is odd until then).
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr.as_ptr().add(self.offset), self.len) }
    }

    /// Its bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.map.bytes(self.offset, self.len).unwrap_or_default()
    }
}

/// Test helpers that need the C library too.
#[cfg(test)]
pub(crate) mod testing {
    /// Sends `signal` to `pid` (a positive `pid_t`, or nothing is sent).
    pub(crate) fn kill(pid: u32, signal: i32) {
        if let Ok(pid @ 1..) = libc::pid_t::try_from(pid) {
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Makes a named pipe at `path`; whether it was made.
    pub(crate) fn mkfifo(path: &std::path::Path) -> bool {
        use std::os::unix::ffi::OsStrExt;
        let Ok(p) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: a NUL-terminated path that outlives the call.
        unsafe { libc::mkfifo(p.as_ptr(), 0o600) == 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Broken, a process killed and not yet reaped (a zombie) counts as
    /// alive until the 5 s full check.
    #[test]
    fn a_killed_process_has_ended_before_its_parent_reaps_it() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut fds = Pidfds::default();
        assert!(fds.ended(&[pid, std::process::id()]).is_empty());
        testing::kill(pid, libc::SIGKILL);
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while fds.ended(&[pid, std::process::id()]) != [pid] {
            assert!(
                std::time::Instant::now() < end,
                "the killed child is never seen ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(
            pid_exists(pid),
            "not reaped yet: kill(pid, 0) still finds it"
        );
        child.wait().unwrap();
        assert_eq!(fds.ended(&[pid]), [pid]);
        assert!(
            fds.ended(&[std::process::id()]).is_empty(),
            "its descriptor closed, ours open"
        );
        assert_eq!(fds.0.len(), 1);
    }
}
