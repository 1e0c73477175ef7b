//! End-to-end tests with real processes: the `milonga` command against
//! itself and against nodes of this test process.

use std::process::Command;
use std::time::{Duration, Instant};

use milonga::{Node, PublisherQos};
use milonga_testkit::{free_port, wait_for, Proc, TempDir};

mod common;
use common::Env;
use serde_json::Value as Json;

const T: Duration = Duration::from_secs(20);

fn json_line(p: &Proc) -> Json {
    parse(&p.line(T).expect("a line before the timeout"))
}

fn parse(line: &str) -> Json {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"))
}

/// The next line that is a sample, skipping status events.
fn sample_line(p: &Proc) -> Json {
    loop {
        let j = json_line(p);
        if j.get("event").is_none() {
            return j;
        }
    }
}

fn samples(p: &Proc, n: usize) -> Vec<Json> {
    (0..n).map(|_| sample_line(p)).collect()
}

#[test]
fn discovery_subscriber_first() {
    let env = Env::new("subfirst");
    let mut sub = env.spawn(&["sub", "lab/ps/*", "--json", "--count", "5"]);
    let mut publ = env.spawn(&[
        "pub",
        "lab/ps/1",
        "12.5",
        "--rate",
        "100",
        "--count",
        "5",
        "--wait-subscribers",
        "1",
    ]);
    let got = samples(&sub, 5);
    for (i, s) in got.iter().enumerate() {
        assert_eq!(s["key"], "lab/ps/1");
        assert_eq!(s["value"], 12.5);
        assert_eq!(s["seq"], i as u64 + 1, "no gap and no duplicate");
        assert_eq!(s["publisher"].as_str().unwrap().len(), 32);
        assert!(s["timestamp_ns"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    }
    assert!(publ.wait_exit(T).unwrap().success());
    let status = sub
        .wait_exit(T)
        .expect("the subscriber exits after --count 5");
    assert!(status.success(), "{status}");
}

/// `milonga sub ... | head -1`: the reader of its output leaves, and the
/// subscriber ends with success, saying nothing (it printed "Broken pipe"
/// and exited 1).
#[test]
fn a_subscriber_whose_reader_leaves_ends_quietly() {
    let env = Env::new("subpipe");
    let _publ = env.spawn(&["pub", "lab/pp/1", "1", "--rate", "200"]);
    let mut sub = env
        .cmd(&["sub", "lab/pp/*", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(sub.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert!(line.starts_with('{'), "{line}");
    drop(out);
    // Its next write fails: the command ends (killed at the deadline).
    let end = Instant::now() + T;
    let status = loop {
        if let Some(s) = sub.try_wait().unwrap() {
            break s;
        }
        if Instant::now() >= end {
            let _ = sub.kill();
            let _ = sub.wait();
            panic!("the subscriber went on writing into a closed pipe");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(sub.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains("Broken pipe"), "{err}");
}

#[test]
fn discovery_publisher_first() {
    let env = Env::new("pubfirst");
    let publ = env.spawn(&["pub", "lab/ps/1", r#"{"current": 3}"#, "--rate", "50"]);
    // The publisher is first: announced, and already putting (to nobody)
    // before the subscriber starts.
    wait_for("the publisher announced and putting", T, || {
        env.ls().iter().any(|n| {
            n["pid"].as_u64() == Some(u64::from(publ.pid()))
                && n["stats"]["samples_sent"].as_u64().is_some_and(|s| s > 0)
        })
    });
    let mut sub = env.spawn(&["sub", "lab/**", "--json", "--count", "3"]);
    let got = samples(&sub, 3);
    assert_eq!(got[0]["value"]["current"], 3);
    // Joining mid-stream is not a loss: the first sequence number seen starts the count.
    let seqs: Vec<u64> = got.iter().map(|s| s["seq"].as_u64().unwrap()).collect();
    assert!(seqs[0] > 1, "joined mid-stream: {seqs:?}");
    assert_eq!(seqs[1], seqs[0] + 1);
    assert_eq!(event_line(&sub, "summary")["lost"], 0, "joining is no loss");
    assert!(sub.wait_exit(T).unwrap().success());
}

/// Publishers that close are not reported unreachable: their endpoints
/// refuse the subscriber's reconnections until discovery forgets them,
/// which is counted (`connects_failed`), not logged as a fault
/// (docs/discovery.md; `hosts.rs` checks that an unreachable one is).
#[test]
fn publishers_that_close_are_not_logged_as_unreachable() {
    let env = Env::new("closing");
    let dir = TempDir::new("closing-log");
    let log = dir.path().join("sub.stderr");
    let mut cmd = env.cmd(&["sub", "lab/**", "--json"]);
    cmd.stderr(std::fs::File::create(&log).unwrap());
    let sub = Proc::spawn(cmd);
    for i in 0..5 {
        let key = format!("lab/closing/{i}");
        let mut publ = env.spawn(&[
            "pub",
            &key,
            "1",
            "--rate",
            "100",
            "--count",
            "20",
            "--wait-subscribers",
            "1",
        ]);
        assert!(publ.wait_exit(T).unwrap().success());
    }
    // An absence cannot be polled for: a refusal that went on would be
    // said a second after the first (RETRY_SAID_AFTER) at the subscriber's
    // next turn, well within these 3 s.
    std::thread::sleep(Duration::from_secs(3));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("cannot connect to a publisher"), "{text}");
    drop(sub);
}

/// A publisher that discovery shows but whose endpoints refuse every
/// connection is logged, with its endpoint, once it keeps refusing. Here:
/// a copy of a live node's announcement under another id, its endpoints
/// moved to a port nothing listens on.
#[test]
fn a_publisher_that_keeps_refusing_is_logged_as_unreachable() {
    let env = Env::new("refusing");
    let node = env.node("real");
    let _p = node.publisher("lab/refusing/x").unwrap();
    let dir = env.dir.path().join(&env.domain);
    let own = dir.join(format!("{}.json", node.id().to_hex()));
    wait_for("the node's announcement", T, || own.exists());
    let mut a: Json = serde_json::from_str(&std::fs::read_to_string(&own).unwrap()).unwrap();
    let port = free_port();
    let closed = format!("tcp://127.0.0.1:{port}");
    let ghost = "00112233445566778899aabbccddeeff";
    a["node_id"] = ghost.into();
    a["name"] = "ghost".into();
    for k in ["control", "data_best_effort", "data_reliable", "liveliness"] {
        if a[k].is_string() {
            a[k] = closed.clone().into();
        }
    }
    for p in a["publications"].as_array_mut().unwrap() {
        if p["endpoint"].is_string() {
            p["endpoint"] = closed.clone().into();
        }
    }
    let tmp = dir.join(format!(".{ghost}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&a).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{ghost}.json"))).unwrap();
    let log_dir = TempDir::new("refusing-log");
    let log = log_dir.path().join("sub.stderr");
    let mut cmd = env.cmd(&["sub", "lab/**", "--json"]);
    cmd.stderr(std::fs::File::create(&log).unwrap());
    let _sub = Proc::spawn(cmd);
    let said = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("cannot connect to a publisher") && text.contains(&format!(":{port}"))
    };
    assert!(
        milonga_testkit::poll_until(T, said),
        "the refusing publisher was logged: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn kill_9_of_a_publisher_leaves_nothing_that_blocks_or_misleads() {
    let env = Env::new("kill9");
    let sub = env.spawn(&["sub", "k9/**", "--json"]);
    let mut a = env.spawn(&["pub", "k9/a", "1", "--rate", "100"]);
    let _b = env.spawn(&["pub", "k9/b", "2", "--rate", "100"]);
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 2 {
        seen.insert(sample_line(&sub)["key"].as_str().unwrap().to_owned());
    }
    let a_pid = a.pid();
    a.kill9();
    // Its announcement disappears from the domain.
    wait_for("the killed node to leave ls", T, || {
        env.ls()
            .iter()
            .all(|n| n["pid"].as_u64() != Some(u64::from(a_pid)))
    });
    let files = std::fs::read_dir(env.dir.path().join(&env.domain))
        .unwrap()
        .count();
    assert_eq!(files, 2, "only the live nodes' announcements remain");
    // The subscriber goes on with the other publisher: k9/b's samples, with
    // its value and in order (k9/a's, received before the kill and still
    // queued in the pipe, may come first).
    let mut b_seqs = Vec::new();
    while b_seqs.len() < 20 {
        let s = sample_line(&sub);
        match s["key"].as_str() {
            Some("k9/b") => {
                assert_eq!(s["value"], 2, "{s}");
                b_seqs.push(s["seq"].as_u64().unwrap());
            }
            Some("k9/a") => assert_eq!(s["value"], 1, "only the killed one's: {s}"),
            _ => panic!("a sample of neither publisher: {s}"),
        }
    }
    assert!(
        b_seqs.windows(2).all(|w| w[0] < w[1]),
        "k9/b in order: {b_seqs:?}"
    );
    // And a restarted publisher is found again, with no action from the subscriber.
    let _a2 = env.spawn(&["pub", "k9/a", "3", "--rate", "100"]);
    wait_for("samples from the restarted publisher", T, || {
        sample_line(&sub)["value"] == 3
    });
}

/// The shared-memory segments (docs/shared-memory.md) of process `pid`.
fn segments_of(pid: u32) -> Vec<std::path::PathBuf> {
    // `milonga-<host>-<pid>-<node id>-<n>`
    let pid = pid.to_string();
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with("milonga-") && name.split('-').nth(2) == Some(pid.as_str())
                })
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A publisher of large samples writes them into a shared-memory segment
/// for the subscribers on its host. A subscriber killed with -9 while it
/// holds a sample (its lease) and has references queued unread does not
/// stop the publisher: the next subscriber gets shared memory again.
/// Killed with -9, the publisher cannot remove its segment, and the
/// subscriber's node sweeps it once the process is gone.
#[test]
fn a_publisher_killed_with_9_leaves_no_shared_memory_segment_behind() {
    let env = Env::new("shmkill");
    // It holds each sample for 30 s (it sleeps with it).
    let mut first = env.spawn(&["sub", "shm/cam", "--json", "--sleep-ms", "30000"]);
    let mut publ = env.spawn(&[
        "pub",
        "shm/cam",
        "--bytes",
        "200000",
        "--rate",
        "1000",
        "--reliable",
    ]);
    samples(&first, 1);
    let pid = publ.pid();
    wait_for("the publisher's segment", T, || {
        !segments_of(pid).is_empty()
    });
    // Long enough for the ring (64 MiB: 320 samples) to fill with slots
    // the first subscriber holds or was sent and never reads.
    std::thread::sleep(Duration::from_secs(1));
    first.kill9();
    let node = env.node("second");
    let second = node.subscribe("shm/cam").unwrap();
    let mut seqs = Vec::new();
    wait_for("samples through shared memory again", T, || {
        if let Ok(milonga::Event::Sample(s)) = second.recv_timeout(Duration::from_millis(100)) {
            seqs.push(s.seq);
        }
        node.stats().shm_received >= 20
    });
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(node.stats().shm_unreadable, 0);
    publ.kill9();
    wait_for("the killed publisher's segment to be swept", T, || {
        segments_of(pid).is_empty()
    });
}

/// Shared memory is used only between processes of one user (and one
/// `/dev/shm`, pid and network namespace: docs/shared-memory.md). A
/// subscriber process of another user on the same host, which could not
/// open the publisher's segments (mode 0600), never asks for shared memory
/// and gets every large sample through the socket, as does the publisher's
/// own-user subscriber beside it (a sample goes one way to all); once the
/// other user's process is gone, the same samples go through shared memory.
///
/// Starting a process as another user needs root: run as anyone else, the
/// test says so on stderr and checks nothing (CI runs as root).
#[test]
fn a_subscriber_of_another_user_gets_large_samples_through_the_socket() {
    use std::os::unix::process::CommandExt;
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: starting a process as another user needs root");
        return;
    }
    const NOBODY: u32 = 65534;
    let env = Env::new("shmuser");
    let other = TempDir::new("shmuser-other");
    // The other user's runtime directory, configuration and binary (the
    // build's directory may be closed to it).
    let (runtime, config) = (other.path().join("run"), other.path().join("config"));
    for d in [&runtime, &config] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let bin = other.path().join("milonga");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_milonga"), &bin).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_milonga"), &bin).unwrap();
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(other.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another user's nodes are not in this user's discovery directory: it
    // reaches the publisher by its control endpoint, over tcp.
    let control = format!("tcp://127.0.0.1:{}", free_port());
    let mut cfg = env.config("pub");
    cfg.transport = milonga::Transport::Tcp;
    cfg.control_endpoint = Some(control.clone());
    let publishing = Node::open_with(cfg).unwrap();
    let p = publishing
        .publisher_with("shm/user", PublisherQos::reliable())
        .unwrap();
    let mut cfg = env.config("same-user");
    cfg.transport = milonga::Transport::Tcp;
    let own = Node::open_with(cfg).unwrap();
    let mine = own.subscribe("shm/user").unwrap();
    let mut cmd = Command::new(&bin);
    cmd.args(["sub", "shm/user", "--json"])
        .env("MILONGA_LOCATOR", env.locator())
        .env("MILONGA_RUNTIME_DIR", &runtime)
        .env("MILONGA_PEERS", &control)
        .env("MILONGA_TRANSPORT", "tcp")
        .env("XDG_CONFIG_HOME", &config)
        .env("HOME", other.path())
        .env_remove("MILONGA_MAX_MESSAGE_BYTES")
        .current_dir(other.path())
        .uid(NOBODY)
        // (std drops root's supplementary groups with the uid.)
        .gid(NOBODY);
    let mut theirs = Proc::spawn(cmd);
    wait_for("both subscriptions", T, || p.subscriber_count() >= 2);
    let payload = |i: usize| milonga::Value::Bytes(vec![i as u8; 200_000].into());
    for i in 0..20 {
        p.put(payload(i)).unwrap();
    }
    let seqs: Vec<u64> = samples(&theirs, 20)
        .iter()
        .map(|s| s["seq"].as_u64().expect("a seq"))
        .collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<u64>>());
    for i in 0..20 {
        let s = next_sample(&mine);
        assert_eq!((s.seq, &s.value), (i as u64 + 1, &payload(i)));
    }
    assert_eq!(
        publishing.stats().shm_sent,
        0,
        "the other user's subscription did not ask: every sample through the socket"
    );
    assert_eq!(own.stats().shm_unreadable, 0);
    theirs.kill9();
    wait_for("the other user's subscription to leave", T, || {
        p.subscriber_count() == 1
    });
    for i in 20..30 {
        p.put(payload(i)).unwrap();
        assert_eq!(next_sample(&mine).value, payload(i));
    }
    assert_eq!(
        publishing.stats().shm_sent,
        10,
        "its own user's subscription alone: shared memory"
    );
}

/// The next sample of `sub`, skipping status events.
fn next_sample(sub: &milonga::Subscriber) -> milonga::Sample {
    let end = Instant::now() + T;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match sub.recv_timeout(left) {
            Ok(milonga::Event::Sample(s)) => return s,
            Ok(_) => {}
            Err(e) => panic!("no sample within {T:?}: {e}"),
        }
    }
}

#[test]
fn wildcards_deliver_what_matches_and_nothing_else() {
    let env = Env::new("wild");
    let sub = env.spawn(&["sub", "sr/*/1/**", "--json"]);
    let exact = env.spawn(&["sub", "a/b", "--json"]);
    let _p1 = env.spawn(&["pub", "sr/ps/1/current", "1", "--rate", "50"]);
    let _p2 = env.spawn(&["pub", "sr/bpm/1/pos/x", "2", "--rate", "50"]);
    let _p3 = env.spawn(&["pub", "sr/ps/2/current", "3", "--rate", "50"]);
    let _p4 = env.spawn(&["pub", "sr/ps", "4", "--rate", "50"]);
    let _p5 = env.spawn(&["pub", "a/bc", "5", "--rate", "50"]);
    let _p6 = env.spawn(&["pub", "a/b", "6", "--rate", "50"]);
    let mut keys = std::collections::BTreeSet::new();
    for _ in 0..100 {
        keys.insert(sample_line(&sub)["key"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        keys,
        ["sr/bpm/1/pos/x", "sr/ps/1/current"]
            .map(String::from)
            .into()
    );
    for _ in 0..30 {
        assert_eq!(sample_line(&exact)["key"], "a/b");
    }
    // `a/bc` never reached the `a/b` subscriber's process: ZeroMQ filtered it
    // at the publisher, so the subscriber had nothing to filter.
    let nodes = env.ls();
    let exact_node = nodes
        .iter()
        .find(|n| n["pid"].as_u64() == Some(u64::from(exact.pid())))
        .expect("the a/b subscriber is listed");
    assert_eq!(exact_node["stats"]["frames_filtered"], 0);
    assert!(exact_node["stats"]["samples_received"].as_u64().unwrap() >= 30);
}

#[test]
fn nodes_of_different_domains_never_exchange_a_sample() {
    let a = Env::new("doma");
    // Same runtime directory, another domain.
    let b = Env {
        dir: TempDir::new("unused"),
        domain: format!("domb-{}", std::process::id()),
    };
    let b_cmd = |args: &[&str]| {
        let mut c = b.cmd(args);
        c.env("MILONGA_RUNTIME_DIR", a.dir.path());
        c
    };
    let port = free_port();
    let control = format!("tcp://127.0.0.1:{port}");
    let _publ = Proc::spawn({
        let mut c = a.cmd(&["pub", "shared/key", "1", "--rate", "100"]);
        c.env("MILONGA_CONTROL_ENDPOINT", &control);
        c
    });
    let same = a.spawn(&["sub", "shared/key", "--json", "--count", "3"]);
    // The publisher works.
    for s in samples(&same, 3) {
        assert_eq!(s["key"], "shared/key", "{s}");
        assert_eq!(s["value"], 1, "{s}");
    }
    // A subscriber of domain B: by local discovery and by a static peer.
    let mut other = Proc::spawn(b_cmd(&[
        "sub",
        "shared/key",
        "--json",
        "--count",
        "1",
        "--timeout",
        "2",
        "--peer",
        &control,
    ]));
    let status = other.wait_exit(T).unwrap();
    assert_eq!(status.code(), Some(2), "no sample crossed domains");
    // The static peer of the other domain was seen, and refused, and counted.
    let _watch = Proc::spawn(b_cmd(&["sub", "shared/key", "--peer", &control]));
    wait_for("the foreign peer to be counted", T, || {
        let out = b_cmd(&["ls", "--json"]).output().unwrap();
        let nodes: Json = serde_json::from_slice(&out.stdout).unwrap();
        nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["stats"]["peers_foreign_domain"].as_u64().unwrap_or(0) > 0)
    });
}

#[test]
fn static_discovery_across_the_loopback() {
    let env = Env::new("static");
    let port = free_port();
    let control = format!("tcp://127.0.0.1:{port}");
    let _publ = Proc::spawn({
        let mut c = env.cmd(&["pub", "far/ps", "7", "--rate", "50"]);
        c.env("MILONGA_CONTROL_ENDPOINT", &control)
            .env("MILONGA_LOCAL_DISCOVERY", "0");
        c
    });
    let mut sub = Proc::spawn({
        let mut c = env.cmd(&[
            "sub", "far/**", "--json", "--count", "2", "--peer", &control,
        ]);
        c.env("MILONGA_LOCAL_DISCOVERY", "0");
        c
    });
    let got = samples(&sub, 2);
    assert_eq!(got[0]["value"], 7);
    assert!(sub.wait_exit(T).unwrap().success());
}

#[test]
fn reliable_mode_loses_nothing_to_a_slow_subscriber() {
    let env = Env::new("reliable");
    let mut cfg = env.config("reliable-pub");
    cfg.send_hwm = 20;
    let node = Node::open_with(cfg).unwrap();
    let p = node
        .publisher_with("rel/data", PublisherQos::reliable())
        .unwrap();
    let n = 3000u64;
    let mut sub = Proc::spawn({
        let mut c = env.cmd(&[
            "sub",
            "rel/data",
            "--json",
            "--count",
            &n.to_string(),
            "--sleep-ms",
            "0.2",
        ]);
        c.env("MILONGA_RECV_HWM", "20");
        c
    });
    wait_for("the subscriber", T, || p.subscriber_count() == 1);
    let writer = std::thread::spawn(move || {
        for i in 0..n {
            p.put(i).unwrap();
        }
        p
    });
    let mut lost_events = 0;
    let mut next = 1u64;
    while next <= n {
        let j = json_line(&sub);
        if j["event"] == "lost" {
            lost_events += 1;
            continue;
        }
        if j.get("event").is_some() {
            continue;
        }
        assert_eq!(j["seq"], next, "in order, nothing missing");
        assert_eq!(j["value"], next - 1);
        next += 1;
    }
    assert_eq!(lost_events, 0);
    let p = writer.join().unwrap();
    assert!(sub.wait_exit(T).unwrap().success());
    let stats = node.stats();
    assert_eq!(stats.samples_sent, n);
    // The subscriber was slower than the publisher: samples queued up and
    // left in batches, which the subscriber unpacked in order above.
    assert!(
        stats.batches_sent > 0 && stats.samples_batched > stats.batches_sent,
        "{stats:?}"
    );
    drop(p);
}

#[test]
fn best_effort_counts_exactly_what_it_dropped() {
    let env = Env::new("besteffort");
    let mut cfg = env.config("be-pub");
    cfg.send_hwm = 20;
    let node = Node::open_with(cfg).unwrap();
    let p = node.publisher("be/data").unwrap();
    let sub = Proc::spawn({
        let mut c = env.cmd(&["sub", "be/data", "--json", "--sleep-ms", "0.5"]);
        c.env("MILONGA_RECV_HWM", "20");
        c
    });
    wait_for("the subscriber", T, || p.subscriber_count() == 1);
    let n = 5000u64;
    for i in 0..n {
        p.put(i).unwrap();
    }
    // One more sample that gets through reveals any gap before it. It must
    // be put once the queues have drained: put one now, and another each
    // time the subscriber has printed nothing for 200 ms (its queues are
    // empty, so the one before was dropped, and is counted like the others),
    // until one comes.
    let (mut received, mut lost) = (0u64, 0u64);
    let mut probe = n;
    p.put(probe).unwrap();
    let hang_guard = Instant::now() + T * 6;
    let last_seq = loop {
        assert!(
            Instant::now() < hang_guard,
            "hang guard: no sample put after the flood reached the subscriber"
        );
        let Some(line) = sub.line(Duration::from_millis(200)) else {
            probe += 1;
            p.put(probe).unwrap();
            continue;
        };
        let j = parse(&line);
        if j["event"] == "lost" {
            lost += j["count"].as_u64().unwrap();
            continue;
        }
        if j.get("event").is_some() {
            continue;
        }
        received += 1;
        let seq = j["seq"].as_u64().unwrap();
        if seq > n {
            break seq;
        }
    };
    assert!(
        lost > 0,
        "the slow subscriber must have lost samples at a high-water mark of 20"
    );
    assert_eq!(
        received + lost,
        last_seq,
        "every sample up to the last one received is either received or counted lost"
    );
    // On exit the subscriber sums its losses per publisher (a probe put
    // after the one that came may still reveal one more loss meanwhile).
    sub.signal(libc::SIGINT);
    let summary = loop {
        let j = json_line(&sub);
        if j["event"] == "lost" {
            lost += j["count"].as_u64().unwrap();
        }
        if j["event"] == "summary" {
            break j;
        }
    };
    assert_eq!(summary["lost"], lost);
    assert_eq!(summary["lost_by_publisher"][node.id().to_hex()], lost);
}

#[test]
fn ls_lists_nodes_endpoints_and_keys() {
    let env = Env::new("ls");
    let publ = env.spawn(&["pub", "ls/ps/1", "1", "--rate", "10"]);
    wait_for("the publisher in ls", T, || {
        env.ls().iter().any(|n| {
            n["pid"].as_u64() == Some(u64::from(publ.pid()))
                && n["publications"][0]["key"] == "ls/ps/1"
                && n["data_best_effort"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("tcp://127.0.0.1:"))
                && n["stats"]["samples_sent"].as_u64().is_some()
        })
    });
    let out = env.cmd(&["ls"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("pub ls/ps/1 (best_effort)"), "{text}");
}

#[test]
fn demo_runs_and_exits_zero() {
    let env = Env::new("demo");
    let out = env.cmd(&["demo", "--duration", "3"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in [
        "demo/sr/ps/1/current",
        "demo/sr/bpm/1/positions",
        "demo/sr/cam/1/image",
    ] {
        assert!(text.contains(key), "{key} missing from the table:\n{text}");
    }
    assert!(
        text.contains("f64[1024]") && text.contains("u8[1048576]"),
        "{text}"
    );
    // It stopped its children: no device server remains in the domain
    // (the last node to leave removes the domain directory).
    let files = std::fs::read_dir(env.dir.path().join(&env.domain)).map_or(0, |d| d.count());
    assert_eq!(files, 0);
}

/// `milonga --security on demo`: the device servers run with the demo's
/// security (they ran with the default, off on loopback, and the demo's
/// node, refusing plain peers, received nothing: exit 1).
#[test]
fn demo_with_security_on_passes_it_to_its_devices() {
    let env = Env::new("demo-sec");
    let xdg = env.dir.path().join("xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    let out = env
        .cmd(&["--security", "on", "demo", "--duration", "3"])
        .env("XDG_CONFIG_HOME", &xdg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("demo/sr/cam/1/image"), "{text}");
}

#[test]
fn bad_cli_input_gets_a_clear_error() {
    let env = Env::new("badcli");
    let out = env
        .cmd(&["pub", "a/*/b", "1", "--count", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wildcard"), "{err}");
    let out = env
        .cmd(&["pub", "a/b", "{not json", "--count", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not JSON"));
    let out = env.cmd(&["sub", "a//b", "--count", "1"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty chunk"));
    // A broker locator where no broker listens.
    let port = milonga_testkit::free_port();
    let out = env
        .cmd(&["--locator", &format!("milonga://127.0.0.1:{port}/x"), "ls"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no broker answered"));
    // Numbers no Duration holds (each panicked once: NaN, infinity, a
    // negative number, 1e19 s past what an Instant can be moved by) and a
    // split that would make a file at every turn are refused by the
    // argument parser, before any node or file is made.
    let rec = env.dir.path().join("never.mcap");
    let rec = rec.to_str().unwrap();
    for args in [
        &["ls", "--wait=-1"][..],
        &["sub", "a/b", "--timeout", "inf"],
        &["sub", "a/b", "--sleep-ms", "nan", "--count", "1"],
        &["pub", "a/b", "1", "--rate", "1e-300"],
        &[
            "pub",
            "a/b",
            "1",
            "--wait-subscribers",
            "1",
            "--wait-timeout",
            "1e20",
        ],
        &["call", "a/b", "1", "--timeout", "1e19"],
        &["record", "a/**", "-o", rec, "--duration", "1e19"],
        &["record", "a/**", "-o", rec, "--split-every", "0"],
        &["record", "a/**", "-o", rec, "--max-bytes", "100"],
        &["record", "a/**", "-o", rec, "--deadline-ms", "1e300"],
        // Over a year: the library refuses it, after the file was made.
        &["record", "a/**", "-o", rec, "--deadline-ms", "1e11"],
        &["sub", "a/b", "--deadline-ms", "1e11"],
        &["serve", "a/b", "--echo", "--delay-ms=-1"],
        &["bench", "pubsub", "--sizes", "0"],
        &["bench", "scale", "--rate=-1"],
        &["bench", "registry", "--rest", "nan"],
        &["sub", "a/b", "--keep-last", "0"],
        &["sub", "a/b", "--keep-all", "0"],
        &["replay", rec, "--wait-timeout", "1e20"],
        &["replay", rec, "--speed", "fast"],
        &["replay", rec, "--speed", "0"],
        &["replay", rec, "--to", "2610-07-01T00:00:00Z"],
        &["demo", "--duration=-5"],
        // Broker options out of their documented ranges (each started,
        // the value quietly raised or lowered).
        &["broker", "--max-domains", "30"],
        &["broker", "--max-domains", "0"],
        &["broker", "--lease-ms", "0"],
        &["broker", "--attach-interval-ms", "0"],
        &["broker", "--hold-mib", "0"],
        &["broker", "--stall-ms", "999999999999"],
    ] {
        let out = env.cmd(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("invalid value"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // What the ranges alone cannot refuse; an ACL a broker would not apply
    // (it started without a word, every trusted key allowed); a recovery
    // that would drop what else it was told.
    let acl = env.dir.path().join("rules.acl");
    std::fs::write(&acl, "allow * publish a/**\n").unwrap();
    for (args, says) in [
        (
            &["broker", "--lease-ms", "300", "--attach-interval-ms", "250"][..],
            "twice --attach-interval-ms",
        ),
        (
            &["broker", "--domain-idle-ms", "100"],
            "less than --lease-ms",
        ),
        (
            &["broker", "--acl", acl.to_str().unwrap()],
            "no access-control rules",
        ),
        (
            &["record", "--recover", rec, "a/**", "-o", rec],
            "cannot be used with",
        ),
        (
            &["record", "--recover", rec, "--duration", "1", "-o", rec],
            "cannot be used with",
        ),
        // 2^64 bytes asked for: a capacity overflow, before.
        (
            &["pub", "a/b", "--bytes", "18446744073709551615"],
            "more than max_message_bytes",
        ),
        // A node's option a broker quietly ignored.
        (&["--node-name", "x", "broker"], "--node-name"),
    ] {
        let out = env.cmd(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(
        !std::path::Path::new(rec).exists(),
        "a refused record made {rec}"
    );
}

/// A short run of each benchmark: the exact CSV columns, a row per system
/// and cell, real figures, nothing lost in reliable mode.
#[test]
fn bench_prints_the_documented_csv() {
    let env = Env::new("bench");
    let run = |args: &[&str]| -> Vec<Vec<String>> {
        let out = env.cmd(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(',').map(str::to_owned).collect())
            .collect()
    };
    let pubsub = |sizes: &str, subs: &str| {
        run(&[
            "bench",
            "pubsub",
            "--transport",
            "ipc",
            "--sizes",
            sizes,
            "--subs",
            subs,
            "--duration",
            "0.3",
            "--format",
            "csv",
        ])
    };
    let rows = pubsub("92", "1,2");
    assert_eq!(
        rows[0].join(","),
        "system,transport,payload_bytes,subscribers,events_per_s_per_sub,mb_per_s_per_sub,lost,sent,received,path"
    );
    // A row per system and cell, the systems' order turning each cell.
    let cells: Vec<(&str, &str)> = rows[1..]
        .iter()
        .map(|r| (r[0].as_str(), r[3].as_str()))
        .collect();
    assert_eq!(
        cells,
        [
            ("milonga", "1"),
            ("raw-zmq", "1"),
            ("raw-zmq", "2"),
            ("milonga", "2")
        ]
    );
    for r in &rows[1..] {
        assert_eq!(&r[1..3], ["ipc", "92"]);
        assert!(r[4].parse::<f64>().unwrap() > 0.0, "{r:?}");
        assert_eq!(r[6], "0", "reliable mode lost samples: {r:?}");
        let subs: u64 = r[3].parse().unwrap();
        let (sent, received): (u64, u64) = (r[7].parse().unwrap(), r[8].parse().unwrap());
        assert!(sent > 0 && received == subs * sent, "{r:?}");
        assert_eq!(r[9], "socket", "92 B goes through the socket: {r:?}");
    }
    // 64 KiB: Milonga's samples through shared memory, and the column
    // says so (the raw ones and those with shared memory off: socket; a
    // put that finds the ring full goes through the socket: `mixed`).
    let rows = pubsub("65536", "1");
    let paths: Vec<(&str, &str)> = rows[1..]
        .iter()
        .map(|r| (r[0].as_str(), r[9].as_str()))
        .collect();
    let shm = |p: &str| matches!(p, "shm" | "mixed");
    assert!(
        matches!(
            paths[..],
            [
                ("milonga", a),
                ("mlg-loan", b),
                ("mlg-sock", "socket"),
                ("raw-zmq", "socket")
            ] if shm(a) && shm(b)
        ),
        "{paths:?}"
    );
    let rows = run(&[
        "bench",
        "latency",
        "--transport",
        "ipc",
        "--sizes",
        "92",
        "--round-trips",
        "200",
        "--format",
        "csv",
    ]);
    assert_eq!(
        rows[0].join(","),
        "system,transport,payload_bytes,latency_p50_us,latency_p99_us,round_trips"
    );
    assert_eq!(rows.len(), 3, "{rows:?}");
    for r in &rows[1..] {
        let (p50, p99): (f64, f64) = (r[3].parse().unwrap(), r[4].parse().unwrap());
        assert!(p50 > 0.0 && p99 >= p50, "{r:?}");
        assert_eq!(r[5], "200", "{r:?}");
    }
    // bench record: a table, a row per mode, every rate a real figure.
    let out = env
        .cmd(&[
            "bench", "record", "--sizes", "92", "--bytes", "100000", "--runs", "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let modes: Vec<(String, f64)> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim_start().starts_with("size"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].to_owned(), f[2].parse().unwrap())
        })
        .collect();
    let names: Vec<&str> = modes.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(
        names,
        ["sub", "none", "lz4", "zstd", "disk", "replay", "writer"]
    );
    assert!(modes.iter().all(|m| m.1 > 0.0), "{text}");
    // bench encoding: the issue's columns, a row per format and
    // compression, each track back as it went (the bench checks), the
    // reference cell's omega 1.
    let rows = run(&[
        "bench",
        "encoding",
        "--round-trips",
        "20",
        "--calls",
        "5",
        "--format",
        "csv",
    ]);
    assert_eq!(
        rows[0].join(","),
        "format,compression,payload_bytes,wire_bytes,eta,chi,encode_ns,decode_ns,path,rate_per_s,rtt_p50_us,rtt_p99_us,omega,lost"
    );
    let cells: Vec<String> = rows[1..]
        .iter()
        .map(|r| format!("{}/{}", r[0], r[1]))
        .collect();
    assert_eq!(cells.len(), 16, "{cells:?}");
    assert_eq!(cells[12], "schema/none");
    assert_eq!(cells[0], "cdr/none");
    assert_eq!(rows[1][12], "1.000");
    for r in &rows[1..] {
        let eta: f64 = r[4].parse().unwrap();
        let p50: f64 = r[10].parse().unwrap();
        assert!(eta > 0.0 && p50 > 0.0 && r[8] == "loopback", "{r:?}");
    }
    let out = env
        .cmd(&["bench", "encoding", "--paths", "Z"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected loopback, A, B, C, D or E"));
    let rows = run(&["bench", "discovery", "--nodes", "5", "--format", "csv"]);
    assert_eq!(rows[0].join(","), "case,nodes,p50_ms,max_ms,note");
    let cases: Vec<&str> = rows[1..].iter().map(|r| r[0].as_str()).collect();
    assert_eq!(cases, ["start", "join", "leave", "join", "crash", "churn"]);
    for r in &rows[1..] {
        let (p50, max): (f64, f64) = (r[2].parse().unwrap(), r[3].parse().unwrap());
        assert!(p50 > 0.0 && max >= p50, "{r:?}");
    }
}

/// The next status line with `"event": event`, skipping samples and other
/// events; it must come within `T` (samples may keep coming meanwhile).
fn event_line(p: &Proc, event: &str) -> Json {
    let end = Instant::now() + T;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let line = p
            .line(left)
            .unwrap_or_else(|| panic!("no {event:?} event within {T:?}"));
        let j = parse(&line);
        if j["event"] == event {
            return j;
        }
    }
}

/// Liveliness as a subscriber sees it: alive, killed (-9), restarted (a new
/// node, not a gap), frozen (SIGSTOP: the lease runs out), thawed, closed.
#[test]
fn publisher_liveliness_is_reported_with_its_reason() {
    let env = Env::new("live");
    // A short lease, so that the frozen case takes a second, not three.
    let short = |args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("MILONGA_HEARTBEAT_INTERVAL_MS", "100")
            .env("MILONGA_HEARTBEAT_TIMEOUT_MS", "500");
        Proc::spawn(c)
    };
    let sub = short(&["sub", "lv/**", "--json"]);
    let mut p1 = short(&["pub", "lv/x", "1", "--rate", "50"]);
    let alive = event_line(&sub, "publisher_alive");
    let first = alive["publisher"].as_str().unwrap().to_owned();
    assert!(
        alive["name"].as_str().unwrap().starts_with("pub@"),
        "{alive}"
    );
    assert_eq!(sample_line(&sub)["publisher"], first.as_str());

    p1.kill9();
    let lost = event_line(&sub, "publisher_lost");
    assert_eq!(lost["publisher"], first.as_str());
    assert_eq!(lost["reason"], "disconnected");

    // A restart is a new node: alive again, sequence numbers of its own.
    let mut p2 = short(&["pub", "lv/x", "2", "--rate", "50"]);
    let alive = event_line(&sub, "publisher_alive");
    let second = alive["publisher"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    let s = sample_line(&sub);
    assert_eq!(
        (s["publisher"].as_str(), s["value"].as_u64()),
        (Some(second.as_str()), Some(2))
    );

    p2.signal(libc::SIGSTOP);
    let lost = event_line(&sub, "publisher_lost");
    assert_eq!(
        (lost["publisher"].as_str(), lost["reason"].as_str()),
        (Some(second.as_str()), Some("lease_expired"))
    );
    p2.signal(libc::SIGCONT);
    let alive = event_line(&sub, "publisher_alive");
    assert_eq!(alive["publisher"], second.as_str(), "the same node, thawed");

    p2.signal(libc::SIGINT);
    let lost = event_line(&sub, "publisher_lost");
    assert_eq!(
        (lost["publisher"].as_str(), lost["reason"].as_str()),
        (Some(second.as_str()), Some("closed"))
    );
    assert!(p2.wait_exit(T).unwrap().success());
    // Nothing was counted lost: a restart is not a gap.
    let mut sub = sub;
    sub.signal(libc::SIGINT);
    assert_eq!(event_line(&sub, "summary")["lost"], 0);
    let _ = sub.wait_exit(T);
}

/// A publisher that keeps history and is restarted: a reliable subscriber
/// misses none of the samples the new process put, even those put before
/// its subscription reached it.
#[test]
fn a_restarted_publisher_with_history_loses_nothing() {
    let env = Env::new("restart");
    let sub = env.spawn(&["sub", "rs/**", "--json", "--reliable"]);
    let args = [
        "pub",
        "rs/x",
        "1",
        "--rate",
        "200",
        "--reliable",
        "--history",
        "1000",
    ];
    let mut p1 = env.spawn(&args);
    let first = event_line(&sub, "publisher_alive")["publisher"]
        .as_str()
        .unwrap()
        .to_owned();
    sample_line(&sub);
    p1.kill9();
    assert_eq!(
        event_line(&sub, "publisher_lost")["publisher"],
        first.as_str()
    );
    let _p2 = env.spawn(&args);
    let second = event_line(&sub, "publisher_alive")["publisher"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(second, first);
    let mut expect = 1;
    while expect <= 50 {
        let j = json_line(&sub);
        assert_ne!(j["event"], "lost", "{j}");
        if j.get("event").is_none() && j["publisher"] == second.as_str() {
            assert_eq!(j["seq"], expect, "from its first sample on, none missed");
            expect += 1;
        }
    }
}

/// Best effort: a subscriber frozen with SIGSTOP slows neither the
/// publisher nor the other subscribers, which receive everything; the
/// frozen one is told what it lost once it runs again.
#[test]
fn a_stopped_subscriber_slows_neither_the_publisher_nor_the_others() {
    let env = Env::new("stopped");
    let mut cfg = env.config("fast-pub");
    cfg.transport = milonga::Transport::Ipc;
    cfg.send_hwm = 20;
    let node = Node::open_with(cfg).unwrap();
    let p = node.publisher("st/x").unwrap();
    // The running ones read with a pump (`--keep-all`), so that the test's
    // own load (JSON printing, parallel tests) cannot make them the slow
    // ones; the frozen one reads nothing at all.
    let subs = [
        env.spawn(&["sub", "st/x", "--json"]),
        env.spawn(&["sub", "st/x", "--json", "--keep-all", "100000"]),
        env.spawn(&["sub", "st/x", "--json", "--keep-all", "100000"]),
    ];
    wait_for("three subscribers", T, || p.subscriber_count() == 3);
    subs[0].signal(libc::SIGSTOP);
    // 10 MB in all, more than the frozen subscriber's queues (20 + 1000
    // messages) and socket buffers hold; about 1,000 samples a second, so
    // that a running subscriber descheduled for a second by the other tests
    // still keeps up.
    let n = 2000u64;
    let payload = milonga::Value::Bytes(milonga::Bytes::from(vec![7u8; 5000]));
    for _ in 0..n {
        p.put(payload.clone()).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    for s in &subs[1..] {
        let mut next = 1u64;
        while next <= n {
            let j = json_line(s);
            assert_ne!(j["event"], "lost", "a running subscriber lost nothing: {j}");
            if j.get("event").is_none() {
                assert_eq!(j["seq"], next);
                next += 1;
            }
        }
    }
    subs[0].signal(libc::SIGCONT);
    // One more sample reveals the frozen subscriber's gap, once its queues
    // have room again: put one now, and another each time it has printed
    // nothing for 200 ms (it has read its backlog), until it reports the
    // loss.
    p.put(payload.clone()).unwrap();
    let hang_guard = Instant::now() + T * 3;
    let lost = loop {
        assert!(
            Instant::now() < hang_guard,
            "hang guard: the thawed subscriber never reported its loss"
        );
        let Some(line) = subs[0].line(Duration::from_millis(200)) else {
            p.put(payload.clone()).unwrap();
            continue;
        };
        let j = parse(&line);
        if j["event"] == "lost" {
            break j;
        }
    };
    assert!(lost["count"].as_u64().unwrap() > 0, "{lost}");
}

/// `milonga sub --filter`, `--min-period-ms`: the publisher sends only what
/// passes; a filter that does not parse is a clear error.
#[test]
fn sub_filters_are_applied_by_the_publisher() {
    let env = Env::new("cfilter");
    let high = env.spawn(&[
        "sub",
        "cf/x",
        "--json",
        "--filter",
        "value.v >= 3 && value.ok",
    ]);
    let slow = env.spawn(&["sub", "cf/x", "--json", "--min-period-ms", "300"]);
    let node = Node::open_with(env.config("cf-pub")).unwrap();
    let p = node.publisher("cf/x").unwrap();
    wait_for("two filtered subscribers", T, || {
        p.subscriber_count() == 2 && node.stats().filters_declared == 2
    });
    // A sample every 10 ms, numbered, until the filtered subscriber has 10
    // and the one with a minimum period has 4. When each put started and
    // ended: the publisher times the period somewhere in between.
    let mut puts: Vec<(Instant, Instant)> = Vec::new();
    let mut high_seen = 0;
    let mut slow_seen: Vec<usize> = Vec::new();
    let hang_guard = Instant::now() + T * 3;
    while high_seen < 10 || slow_seen.len() < 4 {
        assert!(
            Instant::now() < hang_guard,
            "hang guard: {} puts, {high_seen} samples through the filter, {slow_seen:?} through the minimum period",
            puts.len()
        );
        let i = puts.len() as u64;
        let v = milonga::Value::Map(vec![
            ("i".into(), i.into()),
            ("v".into(), (i % 5).into()),
            ("ok".into(), milonga::Value::Bool(i % 2 == 0)),
        ]);
        let start = Instant::now();
        p.put(v).unwrap();
        puts.push((start, Instant::now()));
        std::thread::sleep(Duration::from_millis(10));
        // i % 5 >= 3 and i even: i = 4, 8, 14, 18, ...
        while let Some(line) = high.line(Duration::ZERO) {
            let s = parse(&line);
            if s.get("event").is_none() {
                let v = &s["value"];
                assert!(v["v"].as_u64().unwrap() >= 3 && v["ok"] == true, "{s}");
                high_seen += 1;
            }
        }
        while let Some(line) = slow.line(Duration::ZERO) {
            let s = parse(&line);
            if s.get("event").is_none() {
                slow_seen.push(s["value"]["i"].as_u64().unwrap() as usize);
            }
        }
    }
    // One per 300 ms, and no fewer: of two samples that passed one after
    // the other, the later put ended at least 300 ms after the earlier one
    // started, and every put between them started less than 300 ms after
    // the earlier one ended (or it would have passed).
    let period = Duration::from_millis(300);
    for w in slow_seen.windows(2) {
        let (a, b) = (w[0], w[1]);
        assert!(
            puts[b].1.saturating_duration_since(puts[a].0) >= period,
            "samples {a} and {b} both passed, less than 300 ms apart: {slow_seen:?}"
        );
        for k in a + 1..b {
            assert!(
                puts[k].0 < puts[a].1 + period,
                "sample {k}, put 300 ms after sample {a}, did not pass: {slow_seen:?}"
            );
        }
    }
    let out = env
        .cmd(&["sub", "cf/x", "--filter", "value >", "--timeout", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at byte 7"), "{err}");
}

/// A reliable `pub` held up by a subscriber that does not read waited for
/// room for ever: Ctrl-C and SIGTERM did nothing (its handler only set a
/// flag). Its put now waits in slices, and a stop ends it. The
/// subscriber, alive (its heartbeats keep the connection) but asleep
/// after its first sample (`--sleep-ms`, ten minutes), stops on SIGTERM
/// at once too (its sleep was one that nothing cut short).
#[test]
fn a_reliable_pub_held_up_by_a_sleeping_subscriber_stops_on_sigint() {
    let env = Env::new("stuck");
    let mut sub = Proc::spawn(env.cmd(&["sub", "st/x", "--reliable", "--sleep-ms", "600000"]));
    let mut publisher = Proc::spawn(env.cmd(&[
        "pub",
        "st/x",
        "--bytes",
        "4096",
        "--reliable",
        "--rate",
        "1000000",
        "--wait-subscribers",
        "1",
    ]));
    assert!(sub.line(T).is_some(), "the subscriber receives");
    // Four seconds at a million puts a second fill every queue and buffer
    // between them, past the lease (a fixed span: the publisher is then
    // stuck in a put, its subscriber alive).
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        publisher.wait_exit(Duration::ZERO).is_none(),
        "still running"
    );
    publisher.signal(libc::SIGINT);
    let status = publisher
        .wait_exit(Duration::from_secs(10))
        .expect("the stuck publisher stops on SIGINT");
    assert!(status.success(), "{status:?}");
    sub.signal(libc::SIGTERM);
    let status = sub
        .wait_exit(Duration::from_secs(10))
        .expect("the sleeping subscriber stops on SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// SIGHUP (the terminal or the ssh session closed) stops a command
/// cleanly, exit 0, as SIGINT does (a recorder left its file unfinished);
/// under `nohup` (SIGHUP ignored) it goes on, as `nohup milonga broker &`
/// must.
#[test]
fn sighup_stops_a_command_cleanly_unless_nohup_ignores_it() {
    use std::os::unix::process::CommandExt;
    let env = Env::new("hup");
    let watcher = env.node("watcher");
    let sub = watcher.subscribe("hup/**").unwrap();
    // Samples of the publisher seen, counted from now: it is in its loop
    // (its handler set), or still alive.
    let samples_after = |n: usize| {
        let mut seen = 0;
        let end = Instant::now() + Duration::from_secs(30);
        while seen < n && Instant::now() < end {
            if let Ok(milonga::Event::Sample(_)) = sub.recv_timeout(Duration::from_millis(100)) {
                seen += 1;
            }
        }
        seen >= n
    };
    let mut plain = Proc::spawn(env.cmd(&["pub", "hup/a", "1", "--rate", "20"]));
    assert!(samples_after(2), "the publisher publishes");
    plain.signal(libc::SIGHUP);
    let status = plain.wait_exit(Duration::from_secs(10)).expect("it stops");
    assert!(status.success(), "{status:?}");
    let mut cmd = env.cmd(&["pub", "hup/b", "1", "--rate", "20"]);
    // SAFETY: signal() is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut nohup = Proc::spawn(cmd);
    assert!(samples_after(2), "the nohup publisher publishes");
    nohup.signal(libc::SIGHUP);
    assert!(samples_after(5), "it goes on after SIGHUP");
    assert!(nohup.wait_exit(Duration::ZERO).is_none());
    nohup.signal(libc::SIGTERM);
    let status = nohup.wait_exit(Duration::from_secs(10)).expect("it stops");
    assert!(status.success(), "{status:?}");
}
