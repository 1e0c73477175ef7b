//! Several hosts on one machine: network namespaces joined by veth pairs to
//! a bridge, for tests that cross a network.
//!
//! ```text
//!   host 0 (netns mlg-<pid>-<n>-h0)        host 1 (netns ...-h1)
//!   eth0 10.99.0.1/24, fd99::1/64          eth0 10.99.0.2/24, fd99::2/64
//!     │ veth                                 │ veth
//!   ──┴── h0 ──────── br0 ──────────────── h1 ─┴──  switch (netns ...-sw)
//! ```
//!
//! Every host has its own loopback, addresses, routes and nftables; the
//! bridge lives in a namespace of its own, so the machine's own network is
//! not touched and no traffic leaves the bed. A test can cut a host's link
//! (the switch port goes down), drop a share of its packets (nftables'
//! `numgen random`, in the host's own namespace), delay and reorder them
//! (a relay in user space, [`Bed::set_delay`]: this kernel has no
//! `sch_netem`) and freeze its processes (`Proc::signal(SIGSTOP)`).
//!
//! Everything a bed creates is removed when it is dropped, a failing test
//! included. A test process killed outright leaves its namespaces behind:
//! the next bed created on the machine removes those of processes that no
//! longer run (killing what still runs inside them), so nothing piles up.
//!
//! Creating namespaces needs root (CI runs as root). Where it is refused,
//! [`Bed::new`] says why; [`bed_or_skip`] turns that into a test failure
//! unless `MILONGA_SKIP_MULTIHOST=1` asks to skip, so that a skipped
//! multi-host suite never looks green.

pub use crate::relay::Capture;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The variable that lets a machine without network namespaces skip the
/// multi-host tests (they fail otherwise).
pub const SKIP_VAR: &str = "MILONGA_SKIP_MULTIHOST";

/// Prefix of every namespace a bed creates: `mlg-<pid>-<n>-<role>`.
const PREFIX: &str = "mlg-";

/// One host of a bed.
#[derive(Debug)]
pub struct Host {
    /// The network namespace.
    pub netns: String,
    /// Its address on the bed's network (`10.99.0.<i+1>`, /24).
    pub addr: Ipv4Addr,
    /// Its IPv6 address on the bed's network (`fd99::<i+1>`, /64, a
    /// unique-local address; the interface has a link-local one too).
    pub addr6: Ipv6Addr,
    /// The switch port it is plugged into (in the switch's namespace).
    port: String,
}

/// What a delayed link's relay did ([`Bed::link_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames sent on, both directions.
    pub frames: u64,
    /// Frames sent on before one that arrived earlier.
    pub reordered: u64,
    /// Frames dropped because the relay held 10,000 already.
    pub dropped: u64,
}

/// A set of hosts on one switch; removed when dropped.
#[derive(Debug)]
pub struct Bed {
    switch: String,
    hosts: Vec<Host>,
    /// Networks added after the first.
    networks: u8,
    /// The delay relay of each host's link on the first network, once
    /// [`Bed::set_delay`] made one.
    relays: Vec<Option<crate::relay::Relay>>,
}

/// Runs `ip`/`nft` and the like: Ok, or the command and what it printed.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// Runs `nft -f -` with `script` on its standard input, in `netns`.
fn nft(netns: &str, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "nft in {netns}: {} (script: {script})",
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The namespaces on the machine (`ip netns list`).
fn namespaces() -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Kills every process in `netns`, then deletes it.
fn remove_namespace(netns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<u32>() {
                crate::sys::signal(pid, libc::SIGKILL);
            }
        }
    }
    let _ = run("ip", &["netns", "del", netns]);
}

/// Whether process `pid` runs (a zombie, killed but not yet reaped, does
/// not). A recycled pid keeps a stale bed until that process ends.
fn runs(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X" | "x") | None)
}

/// Removes the namespaces of beds whose test process no longer runs
/// (killed before its beds could be dropped).
fn sweep_stale() {
    for ns in namespaces() {
        let Some(rest) = ns.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !runs(pid) {
            remove_namespace(&ns);
        }
    }
}

/// Creates bridge `name` in namespace `sw`, up.
fn add_bridge(sw: &str, name: &str) -> Result<(), String> {
    run("ip", &["-n", sw, "link", "add", name, "type", "bridge"])?;
    // Without a querier, IGMP snooping would stop multicast at the bridge
    // after a while.
    run(
        "ip",
        &[
            "-n",
            sw,
            "link",
            "set",
            name,
            "type",
            "bridge",
            "mcast_snooping",
            "0",
        ],
    )?;
    run("ip", &["-n", sw, "link", "set", name, "up"])
}

impl Bed {
    /// Creates `hosts` hosts (at most 250) on one switch. Err: why the
    /// namespaces or links could not be made (not root, no `ip`, no veth).
    pub fn new(hosts: usize) -> Result<Bed, String> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        assert!((1..=250).contains(&hosts), "1 to 250 hosts");
        sweep_stale();
        let tag = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let switch = format!("{tag}-sw");
        run("ip", &["netns", "add", &switch])?;
        // From here on, `Drop` removes what exists.
        let mut bed = Bed {
            switch,
            hosts: Vec::new(),
            networks: 0,
            relays: Vec::new(),
        };
        let sw = bed.switch.clone();
        add_bridge(&sw, "br0")?;
        for i in 0..hosts {
            let netns = format!("{tag}-h{i}");
            run("ip", &["netns", "add", &netns])?;
            let addr = Ipv4Addr::new(10, 99, 0, i as u8 + 1);
            let port = format!("h{i}");
            let addr6 = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, i as u16 + 1);
            bed.hosts.push(Host {
                netns: netns.clone(),
                addr,
                addr6,
                port: port.clone(),
            });
            run(
                "ip",
                &[
                    "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &netns,
                ],
            )?;
            run(
                "ip",
                &["-n", &sw, "link", "set", &port, "master", "br0", "up"],
            )?;
            let cidr = format!("{addr}/24");
            run("ip", &["-n", &netns, "addr", "add", &cidr, "dev", "eth0"])?;
            // No duplicate address detection: usable at once.
            let cidr6 = format!("{addr6}/64");
            run(
                "ip",
                &["-n", &netns, "addr", "add", &cidr6, "dev", "eth0", "nodad"],
            )?;
            run("ip", &["-n", &netns, "link", "set", "eth0", "up"])?;
            run("ip", &["-n", &netns, "link", "set", "lo", "up"])?;
            // Multicast leaves by the bed's network.
            run(
                "ip",
                &["-n", &netns, "route", "add", "224.0.0.0/4", "dev", "eth0"],
            )?;
        }
        Ok(bed)
    }

    /// Host `i`.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// The hosts.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// `program args...` to run on host `i` (`ip netns exec`). Its
    /// environment is the caller's.
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i].netns, program]);
        c
    }

    /// Unplugs host `i`: its switch port goes down, and nothing it sends
    /// arrives anywhere (nor does anything reach it).
    pub fn cut(&self, i: usize) {
        run(
            "ip",
            &[
                "-n",
                &self.switch,
                "link",
                "set",
                &self.hosts[i].port,
                "down",
            ],
        )
        .expect("cut a link");
    }

    /// Plugs host `i` back in.
    pub fn restore(&self, i: usize) {
        run(
            "ip",
            &["-n", &self.switch, "link", "set", &self.hosts[i].port, "up"],
        )
        .expect("restore a link");
    }

    /// Adds a network: a bridge of its own joining `members`, each given
    /// an interface `eth<k>` with address `10.99.<k>.<i+1>/24` (`k` the
    /// network's number, 1 for the first added). Its number.
    pub fn add_network(&mut self, members: &[usize]) -> Result<u8, String> {
        self.networks += 1;
        let k = self.networks;
        let sw = self.switch.clone();
        let br = format!("br{k}");
        add_bridge(&sw, &br)?;
        for &i in members {
            let port = format!("n{k}h{i}");
            let dev = format!("eth{k}");
            let netns = self.hosts[i].netns.clone();
            run(
                "ip",
                &[
                    "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", &dev, "netns",
                    &netns,
                ],
            )?;
            run(
                "ip",
                &["-n", &sw, "link", "set", &port, "master", &br, "up"],
            )?;
            let cidr = format!("{}/24", Ipv4Addr::new(10, 99, k, i as u8 + 1));
            run("ip", &["-n", &netns, "addr", "add", &cidr, "dev", &dev])?;
            run("ip", &["-n", &netns, "link", "set", &dev, "up"])?;
        }
        Ok(k)
    }

    /// Host `i` refuses new TCP connections arriving on its `eth0` (a
    /// firewall); UDP, multicast included, still passes.
    pub fn block_new_tcp(&self, i: usize) {
        let script = "table inet milonga_block {\n\
             \x20 chain input { type filter hook input priority 0; iifname \"eth0\" tcp flags & (syn | ack) == syn drop; }\n\
             }\n";
        nft(&self.hosts[i].netns, script).expect("block new TCP connections");
    }

    /// Delays every frame host `i` sends or receives on the bed's network
    /// by `delay` plus a uniformly random share of `jitter` (a jitter
    /// larger than the gap between two frames reorders them), in both
    /// directions: a round trip between two delayed hosts takes four
    /// delays. The first call puts a relay (two threads of this process
    /// in the switch's namespace, see `relay.rs`) on the host's link and
    /// turns offloads off on every host's `eth0`; later calls change the
    /// figures. At most 10,000 frames are held per direction; more are
    /// dropped.
    pub fn set_delay(&mut self, i: usize, delay: Duration, jitter: Duration) -> Result<(), String> {
        if self.relays.len() < self.hosts.len() {
            self.relays.resize_with(self.hosts.len(), || None);
        }
        if self.relays.iter().all(Option::is_none) {
            for h in &self.hosts {
                crate::relay::offloads_off(&h.netns, "eth0")?;
            }
        }
        let shape = match &self.relays[i] {
            Some(r) => r.shape.clone(),
            None => {
                let sw = self.switch.clone();
                let port = self.hosts[i].port.clone();
                let (outer, inner) = (format!("d{i}a"), format!("d{i}b"));
                run(
                    "ip",
                    &[
                        "-n", &sw, "link", "add", &outer, "type", "veth", "peer", "name", &inner,
                    ],
                )?;
                run("ip", &["-n", &sw, "link", "set", &port, "nomaster"])?;
                run("ip", &["-n", &sw, "link", "set", &port, "promisc", "on"])?;
                run(
                    "ip",
                    &["-n", &sw, "link", "set", &outer, "promisc", "on", "up"],
                )?;
                run(
                    "ip",
                    &["-n", &sw, "link", "set", &inner, "master", "br0", "up"],
                )?;
                let shape = std::sync::Arc::new(crate::relay::Shape::default());
                self.relays[i] = Some(crate::relay::start(&sw, &port, &outer, shape.clone())?);
                shape
            }
        };
        use std::sync::atomic::Ordering;
        shape
            .delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
        shape
            .jitter_us
            .store(jitter.as_micros() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Starts an eavesdropper on host `i`'s link: every frame it sends or
    /// receives on the bed's network is kept (see [`Capture`]).
    pub fn capture(&self, i: usize) -> Result<Capture, String> {
        crate::relay::capture(&self.switch, &self.hosts[i].port)
    }

    /// What the relay of host `i`'s link did so far ([`Bed::set_delay`]):
    /// frames sent on, frames sent before one that arrived earlier
    /// (reordered), frames dropped because 10,000 were held. `None`
    /// without a relay.
    pub fn link_stats(&self, i: usize) -> Option<LinkStats> {
        use std::sync::atomic::Ordering;
        let shape = &self.relays.get(i)?.as_ref()?.shape;
        Some(LinkStats {
            frames: shape.frames.load(Ordering::Relaxed),
            reordered: shape.reordered.load(Ordering::Relaxed),
            dropped: shape.dropped.load(Ordering::Relaxed),
        })
    }

    /// Drops `percent` of the packets host `i` sends and receives on the
    /// bed's network (nftables' `numgen random`), loopback untouched;
    /// 0 removes the rule.
    pub fn set_loss(&self, i: usize, percent: u32) {
        assert!(percent <= 100, "a percentage");
        self.set_loss_ppm(i, percent * 10_000);
    }

    /// [`Bed::set_loss`] in parts per million (3.35% is 33,500): finer
    /// figures, such as measured paths' loss rates.
    pub fn set_loss_ppm(&self, i: usize, ppm: u32) {
        assert!(ppm <= 1_000_000, "parts per million");
        let ns = &self.hosts[i].netns;
        // Deleting a table that does not exist fails: ignore that.
        let _ = nft(ns, "delete table inet milonga_bed\n");
        if ppm == 0 {
            return;
        }
        let script = format!(
            "table inet milonga_bed {{\n\
             \x20 chain input {{ type filter hook input priority 0; iifname \"eth0\" numgen random mod 1000000 < {ppm} drop; }}\n\
             \x20 chain output {{ type filter hook output priority 0; oifname \"eth0\" numgen random mod 1000000 < {ppm} drop; }}\n\
             }}\n"
        );
        nft(ns, &script).expect("set packet loss");
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // The relays' threads stop before their namespace goes.
        self.relays.clear();
        for h in &self.hosts {
            remove_namespace(&h.netns);
        }
        remove_namespace(&self.switch);
    }
}

/// A bed of `hosts` hosts, or `None` if the machine cannot make one and
/// [`SKIP_VAR`] is `1` (the one line printed says so). Without the
/// variable, a machine that cannot make one fails the test, with the
/// reason: a skipped multi-host suite must never look green.
pub fn bed_or_skip(hosts: usize) -> Option<Bed> {
    match Bed::new(hosts) {
        Ok(b) => Some(b),
        Err(why) if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") => {
            eprintln!("multi-host test SKIPPED ({SKIP_VAR}=1): cannot create network namespaces: {why}");
            None
        }
        Err(why) => panic!(
            "cannot create network namespaces ({why}); the multi-host tests need root and iproute2. Set {SKIP_VAR}=1 to skip them on this machine"
        ),
    }
}
