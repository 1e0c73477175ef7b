//! What the real-process tests of `milonga` share: a runtime directory and
//! a domain of their own, and the command run in them.
#![allow(dead_code)] // each test crate uses its part

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use milonga::{Config, Event, Node, Subscriber};
use milonga_testkit::{Proc, TempDir};
use serde_json::Value as Json;

/// A `milonga` command in its own runtime directory and domain.
pub struct Env {
    pub dir: TempDir,
    pub domain: String,
}

impl Env {
    pub fn new(tag: &str) -> Env {
        Env {
            dir: TempDir::new(tag),
            domain: format!("{tag}-{}", std::process::id()),
        }
    }

    pub fn locator(&self) -> String {
        format!("milonga:///{}", self.domain)
    }

    /// `milonga ARGS` in this environment (none of the caller's
    /// MILONGA_* settings that would take it elsewhere).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_milonga"));
        c.env("MILONGA_RUNTIME_DIR", self.dir.path())
            .env("MILONGA_LOCATOR", self.locator())
            .env_remove("MILONGA_PEERS")
            .env_remove("MILONGA_TRANSPORT")
            .env_remove("MILONGA_MAX_MESSAGE_BYTES")
            // A default identity, if one is made, lives with the test.
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .args(args);
        c
    }

    pub fn spawn(&self, args: &[&str]) -> Proc {
        Proc::spawn(self.cmd(args))
    }

    /// A node configuration in this environment.
    pub fn config(&self, name: &str) -> Config {
        let mut c = Config::new(&self.locator(), name);
        c.runtime_dir = Some(self.dir.path().to_path_buf());
        c
    }

    pub fn node(&self, name: &str) -> Node {
        Node::open_with(self.config(name)).expect("open node")
    }

    /// `milonga ls --json`, or `None` if it fails.
    pub fn try_ls(&self) -> Option<Vec<Json>> {
        let out = self.cmd(&["ls", "--json"]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let v: Json = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array().cloned()
    }

    /// `milonga ls --json`.
    pub fn ls(&self) -> Vec<Json> {
        self.try_ls().expect("ls succeeds and prints a JSON array")
    }
}

/// Starts `n` publisher processes (`milonga pub <prefix>/<i> ...`, each
/// given to `configure`), waits until `sub` (which must match them) has a
/// sample of each, kills them all with -9 at once, and returns how many
/// `sub` reported lost for each reason, and how long after the kills the
/// last report came. Panics if that takes longer than `timeout`.
pub fn kill_together(
    env: &Env,
    sub: &Subscriber,
    prefix: &str,
    n: usize,
    configure: impl Fn(&mut Command),
    timeout: Duration,
) -> (BTreeMap<&'static str, usize>, Duration) {
    let mut pubs: Vec<Proc> = (0..n)
        .map(|i| {
            let mut c = env.cmd(&["pub", &format!("{prefix}/{i}"), "[1,2,3]", "--rate", "200"]);
            configure(&mut c);
            Proc::spawn(c)
        })
        .collect();
    let mut alive = std::collections::HashSet::new();
    let end = Instant::now() + timeout;
    while alive.len() < n {
        assert!(
            Instant::now() < end,
            "only {} publishers heard",
            alive.len()
        );
        if let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(100)) {
            alive.insert(s.publisher);
        }
    }
    let killed = Instant::now();
    for p in &pubs {
        p.signal(libc::SIGKILL);
    }
    for p in &mut pubs {
        p.kill9();
    }
    let mut reasons = std::collections::HashMap::new();
    let end = Instant::now() + timeout;
    while reasons.len() < n {
        assert!(
            Instant::now() < end,
            "only {} reported lost: {reasons:?}",
            reasons.len()
        );
        if let Ok(Event::PublisherLost(l)) = sub.recv_timeout(Duration::from_millis(100)) {
            reasons.insert(l.publisher, l.reason);
        }
    }
    let took = killed.elapsed();
    let mut by_reason = BTreeMap::new();
    for r in reasons.values() {
        *by_reason.entry(r.as_str()).or_insert(0) += 1;
    }
    (by_reason, took)
}

/// A raw XSUB connected to `endpoint` that sends `n` subscriptions of
/// 64 KiB of pseudo-random bytes, then holds its connection until the
/// returned sender is dropped; join the handle after. libzmq's XSUB adds a
/// subscription to its own trie recursively, a stack frame per byte: the
/// thread gets a large stack. With `server_key` (Z85), the XSUB is a CURVE
/// client with a key of its own that nobody trusts.
pub fn long_subscriptions(
    endpoint: String,
    server_key: Option<String>,
    n: usize,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (leave, left) = std::sync::mpsc::channel::<()>();
    let sender = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let ctx = zmq::Context::new();
            let raw = ctx.socket(zmq::XSUB).unwrap();
            raw.set_sndhwm(0).unwrap();
            if let Some(server) = server_key {
                let own = zmq::CurveKeyPair::new().unwrap();
                raw.set_curve_serverkey(&zmq::z85_decode(&server).unwrap())
                    .unwrap();
                raw.set_curve_publickey(&own.public_key).unwrap();
                raw.set_curve_secretkey(&own.secret_key).unwrap();
            }
            raw.connect(&endpoint).unwrap();
            let mut x: u32 = 1;
            for _ in 0..n {
                let mut s = vec![1u8];
                s.extend((0..64 << 10).map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 24) as u8 | 0x20
                }));
                raw.send(s, 0).unwrap();
            }
            let _ = left.recv();
        })
        .expect("a thread");
    (leave, sender)
}
