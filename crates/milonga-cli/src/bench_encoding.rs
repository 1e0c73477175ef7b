//! `milonga bench encoding`: seed 003's measurements of serialization
//! formats and compression, on a track record of the kind air-traffic
//! control centres exchange (docs/benchmarks.md "Encodings").
//!
//! For each format (CDR as DDS writes it, JSON, CBOR as Milonga sends it,
//! and Milonga's schema'd compact encoding, docs/schemas.md)
//! and each compression (none, LZ4, zstd as Milonga's publishers compress;
//! zlib for comparison with the seed), in this process:
//!
//! - `payload_bytes`: the message's information, each field at its native
//!   size (`Track::information_bytes`); `wire_bytes`: what the format and
//!   the compression hand to the transport; `eta` = payload / wire; `chi`
//!   = the format's size uncompressed / wire.
//! - `encode_ns`, `decode_ns`: serialize then compress, and inflate then
//!   deserialize, per message (medians of 21 batches of 2,000).
//! - RTT (path `loopback`): a ping node and a pong node over tcp on
//!   loopback (LZ4 and zstd done by Milonga's publishers and subscribers,
//!   zlib by the application); ping encodes a track and puts its bytes,
//!   pong decodes them,
//!   encodes its answer and puts it back, ping decodes the answer: one
//!   round trip, one message in flight, best effort (the seed's test),
//!   after 200 warm-up round trips. `lost` counts round trips that did not
//!   come back within a second. `omega` = CDR's p50 without compression /
//!   this cell's p50.
//!
//! - Paths `A`..`E` (root: two network namespaces of the test bed): seed
//!   003's wide-area paths, at each of its publishing rates (200, 100, 50
//!   messages a second), with the one-way delay and the packet loss it
//!   measured on each (`PATHS`). A ping process on one host puts a track
//!   every 1/rate s (best effort, or reliable with `--reliable`; several
//!   in flight when the delay is
//!   longer than the period), a pong process on the other decodes and
//!   answers each; the RTT of each message is its answer's arrival, once
//!   decoded, less its put. `lost`: messages with no answer within a
//!   second of the last put. The delay is the bed's relay on the ping
//!   host's link (median less the IQR, plus a uniform share of twice the
//!   IQR: the same median and IQR), the loss nftables' on that link, both
//!   ways; over TCP a lost packet is retransmitted, so loss shows as
//!   latency, not as lost messages.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::{Bytes, Config, Event, Node, PublisherQos, SubscriberQos, Transport, Value};
use serde::{Deserialize, Serialize};

use crate::bench::Format;

/// Options of `milonga bench encoding`.
#[derive(Args, Debug)]
pub struct EncodingArgs {
    /// Paths to measure the round trip on: `loopback`, and seed 003's
    /// wide-area paths `A`..`E` (root: network namespaces).
    #[arg(long, value_delimiter = ',', default_value = "loopback")]
    paths: Vec<String>,
    /// Publishing rates on the wide-area paths, messages a second (the
    /// seed's: 200, 100, 50).
    #[arg(long, value_delimiter = ',', default_value = "200,100,50")]
    rates: Vec<u32>,
    /// Messages per cell on a wide-area path.
    #[arg(long, default_value_t = 200)]
    wan_messages: usize,
    /// Round trips measured per cell (after 200 warm-up ones).
    #[arg(long, default_value_t = 2000)]
    round_trips: usize,
    /// Calls per timing batch of the encode and decode figures (21
    /// batches, the median taken).
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Also measure zstd with a dictionary (`zstd-dict`, docs/compression.md
    /// "Dictionaries"): trained as a publisher trains one, from 128 other
    /// tracks; on loopback only.
    #[arg(long)]
    dictionary: bool,
    /// Formats whose encode, decode and loopback cells are measured (all
    /// by default; the wide-area paths always run every cell).
    #[arg(long, value_delimiter = ',', value_enum)]
    formats: Vec<Fmt>,
    /// Compressions whose encode, decode and loopback cells are measured
    /// (all by default; `zstd-dict` needs `--dictionary`).
    #[arg(long, value_delimiter = ',', value_enum)]
    compressions: Vec<Comp>,
    /// On the wide-area paths, reliable publishers (a history of 1,000
    /// samples, what a gap is repaired from) and reliable subscriptions
    /// instead of best effort: `lost` then counts answers that never came,
    /// and the answers the ping host repaired from history are said on
    /// stderr, per cell.
    #[arg(long)]
    reliable: bool,
    /// Output: a table, or CSV with the columns of docs/benchmarks.md.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Position, metres in a local Cartesian frame.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Debug, PartialEq)]
struct Position {
    x_m: f64,
    y_m: f64,
    altitude_m: f64,
}

/// Velocity, metres per second.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Debug, PartialEq)]
struct Velocity {
    vx_mps: f64,
    vy_mps: f64,
    vz_mps: f64,
}

/// A track's state.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Copy, Debug, PartialEq)]
enum TrackStatus {
    Tentative,
    Confirmed,
    Coasted,
    Dropped,
}

/// One sensor plot that updated the track.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Debug, PartialEq)]
struct Plot {
    sensor_id: u16,
    range_m: f32,
    azimuth_deg: f32,
    time_ns: u64,
}

/// The message: a track record of an air-traffic-control centre's
/// tracker, as the centres of seed 003 exchange.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Debug, PartialEq)]
struct Track {
    track_id: u32,
    system_id: u16,
    time_ns: u64,
    position: Position,
    velocity: Velocity,
    status: TrackStatus,
    callsign: String,
    mode_3a: u16,
    plots: Vec<Plot>,
    /// The position's 3x3 covariance, row by row.
    covariance: Vec<f32>,
}

impl Track {
    fn sample(n: u32) -> Track {
        let t = 1_732_400_000_000_000_000 + u64::from(n) * 4_000_000_000;
        Track {
            track_id: 40_000 + n,
            system_id: 17,
            time_ns: t,
            position: Position {
                x_m: 12_345.678 + f64::from(n),
                y_m: -98_765.432,
                altitude_m: 10_668.0,
            },
            velocity: Velocity {
                vx_mps: 231.5,
                vy_mps: -12.25,
                vz_mps: 0.0,
            },
            status: TrackStatus::Confirmed,
            callsign: "AZA1234".into(),
            mode_3a: 0o2471,
            plots: (0..4)
                .map(|i| Plot {
                    sensor_id: 3 + i,
                    range_m: 85_000.0 + f32::from(i) * 12.5,
                    azimuth_deg: 41.25 + f32::from(i) * 0.01,
                    time_ns: t - u64::from(i) * 1_000_000_000,
                })
                .collect(),
            covariance: vec![25.0, 1.5, 0.0, 1.5, 25.0, 0.0, 0.0, 0.0, 100.0],
        }
    }

    /// The information it carries, each field at its native size (the
    /// enum a byte, the string its UTF-8 bytes, no lengths, no padding):
    /// seed 003's "bytes to send".
    fn information_bytes(&self) -> usize {
        4 + 2
            + 8
            + 3 * 8
            + 3 * 8
            + 1
            + self.callsign.len()
            + 2
            + self.plots.len() * (2 + 4 + 4 + 8)
            + self.covariance.len() * 4
    }
}

/// An alarm severity, as control systems grade a reading.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Copy, Debug, PartialEq)]
enum Severity {
    NoAlarm,
    Minor,
    Major,
    Invalid,
}

/// The 92 B class: one reading of a device server's channel (a beam
/// position monitor's, say), the commonest event of a control system.
#[derive(Serialize, Deserialize, milonga::Compact, Clone, Debug, PartialEq)]
struct Reading {
    device_id: u32,
    channel: u16,
    time_ns: u64,
    value: f64,
    setpoint: f64,
    low: f64,
    high: f64,
    severity: Severity,
    unit: String,
    quality: f32,
    name: String,
    seq: u64,
    flags: u16,
}

impl Reading {
    fn sample() -> Reading {
        Reading {
            device_id: 70_412,
            channel: 7,
            time_ns: 1_732_400_000_123_456_789,
            value: 0.125_4,
            setpoint: 0.0,
            low: -2.5,
            high: 2.5,
            severity: Severity::NoAlarm,
            unit: "mm".into(),
            quality: 0.98,
            name: "BPM.H.07".into(),
            seq: 1_234_567,
            flags: 0x0011,
        }
    }
}

/// The 92 B class (`Reading`) as CDR and as the derived compact code:
/// bytes, encode and decode times, said on stderr beside the track's
/// cells.
fn small_class(calls: usize) -> Result<()> {
    use std::hint::black_box;
    let r = Reading::sample();
    let cdr = cdr_encoding::to_vec::<Reading, byteorder::LittleEndian>(&r)?;
    let compact = milonga::wire::compact::to_vec(&r);
    if cdr_encoding::from_bytes::<Reading, byteorder::LittleEndian>(&cdr)?.0 != r
        || milonga::wire::compact::from_slice::<Reading>(&compact)? != r
    {
        bail!("the reading does not come back");
    }
    let cdr_enc = per_call(calls, || {
        black_box(cdr_encoding::to_vec::<Reading, byteorder::LittleEndian>(
            black_box(&r),
        )?);
        Ok(())
    })?;
    let cdr_dec = per_call(calls, || {
        black_box(cdr_encoding::from_bytes::<Reading, byteorder::LittleEndian>(black_box(&cdr))?);
        Ok(())
    })?;
    let enc = per_call(calls, || {
        let mut out = Vec::with_capacity(128);
        milonga::Compact::write_compact(black_box(&r), &mut out);
        black_box(out);
        Ok(())
    })?;
    let dec = per_call(calls, || {
        black_box(milonga::wire::compact::from_slice::<Reading>(black_box(
            &compact,
        ))?);
        Ok(())
    })?;
    eprintln!(
        "# 92 B class (a device reading, 13 fields): cdr {} bytes, encode {cdr_enc:.0} ns, decode {cdr_dec:.0} ns; schema {} bytes, encode {enc:.0} ns, decode {dec:.0} ns; schema's encode+decode / cdr's {:.2}",
        cdr.len(),
        compact.len(),
        (enc + dec) / (cdr_enc + cdr_dec)
    );
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Fmt {
    Cdr,
    Json,
    Cbor,
    /// Milonga's schema'd compact encoding (docs/schemas.md): values
    /// written by position, by the track's derived code
    /// (`#[derive(milonga::Compact)]`).
    Schema,
}

/// The track's schema as its serde impl traces it, its writer, and the
/// plan that reads it back as a subscriber does (by the writer's own
/// fields): the serde path to the compact encoding, measured beside the
/// derived one.
struct TrackSchema {
    writer: milonga::wire::schema::CompactWriter,
    plan: milonga::wire::schema::Plan,
}

fn track_schema() -> &'static TrackSchema {
    static S: std::sync::OnceLock<TrackSchema> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let schema = milonga::Schema::of::<Track>().expect("the track has a schema");
        TrackSchema {
            writer: schema.writer(),
            plan: milonga::wire::schema::Plan::identity(&schema),
        }
    })
}

/// The track's derived schema (what its publishers declare).
fn derived_schema() -> &'static milonga::wire::compact::RecordSchema {
    use milonga::CompactRecord;
    Track::record_schema().expect("the track has a schema")
}

#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
enum Comp {
    None,
    Lz4,
    Zstd,
    Zlib,
    /// zstd with the format's dictionary (`--dictionary`).
    ZstdDict,
}

fn fmt_name(f: Fmt) -> &'static str {
    match f {
        Fmt::Cdr => "cdr",
        Fmt::Json => "json",
        Fmt::Cbor => "cbor",
        Fmt::Schema => "schema",
    }
}

fn comp_name(c: Comp) -> &'static str {
    match c {
        Comp::None => "none",
        Comp::Lz4 => "lz4",
        Comp::Zstd => "zstd",
        Comp::Zlib => "zlib",
        Comp::ZstdDict => "zstd-dict",
    }
}

fn serialize(f: Fmt, t: &Track) -> Result<Vec<u8>> {
    Ok(match f {
        Fmt::Cdr => cdr_encoding::to_vec::<Track, byteorder::LittleEndian>(t)?,
        Fmt::Json => serde_json::to_vec(t)?,
        Fmt::Cbor => milonga::wire::cbor::to_cbor(t)?,
        Fmt::Schema => {
            let mut out = Vec::with_capacity(256);
            milonga::Compact::write_compact(t, &mut out);
            out
        }
    })
}

fn deserialize(f: Fmt, b: &[u8]) -> Result<Track> {
    Ok(match f {
        Fmt::Cdr => cdr_encoding::from_bytes::<Track, byteorder::LittleEndian>(b)?.0,
        Fmt::Json => serde_json::from_slice(b)?,
        Fmt::Cbor => milonga::wire::cbor::from_cbor(b)?,
        // What a typed subscriber does (`SubscriberQos::typed`,
        // `Sample::read`) with a sample of the type's own schema: the
        // type's derived code reads it by position.
        Fmt::Schema => milonga::wire::compact::from_slice::<Track>(b)?,
    })
}

thread_local! {
    /// One context per codec, kept (as Milonga's publishers and
    /// subscribers keep their zstd contexts): making one per message would
    /// cost more than compressing a small one.
    static ZSTD: std::cell::RefCell<(zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)> =
        std::cell::RefCell::new((
            zstd::bulk::Compressor::new(3).expect("a zstd context"),
            zstd::bulk::Decompressor::new().expect("a zstd context"),
        ));
    static ZLIB: std::cell::RefCell<(flate2::Compress, flate2::Decompress)> =
        std::cell::RefCell::new((
            flate2::Compress::new(flate2::Compression::new(6), true),
            flate2::Decompress::new(true),
        ));
}

/// The format's dictionary, trained as a publisher trains its own
/// (`milonga::train_dictionary`) from 128 tracks other than the one
/// measured: its id and bytes.
fn dictionary(f: Fmt) -> &'static (u32, Vec<u8>) {
    static D: [std::sync::OnceLock<(u32, Vec<u8>)>; 4] = [const { std::sync::OnceLock::new() }; 4];
    D[f as usize].get_or_init(|| {
        let samples: Vec<Vec<u8>> = (1001..1001 + milonga::DICTIONARY_TRAINING_SAMPLES as u32)
            .map(|n| serialize(f, &Track::sample(n)).expect("a track serializes"))
            .collect();
        let d = milonga::train_dictionary(&samples);
        (milonga::wire::content_id(&d), d)
    })
}

/// Milonga's compressed body for LZ4, zstd and zstd with a dictionary
/// (its 5- or 9-byte head, then the data, as publishers send it:
/// docs/protocol.md §4); a zlib stream at level 6 for zlib, which Milonga
/// does not send (the seed's comparison).
fn compress(f: Fmt, c: Comp, b: Vec<u8>) -> Result<Vec<u8>> {
    let head = |id: u8, data: Vec<u8>| {
        let mut out = vec![id];
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&data);
        out
    };
    Ok(match c {
        Comp::None => b,
        Comp::Lz4 => head(
            1,
            lz4::block::compress(&b, Some(lz4::block::CompressionMode::FAST(1)), false)?,
        ),
        Comp::Zstd => head(2, ZSTD.with(|z| z.borrow_mut().0.compress(&b))?),
        Comp::ZstdDict => {
            let (id, _) = dictionary(f);
            let data = with_dictionary(f, |c, _| Ok(c.compress(&b)?))?;
            let mut out =
                milonga::wire::frame::Compressed::dictionary_head(b.len() as u32, *id).to_vec();
            out.extend_from_slice(&data);
            out
        }
        Comp::Zlib => ZLIB.with(|z| -> Result<Vec<u8>> {
            let z = &mut z.borrow_mut().0;
            z.reset();
            let mut out = Vec::with_capacity(b.len() + 64);
            z.compress_vec(&b, &mut out, flate2::FlushCompress::Finish)?;
            Ok(out)
        })?,
    })
}

fn decompress(f: Fmt, c: Comp, b: &[u8]) -> Result<Vec<u8>> {
    let size = |b: &[u8]| u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")) as usize;
    Ok(match c {
        Comp::None => b.to_vec(),
        Comp::ZstdDict => with_dictionary(f, |_, d| Ok(d.decompress(&b[9..], size(b))?))?,
        Comp::Lz4 => lz4::block::decompress(&b[5..], Some(size(b) as i32))?,
        Comp::Zstd => ZSTD.with(|z| z.borrow_mut().1.decompress(&b[5..], size(b)))?,
        Comp::Zlib => ZLIB.with(|z| -> Result<Vec<u8>> {
            let z = &mut z.borrow_mut().1;
            z.reset(true);
            // The track is a few hundred bytes: 64 KiB holds it many times.
            let mut out = Vec::with_capacity(64 << 10);
            z.decompress_vec(b, &mut out, flate2::FlushDecompress::Finish)?;
            Ok(out)
        })?,
    })
}

thread_local! {
    /// Contexts with each format's dictionary loaded, kept.
    static ZDICT: std::cell::RefCell<Vec<Option<(zstd::bulk::Compressor<'static>, zstd::bulk::Decompressor<'static>)>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `w` with the contexts of format `f`'s dictionary.
fn with_dictionary<T>(
    f: Fmt,
    w: impl FnOnce(
        &mut zstd::bulk::Compressor<'static>,
        &mut zstd::bulk::Decompressor<'static>,
    ) -> Result<T>,
) -> Result<T> {
    ZDICT.with(|z| {
        let mut z = z.borrow_mut();
        if z.len() <= f as usize {
            z.resize_with(f as usize + 1, || None);
        }
        let slot = &mut z[f as usize];
        if slot.is_none() {
            let (_, d) = dictionary(f);
            *slot = Some((
                zstd::bulk::Compressor::with_dictionary(3, d)?,
                zstd::bulk::Decompressor::with_dictionary(d)?,
            ));
        }
        let (c, d) = slot.as_mut().expect("made above");
        w(c, d)
    })
}

/// In the round trips, LZ4 and zstd are Milonga's own: the publisher
/// compresses (`PublisherQos::compression`, from any size) and the
/// subscriber inflates; the application puts the format's plain bytes.
/// zlib, which Milonga does not send, is the application's.
fn app_comp(c: Comp) -> Comp {
    match c {
        Comp::Lz4 | Comp::Zstd | Comp::ZstdDict => Comp::None,
        other => other,
    }
}

/// The publishers' QoS of a cell: best effort (reliable, with a history
/// to repair from, for `--reliable` on the wide-area paths), compressed by Milonga for
/// LZ4 and zstd; the schema'd format's publishers declare the track's
/// schema (unless the application compresses: zlib).
fn qos(f: Fmt, c: Comp, reliable: bool) -> PublisherQos {
    let mut q = if reliable {
        PublisherQos::reliable().history(1000)
    } else {
        PublisherQos::best_effort()
    };
    if milonga_writes(f, c) {
        q = q.schema(derived_schema().schema.clone());
    }
    match c {
        Comp::Lz4 => q.compression(milonga::Compression::lz4().threshold(1)),
        Comp::Zstd => q.compression(milonga::Compression::zstd().threshold(1)),
        Comp::ZstdDict => q.compression(milonga::Compression::zstd().dictionary().threshold(1)),
        _ => q,
    }
}

/// Whether Milonga's publisher writes the track (the schema'd format,
/// `put_compact`) rather than the application putting its bytes.
fn milonga_writes(f: Fmt, c: Comp) -> bool {
    f == Fmt::Schema && app_comp(c) == Comp::None
}

/// Puts a track as the cell sends it.
fn put_track(p: &milonga::Publisher, f: Fmt, c: Comp, t: &Track) -> Result<()> {
    if milonga_writes(f, c) {
        p.put_compact(t)?;
    } else {
        p.put(Value::Bytes(Bytes::from(encode(f, app_comp(c), t)?)))?;
    }
    Ok(())
}

/// The track a sample of the cell carries.
fn take_track(f: Fmt, c: Comp, s: &milonga::Sample) -> Result<Track> {
    if milonga_writes(f, c) {
        // A typed subscription: the type read straight from the payload.
        return Ok(s.read::<Track>()?);
    }
    match &s.value {
        Value::Bytes(b) => decode(f, app_comp(c), b),
        _ => bail!("{}: not bytes", s.key),
    }
}

fn encode(f: Fmt, c: Comp, t: &Track) -> Result<Vec<u8>> {
    compress(f, c, serialize(f, t)?)
}

fn decode(f: Fmt, c: Comp, b: &[u8]) -> Result<Track> {
    deserialize(f, &decompress(f, c, b)?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f`: the median of 21 batches of `calls`.
fn per_call(calls: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let calls = calls.max(1);
    let mut batches = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        for _ in 0..calls {
            f()?;
        }
        batches.push(t.elapsed().as_nanos() as f64 / calls as f64);
    }
    Ok(median(batches))
}

/// One cell's figures.
struct Cell {
    fmt: Fmt,
    comp: Comp,
    payload: usize,
    wire: usize,
    plain: usize,
    encode_ns: f64,
    decode_ns: f64,
    rtt: Option<Rtt>,
}

struct Rtt {
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    lost: u64,
}

/// Seed 003's wide-area paths ("Performance Evaluation III", measured on
/// PlanetLab): path, publishing rate (messages/s), one-way delay median
/// and IQR (ms), packet loss rate median (%).
const PATHS: &[(&str, u32, f64, f64, f64)] = &[
    ("A", 200, 8.9, 0.87, 3.35),
    ("A", 100, 8.85, 0.78, 1.07),
    ("A", 50, 8.96, 0.53, 0.4),
    ("B", 200, 17.95, 0.56, 5.28),
    ("B", 100, 17.91, 0.53, 1.93),
    ("B", 50, 18.0, 0.42, 0.74),
    ("C", 200, 27.16, 18.0, 5.34),
    ("C", 100, 22.3, 13.69, 1.41),
    ("C", 50, 23.48, 10.6, 0.35),
    ("D", 200, 27.75, 1.65, 5.78),
    ("D", 100, 28.23, 1.50, 0.77),
    ("D", 50, 28.25, 1.55, 0.2),
    ("E", 200, 43.81, 0.78, 5.05),
    ("E", 100, 43.71, 0.82, 1.78),
    ("E", 50, 43.71, 0.63, 0.65),
];

/// Every cell: format and compression.
fn all_cells() -> Vec<(Fmt, Comp)> {
    [Fmt::Cdr, Fmt::Json, Fmt::Cbor, Fmt::Schema]
        .into_iter()
        .flat_map(|f| {
            [Comp::None, Comp::Lz4, Comp::Zstd, Comp::Zlib]
                .into_iter()
                .map(move |c| (f, c))
        })
        .collect()
}

fn tag(f: Fmt, c: Comp) -> String {
    format!("{}-{}", fmt_name(f), comp_name(c))
}

fn parse_tag(t: &str) -> Option<(Fmt, Comp)> {
    all_cells().into_iter().find(|(f, c)| tag(*f, *c) == t)
}

/// One cell's round trips on a wide-area path, as the ping worker says.
#[derive(Serialize, Deserialize, Debug)]
struct WanRtt {
    tag: String,
    p50_us: f64,
    p99_us: f64,
    lost: u64,
    /// Answers the ping host's reliable subscription took from the pong's
    /// history (a gap repaired), in the measured part of the cell.
    #[serde(default)]
    repaired: u64,
}

/// A cell's subscriptions: typed (the schema'd cells read the track
/// straight from the payload), reliable with `--reliable`.
fn sub_qos(reliable: bool) -> SubscriberQos {
    let q = SubscriberQos::default().typed();
    if reliable {
        q.reliable()
    } else {
        q
    }
}

/// Runs `milonga bench encoding`.
pub fn run(a: EncodingArgs) -> Result<std::process::ExitCode> {
    for p in &a.paths {
        if p != "loopback" && !PATHS.iter().any(|(id, ..)| id == p) {
            bail!("path {p}: expected loopback, A, B, C, D or E");
        }
    }
    for r in &a.rates {
        if !PATHS.iter().any(|(_, rate, ..)| rate == r) {
            bail!("rate {r}: seed 003 measured its paths at 200, 100 and 50 messages a second");
        }
    }
    let track = Track::sample(1);
    let payload = track.information_bytes();
    let mut cells = Vec::new();
    for fmt in [Fmt::Cdr, Fmt::Json, Fmt::Cbor, Fmt::Schema] {
        let plain = serialize(fmt, &track)?.len();
        let mut comps = vec![Comp::None, Comp::Lz4, Comp::Zstd, Comp::Zlib];
        if a.dictionary {
            comps.push(Comp::ZstdDict);
        }
        for comp in comps {
            if !a.formats.is_empty() && !a.formats.contains(&fmt)
                || !a.compressions.is_empty() && !a.compressions.contains(&comp)
            {
                continue;
            }
            let wire = encode(fmt, comp, &track)?;
            // Every cell must give the message back as it was.
            if decode(fmt, comp, &wire)? != track {
                bail!(
                    "{}+{}: the track does not come back",
                    fmt_name(fmt),
                    comp_name(comp)
                );
            }
            let encode_ns = per_call(a.calls, || {
                std::hint::black_box(encode(fmt, comp, std::hint::black_box(&track))?);
                Ok(())
            })?;
            let decode_ns = per_call(a.calls, || {
                std::hint::black_box(decode(fmt, comp, std::hint::black_box(&wire))?);
                Ok(())
            })?;
            cells.push(Cell {
                fmt,
                comp,
                payload,
                wire: wire.len(),
                plain,
                encode_ns,
                decode_ns,
                rtt: None,
            });
        }
    }
    if a.formats.is_empty() || a.formats.contains(&Fmt::Schema) {
        serde_path(&track, a.calls)?;
        small_class(a.calls)?;
    }
    if a.paths.iter().any(|p| p == "loopback") {
        let dir = std::env::temp_dir().join(format!("mlg-bench-encoding-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        let result = (|| -> Result<()> {
            let (ping, pong) = nodes(&dir)?;
            for c in &mut cells {
                c.rtt = Some(round_trips(&ping, &pong, c.fmt, c.comp, a.round_trips)?);
            }
            Ok(())
        })();
        let _ = std::fs::remove_dir_all(&dir);
        result?;
    }
    let wan: Vec<&str> = a
        .paths
        .iter()
        .map(String::as_str)
        .filter(|p| *p != "loopback")
        .collect();
    let mut wan_rows = Vec::new();
    if !wan.is_empty() {
        wan_rows = wide_area(&a, &wan)?;
    }
    print(&a, &cells, &wan_rows);
    Ok(std::process::ExitCode::SUCCESS)
}

/// The serde path to the same compact bytes (`Schema::of`, `put_serde`,
/// `Sample::deserialize` of a typed subscription), timed as the cells are
/// and said on stderr beside the derived code's `schema` cells.
fn serde_path(track: &Track, calls: usize) -> Result<()> {
    use std::hint::black_box;
    let s = track_schema();
    if milonga::Schema::of::<Track>()? != derived_schema().schema {
        bail!("the serde path traces another schema than the derived code declares");
    }
    let mut out = Vec::with_capacity(256);
    s.writer.write_serde(track, &mut out)?;
    if out != serialize(Fmt::Schema, track)? {
        bail!("the serde path writes other bytes than the derived code");
    }
    let payload = Bytes::from(out);
    let encode_ns = per_call(calls, || {
        let mut o = Vec::with_capacity(256);
        s.writer.write_serde(black_box(track), &mut o)?;
        black_box(o);
        Ok(())
    })?;
    let decode_ns = per_call(calls, || {
        black_box(s.plan.deserialize::<Track>(black_box(&payload))?);
        Ok(())
    })?;
    eprintln!("# schema through serde (Schema::of, put_serde, Sample::deserialize; the same bytes as the derived code's schema cells): encode {encode_ns:.0} ns, decode {decode_ns:.0} ns");
    Ok(())
}

/// The wide-area paths: (path, rate, the cells' round trips).
fn wide_area(a: &EncodingArgs, paths: &[&str]) -> Result<Vec<(String, u32, Vec<WanRtt>)>> {
    use std::io::BufRead;
    let mut bed = milonga_testkit::netbed::Bed::new(2)
        .map_err(|why| anyhow::anyhow!("paths A-E need network namespaces (root): {why}"))?;
    let dir = std::env::temp_dir().join(format!("mlg-bench-encoding-wan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let mut out = Vec::new();
    let result = (|| -> Result<()> {
        for &(id, rate, median, iqr, plr) in PATHS {
            if !paths.contains(&id) || !a.rates.contains(&rate) {
                continue;
            }
            let base = (median - iqr).max(0.0);
            bed.set_delay(
                0,
                Duration::from_secs_f64(base / 1000.0),
                Duration::from_secs_f64(2.0 * iqr / 1000.0),
            )
            .map_err(|why| anyhow::anyhow!("cannot delay the link: {why}"))?;
            bed.set_loss_ppm(0, (plr * 10_000.0).round() as u32);
            eprintln!("# path {id} at {rate}/s: one-way delay {median} ms (IQR {iqr}), loss {plr}% each way on the ping host's link");
            let at = crate::bench::Place {
                address: format!(
                    "milonga:///bench-encoding-{}-{id}{rate}",
                    std::process::id()
                ),
                runtime_dir: dir.display().to_string(),
                transport: "tcp".into(),
                hwm: 1000,
                history: 0,
                keys: None,
                spin_us: 0,
                no_shm: false,
                loan: false,
                shm_small: None,
            };
            let spawn = |h: usize, role: crate::bench::Role| -> Result<std::process::Child> {
                let exe = std::env::current_exe()?;
                let mut c = bed.command(h, &exe.display().to_string());
                c.env("MILONGA_BENCH_TCP_HOST", bed.host(h).addr.to_string())
                    .arg("bench-worker")
                    .arg(serde_json::to_string(&role)?)
                    .stdout(std::process::Stdio::piped())
                    .stdin(std::process::Stdio::null());
                c.spawn().context("cannot start a bench worker")
            };
            let mut pong = spawn(
                1,
                crate::bench::Role::EncPong {
                    at: at.clone(),
                    reliable: a.reliable,
                },
            )?;
            let ping = spawn(
                0,
                crate::bench::Role::EncPing {
                    at,
                    n: a.wan_messages,
                    rate: f64::from(rate),
                    reliable: a.reliable,
                },
            );
            let line = ping.and_then(|mut p| {
                let mut line = String::new();
                std::io::BufReader::new(p.stdout.take().expect("piped")).read_line(&mut line)?;
                let status = p.wait()?;
                if !status.success() {
                    bail!("the ping worker of path {id} at {rate}/s failed ({status})");
                }
                Ok(line)
            });
            let _ = pong.kill();
            let _ = pong.wait();
            let rtts: Vec<WanRtt> = serde_json::from_str(&line?)?;
            if a.reliable {
                let said: Vec<String> = rtts
                    .iter()
                    .map(|r| format!("{} {}", r.tag, r.repaired))
                    .collect();
                eprintln!(
                    "# path {id} at {rate}/s, reliable: answers repaired at the ping host: {}",
                    said.join(", ")
                );
            }
            out.push((id.to_owned(), rate, rtts));
        }
        Ok(())
    })();
    bed.set_loss_ppm(0, 0);
    drop(bed);
    let _ = std::fs::remove_dir_all(&dir);
    result.map(|()| out)
}

/// A `bench encoding` worker on a host of the bed (`bench-worker`).
pub fn worker(role: crate::bench::Role) -> Result<std::process::ExitCode> {
    match role {
        crate::bench::Role::EncPong { at, reliable } => pong_worker(&at, reliable),
        crate::bench::Role::EncPing {
            at,
            n,
            rate,
            reliable,
        } => {
            let rtts = ping_worker(&at, n, rate, reliable)?;
            println!("{}", serde_json::to_string(&rtts)?);
            Ok(std::process::ExitCode::SUCCESS)
        }
        _ => bail!("not a bench encoding role"),
    }
}

/// Answers every ping of every cell, until killed (or a minute without
/// one).
fn pong_worker(at: &crate::bench::Place, reliable: bool) -> Result<std::process::ExitCode> {
    let node = Node::open_with(crate::bench::mlg_config(at, "pong")?)?;
    let mut to_ping = std::collections::HashMap::new();
    for (f, c) in all_cells() {
        let t = tag(f, c);
        let p = node.publisher_with(&format!("enc/{t}/pong"), qos(f, c, reliable))?;
        to_ping.insert(t, p);
    }
    let sub = node.subscribe_with("enc/*/ping", sub_qos(reliable))?;
    loop {
        match sub.recv_timeout(Duration::from_secs(60)) {
            Ok(Event::Sample(s)) => {
                let Some(t) = s.key.split('/').nth(1) else {
                    continue;
                };
                let (Some((f, c)), Some(p)) = (parse_tag(t), to_ping.get(t)) else {
                    continue;
                };
                let mut track = match take_track(f, c, &s) {
                    Ok(t) => t,
                    Err(e) => {
                        eprintln!("pong: {} seq {}: {e}", s.key, s.seq);
                        continue;
                    }
                };
                track.status = TrackStatus::Coasted;
                // Best effort: a full queue drops the answer (counted lost
                // at the ping side); reliable: the put waits for room.
                let _ = put_track(p, f, c, &track);
            }
            Ok(_) => {}
            Err(_) => return Ok(std::process::ExitCode::SUCCESS),
        }
    }
}

/// Every cell in turn: `n` tracks at `rate` a second, each answer's round
/// trip.
fn ping_worker(
    at: &crate::bench::Place,
    n: usize,
    rate: f64,
    reliable: bool,
) -> Result<Vec<WanRtt>> {
    let node = Node::open_with(crate::bench::mlg_config(at, "ping")?)?;
    let mut out = Vec::new();
    for (f, c) in all_cells() {
        let t = tag(f, c);
        let to_pong = node.publisher_with(&format!("enc/{t}/ping"), qos(f, c, reliable))?;
        let back = node.subscribe_with(&format!("enc/{t}/pong"), sub_qos(reliable))?;
        // Both ways matched: the pong's subscription reached this
        // publisher, and an answer comes back.
        let until = Instant::now() + Duration::from_secs(30);
        // Warm-up tracks: ids far above those measured (0..n).
        let mut id = 1_000_000;
        'warm: loop {
            if Instant::now() > until {
                bail!("{t}: no answer from the pong host in 30 s");
            }
            if to_pong.subscriber_count() > 0 {
                id += 1;
                put_track(&to_pong, f, c, &Track::sample(id))?;
            }
            let wait = Instant::now() + Duration::from_millis(200);
            while let Ok(e) = back.recv_timeout(wait.saturating_duration_since(Instant::now())) {
                if let Event::Sample(_) = e {
                    break 'warm;
                }
            }
        }
        // Late answers of the warm-up are told apart by their ids.
        let replayed_before = node.stats().samples_replayed;
        let mut sent_at: Vec<Option<Instant>> = vec![None; n];
        let mut rtts = Vec::with_capacity(n);
        let period = Duration::from_secs_f64(1.0 / rate);
        let start = Instant::now();
        let mut next = 0usize;
        // Each track's first answer counts (a copy would count twice).
        let take = |e: Event, rtts: &mut Vec<f64>, sent_at: &mut [Option<Instant>]| -> Result<()> {
            if let Event::Sample(s) = e {
                let track = take_track(f, c, &s)?;
                let i = track.track_id.wrapping_sub(40_000) as usize;
                if let Some(t0) = sent_at.get_mut(i).and_then(Option::take) {
                    rtts.push(t0.elapsed().as_nanos() as f64 / 1000.0);
                }
            }
            Ok(())
        };
        while next < n {
            let due = start + period * next as u32;
            let now = Instant::now();
            if now >= due {
                sent_at[next] = Some(now);
                put_track(&to_pong, f, c, &Track::sample(next as u32))?;
                next += 1;
                continue;
            }
            if let Ok(e) = back.recv_timeout(due - now) {
                take(e, &mut rtts, &mut sent_at)?;
            }
        }
        let end = Instant::now() + Duration::from_secs(1);
        while rtts.len() < n {
            match back.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(e) => take(e, &mut rtts, &mut sent_at)?,
                Err(_) => break,
            }
        }
        let lost = (n - rtts.len().min(n)) as u64;
        rtts.sort_by(f64::total_cmp);
        let (p50, p99) = if rtts.is_empty() {
            (f64::NAN, f64::NAN)
        } else {
            (rtts[rtts.len() / 2], rtts[p99_rank(rtts.len())])
        };
        out.push(WanRtt {
            tag: t,
            p50_us: p50,
            p99_us: p99,
            lost,
            repaired: node.stats().samples_replayed - replayed_before,
        });
    }
    Ok(out)
}

/// The index of the 99th percentile, by nearest rank, in `n` sorted
/// samples (`n` > 0).
fn p99_rank(n: usize) -> usize {
    (n * 99).div_ceil(100).max(1) - 1
}

fn nodes(dir: &std::path::Path) -> Result<(Node, Node)> {
    let locator = format!("milonga:///bench-encoding-{}", std::process::id());
    let open = |name: &str| {
        let mut cfg = Config::new(&locator, name);
        cfg.security = milonga::Security::Off;
        cfg.runtime_dir = Some(dir.to_path_buf());
        cfg.transport = Transport::Tcp;
        Node::open_with(cfg)
    };
    Ok((open("ping")?, open("pong")?))
}

/// Ping-pong of one cell: round trips per second, RTT p50/p99, lost.
fn round_trips(ping: &Node, pong: &Node, fmt: Fmt, comp: Comp, n: usize) -> Result<Rtt> {
    let tag = format!("{}-{}", fmt_name(fmt), comp_name(comp));
    let to_pong = ping.publisher_with(&format!("enc/{tag}/ping"), qos(fmt, comp, false))?;
    let to_ping = pong.publisher_with(&format!("enc/{tag}/pong"), qos(fmt, comp, false))?;
    // Typed: the schema'd cells read the track straight from the payload
    // (no effect on the others, whose samples are plain bytes).
    let typed = SubscriberQos::default().typed();
    let at_pong = pong.subscribe_with(&format!("enc/{tag}/ping"), typed.clone())?;
    let at_ping = ping.subscribe_with(&format!("enc/{tag}/pong"), typed)?;
    let until = Instant::now() + Duration::from_secs(10);
    while to_pong.subscriber_count() == 0 || to_ping.subscriber_count() == 0 {
        if Instant::now() > until {
            bail!("{tag}: the ping and pong nodes did not find each other");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Result<()> {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(Event::Sample(s)) = at_pong.recv_timeout(Duration::from_millis(50)) {
                    let mut t = take_track(fmt, comp, &s)?;
                    t.status = TrackStatus::Coasted;
                    put_track(&to_ping, fmt, comp, &t)?;
                }
            }
            Ok(())
        })
    };
    let mut rtts = Vec::with_capacity(n);
    let mut lost = 0;
    let started = Instant::now();
    let mut measured_from = started;
    for i in 0..n + 200 {
        if i == 200 {
            measured_from = Instant::now();
        }
        if echo.is_finished() {
            // It stopped on an error: said when it is joined.
            break;
        }
        let t0 = Instant::now();
        let track = Track::sample(i as u32);
        put_track(&to_pong, fmt, comp, &track)?;
        let deadline = t0 + Duration::from_secs(1);
        let back = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match at_ping.recv_timeout(left) {
                Ok(Event::Sample(s)) => {
                    let t = take_track(fmt, comp, &s)?;
                    if t.track_id == track.track_id {
                        break true;
                    }
                }
                Ok(_) => {}
                Err(_) => break false,
            }
        };
        if i >= 200 {
            if back {
                rtts.push(t0.elapsed().as_nanos() as f64 / 1000.0);
            } else {
                lost += 1;
            }
        }
    }
    let took = measured_from.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    echo.join()
        .map_err(|_| anyhow::anyhow!("{tag}: the echo thread panicked"))??;
    if rtts.is_empty() {
        bail!("{tag}: no round trip came back");
    }
    rtts.sort_by(f64::total_cmp);
    let p99 = rtts[p99_rank(rtts.len())];
    Ok(Rtt {
        rate: n as f64 / took,
        p50_us: rtts[rtts.len() / 2],
        p99_us: p99,
        lost,
    })
}

fn print(a: &EncodingArgs, cells: &[Cell], wan: &[(String, u32, Vec<WanRtt>)]) {
    // Per cell, its rows: (path, rate, p50, p99, omega, lost), the
    // loopback's first. Omega is against CDR uncompressed on the same
    // path and rate.
    let loop_cdr = cells
        .iter()
        .find(|c| c.fmt == Fmt::Cdr && c.comp == Comp::None)
        .and_then(|c| c.rtt.as_ref().map(|r| r.p50_us));
    // A cell with no round trip back (NaN) prints empty fields.
    let omega = |reference: Option<f64>, p50: f64| match reference {
        Some(r) if r.is_finite() && p50.is_finite() => format!("{:.3}", r / p50),
        _ => String::new(),
    };
    let us = |v: f64| {
        if v.is_finite() {
            format!("{v:.1}")
        } else {
            String::new()
        }
    };
    let mut rows: Vec<(&Cell, [String; 6])> = Vec::new();
    for c in cells {
        if let Some(r) = &c.rtt {
            rows.push((
                c,
                [
                    "loopback".to_owned(),
                    format!("{:.0}", r.rate),
                    us(r.p50_us),
                    us(r.p99_us),
                    omega(loop_cdr, r.p50_us),
                    r.lost.to_string(),
                ],
            ));
        }
    }
    for (path, rate, rtts) in wan {
        let reference = rtts
            .iter()
            .find(|r| r.tag == tag(Fmt::Cdr, Comp::None))
            .map(|r| r.p50_us);
        for r in rtts {
            let Some(c) = cells.iter().find(|c| tag(c.fmt, c.comp) == r.tag) else {
                continue;
            };
            rows.push((
                c,
                [
                    path.clone(),
                    rate.to_string(),
                    us(r.p50_us),
                    us(r.p99_us),
                    omega(reference, r.p50_us),
                    r.lost.to_string(),
                ],
            ));
        }
    }
    if rows.is_empty() {
        rows.extend(cells.iter().map(|c| (c, Default::default())));
    }
    if a.format == Format::Csv {
        println!("format,compression,payload_bytes,wire_bytes,eta,chi,encode_ns,decode_ns,path,rate_per_s,rtt_p50_us,rtt_p99_us,omega,lost");
        for (c, [path, rate, p50, p99, omega, lost]) in &rows {
            println!(
                "{},{},{},{},{:.3},{:.3},{:.0},{:.0},{path},{rate},{p50},{p99},{omega},{lost}",
                fmt_name(c.fmt),
                comp_name(c.comp),
                c.payload,
                c.wire,
                c.payload as f64 / c.wire as f64,
                c.plain as f64 / c.wire as f64,
                c.encode_ns,
                c.decode_ns,
            );
        }
        return;
    }
    println!(
        "# milonga bench encoding: a track record (docs/benchmarks.md \"Encodings\"), {} bytes of information; eta = information / wire bytes, chi = uncompressed / wire bytes; encode = serialize + compress, decode = inflate + deserialize, ns per message (median of 21 batches of {}); lz4 and zstd as Milonga's publishers send them (5-byte head), zlib level 6 for comparison; RTT: encoded tracks between two nodes over tcp, best effort, decoded and re-encoded at each end: on loopback one in flight ({} after 200 warm-up; rate = round trips/s), on paths A-E at the path's rate ({} a cell, {}) with seed 003's delay and loss on the ping host's link; omega = RTT p50 of cdr/none on the same path and rate over this cell's; schema = Milonga's compact encoding (written and read by position by the track's #[derive(milonga::Compact)] code: put_compact, and Sample::read of a typed subscription), its lz4/zstd cells compressed by Milonga's publisher after encoding",
        cells.first().map_or(0, |c| c.payload),
        a.calls,
        a.round_trips,
        a.wan_messages,
        if a.reliable {
            "reliable, the pong's history of 1,000 the repair source"
        } else {
            "best effort"
        }
    );
    println!(
        "{:>6} {:>5} {:>7} {:>5} {:>6} {:>9} {:>9} {:>8} {:>6} {:>9} {:>9} {:>6} {:>5}",
        "format",
        "comp",
        "wire_B",
        "eta",
        "chi",
        "enc_ns",
        "dec_ns",
        "path",
        "rate",
        "p50_us",
        "p99_us",
        "omega",
        "lost"
    );
    for (c, [path, rate, p50, p99, omega, lost]) in &rows {
        println!(
            "{:>6} {:>5} {:>7} {:>5.2} {:>6.2} {:>9.0} {:>9.0} {:>8} {:>6} {:>9} {:>9} {:>6} {:>5}",
            fmt_name(c.fmt),
            comp_name(c.comp),
            c.wire,
            c.payload as f64 / c.wire as f64,
            c.plain as f64 / c.wire as f64,
            c.encode_ns,
            c.decode_ns,
            path,
            rate,
            p50,
            p99,
            omega,
            lost,
        );
    }
}
