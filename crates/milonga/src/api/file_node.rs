//! A node on a `file:///PATH` locator (docs/recording.md): the same API
//! over a recording. Its publishers write their samples into the file (a
//! `RecordWriter`, this node's id and sequence numbers, the source
//! timestamps given or taken at the put); its subscriptions read the file
//! back, each from the start, as fast as they take it or at a factor of
//! the recorded pace (`file_speed`), and end with
//! [`RecvError::EndOfRecording`](crate::RecvError::EndOfRecording).
//!
//! Underneath is an ordinary node on a domain private to the file, over
//! inproc, so that subscriptions keep their machinery (queue policies,
//! callbacks, the events of a live subscription): a feeder thread per
//! subscription hands the recorded events to it, and publishers send
//! nothing over it.
//!
//! A file that exists is appended to by copying it, record by record, to
//! `PATH.milonga-tmp` at the first publisher, writing on, and renaming the
//! copy over `PATH` when the node closes (so that the original stays whole
//! until then); a new file is written under a hidden name, locked, then
//! linked at `PATH` (so that two nodes creating it at once never see each
//! other's file unlocked).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use milonga_wire::cbor::decode_payload;
use milonga_wire::cbor::Encoded;
use milonga_wire::{KeyExpr, NodeId};

use crate::api::subscriber::SubShared;
use crate::backend::file::{
    copy_recording, Entry, RecordError, RecordOptions, RecordReader, RecordWriter,
};
use crate::model::error::PutError;
use crate::model::sample::{Event, Sample};
use crate::util::lock;

/// How many events a feeder hands over before the subscription reads them.
const FEED_AHEAD: usize = 1024;
/// And how many bytes of their values, one event at least: a recording's
/// samples may be up to 256 MiB each (a reader's limit), and a thousand
/// of those must not wait in memory for a slow subscription.
const FEED_AHEAD_BYTES: usize = 64 << 20;

/// How often a writing node's open chunk is looked at by its flusher
/// thread: a chunk is written out once it is `flush_every` old (1 s),
/// whether puts follow or not, so that a node killed while idle loses at
/// most that much (as `milonga record`).
const FLUSH_LOOK: Duration = Duration::from_millis(250);

/// The recording behind a `file:///` node.
pub(crate) struct FileNode {
    pub(crate) path: PathBuf,
    /// `None`: as fast as subscriptions take it.
    pub(crate) speed: Option<f64>,
    node: NodeId,
    name: String,
    sink: Mutex<Sink>,
    /// The thread that ends chunks while the node is idle, once it writes.
    flusher: Mutex<Option<std::thread::Thread>>,
    /// [`FEED_AHEAD_BYTES`] (tests lower it).
    ahead_bytes: std::sync::atomic::AtomicUsize,
}

enum Sink {
    /// No publisher yet.
    Idle,
    Writing {
        writer: Box<RecordWriter>,
        /// Appending: the copy being written, and the file it is renamed
        /// over at close (`path`, or the file a symbolic link there names).
        tmp: Option<(PathBuf, PathBuf)>,
        /// The recording, locked (`flock`) while this node writes it: a
        /// second node appending at once is refused rather than each
        /// replacing the other's copy.
        _lock: File,
    },
    /// Appending was refused (the reason): every later put says it,
    /// without copying the recording again.
    Refused(String),
    Closed,
}

fn now_ns() -> u64 {
    crate::util::now_ns()
}

impl FileNode {
    pub(crate) fn new(path: PathBuf, speed: Option<f64>, node: NodeId, name: &str) -> FileNode {
        FileNode {
            path,
            speed,
            node,
            name: name.to_owned(),
            sink: Mutex::new(Sink::Idle),
            flusher: Mutex::new(None),
            ahead_bytes: std::sync::atomic::AtomicUsize::new(FEED_AHEAD_BYTES),
        }
    }

    fn open_writer(&self) -> Result<Sink, RecordError> {
        let mut opts = RecordOptions::default();
        opts.metadata.insert("recorder".into(), self.name.clone());
        opts.metadata
            .insert("started_ns".into(), now_ns().to_string());
        if !self.path.exists() {
            if let Some(sink) = self.create(&opts)? {
                return Ok(sink);
            }
            // Another node created it first: appended to, once it closed.
        }
        // Appending: the recording so far, copied into a new file beside
        // the one the path names (a symbolic link's target: the link
        // stays a link).
        let lock = self.lock()?;
        let target = std::fs::canonicalize(&self.path).unwrap_or_else(|_| self.path.clone());
        let refused = |why: String| RecordError::Append {
            path: self.path.clone(),
            why,
        };
        let meta = std::fs::metadata(&target).map_err(|source| RecordError::Io {
            path: self.path.clone(),
            source,
        })?;
        {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            // The copy replaces it: a file nobody may write is not
            // replaced (whoever may write the directory could).
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o222 == 0 {
                return Err(refused(format!(
                    "it is read-only (mode {mode:04o}); it is left as it is"
                )));
            }
            if meta.nlink() > 1 {
                tracing::warn!(file = %self.path.display(), links = meta.nlink(), "the recording has other names (hard links): appending replaces this name's file, and the others keep the recording as it was");
            }
        }
        let tmp = tmp_path(&target);
        if std::fs::symlink_metadata(&tmp).is_ok() {
            // A node killed while appending (it held the lock this node
            // holds now) left its copy: the recording and what that node
            // added, cut short. Kept, beside, never removed.
            let aside = aside_path(&target);
            if let Err(e) = std::fs::rename(&tmp, &aside) {
                return Err(refused(format!(
                    "{} holds what a node killed while appending added, and cannot be moved aside ({e}): move it away to append; it is left as it is",
                    tmp.display()
                )));
            }
            tracing::warn!(file = %self.path.display(), kept = %aside.display(), "a node killed while appending to this recording left its copy, with the samples it added: kept beside it (milonga record --recover makes a finished recording of it)");
        }
        let mut reader = RecordReader::open(&target)?;
        // The copy is created with the recording's permissions (not wider
        // while the recording is copied into it; no set-id bits).
        let mode = {
            use std::os::unix::fs::PermissionsExt;
            meta.permissions().mode() & 0o777
        };
        let opts = RecordOptions { mode, ..opts };
        let (writer, _) =
            copy_recording(&mut reader, &tmp, &opts).map_err(|e| RecordError::Append {
                path: self.path.clone(),
                why: format!("its copy failed ({e}); it is left as it is"),
            })?;
        // The copy replaces the file when the node closes: only a finished
        // recording the copy holds whole is appended to, never one whose
        // damaged or foreign parts the copy would leave out.
        let refuse = if let Some(why) = reader.damage() {
            Some(format!(
                "it holds {} damaged chunks ({why})",
                reader.skipped().damaged_chunks
            ))
        } else if !reader.complete() {
            Some(match reader.truncated() {
                Some(why) => format!("it is damaged or cut short ({why})"),
                None => "it is not finished (no summary)".to_owned(),
            })
        } else if !reader.skipped().is_empty() {
            Some(format!(
                "it holds what a copy would leave out: {}",
                reader.skipped()
            ))
        } else {
            None
        };
        if let Some(why) = refuse {
            writer.abandon();
            let _ = std::fs::remove_file(&tmp);
            return Err(RecordError::Append {
                path: self.path.clone(),
                why: format!("{why}; it is left as it is (milonga record --recover writes a clean copy, which can be appended to)"),
            });
        }
        // Exactly the recording's (the umask may have taken some away).
        let perms = std::os::unix::fs::PermissionsExt::from_mode(mode);
        let _ = std::fs::set_permissions(&tmp, perms);
        Ok(Sink::Writing {
            writer: Box::new(writer),
            tmp: Some((tmp, target)),
            _lock: lock,
        })
    }

    /// A new recording at `path`, locked for this node before any other
    /// node can see it: written under a hidden name of its own
    /// (`.milonga-new-<node id>` beside it), locked, then linked at `path`,
    /// which fails if another node created `path` meanwhile (`None`: that
    /// node's file is appended to, once it closes). Created in place, as
    /// before, where no hidden file can be made or linked there (a file
    /// system without hard links).
    fn create(&self, opts: &RecordOptions) -> Result<Option<Sink>, RecordError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        remove_stale_new_files(dir);
        let new = dir.join(format!("{NEW_PREFIX}{}", self.node.to_hex()));
        let _ = std::fs::remove_file(&new);
        let mut writer = match RecordWriter::create(&new, opts) {
            Ok(w) => Box::new(w),
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "no hidden file can be made beside the recording: it is created in place");
                return self.create_in_place(opts).map(Some);
            }
        };
        // A file none but this node has seen: its lock is this node's.
        if let Err(e) = crate::util::sys::try_lock(writer.file()) {
            tracing::warn!(file = %self.path.display(), error = %e, "the recording cannot be locked: a second node writing it at once is not refused");
        }
        let lock = match writer.file().try_clone() {
            Ok(lock) => lock,
            Err(e) => {
                writer.abandon();
                let _ = std::fs::remove_file(&new);
                return Err(RecordError::Io {
                    path: self.path.clone(),
                    source: e,
                });
            }
        };
        let linked = std::fs::hard_link(&new, &self.path);
        let _ = std::fs::remove_file(&new);
        // The name on the disk: a power loss must not leave the hidden
        // name alone, which the next creation takes for a killed node's.
        crate::util::sys::sync_dir(dir);
        match linked {
            Ok(()) => {
                writer.moved_to(&self.path);
                Ok(Some(Sink::Writing {
                    writer,
                    tmp: None,
                    _lock: lock,
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                writer.abandon();
                Ok(None)
            }
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "the new recording cannot be linked into place: it is created in place (a second node creating it at once may be refused)");
                writer.abandon();
                self.create_in_place(opts).map(Some)
            }
        }
    }

    /// A new recording written where it lies, locked once created.
    fn create_in_place(&self, opts: &RecordOptions) -> Result<Sink, RecordError> {
        let writer = Box::new(RecordWriter::create(&self.path, opts)?);
        let lock = self.lock()?;
        Ok(Sink::Writing {
            writer,
            tmp: None,
            _lock: lock,
        })
    }

    /// The recording at `path`, locked for this node: refused if another
    /// node (here or in another process) writes it now. Locked, the file
    /// must still be the one at `path` (an appender that finished meanwhile
    /// put its copy there): else the new one is locked.
    fn lock(&self) -> Result<File, RecordError> {
        let io = |source| RecordError::Io {
            path: self.path.clone(),
            source,
        };
        loop {
            let f = crate::util::sys::open_regular(&self.path).map_err(io)?;
            match crate::util::sys::try_lock(&f) {
                Ok(true) => {}
                // Not cached as a refusal: a later put tries again.
                Ok(false) => {
                    return Err(io(std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        "another node writes it now (a put tries again)",
                    )))
                }
                // A file system without such locks (some NFS and FUSE
                // mounts): written unlocked, as before locks were taken.
                Err(e) => {
                    tracing::warn!(file = %self.path.display(), error = %e, "the recording cannot be locked: a second node writing it at once is not refused");
                    return Ok(f);
                }
            }
            use std::os::unix::fs::MetadataExt;
            let (locked, now) = (
                f.metadata().map_err(io)?,
                std::fs::metadata(&self.path).map_err(io)?,
            );
            if (locked.dev(), locked.ino()) == (now.dev(), now.ino()) {
                return Ok(f);
            }
        }
    }

    /// Leaves out the next `n` sequence numbers of a publisher
    /// ([`crate::Publisher::skip`]): the recording shows the gap.
    pub(crate) fn skip(&self, seq: &AtomicU64, n: u64) {
        let _sink = lock(&self.sink);
        let s = seq.load(Ordering::Relaxed);
        seq.store(s.saturating_add(n), Ordering::Relaxed);
    }

    /// Writes one sample of `key` put by this node: its sequence number
    /// is the next of `seq`, its timestamp `timestamp_ns` or now.
    pub(crate) fn put(
        self: &Arc<Self>,
        key: &str,
        seq: &AtomicU64,
        enc: Encoded,
        schema_id: u32,
        timestamp_ns: Option<u64>,
        replayed: bool,
    ) -> Result<(), PutError> {
        let value = decode_payload(enc.encoding, enc.head, enc.tail)
            .map_err(|e| PutError::Recording(format!("{key}: {e}")))?;
        let mut sink = lock(&self.sink);
        if matches!(*sink, Sink::Idle) {
            *sink = match self.open_writer() {
                Ok(s) => s,
                // Appending refused: said at every put, the file read once.
                Err(e @ RecordError::Append { .. }) => Sink::Refused(e.to_string()),
                Err(e) => return Err(PutError::Recording(e.to_string())),
            };
            if matches!(*sink, Sink::Writing { .. }) {
                self.start_flusher();
            }
        }
        let writer = match &mut *sink {
            Sink::Writing { writer, .. } => writer,
            Sink::Refused(why) => return Err(PutError::Recording(why.clone())),
            Sink::Idle | Sink::Closed => return Err(PutError::Closed),
        };
        let now = now_ns();
        let n = seq.load(Ordering::Relaxed) + 1;
        let sample = Sample {
            key: key.to_owned(),
            value,
            publisher: self.node,
            seq: n,
            timestamp_ns: timestamp_ns.unwrap_or(now),
            encoding: enc.encoding,
            schema_id,
            replayed,
            compact: None,
        };
        writer
            .sample(&sample, now)
            .map_err(|e| PutError::Recording(e.to_string()))?;
        writer
            .tick()
            .map_err(|e| PutError::Recording(e.to_string()))?;
        seq.store(n, Ordering::Relaxed);
        Ok(())
    }

    /// Starts the thread that writes out the open chunk once it is
    /// `flush_every` old while no put comes ([`FLUSH_LOOK`]); it ends with
    /// the node, or at the first failed write (which every later put
    /// reports).
    fn start_flusher(self: &Arc<Self>) {
        let mut flusher = lock(&self.flusher);
        if flusher.is_some() {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("milonga-file-flush".into())
            .spawn(move || loop {
                std::thread::park_timeout(FLUSH_LOOK);
                let Some(node) = me.upgrade() else {
                    return;
                };
                let mut sink = lock(&node.sink);
                match &mut *sink {
                    Sink::Writing { writer, .. } => {
                        if let Err(e) = writer.tick() {
                            tracing::error!(file = %node.path.display(), error = %e, "the recording's open chunk could not be written out");
                            return;
                        }
                    }
                    Sink::Closed => return,
                    Sink::Idle | Sink::Refused(_) => {}
                }
            });
        match spawned {
            Ok(t) => *flusher = Some(t.thread().clone()),
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e, "no thread to write out chunks while idle: a chunk waits for the next put")
            }
        }
    }

    /// Finishes the recording (and puts an appended copy in its place).
    /// Idempotent; a failure is logged, the file then left as it is.
    pub(crate) fn close(&self) {
        let sink = std::mem::replace(&mut *lock(&self.sink), Sink::Closed);
        if let Some(t) = lock(&self.flusher).as_ref() {
            t.unpark();
        }
        if let Sink::Writing { writer, tmp, .. } = sink {
            let done = writer.finish().and_then(|_| match &tmp {
                Some((t, target)) => {
                    let renamed = std::fs::rename(t, target).map_err(|source| RecordError::Io {
                        path: self.path.clone(),
                        source,
                    });
                    // The copy in place on the disk, not only in memory.
                    if renamed.is_ok() {
                        crate::util::sys::sync_dir(target.parent().unwrap_or(Path::new(".")));
                    }
                    renamed
                }
                None => Ok(()),
            });
            if let Err(e) = done {
                tracing::error!(file = %self.path.display(), error = %e, "the recording could not be finished");
            }
        }
    }

    /// Starts the thread that reads the recording into `sub`, once it is
    /// open: no recording at the path (none written there yet, or a typo),
    /// or a file that is not one, is the subscription's error, not an
    /// empty recording.
    pub(crate) fn feed(
        self: &Arc<Self>,
        sub: Arc<SubShared>,
        expr: KeyExpr,
    ) -> Result<(), crate::SubscribeError> {
        let reader = RecordReader::open(&self.path)
            .map_err(|e| crate::SubscribeError::Recording(e.to_string()))?;
        let me = self.clone();
        std::thread::Builder::new()
            .name(format!("milonga-file {expr}"))
            .spawn(move || {
                if let Err(e) = me.read_into(reader, &sub, &expr) {
                    tracing::error!(file = %me.path.display(), error = %e, "reading the recording failed; the subscription ends there");
                }
                sub.ended.store(true, Ordering::Release);
                sub.wake();
            })
            .map(|_| ())
            .map_err(crate::SubscribeError::Thread)
    }

    fn read_into(
        &self,
        mut reader: RecordReader,
        sub: &SubShared,
        expr: &KeyExpr,
    ) -> Result<(), RecordError> {
        let start = Instant::now();
        let mut first: Option<u64> = None;
        while let Some(entry) = reader.next_entry()? {
            if sub.stopped() {
                return Ok(());
            }
            let (ev, at) = match entry {
                Entry::Sample(s, at) => (Event::Sample(s), at),
                Entry::Event(ev, at) => (ev, at),
            };
            if !wanted(&ev, expr) {
                continue;
            }
            if let Some(speed) = self.speed {
                let t0 = *first.get_or_insert(at);
                let due = start + Duration::from_nanos(at.saturating_sub(t0)).div_f64(speed);
                let wait = due.saturating_duration_since(Instant::now());
                if wait >= Duration::from_secs(10) {
                    tracing::warn!(file = %self.path.display(), wait_s = wait.as_secs(), "the recording is silent here: its next event is due after a long wait at this file_speed");
                }
                while let Some(d) = due.checked_duration_since(Instant::now()) {
                    if sub.stopped() {
                        return Ok(());
                    }
                    std::thread::sleep(d.min(Duration::from_millis(100)));
                }
            }
            // At most FEED_AHEAD events and FEED_AHEAD_BYTES of their
            // values wait for the reader (who takes them all at once, and
            // sets the bytes back to 0).
            let bytes = event_bytes(&ev);
            let ahead = self.ahead_bytes.load(Ordering::Relaxed);
            loop {
                let waiting = lock(&sub.injected).len();
                let full = waiting >= FEED_AHEAD
                    || waiting > 0 && sub.injected_bytes.load(Ordering::Acquire) + bytes > ahead;
                if !full {
                    break;
                }
                if sub.stopped() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            {
                let mut q = lock(&sub.injected);
                sub.injected_bytes.fetch_add(bytes, Ordering::AcqRel);
                q.push_back(ev);
            }
            sub.has_injected.store(true, Ordering::Release);
            sub.wake();
        }
        if let Some(why) = reader.truncated() {
            tracing::warn!(file = %self.path.display(), %why, "the recording was cut short; read to its last complete record");
        }
        if !reader.skipped().is_empty() {
            tracing::warn!(file = %self.path.display(), skipped = %reader.skipped(), damage = reader.damage().unwrap_or("none"), "the recording holds what a subscription cannot read");
        }
        Ok(())
    }
}

/// About the bytes an event holds ([`milonga_wire::Value::approx_bytes`]).
fn event_bytes(ev: &Event) -> usize {
    match ev {
        Event::Sample(s) => s.value.approx_bytes(),
        _ => 64,
    }
}

/// Whether a recorded event belongs to a subscription of `expr`: samples
/// and losses of its keys, and the events of no key.
fn wanted(ev: &Event, expr: &KeyExpr) -> bool {
    match ev {
        Event::Sample(s) => expr.matches(&s.key),
        Event::Lost(l) => expr.matches(&l.key),
        Event::DeadlineMissed(d) => expr.matches(&d.key),
        Event::IncompatibleQos(q) => expr.matches(&q.key),
        _ => true,
    }
}

/// The hidden name a node writes a new recording under before linking it
/// into place, its node id after it.
const NEW_PREFIX: &str = ".milonga-new-";

/// The hidden files of `dir` that a node killed while creating a new
/// recording left (before its link, or between the link and the removal
/// of the hidden name, which then keeps that recording's space): removed
/// once a minute old when no node holds their lock.
fn remove_stale_new_files(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(NEW_PREFIX) {
            continue;
        }
        // Only a node's files: a FIFO or a device of that name (anyone
        // who can write the directory can make one) would block the open.
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Ok(f) = crate::util::sys::open_regular(&e.path()) else {
            continue;
        };
        let old = f
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > Duration::from_secs(60));
        if old && matches!(crate::util::sys::try_lock(&f), Ok(true)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Where a killed appender's copy is kept: `NAME.unfinished-<ns>.mcap`
/// beside the recording.
fn aside_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".unfinished-{}.mcap", now_ns()));
    path.with_file_name(name)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".milonga-tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subscription that does not read a recording of large samples
    /// holds at most about FEED_AHEAD_BYTES of them waiting (here lowered
    /// to 1 MiB, samples of 256 KiB): a 31 KB hostile file of twelve
    /// 64 MiB values made a reader that did not keep up hold 808 MB, the
    /// bound being 1,024 events of any size.
    #[test]
    fn a_subscription_that_does_not_read_holds_a_bounded_number_of_bytes() {
        let dir = std::env::temp_dir().join(format!("mlg-feed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("big.mcap");
        let _ = std::fs::remove_file(&path);
        let locator = format!("file://{}", path.display());
        let w = crate::Node::open(&locator, "writer").unwrap();
        let p = w.publisher("big/k").unwrap();
        for i in 0..20u8 {
            p.put(milonga_wire::Value::Bytes(vec![i; 256 << 10].into()))
                .unwrap();
        }
        drop(p);
        w.close();
        let r = crate::Node::open(&locator, "reader").unwrap();
        let file = r.file.clone().unwrap();
        file.ahead_bytes.store(1 << 20, Ordering::Relaxed);
        let sub = r.subscribe("big/**").unwrap();
        // The feeder fills what it may, then waits: its queue no longer
        // grows.
        let queued = || lock(&sub.shared.injected).len();
        let end = Instant::now() + Duration::from_secs(10);
        // Its thread started (a busy machine may take a while).
        while queued() == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut last = usize::MAX;
        while queued() != last && Instant::now() < end {
            last = queued();
            std::thread::sleep(Duration::from_millis(200));
        }
        let bytes = sub.shared.injected_bytes.load(Ordering::Acquire);
        assert!(
            (3..=4).contains(&last),
            "{last} samples waiting, {bytes} bytes"
        );
        assert!(bytes <= 1 << 20, "{bytes}");
        // Read, they all come.
        let mut n = 0;
        while let Ok(ev) = sub.recv_timeout(Duration::from_secs(5)) {
            if matches!(ev, Event::Sample(_)) {
                n += 1;
            }
        }
        assert_eq!(n, 20);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
