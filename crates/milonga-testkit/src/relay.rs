//! The delay of a bed's link, in user space (this kernel has no
//! `sch_netem`): two threads in the switch's namespace copy the Ethernet
//! frames between a host's switch port and the bridge, each frame held
//! for the link's delay plus a random share of its jitter. Frames leave
//! in the order of their due time, so a jitter larger than the gap
//! between two frames reorders them, as netem's does.
//!
//! ```text
//!   host eth0 ── h<i> ⇄ relay ⇄ d<i>a ── d<i>b ── br0
//! ```
//!
//! Raw (`AF_PACKET`) sockets see frames as the kernel hands them over:
//! with segmentation or checksum offload on, a "frame" may be 64 KiB long
//! or lack its checksum, and could not be sent on. The bed turns those
//! offloads off on every host's `eth0` before the first relay starts
//! ([`offloads_off`]).

use std::collections::BinaryHeap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most frames held per direction; more are dropped (netem's `limit`).
pub(crate) const MAX_HELD: usize = 10_000;

/// A link's delay and jitter, in microseconds, changed while it runs.
#[derive(Debug, Default)]
pub(crate) struct Shape {
    pub(crate) delay_us: AtomicU64,
    pub(crate) jitter_us: AtomicU64,
    /// Frames sent on, both directions.
    pub(crate) frames: AtomicU64,
    /// Frames sent on before one that arrived earlier (reordered).
    pub(crate) reordered: AtomicU64,
    /// Frames dropped: [`MAX_HELD`] were held.
    pub(crate) dropped: AtomicU64,
}

/// The two threads of one link; stopped and joined when dropped.
#[derive(Debug)]
pub(crate) struct Relay {
    pub(crate) shape: Arc<Shape>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves the calling thread into namespace `netns` (only this thread).
fn enter(netns: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{netns}");
    let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: setns on an open namespace file; it changes this thread only.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "setns {netns}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Runs `f` on a thread of its own in namespace `netns`.
fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let netns = netns.to_owned();
    std::thread::spawn(move || enter(&netns).and_then(|()| f()))
        .join()
        .map_err(|_| "a namespace thread panicked".to_owned())?
}

/// Turns off segmentation, checksum and scatter-gather offloads of `dev`
/// in `netns` (the legacy ethtool ioctls, so that no `ethtool` binary is
/// needed).
pub(crate) fn offloads_off(netns: &str, dev: &str) -> Result<(), String> {
    if dev.len() >= libc::IFNAMSIZ {
        return Err(format!(
            "{dev:?}: an interface name is shorter than {} bytes",
            libc::IFNAMSIZ
        ));
    }
    let dev = dev.to_owned();
    in_netns(netns, move || {
        #[repr(C)]
        struct EthtoolValue {
            cmd: u32,
            data: u32,
        }
        #[repr(C)]
        struct Ifreq {
            name: [u8; libc::IFNAMSIZ],
            data: *mut EthtoolValue,
            _pad: [u8; 16],
        }
        const SIOCETHTOOL: libc::c_ulong = 0x8946;
        const STXCSUM: u32 = 0x17;
        const SSG: u32 = 0x19;
        const STSO: u32 = 0x1f;
        const SGSO: u32 = 0x24;
        const SGRO: u32 = 0x2c;
        // SAFETY: a plain datagram socket, owned at once.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        if fd < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is a new descriptor nobody else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        for cmd in [STSO, SGSO, SGRO, SSG, STXCSUM] {
            let mut v = EthtoolValue { cmd, data: 0 };
            let mut req = Ifreq {
                name: [0; libc::IFNAMSIZ],
                data: &mut v,
                _pad: [0; 16],
            };
            req.name[..dev.len()].copy_from_slice(dev.as_bytes());
            // SAFETY: the ifreq and the value it points to live across
            // the call.
            if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req) } != 0 {
                return Err(format!(
                    "ethtool {cmd:#x} off on {dev}: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        Ok(())
    })
}

/// A raw socket of namespace `netns` bound to interface `dev`, reading
/// every frame, with a 50 ms receive timeout (so that a stop is seen).
fn packet_socket(dev: &str) -> Result<(OwnedFd, i32), String> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: socket(2), owned at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
    if fd < 0 {
        return Err(format!(
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd is a new descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = CString::new(dev).map_err(|_| "a NUL in a device name".to_owned())?;
    // SAFETY: a NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) } as i32;
    if ifindex == 0 {
        return Err(format!("no interface {dev}"));
    }
    // SAFETY: sockaddr_ll is plain data; zeroed is a valid start.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = ifindex;
    // SAFETY: binds to a filled sockaddr_ll of the right size.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if rc != 0 {
        return Err(format!(
            "bind to {dev}: {}",
            std::io::Error::last_os_error()
        ));
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 50_000,
    };
    // SAFETY: a timeval of the right size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
    }
    Ok((sock, ifindex))
}

/// A frame waiting for its time; the earliest first out of the heap.
struct Held {
    due: Instant,
    n: u64,
    frame: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.n) == (o.due, o.n)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.n).cmp(&(self.due, self.n))
    }
}

/// A small xorshift generator: the jitter needs spread, not quality.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 {
            0
        } else {
            self.0 % n
        }
    }
}

/// Copies frames arriving on `from` to `to`, each after the shape's delay;
/// says on `ready` when its sockets are bound.
fn pump(
    from: &str,
    to: &str,
    shape: &Shape,
    stop: &AtomicBool,
    seed: u64,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) -> Result<(), String> {
    let bound = packet_socket(from).and_then(|rx| Ok((rx, packet_socket(to)?)));
    let ((rx, _), (tx, _)) = match bound {
        Ok(b) => {
            let _ = ready.send(Ok(()));
            b
        }
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    let mut held = BinaryHeap::new();
    let mut rng = Rng(seed | 1);
    let mut n = 0u64;
    let mut last_sent = 0u64;
    let mut buf = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        // Send what is due, then wait for a frame at most until the next.
        let now = Instant::now();
        while held.peek().is_some_and(|h: &Held| h.due <= now) {
            let h = held.pop().expect("peeked");
            shape.frames.fetch_add(1, Ordering::Relaxed);
            if h.n < last_sent {
                shape.reordered.fetch_add(1, Ordering::Relaxed);
            }
            last_sent = last_sent.max(h.n);
            // SAFETY: sends a buffer of its length on a bound socket.
            unsafe {
                libc::send(tx.as_raw_fd(), h.frame.as_ptr().cast(), h.frame.len(), 0);
            }
        }
        // Rounded down: the last fraction of a millisecond is spun, so
        // that a 1 ms delay is 1 ms, not 2.
        let wait_ms = held.peek().map_or(50, |h: &Held| {
            h.due.saturating_duration_since(now).as_millis() as i32
        });
        let mut pfd = libc::pollfd {
            fd: rx.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd.
        if unsafe { libc::poll(&mut pfd, 1, wait_ms.min(50)) } <= 0 {
            continue;
        }
        loop {
            // SAFETY: sockaddr_ll is plain data.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: receives into a buffer of its length.
            let got = unsafe {
                libc::recvfrom(
                    rx.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if got <= 0 {
                break;
            }
            // What the other direction sent out of this port shows here
            // too: not ours to copy.
            if sll.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            if held.len() >= MAX_HELD {
                shape.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let delay = shape.delay_us.load(Ordering::Relaxed);
            let jitter = rng.below(shape.jitter_us.load(Ordering::Relaxed) + 1);
            n += 1;
            held.push(Held {
                due: Instant::now() + Duration::from_micros(delay + jitter),
                n,
                frame: buf[..got as usize].to_vec(),
            });
        }
    }
    Ok(())
}

/// Starts the relay of a link in namespace `netns` between the host's
/// port `port` and the bridge side `inner`; returns once both directions
/// are bound.
pub(crate) fn start(
    netns: &str,
    port: &str,
    inner: &str,
    shape: Arc<Shape>,
) -> Result<Relay, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut relay = Relay {
        shape,
        stop,
        threads: Vec::new(),
    };
    for (k, (from, to)) in [(port, inner), (inner, port)].into_iter().enumerate() {
        let (netns, from, to) = (netns.to_owned(), from.to_owned(), to.to_owned());
        let (shape, stop) = (relay.shape.clone(), relay.stop.clone());
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let t = std::thread::Builder::new()
            .name(format!("bed-relay-{from}"))
            .spawn(move || {
                let seed = seed.wrapping_add(k as u64);
                let r = match enter(&netns) {
                    Ok(()) => pump(&from, &to, &shape, &stop, seed, ready_tx),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.clone()));
                        Err(e)
                    }
                };
                if let Err(e) = r {
                    eprintln!("bed relay {from} -> {to} stopped: {e}");
                }
            })
            .map_err(|e| format!("spawn a relay thread: {e}"))?;
        relay.threads.push(t);
        ready
            .recv()
            .map_err(|_| "a relay thread ended before binding".to_owned())??;
    }
    Ok(relay)
}

/// An eavesdropper on one link: a thread in the switch's namespace reading
/// every frame that crosses a host's switch port (both directions) with an
/// `AF_PACKET` socket, keeping up to 64 MiB.
#[derive(Debug)]
pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<u8>>>,
}

/// Most bytes a [`Capture`] keeps; later frames are not kept.
pub const MAX_CAPTURED: usize = 64 << 20;

impl Capture {
    /// Stops listening: every byte of every frame seen, frames one after
    /// the other.
    pub fn finish(mut self) -> Vec<u8> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts capturing on `dev` in namespace `netns`.
pub(crate) fn capture(netns: &str, dev: &str) -> Result<Capture, String> {
    let dev = dev.to_owned();
    let (sock, _) = in_netns(netns, move || packet_socket(&dev))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65_536 + 128];
        while !stopped.load(Ordering::Relaxed) {
            // SAFETY: reads into a buffer of the length given.
            let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n > 0 && out.len() < MAX_CAPTURED {
                out.extend_from_slice(&buf[..n as usize]);
            }
        }
        out
    });
    Ok(Capture {
        stop,
        thread: Some(thread),
    })
}
