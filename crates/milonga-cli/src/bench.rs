//! `milonga bench`: Milonga side by side with raw libzmq, in one run.
//!
//! pubsub: one publisher process and N subscriber processes (threads of one
//! process for inproc). The publisher waits until all N subscriptions have
//! reached it, sends as fast as it can for `--duration` seconds, then sends
//! an end marker (an empty message). Each subscriber counts what it got
//! between its first and its last data message: events/s = received /
//! (t_last - t_first). lost = sent - received, measured the same way for
//! both systems. High-water marks: the number of messages that fit in
//! 64 MiB, between 16 and 10,000, for raw libzmq's sockets and Milonga's
//! subscribers and best-effort publishers; a reliable Milonga publisher
//! keeps its default `reliable_send_hwm` (16 messages, each a sample or a
//! batch of at most 128 KiB).
//!
//! The raw baseline is libzmq as a careful user would write it: one XPUB
//! (lossy for best effort, XPUB_NODROP and blocking sends for reliable),
//! SUB sockets subscribed to everything, one frame per message, no
//! encoding, no header.
//!
//! latency: two processes ping-pong one message at a time over PUB/SUB in
//! each direction; the figures are one-way, half of each round trip.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use milonga::{Bytes, Config, Event, Node, PublisherQos, RecvError, Transport, Value};
use serde::{Deserialize, Serialize};

use crate::NetArgs;

/// Options of `milonga bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    kind: BenchKind,
}

#[derive(Subcommand, Debug)]
enum BenchKind {
    /// Events per second per subscriber: 1 publisher, N subscribers.
    Pubsub(PubsubArgs),
    /// Ping-pong latency, one message in flight.
    Latency(LatencyArgs),
    /// Resident memory of an idle node (one publisher, one subscription).
    Idle(IdleArgs),
    /// How fast a subscriber learns that a publisher died, froze or restarted.
    Liveliness(crate::bench_liveliness::LivelinessArgs),
    /// Request/reply calls per second and latency, 1..100 client processes.
    Rpc(crate::bench_rpc::RpcArgs),
    /// How long N node processes of one host take to find each other, and
    /// to see a fifth of them replaced.
    Discovery(crate::bench_discovery::DiscoveryArgs),
    /// N peer-to-peer nodes finding each other through one registry: a
    /// broker (`registry`) and etcd (`discovery = etcd`).
    Registry(crate::bench_registry::RegistryArgs),
    /// How soon a call ends when nobody serves it, its deadline passes or
    /// its server is killed.
    Deadlines(crate::bench_deadlines::DeadlinesArgs),
    /// What recording to MCAP costs: rate against a subscriber alone and
    /// against the disk, and the replay rate.
    Record(crate::bench_record::RecordArgs),
    /// Seed 003: serialization formats (CDR, JSON, CBOR) and compression
    /// (LZ4, zstd, zlib) on a track record: efficiency, codec time, RTT.
    Encoding(crate::bench_encoding::EncodingArgs),
    /// Seed 004's scalability tests: 1 publisher to 100 subscribers, 100
    /// to 1, 100 to 100; put and end-to-end latency, rate per subscriber,
    /// CPU per delivered sample, raw libzmq in the same run.
    Scale(crate::bench_scale::ScaleArgs),
}

#[derive(Args, Debug)]
struct IdleArgs {
    /// Seconds to stay idle before measuring.
    #[arg(long, default_value_t = 3.0, value_parser = crate::args::seconds)]
    duration: f64,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Table,
    Csv,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Baseline {
    /// Raw libzmq PUB/SUB in the same run.
    RawZmq,
    /// No baseline.
    None,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Mode {
    Reliable,
    BestEffort,
}

#[derive(Args, Debug)]
struct PubsubArgs {
    /// Payload sizes in bytes.
    #[arg(long, default_value = "92,4096,1048576", value_delimiter = ',', value_parser = crate::args::payload_size)]
    sizes: Vec<usize>,
    /// Numbers of subscriber processes.
    #[arg(long, default_value = "1,2,5,10", value_delimiter = ',')]
    subs: Vec<usize>,
    /// Delivery mode.
    #[arg(long, value_enum, default_value = "reliable")]
    mode: Mode,
    /// Seconds of sending per cell.
    #[arg(long, default_value_t = 2.0, value_parser = crate::args::positive_seconds)]
    duration: f64,
    /// Baseline measured in the same run.
    #[arg(long, value_enum, default_value = "raw-zmq")]
    baseline: Baseline,
    /// Milonga's publisher keeps this many samples for late joiners and
    /// repair (`PublisherQos::history`).
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Hosts: 1, or 2 (tcp only, root needed): the publisher on one host
    /// of the multi-host test bed, the subscribers on the other, over a
    /// veth pair and a bridge.
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// With `--hosts 2`: milliseconds every frame waits on the sending
    /// host's link, each way (a user-space relay, as netem's `delay`
    /// would; a round trip waits twice).
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Also measure Milonga with samples of at least this many bytes
    /// through same-host shared memory (`zero_copy_threshold_bytes` and
    /// `shm_threshold_bytes` set to it; by default 64 KiB), as a row
    /// `mlg-shm` in the same run: whether small samples gain by it.
    #[arg(long = "shm-small")]
    shm_small: Option<usize>,
    /// Also measure Milonga with security on (CURVE on every connection,
    /// docs/security.md), as a row `mlg+curve` in the same run; with
    /// --via-broker, a row `mlg-brk+curve` (a broker with security on).
    #[arg(long = "with-security")]
    with_security: bool,
    /// Measure through a relay instead: a raw libzmq XSUB/XPUB proxy
    /// (`raw-proxy`), Milonga peer-to-peer (`milonga`) and Milonga through
    /// `milonga broker` (`mlg-broker`), in the same run (tcp only).
    #[arg(long = "via-broker")]
    via_broker: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(Args, Debug)]
struct LatencyArgs {
    /// Payload sizes in bytes.
    #[arg(long, default_value = "92,4096,1048576", value_delimiter = ',', value_parser = crate::args::payload_size)]
    sizes: Vec<usize>,
    /// Round trips per size (fewer for 1 MiB: a tenth, at least 100).
    #[arg(long, default_value_t = 5000)]
    round_trips: usize,
    /// Baseline measured in the same run.
    #[arg(long, value_enum, default_value = "raw-zmq")]
    baseline: Baseline,
    /// Hosts: 1, or 2 (tcp only, root needed): ping on one host of the
    /// multi-host test bed, pong on the other.
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// With `--hosts 2`: milliseconds every frame waits on the sending
    /// host's link, each way (a user-space relay, as netem's `delay`
    /// would; a round trip waits twice).
    #[arg(long, default_value_t = 0.0)]
    delay_ms: f64,
    /// Also measure Milonga with samples of at least this many bytes
    /// through same-host shared memory (`zero_copy_threshold_bytes` and
    /// `shm_threshold_bytes` set to it; by default 64 KiB), as a row
    /// `mlg-shm` in the same run: whether small samples gain by it.
    #[arg(long = "shm-small")]
    shm_small: Option<usize>,
    /// Also measure Milonga with security on (CURVE on every connection,
    /// docs/security.md), as a row `mlg+curve` in the same run; with
    /// --via-broker, a row `mlg-brk+curve` (a broker with security on).
    #[arg(long = "with-security")]
    with_security: bool,
    /// Measure through a relay instead: raw libzmq proxies, Milonga
    /// peer-to-peer and Milonga through `milonga broker` (tcp only).
    #[arg(long = "via-broker")]
    via_broker: bool,
    /// Also measure Milonga's low-latency mode: subscriptions poll this
    /// many microseconds before blocking (`recv_spin_us`), as a row
    /// `mlg-spin` in the same run.
    #[arg(long = "spin-us", default_value_t = 0)]
    spin_us: u32,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// Options of the hidden `milonga bench-worker` command.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The worker's role, as JSON.
    spec: String,
}

/// Where a worker meets its peers.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) struct Place {
    /// Raw: the endpoint the publisher binds. Milonga: the locator.
    pub address: String,
    /// Milonga: runtime directory and transport.
    pub runtime_dir: String,
    pub transport: String,
    pub hwm: i32,
    /// Milonga publishers: samples kept per key (`PublisherQos::history`).
    #[serde(default)]
    pub history: usize,
    /// Milonga with security on: the directory of the run's key
    /// (`bench.key`) and trust directory (`trust/`).
    #[serde(default)]
    pub keys: Option<String>,
    /// Milonga subscriptions: `recv_spin_us` (0: block at once).
    #[serde(default)]
    pub spin_us: u32,
    /// Milonga nodes with `shared_memory` off (the `mlg-sock` row): large
    /// payloads through the socket even on one host.
    #[serde(default)]
    pub no_shm: bool,
    /// Milonga publishers: put each sample as a loan of the segment
    /// (`Publisher::loan`, the `mlg-loan` row), left as the slot held it:
    /// the payload produced in place, as a driver writing a frame into the
    /// loan would.
    #[serde(default)]
    pub loan: bool,
    /// Milonga nodes whose samples of at least this many bytes go through
    /// shared memory (the `mlg-shm` row, `--shm-small`).
    #[serde(default)]
    pub shm_small: Option<usize>,
}

/// The systems measured in a run: the raw baseline if asked, Milonga, and
/// Milonga with security on if asked; through a relay, the raw proxy,
/// Milonga peer-to-peer and Milonga through a broker.
fn systems(baseline: Baseline, security: bool, via_broker: bool) -> Vec<&'static str> {
    if via_broker {
        let mut s = vec!["raw-proxy", "milonga", "mlg-broker"];
        if security {
            s.push("mlg-brk+curve");
        }
        return s;
    }
    let mut s = Vec::new();
    if baseline == Baseline::RawZmq {
        s.push("raw-zmq");
    }
    s.push("milonga");
    if security {
        s.push("mlg+curve");
    }
    s
}

/// `systems` in the order cell number `cell` runs them: rotated by one
/// each cell, so that no system always runs first (on a warm or a cold
/// machine) and each is first as often as the others over a matrix.
pub(crate) fn in_turn<T: Copy>(systems: &[T], cell: usize) -> Vec<T> {
    let mut v = systems.to_vec();
    if !v.is_empty() {
        let n = v.len();
        v.rotate_left(cell % n);
    }
    v
}

/// The line that says so, in each benchmark's header.
pub(crate) const IN_TURN: &str = "# the systems of a cell run one after the other, their order rotated by one each cell (no system always first)";

/// Makes the one identity every worker of a secured run uses (in `dir`),
/// trusted by all: the cost measured is CURVE's, not key management's.
fn bench_keys(dir: &std::path::Path) -> Result<String> {
    let keys = dir.join("keys");
    if !keys.join("bench.key").exists() {
        let id = milonga::security::Identity::generate("bench")?;
        id.write(&keys)?;
        // Writable by its owner alone, whatever the umask (a trust
        // directory others may write is refused).
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(keys.join("trust"))?;
        std::fs::copy(keys.join("bench.pub"), keys.join("trust").join("bench.pub"))?;
    }
    Ok(keys.display().to_string())
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "role", rename_all = "kebab-case")]
pub(crate) enum Role {
    RawPub {
        at: Place,
        size: usize,
        subs: usize,
        duration_s: f64,
        mode: Mode,
        /// Through a raw proxy: connect to its XSUB here instead of
        /// binding `at.address` (where the proxy's XPUB is).
        #[serde(default)]
        via: Option<String>,
    },
    RawSub {
        at: Place,
        deadline_s: f64,
    },
    MlgPub {
        at: Place,
        size: usize,
        subs: usize,
        duration_s: f64,
        mode: Mode,
        /// The subscribers are behind another broker of a federation.
        #[serde(default)]
        behind_link: bool,
    },
    MlgSub {
        at: Place,
        deadline_s: f64,
    },
    RawPing {
        at: Place,
        back: String,
        size: usize,
        n: usize,
        /// Through raw proxies: (where its PUB connects, where its SUB
        /// connects), instead of binding `at.address` and connecting `back`.
        #[serde(default)]
        via: Option<(String, String)>,
    },
    RawPong {
        at: Place,
        back: String,
        #[serde(default)]
        via: Option<(String, String)>,
    },
    /// A raw libzmq XSUB/XPUB proxy (`--via-broker`'s baseline), killed by
    /// the bench.
    RawProxy {
        front: String,
        back: String,
        hwm: i32,
        nodrop: bool,
    },
    MlgPing {
        at: Place,
        size: usize,
        n: usize,
    },
    MlgPong {
        at: Place,
    },
    /// A publisher process for `bench liveliness`, killed by the bench.
    LivePub {
        at: Place,
    },
    /// `bench encoding` on a wide-area path: the ping side, which runs
    /// every cell at `rate` messages a second, `n` messages each.
    EncPing {
        at: Place,
        n: usize,
        rate: f64,
        /// Reliable publishers and subscriptions (`--reliable`).
        #[serde(default)]
        reliable: bool,
    },
    /// `bench encoding` on a wide-area path: the pong side.
    EncPong {
        at: Place,
        #[serde(default)]
        reliable: bool,
    },
    /// `bench scale`: `count` publishers of one worker process.
    ScalePub {
        at: Place,
        raw: bool,
        endpoints: Vec<String>,
        first: usize,
        count: usize,
        subs: usize,
        size: usize,
        puts: usize,
        rate: f64,
    },
    /// `bench scale`: `count` subscribers of one worker process.
    ScaleSub {
        at: Place,
        raw: bool,
        endpoints: Vec<String>,
        count: usize,
        pubs: usize,
        expect: u64,
        deadline_s: f64,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct Outcome {
    pub(crate) sent: u64,
    pub(crate) received: u64,
    pub(crate) seconds: f64,
    lost_reported: u64,
    /// `bench pubsub`: samples a Milonga subscriber received through
    /// shared memory (the `path` column).
    #[serde(default)]
    shm_received: u64,
    p50_us: f64,
    p99_us: f64,
    /// `bench scale`: the latencies measured (put or end to end).
    #[serde(default)]
    pub(crate) hist: crate::bench_scale::Hist,
    /// `bench scale`: the worker process's CPU time; `bench pubsub`: the
    /// publisher process's, over its sending loop.
    #[serde(default)]
    pub(crate) cpu_ns: u64,
    /// `bench scale`: its subscribers' rates (samples a second), summed.
    #[serde(default)]
    pub(crate) rate_sum: f64,
}

/// Starts `roles` as worker processes and waits for their outcomes, in
/// the order of `roles`.
pub(crate) fn start_workers(roles: Vec<Role>) -> Result<Vec<Outcome>> {
    Workers::start(roles, None, None)?.finish()
}

/// Runs `milonga bench`.
///
/// The benchmarks run in private domains of their own; of the common
/// options they take only `--transport` (default tcp).
pub fn run(net: &NetArgs, a: BenchArgs) -> Result<ExitCode> {
    let t = net.transport.unwrap_or(Transport::Tcp);
    match a.kind {
        BenchKind::Pubsub(p) => pubsub(p, t),
        BenchKind::Latency(l) => latency(l, t),
        BenchKind::Idle(i) => idle(i),
        BenchKind::Liveliness(l) => crate::bench_liveliness::run(l, t),
        BenchKind::Rpc(r) => crate::bench_rpc::run(r, t),
        BenchKind::Discovery(d) => crate::bench_discovery::run(d),
        BenchKind::Registry(r) => crate::bench_registry::run(r),
        BenchKind::Deadlines(d) => crate::bench_deadlines::run(d, t),
        BenchKind::Record(r) => crate::bench_record::run(r, t),
        BenchKind::Encoding(e) => crate::bench_encoding::run(e),
        BenchKind::Scale(s) => crate::bench_scale::run(s),
    }
}

/// Opens a node in a private domain with a publisher and a subscription,
/// stays idle, then reads this process's resident set size from /proc.
fn idle(a: IdleArgs) -> Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("mlg-idle-{}", std::process::id()));
    let mut cfg = Config::new(&format!("milonga:///idle-{}", std::process::id()), "idle");
    // Benchmarks compare with plain libzmq: security off unless asked
    // (`--with-security`), whatever the address.
    cfg.security = milonga::Security::Off;
    cfg.runtime_dir = Some(dir.clone());
    let node = Node::open_with(cfg)?;
    let _p = node.publisher("idle/x")?;
    let _s = node.subscribe("idle/**")?;
    std::thread::sleep(Duration::from_secs_f64(a.duration));
    let status = std::fs::read_to_string("/proc/self/status")?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/self/status")?;
    println!(
        "idle node (1 publisher, 1 subscription, {} s idle): RSS {:.1} MiB ({rss_kib} KiB), target < 10 MiB",
        a.duration,
        rss_kib as f64 / 1024.0
    );
    node.close();
    let _ = std::fs::remove_dir_all(dir);
    Ok(ExitCode::SUCCESS)
}

/// Runs a worker role in this process (`milonga bench-worker`).
pub fn worker(a: WorkerArgs) -> Result<ExitCode> {
    let role: Role = serde_json::from_str(&a.spec).context("bad worker spec")?;
    if matches!(role, Role::EncPing { .. } | Role::EncPong { .. }) {
        return crate::bench_encoding::worker(role);
    }
    let ctx = zmq::Context::new();
    let out = run_role(&ctx, role)?;
    println!("{}", serde_json::to_string(&out)?);
    Ok(ExitCode::SUCCESS)
}

fn run_role(ctx: &zmq::Context, role: Role) -> Result<Outcome> {
    match role {
        Role::RawPub {
            at,
            size,
            subs,
            duration_s,
            mode,
            via,
        } => raw_pub(ctx, &at, size, subs, duration_s, mode, via.as_deref()),
        Role::RawSub { at, deadline_s } => raw_sub(ctx, &at, deadline_s),
        Role::MlgPub {
            at,
            size,
            subs,
            duration_s,
            mode,
            behind_link,
        } => mlg_pub(&at, size, subs, duration_s, mode, behind_link),
        Role::MlgSub { at, deadline_s } => mlg_sub(&at, deadline_s),
        Role::RawPing {
            at,
            back,
            size,
            n,
            via,
        } => raw_ping(ctx, &at, &back, size, n, via),
        Role::RawPong { at, back, via } => raw_pong(ctx, &at, &back, via),
        Role::RawProxy {
            front,
            back,
            hwm,
            nodrop,
        } => crate::bench_broker::raw_proxy(ctx, &front, &back, hwm, nodrop)
            .map(|()| Outcome::default()),
        Role::MlgPing { at, size, n } => mlg_ping(&at, size, n),
        Role::MlgPong { at } => mlg_pong(&at),
        Role::LivePub { at } => crate::bench_liveliness::live_pub(&at),
        Role::EncPing { .. } | Role::EncPong { .. } => {
            bail!("a bench encoding role runs in a worker process of its own")
        }
        Role::ScalePub {
            at,
            raw,
            endpoints,
            first,
            count,
            subs,
            size,
            puts,
            rate,
        } => crate::bench_scale::scale_pub(
            &at, raw, &endpoints, first, count, subs, size, puts, rate,
        ),
        Role::ScaleSub {
            at,
            raw,
            endpoints,
            count,
            pubs,
            expect,
            deadline_s,
        } => crate::bench_scale::scale_sub(&at, raw, &endpoints, count, pubs, expect, deadline_s),
    }
}

/// Starts workers: processes, or threads of this process for inproc.
struct Workers {
    procs: Vec<std::process::Child>,
    threads: Vec<std::thread::JoinHandle<Result<Outcome>>>,
}

/// The test bed of `--hosts 2`: the sending side (publisher, ping) runs on
/// host 0, the receiving side (subscribers, pong) on host 1.
/// With `delay_ms` > 0, host 0's link delays every frame that much each
/// way.
fn bed_for(
    hosts: usize,
    t: Transport,
    delay_ms: f64,
) -> Result<Option<milonga_testkit::netbed::Bed>> {
    if delay_ms != 0.0 && (hosts != 2 || !(0.0..=10_000.0).contains(&delay_ms)) {
        bail!("--delay-ms needs --hosts 2, and 0 to 10000 ms");
    }
    let mut bed = match hosts {
        1 => return Ok(None),
        2 if t == Transport::Tcp => milonga_testkit::netbed::Bed::new(2)
            .map_err(|why| anyhow!("--hosts 2 needs network namespaces (root): {why}"))?,
        2 => bail!("--hosts 2 runs over tcp only"),
        h => bail!("--hosts must be 1 or 2, not {h}"),
    };
    if delay_ms > 0.0 {
        let d = Duration::from_secs_f64(delay_ms / 1000.0);
        bed.set_delay(0, d, Duration::ZERO)
            .map_err(|why| anyhow!("cannot delay the link: {why}"))?;
        eprintln!("# host 0's link delays every frame {delay_ms} ms each way (a user-space relay of the test bed, offloads off on both hosts: its cost is in both systems' figures)");
    }
    Ok(Some(bed))
}

/// The host a role runs on in a two-host bench.
fn host_of(role: &Role) -> usize {
    match role {
        Role::RawSub { .. } | Role::MlgSub { .. } | Role::RawPong { .. } | Role::MlgPong { .. } => {
            1
        }
        _ => 0,
    }
}

/// A tcp endpoint on host `h` of the bed (its address), or on the
/// loopback without a bed.
fn endpoint_on(
    bed: Option<&milonga_testkit::netbed::Bed>,
    h: usize,
    t: Transport,
    tag: &str,
    port: u16,
) -> Result<String> {
    match bed {
        Some(b) => Ok(format!("tcp://{}:{port}", b.host(h).addr)),
        None => free_endpoint(t, tag),
    }
}

impl Workers {
    fn start(
        roles: Vec<Role>,
        inproc: Option<&zmq::Context>,
        bed: Option<&milonga_testkit::netbed::Bed>,
    ) -> Result<Workers> {
        let mut w = Workers {
            procs: Vec::new(),
            threads: Vec::new(),
        };
        for role in roles {
            match inproc {
                Some(ctx) => {
                    let ctx = ctx.clone();
                    w.threads
                        .push(std::thread::spawn(move || run_role(&ctx, role)));
                }
                None => {
                    let exe = std::env::current_exe()?;
                    let mut cmd = match bed {
                        Some(b) => {
                            let h = host_of(&role);
                            let mut c = b.command(h, &exe.display().to_string());
                            c.env("MILONGA_BENCH_TCP_HOST", b.host(h).addr.to_string());
                            c
                        }
                        None => Command::new(exe),
                    };
                    let child = cmd
                        .arg("bench-worker")
                        .arg(serde_json::to_string(&role)?)
                        .stdout(Stdio::piped())
                        .stdin(Stdio::null())
                        .spawn()
                        .context("cannot start a bench worker")?;
                    w.procs.push(child);
                }
            }
        }
        Ok(w)
    }

    fn finish(self) -> Result<Vec<Outcome>> {
        let mut out = Vec::new();
        for t in self.threads {
            out.push(t.join().map_err(|_| anyhow!("a bench worker panicked"))??);
        }
        // Every worker is waited for, a failed one's too (none is left
        // running into the next cell); the first failure is the error.
        let mut failed = None;
        for mut p in self.procs {
            let mut line = String::new();
            let read = BufReader::new(p.stdout.take().expect("piped")).read_line(&mut line);
            let status = p.wait()?;
            if failed.is_some() {
                continue;
            }
            if !status.success() {
                failed = Some(anyhow!("a bench worker failed ({status})"));
                continue;
            }
            read?;
            match serde_json::from_str(&line) {
                Ok(o) => out.push(o),
                Err(e) => failed = Some(anyhow!("bad worker output {line:?}: {e}")),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// What one copy of `size` bytes costs on this machine, in ns (median of
/// rounds of about 50 ms each): copies of one buffer into successive
/// places of a ring of `ring_bytes` whose pages are already there, as
/// `put` copies a payload into its shared-memory segment (whose ring
/// starts again at its beginning when its readers keep up: a small ring
/// stays in the caches, a large one does not). A `put` of that size
/// cannot go faster than one such copy; a loan, written in place, skips
/// it.
fn one_copy_ns(size: usize, ring_bytes: usize) -> f64 {
    let src = vec![0x5au8; size];
    let mut ring = vec![0u8; ring_bytes.max(size)];
    // Touch every page first (a segment's pages are there after its
    // first round).
    ring.iter_mut().step_by(4096).for_each(|b| *b = 1);
    let slots = (ring.len() / size).max(1);
    let mut rounds = Vec::new();
    let mut at = 0;
    for _ in 0..9 {
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            let off = (at % slots) * size;
            ring[off..off + size].copy_from_slice(&src);
            std::hint::black_box(&ring[off]);
            at += 1;
            n += 1;
        }
        rounds.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn hwm_for(size: usize) -> i32 {
    ((64usize << 20) / size.max(1)).clamp(16, 10_000) as i32
}

pub(crate) fn free_endpoint(transport: Transport, tag: &str) -> Result<String> {
    Ok(match transport {
        Transport::Tcp => {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            format!("tcp://127.0.0.1:{}", l.local_addr()?.port())
        }
        // In the run's own directory, removed at its end: a socket file of
        // a worker killed mid-run goes with it.
        Transport::Ipc => format!(
            "ipc://{}/{tag}.sock",
            std::env::temp_dir()
                .join(format!("mlg-bench-{}", std::process::id()))
                .display()
        ),
        Transport::Inproc => format!("inproc://mlg-bench-{tag}"),
    })
}

struct Row {
    system: &'static str,
    size: usize,
    subs: usize,
    events_per_s: f64,
    lost: u64,
    /// Samples the publisher sent, and the subscribers received (summed).
    sent: u64,
    received: u64,
    /// How the samples came: `socket`, `shm` (shared memory), or `mixed`.
    path: &'static str,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn pubsub(a: PubsubArgs, t: Transport) -> Result<ExitCode> {
    if a.via_broker && (t != Transport::Tcp || a.hosts != 1) {
        bail!("--via-broker runs over tcp on one host");
    }
    let tmp = std::env::temp_dir().join(format!("mlg-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let inproc_ctx = (t == Transport::Inproc).then(zmq::Context::new);
    let bed = bed_for(a.hosts, t, a.delay_ms)?;
    if bed.is_some() {
        eprintln!("# two hosts: the publisher on one network namespace (10.99.0.1), the subscribers on another (10.99.0.2), joined by veth pairs and a bridge");
    }
    eprintln!(
        "# milonga bench pubsub: transport {}, mode {:?}, {} s per cell, hwm = 64 MiB / size (16..10000) for both systems (a reliable milonga publisher: reliable_send_hwm = 16 messages, a message being a sample or a batch <= 128 KiB); milonga history {}; liveliness on",
        t.name(),
        a.mode,
        a.duration,
        a.history
    );
    eprintln!("# events_per_s_per_sub = median over subscribers of received / (last - first arrival); MB = 10^6 bytes of payload; sent = the publisher's puts (raw: zmq_send calls), received = summed over subscribers, lost = sent - received summed over subscribers (received > sent is flagged)");
    eprintln!("# an event is one sample: milonga batches small samples into messages of up to 128 KiB, raw libzmq sends one message per event (ratios at 92 B and 4 KiB compare batched with unbatched sending); every subscriber reads one byte in each 4 KiB of each payload (both systems)");
    eprintln!("{IN_TURN}");
    eprintln!("# path: how the samples came (socket; shm = through shared memory, on one host; mixed = some through the socket, as when a put finds the ring full); `transport` is what the sockets use");
    if a.format == Format::Csv {
        println!(
            "system,transport,payload_bytes,subscribers,events_per_s_per_sub,mb_per_s_per_sub,lost,sent,received,path"
        );
    } else {
        println!(
            "{:<9} {:>6} {:>9} {:>5} {:>14} {:>10} {:>8} {:>11} {:>11} {:>6}",
            "system",
            "transp",
            "bytes",
            "subs",
            "events/s/sub",
            "MB/s/sub",
            "lost",
            "sent",
            "received",
            "path"
        );
    }
    let mut cell = 0;
    let mut these = systems(a.baseline, a.with_security, a.via_broker);
    if !a.via_broker && t != Transport::Inproc && bed.is_none() {
        // Large payloads on one host go through shared memory: the same
        // cells published from loans, and with shared memory off, through
        // the socket (sizes from 64 KiB on).
        these.push("mlg-loan");
        these.push("mlg-sock");
        if a.shm_small.is_some() {
            these.push("mlg-shm");
        }
    }
    if a.via_broker {
        // Two federated brokers: the publisher behind one, the
        // subscribers behind the other.
        these.push("mlg-fed2");
    }
    // The rows about shared memory only from the size it starts at.
    let shm_from = milonga::Config::new("milonga:///x", "x").shm_threshold_bytes;
    if these.contains(&"mlg-loan") {
        for &size in a.sizes.iter().filter(|s| **s >= shm_from) {
            let far = one_copy_ns(size, 64 << 20);
            let near = one_copy_ns(size, 2 * size);
            eprintln!(
                "# one copy of {size} B here (median of 9 rounds of 50 ms): {:.1} us into a 64 MiB ring, {:.1} us into the same two places: `put` through shared memory copies the payload once, so at most {:.0} to {:.0} puts/s; a loan skips that copy",
                far / 1000.0,
                near / 1000.0,
                1e9 / far,
                1e9 / near
            );
        }
    }
    let mut turn = 0;
    for &size in &a.sizes {
        for &subs in &a.subs {
            turn += 1;
            for system in in_turn(&these, turn) {
                if matches!(system, "mlg-sock" | "mlg-loan") && size < shm_from {
                    continue;
                }
                // Only sizes that the opt-in sends through shared memory
                // and the default does not.
                if system == "mlg-shm"
                    && (size >= shm_from || a.shm_small.is_some_and(|b| size < b))
                {
                    continue;
                }
                cell += 1;
                let hwm = hwm_for(size);
                let domain = format!("bench-{}-{cell}", std::process::id());
                let relay = match system {
                    "raw-proxy" => Some(crate::bench_broker::Relay::raw_proxy(
                        hwm,
                        a.mode == Mode::Reliable,
                    )?),
                    "mlg-broker" | "mlg-fed2" => {
                        Some(crate::bench_broker::Relay::broker(&domain, hwm, None)?)
                    }
                    "mlg-brk+curve" => Some(crate::bench_broker::Relay::broker(
                        &domain,
                        hwm,
                        Some(&bench_keys(&tmp)?),
                    )?),
                    _ => None,
                };
                // The second broker of a federation, the subscribers'.
                let far = match (system, &relay) {
                    ("mlg-fed2", Some(b1)) => Some(crate::bench_broker::Relay::linked_broker(
                        &domain,
                        hwm,
                        Some(&b1.back),
                    )?),
                    _ => None,
                };
                let at = Place {
                    address: match (system, &relay) {
                        ("raw-zmq", _) => endpoint_on(
                            bed.as_ref(),
                            0,
                            t,
                            &cell.to_string(),
                            20_000 + cell as u16,
                        )?,
                        ("mlg-broker" | "mlg-fed2" | "mlg-brk+curve", Some(r)) => r.front.clone(),
                        (_, Some(r)) => r.back.clone(),
                        _ => format!("milonga:///{domain}"),
                    },
                    runtime_dir: tmp.display().to_string(),
                    transport: t.name().to_owned(),
                    hwm,
                    history: a.history,
                    keys: matches!(system, "mlg+curve" | "mlg-brk+curve")
                        .then(|| bench_keys(&tmp))
                        .transpose()?,
                    spin_us: 0,
                    no_shm: system == "mlg-sock",
                    loan: system == "mlg-loan",
                    shm_small: a.shm_small.filter(|_| system == "mlg-shm"),
                };
                let deadline_s = a.duration + 20.0 + size as f64 / 1e6;
                let raw = system.starts_with("raw");
                let sub_role = |at: Place| match raw {
                    true => Role::RawSub { at, deadline_s },
                    false => Role::MlgSub { at, deadline_s },
                };
                let pub_role = match raw {
                    true => Role::RawPub {
                        at: at.clone(),
                        size,
                        subs,
                        duration_s: a.duration,
                        mode: a.mode,
                        via: relay
                            .as_ref()
                            .filter(|_| system == "raw-proxy")
                            .map(|r| r.front.clone()),
                    },
                    false => Role::MlgPub {
                        at: at.clone(),
                        size,
                        subs,
                        duration_s: a.duration,
                        mode: a.mode,
                        behind_link: system == "mlg-fed2",
                    },
                };
                // Raw: the publisher binds first. Milonga: either order works.
                let mut roles = vec![pub_role];
                let sub_at = match &far {
                    Some(b2) => Place {
                        address: b2.front.clone(),
                        ..at.clone()
                    },
                    None => at.clone(),
                };
                roles.extend((0..subs).map(|_| sub_role(sub_at.clone())));
                let outs = Workers::start(roles, inproc_ctx.as_ref(), bed.as_ref())?.finish()?;
                let sent = outs[0].sent;
                let subs_out = &outs[1..];
                let lost: u64 = subs_out
                    .iter()
                    .map(|o| sent.saturating_sub(o.received))
                    .sum();
                let received: u64 = subs_out.iter().map(|o| o.received).sum();
                if let Some(o) = subs_out.iter().find(|o| o.received > sent) {
                    eprintln!(
                        "# note: {system} {size} B x{subs}: a subscriber received {} of {sent} sent: duplicates",
                        o.received
                    );
                }
                let shm: u64 = subs_out.iter().map(|o| o.shm_received).sum();
                let path = match shm {
                    0 => "socket",
                    n if n >= received => "shm",
                    _ => "mixed",
                };
                if path == "mixed" {
                    eprintln!(
                        "# {system} {size} B x{subs}: {shm} of the {received} samples received came through shared memory, the others through the socket"
                    );
                }
                let rates: Vec<f64> = subs_out
                    .iter()
                    .map(|o| {
                        if o.seconds > 0.0 {
                            o.received as f64 / o.seconds
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let row = Row {
                    system,
                    size,
                    subs,
                    events_per_s: median(rates),
                    lost,
                    sent,
                    received,
                    path,
                };
                print_row(&row, t, a.format)?;
                // Threads of one process for inproc: no CPU of its own.
                if t != Transport::Inproc && sent > 0 && outs[0].cpu_ns > 0 {
                    eprintln!(
                        "# {system} {size} B x{subs}: publisher CPU {:.0} ns per sample sent (every thread of its process, over its sending loop)",
                        outs[0].cpu_ns as f64 / sent as f64
                    );
                }
                if let Some(r) = relay {
                    let cpu_ns = r.finish()? + far.map(|b2| b2.finish()).transpose()?.unwrap_or(0);
                    let delivered: u64 = subs_out.iter().map(|o| o.received).sum();
                    eprintln!(
                        "# {system} {size} B x{subs}: relay CPU {:.2} us per delivered sample ({:.2} s for {delivered})",
                        cpu_ns as f64 / 1e3 / delivered.max(1) as f64,
                        cpu_ns as f64 / 1e9
                    );
                }
                if !raw {
                    let reported: u64 = subs_out.iter().map(|o| o.lost_reported).sum();
                    if reported > lost {
                        eprintln!("# note: milonga subscribers reported {reported} lost (gaps), more than sent - received = {lost}");
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(ExitCode::SUCCESS)
}

fn print_row(r: &Row, t: Transport, f: Format) -> Result<()> {
    let mb = r.events_per_s * r.size as f64 / 1e6;
    let mut o = std::io::stdout().lock();
    match f {
        Format::Csv => writeln!(
            o,
            "{},{},{},{},{:.0},{:.2},{},{},{},{}",
            r.system,
            t.name(),
            r.size,
            r.subs,
            r.events_per_s,
            mb,
            r.lost,
            r.sent,
            r.received,
            r.path
        )?,
        Format::Table => writeln!(
            o,
            "{:<9} {:>6} {:>9} {:>5} {:>14.0} {:>10.2} {:>8} {:>11} {:>11} {:>6}",
            r.system,
            t.name(),
            r.size,
            r.subs,
            r.events_per_s,
            mb,
            r.lost,
            r.sent,
            r.received,
            r.path
        )?,
    }
    o.flush()?;
    Ok(())
}

// ---- raw libzmq ----

fn raw_pub(
    ctx: &zmq::Context,
    at: &Place,
    size: usize,
    subs: usize,
    duration_s: f64,
    mode: Mode,
    via: Option<&str>,
) -> Result<Outcome> {
    let s = ctx.socket(zmq::XPUB)?;
    s.set_sndhwm(at.hwm)?;
    s.set_rcvhwm(at.hwm)?;
    s.set_linger(5000)?;
    s.set_xpub_verbose(true)?;
    let mut s = s;
    crate::ffi::set_xpub_nodrop(&mut s, mode == Mode::Reliable)?;
    match via {
        Some(proxy) => s.connect(proxy)?,
        None => s.bind(&at.address)?,
    }
    // Each subscriber subscribes to a topic of its own too (see
    // `raw_sub`): counted, as a proxy forwards a topic it already had
    // only once to a publisher that connects after the subscribers.
    let mut joined = 0;
    while joined < subs {
        let m = s.recv_msg(0)?;
        if m.first() == Some(&1) && m[1..].starts_with(JOIN) {
            joined += 1;
        }
    }
    let payload = Bytes::from(vec![0xa5u8; size]);
    // Large payloads leave without a copy, as a careful libzmq user would
    // send them (and as Milonga does): libzmq holds a reference on one buffer.
    let zero_copy = size >= 64 << 10;
    let cpu0 = own_cpu_ns();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(duration_s);
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            if zero_copy {
                crate::ffi::send_shared(&mut s, &payload)?;
            } else {
                s.send(&payload[..], 0)?;
            }
            sent += 1;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_ns = own_cpu_ns().saturating_sub(cpu0);
    end_markers(|| s.send(&[][..], zmq::DONTWAIT).is_ok());
    Ok(Outcome {
        sent,
        seconds,
        cpu_ns,
        ..Default::default()
    })
}

/// Sends end markers for 2 s (best effort may drop some; reliable sends
/// them all once there is room).
fn end_markers(mut send: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(2);
    let mut sent_one = false;
    while Instant::now() < end {
        sent_one |= send();
        std::thread::sleep(Duration::from_millis(if sent_one { 50 } else { 5 }));
    }
}

/// What a raw subscriber's own topic starts with: its publisher counts
/// the subscribers by them (no message carries one).
const JOIN: &[u8] = b"\xffjoin/";

fn raw_sub(ctx: &zmq::Context, at: &Place, deadline_s: f64) -> Result<Outcome> {
    let s = ctx.socket(zmq::SUB)?;
    s.set_rcvhwm(at.hwm)?;
    s.set_subscribe(b"")?;
    let mut own = JOIN.to_vec();
    // Unique across processes and, for inproc, the threads of one.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    own.extend_from_slice(format!("{}-{n}", std::process::id()).as_bytes());
    s.set_subscribe(&own)?;
    s.connect(&at.address)?;
    s.set_rcvtimeo((deadline_s * 1000.0) as i32)?;
    let mut msg = zmq::Message::new();
    let (mut first, mut last) = (None, Instant::now());
    let mut received = 0u64;
    loop {
        if s.recv(&mut msg, 0).is_err() {
            break;
        }
        if msg.is_empty() {
            break;
        }
        read_payload(&msg);
        last = Instant::now();
        first.get_or_insert(last);
        received += 1;
    }
    let seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    Ok(Outcome {
        received,
        seconds,
        ..Default::default()
    })
}

// ---- milonga ----

pub(crate) fn mlg_config(at: &Place, name: &str) -> Result<Config> {
    let mut c = Config::new(&at.address, name);
    // Benchmarks compare with plain libzmq: security off unless asked
    // (`--with-security`), whatever the address.
    c.security = milonga::Security::Off;
    c.runtime_dir = Some(at.runtime_dir.clone().into());
    // On a host of the test bed (`--hosts 2`): bound to its address.
    if let Ok(host) = std::env::var("MILONGA_BENCH_TCP_HOST") {
        c.tcp_host = host;
    }
    c.transport = at.transport.parse().map_err(|e: String| anyhow!(e))?;
    c.send_hwm = at.hwm;
    c.recv_hwm = at.hwm;
    c.close_linger_ms = 5000;
    c.recv_spin_us = at.spin_us;
    c.shared_memory = !at.no_shm;
    if let Some(bytes) = at.shm_small {
        c.zero_copy_threshold_bytes = bytes;
        c.shm_threshold_bytes = bytes;
    }
    if let Some(k) = &at.keys {
        let k = std::path::Path::new(k);
        c.security = milonga::Security::On;
        c.key_file = Some(k.join("bench.key"));
        c.trust_dir = Some(k.join("trust"));
    }
    Ok(c)
}

fn mlg_pub(
    at: &Place,
    size: usize,
    subs: usize,
    duration_s: f64,
    mode: Mode,
    behind_link: bool,
) -> Result<Outcome> {
    let node = Node::open_with(mlg_config(at, "bench-pub")?)?;
    let qos = match mode {
        Mode::Reliable => PublisherQos::reliable(),
        Mode::BestEffort => PublisherQos::best_effort(),
    }
    .history(at.history);
    let p = node.publisher_with("bench/data", qos)?;
    // Subscribers behind a broker count as one at the publisher (the
    // broker passes a topic on once, `subscriber_count`): wait for that
    // one; then, behind this broker, until it lists every subscriber
    // client with its subscription (their reports, once a second), and
    // behind another broker of a federation, the time they take to
    // subscribe there, which all of them start doing at once.
    let brokered = milonga::broker::clients(&node, Duration::from_secs(2)).is_some();
    let expected = if behind_link || brokered { 1 } else { subs };
    let wait_end = Instant::now() + Duration::from_secs(30);
    while (p.subscriber_count() as usize) < expected {
        if Instant::now() > wait_end {
            bail!(
                "{} subscriptions heard of the {expected} awaited ({subs} subscribers{})",
                p.subscriber_count(),
                if behind_link {
                    ", behind a federation link"
                } else {
                    ""
                }
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if behind_link {
        std::thread::sleep(Duration::from_secs(2));
    } else if brokered {
        loop {
            let ready = milonga::broker::clients(&node, Duration::from_secs(2))
                .unwrap_or_default()
                .iter()
                .filter(|c| c.subscriptions.iter().any(|e| e == "bench/data"))
                .count();
            if ready >= subs {
                break;
            }
            if Instant::now() > wait_end {
                bail!("{ready} subscriber clients listed by the broker of the {subs} awaited");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let payload = Value::Bytes(Bytes::from(vec![0xa5u8; size]));
    let cpu0 = own_cpu_ns();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(duration_s);
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            if at.loan {
                p.put_loan(p.loan(size))?;
            } else {
                p.put(payload.clone())?;
            }
            sent += 1;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_ns = own_cpu_ns().saturating_sub(cpu0);
    end_markers(|| p.try_put(Value::Bytes(Bytes::new())).is_ok());
    let st = node.stats();
    if std::env::var_os("MILONGA_BENCH_DEBUG").is_some() {
        eprintln!(
            "# publisher: {} batches carried {} of {} samples; {} puts waited for room, {} us in all",
            st.batches_sent, st.samples_batched, st.samples_sent, st.puts_blocked, st.puts_blocked_us
        );
    }
    node.close();
    Ok(Outcome {
        sent,
        seconds,
        cpu_ns,
        ..Default::default()
    })
}

/// CPU time of this process's threads so far (ns): a publisher's, over
/// its sending loop.
fn own_cpu_ns() -> u64 {
    crate::bench_rpc::cpu_ns(std::process::id()).unwrap_or(0)
}

fn mlg_sub(at: &Place, deadline_s: f64) -> Result<Outcome> {
    let node = Node::open_with(mlg_config(at, "bench-sub")?)?;
    let sub = node.subscribe("bench/data")?;
    let (mut first, mut last) = (None, Instant::now());
    let mut received = 0u64;
    let deadline = Duration::from_secs_f64(deadline_s);
    loop {
        match sub.recv_timeout(deadline) {
            Ok(Event::Sample(s)) => {
                if s.bytes().is_some_and(Bytes::is_empty) {
                    break;
                }
                if let Some(b) = s.bytes() {
                    read_payload(b);
                }
                last = Instant::now();
                first.get_or_insert(last);
                received += 1;
            }
            Ok(_) => {}
            Err(RecvError::Timeout) => break,
            Err(e) => bail!(e),
        }
    }
    let seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    let lost_reported = sub.lost();
    Ok(Outcome {
        received,
        seconds,
        lost_reported,
        shm_received: node.stats().shm_received,
        ..Default::default()
    })
}

/// Reads one byte in each 4 KiB of a received payload, as a consumer of
/// the data would at the least: a sample through shared memory is a
/// reference to the ring until read, a raw libzmq message has had its
/// bytes copied in by the kernel.
fn read_payload(b: &[u8]) {
    let x = b.iter().step_by(4096).fold(0u8, |a, x| a ^ x);
    std::hint::black_box(x);
}

// ---- latency ----

fn percentiles(mut rtts_ns: Vec<u64>) -> (f64, f64) {
    rtts_ns.sort_unstable();
    let at = |q: f64| {
        let i = ((rtts_ns.len() as f64 - 1.0) * q).round() as usize;
        rtts_ns.get(i).copied().unwrap_or(0) as f64 / 2.0 / 1000.0
    };
    (at(0.5), at(0.99))
}

fn raw_pair(
    ctx: &zmq::Context,
    bind: &str,
    connect: &str,
    hwm: i32,
) -> Result<(zmq::Socket, zmq::Socket)> {
    let p = ctx.socket(zmq::PUB)?;
    p.set_sndhwm(hwm)?;
    p.set_linger(0)?;
    p.bind(bind)?;
    let s = ctx.socket(zmq::SUB)?;
    s.set_rcvhwm(hwm)?;
    s.set_subscribe(b"")?;
    s.connect(connect)?;
    Ok((p, s))
}

/// A PUB and a SUB that both connect, to raw proxies.
fn raw_pair_via(
    ctx: &zmq::Context,
    to: &str,
    from: &str,
    hwm: i32,
) -> Result<(zmq::Socket, zmq::Socket)> {
    let p = ctx.socket(zmq::PUB)?;
    p.set_sndhwm(hwm)?;
    p.set_linger(0)?;
    p.connect(to)?;
    let s = ctx.socket(zmq::SUB)?;
    s.set_rcvhwm(hwm)?;
    s.set_subscribe(b"")?;
    s.connect(from)?;
    Ok((p, s))
}

fn raw_ping(
    ctx: &zmq::Context,
    at: &Place,
    back: &str,
    size: usize,
    n: usize,
    via: Option<(String, String)>,
) -> Result<Outcome> {
    let (mut p, s) = match via {
        Some((to, from)) => raw_pair_via(ctx, &to, &from, at.hwm)?,
        None => raw_pair(ctx, &at.address, back, at.hwm)?,
    };
    let payload = Bytes::from(vec![0x5au8; size]);
    // Large payloads leave without a copy, as in the throughput baseline.
    let zero_copy = size >= 64 << 10;
    // Warm up until the pong answers.
    s.set_rcvtimeo(20)?;
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        p.send(&payload[..], 0)?;
        if s.recv_msg(0).is_ok() {
            break;
        }
        if Instant::now() > end {
            bail!("raw pong never answered");
        }
    }
    s.set_rcvtimeo(100)?;
    while s.recv_msg(0).is_ok() {}
    s.set_rcvtimeo(10_000)?;
    let mut rtts = Vec::with_capacity(n);
    let mut msg = zmq::Message::new();
    for _ in 0..n {
        let t = Instant::now();
        if zero_copy {
            crate::ffi::send_shared(&mut p, &payload)?;
        } else {
            p.send(&payload[..], 0)?;
        }
        s.recv(&mut msg, 0).context("raw pong stopped answering")?;
        rtts.push(t.elapsed().as_nanos() as u64);
    }
    p.send(&[][..], 0)?;
    let (p50_us, p99_us) = percentiles(rtts);
    Ok(Outcome {
        p50_us,
        p99_us,
        ..Default::default()
    })
}

fn raw_pong(
    ctx: &zmq::Context,
    at: &Place,
    back: &str,
    via: Option<(String, String)>,
) -> Result<Outcome> {
    let (p, s) = match via {
        Some((to, from)) => raw_pair_via(ctx, &to, &from, at.hwm)?,
        None => raw_pair(ctx, back, &at.address, at.hwm)?,
    };
    s.set_rcvtimeo(60_000)?;
    loop {
        let msg = s.recv_msg(0).context("raw ping went silent")?;
        if msg.is_empty() {
            break;
        }
        // The received message itself goes back: no copy.
        p.send(msg, 0)?;
    }
    Ok(Outcome::default())
}

fn mlg_ping(at: &Place, size: usize, n: usize) -> Result<Outcome> {
    let node = Node::open_with(mlg_config(at, "bench-ping")?)?;
    let p = node.publisher("bench/ping")?;
    let s = node.subscribe("bench/pong")?;
    let payload = Value::Bytes(Bytes::from(vec![0x5au8; size]));
    let end = Instant::now() + Duration::from_secs(30);
    // Warm up until the pong answers with a sample (a status event, such
    // as the pong's publisher_alive, can come before the path works).
    loop {
        p.put(payload.clone())?;
        if matches!(
            s.recv_timeout(Duration::from_millis(20)),
            Ok(Event::Sample(_))
        ) {
            break;
        }
        if Instant::now() > end {
            bail!("milonga pong never answered");
        }
    }
    while s.recv_timeout(Duration::from_millis(100)).is_ok() {}
    let mut rtts = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        p.put(payload.clone())?;
        loop {
            match s.recv_timeout(Duration::from_secs(10)) {
                Ok(Event::Sample(_)) => break,
                Ok(_) => {}
                Err(e) => bail!("milonga pong stopped answering: {e}"),
            }
        }
        rtts.push(t.elapsed().as_nanos() as u64);
    }
    p.put(Value::Bytes(Bytes::new()))?;
    node.close();
    let (p50_us, p99_us) = percentiles(rtts);
    Ok(Outcome {
        p50_us,
        p99_us,
        ..Default::default()
    })
}

fn mlg_pong(at: &Place) -> Result<Outcome> {
    let node = Node::open_with(mlg_config(at, "bench-pong")?)?;
    let p = node.publisher("bench/pong")?;
    let s = node.subscribe("bench/ping")?;
    loop {
        match s.recv_timeout(Duration::from_secs(60)) {
            Ok(Event::Sample(x)) => {
                if x.bytes().is_some_and(Bytes::is_empty) {
                    break;
                }
                p.put(x.value)?;
            }
            Ok(_) => {}
            Err(e) => bail!("milonga ping went silent: {e}"),
        }
    }
    node.close();
    Ok(Outcome::default())
}

fn latency(a: LatencyArgs, t: Transport) -> Result<ExitCode> {
    if a.via_broker && (t != Transport::Tcp || a.hosts != 1) {
        bail!("--via-broker runs over tcp on one host");
    }
    let tmp = std::env::temp_dir().join(format!("mlg-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let inproc_ctx = (t == Transport::Inproc).then(zmq::Context::new);
    let bed = bed_for(a.hosts, t, a.delay_ms)?;
    eprintln!("# milonga bench latency: transport {}, one message in flight, one-way latency = round trip / 2; the q-quantile is the round((n - 1) q)-th of the n sorted round trips (ZeroMQ's local_lat prints the mean instead)", t.name());
    eprintln!("{IN_TURN}");
    if bed.is_some() {
        eprintln!("# two hosts: ping on one network namespace (10.99.0.1), pong on another (10.99.0.2), joined by veth pairs and a bridge");
    }
    if a.format == Format::Csv {
        println!("system,transport,payload_bytes,latency_p50_us,latency_p99_us,round_trips");
    } else {
        println!(
            "{:<9} {:>6} {:>9} {:>10} {:>10} {:>8}",
            "system", "transp", "bytes", "p50 us", "p99 us", "trips"
        );
    }
    let shm_from = milonga::Config::new("milonga:///x", "x").shm_threshold_bytes;
    let mut cell = 0;
    for (turn, &size) in a.sizes.iter().enumerate() {
        let n = if size >= 1 << 20 {
            (a.round_trips / 10).max(100)
        } else {
            a.round_trips
        };
        let mut these = systems(a.baseline, a.with_security, a.via_broker);
        if a.spin_us > 0 {
            these.push("mlg-spin");
        }
        if a.shm_small.is_some_and(|b| size >= b && size < shm_from) && t != Transport::Inproc {
            these.push("mlg-shm");
        }
        if a.via_broker {
            // Two federated brokers: ping behind one, pong behind the
            // other (two hops each way).
            these.push("mlg-fed2");
        }
        for system in in_turn(&these, turn) {
            cell += 1;
            let domain = format!("bench-lat-{}-{cell}", std::process::id());
            // Through raw proxies: one each way (ping to pong, pong to
            // ping), as a broker carries both.
            let relays = match system {
                "raw-proxy" => vec![
                    crate::bench_broker::Relay::raw_proxy(hwm_for(size), false)?,
                    crate::bench_broker::Relay::raw_proxy(hwm_for(size), false)?,
                ],
                "mlg-broker" => vec![crate::bench_broker::Relay::broker(
                    &domain,
                    hwm_for(size),
                    None,
                )?],
                "mlg-brk+curve" => vec![crate::bench_broker::Relay::broker(
                    &domain,
                    hwm_for(size),
                    Some(&bench_keys(&tmp)?),
                )?],
                "mlg-fed2" => {
                    let b1 = crate::bench_broker::Relay::broker(&domain, hwm_for(size), None)?;
                    let b2 = crate::bench_broker::Relay::linked_broker(
                        &domain,
                        hwm_for(size),
                        Some(&b1.back),
                    )?;
                    vec![b1, b2]
                }
                _ => vec![],
            };
            let at = Place {
                address: if matches!(system, "mlg-broker" | "mlg-fed2" | "mlg-brk+curve") {
                    relays[0].front.clone()
                } else if system == "raw-zmq" {
                    endpoint_on(
                        bed.as_ref(),
                        0,
                        t,
                        &format!("l{cell}a"),
                        21_000 + cell as u16,
                    )?
                } else {
                    format!("milonga:///bench-lat-{}-{cell}", std::process::id())
                },
                runtime_dir: tmp.display().to_string(),
                transport: t.name().to_owned(),
                hwm: hwm_for(size),
                history: 0,
                keys: matches!(system, "mlg+curve" | "mlg-brk+curve")
                    .then(|| bench_keys(&tmp))
                    .transpose()?,
                spin_us: if system == "mlg-spin" { a.spin_us } else { 0 },
                no_shm: false,
                loan: false,
                shm_small: a.shm_small.filter(|_| system == "mlg-shm"),
            };
            let roles = if system == "raw-proxy" {
                let (ab, ba) = (&relays[0], &relays[1]);
                vec![
                    Role::RawPing {
                        at: at.clone(),
                        back: String::new(),
                        size,
                        n,
                        via: Some((ab.front.clone(), ba.back.clone())),
                    },
                    Role::RawPong {
                        at,
                        back: String::new(),
                        via: Some((ba.front.clone(), ab.back.clone())),
                    },
                ]
            } else if system == "raw-zmq" {
                let back = endpoint_on(
                    bed.as_ref(),
                    1,
                    t,
                    &format!("l{cell}b"),
                    22_000 + cell as u16,
                )?;
                vec![
                    Role::RawPing {
                        at: at.clone(),
                        back: back.clone(),
                        size,
                        n,
                        via: None,
                    },
                    Role::RawPong {
                        at,
                        back,
                        via: None,
                    },
                ]
            } else {
                // The pong behind the second broker of a federation.
                let pong_at = match relays.get(1) {
                    Some(b2) if system == "mlg-fed2" => Place {
                        address: b2.front.clone(),
                        ..at.clone()
                    },
                    _ => at.clone(),
                };
                vec![
                    Role::MlgPing {
                        at: at.clone(),
                        size,
                        n,
                    },
                    Role::MlgPong { at: pong_at },
                ]
            };
            let outs = Workers::start(roles, inproc_ctx.as_ref(), bed.as_ref())?.finish()?;
            let o = &outs[0];
            let mut cpu_ns = 0;
            let relayed = !relays.is_empty();
            for r in relays {
                cpu_ns += r.finish()?;
            }
            if relayed {
                eprintln!(
                    "# {system} {size} B: relay CPU {:.2} us per round trip ({n} round trips, warm-up included)",
                    cpu_ns as f64 / 1e3 / n.max(1) as f64
                );
            }
            let mut out = std::io::stdout().lock();
            match a.format {
                Format::Csv => writeln!(
                    out,
                    "{system},{},{size},{:.1},{:.1},{n}",
                    t.name(),
                    o.p50_us,
                    o.p99_us
                )?,
                Format::Table => writeln!(
                    out,
                    "{system:<9} {:>6} {size:>9} {:>10.1} {:>10.1} {n:>8}",
                    t.name(),
                    o.p50_us,
                    o.p99_us
                )?,
            }
            out.flush()?;
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(ExitCode::SUCCESS)
}
