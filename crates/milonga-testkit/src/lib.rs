//! Test helpers for Milonga: temporary directories, bounded waits, child
//! processes that are killed when the test ends, RSS/fd sampling, and a
//! bed of network namespaces for tests across hosts ([`netbed`]).
#![deny(missing_docs)]
// `unsafe` lives in `sys` and in `relay` (raw sockets, namespaces) alone.
#![deny(unsafe_code)]

pub mod etcd;
pub mod netbed;
#[allow(unsafe_code)]
mod relay;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A directory removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `/tmp/milonga-test-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "mlg-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `cond` every 5 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        poll_until(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// Polls `cond` every 5 ms until it holds or `timeout` passes; whether it
/// held. For waits that must not panic (in a handler, in a helper thread).
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A child process whose stdout lines are read in the background; killed
/// (SIGKILL) when dropped, so that a failing test leaves nothing running.
#[derive(Debug)]
pub struct Proc {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    /// Spawns `cmd` with stdout piped. The child is killed when the thread
    /// that spawned it ends, even if the test process aborts (a stack
    /// overflow skips every `Drop`): `PR_SET_PDEATHSIG`.
    pub fn spawn(mut cmd: std::process::Command) -> Proc {
        cmd.stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null());
        sys::kill_with_parent(&mut cmd);
        let mut child = cmd.spawn().expect("spawn child process");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, lines }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line, waiting at most `timeout`.
    pub fn line(&self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Sends `signal` (libc number) to the process.
    pub fn signal(&self, signal: i32) {
        sys::signal(self.child.id(), signal);
    }

    /// SIGKILL, then reap.
    pub fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Waits at most `timeout` for the process to exit; its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resident set size of process `pid`, in KiB (from /proc).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Number of open file descriptors of process `pid`.
pub fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// `Err` naming the first sequence number out of place unless `seqs` is
/// exactly 1, 2, ... `sent`: every sample once, in order.
pub fn in_order_from_1(seqs: &[u64], sent: u64) -> Result<(), String> {
    if let Some((got, want)) = seqs.iter().zip(1..).find(|(got, want)| **got != *want) {
        return Err(format!(
            "sample {want} expected, {got} came ({} of {sent} received)",
            seqs.len()
        ));
    }
    if seqs.len() as u64 != sent {
        return Err(format!("{} of {sent} samples received", seqs.len()));
    }
    Ok(())
}

/// Garbage at the TCP endpoint `tcp://HOST:PORT`, on two connections of
/// its own: a ZMTP greeting with a mechanism nobody speaks followed by
/// junk, and bytes that are not ZMTP at all (which libzmq may read as a
/// ZMTP 1.0 peer's messages). The connections close when this returns.
pub fn zmtp_garbage(endpoint: &str) {
    use std::io::Write;
    let addr = endpoint.strip_prefix("tcp://").expect("tcp://HOST:PORT");
    let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0];
    greeting.extend_from_slice(b"GARBAGE\0\0\0\0\0\0\0\0\0\0\0\0\0");
    greeting.push(0);
    greeting.extend_from_slice(&[0u8; 31]);
    greeting.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef].repeat(64));
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let _ = s.write_all(&greeting);
    let mut s2 = std::net::TcpStream::connect(addr).expect("connect");
    let _ = s2.write_all(&[0x42; 512]);
}

/// A TCP port on 127.0.0.1 that was free a moment ago, below Linux's
/// ephemeral range (32768 and up by default): a port the kernel hands
/// out could be taken, before the test binds it (or binds it again after
/// killing its server), as the source port of any connection made
/// meanwhile (seen once: a broker restarted on its port found it in
/// use). Picked at random in 20000..32768 (from the clock and the
/// process id), checked free; the kernel's pick if none is found.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x =
        nanos ^ (u64::from(std::process::id()) << 32) ^ CALLS.fetch_add(1, Ordering::Relaxed);
    for _ in 0..64 {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let port = 20_000 + (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % 12_768;
        let port = port as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Start time of process `pid` in clock ticks after boot (field 22 of
/// /proc/pid/stat), as Milonga's local discovery records it.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A TCP proxy on the loopback that a test can cut: every connection made
/// to [`FaultProxy::port`] is forwarded to the upstream address, until
/// [`FaultProxy::cut`] closes them all (both sides see the connection
/// drop), and while [`FaultProxy::set_down`] holds, new connections are
/// closed as soon as they are accepted.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl FaultProxy {
    /// Starts forwarding a free port of 127.0.0.1 to `upstream`.
    pub fn start(upstream: std::net::SocketAddr) -> FaultProxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("address").port();
        let proxy = FaultProxy {
            port,
            conns: Default::default(),
            down: Default::default(),
            stop: Default::default(),
        };
        let (conns, down, stop) = (proxy.conns.clone(), proxy.down.clone(), proxy.stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                if down.load(Ordering::Acquire) {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                };
                let mut held = conns.lock().unwrap_or_else(|e| e.into_inner());
                if let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
                    client.try_clone(),
                    server.try_clone(),
                    client.try_clone(),
                    server.try_clone(),
                ) {
                    held.push(c3);
                    held.push(s3);
                    pipe(c2, server);
                    pipe(s2, client);
                }
            }
        });
        proxy
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes every connection now forwarded.
    pub fn cut(&self) {
        let mut held = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        for s in held.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// While `true`, new connections are closed as soon as accepted.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.cut();
        // Wake the accepting thread so that it sees `stop`.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Accounts for every sequence number of every stream (publisher, key) a
/// subscriber saw: delivered, or inside a reported loss. [`SeqLedger::check`]
/// fails on a duplicate, on a sample both delivered and reported lost, and
/// on a hole (a sequence number neither delivered nor reported) between the
/// first and the last sequence number of each stream.
#[derive(Debug, Default)]
pub struct SeqLedger {
    streams: std::collections::BTreeMap<(String, String), Stream>,
}

#[derive(Debug, Default)]
struct Stream {
    delivered: std::collections::BTreeSet<u64>,
    duplicates: Vec<u64>,
    /// Reported losses: first sequence number -> count.
    lost: Vec<(u64, u64)>,
}

/// What a [`SeqLedger`] holds of one stream, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accounted {
    /// Samples delivered.
    pub delivered: u64,
    /// Samples reported lost.
    pub lost: u64,
    /// The first and last sequence numbers accounted for.
    pub first: u64,
    /// See `first`.
    pub last: u64,
}

impl SeqLedger {
    /// A sample `seq` of (`publisher`, `key`) was delivered.
    pub fn sample(&mut self, publisher: &str, key: &str, seq: u64) {
        let s = self.stream(publisher, key);
        if !s.delivered.insert(seq) {
            s.duplicates.push(seq);
        }
    }

    /// `count` samples from `first_seq` on were reported lost.
    pub fn lost(&mut self, publisher: &str, key: &str, first_seq: u64, count: u64) {
        self.stream(publisher, key).lost.push((first_seq, count));
    }

    /// The highest sequence number delivered on (`publisher`, `key`).
    pub fn last_delivered(&self, publisher: &str, key: &str) -> Option<u64> {
        self.streams
            .get(&(publisher.to_owned(), key.to_owned()))
            .and_then(|s| s.delivered.last().copied())
    }

    fn stream(&mut self, publisher: &str, key: &str) -> &mut Stream {
        self.streams
            .entry((publisher.to_owned(), key.to_owned()))
            .or_default()
    }

    /// Checks every stream; what each holds, or what is wrong with it.
    pub fn check(&self) -> Result<Vec<Accounted>, String> {
        let mut out = Vec::new();
        for ((publisher, key), s) in &self.streams {
            let name = format!("{key} of {publisher}");
            if !s.duplicates.is_empty() {
                return Err(format!(
                    "{name}: {} duplicates, the first ones {:?}",
                    s.duplicates.len(),
                    &s.duplicates[..s.duplicates.len().min(5)]
                ));
            }
            let mut lost = std::collections::BTreeSet::new();
            for &(first, count) in &s.lost {
                if count > 1 << 24 {
                    return Err(format!("{name}: an absurd loss of {count} from {first}"));
                }
                for q in first..first + count {
                    if s.delivered.contains(&q) || !lost.insert(q) {
                        return Err(format!(
                            "{name}: seq {q} reported lost twice or also delivered"
                        ));
                    }
                }
            }
            let all: std::collections::BTreeSet<u64> = s.delivered.union(&lost).copied().collect();
            let (Some(&first), Some(&last)) = (all.first(), all.last()) else {
                continue;
            };
            if (last - first + 1) as usize != all.len() {
                let hole = (first..=last).find(|q| !all.contains(q)).unwrap_or(0);
                return Err(format!(
                    "{name}: {} sequence numbers between {first} and {last} neither delivered nor reported lost (the first: {hole})",
                    (last - first + 1) as usize - all.len()
                ));
            }
            out.push(Accounted {
                delivered: s.delivered.len() as u64,
                lost: lost.len() as u64,
                first,
                last,
            });
        }
        Ok(out)
    }
}

/// The calls into the C library, each behind a safe function.
#[allow(unsafe_code)]
mod sys {
    /// Makes `cmd`'s process get SIGKILL when the thread that spawned it
    /// ends (`PR_SET_PDEATHSIG`).
    pub(crate) fn kill_with_parent(cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the child between fork and exec, and
        // only calls prctl, which is async-signal-safe and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }

    /// Sends `signal` to process `pid` (a child of ours); a pid that is
    /// not a positive `pid_t` is ignored (kill would signal a group).
    pub(crate) fn signal(pid: u32, signal: i32) {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return;
        };
        if pid > 0 {
            // SAFETY: kill(2) has no memory preconditions.
            unsafe { libc::kill(pid, signal) };
        }
    }
}
