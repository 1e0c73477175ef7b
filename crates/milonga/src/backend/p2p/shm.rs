//! The same-host shared-memory path (docs/shared-memory.md): a publisher
//! writes a large payload frame once into a segment of its own in
//! `/dev/shm` and sends subscriptions on its host a reference to it
//! (docs/protocol.md §4.6); they map the segment and read the payload in
//! place.
//!
//! A segment is a file `/dev/shm/milonga-<host>-<pid>-<node id>-<n>`: a
//! header page, a table of slots, and a data ring. A slot holds one
//! payload: its stamp (even when written, odd while rewritten), the
//! readers still expected, where its bytes lie, and the pids of the
//! processes that hold it (leases). The writer reuses the oldest slot when
//! no live process holds it and every expected reader came (or, see
//! [`Ring::reclaim_oldest`], gave up), and otherwise sends the sample
//! through the socket. A reader takes a lease, then checks the stamp; the
//! lease goes when the last view of the bytes is dropped. Files of
//! processes that ended are removed by the next node on the host that
//! sweeps (every second, [`sweep`]).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use milonga_wire::shm::{SharedRef, MARKER_BYTE, MARKER_HEAD_LEN, REF_LEN};
use milonga_wire::NodeId;

use crate::util::sys::{allocate, pid_exists, SharedMap, SharedWindow};

/// Where segments live.
const DIR: &str = "/dev/shm";
/// Their file names start with this.
const FILE_PREFIX: &str = "milonga-";
/// The segment header's magic: "MLGSHM", format 2 (format 1 had slots of
/// 256 bytes). A reader of one format refuses a segment of the other: the
/// sample is reported lost and the subscription withdraws its markers,
/// so that its publishers send it the bytes through the socket.
const MAGIC: u64 = u64::from_le_bytes(*b"MLGSHM\x00\x02");
/// The header page.
const HEADER_BYTES: usize = 4096;
/// One slot of the table: room for 248 leases, so that seed 004's
/// hundred subscribers of one publisher on one host all read in place.
const SLOT_BYTES: usize = 1024;
/// Slot fields: stamp (u64), readers expected (u32), data offset (u64),
/// length (u64), then the lease pids (u32 each).
const SLOT_STAMP: usize = 0;
const SLOT_EXPECTED: usize = 8;
const SLOT_OFFSET: usize = 16;
const SLOT_LEN: usize = 24;
const SLOT_PIDS: usize = 32;
/// Leases one slot holds at once: a sample goes through the socket when
/// more subscriptions on the host want it.
pub(crate) const MAX_READERS: u32 = ((SLOT_BYTES - SLOT_PIDS) / 4) as u32;
/// Payloads are placed on this alignment in the ring.
const ALIGN: usize = 64;
/// Most slots a segment has.
const MAX_SLOTS: usize = 4096;
/// The bytes of a segment's file allocated at a time, as its ring first
/// reaches them: a segment takes the memory its payloads in flight have
/// needed, not its whole size at once.
const ALLOCATE_STEP: usize = 4 << 20;
/// How long a segment that found `/dev/shm` full waits before it tries to
/// allocate again (its large samples go through the socket meanwhile).
const FULL_RETRY: Duration = Duration::from_secs(1);
/// A lease entry's bit that marks the writer's own lease on a slot it
/// reserved (a loan being filled), never a reader's (pids are below 2^22).
const WRITER: u32 = 1 << 31;

/// The identity of this host's shared memory, as subscriptions' markers
/// spell it: FNV-1a 64 of the boot id, the `/dev/shm` file system, the pid
/// and network namespaces and the user, so that a publisher serves only
/// subscribers that can open its files (same user), see the same ones
/// (same mount), whose pids mean the same (same pid namespace), and that
/// are on its host as the network sees it (a network namespace is a host
/// of its own: a container, or a host of milonga-testkit's test bed).
/// `None` where `/dev/shm` or the boot id cannot be read: no shared memory
/// then.
fn host() -> Option<&'static str> {
    static HOST: OnceLock<Option<String>> = OnceLock::new();
    HOST.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
        let shm = std::fs::metadata(DIR).ok()?;
        let pidns = std::fs::metadata("/proc/self/ns/pid").ok()?;
        let netns = std::fs::metadata("/proc/self/ns/net").ok()?;
        let mut id = boot;
        for n in [
            shm.dev(),
            shm.ino(),
            pidns.ino(),
            netns.ino(),
            u64::from(crate::util::sys::uid()),
        ] {
            id.extend_from_slice(&n.to_le_bytes());
        }
        Some(format!("{:016x}", crate::util::fnv1a64(&id)))
    })
    .as_deref()
}

/// The marker head a subscription on this host sends before each of its
/// prefixes `P` (as `marker ‖ P`), and a publisher before the key of a
/// reference frame: `0xFF s/<host>/` ([`MARKER_HEAD_LEN`] bytes). `None`:
/// no shared memory on this host.
pub(crate) fn marker() -> Option<&'static [u8]> {
    static MARKER: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    MARKER
        .get_or_init(|| {
            let mut m = vec![MARKER_BYTE];
            m.extend_from_slice(format!("s/{}/", host()?).as_bytes());
            Some(m)
        })
        .as_deref()
}

/// The path of segment `n` of process `pid`'s node `node` on this host
/// (`None`: no shared memory here). The host is in the name so that a
/// sweep removes only files whose pids it can check (same pid namespace).
fn path(pid: u32, node: &NodeId, n: u32) -> Option<PathBuf> {
    Some(PathBuf::from(format!(
        "{DIR}/{FILE_PREFIX}{}-{pid}-{}-{n}",
        host()?,
        node.to_hex()
    )))
}

// ---------------------------------------------------------------------
// The writer.

/// A publisher's segment: one per data socket, made on the first sample
/// that goes through shared memory, removed when the socket closes.
pub(crate) struct Ring {
    map: Arc<SharedMap>,
    /// The segment's file, kept to allocate its pages as the ring reaches
    /// them.
    file: File,
    /// The bytes of the file allocated so far, from its start.
    allocated: usize,
    /// A full `/dev/shm` was logged (once per segment).
    full_logged: bool,
    /// After `/dev/shm` was found full, no allocation is tried before
    /// this (each try allocates pages and gives them back).
    full_until: Option<Instant>,
    path: PathBuf,
    number: u32,
    pid: u32,
    data_start: usize,
    data_end: usize,
    /// Where the next payload goes.
    head: usize,
    /// Slots in use, oldest first (their payloads in ring order).
    live: VecDeque<Live>,
    /// Slots not in use.
    free: Vec<u32>,
    /// The last stamp given (even).
    stamp: u64,
    /// How long a slot waits for readers that were expected and did not
    /// come, before it may be reclaimed (see [`Ring::reclaim_oldest`]).
    hold: Duration,
    /// A reliable socket's ring: a slot's expected readers are waited for
    /// as long as none of the socket's marked subscriptions left.
    reliable: bool,
    /// Reservations made, numbering them.
    reservations: u64,
}

struct Live {
    slot: u32,
    offset: usize,
    /// When its reference was sent (its reservation until then).
    at: Instant,
    /// Its reservation's number.
    number: u64,
    /// The socket's marker departures when it was written.
    departures: u64,
    /// A marked subscription came while its reference was being sent: it
    /// may have got it without being counted, and taken the turn of one
    /// that was (so "every expected reader came" is not known).
    uncertain: bool,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("path", &self.path).finish()
    }
}

impl Ring {
    /// Makes segment file of `bytes` bytes for node `node` (at least a
    /// header, a table and 1 MiB of ring), with slots for payloads of
    /// `threshold` bytes or more.
    pub(crate) fn create(
        node: &NodeId,
        bytes: usize,
        threshold: usize,
        hold: Duration,
        reliable: bool,
    ) -> std::io::Result<Ring> {
        use std::os::unix::fs::OpenOptionsExt;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let number = NEXT.fetch_add(1, SeqCst);
        let pid = std::process::id();
        let slots = (bytes / threshold.max(ALIGN)).clamp(16, MAX_SLOTS);
        let data_start = HEADER_BYTES + slots * SLOT_BYTES;
        if bytes < data_start + (1 << 20) {
            return Err(std::io::Error::other(format!(
                "shm_segment_bytes {bytes} leaves less than 1 MiB for payloads"
            )));
        }
        let path = path(pid, node, number)
            .ok_or_else(|| std::io::Error::other("no shared memory on this host"))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        // The header, the slot table and a first step of ring now, the rest
        // as the ring reaches it (`Ring::reserve`): a full /dev/shm is an
        // error then, not a SIGBUS at the first write of a page.
        let allocated = (data_start + ALLOCATE_STEP).min(bytes);
        let made = (|| {
            file.set_len(bytes as u64)?;
            allocate(&file, 0, allocated)?;
            SharedMap::map(&file, bytes).map(Arc::new)
        })();
        let map = match made {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let header = |o| map.atomic_u64(o).expect("the header page is mapped");
        header(8).store(bytes as u64, SeqCst);
        header(16).store(slots as u64 | (u64::from(pid) << 32), SeqCst);
        header(0).store(MAGIC, SeqCst);
        Ok(Ring {
            map,
            file,
            allocated,
            full_logged: false,
            full_until: None,
            path,
            number,
            pid,
            data_start,
            data_end: bytes,
            head: data_start,
            live: VecDeque::new(),
            free: (0..slots as u32).rev().collect(),
            stamp: 0,
            hold,
            reliable,
            reservations: 0,
        })
    }

    fn slot_u64(&self, slot: u32, field: usize) -> &AtomicU64 {
        self.map
            .atomic_u64(HEADER_BYTES + slot as usize * SLOT_BYTES + field)
            .expect("slots are inside the table")
    }

    fn slot_u32(&self, slot: u32, field: usize) -> &AtomicU32 {
        self.map
            .atomic_u32(HEADER_BYTES + slot as usize * SLOT_BYTES + field)
            .expect("slots are inside the table")
    }

    /// Reserves a slot of `len` bytes for this process to fill, leased
    /// to it (so that it is not reclaimed) until the [`Reserved`] is
    /// dropped; `None` when no slot can be had now.
    pub(crate) fn reserve(&mut self, len: usize, departures: u64) -> Option<Reserved> {
        if len == 0 || len > self.data_end - self.data_start {
            return None;
        }
        let size = len.div_ceil(ALIGN) * ALIGN;
        if size > self.data_end - self.data_start {
            return None;
        }
        if self.free.is_empty() && !self.reclaim_oldest(departures, true) {
            return None;
        }
        let offset = self.place(size, departures)?;
        self.allocate_to(offset + size)?;
        // Made before anything is marked, so that nothing is left half done.
        let window = SharedWindow::new(self.map.clone(), offset, len)?;
        let slot = self.free.pop()?;
        // The slot is free: no reader holds it, and its stamp is odd (a
        // reclaimed slot) or 0 (never used); readers of older references
        // find the stamp changed.
        self.slot_u64(slot, SLOT_STAMP).fetch_or(1, SeqCst);
        self.slot_u64(slot, SLOT_OFFSET)
            .store(offset as u64, SeqCst);
        self.slot_u64(slot, SLOT_LEN).store(len as u64, SeqCst);
        self.slot_u32(slot, SLOT_EXPECTED).store(0, SeqCst);
        // The writer's own lease, in an entry no reader holds (a reader
        // of an older reference may hold one a moment, until it sees the
        // stamp changed).
        let mine = self.pid | WRITER;
        let Some(entry) = (0..MAX_READERS as usize)
            .map(|i| SLOT_PIDS + 4 * i)
            .find(|&e| {
                self.slot_u32(slot, e)
                    .compare_exchange(0, mine, SeqCst, SeqCst)
                    .is_ok()
            })
        else {
            self.free.push(slot);
            return None;
        };
        self.head = offset + size;
        self.reservations += 1;
        self.live.push_back(Live {
            slot,
            offset,
            at: Instant::now(),
            number: self.reservations,
            departures,
            uncertain: false,
        });
        Some(Reserved {
            window,
            claim: Claim {
                segment: self.number,
                slot,
                number: self.reservations,
                len,
            },
            entry: HEADER_BYTES + slot as usize * SLOT_BYTES + entry,
            value: mine,
        })
    }

    /// Publishes a reserved slot, filled, for `readers` expected readers:
    /// its reference (`None`: not a slot of this ring, or too many
    /// readers; it is then reclaimed once its reservation is dropped).
    pub(crate) fn commit(&mut self, c: Claim, readers: u32, departures: u64) -> Option<SharedRef> {
        // One lease entry stays for the writer's own (a loan's, while it is
        // sent).
        if c.segment != self.number || readers >= MAX_READERS {
            return None;
        }
        // Still its reservation (a stale claim must not publish the payload
        // of another).
        let live = self
            .live
            .iter_mut()
            .rev()
            .find(|l| l.slot == c.slot && l.number == c.number)?;
        live.departures = departures;
        live.at = Instant::now();
        self.slot_u32(c.slot, SLOT_EXPECTED).store(readers, SeqCst);
        self.stamp += 2;
        self.slot_u64(c.slot, SLOT_STAMP).store(self.stamp, SeqCst);
        Some(SharedRef {
            segment: self.number,
            pid: self.pid,
            slot: c.slot,
            stamp: self.stamp,
            len: c.len as u64,
        })
    }

    /// Writes `payload` for `readers` expected readers: its reference, or
    /// `None` when no slot can be had now (the sample then goes through
    /// the socket).
    pub(crate) fn write(
        &mut self,
        payload: &[u8],
        readers: u32,
        departures: u64,
    ) -> Option<SharedRef> {
        if readers >= MAX_READERS {
            return None;
        }
        let mut r = self.reserve(payload.len(), departures)?;
        r.window.as_mut_slice().copy_from_slice(payload);
        self.commit(r.claim, readers, departures)
        // `r` dropped: this process's lease goes.
    }

    /// Gives back a slot just written whose reference could not be sent.
    pub(crate) fn unsent(&mut self, r: &SharedRef) {
        if r.segment == self.number && self.live.iter().any(|l| l.slot == r.slot) {
            self.slot_u32(r.slot, SLOT_EXPECTED).store(0, SeqCst);
        }
    }

    /// Whether a slot still awaits a reader it was sent to.
    pub(crate) fn awaited(&self) -> bool {
        self.live
            .iter()
            .any(|l| self.slot_u32(l.slot, SLOT_EXPECTED).load(SeqCst) > 0)
    }

    /// The reference of a slot left: the wait for its readers starts now
    /// (a reliable put may have waited for room before); `uncertain`: a
    /// marked subscription came meanwhile.
    pub(crate) fn sent(&mut self, r: &SharedRef, uncertain: bool) {
        if r.segment != self.number {
            return;
        }
        if let Some(l) = self.live.iter_mut().rev().find(|l| l.slot == r.slot) {
            l.at = Instant::now();
            l.uncertain = uncertain;
        }
    }

    /// Allocates the file's pages up to `end` (a step at a time), unless
    /// done: `None` when `/dev/shm` is full (logged once; the sample then
    /// goes through the socket).
    fn allocate_to(&mut self, end: usize) -> Option<()> {
        if end <= self.allocated {
            return Some(());
        }
        if self.full_until.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        let step = end.max(self.allocated + ALLOCATE_STEP).min(self.data_end);
        // A step, or, when there is no room for one, what this payload needs.
        let mut error = None;
        let got = std::iter::once(step)
            .chain((end < step).then_some(end))
            .find(
                |&to| match allocate(&self.file, self.allocated, to - self.allocated) {
                    Ok(()) => true,
                    Err(e) => {
                        error = Some(e);
                        false
                    }
                },
            );
        match got {
            Some(to) => {
                self.allocated = to;
                self.full_until = None;
                Some(())
            }
            None => {
                self.full_until = Some(Instant::now() + FULL_RETRY);
                if !std::mem::replace(&mut self.full_logged, true) {
                    tracing::warn!(
                        error = %error.map_or_else(String::new, |e| e.to_string()),
                        segment = %self.path.display(),
                        "shared memory is full: large samples go through the socket while it is"
                    );
                }
                None
            }
        }
    }

    /// Where `size` bytes go, reclaiming the oldest slots as needed (the
    /// live payloads fill the ring from the oldest's offset to `head`,
    /// possibly wrapping). Slots whose readers all came are reclaimed
    /// first, whether room is needed or not: a ring whose readers keep up
    /// starts again at its beginning, and so stays within the pages it
    /// already has.
    fn place(&mut self, size: usize, departures: u64) -> Option<usize> {
        while self.reclaim_oldest(departures, false) {}
        loop {
            let Some(front) = self.live.front() else {
                self.head = self.data_start;
                return Some(self.data_start);
            };
            let tail = front.offset;
            if self.head > tail {
                if self.head + size <= self.data_end {
                    return Some(self.head);
                }
                if self.data_start + size <= tail {
                    return Some(self.data_start);
                }
            } else if self.head < tail && self.head + size <= tail {
                return Some(self.head);
            }
            if !self.reclaim_oldest(departures, true) {
                return None;
            }
        }
    }

    /// Frees the oldest slot if no live process holds it and its expected
    /// readers came: whether it did. Readers that have not come are given
    /// up on after the hold time, on a best-effort socket (the reference
    /// may have been dropped at a full queue), and on a reliable one only
    /// if a marked subscription left the socket since (`departures`, the
    /// socket's count of marker unsubscriptions, grew: the reader that did
    /// not come may be the one that left, killed or closed); a reliable
    /// reader that is only slow is waited for. A slot whose count is not
    /// known to be right (`uncertain`: a marked subscription came while
    /// its reference was sent, and may have read it uncounted in the place
    /// of one that was counted) waits the hold time even when its count
    /// reached 0. `give_up`: whether readers that have not come may be
    /// given up on at all (not when reclaiming ahead of need).
    fn reclaim_oldest(&mut self, departures: u64, give_up: bool) -> bool {
        let Some(l) = self.live.front() else {
            return false;
        };
        let (slot, written_at, uncertain) = (l.slot, l.departures, l.uncertain);
        let waited = l.at.elapsed() >= self.hold;
        if self.slot_u32(slot, SLOT_EXPECTED).load(SeqCst) > 0 {
            if !(give_up && waited && (!self.reliable || departures > written_at)) {
                return false;
            }
        } else if uncertain && !waited {
            return false;
        }
        // Marked odd first, then the leases read: a reader that leased it
        // before is seen here; one that leases it after sees the stamp
        // changed (both sides sequentially consistent).
        let stamp = self.slot_u64(slot, SLOT_STAMP);
        let was = stamp.fetch_or(1, SeqCst);
        for i in 0..MAX_READERS as usize {
            let lease = self.slot_u32(slot, SLOT_PIDS + 4 * i);
            let held = lease.load(SeqCst);
            if held == 0 {
                continue;
            }
            let pid = held & !WRITER;
            if pid_exists(pid) {
                self.slot_u64(slot, SLOT_STAMP).store(was, SeqCst);
                return false;
            }
            // A reader that ended without giving its lease back.
            let _ = lease.compare_exchange(held, 0, SeqCst, SeqCst);
        }
        self.live.pop_front();
        self.free.push(slot);
        true
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Readers that mapped it keep their mapping; the name goes.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Which reserved slot of which ring a filled payload is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claim {
    segment: u32,
    slot: u32,
    /// Its reservation's number.
    number: u64,
    len: usize,
}

/// A slot reserved for this process to fill (a loan): its window, and the
/// lease that keeps the writer from reclaiming it, given back on drop.
/// As `AsRef<[u8]>` it is the payload frame of the sample that publishes
/// it (a `Bytes` made from it holds the lease until the send is done).
#[derive(Debug)]
pub(crate) struct Reserved {
    pub(crate) window: SharedWindow,
    pub(crate) claim: Claim,
    /// Offset of the writer's lease entry, and what it holds.
    entry: usize,
    value: u32,
}

impl AsRef<[u8]> for Reserved {
    fn as_ref(&self) -> &[u8] {
        self.window.as_slice()
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if let Some(a) = self.window.map().atomic_u32(self.entry) {
            let _ = a.compare_exchange(self.value, 0, SeqCst, SeqCst);
        }
    }
}

// ---------------------------------------------------------------------
// The readers.

/// A segment another process wrote, mapped here (one mapping per segment
/// for the whole process, shared by its subscriptions).
struct Mapped {
    map: SharedMap,
    slots: u32,
    path: PathBuf,
    used: Mutex<Instant>,
}

/// A segment: its writer's pid, node and number.
type SegmentId = (u32, NodeId, u32);

/// Segment -> its mapping, for every subscription of the process.
type Mappings = Mutex<HashMap<SegmentId, Arc<Mapped>>>;

fn mapped() -> &'static Mappings {
    static MAPPED: OnceLock<Mappings> = OnceLock::new();
    MAPPED.get_or_init(Default::default)
}

/// Most segments a process keeps mapped: beyond, a new one is not mapped
/// (its samples are counted unreadable) until the sweep forgets unused ones.
const MAX_MAPPED: usize = 256;

/// How long a reader waits for a slot's stamp to be even again (the writer
/// marks it odd a moment while it checks whether it may reuse the slot).
const ODD_STAMP_WAIT: Duration = Duration::from_millis(2);

/// Why a reference could not be read.
#[derive(Debug)]
pub(crate) enum Unreadable {
    /// What would fail again for the next references: a segment that
    /// cannot be mapped or is not one this process may trust (another
    /// owner, a link, open to others, a bad header), too many segments
    /// mapped, a payload over `max_message_bytes`, every lease of a slot
    /// taken. The subscription stops asking for shared memory.
    Withdraw(String),
    /// This sample only: the segment is gone (its writer closed it or
    /// ended), or the frame is not a well-formed reference.
    Lost(String),
    /// The slot was rewritten before this reader came, or the reference
    /// does not match it.
    Overwritten,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreadable::Withdraw(why) | Unreadable::Lost(why) => write!(f, "{why}"),
            Unreadable::Overwritten => write!(f, "the slot was rewritten before it was read"),
        }
    }
}

fn open(pid: u32, node: &NodeId, n: u32) -> Result<Arc<Mapped>, Unreadable> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut all = crate::util::lock(mapped());
    if let Some(m) = all.get(&(pid, *node, n)) {
        *crate::util::lock(&m.used) = Instant::now();
        return Ok(m.clone());
    }
    if all.len() >= MAX_MAPPED {
        return Err(Unreadable::Withdraw(format!(
            "{MAX_MAPPED} segments are mapped already"
        )));
    }
    let path =
        path(pid, node, n).ok_or_else(|| Unreadable::Lost("no shared memory here".into()))?;
    let bad = |why: String| Unreadable::Withdraw(format!("{}: {why}", path.display()));
    // Never through a link, and only a file of this user that no one else
    // may write: what the mapping holds is trusted as a writer's slots.
    let file = match File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Unreadable::Lost(format!("{}: gone", path.display())))
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.uid() != crate::util::sys::uid() || meta.mode() & 0o077 != 0 {
        return Err(bad("not a file of this user alone".into()));
    }
    let len = usize::try_from(meta.len())
        .ok()
        .filter(|l| *l > HEADER_BYTES)
        .ok_or_else(|| bad(format!("{} bytes is not a segment", meta.len())))?;
    let map = SharedMap::map(&file, len).map_err(|e| bad(e.to_string()))?;
    let word = |o| map.atomic_u64(o).map_or(0, |a| a.load(SeqCst));
    let (magic, size, slots_pid) = (word(0), word(8), word(16));
    let slots = (slots_pid & 0xffff_ffff) as usize;
    if magic != MAGIC
        || size != len as u64
        || slots_pid >> 32 != u64::from(pid)
        || slots == 0
        || slots > MAX_SLOTS
        || HEADER_BYTES + slots * SLOT_BYTES > len
    {
        return Err(bad("not a Milonga segment".into()));
    }
    let m = Arc::new(Mapped {
        map,
        slots: slots as u32,
        path,
        used: Mutex::new(Instant::now()),
    });
    all.insert((pid, *node, n), m.clone());
    Ok(m)
}

/// A lease of one slot: the bytes it holds, until dropped.
struct Lease {
    seg: Arc<Mapped>,
    entry: usize,
    offset: usize,
    len: usize,
    pid: u32,
}

impl AsRef<[u8]> for Lease {
    fn as_ref(&self) -> &[u8] {
        // Checked inside the mapping when the lease was taken.
        self.seg
            .map
            .bytes(self.offset, self.len)
            .unwrap_or_default()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(a) = self.seg.map.atomic_u32(self.entry) {
            let _ = a.compare_exchange(self.pid, 0, SeqCst, SeqCst);
        }
    }
}

/// The payload frame `r` names, written by node `node`, of at most
/// `limit` bytes: a view of the segment (no copy) that holds the slot's
/// lease while it lives.
pub(crate) fn read(node: &NodeId, r: &SharedRef, limit: usize) -> Result<Bytes, Unreadable> {
    let seg = open(r.pid, node, r.segment)?;
    if r.slot >= seg.slots {
        return Err(Unreadable::Overwritten);
    }
    let base = HEADER_BYTES + r.slot as usize * SLOT_BYTES;
    let field = |o| seg.map.atomic_u64(base + o).ok_or(Unreadable::Overwritten);
    // A reader that gives up still came: the writer does not wait for it.
    let came = || {
        if let Some(a) = seg.map.atomic_u32(base + SLOT_EXPECTED) {
            let _ = a.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
        }
    };
    if r.len > limit as u64 {
        came();
        return Err(Unreadable::Withdraw(format!(
            "a shared-memory payload of {} bytes is over max_message_bytes",
            r.len
        )));
    }
    let me = std::process::id();
    // The lease first, then the stamp (see `Ring::reclaim_oldest`).
    let mut entry = None;
    for i in 0..MAX_READERS as usize {
        let at = base + SLOT_PIDS + 4 * i;
        let Some(a) = seg.map.atomic_u32(at) else {
            break;
        };
        if a.compare_exchange(0, me, SeqCst, SeqCst).is_ok() {
            entry = Some(at);
            break;
        }
    }
    let Some(entry) = entry else {
        came();
        return Err(Unreadable::Withdraw(
            "every lease of a shared-memory slot is taken".into(),
        ));
    };
    let release = || {
        if let Some(a) = seg.map.atomic_u32(entry) {
            let _ = a.compare_exchange(me, 0, SeqCst, SeqCst);
        }
    };
    let mut stamp = field(SLOT_STAMP)?.load(SeqCst);
    if stamp == r.stamp | 1 {
        // Odd: the writer is looking at the slot to reuse it, and puts
        // the stamp back when it finds this lease; or it is rewriting it
        // (the stamp then becomes another even number).
        let until = Instant::now() + ODD_STAMP_WAIT;
        while stamp % 2 == 1 && Instant::now() < until {
            std::thread::yield_now();
            stamp = field(SLOT_STAMP)?.load(SeqCst);
        }
    }
    let offset = field(SLOT_OFFSET)?.load(SeqCst);
    let len = field(SLOT_LEN)?.load(SeqCst);
    let data_start = (HEADER_BYTES + seg.slots as usize * SLOT_BYTES) as u64;
    let fits = offset >= data_start
        && offset
            .checked_add(len)
            .is_some_and(|end| end <= seg.map.len() as u64);
    if stamp != r.stamp || len != r.len || !fits {
        release();
        return Err(Unreadable::Overwritten);
    }
    came();
    Ok(Bytes::from_owner(Lease {
        seg: seg.clone(),
        entry,
        offset: offset as usize,
        len: len as usize,
        pid: me,
    }))
}

/// The frame a receiver reads in place of a reference frame `first`
/// (docs/protocol.md §4.6: a marker head, then key, header and body as
/// for a sample): the key and header with flag bit 3 cleared and bit 0
/// set, the bytes that followed the reference as its body; and the payload
/// frame from the segment (at most `limit` bytes). `None` when `first` is
/// not a reference frame (it does not start with the marker byte).
pub(crate) fn resolve(first: &[u8], limit: usize) -> Option<Result<(Bytes, Bytes), Unreadable>> {
    use milonga_wire::frame::{offset, FLAG_PAYLOAD_FRAME, FLAG_SHARED_MEMORY, HEADER_LEN};
    if first.first() != Some(&MARKER_BYTE) {
        return None;
    }
    let malformed = || Unreadable::Lost("a malformed shared-memory reference".into());
    if !milonga_wire::shm::is_marker_head(first) {
        return Some(Err(malformed()));
    }
    let frame = &first[MARKER_HEAD_LEN..];
    let Some(k) = frame.iter().take(513).position(|b| *b == 0) else {
        return Some(Err(malformed()));
    };
    let h = k + 1;
    let Some(&flags) = frame.get(h + offset::FLAGS) else {
        return Some(Err(malformed()));
    };
    let reference = frame
        .get(h + HEADER_LEN..)
        .filter(|_| flags & (FLAG_SHARED_MEMORY | FLAG_PAYLOAD_FRAME) == FLAG_SHARED_MEMORY)
        .and_then(SharedRef::decode);
    let Some((r, rest)) = reference else {
        return Some(Err(malformed()));
    };
    let node = NodeId(
        frame[h + offset::NODE_ID..h + offset::NODE_ID + 16]
            .try_into()
            .expect("16 bytes"),
    );
    Some(read(&node, &r, limit).map(|payload| {
        let mut out = Vec::with_capacity(h + HEADER_LEN + rest.len());
        out.extend_from_slice(&frame[..h + HEADER_LEN]);
        out[h + offset::FLAGS] = (flags & !FLAG_SHARED_MEMORY) | FLAG_PAYLOAD_FRAME;
        out.extend_from_slice(rest);
        (Bytes::from(out), payload)
    }))
}

/// The body of a reference frame: the reference, then `head` (the bytes
/// that would have led the payload frame's body).
pub(crate) fn reference_body(r: &SharedRef, head: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(REF_LEN + head.len());
    b.extend_from_slice(&r.encode());
    b.extend_from_slice(head);
    b
}

/// Removes this host's segment files of this user whose process ended (a
/// publisher killed before it could), and forgets this process's mappings
/// that no lease holds and that were not used for `idle` or whose file is
/// gone. Run by every node thread with shared memory on, once a second.
pub(crate) fn sweep(idle: Duration) {
    use std::os::unix::fs::MetadataExt;
    let me = crate::util::sys::uid();
    if let (Some(host), Ok(dir)) = (host(), std::fs::read_dir(DIR)) {
        let ours = format!("{FILE_PREFIX}{host}-");
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&ours)) else {
                continue;
            };
            let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let mine = e.metadata().is_ok_and(|m| m.uid() == me);
            if mine && !pid_exists(pid) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    crate::util::lock(mapped()).retain(|_, m| {
        Arc::strong_count(m) > 1 || (m.path.exists() && crate::util::lock(&m.used).elapsed() < idle)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeId {
        let mut id = [0u8; 16];
        getrandom::fill(&mut id).unwrap();
        NodeId(id)
    }

    #[test]
    fn a_written_payload_reads_back_in_place_and_its_slot_waits_for_its_reader() {
        let n = node();
        let mut ring = Ring::create(&n, 4 << 20, 64 << 10, Duration::from_secs(60), false).unwrap();
        let payload: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let r = ring.write(&payload, 1, 0).unwrap();
        let view = read(&n, &r, usize::MAX).unwrap();
        assert_eq!(&view[..], &payload[..]);
        // The ring fills: the held slot is never rewritten, later writes
        // fail once only it is left.
        let mut written = 0;
        while ring.write(&payload, 0, 0).is_some() {
            written += 1;
            assert!(written < 1000, "the ring never fills");
        }
        assert_eq!(&view[..], &payload[..], "a held slot is not rewritten");
        drop(view);
        assert!(
            ring.write(&payload, 0, 0).is_some(),
            "a released slot is reused"
        );
        // A reference to a rewritten slot is refused, not misread.
        assert!(matches!(
            read(&n, &r, usize::MAX),
            Err(Unreadable::Overwritten)
        ));
        let file = ring.path.clone();
        assert!(file.exists());
        drop(ring);
        assert!(!file.exists(), "the segment goes with its writer");
    }

    #[test]
    fn a_segment_takes_the_memory_its_payloads_in_flight_need_not_its_whole_size() {
        use std::os::unix::fs::MetadataExt;
        let n = node();
        let bytes = 64 << 20;
        let mut ring = Ring::create(&n, bytes, 64 << 10, Duration::from_secs(60), false).unwrap();
        let held = |ring: &Ring| std::fs::metadata(&ring.path).unwrap().blocks() as usize * 512;
        assert!(
            held(&ring) <= 2 * ALLOCATE_STEP,
            "{} bytes at first",
            held(&ring)
        );
        // Readers that keep up (none expected): the ring starts again at
        // its beginning, in the pages it has.
        let payload = vec![9u8; 1 << 20];
        for _ in 0..200 {
            ring.write(&payload, 0, 0).unwrap();
        }
        assert!(
            held(&ring) <= 2 * ALLOCATE_STEP,
            "{} bytes kept up",
            held(&ring)
        );
        // Readers that do not come: the ring goes on, allocating as it goes.
        let mut refs = Vec::new();
        for _ in 0..20 {
            refs.push(ring.write(&payload, 1, 0).unwrap());
        }
        assert!(
            held(&ring) >= 20 << 20,
            "{} bytes for 20 MiB held",
            held(&ring)
        );
        assert!(held(&ring) <= bytes);
        for r in &refs {
            assert!(read(&n, r, usize::MAX).unwrap().iter().all(|b| *b == 9));
        }
    }

    /// Seed 004's one publisher to a hundred subscribers on one host: all
    /// of them hold the same payload in place at once.
    #[test]
    fn a_hundred_readers_hold_one_slot_at_once() {
        let n = node();
        let mut ring = Ring::create(&n, 4 << 20, 64 << 10, Duration::from_secs(60), false).unwrap();
        let payload = vec![3u8; 100_000];
        let r = ring
            .write(&payload, 100, 0)
            .expect("a slot for 100 readers");
        let views: Vec<Bytes> = (0..100)
            .map(|_| read(&n, &r, usize::MAX).unwrap())
            .collect();
        assert!(views.iter().all(|v| v[..] == payload[..]));
    }

    #[test]
    fn an_expected_reader_that_never_comes_holds_the_slot_only_for_the_hold_time() {
        let n = node();
        let hold = Duration::from_millis(200);
        let mut ring = Ring::create(&n, 2 << 20, 64 << 10, hold, false).unwrap();
        // More than half the ring: a second one needs the first's room.
        let payload = vec![7u8; 1_100_000];
        let first = ring.write(&payload, 1, 0).unwrap();
        assert!(
            ring.write(&payload, 0, 0).is_none(),
            "the expected reader holds it"
        );
        // What is tested is the passing of the hold time itself.
        std::thread::sleep(hold + Duration::from_millis(50));
        assert!(ring.write(&payload, 0, 0).is_some());
        assert!(matches!(
            read(&n, &first, usize::MAX),
            Err(Unreadable::Overwritten)
        ));
    }

    #[test]
    fn a_reliable_ring_waits_for_a_slow_reader_until_a_subscription_leaves() {
        let n = node();
        let hold = Duration::from_millis(100);
        let mut ring = Ring::create(&n, 2 << 20, 64 << 10, hold, true).unwrap();
        let payload = vec![5u8; 1_100_000];
        let first = ring.write(&payload, 1, 0).unwrap();
        // What is tested is the passing of the hold time itself.
        std::thread::sleep(hold + Duration::from_millis(50));
        assert!(
            ring.write(&payload, 0, 0).is_none(),
            "a reliable reader that is only slow is waited for"
        );
        assert!(
            ring.write(&payload, 0, 1).is_some(),
            "a marked subscription left: the reader may be that one"
        );
        assert!(matches!(
            read(&n, &first, usize::MAX),
            Err(Unreadable::Overwritten)
        ));
    }

    #[test]
    fn a_reservation_is_not_reclaimed_while_it_is_filled_even_by_a_stale_reader_of_this_process() {
        let n = node();
        let mut ring = Ring::create(&n, 2 << 20, 64 << 10, Duration::ZERO, false).unwrap();
        let old = ring.write(&vec![1u8; 1_100_000], 0, 0).unwrap();
        let mut loan = ring.reserve(1_100_000, 0).expect("the old slot is free");
        // A reader of the old reference in this process: it takes a lease,
        // finds the stamp changed and gives its lease back; the writer's
        // own lease on the reservation stays.
        assert!(matches!(
            read(&n, &old, usize::MAX),
            Err(Unreadable::Overwritten)
        ));
        assert!(
            ring.write(&vec![2u8; 1_100_000], 0, 0).is_none(),
            "the loan holds the ring"
        );
        loan.window.as_mut_slice().fill(3);
        let r = ring.commit(loan.claim, 1, 0).unwrap();
        let view = read(&n, &r, usize::MAX).unwrap();
        assert!(view.iter().all(|b| *b == 3));
        drop(loan);
        drop(view);
        assert!(ring.write(&vec![4u8; 1_100_000], 0, 0).is_some());
    }

    #[test]
    fn hostile_references_are_refused() {
        let n = node();
        let mut ring = Ring::create(&n, 2 << 20, 64 << 10, Duration::from_secs(1), false).unwrap();
        let r = ring.write(&[1u8; 70_000], 0, 0).unwrap();
        for bad in [
            SharedRef { slot: 1 << 30, ..r },
            SharedRef { len: 1 << 40, ..r },
            SharedRef {
                stamp: r.stamp + 2,
                ..r
            },
        ] {
            assert!(matches!(
                read(&n, &bad, usize::MAX),
                Err(Unreadable::Overwritten)
            ));
        }
        assert!(matches!(
            read(&node(), &r, usize::MAX),
            Err(Unreadable::Lost(_))
        ));
        assert!(matches!(
            read(
                &n,
                &SharedRef {
                    segment: r.segment + 1000,
                    ..r
                },
                usize::MAX
            ),
            Err(Unreadable::Lost(_))
        ));
        assert!(
            matches!(read(&n, &r, 1000), Err(Unreadable::Withdraw(_))),
            "over the limit"
        );
        assert!(read(&n, &r, usize::MAX).is_ok());
        // A file at a segment's name that others may write, or a link: not
        // mapped.
        use std::os::unix::fs::PermissionsExt;
        let other = node();
        let open_to_all = path(std::process::id(), &other, 7).unwrap();
        std::fs::write(&open_to_all, vec![0u8; 1 << 16]).unwrap();
        std::fs::set_permissions(&open_to_all, std::fs::Permissions::from_mode(0o666)).unwrap();
        let link = path(std::process::id(), &other, 8).unwrap();
        std::os::unix::fs::symlink(&ring.path, &link).unwrap();
        for segment in [7, 8] {
            let got = read(&other, &SharedRef { segment, ..r }, usize::MAX);
            assert!(matches!(got, Err(Unreadable::Withdraw(_))), "{got:?}");
        }
        let _ = std::fs::remove_file(open_to_all);
        let _ = std::fs::remove_file(link);
    }
}
