//! `milonga bench rpc`: request/reply calls, Milonga side by side with a raw
//! libzmq ROUTER/DEALER echo, in one run (the ATLAS RPC test: an echo of a
//! small payload, with more and more concurrent clients).
//!
//! Per cell (system, payload size, clients): one server process and N
//! client processes (`milonga bench-rpc-worker`). Each client makes one
//! call at a time, as fast as it can. When every client says it is ready
//! (connected, a few warm-up calls done), the bench gives them all the same
//! measuring window, `--duration` seconds starting 200 ms later; a client
//! counts the calls that complete inside the window and their latencies
//! (send to reply). The server's CPU time over the window is the sum of
//! its threads' run time from /proc/PID/task/*/schedstat (nanoseconds,
//! every thread, libzmq's I/O thread included).
//!
//! - requests_per_s: calls completed in the window, all clients, / duration;
//! - latency_p50_us, latency_p99_us: over every call of every client;
//! - server_cpu_us_per_request: server CPU time in the window / calls;
//! - clients_cpu_us_per_request: every client process's CPU time in the
//!   window (the same way) / calls: with the server's and the relay's, what
//!   a call costs the machine.
//!
//! The raw server is one thread: `recv` [identity, payload] from a ROUTER,
//! `send` it back. A raw client is a DEALER sending the payload and waiting
//! for it. Milonga's server is `node.serve` with the default options
//! (4 workers) echoing the request value; its clients call
//! `node.call(key, bytes, 5 s)`; both are nodes of a private domain with
//! default settings (local discovery, heartbeats on).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use milonga::{Bytes, Config, Node, Transport, Value};
use serde::{Deserialize, Serialize};

use crate::bench::Format;

/// Options of `milonga bench rpc`.
#[derive(Args, Debug)]
pub struct RpcArgs {
    /// Numbers of concurrent client processes.
    #[arg(long, default_value = "1,10,50,100", value_delimiter = ',')]
    clients: Vec<usize>,
    /// Payload sizes in bytes.
    #[arg(long, default_value = "1,4096", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Seconds of measuring per cell.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Baseline measured in the same run.
    #[arg(long, value_enum, default_value = "raw-zmq")]
    baseline: RpcBaseline,
    /// Measure through a relay instead: a raw ROUTER/DEALER proxy in
    /// front of the raw echo (`raw-proxy`), Milonga peer-to-peer
    /// (`milonga`) and Milonga through `milonga broker` (`mlg-broker`).
    #[arg(long = "via-broker")]
    via_broker: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RpcBaseline {
    /// A raw libzmq ROUTER/DEALER echo in the same run.
    RawZmq,
    /// No baseline.
    None,
}

/// Options of the hidden `milonga bench-rpc-worker` command.
#[derive(Args, Debug)]
pub struct RpcWorkerArgs {
    /// The worker's role, as JSON.
    spec: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "role", rename_all = "kebab-case")]
enum RpcRole {
    RawServer {
        endpoint: String,
    },
    RawClient {
        endpoint: String,
        size: usize,
    },
    MlgServer {
        at: MlgPlace,
    },
    MlgClient {
        at: MlgPlace,
        size: usize,
    },
    /// A raw ROUTER (bound at `front`) / DEALER (connected to the raw
    /// server at `back`) proxy: `--via-broker`'s baseline.
    RawProxy {
        front: String,
        back: String,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct MlgPlace {
    locator: String,
    runtime_dir: String,
    transport: String,
}

/// What a client reports: calls completed in the window and their
/// latencies in nanoseconds.
#[derive(Serialize, Deserialize, Debug, Default)]
struct ClientReport {
    calls: u64,
    errors: u64,
    latencies_ns: Vec<u32>,
}

const KEY: &str = "bench/echo";
const WARMUP_CALLS: usize = 50;

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn mlg_config(at: &MlgPlace, name: &str) -> Result<Config> {
    let mut c = Config::new(&at.locator, name);
    // Benchmarks compare with plain libzmq: security off unless asked
    // (`--with-security`), whatever the address.
    c.security = milonga::Security::Off;
    c.runtime_dir = Some(at.runtime_dir.clone().into());
    c.transport = at.transport.parse().map_err(|e: String| anyhow!(e))?;
    Ok(c)
}

/// Runs an RPC worker role (`milonga bench-rpc-worker`): prints `ready`,
/// then for a client reads `START_NS END_NS` on stdin and prints its
/// report; a server serves until stdin closes.
pub fn worker(a: RpcWorkerArgs) -> Result<ExitCode> {
    let role: RpcRole = serde_json::from_str(&a.spec).context("bad worker spec")?;
    match role {
        RpcRole::RawServer { endpoint } => raw_server(&endpoint)?,
        RpcRole::RawProxy { front, back } => {
            let ctx = zmq::Context::new();
            let f = ctx.socket(zmq::ROUTER)?;
            f.set_linger(0)?;
            f.bind(&front)?;
            let b = ctx.socket(zmq::DEALER)?;
            b.set_linger(0)?;
            b.connect(&back)?;
            std::thread::spawn(move || {
                let _ = zmq::proxy(&f, &b);
            });
            ready()?;
            wait_for_eof();
        }
        RpcRole::MlgServer { at } => {
            let node = Node::open_with(mlg_config(&at, "rpc-server")?)?;
            let _svc = node.serve(KEY, |req| Ok(req.value))?;
            ready()?;
            wait_for_eof();
        }
        RpcRole::RawClient { endpoint, size } => {
            let ctx = zmq::Context::new();
            let s = ctx.socket(zmq::DEALER)?;
            s.set_linger(0)?;
            s.connect(&endpoint)?;
            let payload = vec![0x5au8; size];
            let mut call = || -> Result<bool> {
                s.send(&payload[..], 0)?;
                let r = s.recv_bytes(0)?;
                Ok(r.len() == size)
            };
            client(&mut call)?;
        }
        RpcRole::MlgClient { at, size } => {
            let node = Node::open_with(mlg_config(&at, "rpc-client")?)?;
            let until = Instant::now() + Duration::from_secs(20);
            while !node
                .peers()
                .iter()
                .any(|p| p.services.iter().any(|s| s.key == KEY))
            {
                if Instant::now() > until {
                    bail!("the server did not appear in discovery within 20 s");
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let payload = Value::Bytes(Bytes::from(vec![0x5au8; size]));
            let mut call = || -> Result<bool> {
                let r = node.call(KEY, payload.clone(), Duration::from_secs(5))?;
                Ok(matches!(&r, Value::Bytes(b) if b.len() == size))
            };
            client(&mut call)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn ready() -> Result<()> {
    let mut o = std::io::stdout().lock();
    writeln!(o, "ready")?;
    o.flush()?;
    Ok(())
}

fn wait_for_eof() {
    let mut sink = String::new();
    while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {
        sink.clear();
    }
}

fn raw_server(endpoint: &str) -> Result<()> {
    let ctx = zmq::Context::new();
    let s = ctx.socket(zmq::ROUTER)?;
    s.set_linger(0)?;
    s.bind(endpoint)?;
    // Serve on a thread; the main thread waits for the end of stdin.
    std::thread::spawn(move || loop {
        match s.recv_multipart(0) {
            Ok(parts) => {
                let _ = s.send_multipart(parts, 0);
            }
            Err(_) => return,
        }
    });
    ready()?;
    wait_for_eof();
    Ok(())
}

/// The client loop: warm up, say ready, wait for the window, call until its
/// end, report.
fn client(call: &mut dyn FnMut() -> Result<bool>) -> Result<()> {
    for _ in 0..WARMUP_CALLS {
        call()?;
    }
    ready()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let mut it = line.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(start)), Some(Ok(end))) = (it.next(), it.next()) else {
        bail!("expected START_NS END_NS on stdin, got {line:?}");
    };
    let mut report = ClientReport::default();
    // Until the window opens: keep the system busy as it will be.
    while now_ns() < start {
        call()?;
    }
    loop {
        let t0 = Instant::now();
        let ok = call().unwrap_or(false);
        let took = t0.elapsed();
        if now_ns() > end {
            break;
        }
        if ok {
            report.calls += 1;
            report
                .latencies_ns
                .push(took.as_nanos().min(u128::from(u32::MAX)) as u32);
        } else {
            report.errors += 1;
        }
    }
    let mut o = std::io::stdout().lock();
    writeln!(o, "{}", serde_json::to_string(&report)?)?;
    o.flush()?;
    Ok(())
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn start(role: &RpcRole) -> Result<Proc> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("bench-rpc-worker")
            .arg(serde_json::to_string(role)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start an rpc bench worker")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Proc {
            child,
            stdin,
            stdout,
        })
    }

    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        if self.stdout.read_line(&mut l)? == 0 {
            bail!("an rpc bench worker exited early");
        }
        Ok(l)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time of every thread of `pid`, in nanoseconds.
pub(crate) fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = t?.path().join("schedstat");
        if let Ok(s) = std::fs::read_to_string(path) {
            total += s
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

struct Row {
    system: &'static str,
    size: usize,
    clients: usize,
    requests_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: f64,
    /// CPU time of every client process over the window, per call.
    clients_cpu_us_per_request: f64,
    errors: u64,
}

fn cell(
    system: &'static str,
    t: Transport,
    size: usize,
    clients: usize,
    duration: f64,
    n: usize,
) -> Result<Row> {
    let tmp = std::env::temp_dir().join(format!("mlg-bench-rpc-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let at = MlgPlace {
        locator: format!("milonga:///rpc-{}-{n}", std::process::id()),
        runtime_dir: tmp.display().to_string(),
        transport: t.name().to_owned(),
    };
    let endpoint = match t {
        Transport::Tcp => crate::bench::free_endpoint(t, "rpc")?,
        _ => format!("ipc://{}/raw-{n}.sock", tmp.display()),
    };
    let mut at = at;
    let mut relay: Option<Proc> = None;
    let mut broker = None;
    let (server_role, client_role) = match system {
        "raw-zmq" => (
            RpcRole::RawServer {
                endpoint: endpoint.clone(),
            },
            RpcRole::RawClient { endpoint, size },
        ),
        "raw-proxy" => {
            let front = crate::bench::free_endpoint(t, "rpc-proxy")?;
            let mut p = Proc::start(&RpcRole::RawProxy {
                front: front.clone(),
                back: endpoint.clone(),
            })?;
            p.line()?;
            relay = Some(p);
            (
                RpcRole::RawServer { endpoint },
                RpcRole::RawClient {
                    endpoint: front,
                    size,
                },
            )
        }
        "mlg-broker" => {
            let b = crate::bench_broker::Relay::broker(
                &format!("rpc-{}-{n}", std::process::id()),
                1000,
                None,
            )?;
            at.locator = b.front.clone();
            broker = Some(b);
            (
                RpcRole::MlgServer { at: at.clone() },
                RpcRole::MlgClient { at, size },
            )
        }
        _ => (
            RpcRole::MlgServer { at: at.clone() },
            RpcRole::MlgClient { at, size },
        ),
    };
    let relay_pid = relay
        .as_ref()
        .map(|p| p.child.id())
        .or(broker.as_ref().map(crate::bench_broker::Relay::pid));
    let mut server = Proc::start(&server_role)?;
    server.line()?;
    let mut procs = Vec::new();
    for _ in 0..clients {
        procs.push(Proc::start(&client_role)?);
    }
    for p in &mut procs {
        let l = p.line()?;
        if l.trim() != "ready" {
            bail!("a client said {l:?} instead of ready");
        }
    }
    let start = now_ns() + 200_000_000;
    let end = start + (duration * 1e9) as u64;
    for p in &mut procs {
        let stdin = p.stdin.as_mut().expect("piped");
        writeln!(stdin, "{start} {end}")?;
        stdin.flush()?;
    }
    let pid = server.child.id();
    let clients_cpu = || -> Result<u64> {
        procs
            .iter()
            .map(|p| cpu_ns(p.child.id()))
            .sum::<Result<u64>>()
    };
    std::thread::sleep(Duration::from_nanos(start.saturating_sub(now_ns())));
    let cpu0 = cpu_ns(pid)?;
    let relay0 = relay_pid.map(cpu_ns).transpose()?;
    let clients0 = clients_cpu()?;
    std::thread::sleep(Duration::from_nanos(end.saturating_sub(now_ns())));
    let cpu1 = cpu_ns(pid)?;
    let relay1 = relay_pid.map(cpu_ns).transpose()?;
    let clients1 = clients_cpu()?;
    let mut calls = 0;
    let mut errors = 0;
    let mut lat = Vec::new();
    for p in &mut procs {
        let l = p.line()?;
        let r: ClientReport =
            serde_json::from_str(&l).with_context(|| format!("bad client report {l:?}"))?;
        calls += r.calls;
        errors += r.errors;
        lat.extend(r.latencies_ns);
    }
    drop(procs);
    drop(server);
    drop(relay);
    if let Some(b) = broker {
        b.finish()?;
    }
    if let (Some(c0), Some(c1)) = (relay0, relay1) {
        eprintln!(
            "# {system} {size} B x{clients}: relay CPU {:.2} us per call",
            c1.saturating_sub(c0) as f64 / 1000.0 / calls.max(1) as f64
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    lat.sort_unstable();
    let q = |q: f64| {
        let i = ((lat.len() as f64 - 1.0) * q).round() as usize;
        lat.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    let per_call = |ns: u64| {
        if calls > 0 {
            ns as f64 / 1000.0 / calls as f64
        } else {
            0.0
        }
    };
    Ok(Row {
        system,
        size,
        clients,
        requests_per_s: calls as f64 / duration,
        p50_us: q(0.5),
        p99_us: q(0.99),
        cpu_us_per_request: per_call(cpu1.saturating_sub(cpu0)),
        clients_cpu_us_per_request: per_call(clients1.saturating_sub(clients0)),
        errors,
    })
}

/// Runs `milonga bench rpc`.
pub fn run(a: RpcArgs, t: Transport) -> Result<ExitCode> {
    if t == Transport::Inproc {
        bail!("bench rpc runs clients in separate processes: use tcp or ipc");
    }
    if a.via_broker && t != Transport::Tcp {
        bail!("--via-broker runs over tcp");
    }
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
    }
    eprintln!(
        "# milonga bench rpc: transport {}, {} s per cell; clients are processes making one call at a time; milonga: node.serve with 4 workers, node.call; raw-zmq: one ROUTER thread echoing to DEALER clients",
        t.name(),
        a.duration
    );
    eprintln!("# requests_per_s = calls completed in the window / duration; latency = send to reply, over every call; server_cpu_us_per_request = server CPU (all threads, /proc/PID/task/*/schedstat) / calls; clients_cpu_us_per_request = every client process's CPU, the same way, / calls; errors = calls that failed or timed out in the window (not in the latencies); the q-quantile is the round((n - 1) q)-th of the sorted latencies");
    eprintln!("{}", crate::bench::IN_TURN);
    let mut o = std::io::stdout().lock();
    if a.format == Format::Csv {
        writeln!(o, "system,transport,payload_bytes,clients,requests_per_s,latency_p50_us,latency_p99_us,server_cpu_us_per_request,clients_cpu_us_per_request,errors")?;
    } else {
        writeln!(
            o,
            "{:<8} {:>6} {:>7} {:>7} {:>12} {:>9} {:>9} {:>12} {:>12} {:>7}",
            "system",
            "transp",
            "bytes",
            "clients",
            "requests/s",
            "p50_us",
            "p99_us",
            "cpu_us/req",
            "clients_cpu",
            "errors"
        )?;
    }
    o.flush()?;
    drop(o);
    let mut n = 0;
    let mut turn = 0;
    for &size in &a.sizes {
        for &clients in &a.clients {
            if clients == 0 {
                bail!("--clients must be at least 1");
            }
            let mut systems = vec!["milonga"];
            if a.via_broker {
                systems = vec!["raw-proxy", "milonga", "mlg-broker"];
            } else if a.baseline == RpcBaseline::RawZmq {
                systems.insert(0, "raw-zmq");
            }
            turn += 1;
            for system in crate::bench::in_turn(&systems, turn) {
                n += 1;
                let r = cell(system, t, size, clients, a.duration, n)?;
                let mut o = std::io::stdout().lock();
                match a.format {
                    Format::Csv => writeln!(
                        o,
                        "{},{},{},{},{:.0},{:.1},{:.1},{:.2},{:.2},{}",
                        r.system,
                        t.name(),
                        r.size,
                        r.clients,
                        r.requests_per_s,
                        r.p50_us,
                        r.p99_us,
                        r.cpu_us_per_request,
                        r.clients_cpu_us_per_request,
                        r.errors
                    )?,
                    Format::Table => writeln!(
                        o,
                        "{:<8} {:>6} {:>7} {:>7} {:>12.0} {:>9.1} {:>9.1} {:>12.2} {:>12.2} {:>7}",
                        r.system,
                        t.name(),
                        r.size,
                        r.clients,
                        r.requests_per_s,
                        r.p50_us,
                        r.p99_us,
                        r.cpu_us_per_request,
                        r.clients_cpu_us_per_request,
                        r.errors
                    )?,
                }
                o.flush()?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
