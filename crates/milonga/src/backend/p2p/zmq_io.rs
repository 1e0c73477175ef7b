//! Everything that touches libzmq beyond the safe `zmq` crate: the process
//! context, socket options the crate does not expose, and zero-copy send and
//! receive. With util/sys.rs (the C library), the only module with `unsafe`.

use std::os::raw::{c_int, c_void};
use std::sync::Mutex;

use bytes::Bytes;

use crate::model::config::Config;
use crate::model::error::OpenError;
use crate::model::error::{IntoTransport, TransportError};

/// Nodes of one process share one context, so that `inproc://` endpoints
/// reach between them. The first node creates it; the last node to close
/// releases this module's reference. Every socket holds a reference too
/// (the `zmq` crate's design), so the context is terminated, which lets
/// queued messages leave within each socket's linger, when the last socket
/// closes. A node opened while an earlier generation's sockets still live
/// gets a fresh context and cannot reach their `inproc://` endpoints.
///
/// A process forked from one with a context gets a copy of it whose
/// threads stayed with the parent and whose wake-up file descriptors are
/// the parent's: a socket made on it (a node opened in the child) would
/// wake the parent's threads with commands they never find, and libzmq
/// aborts the parent. The first node of the child leaves that copy alone
/// and makes a context of its own.
static CONTEXT: Mutex<Shared> = Mutex::new(Shared {
    refs: 0,
    ctx: None,
    zap: None,
    pid: 0,
});

/// What [`CONTEXT`] guards.
struct Shared {
    refs: usize,
    /// The process that made `ctx`.
    pid: u32,
    ctx: Option<zmq::Context>,
    /// The ZAP handler, once a secured node opened: it lives as long as
    /// the context, so that no secured socket is ever without it.
    zap: Option<Zap>,
}

/// A reference on the process context; dropping the last one terminates it.
/// Its second field is the process that took it: one dropped in a forked
/// child is let go without a word to libzmq or to [`CONTEXT`].
pub(crate) struct ContextRef(Option<zmq::Context>, u32);

impl ContextRef {
    pub(crate) fn acquire() -> ContextRef {
        let mut g = CONTEXT.lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        if g.ctx.is_some() && g.pid != pid {
            // Forked: the parent's context and handler are never touched
            // here, not even to be released.
            std::mem::forget(g.ctx.take());
            std::mem::forget(g.zap.take());
            g.refs = 0;
        }
        g.pid = pid;
        g.refs += 1;
        let ctx = g.ctx.get_or_insert_with(|| {
            let c = zmq::Context::new();
            // One I/O thread per 1 GB/s is libzmq's guidance; one is right
            // for these sizes, and every extra thread costs memory.
            let _ = c.set_io_threads(1);
            c
        });
        ContextRef(Some(ctx.clone()), pid)
    }

    /// Starts the process's ZAP handler if it is not running: every
    /// secured node's listening sockets ask it who may connect.
    pub(crate) fn ensure_zap(&self) -> Result<(), OpenError> {
        let mut g = CONTEXT.lock().unwrap_or_else(|e| e.into_inner());
        if g.zap.is_none() {
            g.zap = Some(Zap::start(self)?);
        }
        Ok(())
    }

    pub(crate) fn socket(&self, kind: zmq::SocketType) -> Result<zmq::Socket, OpenError> {
        self.0
            .as_ref()
            .expect("context is present until drop")
            .socket(kind)
            .map_err(|source| OpenError::Socket {
                action: "create a socket for",
                endpoint: format!("{kind:?}"),
                source: source.transport(),
            })
    }
}

impl Drop for ContextRef {
    fn drop(&mut self) {
        let mine = self.0.take();
        if self.1 != std::process::id() {
            std::mem::forget(mine);
            return;
        }
        let (last, zap) = {
            let mut g = CONTEXT.lock().unwrap_or_else(|e| e.into_inner());
            g.refs -= 1;
            if g.refs == 0 {
                (g.ctx.take(), g.zap.take())
            } else {
                (None, None)
            }
        };
        // The handler's sockets hold the context: it goes first.
        drop(zap);
        drop(mine);
        // Dropped outside the lock: if it is the last reference, zmq_ctx_term
        // waits for sockets' linger, and a new node may open meanwhile.
        drop(last);
    }
}

/// Options every Milonga socket gets: libzmq's defaults (no heartbeats, no
/// size limit, infinite linger) are wrong for a control system.
pub(crate) fn apply_common(sock: &zmq::Socket, cfg: &Config) -> zmq::Result<()> {
    sock.set_heartbeat_ivl(cfg.heartbeat_interval_ms)?;
    sock.set_heartbeat_timeout(cfg.heartbeat_timeout_ms)?;
    // The TTL a PING carries travels in tenths of a second (16 bits, and
    // libzmq multiplies it back in 16 bits): rounded up, so that it never
    // comes out shorter than the lease or 0 (never), and at most 65.5 s.
    sock.set_heartbeat_ttl(((cfg.heartbeat_timeout_ms.max(1) + 99) / 100 * 100).min(65_500))?;
    sock.set_handshake_ivl(cfg.handshake_timeout_ms.max(1))?;
    sock.set_maxmsgsize(i64::try_from(cfg.max_message_bytes).unwrap_or(i64::MAX))?;
    // libzmq takes 0 for a queue without a bound: at least 1.
    sock.set_sndhwm(cfg.send_hwm.max(1))?;
    sock.set_rcvhwm(cfg.recv_hwm.max(1))?;
    sock.set_linger(0)?;
    sock.set_reconnect_ivl(100)?;
    sock.set_reconnect_ivl_max(2000)?;
    if cfg.tcp_buffer_bytes > 0 {
        sock.set_sndbuf(cfg.tcp_buffer_bytes)?;
        sock.set_rcvbuf(cfg.tcp_buffer_bytes)?;
    }
    Ok(())
}

/// Options of a socket that receives data and stops reading it when its
/// reader is behind (a subscription's, a broker's upstream XSUB): the
/// back-pressure of reliable delivery (docs/guarantees.md).
///
/// libzmq's heartbeat timeout runs from each PING this socket sends and
/// ends at the next message it *reads*; a socket that stops reading
/// because its application is slow would time out its own healthy
/// connection after `heartbeat_timeout_ms`, and what the publisher sent
/// meanwhile would go to no one. So it never times out on its own; it
/// sends PINGs on its data connections (chosen per connection with
/// [`set_pings`]): they keep the publisher's side of a connection that
/// is not read from open, and a frozen process sends none and is dropped
/// there. A peer whose host dies is noticed by
/// the kernel ([`kernel_liveness`]), and a peer process that dies closes
/// the connection at once.
pub(crate) fn apply_receiving(sock: &mut zmq::Socket, cfg: &Config) -> zmq::Result<()> {
    sock.set_heartbeat_timeout(0)?;
    kernel_liveness(sock, cfg)
}

/// Whether the connections `sock` makes from now on send ZMTP PINGs
/// (libzmq copies a socket's options into each connection it makes).
/// PINGs cost both ends' I/O threads a wake-up per connection per
/// interval (a hundred subscribers of a hundred publishers on one host:
/// 20,000 connections, more than two cores could answer when both sides
/// of each sent them), so only the data connections get them: their
/// publisher closes a connection whose subscriber stops sending them.
pub(crate) fn set_pings(sock: &zmq::Socket, cfg: &Config, on: bool) -> zmq::Result<()> {
    sock.set_heartbeat_ivl(if on { cfg.heartbeat_interval_ms } else { 0 })
}

/// Options of a socket that sends no ZMTP PINGs of its own but answers
/// its peers' and closes a connection whose peer stops sending them, a
/// TTL (the peer's `heartbeat_timeout_ms`) after the last: a best-effort
/// data socket, whose subscribers PING it. Its side costs a `PONG` per
/// connection per interval, not a `PING` and a `PONG`. Not
/// `TCP_USER_TIMEOUT`: the kernel would then abort a connection whose
/// subscriber reads slowly (a zero window for longer than the timeout),
/// where a best-effort subscriber that is behind must only lose samples
/// at its high-water mark.
pub(crate) fn answer_pings(sock: &mut zmq::Socket) -> zmq::Result<()> {
    sock.set_heartbeat_ivl(0)?;
    sock.set_heartbeat_timeout(0)
}

/// A dead peer host noticed by the kernel, at no cost to libzmq: by
/// `TCP_USER_TIMEOUT` at the lease where data goes unacknowledged, and by
/// TCP keep-alive probes on a connection idle for a lease, a second
/// apart (the user timeout then ends it at the first probe unanswered a
/// lease after the last sign of life).
fn kernel_liveness(sock: &mut zmq::Socket, cfg: &Config) -> zmq::Result<()> {
    // Linux refuses an idle time over 32,767 s, and libzmq then fails
    // the connection.
    let lease_s = (cfg.heartbeat_timeout_ms.max(1).saturating_add(999) / 1000).min(32_767);
    sock.set_tcp_keepalive(1)?;
    sock.set_tcp_keepalive_idle(lease_s)?;
    sock.set_tcp_keepalive_intvl(1)?;
    sock.set_tcp_keepalive_cnt(3)?;
    set_int(
        sock,
        zmq_sys::ZMQ_TCP_MAXRT,
        cfg.heartbeat_timeout_ms.max(1),
    )
}

/// Options of a socket that needs no ZMTP heartbeats: its peers'
/// liveness is told another way. A broker's listen ROUTER and the DEALERs
/// that speak to it (clients' attaches, registry renewals, federated
/// peers' link messages: the renewals say who is there); a node's
/// liveliness XPUB (its heartbeats are the lease; a subscriber that reads
/// nothing fills its connection only after thousands of them, and a
/// window closed for longer than the lease then ends the connection,
/// which it makes again when it reads).
/// libzmq keeps each connection's heartbeat timers in one ordered map per
/// I/O thread and cancels them with a linear search, which a thousand
/// registry nodes made 27% of an idle broker's time, and every PING wakes
/// both ends. A dead host is still noticed by the kernel
/// ([`kernel_liveness`]).
pub(crate) fn apply_leased(sock: &mut zmq::Socket, cfg: &Config) -> zmq::Result<()> {
    sock.set_heartbeat_ivl(0)?;
    sock.set_heartbeat_timeout(0)?;
    sock.set_heartbeat_ttl(0)?;
    kernel_liveness(sock, cfg)
}

/// libzmq's `ZMQ_OUT_BATCH_SIZE` (draft API, `zmq.h` of 4.3.5; the vendored
/// libzmq is built with it, see the `zeromq-src-curve` crate).
const ZMQ_OUT_BATCH_SIZE: u32 = 102;

/// How many bytes of queued messages a data socket's connection gathers
/// into one `send` (libzmq's default is 8 KiB): 128 KiB, the size of the
/// largest batch (`MAX_BATCH_BYTES`). Small samples that a publisher did
/// not batch, and frames a broker forwards, leave about 32 to a system
/// call instead of two; a broker, which receives and sends every byte,
/// spent about a quarter less CPU per 4 KiB sample (docs/benchmarks.md,
/// "Batch sizes"; docs/internals.md §4). The price: libzmq copies a
/// message into this buffer up to its size before it sends the rest of
/// the message in place, so a large message has its first 128 KiB copied
/// where 8 KiB were, per connection (within the noise of the 1 MiB runs,
/// peer-to-peer and through a broker: docs/benchmarks.md). The buffer is
/// per connection; its pages are touched once data queues.
const DATA_OUT_BATCH_BYTES: c_int = crate::engine::batch::MAX_BATCH_BYTES as c_int;

/// Options of a socket that sends samples (a publisher's data socket, a
/// broker's XPUBs): see [`DATA_OUT_BATCH_BYTES`].
pub(crate) fn apply_sending(sock: &mut zmq::Socket) -> zmq::Result<()> {
    set_int(sock, ZMQ_OUT_BATCH_SIZE, DATA_OUT_BATCH_BYTES)
}

/// libzmq's `ZMQ_IN_BATCH_SIZE` (draft API, as above).
const ZMQ_IN_BATCH_SIZE: u32 = 101;

/// How many bytes a broker's upstream socket reads from a connection in
/// one `recv` (libzmq's default is 8 KiB): 32 KiB, about eight unbatched
/// 4 KiB samples a call instead of two; the broker spent a tenth to a
/// fifth less CPU per 4 KiB sample, inside the spread of single runs
/// (docs/benchmarks.md, "Batch sizes"). Not more: libzmq allocates a new
/// read buffer, with a reference counter for every message that could
/// fit in it (about 40 bytes per 33 bytes of buffer), for each read while
/// received messages still hold the last one, and past glibc's 128 KiB
/// threshold each allocation is a fresh mapping the kernel zeroes (at
/// 128 KiB, 9% of a broker's `perf` samples were page faults).
/// A message larger than the buffer is read straight into the message.
const RELAY_IN_BATCH_BYTES: c_int = 32 * 1024;

/// Options of a broker's socket that receives frames to forward (its
/// upstream XSUBs): see [`RELAY_IN_BATCH_BYTES`].
pub(crate) fn apply_relaying(sock: &mut zmq::Socket) -> zmq::Result<()> {
    set_int(sock, ZMQ_IN_BATCH_SIZE, RELAY_IN_BATCH_BYTES)
}

fn set_int(sock: &mut zmq::Socket, option: u32, value: c_int) -> zmq::Result<()> {
    // SAFETY: the socket pointer is valid for the life of `sock`, which we
    // borrow mutably so no other thread uses it; the option value is a c_int
    // of the size passed, as libzmq expects for these integer options.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            sock.as_mut_ptr(),
            option as c_int,
            (&value as *const c_int).cast::<c_void>(),
            std::mem::size_of::<c_int>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// ZMQ_ZAP_ENFORCE_DOMAIN (libzmq's number; a draft option in its
/// headers, always built): refuse every connection when no ZAP handler
/// answers, instead of letting it in unauthenticated.
const ZMQ_ZAP_ENFORCE_DOMAIN: u32 = 93;

/// Makes a CURVE server refuse connections when no ZAP handler answers.
pub(crate) fn set_zap_enforce(sock: &mut zmq::Socket) -> zmq::Result<()> {
    set_int(sock, ZMQ_ZAP_ENFORCE_DOMAIN, 1)
}

/// The Z85 public key (40 characters and a NUL) of a Z85 secret key
/// (NUL-terminated): 0, or -1 without CURVE.
pub(crate) fn curve_public(public: &mut [u8; 41], secret_z85: &[u8]) -> c_int {
    if secret_z85.len() != 41 || secret_z85[40] != 0 {
        return -1;
    }
    // SAFETY: both buffers are 41 bytes as libzmq requires, the secret
    // NUL-terminated (checked above); libzmq writes 41 bytes to `public`.
    unsafe { zmq_curve_public(public.as_mut_ptr().cast(), secret_z85.as_ptr().cast()) }
}

// libzmq's, linked with it; zmq-sys does not export its declaration.
extern "C" {
    fn zmq_curve_public(
        z85_public_key: *mut std::os::raw::c_char,
        z85_secret_key: *const std::os::raw::c_char,
    ) -> c_int;
}

/// The process's ZAP handler (RFC 27): a thread answering libzmq's
/// requests on `inproc://zeromq.zap.01` with the verdict of the node whose
/// socket asks (by ZAP domain, see `curve::admit`).
struct Zap {
    stop: zmq::Socket,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Zap {
    fn start(ctx: &ContextRef) -> Result<Zap, OpenError> {
        let err = |action: &'static str| {
            move |source: zmq::Error| OpenError::Socket {
                action,
                endpoint: "inproc://zeromq.zap.01".into(),
                source: source.transport(),
            }
        };
        let rep = ctx.socket(zmq::REP)?;
        rep.set_linger(0).map_err(err("configure"))?;
        rep.bind("inproc://zeromq.zap.01").map_err(err("bind"))?;
        let stop_rx = ctx.socket(zmq::PAIR)?;
        let stop = ctx.socket(zmq::PAIR)?;
        stop_rx.set_linger(0).map_err(err("configure"))?;
        stop.set_linger(0).map_err(err("configure"))?;
        stop_rx
            .bind("inproc://milonga-zap-stop")
            .map_err(err("bind"))?;
        stop.connect("inproc://milonga-zap-stop")
            .map_err(err("connect"))?;
        let thread = std::thread::Builder::new()
            .name("milonga-zap".into())
            .spawn(move || zap_loop(&rep, &stop_rx))
            .map_err(OpenError::Thread)?;
        Ok(Zap {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Zap {
    fn drop(&mut self) {
        let _ = self.stop.send(&[][..], 0);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn zap_loop(rep: &zmq::Socket, stop: &zmq::Socket) {
    loop {
        let mut items = [
            rep.as_poll_item(zmq::POLLIN),
            stop.as_poll_item(zmq::POLLIN),
        ];
        match zmq::poll(&mut items, -1) {
            Ok(_) => {}
            Err(zmq::Error::EINTR) => continue,
            Err(_) => return,
        }
        if items[1].is_readable() {
            return;
        }
        if !items[0].is_readable() {
            continue;
        }
        let Ok(frames) = rep.recv_multipart(0) else {
            continue;
        };
        let _ = rep.send_multipart(zap_reply(&frames), 0);
    }
}

/// The reply to one ZAP request: version, request id, status code and
/// text, user id (the key's name in the trust directory), metadata.
fn zap_reply(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let id = frames.get(1).cloned().unwrap_or_default();
    let reply = |code: &str, text: &str, user: &str| {
        vec![
            b"1.0".to_vec(),
            id.clone(),
            code.as_bytes().to_vec(),
            text.as_bytes().to_vec(),
            user.as_bytes().to_vec(),
            Vec::new(),
        ]
    };
    if frames.len() < 7 || frames[0] != b"1.0" {
        return reply("500", "malformed ZAP request", "");
    }
    let domain = String::from_utf8_lossy(&frames[2]);
    let address = String::from_utf8_lossy(&frames[3]);
    if frames[5] != b"CURVE" {
        return reply("400", "only CURVE is accepted", "");
    }
    // The user id is the key itself (Z85): a node learns a gossip asker
    // with the key its connection was admitted with.
    match super::curve::admit(&domain, &frames[6], &address) {
        Ok(key) => reply("200", "OK", &key),
        Err(why) => reply("400", why, ""),
    }
}

/// ZMQ_XPUB_NODROP: block (EAGAIN) instead of dropping at the HWM.
pub(crate) fn set_xpub_nodrop(sock: &mut zmq::Socket, on: bool) -> zmq::Result<()> {
    set_int(sock, zmq_sys::ZMQ_XPUB_NODROP, c_int::from(on))
}

/// ZMQ_XPUB_VERBOSER: pass every subscribe and unsubscribe to the
/// application, so that the publisher can count its subscribers.
pub(crate) fn set_xpub_verboser(sock: &mut zmq::Socket) -> zmq::Result<()> {
    set_int(sock, zmq_sys::ZMQ_XPUB_VERBOSER, 1)
}

/// Bytes of subscription prefixes libzmq has let go of since memory was
/// last handed back to the system.
static FREED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Notes that libzmq freed a subscription prefix of `bytes` (its last
/// subscriber left): libzmq keeps about 35 bytes per prefix byte in its
/// subscription trie, which glibc keeps once freed. See [`trim_if_due`].
pub(crate) fn note_freed(bytes: usize) {
    FREED.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    trim_if_due();
}

/// Prefix bytes freed after which the allocator is asked to give free
/// memory back: 64 KiB of prefixes is about 2 MiB of libzmq's trie, far
/// more than ordinary subscriptions (tens of bytes each) ever free.
const TRIM_AFTER: usize = 64 << 10;

/// Gives freed memory back to the system if 64 KiB of prefixes went since
/// the last trim, at most once a second (a trim walks the allocator's free
/// lists). Called as prefixes go and with every heartbeat, so that what
/// went within a second of the last trim is given back a heartbeat later,
/// however little followed it.
pub(crate) fn trim_if_due() {
    use std::sync::atomic::Ordering::Relaxed;
    static LAST_TRIM_S: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if FREED.load(Relaxed) < TRIM_AFTER {
        return;
    }
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST_TRIM_S.load(Relaxed) == now_s {
        return;
    }
    let freed = FREED.swap(0, Relaxed);
    if freed >= TRIM_AFTER {
        LAST_TRIM_S.store(now_s, Relaxed);
        crate::util::sys::trim_heap();
    } else {
        // Another thread trimmed meanwhile: keep the count.
        FREED.fetch_add(freed, Relaxed);
    }
}

/// The monitor event of a handshake refused by the peer's ZAP handler.
pub(crate) const AUTH_FAILED: i32 = zmq_sys::ZMQ_EVENT_HANDSHAKE_FAILED_AUTH as i32;

/// A socket monitor's event from its first frame: the event (u16) and its
/// value (u32), little endian; `(0, 0)` for a frame too short.
pub(crate) fn monitor_event(frames: &[Vec<u8>]) -> (i32, u32) {
    match frames.first().map(|f| &f[..]) {
        Some([a, b, c, d, e, f, ..]) => (
            i32::from(u16::from_le_bytes([*a, *b])),
            u32::from_le_bytes([*c, *d, *e, *f]),
        ),
        _ => (0, 0),
    }
}

/// Reads every event queued on the monitor reader `mon` (so that none
/// piles up) and returns the ZAP status of a refused handshake among them,
/// if there was one.
pub(crate) fn auth_refusal(mon: &zmq::Socket) -> Option<u32> {
    let mut refused = None;
    while let Ok(frames) = mon.recv_multipart(zmq::DONTWAIT) {
        if let (AUTH_FAILED, status) = monitor_event(&frames) {
            refused = Some(status);
        }
    }
    refused
}

/// Lets the monitor reader `reader` (before it connects) take every event
/// libzmq sends it, however many: libzmq's I/O thread sends monitor
/// events with a blocking send, so a reader whose queue were full (one
/// not read for a while, as an idle call connection's to a server that
/// went away, whose reconnection attempts are events) would stall every
/// socket of the context. The queue's size is then the events' (tens of
/// bytes each, a few a second at most per socket), until they are read
/// or the monitor stops.
pub(crate) fn unbounded_monitor_queue(reader: &zmq::Socket) -> zmq::Result<()> {
    reader.set_rcvhwm(0)
}

/// Stops the socket monitor of `sock`. Must run before the PAIR socket
/// reading the monitor is closed: libzmq sends monitor events with a
/// blocking send from its I/O thread, so an event with nobody to take it
/// (a connection closing later) would stall every socket of the context
/// (libzmq issue 3575).
pub(crate) fn stop_monitor(sock: &mut zmq::Socket) {
    // SAFETY: the socket pointer is valid for the life of `sock`, borrowed
    // mutably so no other thread uses it; a null endpoint is libzmq's
    // documented-in-code way to stop monitoring.
    unsafe {
        zmq_sys::zmq_socket_monitor(sock.as_mut_ptr(), std::ptr::null(), 0);
    }
}

fn last_error() -> zmq::Error {
    // SAFETY: zmq_errno only reads the thread's errno.
    zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() })
}

unsafe extern "C" fn free_bytes(_data: *mut c_void, hint: *mut c_void) {
    // SAFETY: `hint` is the Box<Bytes> leaked by `send_bytes`, handed back
    // exactly once by libzmq when it releases the message.
    drop(unsafe { Box::from_raw(hint.cast::<Bytes>()) });
}

/// Sends `data` as one frame without copying it: libzmq holds a reference
/// on the buffer until the frame has left, then releases it.
pub(crate) fn send_bytes(sock: &mut zmq::Socket, data: Bytes, flags: i32) -> zmq::Result<()> {
    let len = data.len();
    let ptr = data.as_ptr() as *mut c_void;
    let hint = Box::into_raw(Box::new(data));
    let mut msg = zmq_sys::zmq_msg_t::default();
    // SAFETY: `ptr`/`len` stay valid while the Box<Bytes> behind `hint`
    // lives; libzmq calls `free_bytes(ptr, hint)` once when done. It never
    // writes through `ptr`.
    let rc =
        unsafe { zmq_sys::zmq_msg_init_data(&mut msg, ptr, len, Some(free_bytes), hint.cast()) };
    if rc != 0 {
        // SAFETY: init failed, so libzmq did not take the hint; reclaim it.
        drop(unsafe { Box::from_raw(hint) });
        return Err(last_error());
    }
    // SAFETY: `msg` is initialised; the socket pointer is valid and used by
    // this thread only (we hold `&mut`).
    let rc = unsafe { zmq_sys::zmq_msg_send(&mut msg, sock.as_mut_ptr(), flags as c_int) };
    if rc < 0 {
        let e = last_error();
        // SAFETY: a failed send leaves the message with us; closing it runs
        // `free_bytes`.
        unsafe { zmq_sys::zmq_msg_close(&mut msg) };
        return Err(e);
    }
    Ok(())
}

/// A received frame shown as [`Bytes`] without a copy.
struct MessageBytes(zmq::Message);

impl AsRef<[u8]> for MessageBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Wraps a received message so that slices of it can outlive the receive
/// call without a copy.
pub(crate) fn message_bytes(msg: zmq::Message) -> Bytes {
    Bytes::from_owner(MessageBytes(msg))
}

/// Receives one whole message (every frame) without copying it; `flags`
/// apply to its first frame.
pub(crate) fn recv_parts(sock: &mut zmq::Socket, flags: i32) -> zmq::Result<Vec<zmq::Message>> {
    let mut parts = vec![sock.recv_msg(flags)?];
    while sock.get_rcvmore()? {
        // The rest of a message is there as soon as its first frame is.
        parts.push(sock.recv_msg(0)?);
    }
    Ok(parts)
}

/// Binds `sock` to `endpoint`: the endpoint bound (a `*` port resolved).
pub(crate) fn bind(sock: &zmq::Socket, endpoint: &str) -> Result<String, OpenError> {
    sock.bind(endpoint)
        .map_err(|source: zmq::Error| OpenError::Socket {
            action: "bind",
            endpoint: endpoint.to_owned(),
            source: source.transport(),
        })?;
    Ok(sock
        .get_last_endpoint()
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| endpoint.to_owned()))
}

impl IntoTransport for zmq::Error {
    fn transport(self) -> TransportError {
        let code = self.to_raw();
        // libzmq's own numbers start at 156384712 (ZMQ_HAUSNUMERO).
        TransportError::new(
            self.message().to_owned(),
            (code < 156_384_712).then_some(code),
        )
    }
}

/// A frame the broker forwards without copying it: libzmq's own message,
/// which [`Frame::share`] lets several sockets send (libzmq counts the
/// references to one buffer). A send that fails leaves the frame here, to
/// be sent again.
pub(crate) struct Frame(zmq_sys::zmq_msg_t);

// SAFETY: a zmq_msg_t is plain data owned by this value; libzmq's
// reference counting of a shared buffer is atomic.
unsafe impl Send for Frame {}

impl Frame {
    /// Receives one frame from `sock`.
    pub(crate) fn recv(sock: &mut zmq::Socket, flags: i32) -> zmq::Result<Frame> {
        let mut msg = zmq_sys::zmq_msg_t::default();
        // SAFETY: `msg` is ours to initialise; an empty message needs no
        // close on failure of the receive below (closing is harmless).
        unsafe { zmq_sys::zmq_msg_init(&mut msg) };
        let f = Frame(msg);
        let mut f = f;
        // SAFETY: `f.0` is initialised; the socket is used by this thread
        // only (we hold `&mut`).
        let rc = unsafe { zmq_sys::zmq_msg_recv(&mut f.0, sock.as_mut_ptr(), flags as c_int) };
        if rc < 0 {
            return Err(last_error());
        }
        Ok(f)
    }

    /// Whether more frames of the message follow.
    pub(crate) fn more(&self) -> bool {
        // SAFETY: the message is initialised; zmq_msg_more only reads it
        // (the C signature takes a const pointer).
        unsafe { zmq_sys::zmq_msg_more(&self.0) != 0 }
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: as `more`.
        unsafe { zmq_sys::zmq_msg_size(&self.0) }
    }

    /// Its bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        let n = self.len();
        if n == 0 {
            return &[];
        }
        // SAFETY: zmq_msg_data only reads the message (its C signature
        // takes a mutable pointer nonetheless); the data lives as long as
        // the message, which `&self` borrows.
        unsafe {
            let p = zmq_sys::zmq_msg_data(std::ptr::addr_of!(self.0).cast_mut());
            std::slice::from_raw_parts(p.cast::<u8>(), n)
        }
    }

    /// The `User-Id` of the connection it came on (the key, in Z85, a
    /// CURVE server's ZAP handler admitted it with), if any.
    pub(crate) fn user_id(&self) -> Option<&[u8]> {
        // SAFETY: zmq_msg_gets reads the message's metadata, which lives
        // as long as the message (borrowed by `&self`); the property name
        // is NUL-terminated; a null result means no such property.
        unsafe {
            let p = zmq_sys::zmq_msg_gets(&self.0, c"User-Id".as_ptr());
            if p.is_null() {
                return None;
            }
            Some(std::ffi::CStr::from_ptr(p).to_bytes())
        }
    }

    /// Another reference to the same frame (no copy of a large one).
    pub(crate) fn share(&mut self) -> zmq::Result<Frame> {
        let mut msg = zmq_sys::zmq_msg_t::default();
        // SAFETY: `msg` is ours to initialise, then made a copy of an
        // initialised message.
        unsafe { zmq_sys::zmq_msg_init(&mut msg) };
        let mut f = Frame(msg);
        // SAFETY: both messages are initialised.
        let rc = unsafe { zmq_sys::zmq_msg_copy(&mut f.0, &mut self.0) };
        if rc != 0 {
            return Err(last_error());
        }
        Ok(f)
    }

    /// Sends it on `sock`; on failure it comes back with the error.
    pub(crate) fn send(
        mut self,
        sock: &mut zmq::Socket,
        flags: i32,
    ) -> Result<(), (Frame, zmq::Error)> {
        // SAFETY: the message is initialised; the socket is used by this
        // thread only. On success libzmq owns the content and leaves the
        // message empty, which `Drop` closes harmlessly.
        let rc = unsafe { zmq_sys::zmq_msg_send(&mut self.0, sock.as_mut_ptr(), flags as c_int) };
        if rc < 0 {
            let e = last_error();
            return Err((self, e));
        }
        Ok(())
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        // SAFETY: the message is initialised (or emptied by a send).
        unsafe { zmq_sys::zmq_msg_close(&mut self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::error::OpenError;

    #[test]
    fn a_monitor_nobody_reads_never_stalls_the_io_thread() {
        // A socket retrying a closed port every millisecond: an event each
        // time, which its monitor's reader does not read. libzmq sends
        // them with a blocking send from the I/O thread; past a bounded
        // queue's 2,000 frames that send, and every socket of the
        // context, would stop for good.
        let ctx = ContextRef::acquire();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let mut retrying = ctx.socket(zmq::DEALER).unwrap();
        retrying.set_linger(0).unwrap();
        retrying.set_reconnect_ivl(1).unwrap();
        retrying.set_reconnect_ivl_max(1).unwrap();
        let ep = format!(
            "inproc://milonga-test-unread-monitor-{}",
            std::process::id()
        );
        retrying
            .monitor(&ep, zmq_sys::ZMQ_EVENT_CONNECT_RETRIED as i32)
            .unwrap();
        let reader = ctx.socket(zmq::PAIR).unwrap();
        reader.set_linger(0).unwrap();
        unbounded_monitor_queue(&reader).unwrap();
        reader.connect(&ep).unwrap();
        retrying
            .connect(&format!("tcp://127.0.0.1:{port}"))
            .unwrap();
        // Meanwhile, TCP through the same I/O thread keeps working.
        let pull = ctx.socket(zmq::PULL).unwrap();
        pull.set_linger(0).unwrap();
        pull.bind("tcp://127.0.0.1:*").unwrap();
        let at = pull.get_last_endpoint().unwrap().unwrap();
        let push = ctx.socket(zmq::PUSH).unwrap();
        push.set_linger(0).unwrap();
        push.connect(&at).unwrap();
        // Past 2,000 frames (a bounded queue's) even on a loaded machine:
        // 7 s at hundreds of retries a second.
        for round in 0..10 {
            std::thread::sleep(std::time::Duration::from_millis(700));
            push.send(&b"ping"[..], zmq::DONTWAIT).unwrap();
            let mut items = [pull.as_poll_item(zmq::POLLIN)];
            let got = zmq::poll(&mut items, 5_000).unwrap();
            assert_eq!(got, 1, "round {round}: the I/O thread stalled");
            pull.recv_bytes(0).unwrap();
        }
        // More events came than a bounded queue holds: the case was made.
        let mut frames = 0;
        while reader.recv_bytes(zmq::DONTWAIT).is_ok() {
            frames += 1;
        }
        stop_monitor(&mut retrying);
        assert!(
            frames > 2_000,
            "only {frames} event frames in 7 s: the retries were too slow to test this"
        );
    }

    /// The kernel's timers of the TCP connections whose remote port is
    /// `port`, from /proc/net/tcp and tcp6 (`tr`: 0 none, 1 retransmit,
    /// 2 keep-alive, 4 zero-window probe).
    fn tcp_timers_to(port: u16) -> Vec<u8> {
        let want = format!(":{port:04X}");
        let mut timers = Vec::new();
        for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(file) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                // sl local rem st tx:rx tr:when ...; 01 = established.
                if f.len() > 5 && f[2].ends_with(&want) && f[3] == "01" {
                    let tr = f[5].split(':').next().unwrap_or("0");
                    timers.push(u8::from_str_radix(tr, 16).unwrap_or(0));
                }
            }
        }
        timers
    }

    /// A leased socket (no ZMTP heartbeats) has the kernel watch its
    /// connections: keep-alive probes armed on an idle connection, so that
    /// a dead host is noticed. libzmq applies the keep-alive options only
    /// when built with the platform's `ZMQ_HAVE_SO_KEEPALIVE` and
    /// `ZMQ_HAVE_TCP_KEEP*`; without them it took them silently and armed
    /// nothing (crates/zeromq-src-patched/PATCHES.md §5).
    #[test]
    fn a_leased_socket_has_the_kernel_probe_its_idle_connections() {
        let ctx = ContextRef::acquire();
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let ep = router.get_last_endpoint().unwrap().unwrap();
        let port: u16 = ep.rsplit(':').next().unwrap().parse().unwrap();
        let mut dealer = ctx.socket(zmq::DEALER).unwrap();
        dealer.set_linger(0).unwrap();
        let cfg = crate::Config::new("milonga:///keepalive", "t");
        apply_leased(&mut dealer, &cfg).unwrap();
        dealer.connect(&ep).unwrap();
        dealer.send("hello", 0).unwrap();
        router.set_rcvtimeo(10_000).unwrap();
        assert_eq!(router.recv_multipart(0).unwrap().len(), 2);
        // Idle now: the keep-alive timer runs (the send's retransmit timer
        // is gone once the ack came).
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let timers = tcp_timers_to(port);
            if timers.contains(&2) {
                break;
            }
            assert!(
                std::time::Instant::now() < end,
                "no keep-alive timer on the connection to port {port}: {timers:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn a_transport_error_keeps_the_reason_and_the_os_number() {
        let e = zmq::Error::EADDRINUSE.transport();
        assert_eq!(e.os_code(), Some(libc::EADDRINUSE));
        assert!(e.message().contains("in use"), "{e}");
        // libzmq's own errors have no OS number.
        let e = zmq::Error::ETERM.transport();
        assert_eq!(e.os_code(), None);
        assert!(!e.message().is_empty());
        let open = OpenError::Socket {
            action: "bind",
            endpoint: "tcp://127.0.0.1:1".into(),
            source: zmq::Error::EADDRINUSE.transport(),
        };
        assert!(
            open.to_string()
                .starts_with("cannot bind tcp://127.0.0.1:1: "),
            "{open}"
        );
    }
}
