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
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: inotify_init1 has no memory preconditions; a non-negative
        // result is a new descriptor, owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: `fd` is fresh and owned by nobody else.
        let w = Inotify(unsafe { OwnedFd::from_raw_fd(fd) });
        let mask = libc::IN_MOVED_TO | libc::IN_MOVED_FROM | libc::IN_DELETE | libc::IN_CLOSE_WRITE;
        // SAFETY: `path` is a NUL-terminated string that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(w.fd(), path.as_ptr(), mask) };
        (wd >= 0).then_some(w)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
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
