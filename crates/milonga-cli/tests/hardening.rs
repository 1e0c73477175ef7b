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
