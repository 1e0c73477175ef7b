//! `milonga bench scale`: seed 004's scalability tests (one publisher to
//! many subscribers, many publishers to one, many to many), for Milonga
//! and for raw libzmq in the same run.
//!
//! Every publisher and every subscriber is a node of its own (a raw PUB or
//! SUB socket for libzmq); they run as threads of at most `--processes`
//! worker processes per side (the output says how many), because 200
//! processes do not fit a small machine. Each publisher puts `--puts`
//! samples at `--rate` a second (a tenth, at least 10, at 1 MiB), best
//! effort; each subscriber takes every publisher's key. Measured: the time
//! `put` takes (seed 004's "write" latency), the end-to-end latency from
//! the source timestamp to the subscriber's `recv`, the samples each
//! subscriber got a second while the publishers sent, and the CPU time of
//! every worker process per delivered sample.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::{Bytes, Event, Node, PublisherQos, Value};
use serde::{Deserialize, Serialize};

use crate::bench::{Format, Outcome, Place, Role};

#[derive(Args, Debug)]
pub struct ScaleArgs {
    /// Cells: publishers x subscribers.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1x1,1x10,1x50,1x100,100x1,10x10,100x100"
    )]
    cases: Vec<String>,
    /// Payload sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "92,4096,1048576")]
    sizes: Vec<usize>,
    /// Puts per publisher (a tenth, at least 10, at 1 MiB and above).
    #[arg(long, default_value_t = 100)]
    puts: usize,
    /// Puts a second per publisher (a tenth at 1 MiB and above).
    #[arg(long, default_value_t = 100.0, value_parser = crate::args::rate)]
    rate: f64,
    /// Most worker processes per side; more nodes are threads of these.
    #[arg(long, default_value_t = 10)]
    processes: usize,
    /// Most bytes a cell may deliver in all (publishers x puts x
    /// subscribers x size); a cell above is skipped, and said so (100 x
    /// 100 at 1 MiB would move 100 GB).
    #[arg(long, default_value_t = 1 << 30)]
    max_bytes: u64,
    /// Leave out the raw libzmq rows.
    #[arg(long)]
    no_raw: bool,
    /// Output: a table, or CSV.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// Latencies in buckets 2% wide (microseconds): what workers send back,
/// merged for percentiles.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub(crate) struct Hist(BTreeMap<i32, u64>);

impl Hist {
    fn bucket(us: f64) -> i32 {
        (us.max(0.1).ln() / 1.02f64.ln()).floor() as i32
    }

    pub(crate) fn add(&mut self, us: f64) {
        *self.0.entry(Self::bucket(us)).or_insert(0) += 1;
    }

    fn merge(&mut self, o: &Hist) {
        for (b, n) in &o.0 {
            *self.0.entry(*b).or_insert(0) += n;
        }
    }

    fn count(&self) -> u64 {
        self.0.values().sum()
    }

    /// The value at quantile `q` (the bucket's upper edge), 0 if empty.
    fn quantile(&self, q: f64) -> f64 {
        let n = self.count();
        if n == 0 {
            return 0.0;
        }
        let rank = ((n as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, c) in &self.0 {
            seen += c;
            if seen >= rank {
                return 1.02f64.powi(b + 1);
            }
        }
        0.0
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Splits `n` nodes over at most `procs` processes: the count each gets.
fn split(n: usize, procs: usize) -> Vec<usize> {
    let p = n.min(procs.max(1));
    (0..p).map(|i| n / p + usize::from(i < n % p)).collect()
}

fn parse_case(c: &str) -> Result<(usize, usize)> {
    let (p, s) = c
        .split_once('x')
        .with_context(|| format!("case {c}: expected PUBSxSUBS, as 1x100"))?;
    let (p, s) = (p.trim().parse::<usize>()?, s.trim().parse::<usize>()?);
    if p == 0 || s == 0 || p > 1000 || s > 1000 {
        bail!("case {c}: 1 to 1000 publishers and subscribers");
    }
    Ok((p, s))
}

struct Row {
    system: &'static str,
    pubs: usize,
    subs: usize,
    size: usize,
    pub_procs: usize,
    sub_procs: usize,
    put: Hist,
    e2e: Hist,
    expected: u64,
    received: u64,
    per_sub_rate: f64,
    cpu_us_per_sample: f64,
}

/// Runs `milonga bench scale`.
pub fn run(a: ScaleArgs) -> Result<std::process::ExitCode> {
    let cases: Vec<(usize, usize)> = a
        .cases
        .iter()
        .map(|c| parse_case(c))
        .collect::<Result<_>>()?;
    let tmp = std::env::temp_dir().join(format!("mlg-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    eprintln!(
        "# milonga bench scale: seed 004's cases, each publisher and subscriber a node (raw: a socket) of its own, as threads of at most {} worker processes per side; best effort over tcp on one host; each publisher puts {} samples at {}/s (a tenth, at least 10, at 1 MiB); put = the time `put` (raw: `send`) takes; e2e = source timestamp to `recv`; per-sub rate = samples a subscriber got a second, from its first to its last (the publishers together put pubs x rate a second); cpu = CPU time of all worker processes per delivered sample: subscribers from when every one of the process has subscribed (their connections to the publishers included) until the last is done (a subscriber that heard from every publisher and then got nothing for 3 s is), publishers from the first put to the last (what their I/O threads send after is left out), closing left out",
        a.processes, a.puts, a.rate
    );
    eprintln!("{}", crate::bench::IN_TURN);
    let mut rows = Vec::new();
    let mut cell = 0;
    let mut turn = 0;
    for &size in &a.sizes {
        for &(pubs, subs) in &cases {
            let big = size >= 1 << 20;
            let puts = if big { (a.puts / 10).max(10) } else { a.puts };
            let total = (pubs * subs * puts) as u64 * size as u64;
            if total > a.max_bytes {
                eprintln!(
                    "# skipped {pubs}x{subs} at {size} B: it would deliver {:.1} GB, over --max-bytes",
                    total as f64 / 1e9
                );
                continue;
            }
            let systems: &[&'static str] = if a.no_raw {
                &["milonga"]
            } else {
                &["raw-zmq", "milonga"]
            };
            turn += 1;
            for system in crate::bench::in_turn(systems, turn) {
                cell += 1;
                match run_cell(&a, system, pubs, subs, size, cell, &tmp) {
                    Ok(row) => {
                        if a.format == Format::Table {
                            print_row(&row, rows.is_empty());
                        }
                        rows.push(row);
                    }
                    // Said, and the run goes on with the next cell.
                    Err(e) => eprintln!("# {system} {pubs}x{subs} at {size} B failed: {e:#}"),
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    if a.format == Format::Csv {
        println!("system,publishers,subscribers,payload_bytes,pub_processes,sub_processes,put_p50_us,put_p99_us,e2e_p50_us,e2e_p99_us,delivered,expected,per_sub_rate_per_s,cpu_us_per_sample");
        for r in &rows {
            println!(
                "{},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{},{},{:.0},{:.2}",
                r.system,
                r.pubs,
                r.subs,
                r.size,
                r.pub_procs,
                r.sub_procs,
                r.put.quantile(0.5),
                r.put.quantile(0.99),
                r.e2e.quantile(0.5),
                r.e2e.quantile(0.99),
                r.received,
                r.expected,
                r.per_sub_rate,
                r.cpu_us_per_sample
            );
        }
    }
    // The cost per subscriber as subscribers are added (one publisher).
    for system in ["raw-zmq", "milonga"] {
        for &size in &a.sizes {
            let cost = |n: usize| {
                rows.iter()
                    .find(|r| r.system == system && r.size == size && r.pubs == 1 && r.subs == n)
                    .map(|r| r.cpu_us_per_sample)
            };
            if let (Some(c10), Some(c100)) = (cost(10), cost(100)) {
                eprintln!(
                    "# {system} {size} B: CPU per delivered sample {c10:.2} us at 10 subscribers, {c100:.2} us at 100: {:.2}x",
                    c100 / c10
                );
            }
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_row(r: &Row, header: bool) {
    if header {
        println!(
            "{:<8} {:>4} {:>4} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12} {:>9} {:>8}",
            "system",
            "pubs",
            "subs",
            "bytes",
            "procs",
            "put p50",
            "put p99",
            "e2e p50",
            "e2e p99",
            "delivered",
            "per sub/s",
            "cpu us"
        );
    }
    println!(
        "{:<8} {:>4} {:>4} {:>8} {:>3}+{:<3} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>12} {:>9.0} {:>8.2}",
        r.system,
        r.pubs,
        r.subs,
        r.size,
        r.pub_procs,
        r.sub_procs,
        r.put.quantile(0.5),
        r.put.quantile(0.99),
        r.e2e.quantile(0.5),
        r.e2e.quantile(0.99),
        format!("{}/{}", r.received, r.expected),
        r.per_sub_rate,
        r.cpu_us_per_sample
    );
}

fn run_cell(
    a: &ScaleArgs,
    system: &'static str,
    pubs: usize,
    subs: usize,
    size: usize,
    cell: usize,
    tmp: &std::path::Path,
) -> Result<Row> {
    let big = size >= 1 << 20;
    let puts = if big { (a.puts / 10).max(10) } else { a.puts };
    let rate = if big { a.rate / 10.0 } else { a.rate };
    let raw = system == "raw-zmq";
    let at = Place {
        address: format!("milonga:///bench-scale-{}-{cell}", std::process::id()),
        runtime_dir: tmp.display().to_string(),
        transport: "tcp".into(),
        // Queues of at most 4 MiB a connection (16 at the least): a
        // hundred subscribers of a hundred publishers hold 10,000.
        hwm: ((4usize << 20) / size.max(1)).clamp(16, 1000) as i32,
        history: 0,
        keys: None,
        spin_us: 0,
        no_shm: false,
        loan: false,
        shm_small: None,
    };
    // Raw: each publisher binds an endpoint of its own, every subscriber
    // connects to all. Ports below the kernel's ephemeral range (32768):
    // one taken at random could meanwhile become the local port of a
    // connection the run makes.
    let base = 10_000 + (std::process::id() as usize % 20) * 1000;
    let endpoints: Vec<String> = if raw {
        (0..pubs)
            .map(|i| format!("tcp://127.0.0.1:{}", base + i))
            .collect()
    } else {
        Vec::new()
    };
    let expect = (pubs * puts) as u64;
    // Longer than publishers wait for their subscribers (60 s), then the
    // sending, and a slow end.
    let deadline_s = 90.0 + puts as f64 / rate * 3.0;
    let mut roles = Vec::new();
    for n in split(subs, a.processes) {
        roles.push(Role::ScaleSub {
            at: at.clone(),
            raw,
            endpoints: endpoints.clone(),
            count: n,
            pubs,
            expect,
            deadline_s,
        });
    }
    let sub_procs = roles.len();
    let mut first = 0;
    for n in split(pubs, a.processes) {
        roles.push(Role::ScalePub {
            at: at.clone(),
            raw,
            endpoints: endpoints
                .get(first..first + n)
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            first,
            count: n,
            subs,
            size,
            puts,
            rate,
        });
        first += n;
    }
    let pub_procs = roles.len() - sub_procs;
    let outcomes = crate::bench::start_workers(roles)?;
    let (mut put, mut e2e) = (Hist::default(), Hist::default());
    let (mut received, mut cpu_ns, mut rates) = (0u64, 0u64, 0f64);
    for (i, o) in outcomes.iter().enumerate() {
        cpu_ns += o.cpu_ns;
        if i < sub_procs {
            e2e.merge(&o.hist);
            received += o.received;
            rates += o.rate_sum;
        } else {
            put.merge(&o.hist);
        }
    }
    Ok(Row {
        system,
        pubs,
        subs,
        size,
        pub_procs,
        sub_procs,
        put,
        e2e,
        expected: expect * subs as u64,
        received,
        per_sub_rate: rates / subs as f64,
        cpu_us_per_sample: if received > 0 {
            cpu_ns as f64 / 1000.0 / received as f64
        } else {
            0.0
        },
    })
}

/// The key publisher `i` of a cell puts on.
fn key_of(i: usize) -> String {
    format!("scale/p{i}")
}

/// A worker's publishers: `count` nodes (raw: PUB sockets), each waiting
/// for `subs` subscribers, then putting `puts` samples at `rate`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scale_pub(
    at: &Place,
    raw: bool,
    endpoints: &[String],
    first: usize,
    count: usize,
    subs: usize,
    size: usize,
    puts: usize,
    rate: f64,
) -> Result<Outcome> {
    let ctx = zmq::Context::new();
    let gate = std::sync::Arc::new(Gate::new(count));
    let threads: Vec<_> = (0..count)
        .map(|k| {
            let at = at.clone();
            let ctx = ctx.clone();
            let endpoint = endpoints.get(k).cloned();
            let gate = gate.clone();
            std::thread::spawn(move || -> Result<(Hist, f64)> {
                gate.clone().guard(|| {
                    // Every publisher starts putting at once.
                    let started = || gate.pass();
                    let mut hist = Hist::default();
                    let period = Duration::from_secs_f64(1.0 / rate);
                    // The timestamp, then the publisher's index (raw
                    // samples carry no key to tell them apart).
                    let index = ((first + k) as u64).to_le_bytes();
                    let mut payload = vec![0x5au8; size.max(16)];
                    payload[8..16].copy_from_slice(&index);
                    if raw {
                        let mut s = ctx.socket(zmq::XPUB)?;
                        s.set_sndhwm(at.hwm)?;
                        s.set_xpub_verbose(true)?;
                        s.bind(
                            endpoint
                                .as_deref()
                                .context("an endpoint per raw publisher")?,
                        )?;
                        // Every subscriber's subscription, then go.
                        let mut seen = 0;
                        let until = Instant::now() + Duration::from_secs(60);
                        while seen < subs {
                            if Instant::now() > until {
                                bail!("raw publisher: {seen} of {subs} subscribers in 60 s");
                            }
                            if s.poll(zmq::POLLIN, 100)? > 0 {
                                let m = s.recv_bytes(0)?;
                                if m.first() == Some(&1) {
                                    seen += 1;
                                }
                            }
                        }
                        started()?;
                        // Large payloads leave without a copy (as Milonga's
                        // do): the timestamp in a frame of its own, then
                        // one shared buffer; small ones in one frame.
                        let zero_copy = size >= 64 << 10;
                        let shared = Bytes::from(payload.clone());
                        let t0 = Instant::now();
                        for n in 0..puts {
                            pace(t0, period, n);
                            let mut stamp = [0u8; 16];
                            stamp[..8].copy_from_slice(&now_ns().to_le_bytes());
                            stamp[8..].copy_from_slice(&index);
                            let t = Instant::now();
                            if zero_copy {
                                s.send(&stamp[..], zmq::SNDMORE)?;
                                crate::ffi::send_shared(&mut s, &shared)?;
                            } else {
                                payload[..8].copy_from_slice(&stamp[..8]);
                                s.send(&payload[..], 0)?;
                            }
                            hist.add(t.elapsed().as_secs_f64() * 1e6);
                        }
                        let secs = t0.elapsed().as_secs_f64();
                        gate.done();
                        // The last ones leave before the socket closes.
                        s.set_linger(5000)?;
                        Ok((hist, secs))
                    } else {
                        let node = Node::open_with(crate::bench::mlg_config(
                            &at,
                            &format!("scale-pub-{}", first + k),
                        )?)?;
                        let p =
                            node.publisher_with(&key_of(first + k), PublisherQos::best_effort())?;
                        let until = Instant::now() + Duration::from_secs(60);
                        while (p.subscriber_count() as usize) < subs {
                            if Instant::now() > until {
                                // What the node saw, to tell a publisher
                                // nobody found from one nobody could reach.
                                let st = node.stats();
                                bail!(
                                    "publisher {}: {} of {subs} subscribers in 60 s (its node knows {} peers; subscription messages {}, handshakes failed {}, accepts failed {}, peer disconnects {})",
                                    first + k,
                                    p.subscriber_count(),
                                    node.peer_count(),
                                    st.subscription_messages,
                                    st.handshakes_failed,
                                    st.accepts_failed,
                                    st.peer_disconnects,
                                );
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        started()?;
                        let value = Value::Bytes(Bytes::from(payload));
                        let t0 = Instant::now();
                        for n in 0..puts {
                            pace(t0, period, n);
                            let t = Instant::now();
                            p.put(value.clone())?;
                            hist.add(t.elapsed().as_secs_f64() * 1e6);
                        }
                        let secs = t0.elapsed().as_secs_f64();
                        gate.done();
                        drop(p);
                        node.close();
                        Ok((hist, secs))
                    }
                })
            })
        })
        .collect();
    let mut out = Outcome::default();
    let mut failed = Vec::new();
    for t in threads {
        match t
            .join()
            .map_err(|_| anyhow::anyhow!("a publisher thread panicked"))
            .and_then(|r| r)
        {
            Ok((h, secs)) => {
                out.hist.merge(&h);
                out.seconds = out.seconds.max(secs);
                out.sent += puts as u64;
            }
            Err(e) => failed.push(e),
        }
    }
    // Every publisher's own failure is said, not only the first: which
    // of them missed their subscribers, and how many each saw.
    let mut failed = failed.into_iter();
    if let Some(first) = failed.next() {
        for e in failed.filter(|e| !e.to_string().starts_with(GATE_FAILED)) {
            eprintln!("# also: {e:#}");
        }
        return Err(first);
    }
    out.cpu_ns = gate.cpu_used();
    Ok(out)
}

/// What a thread waiting at the gate says when another failed.
const GATE_FAILED: &str = "another thread of this worker failed";

/// Where the threads of a worker wait for each other (every publisher set
/// up, every subscriber subscribed), noting the process's CPU time then.
/// A thread that fails before it comes opens the gate for the others
/// (they fail too, instead of waiting forever), as does a minute.
struct Gate {
    count: usize,
    arrived: std::sync::atomic::AtomicUsize,
    failed: std::sync::atomic::AtomicBool,
    cpu0: std::sync::atomic::AtomicU64,
    /// Threads done with the work measured, and the CPU time when the
    /// last was.
    finished: std::sync::atomic::AtomicUsize,
    cpu1: std::sync::atomic::AtomicU64,
}

impl Gate {
    fn new(count: usize) -> Gate {
        Gate {
            count,
            arrived: 0.into(),
            failed: false.into(),
            cpu0: 0.into(),
            finished: 0.into(),
            cpu1: 0.into(),
        }
    }

    /// A thread is done with the work measured (its node is closed
    /// after: closing is not part of it).
    fn done(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.finished.fetch_add(1, SeqCst) + 1 == self.count {
            self.cpu1.store(process_cpu_ns(), SeqCst);
        }
    }

    /// Waits until every thread came.
    fn pass(&self) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.arrived.fetch_add(1, SeqCst) + 1 == self.count {
            self.cpu0.store(process_cpu_ns(), SeqCst);
        }
        let until = Instant::now() + Duration::from_secs(60);
        while self.arrived.load(SeqCst) < self.count {
            if self.failed.load(SeqCst) {
                bail!("{GATE_FAILED}");
            }
            if Instant::now() > until {
                bail!("the other threads of this worker did not come in 60 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Runs a thread's work; if it fails, the others stop waiting.
    fn guard<T>(self: std::sync::Arc<Self>, work: impl FnOnce() -> Result<T>) -> Result<T> {
        let r = work();
        if r.is_err() {
            self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        r
    }

    /// CPU time between every thread passing and the last being done.
    fn cpu_used(&self) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        self.cpu1
            .load(SeqCst)
            .saturating_sub(self.cpu0.load(SeqCst))
    }
}

/// This process's CPU time, every thread's, those that ended too (a
/// node's threads end when it closes).
fn process_cpu_ns() -> u64 {
    crate::ffi::cpu_time_ns()
}

/// Sleeps until put `n` of a publisher that began at `t0` is due.
fn pace(t0: Instant, period: Duration, n: usize) {
    let due = t0 + period * n as u32;
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    }
}

/// Whether a subscriber that got its last sample at `last` has waited
/// long enough for more: what did not come in 3 s was dropped (best
/// effort), and is counted as not delivered.
fn idle(last: Option<Instant>) -> bool {
    last.is_some_and(|l| l.elapsed() > Duration::from_secs(3))
}

/// The publishers a subscriber heard from. A subscriber idle for 3 s is
/// done only once it heard from every publisher (raw), or from every
/// publisher discovery still shows (Milonga: one that closed will send
/// nothing more): a publisher starts when all its subscribers are there,
/// so one may start long after another is done, and a subscriber gone
/// meanwhile would keep it waiting.
struct Heard(Vec<bool>);

impl Heard {
    fn new(pubs: usize) -> Heard {
        Heard(vec![false; pubs])
    }

    fn note(&mut self, i: usize) {
        if let Some(h) = self.0.get_mut(i) {
            *h = true;
        }
    }

    fn all(&self) -> bool {
        self.0.iter().all(|h| *h)
    }

    /// Whether a publisher not heard from is among `peers`.
    fn waits_for(&self, peers: &[milonga::Announcement]) -> bool {
        peers.iter().flat_map(|a| &a.publications).any(|p| {
            p.key
                .strip_prefix("scale/p")
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| self.0.get(i) == Some(&false))
        })
    }
}

/// A worker's subscribers: `count` nodes (raw: SUB sockets connected to
/// every publisher), each taking every sample until `expect` came or the
/// deadline passed.
pub(crate) fn scale_sub(
    at: &Place,
    raw: bool,
    endpoints: &[String],
    count: usize,
    pubs: usize,
    expect: u64,
    deadline_s: f64,
) -> Result<Outcome> {
    let ctx = zmq::Context::new();
    let gate = std::sync::Arc::new(Gate::new(count));
    let threads: Vec<_> = (0..count)
        .map(|k| {
            let at = at.clone();
            let ctx = ctx.clone();
            let endpoints = endpoints.to_vec();
            let gate = gate.clone();
            std::thread::spawn(move || -> Result<(Hist, u64, f64)> {
                gate.clone().guard(|| {
                    // The process's CPU time is noted once every subscriber
                    // is set up.
                    let set_up = || gate.pass();
                    let mut hist = Hist::default();
                    let mut got = 0u64;
                    let mut first = None::<Instant>;
                    let mut last = None::<Instant>;
                    let mut heard = Heard::new(pubs);
                    let until = Instant::now() + Duration::from_secs_f64(deadline_s);
                    if raw {
                        let s = ctx.socket(zmq::SUB)?;
                        s.set_rcvhwm(at.hwm)?;
                        s.set_subscribe(b"")?;
                        for e in &endpoints {
                            s.connect(e)?;
                        }
                        set_up()?;
                        while got < expect && Instant::now() < until && !(idle(last) && heard.all())
                        {
                            if s.poll(zmq::POLLIN, 100)? == 0 {
                                continue;
                            }
                            last = Some(Instant::now());
                            first.get_or_insert(Instant::now());
                            // One frame, its first 16 bytes the timestamp
                            // and the publisher's index, or those then the
                            // payload.
                            let m = s.recv_bytes(0)?;
                            while s.get_rcvmore()? {
                                s.recv_bytes(0)?;
                            }
                            if m.len() >= 16 {
                                let sent = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
                                hist.add(now_ns().saturating_sub(sent) as f64 / 1000.0);
                                let i = u64::from_le_bytes(m[8..16].try_into().expect("8 bytes"));
                                heard.note(i as usize);
                            }
                            got += 1;
                        }
                        gate.done();
                    } else {
                        let node = Node::open_with(crate::bench::mlg_config(
                            &at,
                            &format!("scale-sub-{k}"),
                        )?)?;
                        let sub = node.subscribe("scale/**")?;
                        set_up()?;
                        while got < expect
                            && Instant::now() < until
                            && !(idle(last) && (heard.all() || !heard.waits_for(&node.peers())))
                        {
                            match sub.recv_timeout(Duration::from_millis(100)) {
                                Ok(Event::Sample(s)) => {
                                    hist.add(
                                        now_ns().saturating_sub(s.timestamp_ns) as f64 / 1000.0,
                                    );
                                    got += 1;
                                    if let Some(i) =
                                        s.key.strip_prefix("scale/p").and_then(|i| i.parse().ok())
                                    {
                                        heard.note(i);
                                    }
                                    last = Some(Instant::now());
                                    first.get_or_insert(Instant::now());
                                }
                                Ok(_) | Err(milonga::RecvError::Timeout) => {}
                                Err(e) => bail!("subscriber {k}: {e}"),
                            }
                        }
                        gate.done();
                        drop(sub);
                        node.close();
                    }
                    // Samples a second from its first to its last.
                    let rate = match (first, last) {
                        (Some(f), Some(l)) if got > 1 && l > f => {
                            (got - 1) as f64 / (l - f).as_secs_f64()
                        }
                        _ => 0.0,
                    };
                    Ok((hist, got, rate))
                })
            })
        })
        .collect();
    let mut out = Outcome::default();
    for t in threads {
        let (h, got, rate) = t
            .join()
            .map_err(|_| anyhow::anyhow!("a subscriber thread panicked"))??;
        out.hist.merge(&h);
        out.received += got;
        out.rate_sum += rate;
    }
    out.cpu_ns = gate.cpu_used();
    Ok(out)
}
