//! `milonga demo`: three simulated device servers in their own processes,
//! and a monitor that subscribes with wildcards and prints a live table.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use milonga::{Event, RecvError, Value};

use crate::json::short;
use crate::NetArgs;

/// Options of `milonga demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = crate::args::seconds)]
    duration: f64,
}

/// The simulated devices.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A power supply: its current (f64) at 10 Hz.
    PowerSupply,
    /// A beam-position monitor: 1024 positions (f64 array) at 10 Hz.
    Bpm,
    /// A camera: 1024 x 1024 8-bit images (1 MiB) at 2 Hz.
    Camera,
}

impl DeviceKind {
    fn key(self) -> &'static str {
        match self {
            DeviceKind::PowerSupply => "demo/sr/ps/1/current",
            DeviceKind::Bpm => "demo/sr/bpm/1/positions",
            DeviceKind::Camera => "demo/sr/cam/1/image",
        }
    }

    fn rate_hz(self) -> f64 {
        match self {
            DeviceKind::PowerSupply | DeviceKind::Bpm => 10.0,
            DeviceKind::Camera => 2.0,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DeviceKind::PowerSupply => "power-supply",
            DeviceKind::Bpm => "bpm",
            DeviceKind::Camera => "camera",
        }
    }
}

/// Options of the hidden `milonga device` command.
#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// Which device to simulate.
    #[arg(value_enum)]
    kind: DeviceKind,
    /// Stop after this many seconds (default: run until terminated).
    #[arg(long)]
    duration: Option<f64>,
}

/// A small deterministic noise source (xorshift), enough for a simulation.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }
}

/// Runs one simulated device server until terminated.
pub fn device(net: &NetArgs, a: DeviceArgs) -> Result<ExitCode> {
    // Die with the parent: a demo interrupted by Ctrl-C leaves no device.
    crate::ffi::die_with_parent(libc::SIGTERM);
    crate::catch_interrupts();
    let node = net.open(a.kind.name())?;
    let p = node.publisher(a.kind.key())?;
    let period = Duration::from_secs_f64(1.0 / a.kind.rate_hz());
    let start = Instant::now();
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()));
    let mut n = 0u64;
    while a.duration.is_none_or(|d| start.elapsed().as_secs_f64() < d) && !crate::interrupted() {
        let t = start.elapsed().as_secs_f64();
        let value: Value = match a.kind {
            DeviceKind::PowerSupply => (100.0 + 0.5 * (t * 0.5).sin() + 0.01 * noise.next()).into(),
            DeviceKind::Bpm => (0..1024)
                .map(|i| 0.2 * ((i as f64) * 0.05 + t).sin() + 0.01 * noise.next())
                .collect::<Vec<f64>>()
                .into(),
            DeviceKind::Camera => {
                let shift = (t * 40.0) as usize;
                (0..1024 * 1024)
                    .map(|i| (((i % 1024) + (i / 1024) + shift) % 256) as u8)
                    .collect::<Vec<u8>>()
                    .into()
            }
        };
        p.put(value)?;
        n += 1;
        let next = start + period.mul_f64(n as f64);
        while let Some(d) = next.checked_duration_since(Instant::now()) {
            if crate::interrupted() {
                break;
            }
            std::thread::sleep(d.min(Duration::from_millis(50)));
        }
    }
    node.close();
    Ok(ExitCode::SUCCESS)
}

#[derive(Default)]
struct Row {
    last: String,
    total: u64,
    window: u64,
    rate: f64,
    lost: u64,
}

fn spawn_device(net: &NetArgs, kind: DeviceKind) -> Result<Child> {
    let exe = std::env::current_exe().context("cannot find the milonga executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("--locator").arg(&net.locator);
    if let Some(t) = net.transport {
        cmd.arg("--transport").arg(t.name());
    }
    // The devices join as the demo's own node does: its peers, and its
    // security (they failed to find one another with security on). Not
    // its fixed control endpoint, which one process alone can bind.
    for p in &net.peers {
        cmd.arg("--peer").arg(p);
    }
    if let Some(s) = net.security {
        let s = match s {
            milonga::Security::Auto => "auto",
            milonga::Security::On => "on",
            milonga::Security::Off => "off",
        };
        cmd.arg("--security").arg(s);
    }
    if let Some(k) = &net.key_file {
        cmd.arg("--key").arg(k);
    }
    if let Some(t) = &net.trust_dir {
        cmd.arg("--trust").arg(t);
    }
    if let Some(a) = &net.acl_file {
        cmd.arg("--acl").arg(a);
    }
    cmd.arg("device").arg(kind.name()).stdin(Stdio::null());
    cmd.spawn()
        .with_context(|| format!("cannot start the {} device", kind.name()))
}

fn stop(children: &mut [Child]) {
    for c in children.iter() {
        crate::ffi::signal(c.id(), libc::SIGTERM);
    }
    let end = Instant::now() + Duration::from_secs(2);
    for c in children.iter_mut() {
        while c.try_wait().ok().flatten().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Runs the demo: devices, monitor, clean stop.
pub fn run(net: &NetArgs, a: DemoArgs) -> Result<ExitCode> {
    let node = net.open("demo-monitor")?;
    let sub = node.subscribe("demo/**")?;
    let kinds = [DeviceKind::PowerSupply, DeviceKind::Bpm, DeviceKind::Camera];
    let mut children = Vec::new();
    for k in kinds {
        match spawn_device(net, k) {
            Ok(c) => children.push(c),
            Err(e) => {
                stop(&mut children);
                return Err(e);
            }
        }
    }
    {
        let mut o = std::io::stdout().lock();
        writeln!(
            o,
            "milonga demo: {} device servers in domain {} for {} s (watch it: milonga sub --locator {} 'demo/**')",
            children.len(),
            node.domain(),
            a.duration,
            net.locator
        )?;
        o.flush()?;
    }
    let tty = std::io::stdout().is_terminal();
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(a.duration);
    let mut last_print = Instant::now();
    while Instant::now() < end {
        match sub.recv_timeout(Duration::from_millis(50)) {
            Ok(Event::Sample(s)) => {
                let r = rows.entry(s.key.clone()).or_default();
                r.total += 1;
                r.window += 1;
                r.last = short(&s.value);
            }
            Ok(Event::Lost(l)) => rows.entry(l.key.clone()).or_default().lost += l.count,
            Ok(_) | Err(RecvError::Timeout) => {}
            Err(e) => {
                stop(&mut children);
                bail!(e);
            }
        }
        let since = last_print.elapsed();
        if since >= Duration::from_secs(1) {
            for r in rows.values_mut() {
                r.rate = r.window as f64 / since.as_secs_f64();
                r.window = 0;
            }
            last_print = Instant::now();
            print_table(&rows, start.elapsed(), tty)?;
        }
    }
    stop(&mut children);
    node.close();
    print_table(&rows, start.elapsed(), false)?;
    let missing: Vec<&str> = kinds
        .iter()
        .map(|k| k.key())
        .filter(|k| rows.get(*k).is_none_or(|r| r.total == 0))
        .collect();
    if !missing.is_empty() {
        bail!("no samples received from {}", missing.join(", "));
    }
    writeln!(std::io::stdout(), "milonga demo: done, devices stopped")?;
    Ok(ExitCode::SUCCESS)
}

fn print_table(rows: &BTreeMap<String, Row>, t: Duration, tty: bool) -> Result<()> {
    let mut o = std::io::stdout().lock();
    if tty {
        write!(o, "\x1b[H\x1b[2J")?;
    }
    writeln!(o, "t = {:.1} s", t.as_secs_f64())?;
    writeln!(
        o,
        "{:<26} {:>8} {:>8} {:>6}  last value",
        "key", "rate Hz", "samples", "lost"
    )?;
    for (k, r) in rows {
        writeln!(
            o,
            "{k:<26} {:>8.1} {:>8} {:>6}  {}",
            r.rate, r.total, r.lost, r.last
        )?;
    }
    o.flush()?;
    Ok(())
}
