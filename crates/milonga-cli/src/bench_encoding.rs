//! `milonga bench encoding`: seed 003's measurements of serialization
//! formats and compression, on a track record of the kind air-traffic
//! control centres exchange (docs/benchmarks.md "Encodings").
//!
//! For each format (CDR as DDS writes it, JSON, CBOR as Milonga sends it)
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
//!   loopback; ping encodes a track and puts its bytes, pong decodes them,
//!   encodes its answer and puts it back, ping decodes the answer: one
//!   round trip, one message in flight, best effort (the seed's test),
//!   after 200 warm-up round trips. `lost` counts round trips that did not
//!   come back within a second. `omega` = CDR's p50 without compression /
//!   this cell's p50.
//!
//! The seed's wide-area paths A-E (delay and loss between two hosts) are
//! not built yet: `--paths` takes `loopback` only.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::{Bytes, Config, Event, Node, PublisherQos, Transport, Value};
use serde::{Deserialize, Serialize};

use crate::bench::Format;

/// Options of `milonga bench encoding`.
#[derive(Args, Debug)]
pub struct EncodingArgs {
    /// Paths to measure the round trip on (only `loopback` so far).
    #[arg(long, value_delimiter = ',', default_value = "loopback")]
    paths: Vec<String>,
    /// Round trips measured per cell (after 200 warm-up ones).
    #[arg(long, default_value_t = 2000)]
    round_trips: usize,
    /// Calls per timing batch of the encode and decode figures (21
    /// batches, the median taken).
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Output: a table, or CSV with the columns of docs/benchmarks.md.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Position, metres in a local Cartesian frame.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Position {
    x_m: f64,
    y_m: f64,
    altitude_m: f64,
}

/// Velocity, metres per second.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Velocity {
    vx_mps: f64,
    vy_mps: f64,
    vz_mps: f64,
}

/// A track's state.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
enum TrackStatus {
    Tentative,
    Confirmed,
    Coasted,
    Dropped,
}

/// One sensor plot that updated the track.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Plot {
    sensor_id: u16,
    range_m: f32,
    azimuth_deg: f32,
    time_ns: u64,
}

/// The message: a track record of an air-traffic-control centre's
/// tracker, as the centres of seed 003 exchange.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
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

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    Cdr,
    Json,
    Cbor,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Comp {
    None,
    Lz4,
    Zstd,
    Zlib,
}

fn fmt_name(f: Fmt) -> &'static str {
    match f {
        Fmt::Cdr => "cdr",
        Fmt::Json => "json",
        Fmt::Cbor => "cbor",
    }
}

fn comp_name(c: Comp) -> &'static str {
    match c {
        Comp::None => "none",
        Comp::Lz4 => "lz4",
        Comp::Zstd => "zstd",
        Comp::Zlib => "zlib",
    }
}

fn serialize(f: Fmt, t: &Track) -> Result<Vec<u8>> {
    Ok(match f {
        Fmt::Cdr => cdr_encoding::to_vec::<Track, byteorder::LittleEndian>(t)?,
        Fmt::Json => serde_json::to_vec(t)?,
        Fmt::Cbor => milonga::wire::cbor::to_cbor(t)?,
    })
}

fn deserialize(f: Fmt, b: &[u8]) -> Result<Track> {
    Ok(match f {
        Fmt::Cdr => cdr_encoding::from_bytes::<Track, byteorder::LittleEndian>(b)?.0,
        Fmt::Json => serde_json::from_slice(b)?,
        Fmt::Cbor => milonga::wire::cbor::from_cbor(b)?,
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

/// Milonga's compressed body for LZ4 and zstd (its 5-byte head, then the
/// data, as publishers send it: docs/protocol.md §4); a zlib stream at
/// level 6 for zlib, which Milonga does not send (the seed's comparison).
fn compress(c: Comp, b: Vec<u8>) -> Result<Vec<u8>> {
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
        Comp::Zlib => ZLIB.with(|z| -> Result<Vec<u8>> {
            let z = &mut z.borrow_mut().0;
            z.reset();
            let mut out = Vec::with_capacity(b.len() + 64);
            z.compress_vec(&b, &mut out, flate2::FlushCompress::Finish)?;
            Ok(out)
        })?,
    })
}

fn decompress(c: Comp, b: &[u8]) -> Result<Vec<u8>> {
    let size = |b: &[u8]| u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")) as usize;
    Ok(match c {
        Comp::None => b.to_vec(),
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

fn encode(f: Fmt, c: Comp, t: &Track) -> Result<Vec<u8>> {
    compress(c, serialize(f, t)?)
}

fn decode(f: Fmt, c: Comp, b: &[u8]) -> Result<Track> {
    deserialize(f, &decompress(c, b)?)
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

/// Runs `milonga bench encoding`.
pub fn run(a: EncodingArgs) -> Result<std::process::ExitCode> {
    for p in &a.paths {
        if p != "loopback" {
            bail!(
                "path {p}: the wide-area paths A-E of seed 003 (delay and loss between two hosts) are not built yet; use --paths loopback"
            );
        }
    }
    let track = Track::sample(1);
    let payload = track.information_bytes();
    let mut cells = Vec::new();
    for fmt in [Fmt::Cdr, Fmt::Json, Fmt::Cbor] {
        let plain = serialize(fmt, &track)?.len();
        for comp in [Comp::None, Comp::Lz4, Comp::Zstd, Comp::Zlib] {
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
    print(&a, &cells);
    Ok(std::process::ExitCode::SUCCESS)
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
    let to_pong = ping.publisher_with(&format!("enc/{tag}/ping"), PublisherQos::best_effort())?;
    let to_ping = pong.publisher_with(&format!("enc/{tag}/pong"), PublisherQos::best_effort())?;
    let at_pong = pong.subscribe(&format!("enc/{tag}/ping"))?;
    let at_ping = ping.subscribe(&format!("enc/{tag}/pong"))?;
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
                    let Value::Bytes(b) = s.value else { continue };
                    let mut t = decode(fmt, comp, &b)?;
                    t.status = TrackStatus::Coasted;
                    to_ping.put(Value::Bytes(Bytes::from(encode(fmt, comp, &t)?)))?;
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
        let t0 = Instant::now();
        let track = Track::sample(i as u32);
        to_pong.put(Value::Bytes(Bytes::from(encode(fmt, comp, &track)?)))?;
        let deadline = t0 + Duration::from_secs(1);
        let back = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match at_ping.recv_timeout(left) {
                Ok(Event::Sample(s)) => {
                    if let Value::Bytes(b) = s.value {
                        let t = decode(fmt, comp, &b)?;
                        if t.track_id == track.track_id {
                            break true;
                        }
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
    let p99 = rtts[(rtts.len() * 99 / 100).min(rtts.len() - 1)];
    Ok(Rtt {
        rate: n as f64 / took,
        p50_us: rtts[rtts.len() / 2],
        p99_us: p99,
        lost,
    })
}

fn print(a: &EncodingArgs, cells: &[Cell]) {
    let cdr_p50 = cells
        .iter()
        .find(|c| c.fmt == Fmt::Cdr && c.comp == Comp::None)
        .and_then(|c| c.rtt.as_ref().map(|r| r.p50_us));
    let rtt_cols = |c: &Cell| match &c.rtt {
        Some(r) => (
            "loopback".to_owned(),
            format!("{:.0}", r.rate),
            format!("{:.1}", r.p50_us),
            format!("{:.1}", r.p99_us),
            cdr_p50.map_or(String::new(), |p| format!("{:.3}", p / r.p50_us)),
            r.lost.to_string(),
        ),
        None => Default::default(),
    };
    if a.format == Format::Csv {
        println!("format,compression,payload_bytes,wire_bytes,eta,chi,encode_ns,decode_ns,path,rate_per_s,rtt_p50_us,rtt_p99_us,omega,lost");
        for c in cells {
            let (path, rate, p50, p99, omega, lost) = rtt_cols(c);
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
        "# milonga bench encoding: a track record (docs/benchmarks.md \"Encodings\"), {} bytes of information; eta = information / wire bytes, chi = uncompressed / wire bytes; encode = serialize + compress, decode = inflate + deserialize, ns per message (median of 21 batches of {}); lz4 and zstd as Milonga's publishers send them (5-byte head), zlib level 6 for comparison; RTT: ping-pong of encoded tracks between two nodes over tcp on loopback, best effort, {} round trips after 200 warm-up, decode and re-encode at each end; omega = RTT p50 of cdr/none over this cell's; the schema'd format and the wide-area paths A-E are not built yet",
        cells.first().map_or(0, |c| c.payload),
        a.calls,
        a.round_trips
    );
    println!(
        "{:>6} {:>5} {:>7} {:>5} {:>6} {:>9} {:>9} {:>8} {:>9} {:>9} {:>6} {:>5}",
        "format",
        "comp",
        "wire_B",
        "eta",
        "chi",
        "enc_ns",
        "dec_ns",
        "rt/s",
        "p50_us",
        "p99_us",
        "omega",
        "lost"
    );
    for c in cells {
        let (_, rate, p50, p99, omega, lost) = rtt_cols(c);
        println!(
            "{:>6} {:>5} {:>7} {:>5.2} {:>6.2} {:>9.0} {:>9.0} {:>8} {:>9} {:>9} {:>6} {:>5}",
            fmt_name(c.fmt),
            comp_name(c.comp),
            c.wire,
            c.payload as f64 / c.wire as f64,
            c.plain as f64 / c.wire as f64,
            c.encode_ns,
            c.decode_ns,
            rate,
            p50,
            p99,
            omega,
            lost,
        );
    }
}
