//! Recordings: samples and status events in MCAP files (docs/recording.md
//! is the format mapping). The writer is chunked and ends a chunk at least
//! every `flush_every`, so a recorder killed with -9 (or stopped by a full
//! disk) leaves a file whose completed chunks every MCAP reader can read;
//! the reader reads such a file to its last complete record and says that
//! it was cut short. A `file:///` backend will be built on these two.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mcap::records::{MessageHeader, Record};
use mcap::sans_io::{LinearReadEvent, LinearReader, LinearReaderOptions};
use milonga_wire::cbor::{decode_cbor, encode_cbor};
use milonga_wire::{Bytes, Encoding, NodeId};

use crate::model::sample::{
    DeadlineMissed, Event, IncompatibleQos, LostReason, LostSamples, PermissionDenied,
    PublisherAlive, PublisherLost, QosPolicy, Sample,
};

/// The topic of the channel that holds status events (lost samples,
/// publishers alive and lost, deadlines), as JSON. Milonga keys never
/// start with `/`, so it cannot be a key's topic.
pub const EVENTS_TOPIC: &str = "/milonga/events";
/// Channel metadata: the publishing node's id (32 hex digits).
pub const META_PUBLISHER: &str = "milonga.publisher";
/// Channel metadata: the encoding the publisher used (`cbor`, `raw`,
/// `json`); the message data is CBOR whatever it was.
pub const META_ENCODING: &str = "milonga.encoding";
/// Channel metadata, present when the publisher republished a recording
/// (`Sample::replayed`): `true`.
pub const META_REPLAYED: &str = "milonga.replayed";
/// The name of the metadata record that describes the recording.
pub const METADATA_NAME: &str = "milonga";
/// The longest record a reader accepts (a sample is at most
/// `max_message_bytes`, 256 MiB at most): a hostile file cannot make a
/// reader allocate more.
pub const RECORD_LIMIT: usize = 256 << 20;

/// Chunk compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// zstd (level 3), the default.
    #[default]
    Zstd,
    /// lz4.
    Lz4,
    /// None.
    None,
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "zstd" => Ok(Compression::Zstd),
            "lz4" => Ok(Compression::Lz4),
            "none" => Ok(Compression::None),
            _ => Err(format!("compression {s:?}: zstd, lz4 or none")),
        }
    }
}

/// How a recording is written.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Chunk compression.
    pub compression: Compression,
    /// A chunk ends when it holds this many bytes (before compression).
    pub chunk_bytes: u64,
    /// ... or when this long has passed since it began: what a crash can
    /// lose.
    pub flush_every: Duration,
    /// Written into the `milonga` metadata record.
    pub metadata: BTreeMap<String, String>,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            compression: Compression::Zstd,
            chunk_bytes: 1 << 20,
            flush_every: Duration::from_secs(1),
            metadata: BTreeMap::new(),
        }
    }
}

/// A recording that failed: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Opening, writing or reading the file failed (a full disk among
    /// others).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not MCAP, or a record in it is malformed.
    #[error("{path}: not a readable MCAP recording: {why}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A sample's value cannot be written as CBOR.
    #[error("a value of {key} cannot be recorded: {why}")]
    Value {
        /// The sample's key.
        key: String,
        /// Why.
        why: String,
    },
}

/// Writes a recording.
pub struct RecordWriter {
    path: PathBuf,
    w: mcap::Writer<BufWriter<Counted>>,
    /// Publisher -> key -> channel: looked up with the sample's own key,
    /// no copy of it per sample.
    channels: HashMap<NodeId, HashMap<String, u16>>,
    events: u16,
    chunk_started: Instant,
    flush_every: Duration,
    buf: Vec<u8>,
    messages: u64,
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("path", &self.path)
            .field("messages", &self.messages)
            .finish()
    }
}

/// A file that counts what was written to it (for `--max-bytes`), and
/// that refuses every write after one failed: the MCAP writer finishes a
/// file when dropped, and a summary written after a failure (a full disk
/// that freed up) would present a file with a hole as complete.
struct Counted {
    file: File,
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
    failed: bool,
}

impl Counted {
    fn check(&self) -> std::io::Result<()> {
        if self.failed {
            return Err(std::io::Error::other(
                "an earlier write to this recording failed",
            ));
        }
        Ok(())
    }
}

impl Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.check()?;
        let n = self.file.write(buf).inspect_err(|_| self.failed = true)?;
        self.written
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.check()?;
        self.file.flush().inspect_err(|_| self.failed = true)
    }
}

impl std::io::Seek for Counted {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.check()?;
        self.file.seek(pos).inspect_err(|_| self.failed = true)
    }
}

fn format_err(path: &Path, e: impl std::fmt::Display) -> RecordError {
    RecordError::Format {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

/// An I/O error inside an MCAP error is reported as what it is (a full
/// disk says so).
fn write_err(path: &Path, e: mcap::McapError) -> RecordError {
    match e {
        mcap::McapError::Io(source) => RecordError::Io {
            path: path.to_path_buf(),
            source,
        },
        other => format_err(path, other),
    }
}

impl RecordWriter {
    /// Creates `path` (it must not exist: a recording is never
    /// overwritten).
    pub fn create(path: &Path, opts: &RecordOptions) -> Result<RecordWriter, RecordError> {
        let io = |source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::options()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(io)?;
        let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Counted {
            file,
            written: written.clone(),
            failed: false,
        };
        let compression = match opts.compression {
            Compression::Zstd => Some(mcap::Compression::Zstd),
            Compression::Lz4 => Some(mcap::Compression::Lz4),
            Compression::None => None,
        };
        let mut w = mcap::WriteOptions::new()
            .profile("")
            .library(format!("milonga {}", env!("CARGO_PKG_VERSION")))
            .compression(compression)
            .chunk_size(Some(opts.chunk_bytes))
            // Each chunk is built in memory and written whole: by default
            // the writer streams a chunk into the file and seeks back to
            // fill in its header when it ends, so a recorder killed
            // meanwhile left a header of placeholders that readers take
            // for garbage (the `mcap` Python package stopped there with
            // an error) rather than a file that ends early.
            .disable_seeking(true)
            .create(BufWriter::with_capacity(1 << 16, counted))
            .map_err(|e| write_err(path, e))?;
        w.write_metadata(&mcap::records::Metadata {
            name: METADATA_NAME.into(),
            metadata: opts.metadata.clone(),
        })
        .map_err(|e| write_err(path, e))?;
        let events = w
            .add_channel(0, EVENTS_TOPIC, "json", &BTreeMap::new())
            .map_err(|e| write_err(path, e))?;
        Ok(RecordWriter {
            path: path.to_path_buf(),
            w,
            channels: HashMap::new(),
            events,
            chunk_started: Instant::now(),
            flush_every: opts.flush_every,
            buf: Vec::new(),
            messages: 0,
            written,
        })
    }

    /// Records a sample received at `received_ns` (UNIX time, ns).
    pub fn sample(&mut self, s: &Sample, received_ns: u64) -> Result<(), RecordError> {
        let known = self
            .channels
            .get(&s.publisher)
            .and_then(|keys| keys.get(s.key.as_str()));
        let channel = match known {
            Some(c) => *c,
            None => {
                let mut meta = BTreeMap::new();
                meta.insert(META_PUBLISHER.to_owned(), s.publisher.to_hex());
                meta.insert(
                    META_ENCODING.to_owned(),
                    encoding_name(s.encoding).to_owned(),
                );
                if s.replayed {
                    meta.insert(META_REPLAYED.to_owned(), "true".to_owned());
                }
                let c = self
                    .w
                    .add_channel(0, &s.key, "cbor", &meta)
                    .map_err(|e| write_err(&self.path, e))?;
                self.channels
                    .entry(s.publisher)
                    .or_default()
                    .insert(s.key.clone(), c);
                c
            }
        };
        self.buf.clear();
        // A typed subscription's compact sample holds its payload: the
        // recording keeps the value map it stands for.
        let read;
        let value = match (&s.compact, &s.value) {
            (Some(reader), milonga_wire::Value::Bytes(payload)) => {
                read = reader.0.read(payload).map_err(|e| RecordError::Value {
                    key: s.key.clone(),
                    why: e.to_string(),
                })?;
                &read
            }
            _ => &s.value,
        };
        encode_cbor(value, &mut self.buf).map_err(|e| RecordError::Value {
            key: s.key.clone(),
            why: e.to_string(),
        })?;
        let header = MessageHeader {
            channel_id: channel,
            // MCAP's sequence is 32 bits: the reader extends it again.
            sequence: s.seq as u32,
            log_time: received_ns,
            publish_time: s.timestamp_ns,
        };
        self.w
            .write_to_known_channel(&header, &self.buf)
            .map_err(|e| write_err(&self.path, e))?;
        self.wrote()
    }

    /// Records an event received at `received_ns`: a sample as
    /// [`RecordWriter::sample`] does, a status event in its JSON form
    /// ([`status_json`]).
    pub fn event(&mut self, event: &Event, received_ns: u64) -> Result<(), RecordError> {
        match status_json(event) {
            None => match event {
                Event::Sample(s) => self.sample(s, received_ns),
                _ => Ok(()),
            },
            Some(j) => self.status(j.to_string().as_bytes(), received_ns),
        }
    }

    fn status(&mut self, json: &[u8], received_ns: u64) -> Result<(), RecordError> {
        let header = MessageHeader {
            channel_id: self.events,
            sequence: self.messages as u32,
            log_time: received_ns,
            publish_time: received_ns,
        };
        self.w
            .write_to_known_channel(&header, json)
            .map_err(|e| write_err(&self.path, e))?;
        self.wrote()
    }

    fn wrote(&mut self) -> Result<(), RecordError> {
        self.messages += 1;
        if self.messages % 64 == 0 {
            self.tick()?;
        }
        Ok(())
    }

    /// Ends the current chunk (and writes it out) if it began
    /// `flush_every` ago; call it when idle too.
    pub fn tick(&mut self) -> Result<(), RecordError> {
        if self.chunk_started.elapsed() >= self.flush_every {
            self.flush()?;
        }
        Ok(())
    }

    /// Ends the current chunk and writes it out.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        self.chunk_started = Instant::now();
        self.w.flush().map_err(|e| write_err(&self.path, e))
    }

    /// Messages written so far (samples and events).
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Bytes written to the file so far (what is still in the open chunk
    /// is not).
    pub fn bytes(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Writes the summary (statistics, indexes) and closes the file.
    pub fn finish(mut self) -> Result<u64, RecordError> {
        self.w.finish().map_err(|e| write_err(&self.path, e))?;
        let mut inner = self.w.into_inner();
        inner.flush().map_err(|source| RecordError::Io {
            path: self.path.clone(),
            source,
        })?;
        inner
            .get_ref()
            .file
            .sync_all()
            .map_err(|source| RecordError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(self.written.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Copies every complete entry `reader` has left into a new recording at
/// `path`, made with `opts` and the reader's `milonga` metadata added to
/// its own: the writer, not finished (to write on, or to finish), and how
/// many entries were copied. What `milonga record --recover` and an
/// appending `file:///` node do.
pub fn copy_recording(
    reader: &mut RecordReader,
    path: &Path,
    opts: &RecordOptions,
) -> Result<(RecordWriter, u64), RecordError> {
    // The metadata record comes before the first entry: read by then.
    let mut next = reader.next_entry()?;
    let mut o = opts.clone();
    o.metadata.extend(reader.metadata().clone());
    let mut w = RecordWriter::create(path, &o)?;
    let mut n = 0;
    while let Some(entry) = next {
        match entry {
            Entry::Sample(s, at) => w.sample(&s, at)?,
            Entry::Event(ev, at) => w.event(&ev, at)?,
        }
        n += 1;
        next = reader.next_entry()?;
    }
    Ok((w, n))
}

fn encoding_name(e: Encoding) -> &'static str {
    match e {
        Encoding::Raw => "raw",
        // A compact sample arrives as its schema's map, and is recorded
        // as that map in plain CBOR (docs/schemas.md).
        Encoding::Cbor | Encoding::Compact => "cbor",
        Encoding::Json => "json",
    }
}

fn encoding_of(name: &str) -> Encoding {
    match name {
        "raw" => Encoding::Raw,
        "json" => Encoding::Json,
        _ => Encoding::Cbor,
    }
}

/// One entry of a recording, in file order.
#[derive(Debug, Clone)]
pub enum Entry {
    /// A sample, as it was received, and when (UNIX time, ns).
    Sample(Sample, u64),
    /// A status event (never `Event::Sample`), and when it was received.
    Event(Event, u64),
}

/// The JSON form of a status event, as recordings keep it and `milonga
/// sub --json` prints it (`{"event": "lost", ...}`); `None` for a sample.
pub fn status_json(ev: &Event) -> Option<serde_json::Value> {
    use serde_json::json;
    Some(match ev {
        Event::Sample(_) => return None,
        Event::Lost(l) => json!({
            "event": "lost",
            "key": l.key,
            "publisher": l.publisher.to_hex(),
            "count": l.count,
            "first_seq": l.first_seq,
        }),
        Event::PublisherAlive(a) => json!({
            "event": "publisher_alive",
            "publisher": a.publisher.to_hex(),
            "name": a.name,
        }),
        Event::PublisherLost(l) => json!({
            "event": "publisher_lost",
            "publisher": l.publisher.to_hex(),
            "name": l.name,
            "reason": l.reason.as_str(),
        }),
        Event::DeadlineMissed(d) => json!({
            "event": "deadline_missed",
            "key": d.key,
            "silent_ms": d.silent_for.as_secs_f64() * 1000.0,
        }),
        Event::SubscriptionLive => json!({ "event": "subscription_live" }),
        Event::IncompatibleQos(q) => json!({
            "event": "incompatible_qos",
            "publisher": q.publisher.to_hex(),
            "key": q.key,
            "policy": q.policy.as_str(),
            "detail": q.detail,
        }),
        Event::PermissionDenied(p) => json!({
            "event": "permission_denied",
            "endpoint": p.endpoint,
            "publisher": p.publisher.map(|n| n.to_hex()),
            "reason": p.reason,
        }),
        Event::BrokerChanged(b) => json!({
            "event": "broker_changed",
            "from": b.from,
            "to": b.to,
        }),
    })
}

/// The status event of a JSON form that [`status_json`] wrote; `None`
/// for a kind or a field this version does not know.
pub fn status_from_json(j: &serde_json::Value) -> Option<Event> {
    let text = |f: &str| j.get(f)?.as_str().map(str::to_owned);
    let node = |f: &str| NodeId::from_hex(j.get(f)?.as_str()?);
    let num = |f: &str| j.get(f)?.as_u64();
    Some(match j.get("event")?.as_str()? {
        "lost" => Event::Lost(LostSamples {
            publisher: node("publisher")?,
            key: text("key")?,
            count: num("count")?,
            first_seq: num("first_seq")?,
        }),
        "publisher_alive" => Event::PublisherAlive(PublisherAlive {
            publisher: node("publisher")?,
            name: text("name")?,
        }),
        "publisher_lost" => Event::PublisherLost(PublisherLost {
            publisher: node("publisher")?,
            name: text("name")?,
            reason: match j.get("reason")?.as_str()? {
                "closed" => LostReason::Closed,
                "disconnected" => LostReason::Disconnected,
                "lease_expired" => LostReason::LeaseExpired,
                "undeclared" => LostReason::Undeclared,
                "forgotten" => LostReason::Forgotten,
                _ => return None,
            },
        }),
        "deadline_missed" => Event::DeadlineMissed(DeadlineMissed {
            key: text("key")?,
            silent_for: Duration::try_from_secs_f64(j.get("silent_ms")?.as_f64()? / 1000.0).ok()?,
        }),
        "subscription_live" => Event::SubscriptionLive,
        "incompatible_qos" => Event::IncompatibleQos(IncompatibleQos {
            publisher: node("publisher")?,
            key: text("key")?,
            policy: match j.get("policy")?.as_str()? {
                "reliability" => QosPolicy::Reliability,
                "history" => QosPolicy::History,
                _ => return None,
            },
            detail: text("detail")?,
        }),
        "permission_denied" => Event::PermissionDenied(PermissionDenied {
            endpoint: text("endpoint")?,
            publisher: node("publisher"),
            reason: text("reason")?,
        }),
        "broker_changed" => Event::BrokerChanged(crate::model::sample::BrokerChanged {
            from: text("from")?,
            to: text("to")?,
        }),
        _ => return None,
    })
}

/// What a reader skipped: messages of channels it does not know as
/// Milonga's (a foreign MCAP file), and messages that do not decode (or
/// status events of a kind this version does not know).
#[derive(Debug, Clone, Default)]
pub struct Skipped {
    /// Messages of channels with another encoding, or of no channel.
    pub foreign: u64,
    /// Messages whose data did not decode.
    pub undecodable: u64,
}

/// Reads a recording from start to end, record by record (the file is
/// never loaded whole). A file cut short (a recorder killed, a full disk)
/// is read to its last complete record; [`RecordReader::truncated`] then
/// says why it ended.
pub struct RecordReader {
    path: PathBuf,
    /// Buffered: the reader asks for a few bytes at a time (a record's
    /// opcode and length, then its body), a system call each unbuffered.
    file: std::io::BufReader<File>,
    reader: LinearReader,
    channels: HashMap<u16, Channel>,
    truncated: Option<String>,
    finished: bool,
    skipped: Skipped,
    metadata: BTreeMap<String, String>,
    complete: bool,
    seen_header: bool,
    /// Bytes of the last entry's message data, as stored.
    last_len: usize,
}

impl std::fmt::Debug for RecordReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReader")
            .field("path", &self.path)
            .finish()
    }
}

#[derive(Debug)]
enum Channel {
    Events,
    Samples {
        key: String,
        publisher: NodeId,
        encoding: Encoding,
        replayed: bool,
        /// The last sequence number read, extended to 64 bits.
        last_seq: u64,
    },
    Foreign,
}

impl RecordReader {
    /// Opens a recording.
    pub fn open(path: &Path) -> Result<RecordReader, RecordError> {
        let file = File::open(path).map_err(|source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let opts = LinearReaderOptions::default()
            .with_skip_end_magic(true)
            .with_record_length_limit(RECORD_LIMIT);
        Ok(RecordReader {
            path: path.to_path_buf(),
            file: std::io::BufReader::with_capacity(1 << 16, file),
            reader: LinearReader::new_with_options(opts),
            channels: HashMap::new(),
            truncated: None,
            finished: false,
            skipped: Skipped::default(),
            metadata: BTreeMap::new(),
            complete: false,
            seen_header: false,
            last_len: 0,
        })
    }

    /// Why the file ended before its summary, if it did (read to the end
    /// first).
    pub fn truncated(&self) -> Option<&str> {
        self.truncated.as_deref()
    }

    /// Whether the file ended with its footer: the recorder finished it.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Bytes of the last entry's message data as the file stores it (the
    /// value's CBOR, an event's JSON).
    pub fn last_len(&self) -> usize {
        self.last_len
    }

    /// Messages skipped so far.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// The `milonga` metadata record, once read (it comes first).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The next entry, `Ok(None)` at the end (or where the file was cut
    /// short). An error is a file that is not MCAP at all.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, RecordError> {
        if self.finished {
            return Ok(None);
        }
        loop {
            let event = match self.reader.next_event() {
                None => {
                    self.finished = true;
                    return Ok(None);
                }
                Some(Err(e)) => {
                    self.finished = true;
                    if !self.seen_header {
                        return Err(format_err(&self.path, e));
                    }
                    self.truncated = Some(e.to_string());
                    return Ok(None);
                }
                Some(Ok(e)) => e,
            };
            let (opcode, data) = match event {
                LinearReadEvent::ReadRequest(need) => {
                    let buf = self.reader.insert(need);
                    let n = self.file.read(buf).map_err(|source| RecordError::Io {
                        path: self.path.clone(),
                        source,
                    })?;
                    self.reader.notify_read(n);
                    continue;
                }
                LinearReadEvent::Record { opcode, data } => (opcode, data),
            };
            let record = match mcap::parse_record(opcode, data) {
                Ok(r) => r,
                Err(e) => {
                    self.finished = true;
                    self.truncated = Some(e.to_string());
                    return Ok(None);
                }
            };
            match record {
                Record::Header(_) => self.seen_header = true,
                Record::Metadata(m) if m.name == METADATA_NAME => {
                    self.metadata.extend(m.metadata);
                }
                Record::Footer(_) => self.complete = true,
                Record::Channel(c) => {
                    let ch = if c.topic == EVENTS_TOPIC {
                        Channel::Events
                    } else if c.message_encoding == "cbor" {
                        match c
                            .metadata
                            .get(META_PUBLISHER)
                            .and_then(|h| NodeId::from_hex(h))
                        {
                            Some(publisher) => Channel::Samples {
                                key: c.topic.clone(),
                                publisher,
                                encoding: encoding_of(
                                    c.metadata.get(META_ENCODING).map_or("cbor", String::as_str),
                                ),
                                replayed: c
                                    .metadata
                                    .get(META_REPLAYED)
                                    .is_some_and(|v| v == "true"),
                                last_seq: 0,
                            },
                            None => Channel::Foreign,
                        }
                    } else {
                        Channel::Foreign
                    };
                    self.channels.insert(c.id, ch);
                }
                Record::Message { header, data } => {
                    self.last_len = data.len();
                    let entry = match self.channels.get_mut(&header.channel_id) {
                        Some(Channel::Events) => match serde_json::from_slice(&data)
                            .ok()
                            .as_ref()
                            .and_then(status_from_json)
                        {
                            Some(ev) => Entry::Event(ev, header.log_time),
                            None => {
                                self.skipped.undecodable += 1;
                                continue;
                            }
                        },
                        Some(Channel::Samples {
                            key,
                            publisher,
                            encoding,
                            replayed,
                            last_seq,
                        }) => {
                            let value = match decode_cbor(&Bytes::copy_from_slice(&data)) {
                                Ok(v) => v,
                                Err(_) => {
                                    self.skipped.undecodable += 1;
                                    continue;
                                }
                            };
                            *last_seq = extend_seq(*last_seq, header.sequence);
                            Entry::Sample(
                                Sample {
                                    key: key.clone(),
                                    value,
                                    publisher: *publisher,
                                    seq: *last_seq,
                                    timestamp_ns: header.publish_time,
                                    encoding: *encoding,
                                    schema_id: 0,
                                    replayed: *replayed,
                                    compact: None,
                                },
                                header.log_time,
                            )
                        }
                        Some(Channel::Foreign) | None => {
                            self.skipped.foreign += 1;
                            continue;
                        }
                    };
                    return Ok(Some(entry));
                }
                _ => {}
            }
        }
    }
}

impl Iterator for RecordReader {
    type Item = Result<Entry, RecordError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_entry().transpose()
    }
}

/// The 64-bit sequence number whose low 32 bits are `low`, closest after
/// `last` (a recording keeps 32 bits, as MCAP does; a publisher's numbers
/// only grow, by less than 2^32 between two samples recorded).
fn extend_seq(last: u64, low: u32) -> u64 {
    let base = last & !0xffff_ffff;
    let candidate = base | u64::from(low);
    if candidate < last && last - candidate > 1 << 31 {
        candidate + (1 << 32)
    } else {
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_are_extended_past_32_bits() {
        assert_eq!(extend_seq(0, 1), 1);
        assert_eq!(extend_seq(5, 7), 7);
        assert_eq!(extend_seq(0xffff_fffe, 1), 0x1_0000_0001);
        assert_eq!(extend_seq(0x1_0000_0001, 3), 0x1_0000_0003);
        // A late sample of a republished range (a repair) goes back a little.
        assert_eq!(extend_seq(100, 90), 90);
    }

    fn sample(key: &str, seq: u64, value: milonga_wire::Value) -> Sample {
        Sample {
            key: key.into(),
            value,
            publisher: NodeId([7; 16]),
            seq,
            timestamp_ns: 1_000 + seq,
            encoding: Encoding::Cbor,
            schema_id: 0,
            replayed: false,
            compact: None,
        }
    }

    fn write(path: &Path, compression: Compression, n: u64) {
        let opts = RecordOptions {
            compression,
            chunk_bytes: 4096,
            ..RecordOptions::default()
        };
        let mut w = RecordWriter::create(path, &opts).unwrap();
        for i in 1..=n {
            let v = milonga_wire::Value::from(format!("value {i}"));
            w.sample(
                &sample(if i % 2 == 0 { "a/b" } else { "a/c" }, i, v),
                5_000 + i,
            )
            .unwrap();
            if i % 10 == 0 {
                let lost = Event::Lost(LostSamples {
                    publisher: NodeId([7; 16]),
                    key: "a/b".into(),
                    count: 1,
                    first_seq: i,
                });
                w.event(&lost, 6_000 + i).unwrap();
            }
        }
        w.finish().unwrap();
    }

    #[test]
    fn a_recording_reads_back_as_written_with_every_compression() {
        let dir = milonga_testkit::TempDir::new("rec-rt");
        for c in [Compression::Zstd, Compression::Lz4, Compression::None] {
            let path = dir.path().join(format!("{c:?}.mcap"));
            write(&path, c, 100);
            // A recording is never overwritten.
            assert!(matches!(
                RecordWriter::create(&path, &RecordOptions::default()),
                Err(RecordError::Io { .. })
            ));
            let mut r = RecordReader::open(&path).unwrap();
            let entries: Vec<Entry> = r.by_ref().map(Result::unwrap).collect();
            assert!(r.complete() && r.truncated().is_none(), "{c:?}");
            let samples: Vec<&Sample> = entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Sample(s, _) => Some(s),
                    Entry::Event(..) => None,
                })
                .collect();
            assert_eq!(samples.len(), 100);
            for (i, s) in samples.iter().enumerate() {
                let want = sample(
                    if (i + 1) % 2 == 0 { "a/b" } else { "a/c" },
                    i as u64 + 1,
                    milonga_wire::Value::from(format!("value {}", i + 1)),
                );
                assert_eq!(
                    (&s.key, s.seq, s.timestamp_ns),
                    (&want.key, want.seq, want.timestamp_ns)
                );
                assert_eq!(s.value, want.value);
                assert_eq!(s.publisher, want.publisher);
            }
            let events: Vec<_> = entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Event(Event::Lost(l), at) => Some((l.first_seq, *at)),
                    _ => None,
                })
                .collect();
            assert_eq!(events.len(), 10);
            assert_eq!(events[0], (10, 6_010));
            // The first entry, "value 1": a CBOR text of 7 bytes, stored
            // in 8.
            let mut r = RecordReader::open(&path).unwrap();
            assert!(matches!(r.next_entry().unwrap(), Some(Entry::Sample(..))));
            assert_eq!(r.last_len(), 8);
        }
    }

    #[test]
    fn a_file_cut_short_reads_to_its_last_complete_record() {
        let dir = milonga_testkit::TempDir::new("rec-cut");
        let path = dir.path().join("full.mcap");
        write(&path, Compression::Zstd, 2000);
        let bytes = std::fs::read(&path).unwrap();
        let full = RecordReader::open(&path).unwrap().count();
        let mut last = 0;
        // The last cut is inside the footer (29 bytes, then 8 of magic).
        for cut in [
            bytes.len() / 4,
            bytes.len() / 2,
            bytes.len() - 100,
            bytes.len() - 20,
        ] {
            let p = dir.path().join(format!("cut{cut}.mcap"));
            std::fs::write(&p, &bytes[..cut]).unwrap();
            let mut r = RecordReader::open(&p).unwrap();
            let n = r.by_ref().map(Result::unwrap).count();
            assert!(!r.complete(), "cut at {cut}");
            assert!(r.truncated().is_some() || n == full, "cut at {cut}");
            assert!(n >= last && n <= full, "cut at {cut}: {n} of {full}");
            last = n;
        }
        assert!(last > 0);
    }

    #[test]
    fn every_status_event_survives_its_json_form() {
        let n = NodeId([3; 16]);
        let all = [
            Event::Lost(LostSamples {
                publisher: n,
                key: "k".into(),
                count: 4,
                first_seq: 9,
            }),
            Event::PublisherAlive(PublisherAlive {
                publisher: n,
                name: "p@h:1".into(),
            }),
            Event::PublisherLost(PublisherLost {
                publisher: n,
                name: "p@h:1".into(),
                reason: LostReason::LeaseExpired,
            }),
            Event::DeadlineMissed(DeadlineMissed {
                key: "k".into(),
                silent_for: Duration::from_millis(250),
            }),
            Event::SubscriptionLive,
            Event::IncompatibleQos(IncompatibleQos {
                publisher: n,
                key: "k".into(),
                policy: QosPolicy::History,
                detail: "none kept".into(),
            }),
            Event::PermissionDenied(PermissionDenied {
                endpoint: "tcp://10.0.0.1:7000".into(),
                publisher: None,
                reason: "not trusted".into(),
            }),
            Event::BrokerChanged(crate::model::sample::BrokerChanged {
                from: "tcp://b1:7447".into(),
                to: "tcp://b2:7447".into(),
            }),
        ];
        for ev in all {
            let j = status_json(&ev).unwrap();
            assert_eq!(status_from_json(&j).as_ref(), Some(&ev), "{j}");
        }
        assert!(status_from_json(&serde_json::json!({"event": "from_the_future"})).is_none());
    }

    /// Hostile files: a recording with bytes flipped, cut or overwritten
    /// at random, a thousand times, reads without a panic (every entry or
    /// an error, then the end).
    #[test]
    fn a_damaged_file_never_panics_the_reader() {
        let dir = milonga_testkit::TempDir::new("rec-fuzz");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::Zstd, 300);
        let bytes = std::fs::read(&good).unwrap();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let p = dir.path().join("bad.mcap");
        for _ in 0..1000 {
            let mut b = bytes.clone();
            for _ in 0..1 + next() % 8 {
                let at = (next() as usize) % b.len();
                b[at] = match next() % 3 {
                    0 => b[at] ^ (1 << (next() % 8)),
                    1 => 0xff,
                    _ => next() as u8,
                };
            }
            if next() % 4 == 0 {
                b.truncate((next() as usize) % b.len());
            }
            std::fs::write(&p, &b).unwrap();
            let Ok(mut r) = RecordReader::open(&p) else {
                continue;
            };
            let mut n = 0;
            while let Ok(Some(_)) = r.next_entry() {
                n += 1;
                assert!(n <= 1000, "more entries than were written");
            }
        }
    }

    /// A chunk that claims to hold a terabyte once decompressed is refused,
    /// not allocated.
    #[test]
    fn a_chunk_claiming_a_huge_size_is_refused() {
        let dir = milonga_testkit::TempDir::new("rec-bomb");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::Zstd, 300);
        let mut b = std::fs::read(&good).unwrap();
        // Records after the 8-byte magic: opcode, u64 length, body.
        let mut at = 8;
        let chunk = loop {
            let len = u64::from_le_bytes(b[at + 1..at + 9].try_into().unwrap()) as usize;
            if b[at] == 0x06 {
                break at + 9;
            }
            at += 9 + len;
        };
        // The body: start time, end time, then the uncompressed size.
        b[chunk + 16..chunk + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let p = dir.path().join("bomb.mcap");
        std::fs::write(&p, &b).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        while let Ok(Some(_)) = r.next_entry() {}
        assert!(
            r.truncated().is_some(),
            "the damaged chunk is said to end the file"
        );
    }

    #[test]
    fn a_file_that_is_not_mcap_is_a_clear_error() {
        let dir = milonga_testkit::TempDir::new("rec-bad");
        let p = dir.path().join("bad.mcap");
        std::fs::write(&p, b"not an mcap file at all").unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let err = r.next_entry().unwrap_err();
        assert!(err.to_string().contains("not a readable MCAP"), "{err}");
        let missing = RecordReader::open(&dir.path().join("none.mcap")).unwrap_err();
        assert!(missing.to_string().contains("none.mcap"), "{missing}");
    }
}
