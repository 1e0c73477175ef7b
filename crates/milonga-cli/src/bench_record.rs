//! `milonga bench record`: what recording costs (docs/recording.md,
//! docs/benchmarks.md).
//!
//! In this process, a reliable publisher node sends N samples of S bytes
//! as fast as a reliable subscription of a second node takes them (so the
//! rate is the highest one without loss: a slower reader holds the
//! publisher back), and the subscription:
//!
//! - `subscriber`: only counts them (the rate a subscriber alone sustains);
//! - `record none|lz4|zstd`: writes each to an MCAP file as `milonga
//!   record` does (`RecordWriter::sample`), the file finished and synced
//!   within the time measured.
//!
//! The payloads are pseudo-random bytes, which no compression shrinks.
//!
//! In the same run, `disk`: the same number of bytes written to a file in
//! 1 MiB blocks and synced (what `dd bs=1M conv=fsync` measures), with the
//! recorder's own I/O habits (blocks allocated ahead, writeback started as
//! each block is written), and
//! `replay`: the uncompressed recording read back and published reliably
//! into a subscription, as `milonga replay --speed max` does; `writer`:
//! `RecordWriter::sample` alone, uncompressed, no network (what a record
//! costs by itself). Each is run `--runs` times; the median is printed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::recording::{Compression, Entry, RecordOptions, RecordReader, RecordWriter};
use milonga::{Bytes, Config, Event, Node, PublisherQos, SubscriberQos, Transport, Value};

/// Options of `milonga bench record`.
#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Sample sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "92,4096,1048576")]
    sizes: Vec<usize>,
    /// Bytes sent per run and size (at least 100 samples, at most
    /// `--max-samples`).
    #[arg(long, default_value_t = 256 << 20)]
    bytes: u64,
    /// The most samples sent per run and size: enough that a cell of small
    /// samples lasts a good part of a second.
    #[arg(long, default_value_t = 2_000_000)]
    max_samples: u64,
    /// Recording modes measured (`none`, `lz4`, `zstd`); the subscriber
    /// alone is always measured, the replay with `none`.
    #[arg(long, value_delimiter = ',', default_value = "none,lz4,zstd")]
    modes: Vec<String>,
    /// Runs of each measurement; the median is printed.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Where the files go (default: the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// What one measurement does with the samples it receives.
#[derive(Clone, Copy)]
enum Mode {
    Subscriber,
    Record(Compression),
}

fn samples_for(size: usize, bytes: u64, max: u64) -> u64 {
    (bytes / size.max(1) as u64).clamp(100, max.max(100))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `milonga bench record`.
pub fn run(a: RecordArgs, t: Transport) -> Result<std::process::ExitCode> {
    if a.runs == 0 || a.sizes.is_empty() {
        bail!("--runs and --sizes must not be empty");
    }
    let base = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("mlg-bench-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let result = measure_all(&a, t, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure_all(a: &RecordArgs, t: Transport, dir: &Path) -> Result<std::process::ExitCode> {
    let locator = format!("milonga:///bench-record-{}", std::process::id());
    let open = |name: &str| {
        let mut cfg = Config::new(&locator, name);
        cfg.security = milonga::Security::Off;
        cfg.runtime_dir = Some(dir.to_path_buf());
        cfg.transport = t;
        Node::open_with(cfg)
    };
    let publisher = open("bench-pub")?;
    let subscriber = open("bench-sub")?;
    println!(
        "# milonga bench record: transport {t:?}; a reliable publisher node and a reliable \
         subscription of another node in one process; samples/s = N / (first put to last \
         sample handled, the file finished and synced); disk = the same bytes written in \
         1 MiB blocks and synced, allocated 16 MiB ahead and written back as they go, \
         as the recorder writes; replay = the uncompressed file published again reliably \
         into a subscription; payloads pseudo-random (incompressible); median of {} runs \
         (each run measures disk and modes in turn); files in {}",
        a.runs,
        dir.display()
    );
    println!(
        "# cpu_ns = this process's CPU time (every thread: publisher, both nodes' I/O, the \
         receiving loop with its recording) over the samples; loop_ns = the receiving loop's \
         thread alone (what sets the rate where a core is spare for the others); medians of \
         the runs"
    );
    println!(
        "{:>9} {:>8} {:>14} {:>10} {:>9} {:>8} {:>8} {:>8}",
        "size", "mode", "samples/s", "MB/s", "of sub", "of disk", "cpu_ns", "loop_ns"
    );
    let mut modes = vec![("sub", Mode::Subscriber)];
    for m in &a.modes {
        let c: Compression = m
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--modes: {e}"))?;
        // Only the three names parse: each is its mode's name.
        if !modes.iter().any(|(n, _)| *n == m) {
            modes.push((m.as_str(), Mode::Record(c)));
        }
    }
    for &size in &a.sizes {
        let n = samples_for(size, a.bytes, a.max_samples);
        let mb = |rate: f64| rate * size as f64 / 1e6;
        // Each run measures the disk and every mode one after the other,
        // so that all see the same machine (this disk's speed varies from
        // one second to the next); the medians are of the runs.
        let mut disk = Vec::new();
        let mut rates = vec![Vec::new(); modes.len()];
        let mut cpus = vec![Vec::new(); modes.len()];
        let mut loops = vec![Vec::new(); modes.len()];
        let mut replay = Vec::new();
        let mut writer = Vec::new();
        for run in 0..a.runs {
            disk.push(disk_rate(dir, n * size as u64)?);
            writer.push(writer_rate(dir, size, n)?);
            for (i, (name, mode)) in modes.iter().enumerate() {
                let key = format!("bench/rec/{size}/{name}/{run}");
                let file = dir.join(format!("{size}-{name}-{run}.mcap"));
                let (rate, cpu, lp) =
                    one_run(&publisher, &subscriber, &key, size, n, *mode, &file)?;
                rates[i].push(rate);
                cpus[i].push(cpu);
                loops[i].push(lp);
                if *name == "none" {
                    replay.push(replay_rate(&publisher, &subscriber, &file, size, n, run)?);
                }
                let _ = std::fs::remove_file(&file);
            }
        }
        let disk = median(disk);
        let sub_rate = median(rates[0].clone());
        for ((((name, _), r), c), l) in modes.iter().zip(rates).zip(cpus).zip(loops) {
            let rate = median(r);
            println!(
                "{size:>9} {name:>8} {rate:>14.0} {:>10.1} {:>9.2} {:>8.2} {:>8.0} {:>8.0}",
                mb(rate),
                rate / sub_rate,
                mb(rate) / disk,
                median(c),
                median(l)
            );
        }
        println!(
            "{size:>9} {:>8} {:>14.0} {disk:>10.1} {:>9} {:>8.2}",
            "disk",
            disk * 1e6 / size as f64,
            "",
            1.0
        );
        if !replay.is_empty() {
            let replay = median(replay);
            println!(
                "{size:>9} {:>8} {replay:>14.0} {:>10.1} {:>9.2} {:>8}",
                "replay",
                mb(replay),
                replay / sub_rate,
                ""
            );
        }
        let writer = median(writer);
        println!(
            "{size:>9} {:>8} {writer:>14.0} {:>10.1} {:>9} {:>8.2}  ({:.0} ns a sample)",
            "writer",
            mb(writer),
            "",
            mb(writer) / disk,
            1e9 / writer
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Waits until `pubs` all see a subscriber.
fn wait_matched(p: &milonga::Publisher) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(20);
    while p.subscriber_count() == 0 {
        if Instant::now() > end {
            bail!(
                "the subscription never reached the publisher of {}",
                p.key()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// One measurement: samples per second, and the CPU time per sample (ns)
/// of the process and of the receiving loop's thread.
fn one_run(
    publisher: &Node,
    subscriber: &Node,
    key: &str,
    size: usize,
    n: u64,
    mode: Mode,
    file: &Path,
) -> Result<(f64, f64, f64)> {
    let sub = subscriber.subscribe_with(key, SubscriberQos::default().reliable())?;
    let p = publisher.publisher_with(key, PublisherQos::reliable())?;
    wait_matched(&p)?;
    let mut writer = match mode {
        Mode::Subscriber => None,
        Mode::Record(compression) => Some(RecordWriter::create(
            file,
            &RecordOptions {
                compression,
                ..RecordOptions::default()
            },
        )?),
    };
    // Pseudo-random bytes: compression gains nothing on them and costs
    // what it costs (the worst case; measured data compresses somewhat).
    let mut x: u32 = 0x9e37_79b9;
    let noise: Vec<u8> = (0..size)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect();
    let value = Value::Bytes(Bytes::from(noise));
    let cpu0 = crate::ffi::cpu_time_ns();
    let loop0 = crate::ffi::thread_cpu_time_ns();
    let started = Instant::now();
    // The publisher comes back, to be dropped once everything arrived.
    let sender = std::thread::spawn(move || -> Result<milonga::Publisher> {
        for _ in 0..n {
            p.put(value.clone())?;
        }
        Ok(p)
    });
    let mut got = 0u64;
    let mut looks = crate::record::Looks::default();
    while got < n {
        // Recording takes events as `milonga record` does, with their
        // receive times; the subscriber alone as a plain subscriber would.
        let (event, at) = match writer {
            Some(_) => sub.recv_timeout_stamped(Duration::from_secs(30))?,
            None => (sub.recv_timeout(Duration::from_secs(30))?, 0),
        };
        match event {
            Event::Sample(s) => {
                got += 1;
                if s.seq != got {
                    bail!("{key}: sample {} where {got} was due: not loss-free", s.seq);
                }
                // What `milonga record`'s loop does with a sample: its
                // receive time read, its record written, the timers looked
                // at when due.
                if let Some(w) = writer.as_mut() {
                    let written = w.bytes();
                    w.sample(&s, at)?;
                    if looks.after_event(at, w.bytes() != written) {
                        w.tick()?;
                    }
                }
            }
            Event::Lost(l) => bail!("{key}: {} samples lost", l.count),
            _ => {}
        }
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    let took = started.elapsed();
    let lp = crate::ffi::thread_cpu_time_ns().saturating_sub(loop0);
    let cpu = crate::ffi::cpu_time_ns().saturating_sub(cpu0);
    let p = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the sending thread panicked"))??;
    drop((p, sub));
    Ok((
        n as f64 / took.as_secs_f64(),
        cpu as f64 / n as f64,
        lp as f64 / n as f64,
    ))
}

/// `RecordWriter::sample` alone (uncompressed, payloads of the same size:
/// their bytes do not matter without compression; no network): samples
/// per second, the file finished and synced.
fn writer_rate(dir: &Path, size: usize, n: u64) -> Result<f64> {
    let path = dir.join("writer.mcap");
    let mut w = RecordWriter::create(
        &path,
        &RecordOptions {
            compression: Compression::None,
            ..RecordOptions::default()
        },
    )?;
    let mut s = milonga::Sample {
        key: format!("bench/writer/{size}"),
        value: Value::Bytes(Bytes::from(vec![0x5au8; size])),
        publisher: milonga::NodeId([1; 16]),
        seq: 0,
        timestamp_ns: 0,
        encoding: milonga::Encoding::Raw,
        schema_id: 0,
        replayed: false,
        compact: None,
    };
    let started = Instant::now();
    for i in 1..=n {
        s.seq = i;
        s.timestamp_ns = i;
        w.sample(&s, i)?;
    }
    w.finish()?;
    let took = started.elapsed();
    std::fs::remove_file(&path)?;
    Ok(n as f64 / took.as_secs_f64())
}

/// The disk's sequential write speed, MB/s: `bytes` in 1 MiB blocks, then
/// synced, written as the recorder writes (blocks allocated 16 MiB ahead,
/// each block's writeback started as it is written), so that the recorder
/// is not compared with weaker I/O than its own.
fn disk_rate(dir: &Path, bytes: u64) -> Result<f64> {
    const AHEAD: u64 = 16 << 20;
    let path = dir.join("disk.bin");
    let block = vec![0x5au8; 1 << 20];
    let started = Instant::now();
    let mut f = std::fs::File::create(&path)?;
    let (mut pos, mut allocated) = (0u64, 0u64);
    while pos < bytes {
        let n = (bytes - pos).min(block.len() as u64);
        if pos + n > allocated {
            milonga::recording::io::preallocate(&f, allocated, pos + n + AHEAD - allocated);
            allocated = pos + n + AHEAD;
        }
        f.write_all(&block[..n as usize])?;
        milonga::recording::io::start_writeback(&f, pos, n);
        pos += n;
    }
    f.set_len(bytes)?;
    f.sync_all()?;
    let took = started.elapsed();
    drop(f);
    std::fs::remove_file(&path)?;
    Ok(bytes as f64 / 1e6 / took.as_secs_f64())
}

/// Replays `file` (N samples) reliably into a subscription: samples per
/// second, from the first read to the last sample received.
fn replay_rate(
    publisher: &Node,
    subscriber: &Node,
    file: &Path,
    size: usize,
    n: u64,
    run: usize,
) -> Result<f64> {
    let key = format!("bench/replay/{size}/{run}");
    let sub = subscriber.subscribe_with(&key, SubscriberQos::default().reliable())?;
    let p = publisher.publisher_with(&key, PublisherQos::reliable().replay())?;
    wait_matched(&p)?;
    let file = file.to_path_buf();
    let started = Instant::now();
    let sender = std::thread::spawn(move || -> Result<(u64, milonga::Publisher)> {
        let mut sent = 0;
        let mut r = RecordReader::open(&file)?;
        while let Some(e) = r.next_entry()? {
            if let Entry::Sample(s, _) = e {
                p.put_at(s.value, s.timestamp_ns)?;
                sent += 1;
            }
        }
        Ok((sent, p))
    });
    let mut got = 0u64;
    while got < n {
        match sub.recv_timeout(Duration::from_secs(30))? {
            Event::Sample(_) => got += 1,
            Event::Lost(l) => bail!("replay: {} samples lost", l.count),
            _ => {}
        }
    }
    let took = started.elapsed();
    let (sent, p) = sender
        .join()
        .map_err(|_| anyhow::anyhow!("the replaying thread panicked"))??;
    drop((p, sub));
    if sent != n {
        bail!("the recording held {sent} samples, not {n}");
    }
    Ok(n as f64 / took.as_secs_f64())
}
