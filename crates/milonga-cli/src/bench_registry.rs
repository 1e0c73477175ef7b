//! `milonga bench registry`: N peer-to-peer nodes registering with one
//! registry and finding each other through it (issue 14, item 6), through
//! a Milonga broker (`registry = tcp://...`) and through etcd
//! (`discovery = etcd`, Debian's `etcd-server`), in one run.
//!
//! The nodes are threads of a few worker processes (`--per-process`, 50 by
//! default: a thousand processes do not fit two cores), each node a full
//! `Node` with its own sockets and threads, over tcp on loopback, without
//! local discovery (so the registry is all they have). Every node declares
//! one publication. From a start instant given to every process, each
//! worker opens its nodes one after the other and reports, for each, when
//! its peer table first held all N-1 others. The bench prints the median
//! and the largest of those times, and the registry's CPU time (its
//! threads' /proc schedstat) until full view and per second at rest after, and its resident
//! memory at the end.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use milonga::{Config, Node, Transport};

use crate::bench::Format;

/// Which registry the nodes use.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A `milonga broker` (`registry = tcp://...`).
    Broker,
    /// etcd (`discovery = etcd`).
    Etcd,
}

/// Options of `milonga bench registry`.
#[derive(Args, Debug)]
pub struct RegistryArgs {
    /// Nodes in all.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Nodes per worker process (threads of one process).
    #[arg(long, default_value_t = 50)]
    per_process: usize,
    /// The registries to measure (default both, one after the other).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Via::Broker, Via::Etcd])]
    via: Vec<Via>,
    /// Seconds at rest, after full view, over which the registry's CPU is
    /// measured.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::positive_seconds)]
    rest: f64,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// Options of the `bench-registry-worker` process.
#[derive(Args, Debug)]
pub struct RegWorkerArgs {
    /// `broker` or `etcd`.
    via: String,
    /// The registry's endpoint (tcp://... or http://...).
    endpoint: String,
    /// The domain.
    domain: String,
    /// Runtime directory.
    runtime_dir: String,
    /// The numbers of this process's nodes: FIRST..FIRST+COUNT.
    first: usize,
    count: usize,
    /// Nodes in all (each waits for the others).
    total: usize,
    /// Wall clock (ns since the epoch) the times are measured from.
    start_ns: u64,
}

/// How long after full view the rest measurement starts.
const SETTLE: Duration = Duration::from_secs(5);
/// How long after the start instant the nodes have to see each other.
const WINDOW: Duration = Duration::from_secs(300);

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The worker: opens its nodes, prints `seen <ms>` for each once its peer
/// table holds every other node, then `ready`, and keeps them open until
/// its input ends.
pub fn worker(a: RegWorkerArgs) -> Result<std::process::ExitCode> {
    let wait = Duration::from_nanos(a.start_ns.saturating_sub(now_ns()));
    std::thread::sleep(wait);
    let mut nodes = Vec::with_capacity(a.count);
    for i in a.first..a.first + a.count {
        let mut cfg = Config::new(&format!("milonga:///{}", a.domain), &format!("reg-{i}"));
        cfg.security = milonga::Security::Off;
        cfg.runtime_dir = Some(a.runtime_dir.clone().into());
        cfg.local_discovery = false;
        cfg.transport = Transport::Tcp;
        // A node with a data socket turns every `discovery_interval_ms`
        // (20) to read its subscriptions: a thousand of them on two cores
        // would measure that, not discovery.
        cfg.discovery_interval_ms = 250;
        match a.via.as_str() {
            "broker" => cfg.registry = vec![a.endpoint.clone()],
            _ => {
                cfg.discovery = "etcd".into();
                cfg.etcd_endpoints = vec![a.endpoint.clone()];
            }
        }
        let node = Node::open_with(cfg)?;
        let p = node.publisher(&format!("reg/{i}"))?;
        nodes.push((node, p, false));
    }
    let opened = now_ns().saturating_sub(a.start_ns) as f64 / 1e6;
    println!("opened {opened:.1}");
    // 300 s after the start instant, the nodes that have not seen every
    // other are given up (the bench reports how many did).
    let deadline = Instant::now()
        + Duration::from_nanos((a.start_ns + WINDOW.as_nanos() as u64).saturating_sub(now_ns()));
    let mut left = nodes.len();
    let out = std::io::stdout();
    while left > 0 && Instant::now() < deadline {
        for (node, _, seen) in nodes.iter_mut().filter(|(_, _, s)| !s) {
            if node.peer_count() + 1 >= a.total {
                *seen = true;
                left -= 1;
                let ms = now_ns().saturating_sub(a.start_ns) as f64 / 1e6;
                writeln!(out.lock(), "seen {ms:.1}")?;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    writeln!(out.lock(), "ready")?;
    for _ in std::io::stdin().lines() {}
    drop(nodes);
    Ok(std::process::ExitCode::SUCCESS)
}

/// CPU time (ms) of process `pid`'s threads (schedstat: the broker's and
/// etcd's threads live as long as they do).
fn cpu_ms(pid: u32) -> Result<f64> {
    Ok(crate::bench_rpc::cpu_ns(pid)? as f64 / 1e6)
}

/// A child killed when dropped.
struct Kid(Child);

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A registry process: a broker, or etcd.
enum Registry {
    Broker(Kid),
    Etcd(milonga_testkit::etcd::Etcd),
}

impl Registry {
    fn pid(&self) -> u32 {
        match self {
            Registry::Broker(k) => k.0.id(),
            Registry::Etcd(e) => e.pid(),
        }
    }
}

/// The registry process, and its endpoint.
fn start_registry(via: Via, dir: &std::path::Path, domain: &str) -> Result<(Registry, String)> {
    match via {
        Via::Broker => {
            let mut child = Command::new(std::env::current_exe()?)
                .args(["broker", "--listen", "tcp://127.0.0.1:0", "--json"])
                .args(["--domain", domain])
                .env("MILONGA_RUNTIME_DIR", dir.join("broker"))
                .env_remove("MILONGA_LOCATOR")
                .stdout(Stdio::piped())
                .stdin(Stdio::null())
                .spawn()
                .context("cannot start milonga broker")?;
            let mut r = BufReader::new(child.stdout.take().context("piped")?);
            let mut line = String::new();
            r.read_line(&mut line)?;
            let v: serde_json::Value =
                serde_json::from_str(&line).with_context(|| format!("the broker said {line:?}"))?;
            let listen = v["listen"]
                .as_str()
                .context("a listen endpoint")?
                .to_owned();
            std::thread::spawn(move || for _ in r.lines() {});
            Ok((Registry::Broker(Kid(child)), listen))
        }
        Via::Etcd => {
            let e =
                milonga_testkit::etcd::Etcd::start(dir, Duration::from_secs(30)).map_err(|e| {
                    anyhow::anyhow!("{e} (etcd is Debian's etcd-server; make setup installs it)")
                })?;
            let url = e.url.clone();
            Ok((Registry::Etcd(e), url))
        }
    }
}

/// One measurement.
struct Row {
    via: Via,
    nodes: usize,
    /// How many saw every other within the window.
    complete: usize,
    opened_ms: f64,
    p50_ms: f64,
    max_ms: f64,
    cpu_to_view_ms: f64,
    rest_cpu_pct: f64,
    rss_mib: f64,
}

fn measure(a: &RegistryArgs, via: Via, dir: &std::path::Path) -> Result<Row> {
    let domain = format!("bench-reg-{}-{via:?}", std::process::id()).to_lowercase();
    let (registry, endpoint) = start_registry(via, dir, &domain)?;
    let pid = registry.pid();
    let cpu_at_start = cpu_ms(pid)?;
    // Every process gets the same start instant, a moment ahead.
    let start_ns = now_ns() + 500_000_000;
    let mut workers = Vec::new();
    let per = a.per_process.max(1);
    let mut first = 0;
    while first < a.nodes {
        let count = per.min(a.nodes - first);
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench-registry-worker", &format!("{via:?}").to_lowercase()])
            .args([&endpoint, &domain, &dir.join("nodes").display().to_string()])
            .args([first.to_string(), count.to_string(), a.nodes.to_string()])
            .arg(start_ns.to_string())
            .env_remove("MILONGA_LOCATOR")
            .env_remove("MILONGA_PEERS")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a registry worker")?;
        let out = child.stdout.take().context("piped")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        workers.push((Kid(child), rx));
        first += count;
    }
    let mut seen = Vec::with_capacity(a.nodes);
    let mut opened_ms: f64 = 0.0;
    let end = Instant::now() + WINDOW + Duration::from_secs(30);
    for (_, rx) in &workers {
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l == "ready" => break,
                Ok(l) if l.starts_with("opened ") => {
                    if let Ok(ms) = l["opened ".len()..].parse::<f64>() {
                        opened_ms = opened_ms.max(ms);
                    }
                }
                Ok(l) => {
                    if let Some(ms) = l.strip_prefix("seen ").and_then(|m| m.parse::<f64>().ok()) {
                        seen.push(ms);
                    }
                }
                Err(_) => bail!("{via:?}: a worker stopped before all its nodes saw the others"),
            }
        }
    }
    let cpu_to_view = cpu_ms(pid)? - cpu_at_start;
    if seen.is_empty() {
        bail!("{via:?}: no node saw every other within {WINDOW:?}");
    }
    // The last changes (publications declared after open) settle first.
    std::thread::sleep(SETTLE);
    let rest_from = cpu_ms(pid)?;
    let rest_start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(a.rest));
    let rest_cpu_pct =
        (cpu_ms(pid)? - rest_from) / (rest_start.elapsed().as_secs_f64() * 1000.0) * 100.0;
    let rss_mib = milonga_testkit::rss_kib(pid).unwrap_or(0) as f64 / 1024.0;
    seen.sort_by(f64::total_cmp);
    let row = Row {
        via,
        nodes: a.nodes,
        complete: seen.len(),
        opened_ms,
        p50_ms: seen[seen.len() / 2],
        max_ms: seen[seen.len() - 1],
        cpu_to_view_ms: cpu_to_view,
        rest_cpu_pct,
        rss_mib,
    };
    for (kid, _) in &mut workers {
        drop(kid.0.stdin.take());
    }
    drop(workers);
    drop(registry);
    Ok(row)
}

/// The columns of the output, in order.
const COLUMNS: [&str; 9] = [
    "via",
    "nodes",
    "complete",
    "all_open_ms",
    "p50_ms",
    "max_ms",
    "registry_cpu_to_view_ms",
    "registry_rest_cpu_pct",
    "registry_rss_mib",
];

/// One line of the output: comma-separated, or right-aligned under
/// [`COLUMNS`].
fn print_row(format: Format, cells: &[String]) {
    match format {
        Format::Csv => println!("{}", cells.join(",")),
        Format::Table => {
            let padded: Vec<String> = cells
                .iter()
                .zip(COLUMNS)
                .map(|(c, name)| format!("{c:>w$}", w = name.len().max(7)))
                .collect();
            println!("{}", padded.join(" "));
        }
    }
}

pub fn run(a: RegistryArgs) -> Result<std::process::ExitCode> {
    let dir = std::env::temp_dir().join(format!("mlg-bench-reg-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "# bench registry: {} nodes ({} per worker process, threads), tcp on loopback, no local discovery, \
         discovery_interval_ms 250 (each node publishes one key: at the default 20 ms, 1,000 node threads \
         turning 50 times a second would fill 2 cores); \
         all_open = when the last node was open (from the start instant); time to full view = from one start instant until a node's peer table holds every other node \
         (p50 and max over the nodes that did within 300 s: `complete` of them) \
         (the process opens its nodes one after the other: the later ones start later); registry CPU \
         (its threads' /proc schedstat) until every node has full view, then per second over {} s at rest from 5 s after; RSS at the end",
        a.nodes, a.per_process, a.rest
    );
    print_row(a.format, &COLUMNS.map(str::to_owned));
    let mut failed = false;
    for &via in &a.via {
        match measure(&a, via, &dir) {
            Ok(r) => print_row(
                a.format,
                &[
                    format!("{:?}", r.via).to_lowercase(),
                    r.nodes.to_string(),
                    r.complete.to_string(),
                    format!("{:.1}", r.opened_ms),
                    format!("{:.1}", r.p50_ms),
                    format!("{:.1}", r.max_ms),
                    format!("{:.0}", r.cpu_to_view_ms),
                    format!("{:.2}", r.rest_cpu_pct),
                    format!("{:.1}", r.rss_mib),
                ],
            ),
            Err(e) => {
                eprintln!("# {via:?}: {e:#}");
                failed = true;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    })
}
