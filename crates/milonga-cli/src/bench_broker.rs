//! What `--via-broker` adds to `milonga bench pubsub` and `bench latency`:
//! a relay process between publishers and subscribers, either a raw
//! libzmq XSUB/XPUB proxy (`zmq_proxy`, the baseline) or `milonga broker`,
//! started for each cell, with the CPU time it spent.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use anyhow::{anyhow, bail, Context, Result};

/// A relay process and its CPU time at the start of the cell.
pub(crate) struct Relay {
    child: Child,
    cpu_at_start: u64,
    /// Raw proxy: where publishers connect (the XSUB) and subscribers
    /// connect (the XPUB). Broker: the locator, and its listen endpoint.
    pub(crate) front: String,
    pub(crate) back: String,
}

impl Relay {
    /// A raw libzmq proxy (`zmq::proxy`) binding two free loopback ports,
    /// with high-water mark `hwm` (and `XPUB_NODROP` when `nodrop`, as a
    /// reliable raw publisher has).
    pub(crate) fn raw_proxy(hwm: i32, nodrop: bool) -> Result<Relay> {
        let free = || crate::bench::free_endpoint(milonga::Transport::Tcp, "proxy");
        let (front, back) = (free()?, free()?);
        let role = crate::bench::Role::RawProxy {
            front: front.clone(),
            back: back.clone(),
            hwm,
            nodrop,
        };
        let child = Command::new(std::env::current_exe()?)
            .arg("bench-worker")
            .arg(serde_json::to_string(&role)?)
            .stdout(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start the raw proxy")?;
        Relay::started(child, front, back)
    }

    /// `milonga broker` on a free loopback port serving `domain`, with
    /// high-water mark `hwm` on its sockets; with security on when given
    /// `keys` (a directory holding `bench.key` and `trust/`, the identity
    /// of every worker: each names the broker's key by holding it).
    pub(crate) fn broker(domain: &str, hwm: i32, keys: Option<&str>) -> Result<Relay> {
        Relay::start_broker(domain, hwm, None, keys)
    }

    /// A broker as [`Relay::broker`], linked to the broker `peer` (its
    /// listen endpoint) in a federation.
    pub(crate) fn linked_broker(domain: &str, hwm: i32, peer: Option<&str>) -> Result<Relay> {
        Relay::start_broker(domain, hwm, peer, None)
    }

    fn start_broker(
        domain: &str,
        hwm: i32,
        peer: Option<&str>,
        keys: Option<&str>,
    ) -> Result<Relay> {
        let mut args = vec![
            "broker",
            "--listen",
            "tcp://127.0.0.1:0",
            "--json",
            "--domain",
            domain,
        ];
        if let Some(p) = peer {
            args.extend(["--peer-broker", p]);
        }
        let key_file;
        let trust;
        if let Some(k) = keys {
            key_file = format!("{k}/bench.key");
            trust = format!("{k}/trust");
            args.extend(["--security", "on", "--key", &key_file, "--trust", &trust]);
        }
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .env("MILONGA_SEND_HWM", hwm.to_string())
            .env("MILONGA_RECV_HWM", hwm.to_string())
            .env_remove("MILONGA_LOCATOR")
            .env_remove("MILONGA_PEERS")
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start milonga broker")?;
        let mut line = String::new();
        let out = child.stdout.take().expect("piped");
        let mut r = BufReader::new(out);
        r.read_line(&mut line)?;
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("the broker said {line:?}"))?;
        let locator = v["locators"][0]
            .as_str()
            .ok_or_else(|| anyhow!("the broker said {line:?}"))?
            .to_owned();
        let listen = v["listen"].as_str().unwrap_or_default().to_owned();
        // Its later lines (stats) are read and dropped, so that it never
        // blocks on a full pipe.
        std::thread::spawn(move || for _ in r.lines() {});
        Relay::started(child, locator, listen)
    }

    fn started(child: Child, front: String, back: String) -> Result<Relay> {
        let cpu_at_start = crate::bench_rpc::cpu_ns(child.id())?;
        Ok(Relay {
            child,
            cpu_at_start,
            front,
            back,
        })
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops it; the CPU time it spent since it started, in nanoseconds.
    pub(crate) fn finish(mut self) -> Result<u64> {
        let cpu = crate::bench_rpc::cpu_ns(self.child.id())?.saturating_sub(self.cpu_at_start);
        crate::ffi::signal(self.child.id(), libc::SIGTERM);
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.child.try_wait()?.is_none() {
            if std::time::Instant::now() > end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the relay did not stop within 5 s of SIGTERM");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        Ok(cpu)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The raw proxy's worker: binds an XSUB at `front` and an XPUB at `back`
/// (verbose, so that a raw publisher counts each subscriber) and forwards
/// until killed.
pub(crate) fn raw_proxy(
    ctx: &zmq::Context,
    front: &str,
    back: &str,
    hwm: i32,
    nodrop: bool,
) -> Result<()> {
    let f = ctx.socket(zmq::XSUB)?;
    f.set_rcvhwm(hwm)?;
    f.set_sndhwm(hwm)?;
    f.bind(front)?;
    let mut b = ctx.socket(zmq::XPUB)?;
    b.set_sndhwm(hwm)?;
    b.set_rcvhwm(hwm)?;
    b.set_xpub_verbose(true)?;
    crate::ffi::set_xpub_nodrop(&mut b, nodrop)?;
    b.bind(back)?;
    zmq::proxy(&f, &b)?;
    Ok(())
}
