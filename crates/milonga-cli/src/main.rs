//! `milonga`: publish, subscribe, call, serve, list, demo and benchmark.
// `unsafe` lives in ffi.rs alone.
#![deny(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use milonga::p2p::{NodeExt, ServiceExt};
use milonga::{Config, Event, Node, PublisherQos, RecvError, SubscriberQos, Transport};

mod args;
mod bench;
mod bench_broker;
mod bench_deadlines;
mod bench_discovery;
mod bench_encoding;
mod bench_liveliness;
mod bench_record;
mod bench_registry;
mod bench_rpc;
mod bench_scale;
mod broker;
mod demo;
#[allow(unsafe_code)]
mod ffi;
mod json;
mod record;

pub(crate) static INTERRUPTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Makes SIGINT, SIGTERM and SIGHUP set a flag that long-running commands check, so
/// that they close their node (withdrawing its announcement) before exiting.
pub fn catch_interrupts() {
    ffi::catch_interrupts();
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived (after [`catch_interrupts`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Sleeps `d`, or until interrupted (looked at every 50 ms).
pub(crate) fn sleep_unless_interrupted(d: Duration) {
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if interrupted() || left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Puts with `put`, given how long it may wait for room, in waits of at
/// most 100 ms, so that Ctrl-C or SIGTERM ends a reliable put held up by
/// a subscriber that does not read (a reliable publisher waits for ever
/// otherwise): `Ok(false)` if interrupted before the put was taken.
pub(crate) fn put_interruptibly(
    mut put: impl FnMut(Duration) -> Result<(), milonga::PutError>,
) -> Result<bool, milonga::PutError> {
    loop {
        match put(Duration::from_millis(100)) {
            Err(milonga::PutError::Timeout(_)) if !interrupted() => {}
            Err(milonga::PutError::Timeout(_)) => return Ok(false),
            other => return other.map(|()| true),
        }
    }
}

/// Milonga: event and messaging middleware for control systems.
#[derive(Parser, Debug)]
#[command(name = "milonga", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    net: NetArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where the domain is and how to reach it; every command takes these.
#[derive(Args, Debug, Clone)]
pub struct NetArgs {
    /// Domain locator, such as milonga:///lab.
    #[arg(
        long,
        global = true,
        env = "MILONGA_LOCATOR",
        default_value = "milonga:///default"
    )]
    pub locator: String,
    /// Control endpoint of a node on another host (static discovery); repeatable.
    #[arg(long = "peer", global = true, value_name = "ENDPOINT")]
    pub peers: Vec<String>,
    /// Transport this node binds on: tcp, ipc or inproc.
    #[arg(long, global = true, env = "MILONGA_TRANSPORT")]
    pub transport: Option<Transport>,
    /// Fixed control endpoint of this node, for peers on other hosts.
    #[arg(long, global = true, env = "MILONGA_CONTROL_ENDPOINT")]
    pub control_endpoint: Option<String>,
    /// CURVE on every connection: auto (the default: on when the node
    /// listens on an address other hosts reach, or --key is given), on or
    /// off (docs/security.md).
    #[arg(long, global = true, value_name = "auto|on|off")]
    pub security: Option<milonga::Security>,
    /// This node's secret key file (NAME.key, from `milonga keygen`).
    #[arg(long = "key", global = true, value_name = "FILE")]
    pub key_file: Option<std::path::PathBuf>,
    /// Directory of trusted public keys (*.pub): who may connect.
    #[arg(long = "trust", global = true, value_name = "DIR")]
    pub trust_dir: Option<std::path::PathBuf>,
    /// Access control rules: who may put, subscribe, serve, call, history
    /// on which keys; everything else is denied (docs/security.md).
    #[arg(long = "acl", global = true, value_name = "FILE")]
    pub acl_file: Option<std::path::PathBuf>,
    /// This node's name (shown as NAME@host:pid by `ls` and in liveliness
    /// events); default: the command's.
    #[arg(long = "node-name", global = true, value_name = "NAME")]
    pub node_name: Option<String>,
}

impl NetArgs {
    /// The node configuration: environment, then these flags.
    pub fn config(&self, name: &str) -> Result<Config> {
        let name = self.node_name.as_deref().unwrap_or(name);
        let mut c = Config::from_env(&self.locator, name)?;
        c.locator = self.locator.clone();
        c.peers.extend(self.peers.iter().cloned());
        if let Some(t) = self.transport {
            c.transport = t;
        }
        if let Some(e) = &self.control_endpoint {
            c.control_endpoint = Some(e.clone());
        }
        if let Some(k) = &self.key_file {
            c.key_file = Some(k.clone());
            c.security = milonga::Security::On;
        }
        if let Some(t) = &self.trust_dir {
            c.trust_dir = Some(t.clone());
        }
        if let Some(a) = &self.acl_file {
            c.acl_file = Some(a.clone());
        }
        if let Some(s) = self.security {
            c.security = s;
        }
        Ok(c)
    }

    /// Opens a node named `name`.
    pub fn open(&self, name: &str) -> Result<Node> {
        Node::open_with(self.config(name)?).with_context(|| format!("cannot open {}", self.locator))
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Publish a JSON value (sent as CBOR) on a key.
    Pub(PubArgs),
    /// Subscribe to a key expression and print what arrives.
    Sub(SubArgs),
    /// Call a service with a JSON value and print its reply as JSON.
    Call(CallArgs),
    /// Serve a key (an echo, for tests and benchmarks).
    Serve(ServeArgs),
    /// List the nodes of the domain: endpoints, keys, services and counters.
    Ls(LsArgs),
    /// Make a CURVE identity: DIR/NAME.key (secret, mode 0600) and DIR/NAME.pub.
    Keygen(KeygenArgs),
    /// Record what key expressions carry into an MCAP file.
    Record(record::RecordArgs),
    /// Print a recording's samples and events.
    Cat(record::CatArgs),
    /// Summarise a recording: keys, counts, time range, rates, gaps, size.
    Info(record::InfoArgs),
    /// Publish a recording's samples again, at the recorded pace or faster.
    Replay(record::ReplayArgs),
    /// Run a small simulated control system and a live monitor.
    Demo(demo::DemoArgs),
    /// Serve nodes opened on milonga://HOST:PORT/DOMAIN (docs/broker.md).
    Broker(broker::BrokerArgs),
    /// Measure throughput and latency against raw libzmq.
    Bench(bench::BenchArgs),
    /// A simulated device server (used by `demo`).
    #[command(hide = true)]
    Device(demo::DeviceArgs),
    /// A benchmark worker process (used by `bench`).
    #[command(hide = true)]
    BenchWorker(bench::WorkerArgs),
    /// A request/reply benchmark worker process (used by `bench rpc`).
    #[command(hide = true)]
    BenchRpcWorker(bench_rpc::RpcWorkerArgs),
    /// A discovery benchmark node process (used by `bench discovery`).
    #[command(hide = true)]
    BenchDiscWorker(bench_discovery::DiscWorkerArgs),
    /// A registry benchmark worker process (used by `bench registry`).
    #[command(hide = true)]
    BenchRegistryWorker(bench_registry::RegWorkerArgs),
}

#[derive(Args, Debug)]
struct KeygenArgs {
    /// The identity's name: letters, digits, '.', '_', '-'.
    #[arg(long)]
    name: String,
    /// The directory to write to (made, mode 0700, if missing).
    #[arg(short = 'o', long = "out", default_value = ".")]
    out: std::path::PathBuf,
}

#[derive(Args, Debug)]
struct PubArgs {
    /// The key, such as sr/ps/1/current.
    key: String,
    /// The value as JSON, such as 12.5 or '{"status": "ON"}'.
    #[arg(required_unless_present = "bytes")]
    value: Option<String>,
    /// Put a byte string of this many bytes instead of VALUE (a payload of
    /// a given size, such as a camera frame).
    #[arg(long, conflicts_with = "value")]
    bytes: Option<usize>,
    /// Puts per second; may be fractional (0.5 = every two seconds).
    #[arg(long, default_value_t = 1.0, value_parser = args::rate)]
    rate: f64,
    /// Stop after this many puts (default: run until interrupted).
    #[arg(long)]
    count: Option<u64>,
    /// Reliable delivery: wait for slow subscribers instead of dropping.
    #[arg(long)]
    reliable: bool,
    /// Keep the last N samples for late joiners and repair.
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Compress payloads of 512 bytes or more on the wire (default: the
    /// `compression` setting, MILONGA_COMPRESSION; docs/compression.md).
    #[arg(long, value_parser = ["none", "lz4", "zstd"])]
    compression: Option<String>,
    /// Before the first put, wait until this many subscriptions match.
    #[arg(long, default_value_t = 0)]
    wait_subscribers: u32,
    /// How long to wait for them, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = args::seconds)]
    wait_timeout: f64,
}

#[derive(Args, Debug)]
struct SubArgs {
    /// Key expression: `*` is one chunk, `**` any number (sr/*/1/**).
    expr: String,
    /// One JSON object per line: key, seq, timestamp_ns, publisher, value;
    /// status events as lines with an "event" field (lost,
    /// publisher_alive, publisher_lost, deadline_missed, subscription_live,
    /// incompatible_qos), and a
    /// last line `{"event": "summary", "lost": N, "lost_by_publisher": {..}}`.
    #[arg(long)]
    json: bool,
    /// Exit after this many samples.
    #[arg(long)]
    count: Option<u64>,
    /// Exit after this many seconds; with --count, exit status 2 if fewer
    /// samples arrived.
    #[arg(long, value_parser = args::seconds)]
    timeout: Option<f64>,
    /// On joining, first receive the last N samples publishers keep of
    /// every matching key, then `subscription_live`, then the live stream.
    #[arg(long, default_value_t = 0)]
    last: usize,
    /// Ask for reliable delivery: gaps from reliable publishers with
    /// history are repaired; a best-effort publisher is reported as
    /// `incompatible_qos`.
    #[arg(long)]
    reliable: bool,
    /// Only samples for which this expression holds, evaluated by the
    /// publisher: `value > 3.5 && status == "ON"` (docs/filters.md).
    #[arg(long)]
    filter: Option<String>,
    /// Only samples whose value changed by at least this much since the
    /// last one sent (element-wise for arrays).
    #[arg(long)]
    abs_change: Option<f64>,
    /// Only samples whose value changed by at least this fraction.
    #[arg(long)]
    rel_change: Option<f64>,
    /// At most one sample per key per this many milliseconds.
    #[arg(long)]
    min_period_ms: Option<u64>,
    /// Keep only the newest N samples of each key when this reader is slow
    /// (older ones are squashed, not lost).
    #[arg(long, conflicts_with = "keep_all", value_parser = clap::value_parser!(u32).range(1..))]
    keep_last: Option<u32>,
    /// Keep every sample, at most N waiting when this reader is slow;
    /// beyond, report them lost.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    keep_all: Option<u32>,
    /// Report `deadline_missed` for a key silent longer than this many
    /// milliseconds (and again each period until it speaks; at most a
    /// year).
    #[arg(long, value_parser = args::deadline_millis)]
    deadline_ms: Option<f64>,
    /// Sleep this many milliseconds after each sample: a deliberately slow
    /// consumer, to see reliable back-pressure or best-effort loss.
    #[arg(long, default_value_t = 0.0, value_parser = args::millis)]
    sleep_ms: f64,
}

/// Exit status of `milonga call` for each failure outcome.
mod call_exit {
    pub const TIMEOUT: u8 = 3;
    pub const NO_SERVER: u8 = 4;
    pub const REMOTE_ERROR: u8 = 5;
    pub const SERVER_LOST: u8 = 6;
    pub const REJECTED: u8 = 7;
}

#[derive(Args, Debug)]
#[command(
    after_help = "Exit status: 0 reply, 3 timeout, 4 no server, 5 remote error, \
6 server lost, 7 rejected, 2 arguments the parser refuses, 1 anything else \
(a VALUE that is not JSON, no node)."
)]
struct CallArgs {
    /// The service's key, such as sr/ps/1/set_current; with --all, a key
    /// expression.
    key: String,
    /// The request as JSON, such as 12.5 or '{"amps": 12.5}'.
    value: String,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 5.0, value_parser = args::seconds)]
    timeout: f64,
    /// Call every server of every matching key and print one JSON line per
    /// server: {"key", "server", "reply"} or {"key", "server", "error"}.
    #[arg(long)]
    all: bool,
    /// Wait up to this many seconds for discovery to find a server (useful
    /// with static peers, which are asked asynchronously).
    #[arg(long, default_value_t = 0.0, value_parser = args::seconds)]
    wait_server: f64,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// The key to serve, such as lab/echo.
    key: String,
    /// Reply with the request value.
    #[arg(long, required_unless_present = "error")]
    echo: bool,
    /// Instead of echoing, fail every call with this error kind.
    #[arg(long, value_name = "KIND", conflicts_with = "echo")]
    error: Option<String>,
    /// Worker threads.
    #[arg(long, default_value_t = milonga::ServeOptions::default().workers)]
    workers: usize,
    /// Requests that may wait for a worker before calls are rejected.
    #[arg(long, default_value_t = milonga::ServeOptions::default().max_queued)]
    max_queued: usize,
    /// Sleep this many milliseconds in the handler before answering (a
    /// stop cuts the sleep short).
    #[arg(long, default_value_t = 0.0, value_parser = args::millis)]
    delay_ms: f64,
    /// Panic in the handler when the request equals this JSON value (to
    /// show that a panic is a remote error and the service goes on).
    #[arg(long, value_name = "JSON")]
    panic_on: Option<String>,
}

#[derive(Args, Debug)]
struct LsArgs {
    /// Print JSON: one array of nodes with their announcement and counters.
    #[arg(long)]
    json: bool,
    /// How long to look for nodes, in seconds.
    #[arg(long, default_value_t = 0.3, value_parser = args::seconds)]
    wait: f64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours on a terminal only, not in a file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Pub(a) => cmd_pub(&cli.net, a),
        Cmd::Sub(a) => cmd_sub(&cli.net, a),
        Cmd::Call(a) => cmd_call(&cli.net, a),
        Cmd::Serve(a) => cmd_serve(&cli.net, a),
        Cmd::Ls(a) => cmd_ls(&cli.net, a),
        Cmd::Keygen(a) => cmd_keygen(&a),
        Cmd::Record(a) => record::cmd_record(&cli.net, a),
        Cmd::Cat(a) => record::cmd_cat(a),
        Cmd::Info(a) => record::cmd_info(a),
        Cmd::Replay(a) => record::cmd_replay(&cli.net, a),
        Cmd::Demo(a) => demo::run(&cli.net, a),
        Cmd::Broker(a) => broker::run(&cli.net, a),
        Cmd::Device(a) => demo::device(&cli.net, a),
        Cmd::Bench(a) => bench::run(&cli.net, a),
        Cmd::BenchWorker(a) => bench::worker(a),
        Cmd::BenchRpcWorker(a) => bench_rpc::worker(a),
        Cmd::BenchDiscWorker(a) => bench_discovery::worker(a),
        Cmd::BenchRegistryWorker(a) => bench_registry::worker(a),
    };
    match r {
        Ok(code) => code,
        // `milonga sub ... | head`: the reader of the output left, which
        // ends the command, and nothing failed. (A broken pipe elsewhere,
        // a bench worker's input, is a failure: stdout is still read.)
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            }) && ffi::stdout_reader_gone() =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("milonga: {}", said_once(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, joined by `: `, each said once: the library's
/// errors name their cause in their own message too (for callers that
/// print only that), which `{:#}` would print again.
pub(crate) fn said_once(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let c = cause.to_string();
        if out.contains(&c) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&c);
    }
    out
}

fn cmd_pub(net: &NetArgs, a: PubArgs) -> Result<ExitCode> {
    // Checked before it is made: 2^64 bytes asked panicked.
    let max = net.config("pub")?.max_message_bytes;
    let value = match (&a.value, a.bytes) {
        (_, Some(n)) if n > max => {
            bail!("--bytes {n}: more than max_message_bytes ({max}) allows")
        }
        (_, Some(n)) => milonga::Value::Bytes(vec![0x5a; n].into()),
        (Some(v), None) => {
            let j: serde_json::Value =
                serde_json::from_str(v).with_context(|| format!("VALUE {v:?} is not JSON"))?;
            json::from_json(&j)
        }
        (None, None) => bail!("give a VALUE or --bytes N"),
    };
    let node = net.open("pub")?;
    let qos = if a.reliable {
        PublisherQos::reliable()
    } else {
        PublisherQos::best_effort()
    }
    .history(a.history);
    let qos = match a.compression.as_deref() {
        Some("lz4") => qos.compression(milonga::Compression::lz4()),
        Some("zstd") => qos.compression(milonga::Compression::zstd()),
        Some(_) => qos.compression(milonga::Compression::none()),
        None => qos,
    };
    let p = node.publisher_with(&a.key, qos)?;
    if a.wait_subscribers > 0 {
        let end = Instant::now() + Duration::from_secs_f64(a.wait_timeout);
        while p.subscriber_count() < a.wait_subscribers {
            if Instant::now() > end {
                bail!(
                    "only {} of {} subscribers after {} s",
                    p.subscriber_count(),
                    a.wait_subscribers,
                    a.wait_timeout
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let period = Duration::from_secs_f64(1.0 / a.rate);
    let start = Instant::now();
    let mut n = 0u64;
    catch_interrupts();
    while a.count.is_none_or(|c| n < c) && !interrupted() {
        if !put_interruptibly(|t| p.put_timeout(value.clone(), t))? {
            break;
        }
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            break;
        }
        let next = start + period.mul_f64(n as f64);
        while let Some(d) = next.checked_duration_since(Instant::now()) {
            if interrupted() {
                break;
            }
            std::thread::sleep(d.min(Duration::from_millis(100)));
        }
    }
    node.close();
    Ok(ExitCode::SUCCESS)
}

fn cmd_sub(net: &NetArgs, a: SubArgs) -> Result<ExitCode> {
    let node = net.open("sub")?;
    let mut qos = SubscriberQos::default().last(a.last);
    if a.reliable {
        qos = qos.reliable();
    }
    if let Some(n) = a.keep_last {
        qos = qos.keep_last(n as usize);
    }
    let filter = milonga::Filter {
        expr: a.filter.clone(),
        abs_change: a.abs_change,
        rel_change: a.rel_change,
        min_period_ms: a.min_period_ms,
    };
    if filter != milonga::Filter::default() {
        qos = qos.filter(filter);
    }
    if let Some(n) = a.keep_all {
        qos = qos.keep_all(n as usize);
    }
    if let Some(ms) = a.deadline_ms {
        qos = qos.deadline(Duration::from_secs_f64(ms / 1000.0));
    }
    let sub = node.subscribe_with(&a.expr, qos)?;
    let code = receive(&sub, &a)?;
    // How many samples were lost, per publisher: a last JSON line
    // (`"event": "summary"`) or a line on stderr.
    let by: serde_json::Map<String, serde_json::Value> = sub
        .lost_by_publisher()
        .into_iter()
        .map(|(id, n)| (id.to_hex(), n.into()))
        .collect();
    if a.json {
        let line =
            serde_json::json!({"event": "summary", "lost": sub.lost(), "lost_by_publisher": by});
        let mut o = std::io::stdout().lock();
        writeln!(o, "{line}")?;
        o.flush()?;
    } else if sub.lost() > 0 {
        eprintln!(
            "milonga sub: lost {} samples; by publisher: {}",
            sub.lost(),
            serde_json::Value::Object(by)
        );
    }
    node.close();
    Ok(code)
}

/// Prints events until the count, the timeout or an interrupt.
fn receive(sub: &milonga::Subscriber, a: &SubArgs) -> Result<ExitCode> {
    let end = a
        .timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t));
    catch_interrupts();
    let mut got = 0u64;
    let out = std::io::stdout();
    loop {
        if a.count.is_some_and(|c| got >= c) || interrupted() {
            return Ok(ExitCode::SUCCESS);
        }
        // Wait in slices so that an interrupt is noticed.
        let slice = Duration::from_millis(200);
        let ev = match end {
            None => sub.recv_timeout(slice),
            Some(e) => match e.checked_duration_since(Instant::now()) {
                Some(left) => sub.recv_timeout(left.min(slice)),
                None => Err(RecvError::Timeout),
            },
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(RecvError::Timeout) if end.is_none_or(|e| Instant::now() < e) => continue,
            Err(RecvError::Timeout) => {
                if let Some(c) = a.count {
                    eprintln!("milonga sub: {got} of {c} samples before the timeout");
                    return Ok(ExitCode::from(2));
                }
                return Ok(ExitCode::SUCCESS);
            }
            // A `file:///` locator: the recording was read to its end.
            Err(RecvError::EndOfRecording) => {
                if let Some(c) = a.count.filter(|c| got < *c) {
                    eprintln!("milonga sub: {got} of {c} samples in the recording");
                    return Ok(ExitCode::from(2));
                }
                return Ok(ExitCode::SUCCESS);
            }
            Err(e) => bail!(e),
        };
        let mut o = out.lock();
        if a.json {
            writeln!(o, "{}", json::event_line(&ev))?;
        } else {
            // Names, reasons and endpoints come from other nodes.
            let p = json::printable;
            match &ev {
                Event::Sample(s) => writeln!(
                    o,
                    "{} [{}] {}",
                    json::printable(&s.key),
                    s.seq,
                    json::short(&s.value)
                )?,
                Event::Lost(l) => writeln!(
                    o,
                    "! lost {} samples of {} from {} (from seq {})",
                    l.count,
                    p(&l.key),
                    l.publisher,
                    l.first_seq
                )?,
                Event::PublisherAlive(a) => writeln!(o, "! alive: {} {}", a.publisher, p(&a.name))?,
                Event::PublisherLost(l) => {
                    writeln!(o, "! lost ({}): {} {}", l.reason, l.publisher, p(&l.name))?
                }
                Event::SubscriptionLive => writeln!(o, "! live")?,
                Event::IncompatibleQos(q) => writeln!(
                    o,
                    "! incompatible QoS ({}) on {} from {}: {}",
                    q.policy.as_str(),
                    p(&q.key),
                    q.publisher,
                    p(&q.detail)
                )?,
                Event::DeadlineMissed(d) => writeln!(
                    o,
                    "! deadline missed: {} silent for {:.0} ms",
                    p(&d.key),
                    d.silent_for.as_secs_f64() * 1000.0
                )?,
                Event::PermissionDenied(d) => writeln!(
                    o,
                    "! permission denied by {}{}: {}",
                    p(&d.endpoint),
                    d.publisher
                        .map(|n| format!(" (node {n})"))
                        .unwrap_or_default(),
                    p(&d.reason)
                )?,
                Event::BrokerChanged(b) => {
                    writeln!(o, "! broker changed: {} -> {}", p(&b.from), p(&b.to))?
                }
                other => writeln!(o, "! {other:?}")?,
            }
        }
        o.flush()?;
        if matches!(ev, Event::Sample(_)) {
            got += 1;
            if a.sleep_ms > 0.0 {
                sleep_unless_interrupted(Duration::from_secs_f64(a.sleep_ms / 1000.0));
            }
        }
    }
}

fn cmd_call(net: &NetArgs, a: CallArgs) -> Result<ExitCode> {
    use milonga::CallError;
    let value: serde_json::Value = serde_json::from_str(&a.value)
        .with_context(|| format!("VALUE {:?} is not JSON", a.value))?;
    let value = json::from_json(&value);
    let node = net.open("call")?;
    let timeout = Duration::from_secs_f64(a.timeout);
    let until = Instant::now() + Duration::from_secs_f64(a.wait_server);
    let exit = |e: &CallError| match e {
        CallError::Timeout { .. } => call_exit::TIMEOUT,
        CallError::NoServer { .. } => call_exit::NO_SERVER,
        CallError::Remote { .. } => call_exit::REMOTE_ERROR,
        CallError::ServerLost { .. } => call_exit::SERVER_LOST,
        CallError::Rejected { .. } => call_exit::REJECTED,
        _ => 1,
    };
    let mut o = std::io::stdout().lock();
    if a.all {
        let replies = loop {
            match node.call_all(&a.key, value.clone(), timeout) {
                Err(CallError::NoServer { .. }) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    eprintln!("milonga call: {e}");
                    return Ok(ExitCode::from(exit(&e)));
                }
                Ok(r) => break r,
            }
        };
        let mut worst = 0;
        for r in replies {
            let line = match &r.result {
                Ok(v) => {
                    serde_json::json!({"key": r.key, "server": r.server, "reply": json::to_json(v)})
                }
                Err(e) => {
                    worst = worst.max(exit(e));
                    serde_json::json!({"key": r.key, "server": r.server, "error": e.to_string()})
                }
            };
            writeln!(o, "{line}")?;
        }
        node.close();
        return Ok(ExitCode::from(worst));
    }
    let r = loop {
        match node.call(&a.key, value.clone(), timeout) {
            Err(CallError::NoServer { .. }) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => break r,
        }
    };
    node.close();
    match r {
        Ok(v) => {
            writeln!(o, "{}", json::to_json(&v))?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("milonga call: {e}");
            Ok(ExitCode::from(exit(&e)))
        }
    }
}

fn cmd_serve(net: &NetArgs, a: ServeArgs) -> Result<ExitCode> {
    use milonga::{ServeOptions, ServiceError};
    let panic_on = match &a.panic_on {
        Some(j) => Some(json::from_json(
            &serde_json::from_str(j).with_context(|| format!("--panic-on {j:?} is not JSON"))?,
        )),
        None => None,
    };
    let node = net.open("serve")?;
    let delay = Duration::from_secs_f64(a.delay_ms / 1000.0);
    let error = a.error.clone();
    let opts = ServeOptions::default()
        .workers(a.workers)
        .max_queued(a.max_queued);
    let svc = node.serve_with(&a.key, opts, move |req| {
        if panic_on.as_ref() == Some(&req.value) {
            panic!("asked to panic by the request");
        }
        if !delay.is_zero() {
            sleep_unless_interrupted(delay);
        }
        match &error {
            Some(kind) => Err(ServiceError::new(
                kind.clone(),
                format!("serving {kind} errors as asked"),
            )),
            None => Ok(req.value),
        }
    })?;
    catch_interrupts();
    {
        let mut o = std::io::stdout().lock();
        writeln!(o, "serving {} at {}", svc.key(), svc.endpoint())?;
        o.flush()?;
    }
    while !interrupted() {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(svc);
    node.close();
    Ok(ExitCode::SUCCESS)
}

fn cmd_keygen(a: &KeygenArgs) -> Result<ExitCode> {
    let id = milonga::security::Identity::generate(&a.name)?;
    let (secret, public) = id.write(&a.out)?;
    let mut o = std::io::stdout().lock();
    writeln!(
        o,
        "secret key: {} (mode 0600: keep it to this node)",
        secret.display()
    )?;
    writeln!(
        o,
        "public key: {} (copy it into the trust directories of the nodes that talk to this one)",
        public.display()
    )?;
    writeln!(o, "key: {}", id.public())?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_ls(net: &NetArgs, a: LsArgs) -> Result<ExitCode> {
    let node = net.open("ls")?;
    std::thread::sleep(Duration::from_secs_f64(a.wait));
    let me = node.id().to_hex();
    let mut rows = Vec::new();
    let peers: Vec<_> = node
        .peers()
        .into_iter()
        .filter(|p| p.node_id != me)
        .collect();
    // All at once: a node that does not answer costs one timeout in all.
    let controls: Vec<String> = peers.iter().map(|p| p.control.clone()).collect();
    let infos = node.query_many(&controls, Duration::from_millis(500));
    let secured = node.security() == milonga::Security::On;
    let row = |peer: &milonga::Announcement| {
        let mut r = serde_json::json!({
            "name": peer.name,
            "node_id": peer.node_id,
            "host": peer.host,
            "pid": peer.pid,
            "control": peer.control,
            "data_best_effort": peer.data_best_effort,
            "data_reliable": peer.data_reliable,
            "liveliness": peer.liveliness,
            "publications": peer.publications,
            "services": peer.services,
            "key": peer.key,
            "fingerprint": peer.key.as_deref().map(|k| k.chars().take(8).collect::<String>()),
        });
        // A broker's client shown by a secured broker (its key).
        if let Some(via) = &peer.via {
            r["via"] = serde_json::json!(via);
        }
        r
    };
    for (peer, info) in peers.iter().zip(infos) {
        let mut r = row(peer);
        r["trusted"] = serde_json::json!(secured);
        r["stats"] = serde_json::json!(info.map(|i| i.stats));
        rows.push(r);
    }
    // Nodes seen and not connected to (security: an untrusted key, or a
    // security setting other than this node's).
    for (peer, why) in node.excluded_peers() {
        let mut r = row(&peer);
        r["trusted"] = serde_json::json!(false);
        r["excluded"] = serde_json::json!(why);
        r["stats"] = serde_json::Value::Null;
        rows.push(r);
    }
    // Through a broker: what it knows of its clients (their
    // subscriptions, counters and rates as they last reported them; a
    // client's control endpoint may be out of reach).
    if let Some(clients) = milonga::broker::clients(&node, Duration::from_millis(500)) {
        for c in clients {
            let Some(r) = rows.iter_mut().find(|r| r["node_id"] == c.node_id.as_str()) else {
                continue;
            };
            if r["stats"].is_null() && !c.stats.is_empty() {
                r["stats"] = serde_json::json!(c.stats);
            }
            r["broker_client"] = serde_json::json!({
                "broker": node.broker(),
                "attached_s": c.attached_s,
                "last_attach_ms": c.last_attach_ms,
                "subscriptions": c.subscriptions,
                "rates": c.rates,
                // Events waiting in the client for its application, as it
                // last reported (the broker's own queue to it is libzmq's,
                // not observable: its overflow shows as `samples_lost`).
                "queued": c.stats.get("queued"),
            });
        }
    }
    if a.json {
        writeln!(std::io::stdout(), "{}", serde_json::Value::Array(rows))?;
        return Ok(ExitCode::SUCCESS);
    }
    // What other nodes announced (names, hosts, endpoints, keys) is shown
    // with its control characters escaped, line breaks included: a name
    // cannot add lines of its own.
    let p = |v: &serde_json::Value| json::printable(v.as_str().unwrap_or("?")).into_owned();
    let mut o = std::io::stdout().lock();
    match node.broker() {
        Some(b) => writeln!(
            o,
            "domain {} through {b}: {} node(s)",
            node.domain(),
            rows.len()
        )?,
        None => writeln!(o, "domain {}: {} node(s)", node.domain(), rows.len())?,
    }
    for r in &rows {
        writeln!(
            o,
            "{}  id {}  host {} pid {}  control {}",
            p(&r["name"]),
            p(&r["node_id"]),
            p(&r["host"]),
            r["pid"],
            p(&r["control"])
        )?;
        if let Some(fp) = r["fingerprint"].as_str().map(json::printable) {
            let trust = if r["trusted"] == true {
                "trusted"
            } else {
                "not trusted"
            };
            writeln!(o, "  key {fp}... ({trust})")?;
        }
        if let Some(via) = r["via"].as_str() {
            // A broker's client, shown here by that secured broker.
            let fp: String = json::printable(via).chars().take(8).collect();
            writeln!(o, "  through the secured broker of key {fp}...")?;
        }
        if let Some(why) = r["excluded"].as_str().map(json::printable) {
            writeln!(o, "  not connected: {why}")?;
            continue;
        }
        for (label, field) in [
            ("best-effort data", "data_best_effort"),
            ("reliable data", "data_reliable"),
        ] {
            if let Some(ep) = r[field].as_str().map(json::printable) {
                writeln!(o, "  {label}: {ep}")?;
            }
        }
        for pb in r["publications"].as_array().into_iter().flatten() {
            // A data socket of its own (access control), if it has one.
            let at = pb["endpoint"]
                .as_str()
                .map(|e| format!(" at {}", json::printable(e)))
                .unwrap_or_default();
            writeln!(o, "  pub {} ({}){at}", p(&pb["key"]), p(&pb["reliability"]))?;
        }
        if let Some(c) = r["broker_client"].as_object() {
            let subs: Vec<String> = c["subscriptions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str())
                .map(|s| json::printable(s).into_owned())
                .collect();
            let rate = |k: &str| c["rates"][k].as_f64().unwrap_or(0.0);
            writeln!(
                o,
                "  broker client for {:.0} s: subscribes {}; {:.0} sent/s, {:.0} received/s, {:.0} lost/s, {} queued",
                c["attached_s"].as_f64().unwrap_or(0.0),
                if subs.is_empty() { "nothing".to_owned() } else { subs.join(", ") },
                rate("samples_sent_per_s"),
                rate("samples_received_per_s"),
                rate("samples_lost_per_s"),
                c["queued"].as_u64().unwrap_or(0),
            )?;
        }
        for sv in r["services"].as_array().into_iter().flatten() {
            writeln!(
                o,
                "  service {} at {} ({} workers)",
                p(&sv["key"]),
                p(&sv["endpoint"]),
                sv["workers"]
            )?;
        }
        if r["stats"].is_null() {
            writeln!(o, "  (did not answer a control request)")?;
        } else if let Some(s) = r["stats"].as_object() {
            let nonzero: Vec<String> = s
                .iter()
                .filter(|(_, v)| v.as_u64().is_some_and(|n| n > 0))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            writeln!(
                o,
                "  stats: {}",
                if nonzero.is_empty() {
                    "all zero".into()
                } else {
                    nonzero.join(" ")
                }
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// clap's own consistency checks over every command and option (two
    /// options of one name, a default that does not parse, ...).
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn an_error_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let e = anyhow::Error::new(milonga::recording::RecordError::Io {
            path: "run.mcap".into(),
            source: io,
        })
        .context("copying run.mcap");
        assert_eq!(said_once(&e), "copying run.mcap: run.mcap: No such file");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(said_once(&plain), "outer: inner");
    }

    #[test]
    fn bench_takes_the_common_transport_option() {
        let cli = Cli::try_parse_from(["milonga", "bench", "latency", "--transport", "ipc"])
            .expect("parses");
        assert_eq!(cli.net.transport, Some(Transport::Ipc));
    }
}
