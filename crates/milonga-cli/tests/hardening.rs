//! Regression tests of issue 10 ("Nothing lost, nothing hung"), one per
//! finding, named after it: what outside tests broke, with real processes.

use std::process::Command;
use std::time::{Duration, Instant};

use milonga::{Config, Event, Node, SubscriberQos};
use milonga_testkit::{free_port, wait_for, Proc, SeqLedger, TempDir};

const T: Duration = Duration::from_secs(20);

/// A `milonga` command in its own runtime directory and domain.
struct Env {
    dir: TempDir,
    domain: String,
}

impl Env {
    fn new(tag: &str) -> Env {
        Env {
            dir: TempDir::new(tag),
            domain: format!("{tag}-{}", std::process::id()),
        }
    }

    fn locator(&self) -> String {
        format!("milonga:///{}", self.domain)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_milonga"));
        c.env("MILONGA_RUNTIME_DIR", self.dir.path())
            .env("MILONGA_LOCATOR", self.locator())
            .env_remove("MILONGA_PEERS")
            .env_remove("MILONGA_TRANSPORT")
            .env_remove("MILONGA_MAX_MESSAGE_BYTES")
            .args(args);
        c
    }

    fn config(&self, name: &str) -> Config {
        let mut c = Config::new(&self.locator(), name);
        c.runtime_dir = Some(self.dir.path().to_path_buf());
        c
    }
}

/// Reads events into `ledger` until `done` holds of it; panics after `T`.
fn read_until(
    sub: &milonga::Subscriber,
    ledger: &mut SeqLedger,
    what: &str,
    mut done: impl FnMut(&SeqLedger) -> bool,
) {
    let end = Instant::now() + T;
    while !done(ledger) {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        match sub.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Sample(s)) => ledger.sample(&s.publisher.to_hex(), &s.key, s.seq),
            Ok(Event::Lost(l)) => ledger.lost(&l.publisher.to_hex(), &l.key, l.first_seq, l.count),
            Ok(_) | Err(milonga::RecvError::Timeout) => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Finding 1: a publisher frozen (SIGSTOP) for longer than the lease, and
/// forgotten by static discovery meanwhile, comes back with the same node
/// id; the subscription still knows its sequence numbers, so every sample
/// is delivered once or reported lost, exactly (best effort), or delivered
/// once, repaired from history (reliable).
fn a_freeze_longer_than_the_lease(reliable: bool) {
    let env = Env::new(if reliable { "freeze-r" } else { "freeze-be" });
    let control = format!("tcp://127.0.0.1:{}", free_port());
    let mut args = vec!["pub", "fz/x", "1", "--rate", "1000"];
    if reliable {
        args.extend(["--reliable", "--history", "100000"]);
    }
    let publ = Proc::spawn({
        let mut c = env.cmd(&args);
        c.env("MILONGA_CONTROL_ENDPOINT", &control)
            .env("MILONGA_LOCAL_DISCOVERY", "0")
            .env("MILONGA_HEARTBEAT_INTERVAL_MS", "100")
            .env("MILONGA_HEARTBEAT_TIMEOUT_MS", "500");
        c
    });
    let mut cfg = env.config("freeze-sub");
    cfg.local_discovery = false;
    cfg.peers = vec![control.clone()];
    cfg.heartbeat_interval_ms = 100;
    cfg.heartbeat_timeout_ms = 500;
    cfg.static_query_interval_ms = 100;
    let node = Node::open_with(cfg).unwrap();
    let mut qos = SubscriberQos::default();
    if reliable {
        qos = qos.reliable();
    }
    let sub = node.subscribe_with("fz/**", qos).unwrap();
    let mut ledger = SeqLedger::default();
    read_until(&sub, &mut ledger, "samples before the freeze", |l| {
        l.check()
            .unwrap()
            .first()
            .is_some_and(|a| a.delivered >= 200)
    });
    let pub_id = node
        .peers()
        .into_iter()
        .find(|p| p.name.starts_with("pub@"))
        .expect("the publisher is known")
        .node_id;
    publ.signal(libc::SIGSTOP);
    // Discovery forgets the silent peer (3 query intervals, at least the
    // lease); the subscription reads on meanwhile.
    read_until(
        &sub,
        &mut ledger,
        "static discovery to forget the frozen publisher",
        |_| !node.peers().iter().any(|p| p.node_id == pub_id),
    );
    let before = ledger.last_delivered(&pub_id, "fz/x").unwrap();
    publ.signal(libc::SIGCONT);
    // On waking, the publisher catches up: about a thousand puts per
    // second frozen, at once, before discovery has found it again.
    read_until(&sub, &mut ledger, "samples well after the freeze", |l| {
        l.last_delivered(&pub_id, "fz/x")
            .is_some_and(|s| s > before + 3000)
    });
    let accounted = ledger.check().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(accounted.len(), 1, "{accounted:?}");
    if reliable {
        assert_eq!(accounted[0].lost, 0, "reliable with history: all repaired");
    }
    assert_eq!(
        sub.lost(),
        accounted[0].lost,
        "the subscription's own count agrees"
    );
}

#[test]
fn finding_01_a_freeze_longer_than_the_lease_loses_nothing_silently_best_effort() {
    a_freeze_longer_than_the_lease(false);
}

#[test]
fn finding_01_a_freeze_longer_than_the_lease_duplicates_nothing_reliable() {
    a_freeze_longer_than_the_lease(true);
}

/// Finding 2: a reliable sample put just before the publisher closes and
/// exits reaches a connected subscriber, large (1 MiB) or small, every
/// time; the subscriber's disconnect on the node's departure used to drop
/// what was still on its way.
#[test]
fn finding_02_the_last_sample_before_close_is_delivered() {
    let env = Env::new("close");
    let node = Node::open_with(env.config("close-sub")).unwrap();
    let sub = node
        .subscribe_with("cl/**", SubscriberQos::default().reliable())
        .unwrap();
    for (i, bytes) in [1 << 20, 32 << 10, 1 << 20, 32 << 10, 1 << 20, 32 << 10]
        .into_iter()
        .enumerate()
    {
        let key = format!("cl/{i}");
        let mut publ = Proc::spawn(env.cmd(&[
            "pub",
            &key,
            "--bytes",
            &bytes.to_string(),
            "--reliable",
            "--count",
            "1",
            "--wait-subscribers",
            "1",
        ]));
        let end = Instant::now() + T;
        let got = loop {
            assert!(
                Instant::now() < end,
                "run {i}: the sample of {bytes} bytes put before close never arrived"
            );
            match sub.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Sample(s)) if s.key == key => break s,
                Ok(Event::Lost(l)) => panic!("run {i}: reported lost: {l:?}"),
                Ok(_) | Err(milonga::RecvError::Timeout) => {}
                Err(e) => panic!("recv: {e}"),
            }
        };
        assert_eq!(got.bytes().map(|b| b.len()), Some(bytes));
        assert!(publ.wait_exit(T).unwrap().success());
        wait_for("the publisher to leave the domain", T, || {
            node.peers().iter().all(|p| !p.name.starts_with("pub@"))
        });
    }
    assert_eq!(sub.lost(), 0);
}

/// Finding 2, trailing losses: samples a best-effort publisher dropped
/// after the last one a subscriber received are reported when the
/// publisher closes (its goodbye carries the last sequence number of each
/// key), not at a "next sample" that never comes.
#[test]
fn finding_02_trailing_losses_are_reported_at_the_goodbye() {
    let env = Env::new("trailing");
    let mut cfg = env.config("trailing-pub");
    cfg.transport = milonga::Transport::Inproc;
    cfg.send_hwm = 1;
    let publ = Node::open_with(cfg).unwrap();
    let p = publ.publisher("tr/x").unwrap();
    let mut cfg = env.config("trailing-sub");
    cfg.transport = milonga::Transport::Inproc;
    let node = Node::open_with(cfg).unwrap();
    let sub = node
        .subscribe_with("tr/**", SubscriberQos::default().queue_depth(1))
        .unwrap();
    wait_for("the subscriber", T, || p.subscriber_count() == 1);
    // Nobody reads: the queues (a message each side) fill, the rest drops.
    for i in 0..100u64 {
        p.put(i).unwrap();
    }
    drop(p);
    publ.close();
    let mut ledger = SeqLedger::default();
    read_until(&sub, &mut ledger, "the losses up to the last sample", |l| {
        l.check().unwrap().first().is_some_and(|a| a.last == 100)
    });
    let a = ledger.check().unwrap_or_else(|e| panic!("{e}"));
    assert!(a[0].lost > 0 && a[0].delivered + a[0].lost == 100, "{a:?}");
    assert_eq!(sub.lost(), a[0].lost);
}

/// Finding 9: a FIFO and a link to /dev/zero named `*.json`, and 200 ghost
/// announcements (a live pid, endpoints nobody serves), in a domain
/// directory: nodes open, `ls` answers (its queries to the ghosts run at
/// once, one timeout in all: 200 of them used to take 100 s), and samples
/// flow.
#[test]
fn finding_09_hostile_files_in_the_domain_directory_hang_nothing() {
    let env = Env::new("hostile");
    let dir = env.dir.path().join(&env.domain);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = std::ffi::CString::new(dir.join("fifo.json").to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.json")).unwrap();
    let pid = std::process::id();
    let start = milonga_testkit::process_start_time(pid).unwrap();
    for i in 0..200u32 {
        let id = format!("{:032x}", 0x6000_0000u128 + u128::from(i));
        let ghost = serde_json::json!({
            "protocol": 1, "domain": env.domain, "node_id": id, "name": format!("ghost-{i}"),
            "host": "h", "pid": pid, "start_time": start,
            "control": format!("tcp://127.0.0.1:{}", free_port()),
            "data_best_effort": null, "data_reliable": null, "publications": [],
        });
        std::fs::write(dir.join(format!("{id}.json")), ghost.to_string()).unwrap();
    }
    let mut ls = Proc::spawn(env.cmd(&["ls", "--json"]));
    // A hang guard, not a timing: the ghosts are queried at once.
    let status = ls.wait_exit(T).expect("ls finishes");
    assert!(status.success());
    let sub = Proc::spawn(env.cmd(&["sub", "hf/x", "--json", "--count", "1"]));
    let _publ = Proc::spawn(env.cmd(&["pub", "hf/x", "5", "--rate", "50"]));
    let line = loop {
        let line = sub.line(T).expect("a sample through the hostile directory");
        if !line.contains("\"event\"") {
            break line;
        }
    };
    assert!(line.contains("\"value\":5"), "{line}");
}

/// Finding 15: a publisher killed with -9 while its only observer exits at
/// once leaves no announcement behind (a closing node removes the stale
/// ones it finds), and the domain directory goes with the last node.
#[test]
fn finding_15_the_last_node_to_leave_cleans_the_domain_directory() {
    let env = Env::new("cleanup");
    let dir = env.dir.path().join(&env.domain);
    let mut sub = Proc::spawn(env.cmd(&["sub", "cu/**", "--json"]));
    let mut publ = Proc::spawn(env.cmd(&["pub", "cu/x", "1", "--rate", "50"]));
    loop {
        let line = sub.line(T).expect("the observer hears the publisher");
        if !line.contains("\"event\"") {
            break;
        }
    }
    publ.kill9();
    sub.signal(libc::SIGINT);
    assert!(sub.wait_exit(T).expect("the observer exits").success());
    assert!(
        !dir.exists(),
        "left behind: {:?}",
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}
