//! Recordings: samples and status events in MCAP files (docs/recording.md
//! is the format mapping). The writer is chunked and ends a chunk at least
//! every `flush_every`, so a recorder killed with -9 (or stopped by a full
//! disk) leaves a file whose completed chunks every MCAP reader can read;
//! the reader reads such a file to its last complete record and says that
//! it was cut short, and skips a damaged chunk (its CRC, its compressed
//! data) to read on after it. The `file:///` backend is built on these
//! two.

mod writer;

pub use writer::RecordWriter;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mcap::records::Record;
use mcap::sans_io::{LinearReadEvent, LinearReader, LinearReaderOptions};
use milonga_wire::cbor::decode_cbor;
use milonga_wire::{Bytes, Encoding, Key, NodeId};

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
/// Channel metadata, present when the channel's first sequence number is
/// past 2^32: its high 32 bits (decimal). MCAP keeps a message's low 32
/// bits; a reader extends them from there, each after the one before (in
/// the last one's block of 2^32, or the next when that would be more than
/// 2^31 below it). A publisher's number that would not read back that way
/// starts a new channel for the key.
pub const META_SEQ_HIGH: &str = "milonga.seq_high";
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
    /// The permissions the file is created with (the umask applies):
    /// 0o666 by default, as any file; a copy that replaces a recording
    /// takes the recording's from its first byte.
    pub mode: u32,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            compression: Compression::Zstd,
            chunk_bytes: 1 << 20,
            flush_every: Duration::from_secs(1),
            metadata: BTreeMap::new(),
            mode: 0o666,
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
    /// A `file:///` node cannot append to the recording there (it is
    /// not finished, or holds what a copy would leave out): it is left
    /// as it is.
    #[error("{path}: cannot append to it: {why}")]
    Append {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// The recording holds 65,536 channels (key and publisher pairs),
    /// MCAP's most: a sample of a new one cannot go in this file (a
    /// recorder goes on in a new file).
    #[error("a sample of {key} cannot be recorded: the recording holds 65,536 channels (key and publisher pairs), MCAP's most")]
    Channels {
        /// The sample's key.
        key: String,
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

fn format_err(path: &Path, e: impl std::fmt::Display) -> RecordError {
    RecordError::Format {
        path: path.to_path_buf(),
        why: e.to_string(),
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
    let mut copy = || -> Result<(), RecordError> {
        while let Some(entry) = next.take() {
            match entry {
                Entry::Sample(s, at) => w.sample(&s, at)?,
                Entry::Event(ev, at) => w.event(&ev, at)?,
            }
            n += 1;
            next = reader.next_entry()?;
        }
        Ok(())
    };
    match copy() {
        Ok(()) => Ok((w, n)),
        Err(e) => {
            // Not left behind as a complete recording of part of it.
            w.abandon();
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
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
            // Milliseconds to the microsecond (100.864, not 100.86390800000001).
            "silent_ms": d.silent_for.as_micros() as f64 / 1000.0,
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
    // A key must be one (as a sample's topic must): anything else is a
    // field this version does not know.
    let key = |f: &str| text(f).filter(|k| milonga_wire::Key::new(k).is_ok());
    let node = |f: &str| NodeId::from_hex(j.get(f)?.as_str()?);
    let num = |f: &str| j.get(f)?.as_u64();
    Some(match j.get("event")?.as_str()? {
        "lost" => Event::Lost(LostSamples {
            publisher: node("publisher")?,
            key: key("key")?,
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
            key: key("key")?,
            silent_for: Duration::try_from_secs_f64(j.get("silent_ms")?.as_f64()? / 1000.0).ok()?,
        }),
        "subscription_live" => Event::SubscriptionLive,
        "incompatible_qos" => Event::IncompatibleQos(IncompatibleQos {
            publisher: node("publisher")?,
            key: key("key")?,
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
/// Milonga's (a foreign MCAP file), messages that do not decode (or
/// status events of a kind this version does not know), records that
/// are not Milonga's, and damaged chunks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Messages of channels with another encoding, a topic that is not a
    /// Milonga key, no publisher, or of no channel (one whose record was
    /// in a damaged chunk of a file with no summary to repeat it).
    pub foreign: u64,
    /// Messages whose data did not decode.
    pub undecodable: u64,
    /// Records a Milonga recording does not hold: attachments, metadata
    /// other than `milonga` (or past [`METADATA_LIMIT`]), records of
    /// opcodes MCAP does not define.
    pub other_records: u64,
    /// Chunks skipped because they are damaged: their CRC does not match
    /// what they hold, their data does not decompress, or they claim more
    /// than [`RECORD_LIMIT`] once decompressed (none of their messages is
    /// given); or a record in them is malformed (those before it were
    /// given); or their framing is damaged (a record length, a chunk's
    /// header: the read went on at the next chunk a finished file's
    /// summary indexes, or, without a summary, at the next sound chunk
    /// found; each chunk the search passed that looked sound but did not
    /// open is counted). [`RecordReader::damage`] says why the first was.
    /// Their messages are lost, said as losses; the read goes on.
    pub damaged_chunks: u64,
}

impl Skipped {
    /// Whether nothing was skipped.
    pub fn is_empty(&self) -> bool {
        *self == Skipped::default()
    }
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} messages of channels that are not Milonga's, {} that did not decode, {} other records, {} damaged chunks",
            self.foreign, self.undecodable, self.other_records, self.damaged_chunks
        )
    }
}

/// The most bytes of `milonga` metadata a reader keeps (names and values,
/// all records together); past it, a record is skipped (counted in
/// [`Skipped::other_records`]): a hostile file cannot make a reader hold
/// more.
pub const METADATA_LIMIT: usize = 1 << 20;

/// Reads a recording from start to end, record by record (the file is
/// never loaded whole; a chunk at a time). A file cut short (a recorder
/// killed, a full disk) is read to its last complete record;
/// [`RecordReader::truncated`] then says why it ended. A damaged chunk is
/// skipped, never read as changed values, and the read goes on after it
/// ([`Skipped::damaged_chunks`], [`RecordReader::damage`]); after damage
/// to the framing (a record's length, a chunk's header, a record outside
/// a chunk) it goes on at the next chunk a finished file's summary
/// indexes, or in a file without one at the next sound chunk found.
pub struct RecordReader {
    path: PathBuf,
    /// Buffered: the reader asks for a few bytes at a time (a record's
    /// opcode and length, then its body), a system call each unbuffered;
    /// a chunk's body, asked whole, is read past the buffer. Small, as a
    /// read that goes on by the index fills it anew at each chunk it
    /// starts a linear reader at.
    file: std::io::BufReader<File>,
    /// Reads the file's own records; chunks come whole, as records, and
    /// are opened here ([`open_chunk`]).
    reader: LinearReader,
    /// Where in the file the bytes handed to `reader` end.
    fed: u64,
    /// The file's length when last looked at (it may grow: a recording
    /// still being written). A read asks for no more than it holds.
    known_len: u64,
    /// The end of the last chunk read (whole, damaged or not): the
    /// records before it were read.
    read_end: u64,
    /// The furthest a linear reader took the file's bytes: a new one
    /// starts only past it, so that no byte is framed twice (below it,
    /// chunks are read as the summary's index gives them).
    mark: u64,
    /// The read goes on by the summary's chunk index, after damage to the
    /// framing ([`RecordReader::next_by_index`]).
    by_index: bool,
    /// A chunk was seen (a metadata record after one is not Milonga's).
    chunks_seen: bool,
    /// Chunks opened or found damaged: at the end of a read that used the
    /// summary, those it indexes beyond that many were passed unseen.
    chunks_met: u64,
    settled: bool,
    /// The reader was made again after damage (it does not check the
    /// data section's CRC).
    resumed: bool,
    /// The chunk whose records are being given, and where in it.
    chunk: Option<(Bytes, usize)>,
    zstd: Zstd,
    /// Bytes the searches for the next chunk read, decompressed and
    /// checked, all searches together ([`RecordReader::find_chunk`]).
    search_work: u64,
    /// The summary was looked for (at the first damage to the framing),
    /// and what it held.
    summary_read: bool,
    summary: Option<Summary>,
    truncated: Option<String>,
    finished: bool,
    st: ReadState,
}

/// What a [`RecordReader`] learned from the records read so far.
#[derive(Default)]
struct ReadState {
    channels: HashMap<u16, Channel>,
    skipped: Skipped,
    metadata: BTreeMap<String, String>,
    complete: bool,
    seen_header: bool,
    /// Bytes of the last entry's message data, as stored.
    last_len: usize,
    /// Bytes of `metadata`.
    metadata_bytes: usize,
    /// Past the data section: the summary repeats the channel records.
    in_summary: bool,
    /// Why the first damaged chunk (or damaged framing) was skipped.
    damage: Option<String>,
    /// Written by Milonga (its header says so), which puts every message
    /// and every channel record of the data section in a chunk.
    only_chunked: bool,
    /// A sample to give after the loss given before it.
    pending: Option<Entry>,
    /// The channels whose records were read since the read last lost its
    /// way: what [`ReadState::channels_from`] checks (a few, however long
    /// the file).
    new_channels: Vec<u16>,
    /// The summary's channels were taken in.
    merged: bool,
    /// Searches for the next chunk that passed bytes (which may have held
    /// samples): like a damaged chunk, a gap after one is said lost.
    passes: u64,
}

impl std::fmt::Debug for RecordReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordReader")
            .field("path", &self.path)
            .finish()
    }
}

#[derive(Debug, Clone)]
enum Channel {
    Events,
    Samples {
        key: String,
        publisher: NodeId,
        encoding: Encoding,
        replayed: bool,
        /// The last sequence number read, extended to 64 bits.
        last_seq: u64,
        /// The high bits of its first ([`META_SEQ_HIGH`]), where the
        /// extension starts.
        base: u64,
        /// Damaged chunks skipped, and searches that passed bytes, before
        /// its last sample was read.
        damage_seen: u64,
    },
    Foreign,
}

impl Channel {
    /// What a channel record describes: Milonga's events, samples of a
    /// key by a publisher, or something foreign.
    fn of(topic: &str, message_encoding: &str, metadata: &BTreeMap<String, String>) -> Channel {
        if topic == EVENTS_TOPIC {
            return Channel::Events;
        }
        if message_encoding != "cbor" || Key::new(topic).is_err() {
            return Channel::Foreign;
        }
        match metadata
            .get(META_PUBLISHER)
            .and_then(|h| NodeId::from_hex(h))
        {
            Some(publisher) => Channel::Samples {
                key: topic.to_owned(),
                publisher,
                encoding: encoding_of(metadata.get(META_ENCODING).map_or("cbor", String::as_str)),
                replayed: metadata.get(META_REPLAYED).is_some_and(|v| v == "true"),
                last_seq: 0,
                base: metadata
                    .get(META_SEQ_HIGH)
                    .and_then(|h| h.parse::<u32>().ok())
                    .map_or(0, |h| u64::from(h) << 32),
                damage_seen: 0,
            },
            None => Channel::Foreign,
        }
    }

    /// Whether `self` and `other` describe the same channel (their numbers
    /// aside).
    fn same(&self, other: &Channel) -> bool {
        match (self, other) {
            (Channel::Events, Channel::Events) | (Channel::Foreign, Channel::Foreign) => true,
            (
                Channel::Samples {
                    key,
                    publisher,
                    encoding,
                    replayed,
                    base,
                    ..
                },
                Channel::Samples {
                    key: k,
                    publisher: p,
                    encoding: e,
                    replayed: r,
                    base: b,
                    ..
                },
            ) => key == k && publisher == p && encoding == e && replayed == r && base == b,
            _ => false,
        }
    }
}

/// The most bytes of a summary section read after a damaged chunk (read
/// whole, its CRC checked).
const SUMMARY_LIMIT: u64 = 64 << 20;

/// What a finished file's summary tells a reader that lost its way after
/// damage to the framing: every channel (its record may have been in
/// what was passed), and where every chunk is.
struct Summary {
    /// At most one a channel id (65,536).
    channels: HashMap<u16, Channel>,
    /// Each chunk's start and the length of its record (opcode and length
    /// included), by start.
    chunks: Vec<(u64, u64)>,
}

/// The summary section of a finished file: its channel records and chunk
/// indexes, if it is at most [`SUMMARY_LIMIT`] bytes and its CRC (not 0)
/// matches; nothing else of it is kept.
fn read_summary(f: &mut File) -> Option<Summary> {
    // The footer record (opcode, length, summary start, summary offset
    // start, CRC), then the magic. Its CRC covers the summary and the
    // footer up to the CRC.
    const TAIL: u64 = 1 + 8 + 8 + 8 + 4 + 8;
    const COVERED: usize = 1 + 8 + 8 + 8;
    let len = f.metadata().ok()?.len();
    if len < MAGIC_LEN + TAIL {
        return None;
    }
    let mut tail = [0u8; TAIL as usize];
    f.seek(std::io::SeekFrom::Start(len - TAIL)).ok()?;
    f.read_exact(&mut tail).ok()?;
    let start = u64::from_le_bytes(tail[9..17].try_into().ok()?);
    let crc = u32::from_le_bytes(tail[25..29].try_into().ok()?);
    if tail[0] != mcap::records::op::FOOTER
        || tail[29..] != *mcap::MAGIC
        || crc == 0
        || start < MAGIC_LEN
        || len - TAIL < start
        || len - TAIL - start > SUMMARY_LIMIT
    {
        return None;
    }
    let summary_len = usize::try_from(len - TAIL - start).ok()?;
    let mut bytes = vec![0u8; summary_len + COVERED];
    f.seek(std::io::SeekFrom::Start(start)).ok()?;
    f.read_exact(&mut bytes).ok()?;
    if crc32fast::hash(&bytes) != crc {
        return None;
    }
    let mut summary = &bytes[..summary_len];
    let mut found = Summary {
        channels: HashMap::new(),
        chunks: Vec::new(),
    };
    while summary.len() >= 9 {
        let body = usize::try_from(u64::from_le_bytes(summary[1..9].try_into().ok()?)).ok()?;
        let record = summary.get(9..9usize.checked_add(body)?)?;
        match mcap::parse_record(summary[0], record) {
            Ok(Record::Channel(c)) => {
                found
                    .channels
                    .entry(c.id)
                    .or_insert_with(|| Channel::of(&c.topic, &c.message_encoding, &c.metadata));
            }
            // Chunks lie in the data section, after the header.
            Ok(Record::ChunkIndex(c))
                if c.chunk_start_offset >= MAGIC_LEN && c.chunk_start_offset < start =>
            {
                found.chunks.push((c.chunk_start_offset, c.chunk_length));
            }
            _ => {}
        }
        summary = &summary[9 + body..];
    }
    found.chunks.sort_unstable();
    found.chunks.dedup_by_key(|c| c.0);
    Some(found)
}

/// A chunk a search found ([`RecordReader::find_chunk`]).
struct FoundChunk {
    start: u64,
    /// What it holds, decompressed, its CRC checked.
    records: Bytes,
    /// Where the record after it starts.
    end: u64,
}

/// What the searches for the next chunk in a file without a summary read,
/// decompress and check, all of a read's together, besides four times the
/// file's length ([`RecordReader::find_chunk`]).
const SEARCH_BUDGET: u64 = 64 << 20;

/// Whether the `head` of bytes at `start` (a chunk opcode first) begins a
/// chunk record that agrees with itself and fits before `file_len`: the
/// length of the chunk's body its header gives (the record's own length,
/// which no CRC covers, is not trusted; bytes another writer left after
/// the chunk's data are passed by the next search) and the size it
/// claims decompressed. The body's CRC must not be 0: only a chunk it
/// checks is trusted where the framing is lost.
fn chunk_candidate(head: &[u8], start: u64, file_len: u64) -> Option<(u64, u64)> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(head.get(at..at + 8)?.try_into().ok()?));
    let (t0, t1, size) = (u64_at(9)?, u64_at(17)?, u64_at(25)?);
    let crc = u32::from_le_bytes(head.get(33..37)?.try_into().ok()?);
    let name_len = u32::from_le_bytes(head.get(37..41)?.try_into().ok()?) as usize;
    let name: &[u8] = match name_len {
        0 => b"",
        3 => b"lz4",
        4 => b"zstd",
        _ => return None,
    };
    if head.get(41..41 + name_len)? != name || t0 > t1 || crc == 0 || size > RECORD_LIMIT as u64 {
        return None;
    }
    let packed = u64_at(41 + name_len)?;
    if name.is_empty() && packed != size {
        return None;
    }
    let len = (32 + name_len as u64 + 8).checked_add(packed)?;
    if len > RECORD_LIMIT as u64 || start.checked_add(9)?.checked_add(len)? > file_len {
        return None;
    }
    Some((len, size))
}

/// The MCAP magic that starts a file (and ends a finished one).
const MAGIC_LEN: u64 = 8;

/// A linear reader of the file's records from the start (`resumed`: from
/// a record boundary after damage). Chunks come whole, as records:
/// [`open_chunk`] checks each before any of its messages is given. Read
/// from the start, the data section's CRC is checked (a reader resumed
/// has not seen all of it); the summary's CRC too; a file must end at the
/// magic after its footer (a footer followed by more is not a whole
/// recording).
fn linear_reader(resumed: bool) -> LinearReader {
    LinearReader::new_with_options(
        LinearReaderOptions::default()
            .with_skip_start_magic(resumed)
            .with_emit_chunks(true)
            .with_validate_data_section_crc(!resumed)
            .with_validate_summary_section_crc(true)
            .with_check_finishes_after_end_magic(true)
            .with_record_length_limit(RECORD_LIMIT),
    )
}

/// A reader's zstd context, made at its first compressed chunk.
type Zstd = Option<zstd::bulk::Decompressor<'static>>;

/// What is wrong with a chunk.
enum ChunkFault {
    /// Its data: it is skipped, and the read goes on at the next record
    /// (the chunk's header agrees with its length).
    Data(String),
    /// Its header, which does not agree with the record's length (no CRC
    /// covers either): the record's end cannot be trusted.
    Framing(String),
}

/// A chunk record's body opened: its records, decompressed, and the bytes
/// after its data, if its header agrees with the record's length (`exact`:
/// no bytes after the chunk's data, which Milonga's writer never leaves),
/// its data decompresses to the size it claims (at most [`RECORD_LIMIT`])
/// and its CRC (when not 0) matches what it holds.
fn open_chunk(body: &[u8], exact: bool, zstd: &mut Zstd) -> Result<(Bytes, u64), ChunkFault> {
    // Start and end times, uncompressed size, CRC, the compression's name
    // (its u32 length first), the compressed size, then that many bytes.
    let framing = |why: &str| ChunkFault::Framing(format!("a chunk header that {why}"));
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?))
    };
    let fixed = body.get(..32).ok_or_else(|| framing("is cut short"))?;
    let size = u64::from_le_bytes(fixed[16..24].try_into().unwrap_or_default());
    let crc = u32::from_le_bytes(fixed[24..28].try_into().unwrap_or_default());
    let name_len = u32::from_le_bytes(fixed[28..32].try_into().unwrap_or_default()) as usize;
    let name = body
        .get(32..32usize.saturating_add(name_len))
        .ok_or_else(|| framing("names a compression longer than the chunk"))?;
    let at = 32 + name_len;
    let packed_len = u64_at(at).ok_or_else(|| framing("is cut short"))?;
    let data = &body[at + 8..];
    if (data.len() as u64) < packed_len || (exact && data.len() as u64 != packed_len) {
        return Err(framing("does not agree with the chunk's length"));
    }
    let padding = data.len() as u64 - packed_len;
    let data = &data[..packed_len as usize];
    let damaged = |why: String| ChunkFault::Data(why);
    if size > RECORD_LIMIT as u64 {
        return Err(damaged(format!(
            "a chunk claiming {size} bytes once decompressed, more than {RECORD_LIMIT}"
        )));
    }
    let size = size as usize;
    let records = match name {
        b"" => Bytes::copy_from_slice(data),
        b"zstd" | b"lz4" => {
            let read = if name == b"zstd" {
                // At most the size claimed (up to RECORD_LIMIT), at most
                // what the data's frames say they hold.
                match zstd {
                    Some(z) => Ok(z),
                    None => zstd::bulk::Decompressor::new().map(|z| zstd.insert(z)),
                }
                .and_then(|z| z.decompress(data, size))
            } else {
                // Decompressed as a stream, into memory that grows with
                // what comes out: a header's claim alone allocates little.
                let mut out = Vec::with_capacity(size.min(16 << 20));
                lz4::Decoder::new(data)
                    .and_then(|d| d.take(size as u64 + 1).read_to_end(&mut out))
                    .map(|_| out)
            };
            let out = match read {
                Ok(out) => out,
                Err(e) => {
                    return Err(damaged(format!(
                        "a chunk whose data does not decompress: {e}"
                    )))
                }
            };
            if out.len() != size {
                return Err(damaged(format!(
                    "a chunk that decompresses to {} bytes, not the {size} it claims",
                    out.len()
                )));
            }
            Bytes::from(out)
        }
        other => {
            return Err(damaged(format!(
                "a chunk compressed with {:?}, which this reader does not know",
                String::from_utf8_lossy(other)
            )))
        }
    };
    if records.len() != size {
        return Err(damaged(format!(
            "a chunk of {} bytes that claims {size}",
            records.len()
        )));
    }
    let calculated = crc32fast::hash(&records);
    if crc != 0 && calculated != crc {
        return Err(damaged(format!(
            "Chunk CRC failed: saved {crc:08x}, calculated {calculated:08x}"
        )));
    }
    Ok((records, padding))
}

/// Whether a message index record's body (channel id, then its entries'
/// byte length and the entries, 16 bytes each) is exactly as long as it
/// says: one that is not is bytes of another record read as one.
fn message_index_exact(body: &[u8]) -> bool {
    body.get(2..6)
        .and_then(|n| n.try_into().ok())
        .map(|n| u32::from_le_bytes(n) as usize)
        .is_some_and(|n| n == body.len() - 6 && n % 16 == 0)
}

/// The next record of an opened chunk at `*pos` (its opcode, and the range
/// of its body in `records`), `pos` moved past it; `None` at the chunk's
/// end; an error if the record runs past the chunk's end.
fn chunk_record(
    records: &[u8],
    pos: &mut usize,
) -> Result<Option<(u8, std::ops::Range<usize>)>, String> {
    if *pos >= records.len() {
        return Ok(None);
    }
    let head = records
        .get(*pos..*pos + 9)
        .ok_or("a record in the chunk is cut short by its end")?;
    let len = u64::from_le_bytes(head[1..].try_into().unwrap_or_default());
    let start = *pos + 9;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| start.checked_add(l))
        .filter(|&end| end <= records.len())
        .ok_or("a record in the chunk runs past its end")?;
    *pos = end;
    Ok(Some((head[0], start..end)))
}

impl RecordReader {
    /// Opens a recording: a file that starts with MCAP's magic (anything
    /// else, a directory or an empty file among others, is refused here
    /// rather than at the first read).
    pub fn open(path: &Path) -> Result<RecordReader, RecordError> {
        let io = |source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        };
        let not = |why: &str| RecordError::Format {
            path: path.to_path_buf(),
            why: format!("{why}: not a recording"),
        };
        // Not a FIFO or a device: their open or reads would wait for ever.
        let mut file = match crate::util::sys::open_regular(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(not("not a regular file"))
            }
            Err(e) => return Err(io(e)),
        };
        let mut magic = [0u8; MAGIC_LEN as usize];
        match std::io::Read::read_exact(&mut file, &mut magic) {
            Ok(()) if magic == *writer::MAGIC => {}
            Ok(()) => return Err(not("it does not start with MCAP's magic")),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(not("it is shorter than MCAP's magic"))
            }
            Err(e) => return Err(io(e)),
        }
        std::io::Seek::rewind(&mut file).map_err(io)?;
        Ok(RecordReader {
            path: path.to_path_buf(),
            file: std::io::BufReader::with_capacity(1 << 13, file),
            reader: linear_reader(false),
            fed: 0,
            known_len: 0,
            read_end: MAGIC_LEN,
            mark: 0,
            by_index: false,
            chunks_seen: false,
            chunks_met: 0,
            settled: false,
            resumed: false,
            chunk: None,
            zstd: None,
            truncated: None,
            finished: false,
            summary_read: false,
            summary: None,
            search_work: 0,
            st: ReadState::default(),
        })
    }

    /// Why the file ended before its summary, if it did (read to the end
    /// first).
    pub fn truncated(&self) -> Option<&str> {
        self.truncated.as_deref()
    }

    /// Whether the file ended with its footer and the magic after it,
    /// with nothing after, and nothing in it was damaged: the recorder
    /// finished it and it reads whole.
    pub fn complete(&self) -> bool {
        self.st.complete && self.truncated.is_none() && self.st.damage.is_none()
    }

    /// Why the first damaged chunk was skipped, or the first damage to
    /// the framing passed, if the read skipped any (read to the end
    /// first); [`Skipped::damaged_chunks`] counts the chunks skipped.
    pub fn damage(&self) -> Option<&str> {
        self.st.damage.as_deref()
    }

    /// Bytes of the last entry's message data as the file stores it (the
    /// value's CBOR, an event's JSON).
    pub fn last_len(&self) -> usize {
        self.st.last_len
    }

    /// Messages skipped so far.
    pub fn skipped(&self) -> &Skipped {
        &self.st.skipped
    }

    /// The `milonga` metadata record, once read (it comes first).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.st.metadata
    }

    /// The next entry, `Ok(None)` at the end (or where the file was cut
    /// short). An error is a file that is not MCAP at all.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, RecordError> {
        let next = self.next_record_entry();
        if matches!(next, Ok(None)) && !self.settled {
            self.settled = true;
            self.count_unmet_chunks();
        }
        next
    }

    /// At the end of a read that used the summary (after damage): the
    /// chunks it indexes that the read neither opened nor counted (a
    /// length damaged so that the read went past them on a boundary) are
    /// counted as damaged, and said.
    fn count_unmet_chunks(&mut self) {
        let Some(summary) = &self.summary else {
            return;
        };
        let unmet = (summary.chunks.len() as u64).saturating_sub(self.chunks_met);
        if unmet > 0 {
            self.st.skipped.damaged_chunks += unmet;
            self.st.damage.get_or_insert_with(|| {
                format!("{unmet} chunks the summary indexes were passed unread")
            });
        }
    }

    fn next_record_entry(&mut self) -> Result<Option<Entry>, RecordError> {
        loop {
            if let Some(entry) = self.st.pending.take() {
                return Ok(Some(entry));
            }
            if let Some(entry) = self.next_in_chunk() {
                return Ok(Some(entry));
            }
            if self.finished {
                return Ok(None);
            }
            if self.by_index {
                if !self.next_by_index()? {
                    return Ok(None);
                }
                continue;
            }
            let event = match self.reader.next_event() {
                None => {
                    self.finished = true;
                    if !self.st.seen_header {
                        return Err(format_err(&self.path, "it ends before its header record"));
                    }
                    return Ok(None);
                }
                Some(Err(e)) => {
                    if !self.st.seen_header {
                        if matches!(e, mcap::McapError::BadMagic) {
                            self.finished = true;
                            return Err(format_err(&self.path, e));
                        }
                        if !self.no_header(e.to_string())? {
                            return Ok(None);
                        }
                        continue;
                    }
                    // Cut short (whatever came last was read whole), or
                    // the framing damaged: a length that runs past the
                    // file's end or past what a reader takes, a record
                    // that does not parse.
                    let eof = matches!(e, mcap::McapError::UnexpectedEof);
                    if !self.lost_the_way(e.to_string(), eof) {
                        return Ok(None);
                    }
                    continue;
                }
                Some(Ok(e)) => e,
            };
            let (opcode, data) = match event {
                LinearReadEvent::ReadRequest(need) => {
                    // No more than the file holds (looked at again when
                    // that is passed): the reader makes room for what it
                    // is asked, so a length field claiming 256 MiB in a
                    // file of 60 bytes would allocate 256 MiB.
                    let mut room = self.known_len.saturating_sub(self.fed);
                    if room < need as u64 {
                        self.known_len = self
                            .file
                            .get_ref()
                            .metadata()
                            .map_or(self.known_len, |m| m.len());
                        room = self.known_len.saturating_sub(self.fed);
                    }
                    let ask = need.min(usize::try_from(room).unwrap_or(usize::MAX)).max(1);
                    let buf = self.reader.insert(ask);
                    let n = self.file.read(buf).map_err(|source| RecordError::Io {
                        path: self.path.clone(),
                        source,
                    })?;
                    self.reader.notify_read(n);
                    self.fed += n as u64;
                    continue;
                }
                LinearReadEvent::Record { opcode, data } => (opcode, data),
            };
            if opcode == mcap::records::op::CHUNK && !self.st.seen_header {
                if !self.no_header("its first record is a chunk, not a header".into())? {
                    return Ok(None);
                }
                continue;
            }
            if opcode == mcap::records::op::CHUNK {
                self.chunks_seen = true;
                match open_chunk(data, self.st.only_chunked, &mut self.zstd) {
                    Ok((records, padding)) => {
                        // Bytes after a chunk's data (another writer's)
                        // may hold chunks the index still has.
                        self.read_end = self.fed - padding;
                        self.chunk = Some((records, 0));
                        self.chunks_met += 1;
                    }
                    Err(ChunkFault::Data(why)) => {
                        self.read_end = self.fed;
                        self.chunks_met += 1;
                        self.chunk_damaged(why);
                    }
                    Err(ChunkFault::Framing(why)) => {
                        if !self.lost_the_way(why, false) {
                            return Ok(None);
                        }
                    }
                }
                continue;
            }
            let record = match mcap::parse_record(opcode, data) {
                Ok(r) => r,
                Err(e) if !self.st.seen_header => {
                    if !self.no_header(e.to_string())? {
                        return Ok(None);
                    }
                    continue;
                }
                Err(e) => {
                    if !self.lost_the_way(e.to_string(), false) {
                        return Ok(None);
                    }
                    continue;
                }
            };
            // Milonga's writer puts every message and every channel record
            // in a chunk, and nothing else in the data section but its
            // header and metadata first, the chunks' message indexes and
            // the data end: any other record there is bytes of another
            // record read as one, after a record length was damaged (no
            // CRC covers it until the data section's, at the end), or a
            // chunk whose opcode was: the framing cannot be trusted on.
            let stray = match &record {
                _ if !self.st.only_chunked => None,
                Record::Message { .. } => Some("a message outside a chunk"),
                // The summary repeats the channels.
                _ if self.st.in_summary => None,
                Record::Metadata(m) if !self.chunks_seen && m.name == METADATA_NAME => None,
                Record::DataEnd(_) if data.len() == 4 => None,
                Record::MessageIndex(_) if message_index_exact(data) => None,
                Record::Channel(_) => Some("a channel record outside a chunk"),
                _ => Some("a record out of place in the data section"),
            };
            if let Some(what) = stray {
                let why = format!(
                    "{what} (opcode {opcode:#04x}), which this recorder does not write: a record length before it is damaged"
                );
                if !self.lost_the_way(why, false) {
                    return Ok(None);
                }
                continue;
            }
            match self.st.take(record, None) {
                Ok(Some(entry)) => {
                    // A message outside a chunk (another writer's file):
                    // read, never read again after damage.
                    self.read_end = self.fed;
                    return Ok(Some(entry));
                }
                Ok(None) => {}
                Err(why) => {
                    if !self.no_header(why.into())? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// The next entry of the open chunk, if it has one more; a record in
    /// it that does not parse ends the chunk there, counted as damaged.
    fn next_in_chunk(&mut self) -> Option<Entry> {
        let (records, pos) = self.chunk.as_mut()?;
        let damage = loop {
            let (opcode, range) = match chunk_record(records, pos) {
                Ok(Some(r)) => r,
                Ok(None) => break None,
                Err(why) => break Some(why.to_owned()),
            };
            let body = &records[range.clone()];
            let record = match mcap::parse_record(opcode, body) {
                Ok(r) => r,
                Err(e) => break Some(format!("a record in the chunk does not parse: {e}")),
            };
            // A message most of the chunk holds is given as a view of
            // it (no copy); a smaller one is copied, so that it does
            // not keep the whole chunk in memory.
            let view = match &record {
                Record::Message { data, .. } if data.len() * 2 >= records.len() => {
                    Some(records.slice(range.end - data.len()..range.end))
                }
                _ => None,
            };
            match self.st.take(record, view) {
                Ok(Some(entry)) => return Some(entry),
                Ok(None) => {}
                // Only a header can be refused, and a chunk never
                // holds one (counted as another record).
                Err(why) => break Some(why.to_owned()),
            }
        };
        self.chunk = None;
        if let Some(why) = damage {
            self.chunk_damaged(why);
        }
        None
    }

    /// A chunk was found damaged (`why`): counted, and said if it is the
    /// first damage. It may have held channel records: a finished file's
    /// summary repeats them all (read at the first damage).
    fn chunk_damaged(&mut self, why: String) {
        self.st.skipped.damaged_chunks += 1;
        self.st.damage.get_or_insert(why);
        // The data section's CRC fails now: the read goes on at the next
        // record (the chunk read whole, its framing sound) without it.
        if !self.resumed {
            self.resumed = true;
            self.reader = linear_reader(true);
        }
        self.load_summary();
        if let Some(summary) = &self.summary {
            self.st.merge(&summary.channels);
        }
    }

    /// Reads the summary, at the first call, on a handle of its own: the
    /// same file, not one that replaced it at that path meanwhile (then,
    /// or if the path cannot be opened, no summary is used). Whether the
    /// file was replaced.
    fn load_summary(&mut self) -> bool {
        if self.summary_read {
            return false;
        }
        self.summary_read = true;
        match self.reopen() {
            Ok(Some(mut f)) => {
                self.summary = read_summary(&mut f);
                false
            }
            _ => true,
        }
    }

    /// The file's first record is not a header that parses (`why`): not
    /// a recording (an error), unless a finished file's summary (its CRC
    /// matching) says where its chunks are: then the header's damage is
    /// said and the read goes on by the summary. Whether it goes on.
    fn no_header(&mut self, why: String) -> Result<bool, RecordError> {
        let replaced = self.load_summary();
        if replaced || self.summary.is_none() {
            self.finished = true;
            return Err(format_err(&self.path, why));
        }
        self.st.seen_header = true;
        Ok(self.lost_the_way(format!("its header record is damaged: {why}"), false))
    }

    /// The framing is damaged (`why`): no record boundary can be trusted
    /// after the last one read. A finished file's summary says where each
    /// chunk is: the read goes on by it ([`RecordReader::next_by_index`]).
    /// Otherwise the read goes on at the next sound chunk found after the
    /// last chunk read ([`RecordReader::find_chunk`]; with `eof`, the bytes
    /// ran out inside a record, and only the bytes read are searched: a
    /// file being written has grown since, its last record cut short, not
    /// damaged), or ends here, said. Whether it goes on.
    fn lost_the_way(&mut self, why: String, eof: bool) -> bool {
        let replaced = self.load_summary();
        let Some(summary) = self.summary.as_ref().filter(|_| !replaced) else {
            // Past the data section (a footer, then more bytes: not one
            // recording) no chunk is looked for.
            if !replaced && !self.st.in_summary && !self.st.complete {
                let first = self.st.damage.is_none();
                let mut passed = None;
                let from = self.read_end;
                let found = self.find_chunk(from, eof.then_some(self.fed), &mut passed);
                if let (true, Some(passed)) = (first, &passed) {
                    self.st.damage = Some(passed.clone());
                }
                match found {
                    Ok(Some(FoundChunk {
                        start,
                        records,
                        end,
                    })) => {
                        if first {
                            self.st.damage = Some(format!(
                                "{why}; the framing is damaged: the read went on at the next sound chunk found, at byte {start}, {} bytes after the last chunk read{}",
                                start - from,
                                passed.map_or(String::new(), |d| format!(" (a chunk passed: {d})"))
                            ));
                        }
                        // What the bytes passed held is said lost where
                        // the numbers show a gap.
                        if start > from {
                            self.st.passes += 1;
                        }
                        self.resume_after(records, end);
                        return true;
                    }
                    Ok(None) => {}
                    Err(gave_up) => {
                        self.finished = true;
                        self.truncated = Some(format!("{why}; {gave_up}"));
                        return false;
                    }
                }
            }
            self.finished = true;
            self.truncated = Some(if replaced {
                format!("{why}; the file was replaced while it was read")
            } else {
                why
            });
            return false;
        };
        self.st.damage.get_or_insert_with(|| {
            format!("{why}; the framing is damaged: the read went on by the summary's chunk index")
        });
        // What was read since the last chunk may have been bytes inside
        // records taken for records: the channels that came in since are
        // the summary's (the numbers read of each kept where it is the
        // same channel), and the read is in the data section.
        self.st.channels_from(&summary.channels);
        self.st.in_summary = false;
        self.mark = self.mark.max(self.fed);
        self.resumed = true;
        self.by_index = true;
        // Its buffer (up to a record's worth) goes.
        self.reader = linear_reader(true);
        true
    }

    /// Searches the file from `from` (the end of the last chunk read) to
    /// `upto` (or its end) for the next chunk, in a file without a
    /// summary to say where its chunks are: a chunk opcode followed by a
    /// header that agrees with itself (times in order, a compression this
    /// reader knows, sizes within the file and [`RECORD_LIMIT`]) and a CRC
    /// that is not 0 and matches what the chunk holds. Its length is the
    /// one its header gives, so a chunk whose record length alone is
    /// damaged is found whole. Each candidate that looks sound but does
    /// not open is a damaged chunk, counted (why the first did not open in
    /// `passed`). The chunk found, or none; an error if the search gave
    /// up: all the searches of a read together read, decompress and check
    /// at most [`SEARCH_BUDGET`] bytes more than four times the file's
    /// length, so that a file crafted with many headers that fail, or
    /// many damaged places, cannot make a read take much longer than
    /// reading the file.
    fn find_chunk(
        &mut self,
        from: u64,
        upto: Option<u64>,
        passed: &mut Option<String>,
    ) -> Result<Option<FoundChunk>, String> {
        use std::os::unix::fs::FileExt;
        // A chunk record's opcode and length, times, size, CRC, the
        // compression's name (its length, then at most "zstd") and the
        // compressed size.
        const HEAD: usize = 9 + 28 + 4 + 4 + 8;
        const BLOCK: usize = 64 << 10;
        let failed = |e: std::io::Error| format!("the search for the next chunk failed: {e}");
        let file_len = self.file.get_ref().metadata().map_err(failed)?.len();
        let allowed = SEARCH_BUDGET.saturating_add(file_len.saturating_mul(4));
        let end_at = file_len.min(upto.unwrap_or(u64::MAX));
        let mut block = vec![0u8; BLOCK + HEAD];
        let mut at = from;
        let spend = |work: &mut u64, bytes: u64, start: u64| {
            *work = work.saturating_add(bytes);
            if *work > allowed {
                return Err(format!(
                    "the search for the next chunk gave up at byte {start}, after reading and checking {allowed} bytes in its searches"
                ));
            }
            Ok(())
        };
        while at < end_at {
            let n = usize::try_from(end_at - at).map_or(block.len(), |left| left.min(block.len()));
            spend(&mut self.search_work, n as u64, at)?;
            self.file
                .get_ref()
                .read_exact_at(&mut block[..n], at)
                .map_err(failed)?;
            let last = at + n as u64 == end_at;
            // Each candidate searched here has its whole head in the block.
            let searched = if last { n } else { n - HEAD };
            let mut i = 0;
            while let Some(k) = block[i..searched]
                .iter()
                .position(|&b| b == mcap::records::op::CHUNK)
            {
                let start = at + (i + k) as u64;
                i += k + 1;
                let Some((len, size)) = block[..n]
                    .get(i - 1..i - 1 + HEAD)
                    .and_then(|head| chunk_candidate(head, start, end_at))
                else {
                    continue;
                };
                // Read, then decompressed and checked.
                spend(&mut self.search_work, len.saturating_add(size), start)?;
                let mut body = vec![0u8; len as usize];
                if self
                    .file
                    .get_ref()
                    .read_exact_at(&mut body, start + 9)
                    .is_err()
                {
                    continue;
                }
                match open_chunk(&body, true, &mut self.zstd) {
                    Ok((records, _)) => {
                        return Ok(Some(FoundChunk {
                            start,
                            records,
                            end: start + 9 + len,
                        }))
                    }
                    Err(ChunkFault::Data(why) | ChunkFault::Framing(why)) => {
                        self.st.skipped.damaged_chunks += 1;
                        passed.get_or_insert(why);
                    }
                }
            }
            at += searched as u64;
        }
        Ok(None)
    }

    /// Gives the records of the chunk a search found, and starts a new
    /// linear reader at `end`, the record after it.
    fn resume_after(&mut self, records: Bytes, end: u64) {
        self.chunks_seen = true;
        self.chunk = Some((records, 0));
        self.chunks_met += 1;
        self.read_end = end;
        self.mark = self.mark.max(self.fed).max(end);
        self.fed = end;
        self.resumed = true;
        self.reader = linear_reader(true);
        if self.file.seek(std::io::SeekFrom::Start(end)).is_err() {
            self.finished = true;
        }
    }

    /// The read goes on by the summary's chunk index, at the first indexed
    /// chunk after the last chunk read. Below the mark (bytes a linear
    /// reader already took) it is read as its index gives it: its records
    /// are given if it opens and either its record's head agrees with the
    /// index or its CRC is not 0 (a length damaged, the index's trusted
    /// only for a chunk whose CRC then matches). Past the mark, a chunk
    /// whose head agrees starts a new linear reader there, which reads on
    /// to the end. A chunk that does neither is passed, counted as damaged.
    /// Each byte is read at most once by index and once by a linear
    /// reader. Whether the read goes on.
    fn next_by_index(&mut self) -> Result<bool, RecordError> {
        let io = |source| RecordError::Io {
            path: self.path.clone(),
            source,
        };
        let Some(summary) = &self.summary else {
            self.finished = true;
            return Ok(false);
        };
        let next = summary
            .chunks
            .partition_point(|&(start, _)| start < self.read_end);
        let Some(&(start, len)) = summary.chunks.get(next) else {
            // No chunk left: what follows them is not read.
            self.by_index = false;
            self.finished = true;
            return Ok(false);
        };
        let file_len = self.file.get_ref().metadata().map_err(io)?.len();
        let end = start
            .checked_add(len)
            .filter(|&end| end <= file_len && len >= 9 && len - 9 <= RECORD_LIMIT as u64);
        let mut head = [0u8; 9];
        let f = self.file.get_mut();
        f.seek(std::io::SeekFrom::Start(start)).map_err(io)?;
        let agrees = f.read_exact(&mut head).is_ok()
            && head[0] == mcap::records::op::CHUNK
            && u64::from_le_bytes(head[1..].try_into().unwrap_or_default()).checked_add(9)
                == Some(len);
        if agrees && start >= self.mark {
            // Framed from here by a new linear reader.
            self.file
                .seek(std::io::SeekFrom::Start(start))
                .map_err(io)?;
            self.reader = linear_reader(true);
            self.fed = start;
            self.by_index = false;
            return Ok(true);
        }
        if let Some(end) = end {
            let mut body = vec![0u8; (len - 9) as usize];
            self.file.get_mut().read_exact(&mut body).map_err(io)?;
            self.read_end = end;
            let checked = agrees || body.get(24..28).is_some_and(|c| c != [0; 4]);
            if let (true, Ok((records, _))) = (
                checked,
                open_chunk(&body, self.st.only_chunked, &mut self.zstd),
            ) {
                self.chunk = Some((records, 0));
                self.chunks_met += 1;
                return Ok(true);
            }
        } else {
            self.read_end = start + 1;
        }
        self.chunks_met += 1;
        self.chunk_damaged(format!(
            "the chunk the summary indexes at byte {start} does not open"
        ));
        Ok(true)
    }

    /// The file read, opened again; `None` if another file is at its path
    /// now.
    fn reopen(&self) -> std::io::Result<Option<File>> {
        use std::os::unix::fs::MetadataExt;
        let f = crate::util::sys::open_regular(&self.path)?;
        let (now, was) = (f.metadata()?, self.file.get_ref().metadata()?);
        Ok((now.dev() == was.dev() && now.ino() == was.ino()).then_some(f))
    }
}

impl ReadState {
    /// The read lost its way and goes on at a chunk the summary indexes:
    /// each channel whose record came in since it last did is the
    /// summary's (its numbers kept where the summary's is the same
    /// channel; gone if the summary has none of that id), as is each
    /// channel of the summary not read yet.
    fn channels_from(&mut self, summary: &HashMap<u16, Channel>) {
        for id in std::mem::take(&mut self.new_channels) {
            match (self.channels.get_mut(&id), summary.get(&id)) {
                (Some(read), Some(known)) if !read.same(known) => *read = known.clone(),
                (Some(_), None) => {
                    self.channels.remove(&id);
                }
                _ => {}
            }
        }
        self.merge(summary);
    }

    /// Each channel of the summary not read yet (once: they are all in
    /// after that).
    fn merge(&mut self, summary: &HashMap<u16, Channel>) {
        if !self.merged {
            self.merged = true;
            for (id, ch) in summary {
                self.channels.entry(*id).or_insert_with(|| ch.clone());
            }
        }
    }

    /// Takes one record in: the entry it is, if any; an error if the
    /// file's first record is not a header. A message's data is `view`
    /// when given (a view of the chunk that holds it), else a copy.
    fn take(
        &mut self,
        record: Record<'_>,
        view: Option<Bytes>,
    ) -> Result<Option<Entry>, &'static str> {
        if !self.seen_header && !matches!(record, Record::Header(_)) {
            return Err("its first record is not a header");
        }
        match record {
            // A file has one header, first (another is bytes taken for a
            // record, or a second file: counted).
            Record::Header(_) if self.seen_header => self.skipped.other_records += 1,
            Record::Header(h) => {
                self.seen_header = true;
                self.only_chunked = h.library.starts_with("milonga ");
                // Milonga's recordings have no profile.
                if !h.profile.is_empty() {
                    self.skipped.other_records += 1;
                }
            }
            Record::Metadata(m) if m.name == METADATA_NAME => {
                // Milonga's own record: its writer wrote the file (if a
                // damaged header did not say so).
                self.only_chunked = true;
                let bytes: usize = m.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
                // One record of it in Milonga's recordings: a second
                // one's values are kept where they are new only.
                let again = m
                    .metadata
                    .iter()
                    .any(|(k, v)| self.metadata.get(k).is_some_and(|old| old != v));
                if again || self.metadata_bytes + bytes > METADATA_LIMIT {
                    self.skipped.other_records += 1;
                }
                if self.metadata_bytes + bytes <= METADATA_LIMIT {
                    self.metadata_bytes += bytes;
                    for (k, v) in m.metadata {
                        self.metadata.entry(k).or_insert(v);
                    }
                }
            }
            Record::Metadata(_) | Record::Attachment { .. } | Record::Unknown { .. } => {
                self.skipped.other_records += 1;
            }
            // The summary repeats the schemas: counted once.
            Record::Schema { .. } if !self.in_summary => {
                self.skipped.other_records += 1;
            }
            Record::Footer(_) => self.complete = true,
            Record::DataEnd(_) => self.in_summary = true,
            Record::Channel(c) => {
                // What Milonga's channels do not hold (a schema, other
                // metadata) is not kept by a copy: counted.
                let known = [META_PUBLISHER, META_ENCODING, META_REPLAYED, META_SEQ_HIGH];
                let extra =
                    c.schema_id != 0 || c.metadata.keys().any(|k| !known.contains(&k.as_str()));
                if extra && !self.in_summary {
                    self.skipped.other_records += 1;
                }
                // A channel id names one channel in a file: a record of it
                // again (the summary's, one a writer repeats in each chunk,
                // one the summary supplied after a damaged chunk) keeps what
                // was read of it (its numbers, for 64-bit extension and
                // gaps).
                self.channels.entry(c.id).or_insert_with(|| {
                    self.new_channels.push(c.id);
                    Channel::of(&c.topic, &c.message_encoding, &c.metadata)
                });
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
                            return Ok(None);
                        }
                    },
                    Some(Channel::Samples {
                        key,
                        publisher,
                        encoding,
                        replayed,
                        last_seq,
                        base,
                        damage_seen,
                    }) => {
                        let data = view.unwrap_or_else(|| Bytes::copy_from_slice(&data));
                        let value = match decode_cbor(&data) {
                            Ok(v) => v,
                            Err(_) => {
                                self.skipped.undecodable += 1;
                                return Ok(None);
                            }
                        };
                        let from = if *last_seq == 0 { *base } else { *last_seq };
                        let seq = extend_seq(from, header.sequence);
                        // The samples a damaged chunk held are lost: said
                        // as a loss where the gap shows, as a live
                        // subscription says it (a key's first sample
                        // starts its count, as there).
                        let damaged = self.skipped.damaged_chunks + self.passes;
                        let gap = (*damage_seen < damaged
                            && *last_seq > 0
                            && seq > last_seq.saturating_add(1))
                        .then(|| LostSamples {
                            publisher: *publisher,
                            key: key.clone(),
                            count: seq - *last_seq - 1,
                            first_seq: *last_seq + 1,
                        });
                        *damage_seen = damaged;
                        *last_seq = seq;
                        let sample = Entry::Sample(
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
                        );
                        match gap {
                            Some(lost) => {
                                self.pending = Some(sample);
                                Entry::Event(Event::Lost(lost), header.log_time)
                            }
                            None => sample,
                        }
                    }
                    Some(Channel::Foreign) | None => {
                        self.skipped.foreign += 1;
                        return Ok(None);
                    }
                };
                return Ok(Some(entry));
            }
            _ => {}
        }
        Ok(None)
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
    // Past 2^64 (a hostile file of billions of messages) it stays put.
    if candidate < last && last - candidate > 1 << 31 {
        candidate.checked_add(1 << 32).unwrap_or(candidate)
    } else {
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use milonga_wire::cbor::encode_cbor;

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
            timestamp_ns: seq.wrapping_add(1_000),
            encoding: Encoding::Cbor,
            schema_id: 0,
            replayed: false,
            compact: None,
        }
    }

    /// One sample of `a/b` reported lost from `first_seq`.
    fn lost(first_seq: u64) -> Event {
        Event::Lost(LostSamples {
            publisher: NodeId([7; 16]),
            key: "a/b".into(),
            count: 1,
            first_seq,
        })
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
                w.event(&lost(i), 6_000 + i).unwrap();
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

    /// The writer lays out messages and their indexes itself: the `mcap`
    /// crate's own readers, linear (chunk CRCs checked) and indexed
    /// (summary, chunk indexes, message indexes, a seek to each message),
    /// must find every message where the writer says it put it.
    #[test]
    fn the_mcap_crate_reads_every_recording_linearly_and_by_its_indexes() {
        let dir = milonga_testkit::TempDir::new("rec-idx");
        for c in [Compression::Zstd, Compression::Lz4, Compression::None] {
            let path = dir.path().join(format!("{c:?}.mcap"));
            let opts = RecordOptions {
                compression: c,
                chunk_bytes: 4096,
                ..RecordOptions::default()
            };
            let mut w = RecordWriter::create(&path, &opts).unwrap();
            let mut other = sample("a/b", 0, milonga_wire::Value::Null);
            other.publisher = NodeId([9; 16]);
            for i in 1..=1000u64 {
                // Byte strings of every head length (0-23, 24-255, 256-).
                let v = milonga_wire::Value::Bytes(Bytes::from(vec![i as u8; (i % 300) as usize]));
                let mut s = if i % 3 == 0 {
                    other.clone()
                } else {
                    sample(["a/b", "a/c"][(i % 2) as usize], 0, v.clone())
                };
                (s.seq, s.value) = (i, v);
                w.sample(&s, 5_000 + i).unwrap();
                if i % 100 == 0 {
                    w.event(&lost(i), 5_000 + i).unwrap();
                }
            }
            let size = w.finish().unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(size, bytes.len() as u64);

            let options = mcap::read::Options::ValidateChunkCrcs.into();
            let linear: Vec<_> = mcap::MessageStream::new_with_options(&bytes, options)
                .unwrap()
                .map(Result::unwrap)
                .collect();
            assert_eq!(linear.len(), 1010, "{c:?}");
            let seqs: Vec<u32> = linear
                .iter()
                .filter(|m| m.channel.topic != EVENTS_TOPIC)
                .map(|m| m.sequence)
                .collect();
            assert_eq!(seqs, (1..=1000).collect::<Vec<u32>>());
            // The writer's own byte-string path writes what the CBOR
            // encoder writes.
            for m in linear.iter().filter(|m| m.channel.topic != EVENTS_TOPIC) {
                let i = m.sequence as u64;
                let v = milonga_wire::Value::Bytes(Bytes::from(vec![i as u8; (i % 300) as usize]));
                let mut want = Vec::new();
                encode_cbor(&v, &mut want).unwrap();
                assert_eq!(&m.data[..], &want[..], "sample {i}");
            }
            assert_eq!(linear[1].log_time, 5_002);
            assert_eq!(linear[1].publish_time, 1_000);
            assert_eq!(&linear[1].data[1..], &[2u8; 2][..]);

            let summary = mcap::Summary::read(&bytes).unwrap().expect("a summary");
            let stats = summary.stats.as_ref().expect("statistics");
            assert_eq!(stats.message_count, 1010);
            assert_eq!(stats.channel_count, 4);
            assert_eq!(summary.channels.len(), 4);
            assert_eq!(stats.channel_message_counts.values().sum::<u64>(), 1010);
            assert_eq!(
                (stats.message_start_time, stats.message_end_time),
                (5_001, 6_000)
            );
            assert_eq!(stats.metadata_count, 1);
            assert!(summary.chunk_indexes.len() > 10, "{c:?}");
            assert_eq!(stats.chunk_count as usize, summary.chunk_indexes.len());
            let mut found = 0;
            for ci in &summary.chunk_indexes {
                let in_chunk: Vec<_> = summary.stream_chunk(&bytes, ci).unwrap().collect();
                let indexes = summary.read_message_indexes(&bytes, ci).unwrap();
                let n: usize = indexes.values().map(Vec::len).sum();
                assert_eq!(n, in_chunk.len());
                for (channel, entries) in &indexes {
                    for e in entries {
                        let m = summary.seek_message(&bytes, ci, e).unwrap();
                        assert_eq!(m.channel.id, channel.id);
                        assert_eq!(m.log_time, e.log_time);
                        assert!(ci.message_start_time <= e.log_time);
                        assert!(e.log_time <= ci.message_end_time);
                        found += 1;
                    }
                }
            }
            assert_eq!(found, 1010, "{c:?}");
            // The data section's CRC (in Data End, just before the
            // summary) and the summary's (in the footer).
            let footer = mcap::read::footer(&bytes).unwrap();
            let data_end = footer.summary_start as usize - 13;
            assert_eq!(bytes[data_end], mcap::records::op::DATA_END);
            let crc = u32::from_le_bytes(bytes[data_end + 9..data_end + 13].try_into().unwrap());
            assert_eq!(crc, crc32fast::hash(&bytes[..data_end]), "{c:?}");
            let footer_crc_at = bytes.len() - 8 - 4;
            assert_eq!(
                footer.summary_crc,
                crc32fast::hash(&bytes[footer.summary_start as usize..footer_crc_at])
            );
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
        // A key that is not one (a terminal's escape sequence, say) is not
        // taken for one.
        for event in ["lost", "deadline_missed"] {
            let bad = serde_json::json!({
                "event": event, "publisher": "05".repeat(16), "key": "sr/\u{1b}[2J",
                "count": 1, "first_seq": 1, "silent_ms": 1.0,
            });
            assert!(status_from_json(&bad).is_none(), "{bad}");
        }
    }

    /// Hostile files: a recording with bytes flipped, cut or overwritten
    /// at random, a thousand times, reads without a panic (every entry or
    /// an error, then the end); in a third of them the damage includes a
    /// byte of a record's length (of the file's own records, where no CRC
    /// covers it), to exercise the reads that go on by the summary's
    /// chunk indexes.
    #[test]
    fn a_damaged_file_never_panics_the_reader() {
        let dir = milonga_testkit::TempDir::new("rec-fuzz");
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let p = dir.path().join("bad.mcap");
        for c in [Compression::Zstd, Compression::None] {
            let good = dir.path().join(format!("good-{c:?}.mcap"));
            write(&good, c, 300);
            let bytes = std::fs::read(&good).unwrap();
            // Where the file's own records' lengths are.
            let mut lengths = Vec::new();
            let mut at = 8;
            while at + 9 <= bytes.len() && bytes[at] != 0x02 {
                lengths.push(at + 1);
                at += 9 + u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) as usize;
            }
            assert!(lengths.len() > 10, "{}", lengths.len());
            for _ in 0..1000 {
                let mut b = bytes.clone();
                if next() % 3 == 0 {
                    let at = lengths[next() as usize % lengths.len()] + (next() % 3) as usize;
                    b[at] ^= 1 << (next() % 8);
                }
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
                let (mut n, mut last) = (0, 0);
                while let Ok(Some(e)) = r.next_entry() {
                    n += 1;
                    assert!(n <= 1000, "more entries than were written");
                    // Every chunk's CRC is checked before its messages are
                    // given, and a read goes on only after a chunk whose
                    // framing holds or at one the summary (its CRC
                    // checked) indexes: a damaged file never yields a
                    // changed sample (value, key or publisher).
                    if let Entry::Sample(s, _) = e {
                        let v = milonga_wire::Value::from(format!("value {}", s.seq));
                        let key = if s.seq % 2 == 0 { "a/b" } else { "a/c" };
                        assert_eq!(
                            (s.value, s.key.as_str(), s.publisher),
                            (v, key, NodeId([7; 16])),
                            "a damaged file gave a changed sample"
                        );
                        // Written in order: never a sample twice, never
                        // one out of order (a read that went on after
                        // damage starts after what it gave).
                        assert!(s.seq > last, "{} after {last}", s.seq);
                        last = s.seq;
                    }
                }
            }
        }
    }

    /// A finished recording of 300 samples ([`write`]) at `path`.
    struct Written {
        bytes: Vec<u8>,
        summary: Summary,
        /// Where its third chunk's record starts, and its length.
        third: usize,
        len: usize,
        /// Where its data section ends: cut there, it has no summary.
        data_end: usize,
    }

    fn written(path: &Path, c: Compression) -> Written {
        write(path, c, 300);
        let bytes = std::fs::read(path).unwrap();
        let summary = read_summary(&mut File::open(path).unwrap()).unwrap();
        let (third, len) = summary.chunks[2];
        let (third, len) = (third as usize, len as usize);
        let data_end = third + len + first_record(&bytes[third + len - 8..], 0x0F) - 8;
        Written {
            bytes,
            summary,
            third,
            len,
            data_end,
        }
    }

    /// The first record after the magic: its offset.
    fn first_record(b: &[u8], opcode: u8) -> usize {
        let mut at = 8;
        loop {
            let len = u64::from_le_bytes(b[at + 1..at + 9].try_into().unwrap()) as usize;
            if b[at] == opcode {
                return at;
            }
            at += 9 + len;
        }
    }

    /// One byte changed in a chunk (a value, where compression is off):
    /// that chunk is skipped whole and said, rather than giving the
    /// changed value, and the chunks after it are read; a copy
    /// (`--recover`) holds everything else and reads whole.
    #[test]
    fn a_damaged_chunk_is_skipped_and_said_and_the_read_goes_on() {
        let dir = milonga_testkit::TempDir::new("rec-crc");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::None, 300);
        let mut b = std::fs::read(&good).unwrap();
        let needle = b"value 150";
        let at = b.windows(needle.len()).position(|w| w == needle).unwrap();
        b[at + 6] = b'9';
        let p = dir.path().join("flipped.mcap");
        std::fs::write(&p, &b).unwrap();
        let seqs_of = |r: &mut RecordReader| -> Vec<u64> {
            r.by_ref()
                .filter_map(|e| match e.unwrap() {
                    Entry::Sample(s, _) => Some(s.seq),
                    Entry::Event(..) => None,
                })
                .collect()
        };
        let mut r = RecordReader::open(&p).unwrap();
        let seqs = seqs_of(&mut r);
        assert!(!r.complete());
        assert_eq!(r.skipped().damaged_chunks, 1, "{}", r.skipped());
        assert!(r.damage().unwrap().contains("CRC"), "{:?}", r.damage());
        // The data section's CRC fails too, for the same chunk: not said
        // as the file being cut short.
        assert_eq!(r.truncated(), None);
        // One run of numbers around 150 is missing, and only that: the
        // chunks before and after it were read.
        let missing: Vec<u64> = (1..=300).filter(|i| !seqs.contains(i)).collect();
        assert!(missing.contains(&150), "{missing:?}");
        assert!(seqs.contains(&1) && seqs.contains(&300), "{seqs:?}");
        assert_eq!(
            missing,
            (missing[0]..=missing[missing.len() - 1]).collect::<Vec<_>>()
        );
        assert_eq!(
            seqs,
            (1..=300)
                .filter(|i| !missing.contains(i))
                .collect::<Vec<_>>()
        );
        // The copy holds all of it, and no damage.
        let mut r = RecordReader::open(&p).unwrap();
        let copy = dir.path().join("copy.mcap");
        let (w, n) = copy_recording(&mut r, &copy, &RecordOptions::default()).unwrap();
        w.finish().unwrap();
        assert!(n >= seqs.len() as u64);
        let mut c = RecordReader::open(&copy).unwrap();
        assert_eq!(seqs_of(&mut c), seqs);
        assert!(c.complete() && c.skipped().is_empty(), "{}", c.skipped());
        // The first chunk damaged, which held both channels' records: the
        // summary repeats them, and the later chunks are read.
        let mut b = std::fs::read(&good).unwrap();
        let needle = b"value 2";
        let at = b.windows(needle.len()).position(|w| w == needle).unwrap();
        b[at + 6] = b'8';
        std::fs::write(&p, &b).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let seqs = seqs_of(&mut r);
        assert_eq!(r.skipped().damaged_chunks, 1, "{}", r.skipped());
        assert_eq!(r.skipped().foreign, 0, "{}", r.skipped());
        assert!(!seqs.contains(&2) && seqs.contains(&299) && seqs.contains(&300));
        let first = seqs[0];
        assert_eq!(seqs, (first..=300).collect::<Vec<_>>());
    }

    /// The samples read from a recording, in order; the losses said.
    fn seqs_and_losses(r: &mut RecordReader) -> (Vec<u64>, Vec<(u64, u64)>) {
        let (mut seqs, mut lost) = (Vec::new(), Vec::new());
        for e in r.by_ref() {
            match e.unwrap() {
                Entry::Sample(s, _) => {
                    let v = milonga_wire::Value::from(format!("value {}", s.seq));
                    assert_eq!(s.value, v, "a changed value came out");
                    seqs.push(s.seq);
                }
                Entry::Event(Event::Lost(l), _) if l.publisher == NodeId([7; 16]) => {
                    lost.push((l.first_seq, l.count));
                }
                Entry::Event(..) => {}
            }
        }
        (seqs, lost)
    }

    /// A record length damaged outside the chunks (here the header's, made
    /// to reach into the first chunk) would have the chunk's records read
    /// as the file's own, where no CRC covers them: a value changed in
    /// them came out as it was. A channel record or a message outside a
    /// chunk, which Milonga's writer never writes, is damage to the
    /// framing: the read goes on at the next chunk the summary indexes
    /// (here the first, whose changed value its CRC then refuses).
    #[test]
    fn a_damaged_record_length_never_exposes_a_chunk_s_records() {
        let dir = milonga_testkit::TempDir::new("rec-frame");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::None, 300);
        let mut b = std::fs::read(&good).unwrap();
        // The first chunk's records start after its 40-byte header (no
        // compression name); the header record (at 8) is made to end
        // there.
        let chunk = first_record(&b, 0x06);
        let len = (chunk + 9 + 40 - 8 - 9) as u64;
        b[9..17].copy_from_slice(&len.to_le_bytes());
        let needle = b"value 3";
        let at = b.windows(needle.len()).position(|w| w == needle).unwrap();
        b[at + 6] = b'9';
        let p = dir.path().join("framing.mcap");
        std::fs::write(&p, &b).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, _) = seqs_and_losses(&mut r);
        assert!(
            r.damage().unwrap().contains("outside a chunk"),
            "{:?}",
            r.damage()
        );
        assert!(!r.complete() && r.truncated().is_none());
        // The first chunk is refused, the rest read.
        assert_eq!(r.skipped().damaged_chunks, 1, "{}", r.skipped());
        assert!(!seqs.contains(&3) && seqs.contains(&300), "{seqs:?}");
        assert_eq!(seqs, (seqs[0]..=300).collect::<Vec<_>>());
    }

    /// A chunk's record length made longer or shorter (no CRC covers it),
    /// then also a byte of its data changed: with a summary, the read
    /// goes on by its chunk index; without one (cut off where a killed
    /// recorder leaves it), at the next sound chunk found. Either way the
    /// chunk whose length alone is damaged is read whole (its header and
    /// CRC say where it ends), and the one whose data changed is skipped,
    /// counted, its samples said lost; every other sample is read, once,
    /// in order.
    #[test]
    fn damage_to_a_chunk_s_framing_is_passed_by_the_summary_s_index() {
        let dir = milonga_testkit::TempDir::new("rec-index");
        for c in [Compression::Zstd, Compression::None] {
            let w = written(&dir.path().join(format!("good-{c:?}.mcap")), c);
            assert!(w.summary.chunks.len() >= 4, "{}", w.summary.chunks.len());
            let (b, third, len, data_end) = (w.bytes, w.third, w.len, w.data_end);
            // Its length made longer (the read runs past the file's end)
            // or shorter (the chunk's data does not fit); then shorter and
            // a byte of its data changed.
            for (what, longer, data_too, whole) in [
                ("longer", true, false, true),
                ("shorter", false, false, true),
                ("shorter, data changed", false, true, true),
                ("longer, no summary", true, false, false),
                ("shorter, no summary", false, false, false),
                ("shorter, data changed, no summary", false, true, false),
            ] {
                let mut d = b.clone();
                let old = (len - 9) as u64;
                let changed = if longer { old + (1 << 20) } else { old - 7 };
                d[third + 1..third + 9].copy_from_slice(&changed.to_le_bytes());
                if data_too {
                    d[third + len - 20] ^= 0x11;
                }
                if !whole {
                    d.truncate(data_end);
                }
                let p = dir.path().join("chunk-length.mcap");
                std::fs::write(&p, &d).unwrap();
                let mut r = RecordReader::open(&p).unwrap();
                let (seqs, lost) = seqs_and_losses(&mut r);
                let case = format!(
                    "{c:?}, {what}: {:?}, {:?}, {}",
                    r.damage(),
                    r.truncated(),
                    r.skipped()
                );
                let how = if whole {
                    "summary's chunk index"
                } else {
                    "next sound chunk found"
                };
                assert!(r.damage().unwrap().contains(how), "{case}");
                assert!(!r.complete(), "{case}");
                assert_eq!(r.truncated().is_none(), whole, "{case}");
                assert_eq!(r.skipped().damaged_chunks, u64::from(data_too), "{case}");
                // At most one run of numbers is missing (the third
                // chunk's), said lost by each key's first sample after it
                // (the recorded losses are of one sample each; here the
                // two keys share one run of numbers, as they do not live).
                let missing: Vec<u64> = (1..=300).filter(|i| !seqs.contains(i)).collect();
                assert_eq!(missing.is_empty(), !data_too, "{case}");
                assert!(seqs.contains(&1) && seqs.contains(&300), "{case}");
                assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{case}: {seqs:?}");
                let (lo, hi) = match (missing.first(), missing.last()) {
                    (Some(&lo), Some(&hi)) => (lo, hi),
                    _ => (301, 300),
                };
                assert_eq!(missing, (lo..=hi).collect::<Vec<_>>(), "{case}");
                let said: Vec<_> = lost.iter().filter(|l| l.1 > 1).collect();
                assert_eq!(said.len(), if data_too { 2 } else { 0 }, "{case}: {lost:?}");
                for n in lo..=hi {
                    assert!(
                        said.iter().any(|l| (l.0..l.0 + l.1).contains(&n)),
                        "{case}: {lost:?}"
                    );
                }
            }
        }
    }

    /// A file without a summary, whose framing is damaged before a run of
    /// crafted chunk headers that agree with themselves but not with
    /// their CRC: each is counted as a damaged chunk and the search goes
    /// on to the real chunks after them; thousands of them, each claiming
    /// a MiB, make the search give up (said) rather than open gigabytes.
    /// A file cut short inside its last chunk (a recorder killed, or still
    /// writing) is said cut short, not damaged.
    #[test]
    fn a_file_without_a_summary_goes_on_at_the_next_sound_chunk_within_a_bound() {
        let dir = milonga_testkit::TempDir::new("rec-search");
        let w = written(&dir.path().join("good.mcap"), Compression::Zstd);
        let (b, third, len, data_end) = (w.bytes, w.third, w.len, w.data_end);
        // Headers of uncompressed chunks of `claim` bytes, CRC 1.
        let crafted = |n: usize, claim: u64| {
            let mut v = vec![0u8; 9]; // an opcode 0 record, out of place
            for _ in 0..n {
                v.push(mcap::records::op::CHUNK);
                v.extend_from_slice(&(40 + claim).to_le_bytes());
                v.extend_from_slice(&[0; 16]); // times
                v.extend_from_slice(&claim.to_le_bytes());
                v.extend_from_slice(&1u32.to_le_bytes());
                v.extend_from_slice(&0u32.to_le_bytes());
                v.extend_from_slice(&claim.to_le_bytes());
            }
            v
        };
        let p = dir.path().join("crafted.mcap");
        // A few: each counted, and the chunks after them read.
        let mut d = b[..third].to_vec();
        d.extend(crafted(10, 1000));
        d.extend_from_slice(&b[third..data_end]);
        std::fs::write(&p, &d).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, _) = seqs_and_losses(&mut r);
        let case = format!("{:?} {:?} {}", r.damage(), r.truncated(), r.skipped());
        assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "{case}");
        assert_eq!(r.skipped().damaged_chunks, 10, "{case}");
        assert!(r.damage().unwrap().contains("CRC failed"), "{case}");
        // Thousands claiming a MiB each: the search gives up within its
        // budget, said; what came before is read.
        let mut d = b[..third].to_vec();
        d.extend(crafted(5_000, 1 << 20));
        d.resize(d.len() + (1 << 20), 0);
        d.extend_from_slice(&b[third..data_end]);
        std::fs::write(&p, &d).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, _) = seqs_and_losses(&mut r);
        let case = format!("{:?} {:?} {}", r.damage(), r.truncated(), r.skipped());
        assert!(r.truncated().unwrap().contains("gave up"), "{case}");
        let opened = r.skipped().damaged_chunks;
        // 64 MiB and four times the file, each candidate read (a MiB) and
        // checked (a MiB), less the blocks searched.
        let want = (SEARCH_BUDGET + 4 * d.len() as u64) / (2 * (1 << 20) + 40);
        assert!((want - 2..=want).contains(&opened), "{want}: {case}");
        assert!(!seqs.is_empty() && seqs.len() < 300, "{case}");
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{case}");
        // The third chunk's opcode changed: the search passes it, and its
        // samples are said lost where the numbers show the gap.
        let mut d = b[..data_end].to_vec();
        d[third] = 0x16;
        std::fs::write(&p, &d).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, lost) = seqs_and_losses(&mut r);
        let case = format!("{:?} {:?} {}", r.damage(), r.truncated(), r.skipped());
        assert!(r.damage().unwrap().contains("sound chunk found"), "{case}");
        let missing: Vec<u64> = (1..=300).filter(|i| !seqs.contains(i)).collect();
        assert!(!missing.is_empty() && seqs.contains(&300), "{case}");
        for n in missing {
            assert!(
                lost.iter()
                    .any(|l| l.1 > 1 && (l.0..l.0 + l.1).contains(&n)),
                "{n} not said lost: {lost:?} {case}"
            );
        }
        // Cut inside the third chunk: said cut short, no damage.
        std::fs::write(&p, &b[..third + len / 2]).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, _) = seqs_and_losses(&mut r);
        assert!(
            r.truncated().is_some() && r.damage().is_none(),
            "{:?}",
            r.damage()
        );
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    }

    /// A chunk's opcode changed (a flipped bit: a record MCAP does not
    /// define, or one of the summary's) is a record out of place in a
    /// Milonga file: the summary's index finds the chunk and it is read as
    /// the index gives it, nothing lost. The last chunk's compressed size
    /// damaged (its record length intact): it cannot be opened either way,
    /// and is counted, its samples said lost.
    #[test]
    fn a_chunk_hidden_by_its_opcode_or_its_header_is_found_or_counted() {
        let dir = milonga_testkit::TempDir::new("rec-opcode");
        let w = written(&dir.path().join("good.mcap"), Compression::Zstd);
        let (b, summary, third) = (w.bytes, w.summary, w.third);
        let n = summary.chunks.len();
        let p = dir.path().join("damaged.mcap");
        for opcode in [0x16u8, 0x0E, 0x86, 0x00] {
            let mut d = b.clone();
            d[third] = opcode;
            std::fs::write(&p, &d).unwrap();
            let mut r = RecordReader::open(&p).unwrap();
            let (seqs, _) = seqs_and_losses(&mut r);
            let case = format!("{opcode:#x}: {:?}, {}", r.damage(), r.skipped());
            assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "{case}");
            assert!(r.damage().unwrap().contains("framing"), "{case}");
            assert_eq!(r.skipped().damaged_chunks, 0, "{case}");
            assert!(!r.complete(), "{case}");
        }
        // A chunk's data damaged (the read goes on without the data
        // section's CRC), then a later chunk's opcode made a data end's:
        // found by the index all the same, only the first chunk lost.
        let fourth = summary.chunks[3].0 as usize;
        let second = summary.chunks[1];
        let mut d = b.clone();
        d[(second.0 + second.1) as usize - 5] ^= 0x10;
        d[fourth] = 0x0F;
        std::fs::write(&p, &d).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, _) = seqs_and_losses(&mut r);
        let case = format!("{:?}, {}", r.damage(), r.skipped());
        assert_eq!(r.skipped().damaged_chunks, 1, "{case}");
        let missing: Vec<u64> = (1..=300).filter(|i| !seqs.contains(i)).collect();
        assert!(!missing.is_empty() && seqs.contains(&300), "{case}");
        assert_eq!(
            missing,
            (missing[0]..=missing[missing.len() - 1]).collect::<Vec<_>>()
        );
        // The same in a file another writer made (no rule for what is out
        // of place there): the chunk whose opcode changed is read as an
        // unknown record, and counted at the end as a chunk the summary
        // indexes that the read passed.
        let mut d = d.clone();
        let lib = d.windows(8).position(|w| w == b"milonga ").unwrap();
        d[lib] = b'x';
        // The metadata record's name (after its u32 length).
        let meta = first_record(&d, 0x0C) + 9 + 4;
        assert_eq!(&d[meta..meta + 7], b"milonga");
        d[meta] = b'x';
        d[fourth] = 0x80;
        std::fs::write(&p, &d).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, _) = seqs_and_losses(&mut r);
        let case = format!("{:?}, {}", r.damage(), r.skipped());
        assert_eq!(r.skipped().damaged_chunks, 2, "{case}");
        // (Here the fourth chunk is the last: the file ends short of it.)
        assert!(seqs.contains(&1) && seqs.len() < 300, "{case}");
        assert!(r.truncated().is_none() && !r.complete(), "{case}");
        // The last chunk's compressed size, after its compression's name.
        let (last, _) = summary.chunks[n - 1];
        let at = last as usize + 9 + 32 + 4;
        let mut d = b.clone();
        d[at] ^= 0x01;
        std::fs::write(&p, &d).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let (seqs, lost) = seqs_and_losses(&mut r);
        let case = format!("{:?}, {}", r.damage(), r.skipped());
        assert_eq!(r.skipped().damaged_chunks, 1, "{case}");
        assert!(!r.complete(), "{case}");
        let first_missing = (1..=300).find(|i| !seqs.contains(i)).unwrap();
        assert_eq!(seqs, (1..first_missing).collect::<Vec<_>>(), "{case}");
        // The last chunk's samples are not followed by any: no gap shows,
        // and none is said (as a live subscription cannot say it either
        // until its publisher publishes again).
        assert!(lost.iter().all(|l| l.1 == 1), "{lost:?}");
    }

    /// A footer followed by more (a second recording after the first, or
    /// a footer written into the middle) is not a complete recording.
    #[test]
    fn what_follows_a_footer_makes_a_file_not_complete() {
        let dir = milonga_testkit::TempDir::new("rec-tail");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::Zstd, 50);
        let mut b = std::fs::read(&good).unwrap();
        b.extend_from_within(..);
        let p = dir.path().join("twice.mcap");
        std::fs::write(&p, &b).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        assert_eq!(r.by_ref().count(), 55);
        assert!(!r.complete());
        assert!(r.truncated().is_some());
    }

    /// An empty file, or one whose first record is not a header, is not a
    /// recording: an error, not an empty recording read whole.
    #[test]
    fn a_file_without_a_header_is_an_error() {
        let dir = milonga_testkit::TempDir::new("rec-nohdr");
        let empty = dir.path().join("empty.mcap");
        std::fs::write(&empty, b"").unwrap();
        assert!(RecordReader::open(&empty).is_err());
        let good = dir.path().join("good.mcap");
        write(&good, Compression::Zstd, 10);
        let b = std::fs::read(&good).unwrap();
        // The magic, then the records after the header.
        let header = first_record(&b, 0x01);
        let len = u64::from_le_bytes(b[header + 1..header + 9].try_into().unwrap()) as usize;
        let mut no_header = b[..8].to_vec();
        no_header.extend_from_slice(&b[header + 9 + len..]);
        let p = dir.path().join("noheader.mcap");
        std::fs::write(&p, &no_header).unwrap();
        let err = RecordReader::open(&p).unwrap().next_entry().unwrap_err();
        assert!(err.to_string().contains("header"), "{err}");
    }

    /// Sequence numbers come back as written, whatever they are: past
    /// 2^32 from the first, jumping by 2^31 and more, going back (a
    /// restarted publisher, a forged frame): MCAP keeps their low 32 bits,
    /// and a number that would not read back from them starts a new
    /// channel for the key that says its high bits.
    #[test]
    fn sequence_numbers_read_back_as_written_whatever_their_jumps() {
        let dir = milonga_testkit::TempDir::new("rec-seqs");
        let p = dir.path().join("seqs.mcap");
        let seqs = [
            (1u64 << 33) + 5,
            (1 << 33) + 6,
            1,
            2,
            3,
            (1 << 31) + 13,
            4,
            5,
            u64::MAX - 1,
            u64::MAX,
            7,
        ];
        let mut w = RecordWriter::create(&p, &RecordOptions::default()).unwrap();
        for (i, &seq) in seqs.iter().enumerate() {
            let v = milonga_wire::Value::from(format!("value {seq}"));
            w.sample(&sample("a/b", seq, v), 5_000 + i as u64).unwrap();
        }
        w.finish().unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        let got: Vec<u64> = r
            .by_ref()
            .filter_map(|e| match e.unwrap() {
                Entry::Sample(s, _) => {
                    assert_eq!(
                        s.value,
                        milonga_wire::Value::from(format!("value {}", s.seq))
                    );
                    Some(s.seq)
                }
                Entry::Event(..) => None,
            })
            .collect();
        assert_eq!(got, seqs);
        assert!(r.complete() && r.skipped().is_empty(), "{}", r.skipped());
        // The mcap crate reads it too (one channel a run of numbers).
        let bytes = std::fs::read(&p).unwrap();
        let n = mcap::MessageStream::new(&bytes).unwrap().count();
        assert_eq!(n, seqs.len());
    }

    /// A finished file whose header record is damaged (its length, its
    /// opcode) is read by its summary's chunk index: every sample, the
    /// damage said, never complete.
    #[test]
    fn a_damaged_header_in_a_finished_file_is_passed_by_the_index() {
        let dir = milonga_testkit::TempDir::new("rec-badhdr");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::Zstd, 300);
        let b = std::fs::read(&good).unwrap();
        let p = dir.path().join("badhdr.mcap");
        for (what, at, change) in [("length", 9, 0x03u8), ("opcode", 8, 0x40)] {
            let mut d = b.clone();
            d[at] ^= change;
            std::fs::write(&p, &d).unwrap();
            let mut r = RecordReader::open(&p).unwrap();
            let (seqs, _) = seqs_and_losses(&mut r);
            let case = format!("{what}: {:?}, {}", r.damage(), r.skipped());
            assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "{case}");
            // Said as the header's damage, or (a header that still
            // parses, shorter) as what follows it not parsing.
            let damage = r.damage().unwrap();
            assert!(
                damage.contains("header") || damage.contains("framing"),
                "{case}"
            );
            assert!(!r.complete(), "{case}");
            // Without its summary, the same file is not a recording (its
            // header unreadable), or (a header that still parses) is read
            // on from its first sound chunk.
            let data_end = first_record(&b, 0x0F);
            std::fs::write(&p, &d[..data_end]).unwrap();
            let mut r = RecordReader::open(&p).unwrap();
            match r.next_entry() {
                Err(e) => assert!(e.to_string().contains("header"), "{what}: {e}"),
                Ok(first) => {
                    let mut seqs = Vec::new();
                    if let Some(Entry::Sample(s, _)) = first {
                        seqs.push(s.seq);
                    }
                    seqs.extend(seqs_and_losses(&mut r).0);
                    let case = format!("{what}: {:?}", r.damage());
                    assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "{case}");
                    assert!(r.damage().unwrap().contains("sound chunk found"), "{case}");
                }
            }
        }
    }

    /// A channel whose topic is not a Milonga key (`**`, 100 KiB long),
    /// an attachment and another metadata record: skipped and counted,
    /// never given as samples (and a topic is never kept past a key's
    /// length).
    #[test]
    fn what_is_not_milonga_s_is_skipped_and_counted() {
        let dir = milonga_testkit::TempDir::new("rec-foreign");
        let p = dir.path().join("foreign.mcap");
        let mut w = mcap::Writer::new(std::io::BufWriter::new(File::create(&p).unwrap())).unwrap();
        let meta = BTreeMap::from([(META_PUBLISHER.to_owned(), "07".repeat(16))]);
        let long = "k".repeat(100 << 10);
        for (i, topic) in ["**", long.as_str(), "good/key"].into_iter().enumerate() {
            let ch = w.add_channel(0, topic, "cbor", &meta).unwrap();
            let mut data = Vec::new();
            milonga_wire::cbor::encode_cbor(&milonga_wire::Value::from(1i64), &mut data).unwrap();
            w.write_to_known_channel(
                &mcap::records::MessageHeader {
                    channel_id: ch,
                    sequence: i as u32 + 1,
                    log_time: 1,
                    publish_time: 1,
                },
                &data,
            )
            .unwrap();
        }
        w.attach(&mcap::Attachment {
            log_time: 1,
            create_time: 1,
            name: "x".into(),
            media_type: "text/plain".into(),
            data: std::borrow::Cow::Borrowed(b"hello"),
        })
        .unwrap();
        w.write_metadata(&mcap::records::Metadata {
            name: "calibration".into(),
            metadata: BTreeMap::from([("a".to_owned(), "b".to_owned())]),
        })
        .unwrap();
        w.finish().unwrap();
        drop(w);
        let mut r = RecordReader::open(&p).unwrap();
        let keys: Vec<String> = r
            .by_ref()
            .filter_map(|e| match e.unwrap() {
                Entry::Sample(s, _) => Some(s.key),
                Entry::Event(..) => None,
            })
            .collect();
        assert_eq!(keys, ["good/key"]);
        let s = r.skipped();
        assert_eq!(
            (s.foreign, s.undecodable, s.other_records),
            (2, 0, 2),
            "{s}"
        );
    }

    /// A chunk that claims to hold a terabyte once decompressed is skipped
    /// as damaged, not allocated.
    #[test]
    fn a_chunk_claiming_a_huge_size_is_refused() {
        let dir = milonga_testkit::TempDir::new("rec-bomb");
        let good = dir.path().join("good.mcap");
        write(&good, Compression::Zstd, 300);
        let mut b = std::fs::read(&good).unwrap();
        // The first chunk's body: start time, end time, then the
        // uncompressed size.
        let chunk = first_record(&b, 0x06) + 9;
        b[chunk + 16..chunk + 24].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let p = dir.path().join("bomb.mcap");
        std::fs::write(&p, &b).unwrap();
        let mut r = RecordReader::open(&p).unwrap();
        while let Ok(Some(_)) = r.next_entry() {}
        assert_eq!(r.skipped().damaged_chunks, 1, "{}", r.skipped());
        assert!(r.damage().is_some());
        assert!(!r.complete());
    }

    #[test]
    fn a_file_that_is_not_mcap_is_a_clear_error() {
        let dir = milonga_testkit::TempDir::new("rec-bad");
        let p = dir.path().join("bad.mcap");
        std::fs::write(&p, b"not an mcap file at all").unwrap();
        // Refused at open (a program that opens first and reads later
        // learns it there), as is a directory.
        let err = RecordReader::open(&p).err().unwrap();
        assert!(err.to_string().contains("not a readable MCAP"), "{err}");
        assert!(err.to_string().contains("magic"), "{err}");
        let err = RecordReader::open(dir.path()).err().unwrap();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        let missing = RecordReader::open(&dir.path().join("none.mcap")).unwrap_err();
        assert!(missing.to_string().contains("none.mcap"), "{missing}");
    }
}
