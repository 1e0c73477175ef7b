//! `milonga bench deadlines`: how soon a call ends when its server cannot
//! answer.
//!
//! A client node in this process calls services in a private domain:
//!
//! - `no-server`: a key that nobody serves, with a 30 s deadline; measured
//!   from the call to its `NoServer` error;
//! - `timeout`: a handler on another node of this process that takes twice
//!   the deadline (100 ms by default); measured: how long after its deadline
//!   the call returned `Timeout` (the handler's end is awaited between
//!   trials, so that each call finds the server idle);
//! - `server-killed`: a `milonga serve` process with 4 workers running slow
//!   handlers and the rest of 100 calls queued is killed with SIGKILL once
//!   it has read all 100 (its `requests_received`); measured from the
//!   `kill` call to each call's `ServerLost` (deadline 60 s).
//!
//! The tests assert the outcomes and their order; these are the times.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::p2p::NodeExt;
use milonga::{CallError, Config, Node, ServeOptions, Transport, Value};

use crate::bench::Format;
use crate::bench_liveliness::{print_rows, Row};

/// Options of `milonga bench deadlines`.
#[derive(Args, Debug)]
pub struct DeadlinesArgs {
    /// Trials of the no-server and timeout cases.
    #[arg(long, default_value_t = 50)]
    trials: usize,
    /// Trials of the server-killed case (100 calls in flight each).
    #[arg(long, default_value_t = 5)]
    kill_trials: usize,
    /// The deadline of the timeout case, in ms.
    #[arg(long, default_value_t = 100)]
    timeout_ms: u64,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// Calls in flight when the server is killed.
const IN_FLIGHT: u64 = 100;

/// Polls `cond` every millisecond for at most `limit`.
fn poll(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Result<()> {
    let end = Instant::now() + limit;
    while !cond() {
        if Instant::now() >= end {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A `milonga serve` process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `milonga bench deadlines`.
pub fn run(a: DeadlinesArgs, t: Transport) -> Result<std::process::ExitCode> {
    let dir = std::env::temp_dir().join(format!("mlg-bench-deadlines-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let locator = format!("milonga:///bench-deadlines-{}", std::process::id());
    let open = |name: &str| {
        let mut cfg = Config::new(&locator, name);
        // Benchmarks compare with plain libzmq: security off unless asked
        // (`--with-security`), whatever the address.
        cfg.security = milonga::Security::Off;
        cfg.runtime_dir = Some(dir.clone());
        cfg.transport = t;
        Node::open_with(cfg)
    };
    let client = open("client")?;
    let server = open("server")?;
    let deadline = Duration::from_millis(a.timeout_ms);
    let handler_takes = deadline * 2;
    let _svc = server.serve_with(
        "bench/slow",
        ServeOptions::default().workers(1),
        move |req| {
            std::thread::sleep(handler_takes);
            Ok(req.value)
        },
    )?;
    poll("the service in discovery", Duration::from_secs(20), || {
        knows(&client, "bench/slow")
    })?;
    eprintln!(
        "# milonga bench deadlines: transport {}; no-server: call to \
         `NoServer` (deadline 30 s); timeout: ms past a {} ms deadline at \
         which the call returned `Timeout` (handler takes {} ms); \
         server-killed: ms from SIGKILL of a `milonga serve` process holding \
         {IN_FLIGHT} calls (4 running, the rest queued) to each call's \
         `ServerLost`",
        t.name(),
        deadline.as_millis(),
        handler_takes.as_millis()
    );

    let mut no_server = Vec::with_capacity(a.trials);
    for _ in 0..a.trials {
        let t0 = Instant::now();
        let r = client.call("bench/nobody", Value::Null, Duration::from_secs(30));
        let took = t0.elapsed();
        if !matches!(r, Err(CallError::NoServer { .. })) {
            bail!("a call to nobody ended with {r:?}");
        }
        no_server.push(ms(took));
    }

    let mut past_deadline = Vec::with_capacity(a.trials);
    for i in 0..a.trials {
        let t0 = Instant::now();
        let r = client.call("bench/slow", Value::Null, deadline);
        let took = t0.elapsed();
        if !matches!(r, Err(CallError::Timeout { .. })) {
            bail!("a call to the slow handler ended with {r:?}");
        }
        past_deadline.push(ms(took) - ms(deadline));
        poll("the handler to end", Duration::from_secs(20), || {
            server.stats().calls_served > i as u64
        })?;
    }

    let mut killed = Vec::new();
    for k in 0..a.kill_trials {
        killed.extend(server_killed(&client, &dir, &locator, t, k)?);
    }
    let rows = vec![
        Row {
            case: "no-server",
            ms: no_server,
            note: "call to NoServer; deadline 30 s".to_owned(),
        },
        Row {
            case: "timeout",
            note: format!("ms past the {} ms deadline", deadline.as_millis()),
            ms: past_deadline,
        },
        Row {
            case: "server-killed",
            note: format!(
                "SIGKILL to ServerLost, {} trials of {IN_FLIGHT} calls",
                a.kill_trials
            ),
            ms: killed,
        },
    ];
    client.close();
    server.close();
    let _ = std::fs::remove_dir_all(&dir);
    print_rows(rows, t, a.format);
    Ok(std::process::ExitCode::SUCCESS)
}

/// Whether `client` knows a server of `key`.
fn knows(client: &Node, key: &str) -> bool {
    client
        .peers()
        .iter()
        .any(|p| p.services.iter().any(|s| s.key == key))
}

/// One server-killed trial: the ms from the kill to each call's end.
fn server_killed(
    client: &Node,
    dir: &std::path::Path,
    locator: &str,
    t: Transport,
    trial: usize,
) -> Result<Vec<f64>> {
    let key = format!("bench/killed{trial}");
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", &key, "--echo", "--delay-ms", "60000"])
        .args(["--workers", "4", "--max-queued", "1000"])
        .env("MILONGA_RUNTIME_DIR", dir)
        .env("MILONGA_LOCATOR", locator)
        .env("MILONGA_TRANSPORT", t.name())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start a server process")?;
    let out = child.stdout.take().context("the server's stdout")?;
    let server = Server(child);
    let mut line = String::new();
    // Kept open until the end: the server may print more.
    let mut reader = BufReader::new(out);
    reader.read_line(&mut line)?;
    if !line.starts_with("serving ") {
        bail!("the server process did not start: {line:?}");
    }
    poll("the server in discovery", Duration::from_secs(20), || {
        knows(client, &key)
    })?;
    let control = client
        .peers()
        .into_iter()
        .find(|p| p.services.iter().any(|s| s.key == key))
        .map(|p| p.control)
        .context("the server's control endpoint")?;
    let calls = (0..IN_FLIGHT)
        .map(|i| client.call_async(&key, i, Duration::from_secs(60)))
        .collect::<Result<Vec<_>, _>>()?;
    poll(
        "the server to read every call",
        Duration::from_secs(20),
        || {
            client
                .query(&control, Duration::from_secs(5))
                .is_some_and(|n| n.stats.requests_received == IN_FLIGHT)
        },
    )?;
    let waiters: Vec<_> = calls
        .into_iter()
        .map(|c| std::thread::spawn(move || (c.wait(), Instant::now())))
        .collect();
    let t0 = Instant::now();
    // SIGKILL (the process is reaped when `server` is dropped, below).
    let mut server = server;
    server.0.kill()?;
    let mut out = Vec::with_capacity(waiters.len());
    for w in waiters {
        let (r, at) = w.join().map_err(|_| anyhow::anyhow!("a waiter panicked"))?;
        if !matches!(r, Err(CallError::ServerLost { .. })) {
            bail!("a call to the killed server ended with {r:?}");
        }
        out.push(ms(at.saturating_duration_since(t0)));
    }
    drop(server);
    drop(reader);
    Ok(out)
}
