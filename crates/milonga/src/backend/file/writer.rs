//! The recording writer: MCAP chunks built in memory and written whole.
//!
//! Every record but two is one of the `mcap` crate's record types,
//! serialized by the crate's own code (binrw): the header, metadata,
//! channels, chunk headers, chunk, metadata and summary-offset indexes,
//! statistics, the footer. The two that hold one entry per message, the
//! Message record (31 bytes of fixed fields before the CBOR value) and the
//! Message Index record (a list of time and offset pairs), are laid out
//! here, straight into the chunk: the crate's `Writer` spent about 190 ns
//! a message on them (binrw field by field, a CRC update and a compressor
//! call per small write, three ordered-map lookups), more than a
//! subscriber spends receiving a 92-byte sample (docs/recording.md
//! "Writing"). A chunk is compressed whole when it ends. Tests read every
//! file this writes with the crate's readers (linear and indexed) and the
//! `mcap` Python package.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use binrw::BinWrite;
use mcap::records::{self, op, MessageIndexEntry};
use milonga_wire::cbor::encode_cbor;
use milonga_wire::{NodeId, Value};

use super::{
    encoding_name, extend_seq, status_json, Compression, RecordError, RecordOptions, EVENTS_TOPIC,
    METADATA_NAME, META_ENCODING, META_PUBLISHER, META_REPLAYED, META_SEQ_HIGH,
};
use crate::model::sample::{Event, Sample};

/// MCAP's magic, at both ends of a file.
pub(super) const MAGIC: &[u8; 8] = b"\x89MCAP0\r\n";

/// How far ahead of what it wrote the writer has the file's blocks
/// allocated.
const PREALLOCATE: u64 = 16 << 20;

/// A Message record before its data: opcode, record length, channel id,
/// sequence, log time, publish time.
const MESSAGE_HEAD: usize = 1 + 8 + 2 + 4 + 8 + 8;

/// Writes a recording.
pub struct RecordWriter {
    path: PathBuf,
    file: File,
    /// Bytes written to the file: the offset of the next.
    pos: u64,
    /// The file's blocks are allocated up to here (past `pos`: given back
    /// when the file is finished).
    allocated: u64,
    /// A write failed: nothing more is written (a summary after a failure,
    /// a full disk that freed up, would present a file with a hole as
    /// complete).
    failed: bool,
    finished: bool,
    compression: Compression,
    chunk_bytes: usize,
    flush_every: Duration,
    chunk_started: Instant,
    /// The open chunk's records, uncompressed.
    chunk: Vec<u8>,
    /// Its first and last log times, once it holds a message.
    chunk_times: Option<(u64, u64)>,
    /// The open chunk's message index, per channel id.
    index: Vec<Vec<MessageIndexEntry>>,
    /// The channels with entries in `index`.
    indexed: Vec<u16>,
    /// Publisher -> key -> channel: looked up with the sample's own key,
    /// no copy of it per sample.
    channels: HashMap<NodeId, HashMap<String, u16>>,
    /// The channel of the last sample: a stream of one key skips the maps.
    last: Option<(NodeId, String, u16)>,
    /// Every channel record, by id (the summary repeats them).
    channel_records: Vec<records::Channel>,
    /// Messages per channel id.
    counts: Vec<u64>,
    /// Per channel id, the last sequence number written (its base, the
    /// high bits of its first, before any): where a reader extends the
    /// next one's low 32 bits from.
    seqs: Vec<u64>,
    events: u16,
    messages: u64,
    times: Option<(u64, u64)>,
    chunk_indexes: Vec<records::ChunkIndex>,
    metadata_indexes: Vec<records::MetadataIndex>,
    /// CRC-32 of everything written so far (the Data End record's).
    data_crc: crc32fast::Hasher,
    /// Scratch for records other than messages, and for compressed chunks.
    out: Vec<u8>,
    packed: Vec<u8>,
}

impl std::fmt::Debug for RecordWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordWriter")
            .field("path", &self.path)
            .field("messages", &self.messages)
            .finish()
    }
}

/// Appends a record (opcode, length, the body as the `mcap` crate
/// serializes it) to `buf`.
fn put_record<T>(buf: &mut Vec<u8>, opcode: u8, body: &T)
where
    T: for<'a> BinWrite<Args<'a> = ()>,
{
    let start = buf.len();
    buf.push(opcode);
    buf.extend_from_slice(&[0; 8]);
    let mut c = Cursor::new(&mut *buf);
    c.set_position(c.get_ref().len() as u64);
    body.write_le(&mut c)
        .expect("serializing a record into a Vec cannot fail");
    let len = (buf.len() - start - 9) as u64;
    buf[start + 1..start + 9].copy_from_slice(&len.to_le_bytes());
}

fn widen(times: &mut Option<(u64, u64)>, t: u64) {
    *times = Some(match *times {
        None => (t, t),
        Some((a, b)) => (a.min(t), b.max(t)),
    });
}

impl RecordWriter {
    /// Creates `path` (it must not exist: a recording is never
    /// overwritten).
    pub fn create(path: &Path, opts: &RecordOptions) -> Result<RecordWriter, RecordError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = File::options()
            .write(true)
            .create_new(true)
            .mode(opts.mode & 0o777)
            .open(path)
            .map_err(|source| RecordError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let mut w = RecordWriter {
            path: path.to_path_buf(),
            file,
            pos: 0,
            allocated: 0,
            failed: false,
            finished: false,
            compression: opts.compression,
            chunk_bytes: usize::try_from(opts.chunk_bytes).unwrap_or(usize::MAX),
            flush_every: opts.flush_every,
            chunk_started: Instant::now(),
            chunk: Vec::new(),
            chunk_times: None,
            index: Vec::new(),
            indexed: Vec::new(),
            channels: HashMap::new(),
            last: None,
            channel_records: Vec::new(),
            counts: Vec::new(),
            seqs: Vec::new(),
            events: 0,
            messages: 0,
            times: None,
            chunk_indexes: Vec::new(),
            metadata_indexes: Vec::new(),
            data_crc: crc32fast::Hasher::new(),
            out: Vec::new(),
            packed: Vec::new(),
        };
        let mut head = MAGIC.to_vec();
        put_record(
            &mut head,
            op::HEADER,
            &records::Header {
                profile: String::new(),
                library: format!("milonga {}", env!("CARGO_PKG_VERSION")),
            },
        );
        let at = head.len();
        put_record(
            &mut head,
            op::METADATA,
            &records::Metadata {
                name: METADATA_NAME.into(),
                metadata: opts.metadata.clone(),
            },
        );
        w.metadata_indexes.push(records::MetadataIndex {
            offset: at as u64,
            length: (head.len() - at) as u64,
            name: METADATA_NAME.into(),
        });
        w.write(&head)?;
        w.events = w.add_channel(EVENTS_TOPIC, "json", BTreeMap::new(), 0)?;
        Ok(w)
    }

    /// The file it writes (to lock it, or to hold a lock on it).
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The file was linked at `path` (and its first name removed): errors
    /// name `path` from now on.
    pub(crate) fn moved_to(&mut self, path: &Path) {
        self.path = path.to_path_buf();
    }

    fn io_err(&self, source: std::io::Error) -> RecordError {
        RecordError::Io {
            path: self.path.clone(),
            source,
        }
    }

    #[inline]
    fn check(&self) -> Result<(), RecordError> {
        if self.failed || self.finished {
            return Err(self.closed());
        }
        Ok(())
    }

    /// Why nothing more can be written (out of line: `check` runs for
    /// every message).
    #[cold]
    fn closed(&self) -> RecordError {
        self.io_err(std::io::Error::other(if self.failed {
            "an earlier write to this recording failed"
        } else {
            "the recording is finished"
        }))
    }

    /// Has the file's blocks allocated for `n` more bytes and
    /// `PREALLOCATE` beyond.
    fn reserve(&mut self, n: u64) {
        let end = self.pos + n;
        if end > self.allocated {
            let to = end + PREALLOCATE;
            crate::util::sys::preallocate(&self.file, self.allocated, to - self.allocated);
            self.allocated = to;
        }
    }

    /// Writes `bytes` at the end of the file, its CRC left to the caller.
    fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        self.check()?;
        self.reserve(bytes.len() as u64);
        if let Err(e) = self.file.write_all(bytes) {
            self.failed = true;
            return Err(self.io_err(e));
        }
        self.pos += bytes.len() as u64;
        Ok(())
    }

    /// Writes `bytes` at the end of the file.
    fn write(&mut self, bytes: &[u8]) -> Result<(), RecordError> {
        self.write_bytes(bytes)?;
        self.data_crc.update(bytes);
        Ok(())
    }

    /// A new channel, its record put in the open chunk (before any message
    /// of it, so that a file cut short after it still reads).
    fn add_channel(
        &mut self,
        topic: &str,
        encoding: &str,
        metadata: BTreeMap<String, String>,
        base: u64,
    ) -> Result<u16, RecordError> {
        let id = u16::try_from(self.channel_records.len()).map_err(|_| RecordError::Channels {
            key: topic.to_owned(),
        })?;
        let channel = records::Channel {
            id,
            schema_id: 0,
            topic: topic.to_owned(),
            message_encoding: encoding.to_owned(),
            metadata,
        };
        put_record(&mut self.chunk, op::CHANNEL, &channel);
        self.channel_records.push(channel);
        self.counts.push(0);
        self.seqs.push(base);
        self.index.push(Vec::new());
        Ok(id)
    }

    /// The channel a sample goes in: its publisher's and key's. A reader
    /// reads a channel's numbers back from their low 32 bits, each after
    /// the one before ([`extend_seq`]): a number that would not read back
    /// as itself (a channel's first past 2^32, one in another block of
    /// 2^32 than `extend_seq` picks) starts a new channel for the key,
    /// whose metadata holds that number's high 32 bits ([`META_SEQ_HIGH`]).
    fn channel_of(&mut self, s: &Sample) -> Result<u16, RecordError> {
        let reads_back = |c: u16| extend_seq(self.seqs[c as usize], s.seq as u32) == s.seq;
        // A stream of one key: the last sample's channel, nothing else.
        if let Some((p, k, c)) = &self.last {
            if *p == s.publisher && *k == s.key && reads_back(*c) {
                return Ok(*c);
            }
        }
        let known = self
            .channels
            .get(&s.publisher)
            .and_then(|keys| keys.get(s.key.as_str()))
            .copied();
        let c = match known {
            Some(c) if reads_back(c) => c,
            _ => {
                let mut meta = BTreeMap::new();
                meta.insert(META_PUBLISHER.to_owned(), s.publisher.to_hex());
                meta.insert(
                    META_ENCODING.to_owned(),
                    encoding_name(s.encoding).to_owned(),
                );
                if s.replayed {
                    meta.insert(META_REPLAYED.to_owned(), "true".to_owned());
                }
                let high = s.seq >> 32;
                if high != 0 {
                    meta.insert(META_SEQ_HIGH.to_owned(), high.to_string());
                }
                let c = self.add_channel(&s.key, "cbor", meta, high << 32)?;
                self.channels
                    .entry(s.publisher)
                    .or_default()
                    .insert(s.key.clone(), c);
                c
            }
        };
        match &mut self.last {
            Some((p, k, last)) => {
                *p = s.publisher;
                k.clear();
                k.push_str(&s.key);
                *last = c;
            }
            None => self.last = Some((s.publisher, s.key.clone(), c)),
        }
        Ok(c)
    }

    /// Appends a Message record to the open chunk, its data written by
    /// `data` (which appends to the buffer it is given); ends the chunk
    /// when it is full.
    fn message<E>(
        &mut self,
        channel: u16,
        sequence: u32,
        log_time: u64,
        publish_time: u64,
        data: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<Result<(), E>, RecordError> {
        self.check()?;
        let start = self.chunk.len();
        self.chunk.extend_from_slice(&[0; MESSAGE_HEAD]);
        if let Err(e) = data(&mut self.chunk) {
            self.chunk.truncate(start);
            return Ok(Err(e));
        }
        let len = (self.chunk.len() - start - 9) as u64;
        let h = &mut self.chunk[start..start + MESSAGE_HEAD];
        h[0] = op::MESSAGE;
        h[1..9].copy_from_slice(&len.to_le_bytes());
        h[9..11].copy_from_slice(&channel.to_le_bytes());
        h[11..15].copy_from_slice(&sequence.to_le_bytes());
        h[15..23].copy_from_slice(&log_time.to_le_bytes());
        h[23..31].copy_from_slice(&publish_time.to_le_bytes());
        let entries = &mut self.index[channel as usize];
        if entries.is_empty() {
            self.indexed.push(channel);
        }
        entries.push(MessageIndexEntry {
            log_time,
            offset: start as u64,
        });
        self.counts[channel as usize] += 1;
        widen(&mut self.chunk_times, log_time);
        self.messages += 1;
        if self.chunk.len() >= self.chunk_bytes {
            self.end_chunk()?;
        } else if self.messages % 64 == 0 {
            self.tick()?;
        }
        Ok(Ok(()))
    }

    /// Records a sample received at `received_ns` (UNIX time, ns).
    pub fn sample(&mut self, s: &Sample, received_ns: u64) -> Result<(), RecordError> {
        let channel = self.channel_of(s)?;
        // A typed subscription's compact sample holds its payload: the
        // recording keeps the value map it stands for.
        let read;
        let value = match (&s.compact, &s.value) {
            (Some(reader), Value::Bytes(payload)) => {
                read = reader.0.read(payload).map_err(|e| RecordError::Value {
                    key: s.key.clone(),
                    why: e.to_string(),
                })?;
                &read
            }
            _ => &s.value,
        };
        // MCAP's sequence is 32 bits: the reader extends it again.
        let written = self.message(channel, s.seq as u32, received_ns, s.timestamp_ns, |buf| {
            match value {
                // Raw samples, the common case of a flood: a byte string's
                // head and its bytes, without an encoder.
                Value::Bytes(b) => {
                    milonga_wire::compact::head(buf, 2, b.len() as u64);
                    buf.extend_from_slice(b);
                    Ok(())
                }
                v => encode_cbor(v, buf),
            }
        })?;
        written.map_err(|e| RecordError::Value {
            key: s.key.clone(),
            why: e.to_string(),
        })?;
        self.seqs[channel as usize] = s.seq;
        Ok(())
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
            Some(j) => {
                let json = j.to_string();
                let (channel, seq) = (self.events, self.messages as u32);
                self.message(channel, seq, received_ns, received_ns, |buf| {
                    buf.extend_from_slice(json.as_bytes());
                    Ok::<(), std::convert::Infallible>(())
                })?
                .map_err(|never| match never {})
            }
        }
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
        self.end_chunk()
    }

    /// Compresses the open chunk and writes it, then its message indexes.
    fn end_chunk(&mut self) -> Result<(), RecordError> {
        self.chunk_started = Instant::now();
        if self.chunk.is_empty() {
            return Ok(());
        }
        self.check()?;
        let chunk = std::mem::take(&mut self.chunk);
        let result = self.write_out(&chunk);
        // A chunk that could not be compressed or written is a hole:
        // nothing more is written, no summary presents the file as
        // complete.
        if result.is_err() {
            self.failed = true;
        }
        self.chunk = chunk;
        self.chunk.clear();
        // A huge sample grew the buffers: memory goes back to a chunk's
        // worth.
        let keep = self.chunk_bytes.saturating_mul(2).min(64 << 20);
        if self.chunk.capacity() > keep {
            self.chunk.shrink_to(keep);
        }
        if self.packed.capacity() > keep {
            self.packed = Vec::new();
        }
        result
    }

    /// Writes `chunk` (the open chunk's records) out, compressed, then its
    /// message indexes; notes its index for the summary.
    fn write_out(&mut self, chunk: &[u8]) -> Result<(), RecordError> {
        let mut records_crc = crc32fast::Hasher::new();
        records_crc.update(chunk);
        let uncompressed_crc = records_crc.clone().finalize();
        let mut packed = std::mem::take(&mut self.packed);
        packed.clear();
        let name = match self.compression {
            Compression::None => "",
            Compression::Lz4 => {
                // A frame without lz4's own checksums: the chunk has its
                // CRC (the crate's writer leaves out the block checksum
                // only; the content checksum cost more than compressing).
                let mut enc = lz4::EncoderBuilder::new()
                    .block_checksum(lz4::liblz4::BlockChecksum::NoBlockChecksum)
                    .checksum(lz4::liblz4::ContentChecksum::NoChecksum)
                    .build(&mut packed)
                    .map_err(|e| self.io_err(e))?;
                enc.write_all(chunk).map_err(|e| self.io_err(e))?;
                enc.finish().1.map_err(|e| self.io_err(e))?;
                "lz4"
            }
            Compression::Zstd => {
                packed = zstd::bulk::compress(chunk, 0).map_err(|e| self.io_err(e))?;
                "zstd"
            }
        };
        let (start, end) = self.chunk_times.unwrap_or((0, 0));
        let data: &[u8] = if name.is_empty() { chunk } else { &packed };
        let header = records::ChunkHeader {
            message_start_time: start,
            message_end_time: end,
            uncompressed_size: chunk.len() as u64,
            uncompressed_crc,
            compression: name.into(),
            compressed_size: data.len() as u64,
        };
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        put_record(&mut out, op::CHUNK, &header);
        // The record's length covers its data, which follows the header.
        let len = (out.len() - 9 + data.len()) as u64;
        out[1..9].copy_from_slice(&len.to_le_bytes());
        let chunk_start = self.pos;
        let chunk_length = (out.len() + data.len()) as u64;
        // The message indexes follow the chunk, in channel order.
        let head_len = out.len();
        self.indexed.sort_unstable();
        let mut offsets = BTreeMap::new();
        for &c in &self.indexed {
            let entries = &mut self.index[c as usize];
            offsets.insert(
                c,
                chunk_start + chunk_length + (out.len() - head_len) as u64,
            );
            let body = 16 * entries.len();
            out.push(op::MESSAGE_INDEX);
            out.extend_from_slice(&((2 + 4 + body) as u64).to_le_bytes());
            out.extend_from_slice(&c.to_le_bytes());
            out.extend_from_slice(&(body as u32).to_le_bytes());
            for e in entries.iter() {
                out.extend_from_slice(&e.log_time.to_le_bytes());
                out.extend_from_slice(&e.offset.to_le_bytes());
            }
            entries.clear();
        }
        let index_length = (out.len() - head_len) as u64;
        let result = self.write_chunk(&out[..head_len], data, &records_crc, &out[head_len..]);
        self.chunk_indexes.push(records::ChunkIndex {
            message_start_time: start,
            message_end_time: end,
            chunk_start_offset: chunk_start,
            chunk_length,
            message_index_offsets: offsets,
            message_index_length: index_length,
            compression: name.into(),
            compressed_size: data.len() as u64,
            uncompressed_size: chunk.len() as u64,
        });
        if let Some((a, b)) = self.chunk_times.take() {
            widen(&mut self.times, a);
            widen(&mut self.times, b);
        }
        self.indexed.clear();
        self.out = out;
        self.packed = packed;
        result
    }

    /// Writes a chunk record (its header, then its data) and the message
    /// indexes after it. An uncompressed chunk's CRC is the records' own,
    /// combined into the data section's rather than computed again.
    fn write_chunk(
        &mut self,
        header: &[u8],
        data: &[u8],
        records_crc: &crc32fast::Hasher,
        indexes: &[u8],
    ) -> Result<(), RecordError> {
        let start = self.pos;
        self.write(header)?;
        self.write_bytes(data)?;
        if self.compression == Compression::None {
            self.data_crc.combine(records_crc);
        } else {
            self.data_crc.update(data);
        }
        self.write(indexes)?;
        crate::util::sys::start_writeback(&self.file, start, self.pos - start);
        Ok(())
    }

    /// Messages written so far (samples and events).
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Chunks written to the file so far.
    pub fn chunks(&self) -> usize {
        self.chunk_indexes.len()
    }

    /// Bytes written to the file so far (what is still in the open chunk
    /// is not).
    pub fn bytes(&self) -> u64 {
        self.pos
    }

    /// Writes the summary (channels, statistics, chunk and metadata
    /// indexes) and the footer, syncs the file and closes it: its size.
    pub fn finish(mut self) -> Result<u64, RecordError> {
        self.finish_file()?;
        Ok(self.pos)
    }

    fn finish_file(&mut self) -> Result<(), RecordError> {
        self.end_chunk()?;
        // The data on the disk before a summary says the file is whole: a
        // sync that fails (EIO, or a quota or a full disk told only now,
        // as on NFS) leaves the file without one.
        if let Err(e) = self.file.sync_data() {
            self.failed = true;
            return Err(self.io_err(e));
        }
        let data_end = self.pos;
        let mut out = Vec::new();
        put_record(
            &mut out,
            op::DATA_END,
            &records::DataEnd {
                data_section_crc: self.data_crc.clone().finalize(),
            },
        );
        self.write(&out)?;
        let summary_start = self.pos;
        let mut summary = Vec::new();
        let mut offsets = Vec::new();
        let mut group = |summary: &mut Vec<u8>, opcode: u8, put: &dyn Fn(&mut Vec<u8>)| {
            let at = summary.len();
            put(summary);
            if summary.len() > at {
                offsets.push(records::SummaryOffset {
                    group_opcode: opcode,
                    group_start: summary_start + at as u64,
                    group_length: (summary.len() - at) as u64,
                });
            }
        };
        group(&mut summary, op::CHANNEL, &|s| {
            for c in &self.channel_records {
                put_record(s, op::CHANNEL, c);
            }
        });
        let (start, end) = self.times.unwrap_or((0, 0));
        let stats = records::Statistics {
            message_count: self.messages,
            schema_count: 0,
            channel_count: self.channel_records.len() as u32,
            attachment_count: 0,
            metadata_count: self.metadata_indexes.len() as u32,
            chunk_count: self.chunk_indexes.len() as u32,
            message_start_time: start,
            message_end_time: end,
            channel_message_counts: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(c, n)| (c as u16, *n))
                .collect(),
        };
        group(&mut summary, op::STATISTICS, &|s| {
            put_record(s, op::STATISTICS, &stats)
        });
        group(&mut summary, op::CHUNK_INDEX, &|s| {
            for i in &self.chunk_indexes {
                put_record(s, op::CHUNK_INDEX, i);
            }
        });
        group(&mut summary, op::METADATA_INDEX, &|s| {
            for i in &self.metadata_indexes {
                put_record(s, op::METADATA_INDEX, i);
            }
        });
        let summary_offset_start = summary_start + summary.len() as u64;
        for o in &offsets {
            put_record(&mut summary, op::SUMMARY_OFFSET, o);
        }
        put_record(
            &mut summary,
            op::FOOTER,
            &records::Footer {
                summary_start,
                summary_offset_start,
                summary_crc: 0,
            },
        );
        // The summary's CRC covers it up to the footer's last field.
        let crc_at = summary.len() - 4;
        let crc = crc32fast::hash(&summary[..crc_at]);
        summary[crc_at..].copy_from_slice(&crc.to_le_bytes());
        summary.extend_from_slice(MAGIC);
        self.write(&summary)?;
        self.finished = true;
        // Truncating to its own size gives back the blocks allocated past
        // the end; the file is complete without it (best effort).
        let _ = self.file.set_len(self.pos);
        if let Err(e) = self.file.sync_all() {
            // Whether the summary reached the disk is unknown: taken away
            // (best effort), so that the file reads as cut short, its
            // chunks whole, rather than complete.
            let _ = self.file.set_len(data_end);
            let _ = self.file.sync_all();
            return Err(self.io_err(e));
        }
        // Its name on the disk too (a new file's directory entry).
        if let Some(dir) = self.path.parent() {
            crate::util::sys::sync_dir(dir);
        }
        Ok(())
    }
}

impl RecordWriter {
    /// Drops the writer without finishing the file (a copy that failed:
    /// its file must not read as a complete recording).
    pub(crate) fn abandon(mut self) {
        self.failed = true;
    }
}

/// A writer dropped without `finish` finishes its file (as the `mcap`
/// crate's does) unless a write failed, or a panic unwinds (it may have
/// left a message half written in the chunk): then the file stays without
/// a summary, so that no reader takes it for complete.
impl Drop for RecordWriter {
    fn drop(&mut self) {
        if !self.failed && !self.finished && !std::thread::panicking() {
            let _ = self.finish_file();
        }
    }
}
