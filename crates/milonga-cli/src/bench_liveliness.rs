//! `milonga bench liveliness`: how fast a subscriber learns that a
//! publisher process died, froze or came back.
//!
//! A subscriber in this process follows publisher processes (`milonga
//! bench-worker`, role `live-pub`, putting at 100 Hz) in a private domain
//! with the default heartbeat settings (1 s interval, 3 s lease):
//!
//! - `kill9`: the publisher is killed with SIGKILL; measured from the
//!   `kill` call to the `publisher_lost` event (reason `disconnected`);
//! - `sigstop`: the publisher is frozen with SIGSTOP; measured from the
//!   signal to `publisher_lost` (reason `lease_expired`), which the lease
//!   bounds;
//! - `restart`: a publisher is started while the subscriber runs; measured
//!   from the publisher's first `put` (its wall-clock time travels in every
//!   sample) to the first sample received, with how many samples put before
//!   it were missed (no history yet: the slow-joiner window of ZeroMQ).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use milonga::{Config, Event, LostReason, Node, NodeId, SubscriberQos, Transport, Value};

use crate::bench::{Format, Outcome, Place, Role};

/// Options of `milonga bench liveliness`.
#[derive(Args, Debug)]
pub struct LivelinessArgs {
    /// Trials of the kill -9 and restart cases.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Trials of the SIGSTOP case (each lasts about a lease).
    #[arg(long, default_value_t = 3)]
    stop_trials: usize,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The `live-pub` worker: puts its first put's wall-clock time, at 100 Hz,
/// until killed.
pub(crate) fn live_pub(at: &Place) -> Result<Outcome> {
    let mut cfg = Config::new(&at.address, "live-pub");
    // Benchmarks compare with plain libzmq: security off unless asked
    // (`--with-security`), whatever the address.
    cfg.security = milonga::Security::Off;
    cfg.runtime_dir = Some(at.runtime_dir.clone().into());
    cfg.transport = at
        .transport
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let node = Node::open_with(cfg)?;
    let p = node.publisher("lv/x")?;
    let first = now_ns();
    loop {
        p.put(Value::from(first))?;
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Trial {
    child: Child,
}

impl Trial {
    fn start(at: &Place) -> Result<Trial> {
        let role = Role::LivePub { at: at.clone() };
        let child = Command::new(std::env::current_exe()?)
            .arg("bench-worker")
            .arg(serde_json::to_string(&role)?)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start a publisher process")?;
        Ok(Trial { child })
    }

    fn signal(&self, sig: i32) {
        // (Our child, not yet reaped: the pid is still its.)
        crate::ffi::signal(self.child.id(), sig);
    }
}

impl Drop for Trial {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        self.signal(libc::SIGCONT);
        let _ = self.child.wait();
    }
}

/// Waits for the first event `pick` accepts, at most `limit`.
fn wait_for<T>(
    sub: &milonga::Subscriber,
    limit: Duration,
    mut pick: impl FnMut(Event) -> Option<T>,
) -> Result<T> {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no such event within {limit:?}");
        }
        match sub.recv_timeout(left) {
            Ok(ev) => {
                if let Some(t) = pick(ev) {
                    return Ok(t);
                }
            }
            Err(milonga::RecvError::Timeout) => {}
            Err(e) => bail!(e),
        }
    }
}

/// A new publisher process, alive and heard from: its node id, and the
/// first sample's delay after its first put and how many puts came before.
fn start_and_wait(at: &Place, sub: &milonga::Subscriber) -> Result<(Trial, NodeId, f64, u64)> {
    let trial = Trial::start(at)?;
    let id = wait_for(sub, Duration::from_secs(20), |ev| match ev {
        Event::PublisherAlive(a) => Some(a.publisher),
        _ => None,
    })?;
    let (delay_ms, missed) = wait_for(sub, Duration::from_secs(20), |ev| match ev {
        Event::Sample(s) if s.publisher == id => {
            let first = match s.value {
                Value::Int(v) => u64::try_from(v).ok()?,
                _ => return None,
            };
            Some((
                now_ns().saturating_sub(first) as f64 / 1e6,
                s.seq.saturating_sub(1),
            ))
        }
        _ => None,
    })?;
    Ok((trial, id, delay_ms, missed))
}

fn lost_after(
    sub: &milonga::Subscriber,
    id: NodeId,
    from: Instant,
    limit: Duration,
) -> Result<(f64, LostReason)> {
    wait_for(sub, limit, |ev| match ev {
        Event::PublisherLost(l) if l.publisher == id => {
            Some((from.elapsed().as_secs_f64() * 1000.0, l.reason))
        }
        _ => None,
    })
}

pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// One case of a timing benchmark: what was measured, in ms, per trial.
pub(crate) struct Row {
    pub case: &'static str,
    pub ms: Vec<f64>,
    pub note: String,
}

/// Prints `rows` as a table or CSV: trials, p50, p99 and max in ms.
pub(crate) fn print_rows(rows: Vec<Row>, t: Transport, format: Format) {
    if format == Format::Csv {
        println!("case,transport,trials,p50_ms,p99_ms,max_ms,note");
    } else {
        println!(
            "{:<13} {:<6} {:>6} {:>9} {:>9} {:>9}  note",
            "case", "trans", "trials", "p50 ms", "p99 ms", "max ms"
        );
    }
    for mut r in rows {
        r.ms.sort_by(f64::total_cmp);
        let (p50, p99, max) = (
            quantile(&r.ms, 0.5),
            quantile(&r.ms, 0.99),
            r.ms.last().copied().unwrap_or(f64::NAN),
        );
        if format == Format::Csv {
            println!(
                "{},{},{},{p50:.1},{p99:.1},{max:.1},\"{}\"",
                r.case,
                t.name(),
                r.ms.len(),
                r.note
            );
        } else {
            println!(
                "{:<13} {:<6} {:>6} {p50:>9.1} {p99:>9.1} {max:>9.1}  {}",
                r.case,
                t.name(),
                r.ms.len(),
                r.note
            );
        }
    }
}

/// Runs `milonga bench liveliness`.
pub fn run(a: LivelinessArgs, t: Transport) -> Result<std::process::ExitCode> {
    let dir = std::env::temp_dir().join(format!("mlg-bench-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let at = Place {
        address: format!("milonga:///bench-live-{}", std::process::id()),
        runtime_dir: dir.display().to_string(),
        transport: t.name().to_owned(),
        hwm: 1000,
        history: 0,
        keys: None,
        spin_us: 0,
        no_shm: false,
        loan: false,
        shm_small: None,
    };
    let mut cfg = Config::new(&at.address, "live-sub");
    // Benchmarks compare with plain libzmq: security off unless asked
    // (`--with-security`), whatever the address.
    cfg.security = milonga::Security::Off;
    cfg.runtime_dir = Some(dir.clone());
    cfg.transport = t;
    let lease = Duration::from_millis(cfg.heartbeat_timeout_ms as u64);
    let node = Node::open_with(cfg)?;
    let sub = node.subscribe_with("lv/**", SubscriberQos::default())?;
    eprintln!(
        "# milonga bench liveliness: transport {}, heartbeat every 1000 ms, lease {} ms; a publisher process puts at 100 Hz; times from the signal (or the first put) to the event, in ms",
        t.name(),
        lease.as_millis()
    );
    let mut rows = Vec::new();
    let (mut kill, mut restart, mut missed, mut reasons) = (vec![], vec![], vec![], vec![]);
    for _ in 0..a.trials {
        let (trial, id, delay, m) = start_and_wait(&at, &sub)?;
        restart.push(delay);
        missed.push(m);
        let t0 = Instant::now();
        trial.signal(libc::SIGKILL);
        let (ms, reason) = lost_after(&sub, id, t0, Duration::from_secs(20))?;
        kill.push(ms);
        reasons.push(reason);
        drop(trial);
    }
    let wrong = reasons
        .iter()
        .filter(|r| **r != LostReason::Disconnected)
        .count();
    rows.push(Row {
        case: "kill9",
        ms: kill,
        note: format!(
            "reason disconnected in {} of {}",
            a.trials - wrong,
            a.trials
        ),
    });
    let mut stop = vec![];
    let mut stop_wrong = 0;
    for _ in 0..a.stop_trials {
        let (trial, id, _, _) = start_and_wait(&at, &sub)?;
        let t0 = Instant::now();
        trial.signal(libc::SIGSTOP);
        let (ms, reason) = lost_after(&sub, id, t0, lease * 3)?;
        stop.push(ms);
        stop_wrong += usize::from(reason != LostReason::LeaseExpired);
        drop(trial);
    }
    rows.push(Row {
        case: "sigstop",
        ms: stop,
        note: format!(
            "reason lease_expired in {} of {}; bound: lease + 1000 ms = {} ms",
            a.stop_trials - stop_wrong,
            a.stop_trials,
            lease.as_millis() + 1000
        ),
    });
    missed.sort_unstable();
    rows.push(Row {
        case: "restart",
        ms: restart,
        note: format!(
            "first put to first sample received; puts missed before it (no history): median {}, max {}",
            missed.get(missed.len() / 2).copied().unwrap_or(0),
            missed.last().copied().unwrap_or(0)
        ),
    });
    node.close();
    let _ = std::fs::remove_dir_all(&dir);
    print_rows(rows, t, a.format);
    Ok(std::process::ExitCode::SUCCESS)
}
