//! `milonga record`, `cat`, `info` and `replay`: recordings in MCAP files
//! (docs/recording.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::recording::{
    Compression, Entry, RecordError, RecordOptions, RecordReader, RecordWriter,
};
use milonga::{Event, KeyExpr, LostSamples, NodeId, PublisherQos, SubscriberQos};

use crate::{catch_interrupts, interrupted, json, NetArgs};

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Key expressions to record (one subscription each).
    #[arg(required_unless_present = "recover")]
    exprs: Vec<String>,
    /// The file to write (never overwritten). With --max-bytes or
    /// --split-every, files STEM-0000.mcap, STEM-0001.mcap, ... beside it
    /// (and STEM-0001.mcap, ... after it once it holds 65,536 channels).
    #[arg(short, long)]
    output: PathBuf,
    /// Stop after this many seconds.
    #[arg(long, value_parser = crate::args::seconds)]
    duration: Option<f64>,
    /// Start a new file when this one holds this many bytes (chunks then
    /// hold about an eighth of it, 4 KiB at least, so that a file passes
    /// it by at most one chunk, one sample and its summary).
    #[arg(long, value_parser = clap::value_parser!(u64).range(MIN_MAX_BYTES..))]
    max_bytes: Option<u64>,
    /// Start a new file every this many seconds (at least 1).
    #[arg(long, value_parser = split_seconds)]
    split_every: Option<f64>,
    /// Chunk compression: zstd, lz4 or none.
    #[arg(long, default_value = "zstd")]
    compression: Compression,
    /// Subscribe reliably: gaps from reliable publishers with history are
    /// repaired, and a slow disk holds those publishers back.
    #[arg(long)]
    reliable: bool,
    /// Start with the last N samples publishers keep of each key.
    #[arg(long, default_value_t = 0)]
    last: usize,
    /// Record a `deadline_missed` event for a key silent longer than this
    /// many milliseconds (and again each period until it speaks, so that
    /// the recording shows when a key fell silent; at most a year).
    #[arg(long, value_parser = crate::args::deadline_millis)]
    deadline_ms: Option<f64>,
    /// Write a clean copy of DAMAGED (a recording cut short by a crash or
    /// a full disk) to --output: every complete record, and a summary.
    #[arg(long, value_name = "DAMAGED",
          conflicts_with_all = ["exprs", "duration", "max_bytes", "split_every", "reliable", "last", "deadline_ms"])]
    recover: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CatArgs {
    /// The recording.
    file: PathBuf,
    /// One JSON object per line, as `milonga sub --json` prints them, with
    /// `received_ns`.
    #[arg(long)]
    json: bool,
    /// Only the samples of keys this expression matches (events stay).
    #[arg(long)]
    keys: Option<String>,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The recording.
    file: PathBuf,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The recording.
    file: PathBuf,
    /// 1 is the recorded pace, 2 twice as fast, `max` as fast as the
    /// subscribers take them (reliable publishers).
    #[arg(long, default_value = "1", value_parser = replay_speed)]
    speed: Speed,
    /// Only the keys this expression matches.
    #[arg(long)]
    keys: Option<String>,
    /// Start this many seconds into the recording (by receive time), or
    /// at this time (RFC 3339: 2026-11-23T10:00:00Z).
    #[arg(long, value_parser = parse_bound)]
    from: Option<Bound>,
    /// Stop this many seconds into the recording, or at this time.
    #[arg(long, value_parser = parse_bound)]
    to: Option<Bound>,
    /// Start over at the end, until interrupted.
    #[arg(long = "loop")]
    repeat: bool,
    /// Wait for this many subscribers of every replayed key first.
    #[arg(long, default_value_t = 0)]
    wait_subscribers: u32,
    /// How long to wait for them, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = crate::args::seconds)]
    wait_timeout: f64,
}

/// Where `replay --from/--to` are.
#[derive(Debug, Clone, Copy)]
pub enum Bound {
    /// Nanoseconds after the recording's first entry.
    Offset(u64),
    /// A receive time, ns since the Unix epoch.
    At(u64),
}

impl Bound {
    /// Nanoseconds after `t0`, the first entry's receive time (a time
    /// before it: negative).
    fn offset(self, t0: u64) -> i128 {
        match self {
            Bound::Offset(n) => i128::from(n),
            Bound::At(t) => i128::from(t) - i128::from(t0),
        }
    }
}

fn parse_bound(s: &str) -> Result<Bound, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return if secs >= 0.0 && secs.is_finite() {
            Ok(Bound::Offset((secs * 1e9) as u64))
        } else {
            Err(format!("{s}: seconds must be zero or more"))
        };
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("{s}: seconds into the recording, or an RFC 3339 time ({e})"))?;
    let ns = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{s}: before 1970"))?
        .as_nanos();
    let ns = u64::try_from(ns).map_err(|_| format!("{s}: after 2554, past any receive time"))?;
    Ok(Bound::At(ns))
}

/// The smallest `--max-bytes`: a chunk (4 KiB at least) and its file's
/// header, metadata and summary.
const MIN_MAX_BYTES: u64 = 16 << 10;

/// `--split-every`: seconds, at least 1 (a file a second at most).
fn split_seconds(s: &str) -> Result<f64, String> {
    let v = crate::args::seconds(s)?;
    if v < 1.0 {
        return Err(format!("{v}: a new file at most every second (1 or more)"));
    }
    Ok(v)
}

/// The chunk size for files of at most `max_bytes`: an eighth of it,
/// between 4 KiB and the default 1 MiB. A file ends at the first chunk
/// that takes it to `max_bytes`, so it passes that by at most one chunk
/// (and the chunk's message index and the summary).
pub(crate) fn chunk_bytes_for(max_bytes: Option<u64>) -> u64 {
    let default = RecordOptions::default().chunk_bytes;
    max_bytes.map_or(default, |m| (m / 8).clamp(4096, default))
}

/// The time now, UNIX ns.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// When the recorder's loop looks at its timers (`--duration`,
/// `--split-every`, the writer's chunk timer) and the file's size: when it
/// waited for nothing, after a chunk was written, and otherwise once the
/// receive times of its events moved 10 ms past the last look. Each look
/// reads the clock, about 19 ns here, half as much as the rest of a
/// 92-byte sample's record (docs/benchmarks.md "Recording"); the events
/// come with their receive times.
#[derive(Debug, Default)]
pub(crate) struct Looks {
    /// The receive time of the event at the last look.
    at: u64,
}

impl Looks {
    /// How far the events' receive times move between two looks.
    const EVERY_NS: u64 = 10_000_000;

    /// Whether to look after an event received at `at`; `wrote`: whether
    /// it ended a chunk.
    pub(crate) fn after_event(&mut self, at: u64, wrote: bool) -> bool {
        // A clock stepped back makes a look, early but harmless.
        if wrote || at.abs_diff(self.at) >= Self::EVERY_NS {
            self.at = at;
            return true;
        }
        false
    }
}

/// Where the recorder's events come from.
enum Source {
    /// One expression: its subscription's own queue, read in the
    /// recorder's loop (no hop through another thread per sample).
    One(milonga::Subscriber),
    /// Several: their dispatchers hand events over a bounded queue. A
    /// disk slower than the stream holds the dispatchers, so a reliable
    /// subscription holds its publishers back and a best-effort one
    /// reports what it loses (recorded as `lost` events), as a single
    /// subscription's own queue does. Expressions may overlap: what
    /// several subscriptions tell (a sample of a key both match, a loss,
    /// a node's events) is recorded once ([`NodeEvents`]). The flag says
    /// whether another expression matches the event's key.
    Many(
        Vec<milonga::Subscriber>,
        crossbeam_channel::Receiver<(Event, u64, bool)>,
        NodeEvents,
    ),
}

/// The sequence numbers recorded lately of a key several expressions
/// match: a window of the last 1,024 up to the highest (a copy that comes
/// later than that through the slower subscription is recorded again, a
/// duplicate rather than a loss).
struct Window {
    high: u64,
    bits: [u64; 16],
}

impl Window {
    const SIZE: u64 = 1024;

    fn new(seq: u64) -> Window {
        let mut w = Window {
            high: seq,
            bits: [0; 16],
        };
        w.set(seq);
        w
    }

    fn bit(seq: u64) -> (usize, u64) {
        let i = seq % Self::SIZE;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn set(&mut self, seq: u64) {
        let (i, b) = Self::bit(seq);
        self.bits[i] |= b;
    }

    /// Whether `seq` was not recorded yet (and now is).
    fn is_new(&mut self, seq: u64) -> bool {
        if seq > self.high {
            if seq - self.high >= Self::SIZE {
                self.bits = [0; 16];
            } else {
                for s in self.high + 1..seq {
                    let (i, b) = Self::bit(s);
                    self.bits[i] &= !b;
                }
                let (i, b) = Self::bit(seq);
                self.bits[i] &= !b;
            }
            self.high = seq;
            self.set(seq);
            return true;
        }
        // Older than the window (a publisher that started over): new.
        if self.high - seq >= Self::SIZE {
            return true;
        }
        let (i, b) = Self::bit(seq);
        let new = self.bits[i] & b == 0;
        self.bits[i] |= b;
        new
    }
}

/// The key an event is about, if it is about one.
fn key_of(ev: &Event) -> Option<&str> {
    match ev {
        Event::Sample(s) => Some(&s.key),
        Event::Lost(l) => Some(&l.key),
        Event::DeadlineMissed(d) => Some(&d.key),
        Event::IncompatibleQos(q) => Some(&q.key),
        _ => None,
    }
}

/// What several subscriptions tell, recorded once: a sample of a key
/// several expressions match once by its sequence number ([`Window`]); a
/// publisher's liveliness as its changes (alive, lost, alive again); a
/// loss, deadline or QoS report of such a key, and a refusal, once when
/// several subscriptions tell it within a second (broker changes are
/// counted where they are told, [`BrokerChanges`]).
#[derive(Default)]
struct NodeEvents {
    /// Each publisher told alive (`true`) or lost, at most 65,536 (then
    /// forgotten, and told again).
    alive: std::collections::HashMap<NodeId, bool>,
    /// Other events recorded in the last second (at most 256).
    recent: std::collections::VecDeque<(Event, u64)>,
    /// Per publisher, the keys several expressions match: their windows
    /// (at most 65,536 keys in all, then forgotten: a copy may then be
    /// recorded twice, never a sample left out). A publisher lost starts
    /// its keys over (it may come back numbering from 1).
    seen: std::collections::HashMap<NodeId, std::collections::HashMap<String, Window>>,
    keys_seen: usize,
}

impl NodeEvents {
    /// Whether `ev`, received at `at`, is to be recorded; `overlap`:
    /// another expression matches its key.
    fn is_new(&mut self, ev: &Event, at: u64, overlap: bool) -> bool {
        if let (true, Event::Sample(s)) = (overlap, ev) {
            if self.keys_seen >= 1 << 16 {
                self.seen.clear();
                self.keys_seen = 0;
            }
            let keys = self.seen.entry(s.publisher).or_default();
            return match keys.get_mut(s.key.as_str()) {
                Some(w) => w.is_new(s.seq),
                None => {
                    keys.insert(s.key.clone(), Window::new(s.seq));
                    self.keys_seen += 1;
                    true
                }
            };
        }
        let mut changed = |publisher: NodeId, alive: bool| {
            if self.alive.len() >= 1 << 16 {
                self.alive.clear();
            }
            self.alive.insert(publisher, alive) != Some(alive)
        };
        match ev {
            Event::PublisherAlive(a) => changed(a.publisher, true),
            Event::PublisherLost(l) => {
                if let Some(keys) = self.seen.remove(&l.publisher) {
                    self.keys_seen -= keys.len();
                }
                changed(l.publisher, false)
            }
            Event::Lost(_) | Event::DeadlineMissed(_) | Event::IncompatibleQos(_) if !overlap => {
                true
            }
            Event::Lost(_)
            | Event::DeadlineMissed(_)
            | Event::IncompatibleQos(_)
            | Event::PermissionDenied(_) => {
                while self.recent.front().is_some_and(|(_, t)| {
                    at.abs_diff(*t) > 1_000_000_000 || self.recent.len() >= 256
                }) {
                    self.recent.pop_front();
                }
                if self.recent.iter().any(|(e, _)| e == ev) {
                    return false;
                }
                self.recent.push_back((ev.clone(), at));
                true
            }
            _ => true,
        }
    }
}

/// The node's broker changes, which each of its subscriptions tells, in
/// the same order: the n-th change is recorded by the first subscription
/// to tell it (an equality test over a second dropped a change back to a
/// broker left less than a second before).
#[derive(Clone, Default)]
struct BrokerChanges(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl BrokerChanges {
    /// A subscription that has told `told` changes tells one more: whether
    /// no other told that one first.
    fn first_to_tell(&self, told: &mut u64) -> bool {
        *told += 1;
        self.0
            .fetch_max(*told, std::sync::atomic::Ordering::Relaxed)
            < *told
    }
}

/// What [`Source::next`] found.
enum Next {
    /// An event, and when it was received (UNIX time, ns).
    Event(Event, u64),
    /// Nothing within the timeout.
    Nothing,
    /// The subscriptions are gone.
    Closed,
}

impl Source {
    fn subscribe(node: &milonga::Node, exprs: &[KeyExpr], qos: SubscriberQos) -> Result<Source> {
        Source::subscribe_with_queue(node, exprs, qos, 4096)
    }

    /// As [`Source::subscribe`], several expressions merged over a queue
    /// of `queue` events.
    fn subscribe_with_queue(
        node: &milonga::Node,
        exprs: &[KeyExpr],
        qos: SubscriberQos,
        queue: usize,
    ) -> Result<Source> {
        if let [one] = exprs {
            return Ok(Source::One(node.subscribe_with(one.as_str(), qos)?));
        }
        let (tx, rx) = crossbeam_channel::bounded::<(Event, u64, bool)>(queue);
        let mut subs = Vec::new();
        let changes = BrokerChanges::default();
        for (i, e) in exprs.iter().enumerate() {
            let tx = tx.clone();
            let changes = changes.clone();
            let mut told = 0;
            // The other expressions: a key one of them matches too comes
            // through both subscriptions, each of them on its own.
            let others: Vec<KeyExpr> = exprs
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, e)| e.clone())
                .collect();
            subs.push(node.subscribe_callback(e.as_str(), qos.clone(), move |ev| {
                // Every subscription tells each of the node's broker
                // changes: recorded once.
                if matches!(ev, Event::BrokerChanged(_)) && !changes.first_to_tell(&mut told) {
                    return;
                }
                let overlap = key_of(&ev).is_some_and(|k| others.iter().any(|o| o.matches(k)));
                let _ = tx.send((ev, now_ns(), overlap));
            })?);
        }
        Ok(Source::Many(subs, rx, NodeEvents::default()))
    }

    /// The next event, waiting up to `timeout`.
    fn next(&mut self, timeout: Duration) -> Next {
        match self {
            // The receive time of the message that carried it: one clock
            // reading for a batch's samples.
            Source::One(sub) => match sub.recv_timeout_stamped(timeout) {
                Ok((ev, at)) => Next::Event(ev, at),
                Err(milonga::RecvError::Timeout | milonga::RecvError::Empty) => Next::Nothing,
                Err(_) => Next::Closed,
            },
            Source::Many(_, rx, told) => {
                match rx.recv_timeout(timeout).map_err(|e| e.is_disconnected()) {
                    Ok((ev, at, overlap)) if told.is_new(&ev, at, overlap) => Next::Event(ev, at),
                    // Told already by another subscription.
                    Ok(_) | Err(false) => Next::Nothing,
                    Err(true) => Next::Closed,
                }
            }
        }
    }

    /// Closes the subscriptions. With several, what their dispatchers
    /// hand over until they are closed goes to `write` (read while they
    /// close: a dispatcher blocked on the full queue would otherwise never
    /// let its subscription close), until `write` fails. A single
    /// subscription's queue holds what arrived after the last event the
    /// loop took: not written, as a sample published after the stop.
    fn close(self, mut write: impl FnMut(Event, u64) -> Result<()>) -> Result<()> {
        let (subs, rx, mut told) = match self {
            Source::One(sub) => {
                drop(sub);
                return Ok(());
            }
            Source::Many(subs, rx, told) => (subs, rx, told),
        };
        let closing = std::thread::spawn(move || drop(subs));
        let mut result = Ok(());
        while result.is_ok() {
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok((ev, at, overlap)) if told.is_new(&ev, at, overlap) => result = write(ev, at),
                Ok(_) => {}
                // Every callback (and its sender) is gone.
                Err(e) if e.is_disconnected() => break,
                Err(_) if closing.is_finished() && rx.is_empty() => break,
                Err(_) => {}
            }
        }
        // After a failed write, a dispatcher still sending is let go.
        drop(rx);
        let _ = closing.join();
        result
    }
}

/// The name of file `n` of a split recording: `STEM-000n.mcap`.
fn split_name(output: &Path, n: u32) -> PathBuf {
    let stem = output
        .file_stem()
        .map_or_else(|| "recording".into(), |s| s.to_string_lossy().into_owned());
    output.with_file_name(format!("{stem}-{n:04}.mcap"))
}

pub fn cmd_record(net: &NetArgs, a: RecordArgs) -> Result<ExitCode> {
    if let Some(damaged) = &a.recover {
        return recover(damaged, &a.output, a.compression);
    }
    let exprs = a
        .exprs
        .iter()
        .map(|e| KeyExpr::new(e.as_str()).with_context(|| format!("key expression {e:?}")))
        .collect::<Result<Vec<_>>>()?;
    let mut qos = SubscriberQos::default().last(a.last);
    if a.reliable {
        qos = qos.reliable();
    }
    if let Some(ms) = a.deadline_ms {
        qos = qos.deadline(Duration::from_secs_f64(ms / 1000.0));
    }
    let node = net.open("record")?;
    let mut meta = BTreeMap::new();
    meta.insert("domain".to_owned(), node.domain().to_owned());
    meta.insert("expressions".to_owned(), a.exprs.join(" "));
    meta.insert("recorder".to_owned(), node.name().to_owned());
    meta.insert("started_ns".to_owned(), now_ns().to_string());
    let opts = RecordOptions {
        compression: a.compression,
        metadata: meta,
        chunk_bytes: chunk_bytes_for(a.max_bytes),
        ..RecordOptions::default()
    };
    let split = a.max_bytes.is_some() || a.split_every.is_some();
    // Before the file exists: a stop from then on finishes it.
    catch_interrupts();
    // Subscribed first: a subscription refused makes no file.
    let mut source = Source::subscribe(&node, &exprs, qos)?;
    let mut out = Files::create(&a.output, split, opts)?;
    let start = Instant::now();
    let end = a.duration.map(|d| start + Duration::from_secs_f64(d));
    let result: Result<()> = (|| {
        let mut looks = Looks::default();
        while !interrupted() {
            let written = out.w.bytes();
            let look = match source.next(Duration::from_millis(100)) {
                Next::Event(ev, at) => {
                    out.event(ev, at)?;
                    looks.after_event(at, out.w.bytes() != written)
                }
                Next::Nothing => true,
                Next::Closed => break,
            };
            if !look {
                continue;
            }
            if end.is_some_and(|t| Instant::now() >= t) {
                break;
            }
            out.w.tick()?;
            // Full once a chunk takes it past the limit: never a file of
            // its header alone.
            let full = a
                .max_bytes
                .is_some_and(|m| out.w.bytes() >= m && out.w.chunks() > 0);
            let old = a
                .split_every
                .is_some_and(|s| out.started.elapsed() >= Duration::from_secs_f64(s));
            if full || old {
                out.next_file()?;
            }
        }
        Ok(())
    })();
    // Events handed over before the subscriptions closed are written
    // before the file is finished (Source::close).
    if result.is_ok() {
        source.close(|ev, at| out.event(ev, at))?;
    } else {
        source.close(|_, _| Ok(()))?;
    }
    node.close();
    if let Err(e) = result {
        let path = out.path.clone();
        // A failed write (a full disk) leaves the file as it is, without a
        // summary, so that no reader takes it for complete (its finished
        // chunks read); anything else (the next file of a split that
        // cannot be made) lets it be finished.
        match out.finish() {
            Ok(_) => bail!(
                "recording stopped: {}; {} is finished, with what was recorded before",
                crate::said_once(&e),
                path.display()
            ),
            Err(_) => bail!(
                "recording stopped: {}; {} holds what was written before (milonga record --recover makes a clean copy)",
                crate::said_once(&e),
                path.display()
            ),
        }
    }
    let (samples, events, unrecorded, files) =
        (out.samples, out.events, out.unrecorded, out.no + 1);
    let total_bytes = out.finish()?;
    let unrecorded = match unrecorded {
        0 => String::new(),
        n => format!(" ({n} samples could not be recorded, each recorded as lost)"),
    };
    eprintln!(
        "milonga record: {samples} samples and {events} events in {files} file(s), {total_bytes} bytes{unrecorded}"
    );
    Ok(ExitCode::SUCCESS)
}

/// The files a recorder writes: one, or a numbered series (`split`, or
/// once a file holds 65,536 channels, MCAP's most).
struct Files {
    w: RecordWriter,
    output: PathBuf,
    opts: RecordOptions,
    /// The file being written, its number, and when it was started.
    path: PathBuf,
    no: u32,
    started: Instant,
    /// Bytes of the files finished.
    bytes: u64,
    samples: u64,
    events: u64,
    /// Samples whose value could not be written (recorded as lost).
    unrecorded: u64,
}

impl Files {
    fn create(output: &Path, split: bool, opts: RecordOptions) -> Result<Files> {
        let path = if split {
            split_name(output, 0)
        } else {
            output.to_path_buf()
        };
        Ok(Files {
            w: RecordWriter::create(&path, &opts)?,
            output: output.to_path_buf(),
            opts,
            path,
            no: 0,
            started: Instant::now(),
            bytes: 0,
            samples: 0,
            events: 0,
            unrecorded: 0,
        })
    }

    /// Finishes this file and starts the next (numbered as a split
    /// recording's, the first file keeping its name when not split).
    fn next_file(&mut self) -> Result<()> {
        let path = split_name(&self.output, self.no + 1);
        let next = RecordWriter::create(&path, &self.opts)?;
        self.bytes += std::mem::replace(&mut self.w, next).finish()?;
        self.no += 1;
        self.path = path;
        self.started = Instant::now();
        Ok(())
    }

    /// Records one event. A sample whose value cannot be written (a
    /// publisher's malformed compact payload) is recorded as lost and
    /// counted, and said (the first ten, then every 1,000th), rather than
    /// stopping the recorder; a sample of a 65,537th channel starts the
    /// next file. Only a failed write stops it.
    fn event(&mut self, ev: Event, at: u64) -> Result<()> {
        let written = match self.w.event(&ev, at) {
            Err(RecordError::Channels { .. }) => {
                let was = self.path.clone();
                self.next_file()?;
                eprintln!(
                    "milonga record: {} holds 65,536 channels (key and publisher pairs), MCAP's most: going on in {}",
                    was.display(),
                    self.path.display()
                );
                self.w.event(&ev, at)
            }
            other => other,
        };
        match (written, ev) {
            (Ok(()), Event::Sample(_)) => self.samples += 1,
            (Ok(()), _) => self.events += 1,
            (Err(RecordError::Value { key, why }), Event::Sample(s)) => {
                self.unrecorded += 1;
                if self.unrecorded <= 10 || self.unrecorded % 1000 == 0 {
                    eprintln!(
                        "milonga record: sample {} of {key} by {} not recorded ({} so far), recorded as lost: {why}",
                        s.seq, s.publisher, self.unrecorded
                    );
                }
                let lost = LostSamples {
                    publisher: s.publisher,
                    key: s.key,
                    count: 1,
                    first_seq: s.seq,
                };
                self.w.event(&Event::Lost(lost), at)?;
                self.events += 1;
            }
            (Err(e), _) => return Err(e.into()),
        }
        Ok(())
    }

    /// Finishes the last file: the bytes of all of them.
    fn finish(self) -> Result<u64> {
        Ok(self.bytes + self.w.finish()?)
    }
}

fn recover(damaged: &Path, output: &Path, compression: Compression) -> Result<ExitCode> {
    let mut r = RecordReader::open(damaged)?;
    let opts = RecordOptions {
        compression,
        ..RecordOptions::default()
    };
    let (w, n) = milonga::recording::copy_recording(&mut r, output, &opts).with_context(|| {
        format!(
            "copying {} into {} (not written)",
            damaged.display(),
            output.display()
        )
    })?;
    w.finish()?;
    if !r.skipped().is_empty() {
        eprintln!(
            "milonga record --recover: left out of the copy: {}",
            r.skipped()
        );
    }
    eprintln!(
        "milonga record --recover: {n} messages copied; {} was {}",
        damaged.display(),
        state(&r)
    );
    Ok(ExitCode::SUCCESS)
}

/// What a recording read to its end was: complete, cut short, damaged
/// (chunks skipped), or not finished.
fn state(r: &RecordReader) -> String {
    if r.complete() {
        return "complete".to_owned();
    }
    let mut parts = Vec::new();
    if let Some(why) = r.damage() {
        parts.push(format!(
            "damaged ({} chunks skipped; the first damage: {why})",
            r.skipped().damaged_chunks
        ));
    }
    match r.truncated() {
        Some(why) => parts.push(format!(
            "cut short ({why}); read to its last complete record"
        )),
        // Read to its end magic: all but the damaged chunks.
        None if !parts.is_empty() => parts.push("everything else read".to_owned()),
        None => parts.push("without a summary (not finished)".to_owned()),
    }
    parts.join("; ")
}

fn key_filter(keys: &Option<String>) -> Result<Option<KeyExpr>> {
    keys.as_deref()
        .map(|k| KeyExpr::new(k).with_context(|| format!("--keys {k:?}")))
        .transpose()
}

/// `milonga cat run.mcap | head`: the reader left, nothing failed.
fn reader_left_is_success(r: Result<ExitCode>) -> Result<ExitCode> {
    match r {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(ExitCode::SUCCESS)
        }
        other => other,
    }
}

pub fn cmd_cat(a: CatArgs) -> Result<ExitCode> {
    reader_left_is_success(cat(&a))
}

fn cat(a: &CatArgs) -> Result<ExitCode> {
    let keys = key_filter(&a.keys)?;
    let mut r = RecordReader::open(&a.file)?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    use std::io::Write;
    while let Some(entry) = r.next_entry()? {
        match entry {
            Entry::Sample(s, at) => {
                if keys.as_ref().is_some_and(|k| !k.matches(&s.key)) {
                    continue;
                }
                if a.json {
                    let mut line = json::event_line(&Event::Sample(s));
                    line["received_ns"] = at.into();
                    writeln!(out, "{line}")?;
                } else {
                    writeln!(
                        out,
                        "{} #{} {}",
                        json::printable(&s.key),
                        s.seq,
                        json::short(&s.value)
                    )?;
                }
            }
            Entry::Event(ev, at) => {
                let mut j = json::event_line(&ev);
                if a.json {
                    j["received_ns"] = at.into();
                    writeln!(out, "{j}")?;
                } else {
                    writeln!(out, "-- {j}")?;
                }
            }
        }
    }
    out.flush()?;
    if let Some(why) = r.truncated() {
        eprintln!(
            "milonga cat: {} was cut short ({why}); everything before is shown",
            a.file.display()
        );
    }
    if !r.skipped().is_empty() {
        eprintln!(
            "milonga cat: {} holds what is not shown: {}",
            a.file.display(),
            r.skipped()
        );
    }
    if let Some(why) = r.damage() {
        eprintln!(
            "milonga cat: {} is damaged; the first damage: {why}",
            a.file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `info` gathers of one key.
#[derive(Default)]
struct KeyInfo {
    samples: u64,
    publishers: BTreeMap<NodeId, (u64, u64)>,
    gaps: u64,
    first_ns: u64,
    last_ns: u64,
}

pub fn cmd_info(a: InfoArgs) -> Result<ExitCode> {
    reader_left_is_success(info(&a))
}

fn info(a: &InfoArgs) -> Result<ExitCode> {
    use std::io::Write;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let size = std::fs::metadata(&a.file)
        .with_context(|| a.file.display().to_string())?
        .len();
    let mut r = RecordReader::open(&a.file)?;
    let mut keys: BTreeMap<String, KeyInfo> = BTreeMap::new();
    let (mut events, mut lost_reported) = (0u64, 0u64);
    let mut payload = 0u64;
    // What the message records take before compression: opcode, length
    // and MCAP's message header (31 bytes), then the data.
    let mut records = 0u64;
    let (mut first, mut last) = (u64::MAX, 0u64);
    while let Some(entry) = r.next_entry()? {
        match entry {
            Entry::Sample(s, at) => {
                let k = keys.entry(s.key.clone()).or_default();
                if k.samples == 0 {
                    k.first_ns = at;
                }
                k.samples += 1;
                k.last_ns = at;
                let p = k.publishers.entry(s.publisher).or_insert((0, 0));
                if p.0 > 0 && s.seq > p.1.saturating_add(1) {
                    k.gaps = k.gaps.saturating_add(s.seq - p.1 - 1);
                }
                p.0 += 1;
                p.1 = p.1.max(s.seq);
                payload += r.last_len() as u64;
                records += 31 + r.last_len() as u64;
                first = first.min(at);
                last = last.max(at);
            }
            Entry::Event(ev, at) => {
                events += 1;
                records += 31 + r.last_len() as u64;
                if let Event::Lost(l) = &ev {
                    // Saturating: a file may claim anything.
                    lost_reported = lost_reported.saturating_add(l.count);
                }
                first = first.min(at);
                last = last.max(at);
            }
        }
    }
    let span = if last > first {
        (last - first) as f64 / 1e9
    } else {
        0.0
    };
    let samples: u64 = keys.values().map(|k| k.samples).sum();
    let state = state(&r);
    let ratio = if size > 0 {
        records as f64 / size as f64
    } else {
        0.0
    };
    if a.json {
        let per_key: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .map(|(k, i)| {
                let rate = if i.last_ns > i.first_ns {
                    (i.samples - 1) as f64 / ((i.last_ns - i.first_ns) as f64 / 1e9)
                } else {
                    0.0
                };
                (
                    k.clone(),
                    serde_json::json!({
                        "samples": i.samples,
                        "publishers": i.publishers.len(),
                        "gaps": i.gaps,
                        "rate_hz": rate,
                        "first_ns": i.first_ns,
                        "last_ns": i.last_ns,
                    }),
                )
            })
            .collect();
        let line = serde_json::json!({
            "file": a.file.display().to_string(),
            "state": state,
            "complete": r.complete(),
            "bytes": size,
            "payload_bytes": payload,
            "compression_ratio": ratio,
            "samples": samples,
            "events": events,
            "lost_reported": lost_reported,
            "gaps": keys.values().fold(0u64, |a, k| a.saturating_add(k.gaps)),
            "first_ns": if samples + events > 0 { first } else { 0 },
            "last_ns": last,
            "duration_s": span,
            "keys": per_key,
            "metadata": r.metadata(),
            "skipped_foreign": r.skipped().foreign,
            "skipped_undecodable": r.skipped().undecodable,
            "skipped_other_records": r.skipped().other_records,
            "skipped_damaged_chunks": r.skipped().damaged_chunks,
            "damage": r.damage(),
        });
        writeln!(out, "{line}")?;
    } else {
        writeln!(
            out,
            "file:      {} ({size} bytes, {state})",
            a.file.display()
        )?;
        // A sum that saturated (losses reported past 2^64) says so.
        let more = if lost_reported == u64::MAX {
            " or more"
        } else {
            ""
        };
        writeln!(out,
            "messages:  {samples} samples of {} keys, {events} events ({lost_reported}{more} samples reported lost)",
            keys.len()
        )?;
        writeln!(out, "duration:  {span:.3} s")?;
        if samples + events > 0 {
            let utc =
                |ns: u64| humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(ns));
            writeln!(out, "received:  {} to {} (UTC)", utc(first), utc(last))?;
        }
        writeln!(out,
            "size:      {payload} bytes of values; compression ratio {ratio:.2} (the messages' bytes before compression over the file's)"
        )?;
        for (k, i) in &keys {
            let secs = (i.last_ns.saturating_sub(i.first_ns)) as f64 / 1e9;
            let rate = if secs > 0.0 {
                (i.samples - 1) as f64 / secs
            } else {
                0.0
            };
            writeln!(
                out,
                "  {}: {} samples, {} publisher(s), {rate:.1}/s, {} missing by sequence number",
                json::printable(k),
                i.samples,
                i.publishers.len(),
                i.gaps
            )?;
        }
        if !r.skipped().is_empty() {
            writeln!(out, "skipped:   {}", r.skipped())?;
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The slowest and the fastest `--speed` (a factor): slower, a wait of a
/// second recorded would not fit a `Duration`.
const MIN_SPEED: f64 = 0.001;
const MAX_SPEED: f64 = 1_000_000.0;

/// `--speed`: a factor of the recorded pace, or `max` (`None`).
#[derive(Debug, Clone, Copy)]
struct Speed(Option<f64>);

/// Parses `--speed` (a clear error from the argument parser, exit 2, as
/// for every other value out of range).
fn replay_speed(s: &str) -> Result<Speed, String> {
    match s {
        "max" => Ok(Speed(None)),
        s => match s.trim().parse::<f64>() {
            Ok(v) if (MIN_SPEED..=MAX_SPEED).contains(&v) => Ok(Speed(Some(v))),
            _ => Err(format!(
                "{s:?}: a number from {MIN_SPEED} to {MAX_SPEED}, or max"
            )),
        },
    }
}

/// A wait for the next sample this long is said on stderr (a recording
/// silent for a night, or a receive time far off).
const LONG_WAIT: Duration = Duration::from_secs(10);

/// Most recorded publishers a replay gives a node each; past that, one
/// node replays them all (a node takes about ten of libzmq's 1,023
/// sockets a process).
const MAX_REPLAY_NODES: usize = 32;

/// Most samples and gaps a node opened again holds while its subscribers
/// find it; past that the replay waits for them (or for `--wait-timeout`)
/// before it reads on.
const MAX_HELD: usize = 65_536;
/// And most bytes of their values ([`milonga::Value::approx_bytes`]): a
/// recording's samples may be up to 256 MiB each.
const MAX_HELD_BYTES: usize = 256 << 20;

/// How often a replay looks whether a node opened again has its
/// subscribers back.
const HELD_LOOK: Duration = Duration::from_millis(5);

/// What a node opened again holds until its subscribers find it.
enum Held {
    Sample(String, milonga::Value, u64, u64),
    Gap(String, u64),
}

/// One replaying node: the publishers of the keys of one recorded
/// publisher (or of all of them), while it is open.
struct Replayer {
    /// Its keys (all of them declared when it opens).
    keys: std::collections::BTreeSet<String>,
    open: Option<(milonga::Node, BTreeMap<String, milonga::Publisher>)>,
    /// The keys with a sample published (or held) since it opened: a
    /// recorded loss of one of them is passed on.
    started: std::collections::HashSet<String>,
    /// The fewest subscribers a publisher of it had when it closed: when
    /// it opens again, it waits for as many (they find the new node
    /// first), up to [`Replayers::wait`].
    had: u32,
    /// Opened again and waiting for its subscribers until then: what it
    /// would publish meanwhile is held, in order, while the other
    /// replayers go on.
    until: Option<Instant>,
    held: std::collections::VecDeque<Held>,
    /// About the bytes of `held`'s values.
    held_bytes: usize,
}

impl Replayer {
    /// Whether a node opened again may publish: its subscribers are back,
    /// or it waited long enough.
    fn ready(&self) -> bool {
        let Some(until) = self.until else {
            return true;
        };
        let Some((_, pubs)) = &self.open else {
            return true;
        };
        Instant::now() >= until || pubs.values().all(|p| p.subscriber_count() >= self.had)
    }

    /// Waits until it is [`Replayer::ready`]; false if the replay was
    /// stopped meanwhile (what it holds is then not published).
    fn wait_ready(&self) -> bool {
        while !self.ready() {
            if interrupted() {
                return false;
            }
            std::thread::sleep(HELD_LOOK);
        }
        !interrupted()
    }
}

/// What a replay did, said at its end.
#[derive(Default)]
struct Replayed {
    sent: u64,
    /// Samples recorded as lost, passed on as gaps.
    skipped: u64,
    /// Publishers recorded as lost, passed on as gone.
    left: u64,
    too_large: u64,
    /// Samples of a publisher or key the first pass did not see (the file
    /// grew, or was replaced, after the replay began): not replayed.
    unknown: u64,
}

/// The nodes a replay publishes from: one per recorded publisher, so that
/// its subscribers see each publisher's liveliness as recorded (a
/// recorded `publisher_lost` closes its node, its next sample opens a new
/// one, which they see come), or one for all when the recording has more
/// than [`MAX_REPLAY_NODES`] publishers.
struct Replayers<'a> {
    net: &'a NetArgs,
    qos: PublisherQos,
    by_publisher: bool,
    nodes: BTreeMap<NodeId, Replayer>,
    /// How long a node opened again waits for its subscribers.
    wait: Duration,
    /// Replayers waiting for their subscribers, and when they were last
    /// looked at.
    waiting: usize,
    looked: Instant,
    /// A progress line is on the terminal (a message starts a new line).
    progress: bool,
    done: Replayed,
}

impl Replayers<'_> {
    /// Whether `key` of `publisher` has a replayer: the replay declared
    /// the samples the file held when it began (one that grew since, or
    /// was replaced, may hold more).
    fn knows(&self, publisher: NodeId, key: &str) -> bool {
        let slot = self.slot(publisher);
        self.nodes.get(&slot).is_some_and(|r| r.keys.contains(key))
    }

    /// Which replayer replays what `publisher` published.
    fn slot(&self, publisher: NodeId) -> NodeId {
        if self.by_publisher {
            publisher
        } else {
            NodeId([0; 16])
        }
    }

    /// `publisher`'s replayer, its node opened (again) if it is closed.
    /// A node opened again holds what it publishes until its subscribers
    /// find it (see [`Replayer::until`]).
    fn open(&mut self, publisher: NodeId) -> Result<&mut Replayer> {
        let slot = self.slot(publisher);
        let Some(r) = self.nodes.get_mut(&slot) else {
            bail!("no replayer for {publisher}");
        };
        if r.open.is_none() {
            let name = if self.by_publisher {
                format!("replay-{}", &slot.to_hex()[..8])
            } else {
                "replay".to_owned()
            };
            let node = self.net.open(&name)?;
            // Announced once for all its keys (one by one, a recording of
            // thousands of keys took minutes to start).
            let list = node
                .publishers_with(r.keys.iter().map(String::as_str), self.qos.clone())
                .with_context(|| {
                    format!(
                        "cannot replay the {} keys of recorded publisher {} from one node (replay a part of them with --keys)",
                        r.keys.len(),
                        publisher
                    )
                })?;
            let pubs: BTreeMap<String, milonga::Publisher> =
                r.keys.iter().cloned().zip(list).collect();
            r.open = Some((node, pubs));
            r.started.clear();
            // Subscribers find a new node within a discovery round or
            // two: it waits for as many as the old one had, holding what
            // it would publish, while the others go on.
            if r.had > 0 && !self.wait.is_zero() {
                r.until = Some(Instant::now() + self.wait);
                self.waiting += 1;
            }
        }
        Ok(r)
    }

    /// Publishes a recorded sample, or holds it while its node waits for
    /// its subscribers.
    fn put(&mut self, s: milonga::Sample) -> Result<()> {
        // The key is copied only for its first sample since the node
        // opened, not for every sample.
        let slot = self.slot(s.publisher);
        // Most samples: their node is open and holds nothing.
        if let Some(r) = self
            .nodes
            .get_mut(&slot)
            .filter(|r| r.open.is_some() && r.until.is_none() && r.held.is_empty())
        {
            let key = (!r.started.contains(&s.key)).then(|| s.key.clone());
            let sample = Held::Sample(s.key, s.value, s.timestamp_ns, s.seq);
            if let (true, Some(key)) = (Self::send(r, sample, self.progress, &mut self.done)?, key)
            {
                r.started.insert(key);
            }
            return Ok(());
        }
        let first = !self.open(s.publisher)?.started.contains(&s.key);
        let key = first.then(|| s.key.clone());
        let sample = Held::Sample(s.key, s.value, s.timestamp_ns, s.seq);
        if let (true, Some(key)) = (self.give(s.publisher, sample)?, key) {
            self.open(s.publisher)?.started.insert(key);
        }
        Ok(())
    }

    /// Passes a recorded loss on as a gap in the replaying publisher's
    /// numbers, where it was. (Before a key's first sample a gap would be
    /// nobody's: a subscriber starts counting at the first it gets.)
    fn gap(&mut self, l: &LostSamples) -> Result<()> {
        let slot = self.slot(l.publisher);
        let started = self
            .nodes
            .get(&slot)
            .is_some_and(|r| r.open.is_some() && r.started.contains(&l.key));
        if started {
            self.give(l.publisher, Held::Gap(l.key.clone(), l.count))?;
        }
        Ok(())
    }

    /// Sends `what` from `publisher`'s replayer, or holds it there while
    /// it waits; a replayer holding too much waits for its subscribers
    /// (or `--wait-timeout`) first. Whether it was held or published
    /// (not: a sample too large to send, or the replay was stopped).
    fn give(&mut self, publisher: NodeId, what: Held) -> Result<bool> {
        let r = self.open(publisher)?;
        let full = r.held.len() >= MAX_HELD || r.held_bytes >= MAX_HELD_BYTES;
        if r.until.is_some() && full && !r.wait_ready() {
            return Ok(false);
        }
        if r.until.is_some() && !r.ready() {
            if let Held::Sample(_, v, ..) = &what {
                r.held_bytes += v.approx_bytes();
            }
            r.held.push_back(what);
            return Ok(true);
        }
        if r.until.take().is_some() {
            self.waiting -= 1;
        }
        let slot = self.slot(publisher);
        self.release(slot)?;
        let r = &self.nodes[&slot];
        Self::send(r, what, self.progress, &mut self.done)
    }

    /// Publishes what `slot`'s replayer holds, in order.
    fn release(&mut self, slot: NodeId) -> Result<()> {
        let Some(r) = self.nodes.get_mut(&slot) else {
            return Ok(());
        };
        let held = std::mem::take(&mut r.held);
        r.held_bytes = 0;
        for what in held {
            if interrupted() {
                break;
            }
            Self::send(r, what, self.progress, &mut self.done)?;
        }
        Ok(())
    }

    /// Publishes one sample or gap from an open replayer; whether it did
    /// (not: a sample too large to send, said).
    fn send(r: &Replayer, what: Held, progress: bool, done: &mut Replayed) -> Result<bool> {
        let Some((_, pubs)) = &r.open else {
            bail!("a closed replayer publishes");
        };
        let nl = if progress { "\n" } else { "" };
        match what {
            Held::Sample(key, value, ts, seq) => {
                let Some(p) = pubs.get(&key) else {
                    bail!("no publisher of {key}");
                };
                // (A stop ends a put held up by a subscriber that does
                // not read: the replay ends.)
                match crate::put_interruptibly(|t| p.put_at_timeout(value.clone(), ts, t)) {
                    Ok(true) => done.sent += 1,
                    Ok(false) => return Ok(false),
                    // One sample too large to send (a recording made with
                    // a larger max_message_bytes): said, and the replay
                    // goes on.
                    Err(e @ milonga::PutError::TooLarge { .. }) => {
                        eprintln!(
                            "{nl}milonga replay: a sample of {key} #{seq} not published: {e}"
                        );
                        done.too_large += 1;
                        return Ok(false);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Held::Gap(key, count) => {
                let Some(p) = pubs.get(&key) else {
                    bail!("no publisher of {key}");
                };
                match p.skip(count) {
                    Ok(()) => done.skipped = done.skipped.saturating_add(count),
                    Err(e @ milonga::PutError::SkipTooLarge { .. }) => {
                        eprintln!(
                            "{nl}milonga replay: a recorded loss of {count} on {key} not passed on: {e}"
                        );
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(true)
    }

    /// Publishes what the replayers whose subscribers came back hold;
    /// with `all`, waits for every one of them (or its `--wait-timeout`).
    /// Looks at most every [`HELD_LOOK`] unless `all`.
    fn look(&mut self, all: bool) -> Result<()> {
        if self.waiting == 0 || (!all && self.looked.elapsed() < HELD_LOOK) {
            return Ok(());
        }
        self.looked = Instant::now();
        let slots: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, r)| r.until.is_some())
            .map(|(slot, _)| *slot)
            .collect();
        for slot in slots {
            let r = self.nodes.get_mut(&slot).expect("a slot listed");
            if all && !r.wait_ready() {
                return Ok(());
            }
            if r.ready() {
                r.until = None;
                self.waiting -= 1;
                self.release(slot)?;
            }
        }
        Ok(())
    }

    /// Every publisher open now.
    fn all(&self) -> impl Iterator<Item = &milonga::Publisher> {
        self.nodes
            .values()
            .filter_map(|r| r.open.as_ref())
            .flat_map(|(_, pubs)| pubs.values())
    }

    /// Closes `publisher`'s node, as the recording says it went: its
    /// subscribers are told it left (after what it held). Whether it was
    /// open.
    fn close(&mut self, publisher: NodeId) -> Result<bool> {
        let slot = self.slot(publisher);
        let Some(r) = self.nodes.get_mut(&slot) else {
            return Ok(false);
        };
        if r.until.is_some() {
            let publish = r.wait_ready();
            r.until = None;
            self.waiting -= 1;
            if publish {
                self.release(slot)?;
            }
        }
        let Some(r) = self.nodes.get_mut(&slot) else {
            return Ok(false);
        };
        let Some((node, pubs)) = r.open.take() else {
            return Ok(false);
        };
        r.had = pubs
            .values()
            .map(|p| p.subscriber_count())
            .min()
            .unwrap_or(0);
        // The node first: a publisher dropped from an open node announces
        // the node's every publication left, which for thousands of keys
        // took minutes (the goodbye names them all the same).
        node.close();
        drop(pubs);
        Ok(true)
    }
}

pub fn cmd_replay(net: &NetArgs, a: ReplayArgs) -> Result<ExitCode> {
    let speed = a.speed.0;
    let keys = key_filter(&a.keys)?;
    let said = |r: &RecordReader| {
        if !r.skipped().is_empty() {
            eprintln!(
                "milonga replay: {} holds what is not replayed: {}",
                a.file.display(),
                r.skipped()
            );
        }
        if let Some(why) = r.damage() {
            eprintln!(
                "milonga replay: {} is damaged; the first damage: {why}",
                a.file.display()
            );
        }
        if let Some(why) = r.truncated() {
            eprintln!(
                "milonga replay: {} was cut short ({why}); everything before is replayed",
                a.file.display()
            );
        }
    };
    // Every key of every publisher first: publishers are declared before
    // the first sample, so that subscribers can connect
    // (--wait-subscribers).
    let mut keys_of: BTreeMap<NodeId, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut total = 0u64;
    let mut r = RecordReader::open(&a.file)?;
    while let Some(entry) = r.next_entry()? {
        if let Entry::Sample(s, _) = entry {
            if keys.as_ref().is_none_or(|k| k.matches(&s.key)) {
                keys_of.entry(s.publisher).or_default().insert(s.key);
                total += 1;
            }
        }
    }
    said(&r);
    if keys_of.is_empty() {
        bail!("{}: no sample to replay", a.file.display());
    }
    // Every sample carries the replayed flag and its original timestamp.
    let qos = if speed.is_none() {
        PublisherQos::reliable()
    } else {
        PublisherQos::best_effort()
    }
    .replay();
    let by_publisher = keys_of.len() <= MAX_REPLAY_NODES;
    if !by_publisher {
        eprintln!(
            "milonga replay: {} publishers recorded, more than {MAX_REPLAY_NODES}: replayed from one node (their comings and goings are not passed on)",
            keys_of.len()
        );
    }
    let mut nodes: BTreeMap<NodeId, Replayer> = BTreeMap::new();
    for (publisher, ks) in keys_of {
        let slot = if by_publisher {
            publisher
        } else {
            NodeId([0; 16])
        };
        nodes
            .entry(slot)
            .or_insert_with(|| Replayer {
                keys: Default::default(),
                open: None,
                started: Default::default(),
                had: 0,
                until: None,
                held: Default::default(),
                held_bytes: 0,
            })
            .keys
            .extend(ks);
    }
    // A progress line when stderr is a terminal.
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut rs = Replayers {
        net,
        qos,
        by_publisher,
        nodes,
        wait: Duration::from_secs_f64(a.wait_timeout),
        waiting: 0,
        looked: Instant::now(),
        progress,
        done: Replayed::default(),
    };
    // Open them all now, each publisher of each declared.
    let slots: Vec<NodeId> = rs.nodes.keys().copied().collect();
    for slot in slots {
        rs.open(slot)?;
    }
    catch_interrupts();
    if a.wait_subscribers > 0 {
        let end = Instant::now() + Duration::from_secs_f64(a.wait_timeout);
        while rs.all().any(|p| p.subscriber_count() < a.wait_subscribers) {
            if Instant::now() > end || interrupted() {
                bail!("not every key has {} subscribers", a.wait_subscribers);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let mut shown = Instant::now();
    'outer: loop {
        let sent_before = rs.done.sent;
        // Each pass starts its keys afresh: a loss recorded before a key's
        // first sample in the range is nobody's gap in any pass.
        for r in rs.nodes.values_mut() {
            r.started.clear();
        }
        let mut r = RecordReader::open(&a.file)?;
        let start = Instant::now();
        // The recording's first receive time: --from and --to count from it.
        let mut t0: Option<u64> = None;
        while let Some(entry) = r.next_entry()? {
            if interrupted() {
                break 'outer;
            }
            rs.look(false)?;
            let at = match &entry {
                Entry::Sample(_, at) | Entry::Event(_, at) => *at,
            };
            let first = *t0.get_or_insert(at);
            // An entry the recorder's wall clock put before the first
            // (set back) counts as at it, as without --from.
            let offset = (i128::from(at) - i128::from(first)).max(0);
            // Both ends belong to the window; one that holds no entry
            // publishes nothing (`--to` before the recording's start, say).
            let from_ns = a.from.map_or(i128::MIN, |b| b.offset(first));
            let to_ns = a.to.map_or(i128::MAX, |b| b.offset(first));
            if to_ns < from_ns {
                bail!("--to comes before --from");
            }
            // Not the end: receive times follow the recorder's wall clock,
            // which may have been set back.
            if offset > to_ns {
                continue;
            }
            if offset < from_ns {
                continue;
            }
            let s = match entry {
                Entry::Sample(s, _) => s,
                Entry::Event(Event::Lost(l), _) => {
                    // (A key with no sample to replay has no gap either.)
                    if rs.knows(l.publisher, &l.key) {
                        rs.gap(&l)?;
                    }
                    continue;
                }
                // A publisher that went: its node goes too, and its
                // subscribers are told (as closed: the replay cannot lose
                // it otherwise). Its next sample brings a new one.
                Entry::Event(Event::PublisherLost(l), _) => {
                    if rs.by_publisher && rs.close(l.publisher)? {
                        rs.done.left += 1;
                    }
                    continue;
                }
                Entry::Event(..) => continue,
            };
            if keys.as_ref().is_some_and(|k| !k.matches(&s.key)) {
                continue;
            }
            if !rs.knows(s.publisher, &s.key) {
                rs.done.unknown += 1;
                continue;
            }
            if progress && shown.elapsed() >= Duration::from_millis(200) {
                shown = Instant::now();
                eprint!(
                    "\rmilonga replay: {} of {total} samples, {:.1} s into the recording",
                    rs.done.sent,
                    offset as f64 / 1e9
                );
            }
            if let Some(speed) = speed {
                // From the window's start (an entry the wall clock put
                // before it: at once).
                let ahead = u64::try_from(offset - from_ns.max(0)).unwrap_or(0);
                let due = start + Duration::from_nanos(ahead).div_f64(speed);
                let wait = due.saturating_duration_since(Instant::now());
                if wait >= LONG_WAIT {
                    eprintln!(
                        "{}milonga replay: the recording is silent here: the next sample is due in {} (--from skips ahead, --speed max does not wait)",
                        if progress { "\n" } else { "" },
                        humantime::format_duration(Duration::from_secs(wait.as_secs()))
                    );
                }
                while let Some(d) = due.checked_duration_since(Instant::now()) {
                    if interrupted() {
                        break 'outer;
                    }
                    let nap = if rs.waiting > 0 {
                        HELD_LOOK
                    } else {
                        Duration::from_millis(100)
                    };
                    std::thread::sleep(d.min(nap));
                    rs.look(false)?;
                }
            }
            rs.put(s)?;
        }
        // What nodes opened again still hold goes out before the end (or
        // the next loop).
        rs.look(true)?;
        if !a.repeat {
            break;
        }
        // A loop over a range that holds no sample would spin for ever.
        if rs.done.sent == sent_before {
            bail!(
                "--loop: {} holds no sample to replay in the range asked",
                a.file.display()
            );
        }
    }
    if progress {
        eprintln!();
    }
    let slots: Vec<NodeId> = rs.nodes.keys().copied().collect();
    for slot in slots {
        // Stopped (SIGINT): what is held is not published.
        if let Some(r) = rs.nodes.get_mut(&slot) {
            r.held.clear();
            r.held_bytes = 0;
        }
        rs.close(slot)?;
    }
    let d = &rs.done;
    eprintln!(
        "milonga replay: {} samples published, {} recorded as lost passed on as gaps, {} publishers recorded as lost passed on as gone{}",
        d.sent,
        d.skipped,
        d.left,
        if d.too_large > 0 {
            format!(", {} too large to publish", d.too_large)
        } else {
            String::new()
        }
    );
    if d.unknown > 0 {
        eprintln!(
            "milonga replay: {} samples not replayed: of publishers or keys {} gained after the replay began",
            d.unknown,
            a.file.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use milonga::{Config, Node, Value};

    /// The loop looks at its timers after a chunk was written, and once
    /// its events' receive times moved 10 ms (either way) since the last
    /// look; not for every event.
    #[test]
    fn the_loop_looks_at_its_timers_every_10_ms_of_events() {
        let mut looks = Looks::default();
        let t = 1_700_000_000_000_000_000u64;
        assert!(looks.after_event(t, false), "the first event looks");
        assert!(!looks.after_event(t + 1_000_000, false));
        assert!(!looks.after_event(t + 9_999_999, false));
        assert!(looks.after_event(t + 1_000_000, true), "a chunk written");
        assert!(!looks.after_event(t + 10_999_999, false));
        assert!(looks.after_event(t + 11_000_000, false), "10 ms later");
        assert!(looks.after_event(t, false), "the clock stepped back");
    }

    /// A sample whose value cannot be written is recorded as lost, and
    /// the recorder goes on; a sample of a 65,537th channel starts the
    /// next file, numbered as a split recording's, with that sample in it.
    /// Both files read whole; every sample is in one of them.
    #[test]
    fn a_recorder_goes_on_past_a_value_it_cannot_write_and_past_65536_channels() {
        let dir = milonga_testkit::TempDir::new("rec-files");
        let run = dir.path().join("run.mcap");
        let mut out = Files::create(&run, false, RecordOptions::default()).unwrap();
        let publisher = NodeId([3; 16]);
        let sample = |key: String, seq: u64, value: Value| {
            Event::Sample(milonga::Sample {
                key,
                value,
                publisher,
                seq,
                timestamp_ns: 1,
                encoding: milonga::wire::Encoding::Cbor,
                schema_id: 0,
                replayed: false,
                compact: None,
            })
        };
        // Past CBOR's integers.
        out.event(sample("a/x".into(), 1, Value::Int(i128::MAX)), 1)
            .unwrap();
        out.event(sample("a/x".into(), 2, Value::Int(2)), 2)
            .unwrap();
        assert_eq!((out.unrecorded, out.samples, out.events), (1, 1, 1));
        // The events' channel, a/x, then 65,536 more keys.
        for i in 0..65_536u64 {
            out.event(sample(format!("k/{i}"), 1, Value::Int(1)), 3)
                .unwrap();
        }
        assert_eq!(out.no, 1, "one new file");
        assert_eq!(out.path, dir.path().join("run-0001.mcap"));
        out.finish().unwrap();
        let mut keys = std::collections::BTreeSet::new();
        let mut lost = Vec::new();
        for f in [run.clone(), dir.path().join("run-0001.mcap")] {
            let mut r = RecordReader::open(&f).unwrap();
            for e in r.by_ref() {
                match e.unwrap() {
                    Entry::Sample(s, _) => assert!(keys.insert((s.key, s.seq))),
                    Entry::Event(Event::Lost(l), _) => lost.push((l.key, l.first_seq, l.count)),
                    Entry::Event(..) => {}
                }
            }
            assert!(r.complete(), "{}: {}", f.display(), r.skipped());
        }
        assert_eq!(keys.len(), 1 + 65_536);
        assert!(keys.contains(&("a/x".to_owned(), 2)) && !keys.contains(&("a/x".to_owned(), 1)));
        assert_eq!(lost, [("a/x".to_owned(), 1, 1)]);
    }

    /// A key two expressions match comes through both subscriptions, in
    /// any interleaving: each number is recorded once, whichever comes
    /// first; a copy later than the window is recorded again (a duplicate,
    /// never a loss); a publisher that starts over is recorded.
    #[test]
    fn a_window_records_each_number_of_an_overlapping_key_once() {
        let mut w = Window::new(10);
        assert!(!w.is_new(10));
        assert!(w.is_new(11) && w.is_new(13));
        assert!(!w.is_new(11) && !w.is_new(13));
        assert!(w.is_new(12), "a number skipped by one subscription");
        assert!(!w.is_new(12));
        // The second subscription lags by up to the window.
        for seq in 14..2000 {
            assert!(w.is_new(seq));
        }
        for seq in 1000..2000 {
            assert!(!w.is_new(seq), "{seq}");
        }
        assert!(w.is_new(900), "older than the window: recorded again");
        assert!(w.is_new(5000) && !w.is_new(5000));
        assert!(w.is_new(1), "a publisher numbering from 1 again");
    }

    /// Two subscriptions each tell the node's broker changes A→B, B→A,
    /// A→B: each change is recorded once, whichever tells it first, in any
    /// interleaving (an equality test over a second dropped the third).
    #[test]
    fn each_broker_change_is_recorded_once_whatever_the_interleaving() {
        for order in [[0, 0, 0, 1, 1, 1], [0, 1, 0, 1, 0, 1], [1, 1, 0, 0, 0, 1]] {
            let changes = BrokerChanges::default();
            let mut told = [0u64; 2];
            let recorded: Vec<(usize, u64)> = order
                .iter()
                .filter_map(|&sub| {
                    let first = changes.first_to_tell(&mut told[sub]);
                    first.then_some((sub, told[sub]))
                })
                .collect();
            let nth: Vec<u64> = recorded.iter().map(|r| r.1).collect();
            assert_eq!(nth, [1, 2, 3], "{order:?}: {recorded:?}");
        }
    }

    /// Chunks are an eighth of `--max-bytes`, within 4 KiB and 1 MiB.
    #[test]
    fn chunks_are_an_eighth_of_the_most_a_file_holds_within_bounds() {
        assert_eq!(chunk_bytes_for(None), 1 << 20);
        assert_eq!(chunk_bytes_for(Some(40_000)), 5_000);
        assert_eq!(chunk_bytes_for(Some(1)), 4096);
        assert_eq!(chunk_bytes_for(Some(1 << 40)), 1 << 20);
    }

    /// Several expressions' subscriptions close while the queue between
    /// them and the writer is full: a dispatcher blocked on it kept its
    /// subscription from closing, and the recorder hung at its stop
    /// (until killed with -9, leaving a file without its summary).
    #[test]
    fn several_subscriptions_close_while_their_queue_is_full() {
        let dir = milonga_testkit::TempDir::new("rec-close");
        let locator = format!("milonga:///rec-close-{}", std::process::id());
        let open = |name: &str| {
            let mut cfg = Config::new(&locator, name);
            cfg.security = milonga::Security::Off;
            cfg.runtime_dir = Some(dir.path().to_path_buf());
            Node::open_with(cfg).unwrap()
        };
        let (p, r) = (open("p"), open("r"));
        let exprs = [KeyExpr::new("rc/a").unwrap(), KeyExpr::new("rc/b").unwrap()];
        let source = Source::subscribe_with_queue(&r, &exprs, SubscriberQos::default(), 4).unwrap();
        let Source::Many(_, rx, _) = &source else {
            panic!("two expressions are merged");
        };
        let rx = rx.clone();
        let pa = p.publisher("rc/a").unwrap();
        let until = Instant::now() + Duration::from_secs(20);
        while pa.subscriber_count() == 0 {
            assert!(Instant::now() < until, "the subscription never matched");
            std::thread::sleep(Duration::from_millis(5));
        }
        // Best effort: the puts never wait; the queue fills and the
        // dispatcher blocks on it.
        while rx.len() < 4 {
            assert!(Instant::now() < until, "the queue never filled");
            pa.put(Value::from(1i64)).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..10 {
            pa.put(Value::from(2i64)).unwrap();
        }
        // The dispatcher blocked in its send on the full queue shows
        // nothing outside: 100 ms lets it get there. Too short a pause
        // would only make the test weaker (the close then finds no
        // blocked send), never fail it.
        std::thread::sleep(Duration::from_millis(100));
        drop(rx);
        let (done, closed) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let mut n = 0;
            let r = source.close(|_, _| {
                n += 1;
                Ok(())
            });
            let _ = done.send((r.is_ok(), n));
        });
        let (ok, n) = closed
            .recv_timeout(Duration::from_secs(20))
            .expect("the subscriptions closed within 20 s");
        assert!(ok);
        // What was queued was written, and what the blocked dispatcher
        // held.
        assert!(n >= 4, "{n} events written");
    }
}
