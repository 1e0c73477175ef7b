//! `milonga bench discovery`: how long N node processes of one host take
//! to find each other with local discovery, and to see a fifth of them
//! replaced (the churn of issue 10, finding 9). With `--hosts H` (2 or
//! more, root needed), the nodes are spread over H hosts of the multi-host
//! test bed (network namespaces) and find each other by scouting; the
//! bench then also measures the discovery traffic at rest, per node, from
//! the hosts' interface counters.
//!
//! With a bed, it also cuts the link of host 0 (a partition) and measures
//! until the nodes of the other hosts have forgotten every node of host 0,
//! then restores it and measures until they have them all again.
//!
//! Each node is a process (`milonga bench-worker` role `disc-node`) that
//! opens a node in a private domain, declares a publication and prints the
//! time, from the bench's start signal (a wall-clock instant passed to
//! every process), at which its peer table first holds all the nodes it
//! was told to expect. The bench reports the median and the largest over
//! the nodes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::{Config, Node};

use crate::bench::Format;

/// Options of `milonga bench discovery`.
#[derive(Args, Debug)]
pub struct DiscoveryArgs {
    /// Node processes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Hosts (network namespaces of the test bed, root needed) the nodes
    /// are spread over; with 2 or more they find each other by scouting.
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// Seconds at rest over which the scouting traffic is measured.
    #[arg(long, default_value_t = 5.0, value_parser = crate::args::positive_seconds)]
    rest: f64,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// Options of the `disc-node` worker.
#[derive(Args, Debug)]
pub struct DiscWorkerArgs {
    /// Locator of the private domain.
    locator: String,
    /// Runtime directory.
    runtime_dir: String,
    /// Nodes (names `disc-<i>`) whose announcements this one waits for.
    expect: String,
    /// Wall clock (ns since the epoch) the time is measured from.
    start_ns: u64,
    /// This node's number.
    me: usize,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The `disc-node` worker: prints `seen <ms>` once its peer table holds
/// every expected node, then stays (to be found) and follows the bench's
/// orders on its input until it ends.
pub fn worker(a: DiscWorkerArgs) -> Result<std::process::ExitCode> {
    let mut cfg = Config::new(&a.locator, &format!("disc-{}", a.me));
    // Benchmarks compare with plain libzmq: security off unless asked
    // (`--with-security`), whatever the address.
    cfg.security = milonga::Security::Off;
    cfg.runtime_dir = Some(a.runtime_dir.into());
    // Set by the bench on the hosts of a test bed.
    if let Ok(host) = std::env::var("MILONGA_BENCH_SCOUT_HOST") {
        cfg.tcp_host = host;
        cfg.scouting = true;
    }
    let node = Node::open_with(cfg)?;
    let _p = node.publisher(&format!("disc/{}", a.me))?;
    let expect: std::collections::BTreeSet<String> = a
        .expect
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|i| format!("disc-{i}@"))
        .collect();
    loop {
        let peers = node.peers();
        let seen = expect
            .iter()
            .all(|e| peers.iter().any(|p| p.name.starts_with(e.as_str())));
        if seen {
            let ms = now_ns().saturating_sub(a.start_ns) as f64 / 1e6;
            println!("seen {ms:.1}");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Then the bench's orders, one per line: `join N START` (print when
    // node N is in the peer table), `leave N START` (when it is gone),
    // `exit` (close the node, which says goodbye). Ends with the input.
    for line in std::io::stdin().lines().map_while(Result::ok) {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [what @ ("join" | "leave"), who, start] => {
                // `who`: one node number, or several separated by commas
                // (all must be there, or none).
                let names: Vec<String> = who.split(',').map(|w| format!("disc-{w}@")).collect();
                let start: u64 = start.parse().unwrap_or(0);
                let want_present = *what == "join";
                let deadline = Instant::now() + Duration::from_secs(30);
                let verdict = loop {
                    let peers = node.peers();
                    let has =
                        |name: &String| peers.iter().any(|p| p.name.starts_with(name.as_str()));
                    let done = if want_present {
                        names.iter().all(has)
                    } else {
                        !names.iter().any(has)
                    };
                    if done {
                        break format!("{:.1}", now_ns().saturating_sub(start) as f64 / 1e6);
                    }
                    if Instant::now() > deadline {
                        break "timeout".to_owned();
                    }
                    std::thread::sleep(Duration::from_millis(2));
                };
                println!("{what} {verdict}");
            }
            ["exit"] => break,
            _ => eprintln!("bench-disc-worker: unknown order {line:?}"),
        }
    }
    drop(node);
    Ok(std::process::ExitCode::SUCCESS)
}

struct Proc {
    child: Child,
    orders: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    /// Sends an order (see [`worker`]).
    fn order(&mut self, line: &str) -> Result<()> {
        use std::io::Write;
        let w = self
            .orders
            .as_mut()
            .context("the worker's input is closed")?;
        writeln!(w, "{line}").context("cannot order a node process")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where node processes run: this host, or the hosts of a test bed.
struct Place {
    bed: Option<milonga_testkit::netbed::Bed>,
    dir: std::path::PathBuf,
}

impl Place {
    fn hosts(&self) -> usize {
        self.bed.as_ref().map_or(1, |b| b.hosts().len())
    }

    /// The command of node `me`: on host `me % hosts`, in that host's
    /// runtime directory.
    fn command(&self, me: usize) -> Result<(Command, String)> {
        let exe = std::env::current_exe()?;
        let Some(bed) = &self.bed else {
            return Ok((Command::new(exe), self.dir.display().to_string()));
        };
        let h = me % bed.hosts().len();
        let dir = self.dir.join(format!("h{h}"));
        let mut c = bed.command(h, &exe.display().to_string());
        c.env("MILONGA_BENCH_SCOUT_HOST", bed.host(h).addr.to_string());
        Ok((c, dir.display().to_string()))
    }
}

fn spawn(place: &Place, locator: &str, expect: &str, start_ns: u64, me: usize) -> Result<Proc> {
    let (mut cmd, dir) = place.command(me)?;
    let mut child = cmd
        .args(["bench-disc-worker", locator, &dir, expect])
        .arg(start_ns.to_string())
        .arg(me.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start a node process")?;
    let out = child.stdout.take().context("piped stdout")?;
    let orders = child.stdin.take();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(Proc {
        child,
        orders,
        lines,
    })
}

/// Waits for every process of `procs` to print `seen`; their times in ms.
fn times(procs: &[&Proc], deadline: Instant) -> Result<Vec<f64>> {
    answers(procs, "seen", deadline)
}

/// Waits for every process of `procs` to print `<what> <ms>`; the times,
/// sorted.
fn answers(procs: &[&Proc], what: &str, deadline: Instant) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for p in procs {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = p
            .lines
            .recv_timeout(left)
            .with_context(|| format!("a node did not answer {what:?} in time"))?;
        let ms: f64 = line
            .strip_prefix(what)
            .and_then(|v| v.trim().parse().ok())
            .with_context(|| format!("unexpected worker line {line:?} (waiting for {what})"))?;
        out.push(ms);
    }
    out.sort_by(f64::total_cmp);
    Ok(out)
}

/// One node joins, then leaves (closing: its goodbye), then another joins
/// and is killed with SIGKILL: how long until every other node's peer
/// table shows each change. `procs` have all seen each other; `me` is the
/// number of the first newcomer, `alive` the numbers of `procs`.
fn join_and_leave(
    place: &Place,
    locator: &str,
    procs: &mut [Proc],
    alive: &[String],
    me: usize,
    format: Format,
) -> Result<()> {
    let n = procs.len();
    let order_all = |procs: &mut [Proc], line: &str| -> Result<()> {
        for p in procs.iter_mut() {
            p.order(line)?;
        }
        Ok(())
    };
    let deadline = || Instant::now() + Duration::from_secs(60);
    for (case, newcomer) in [("leave", me), ("crash", me + 1)] {
        let start = now_ns();
        order_all(procs, &format!("join {newcomer} {start}"))?;
        let mut joiner = spawn(place, locator, &alive.join(","), start, newcomer)?;
        let mut t = answers(&procs.iter().collect::<Vec<_>>(), "join", deadline())?;
        t.extend(times(&[&joiner], deadline())?);
        t.sort_by(f64::total_cmp);
        report(
            format,
            "join",
            n,
            &t,
            "one node started: ms until every node has it, and it has every node",
        );
        let start = now_ns();
        order_all(procs, &format!("leave {newcomer} {start}"))?;
        if case == "leave" {
            joiner.order("exit")?;
        } else {
            // Reaped at once, as a supervisor would: a zombie still has
            // its pid, and local discovery's quick check (`kill(pid, 0)`
            // every 250 ms) takes it for alive until the 5 s full check.
            let _ = joiner.child.kill();
            let _ = joiner.child.wait();
        }
        let t = answers(&procs.iter().collect::<Vec<_>>(), "leave", deadline())?;
        let note = if case == "leave" {
            "one node closed (its goodbye): ms until no node has it"
        } else {
            "one node killed with SIGKILL and reaped: ms until no node has it (its host: local discovery's 250 ms check; other hosts: scouting forgets after 3 silent intervals, at least the lease; subscribers of its data see it disconnected at once)"
        };
        report(format, case, n, &t, note);
        let _ = joiner.child.wait();
    }
    Ok(())
}

fn report(format: Format, case: &str, n: usize, t: &[f64], note: &str) {
    let p50 = t[t.len() / 2];
    let max = t[t.len() - 1];
    match format {
        Format::Csv => println!("{case},{n},{p50:.1},{max:.1},\"{note}\""),
        Format::Table => println!("{case:<8} {n:>6} {p50:>10.1} {max:>10.1}  {note}"),
    }
}

/// Runs `milonga bench discovery`.
pub fn run(a: DiscoveryArgs) -> Result<std::process::ExitCode> {
    if a.nodes < 5 {
        bail!("--nodes must be at least 5");
    }
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("mlg-disc-{pid}"));
    let locator = format!("milonga:///disc-{pid}");
    let n = a.nodes;
    let bed = match a.hosts {
        0 => bail!("--hosts must be at least 1"),
        1 => None,
        h => Some(
            milonga_testkit::netbed::Bed::new(h)
                .map_err(|why| anyhow::anyhow!("--hosts needs network namespaces (root): {why}"))?,
        ),
    };
    let place = Place { bed, dir };
    if place.bed.is_some() {
        eprintln!(
            "# milonga bench discovery: {n} node processes spread over {} hosts (network namespaces on one bridge), scouting (UDP multicast) + local discovery; ms from the start signal until a node's peer table holds every expected node; p50 and max over the nodes",
            place.hosts()
        );
    } else {
        eprintln!(
            "# milonga bench discovery: {n} node processes on this host, local discovery (tcp); ms from the start signal until a node's peer table holds every expected node; p50 and max over the nodes"
        );
    }
    match a.format {
        Format::Csv => println!("case,nodes,p50_ms,max_ms,note"),
        Format::Table => println!(
            "{:<8} {:>6} {:>10} {:>10}  note",
            "case", "nodes", "p50_ms", "max_ms"
        ),
    }
    let all: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let start = now_ns();
    let started = Instant::now();
    let mut procs: Vec<Proc> = (0..n)
        .map(|i| spawn(&place, &locator, &all.join(","), start, i))
        .collect::<Result<_>>()?;
    let cold = times(
        &procs.iter().collect::<Vec<_>>(),
        started + Duration::from_secs(120),
    )?;
    report(
        a.format,
        "start",
        n,
        &cold,
        "all started at once; each must see all",
    );
    if let Some(bed) = &place.bed {
        rest_traffic(bed, n, Duration::from_secs_f64(a.rest.max(0.5)))?;
    }
    join_and_leave(&place, &locator, &mut procs, &all, 20 * n, a.format)?;
    if let Some(bed) = &place.bed {
        partition(bed, &mut procs, a.format)?;
    }
    // Churn: a fifth replaced by new nodes; each new node must see every
    // node now alive, and an observer every new node.
    let k = n / 5;
    procs.truncate(n - k);
    let start = now_ns();
    let started = Instant::now();
    let alive: Vec<String> = (0..n - k).chain(n..n + k).map(|i| i.to_string()).collect();
    let fresh: Vec<Proc> = (n..n + k)
        .map(|i| spawn(&place, &locator, &alive.join(","), start, i))
        .collect::<Result<_>>()?;
    let new_ones: Vec<String> = (n..n + k).map(|i| i.to_string()).collect();
    let observer = spawn(&place, &locator, &new_ones.join(","), start, 10 * n)?;
    let mut t = times(
        &fresh.iter().collect::<Vec<_>>(),
        started + Duration::from_secs(120),
    )?;
    t.extend(times(&[&observer], started + Duration::from_secs(120))?);
    t.sort_by(f64::total_cmp);
    report(
        a.format,
        "churn",
        k,
        &t,
        &format!("{k} of {n} killed and {k} started at once; the new ones and an observer must see the new set"),
    );
    drop((procs, fresh, observer));
    let _ = std::fs::remove_dir_all(&place.dir);
    Ok(std::process::ExitCode::SUCCESS)
}

/// Cuts host 0's link, and measures until every node of the other hosts
/// has forgotten all the nodes of host 0; restores it, and measures until
/// they have them all again. `procs[i]` is node `i`, on host `i % hosts`.
fn partition(bed: &milonga_testkit::netbed::Bed, procs: &mut [Proc], format: Format) -> Result<()> {
    let hosts = bed.hosts().len();
    let cut: Vec<String> = (0..procs.len())
        .filter(|i| i % hosts == 0)
        .map(|i| i.to_string())
        .collect();
    let list = cut.join(",");
    let deadline = || Instant::now() + Duration::from_secs(60);
    for (what, case, note) in [
        (
            "leave",
            "partition",
            "host 0's link cut: ms until the nodes of the other hosts have forgotten all of host 0's (scouting's expiry)",
        ),
        (
            "join",
            "heal",
            "host 0's link restored: ms until the nodes of the other hosts have all of host 0's again",
        ),
    ] {
        let start = now_ns();
        let mut observers = Vec::new();
        for (i, p) in procs.iter_mut().enumerate() {
            if i % hosts != 0 {
                p.order(&format!("{what} {list} {start}"))?;
                observers.push(i);
            }
        }
        if what == "leave" {
            bed.cut(0);
        } else {
            bed.restore(0);
        }
        let watching: Vec<&Proc> = observers.iter().map(|&i| &procs[i]).collect();
        let t = answers(&watching, what, deadline())?;
        report(format, case, cut.len(), &t, note);
    }
    Ok(())
}

/// The packets and bytes `eth0` of each host sent and received so far.
fn counters(bed: &milonga_testkit::netbed::Bed) -> Result<Vec<[u64; 4]>> {
    let mut out = Vec::new();
    for h in bed.hosts() {
        let o = Command::new("ip")
            .args(["-s", "-j", "-n", &h.netns, "link", "show", "dev", "eth0"])
            .output()
            .context("ip -s link")?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).context("ip -j output")?;
        let s = &v[0]["stats64"];
        let get = |d: &str, f: &str| s[d][f].as_u64().unwrap_or(0);
        out.push([
            get("tx", "packets"),
            get("tx", "bytes"),
            get("rx", "packets"),
            get("rx", "bytes"),
        ]);
    }
    Ok(out)
}

/// Prints the discovery traffic at rest: per node sent, per host received.
fn rest_traffic(bed: &milonga_testkit::netbed::Bed, n: usize, over: Duration) -> Result<()> {
    // Queries of the start are over once every node has its view.
    std::thread::sleep(Duration::from_secs(1));
    let before = counters(bed)?;
    std::thread::sleep(over);
    let after = counters(bed)?;
    let secs = over.as_secs_f64();
    let mut sum = [0u64; 4];
    for (b, a) in before.iter().zip(&after) {
        for k in 0..4 {
            sum[k] += a[k].saturating_sub(b[k]);
        }
    }
    let hosts = bed.hosts().len() as f64;
    eprintln!(
        "# at rest, over {secs:.1} s: sent per node (every host's eth0 tx / nodes), received per host (eth0 rx / hosts)"
    );
    println!(
        "rest,{n},tx_pkts_per_s_per_node={:.2},tx_bytes_per_s_per_node={:.1},rx_pkts_per_s_per_host={:.1},rx_bytes_per_s_per_host={:.0}",
        sum[0] as f64 / secs / n as f64,
        sum[1] as f64 / secs / n as f64,
        sum[2] as f64 / secs / hosts,
        sum[3] as f64 / secs / hosts,
    );
    Ok(())
}
