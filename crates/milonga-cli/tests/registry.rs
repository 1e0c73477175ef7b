//! Registry mode (docs/discovery.md "A registry"), with a real broker
//! process: peer-to-peer nodes of different "hosts" (a runtime directory
//! each, no local discovery) find each other through the broker's
//! registry, and their data flows directly, not through it: a killed
//! registry stops no data, and one started again is filled again.

use std::path::Path;
use std::time::{Duration, Instant};

use milonga::{Config, Event, Node, Transport};
use milonga_testkit::{free_port, wait_for, Proc, TempDir};
use serde_json::Value as Json;

mod common;
use common::Env;

const T: Duration = Duration::from_secs(30);

/// `milonga broker --json` on `listen`, its own runtime directory `dir`.
fn registry(env: &Env, dir: &Path, listen: &str) -> Proc {
    let mut cmd = env.cmd(&[
        "broker",
        "--listen",
        listen,
        "--json",
        "--domain",
        &env.domain,
        "--lease-ms",
        "1000",
    ]);
    cmd.env("MILONGA_RUNTIME_DIR", dir);
    let proc = Proc::spawn(cmd);
    let line = proc.line(T).expect("the broker says where it listens");
    let v: Json = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(v["event"], "listening", "{v}");
    proc
}

/// Its next stats line's counters.
fn next_stats(b: &Proc) -> Json {
    loop {
        let line = b.line(T).expect("a stats line");
        let v: Json = serde_json::from_str(&line).unwrap();
        if v["event"] == "stats" {
            return v["stats"].clone();
        }
    }
}

/// A peer-to-peer node alone on its "host" (`dir`), over tcp, whose only
/// discovery is the registry at `listen`.
fn config(env: &Env, dir: &Path, name: &str, listen: &str) -> Config {
    let mut c = Config::new(&env.locator(), name);
    c.runtime_dir = Some(dir.to_path_buf());
    c.local_discovery = false;
    c.transport = Transport::Tcp;
    c.registry = vec![listen.to_owned()];
    c
}

fn knows(node: &Node, id: &str) -> bool {
    node.peers().iter().any(|a| a.node_id == id)
}

#[test]
fn nodes_find_each_other_through_the_registry_and_data_flows_directly_even_when_it_dies() {
    let env = Env::new("registry");
    let hosts: Vec<TempDir> = (0..4)
        .map(|i| TempDir::new(&format!("registry-h{i}")))
        .collect();
    let listen = format!("tcp://127.0.0.1:{}", free_port());
    let mut broker = registry(&env, hosts[0].path(), &listen);
    let a = Node::open_with(config(&env, hosts[1].path(), "a", &listen)).unwrap();
    let p = a.publisher("reg/a").unwrap();
    // Opened after a: its view holds a when open returns (its first page
    // is awaited, as a peer-to-peer node reads its directory).
    let b = Node::open_with(config(&env, hosts[2].path(), "b", &listen)).unwrap();
    assert!(knows(&b, &a.id().to_hex()), "b knows a when open returns");
    let sub = b.subscribe("reg/a").unwrap();
    wait_for("a knows b", T, || knows(&a, &b.id().to_hex()));
    let next = |sub: &milonga::Subscriber| {
        let end = Instant::now() + T;
        loop {
            p.put(1.0).unwrap();
            if let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(50)) {
                return s;
            }
            assert!(Instant::now() < end, "no sample");
        }
    };
    next(&sub);
    // The samples went directly: the broker forwarded none; it holds the
    // two nodes.
    let end = Instant::now() + T;
    let s = loop {
        let s = next_stats(&broker);
        if s["registered"] == 2 {
            break s;
        }
        assert!(Instant::now() < end, "{s}");
    };
    assert_eq!(s["frames_forwarded"], 0, "{s}");

    // A node that closes is gone from the others' views at once
    // (unregistered); one killed with -9 after the registry's lease.
    let c = Node::open_with(config(&env, hosts[3].path(), "c", &listen)).unwrap();
    let c_id = c.id().to_hex();
    wait_for("a knows c", T, || knows(&a, &c_id));
    let closed = Instant::now();
    c.close();
    wait_for("c gone from a's view", T, || !knows(&a, &c_id));
    assert!(
        closed.elapsed() < Duration::from_secs(1),
        "{:?}",
        closed.elapsed()
    );
    // A CLI node takes the registry from the environment.
    let mut killed = {
        let mut cmd = env.cmd(&["pub", "reg/killed", "1", "--rate", "10"]);
        cmd.env("MILONGA_RUNTIME_DIR", hosts[3].path())
            .env("MILONGA_LOCAL_DISCOVERY", "0")
            .env("MILONGA_TRANSPORT", "tcp")
            .env("MILONGA_REGISTRY", &listen);
        Proc::spawn(cmd)
    };
    let published = |n: &Node| {
        n.peers()
            .iter()
            .any(|x| x.publications.iter().any(|p| p.key == "reg/killed"))
    };
    wait_for("a knows the CLI publisher", T, || published(&a));
    killed.kill9();
    let at = Instant::now();
    wait_for("the killed node gone from a's view", T, || !published(&a));
    // The lease is 1 s; removals are checked every 100 ms.
    assert!(at.elapsed() < Duration::from_secs(3), "{:?}", at.elapsed());

    // The registry dies: data still flows, views stay.
    broker.kill9();
    for _ in 0..5 {
        next(&sub);
    }
    assert!(knows(&b, &a.id().to_hex()) && knows(&a, &b.id().to_hex()));
    // Started again (another epoch), it is filled again by the renewals,
    // and a newcomer finds the nodes registered before.
    let broker = registry(&env, hosts[0].path(), &listen);
    // While the nodes renew into the new table, none vanishes from a view
    // (a reset holding only the nodes renewed so far must not replace it).
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(3) {
        assert!(
            knows(&b, &a.id().to_hex()) && knows(&a, &b.id().to_hex()),
            "a view lost a node {:?} after the registry started again",
            watch.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = Node::open_with(config(&env, hosts[3].path(), "d", &listen)).unwrap();
    wait_for("d knows a and b", T, || {
        knows(&d, &a.id().to_hex()) && knows(&d, &b.id().to_hex())
    });
    wait_for("a knows d", T, || knows(&a, &d.id().to_hex()));
    // (Its stats lines since it started are read in turn.)
    let end = Instant::now() + T;
    while next_stats(&broker)["registered"] != 3 {
        assert!(Instant::now() < end, "the three nodes registered again");
    }
}

/// A real etcd (Debian's `etcd-server`, installed by `make setup`) on two
/// free loopback ports, its data in `dir`; killed when dropped.
struct Etcd {
    proc: Proc,
    url: String,
}

impl Etcd {
    /// On two free ports: a port found free may be taken by another test
    /// before etcd binds it, and etcd then exits; it is tried again.
    fn start_anywhere(dir: &Path) -> (Etcd, u16, u16) {
        for _ in 0..5 {
            let (client, peer) = (free_port(), free_port());
            if let Some(e) = Etcd::try_start(dir, client, peer) {
                return (e, client, peer);
            }
        }
        panic!("etcd did not start on 5 pairs of free ports");
    }

    /// On `client` and `peer`, which must be free.
    fn start(dir: &Path, client: u16, peer: u16) -> Etcd {
        Etcd::try_start(dir, client, peer).expect("etcd starts on its ports again")
    }

    /// etcd on `client` and `peer`, once it answers; `None` if it exited.
    fn try_start(dir: &Path, client: u16, peer: u16) -> Option<Etcd> {
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = std::process::Command::new("etcd");
        cmd.args([
            "--data-dir",
            // Its own per client port: an attempt that failed leaves
            // nothing for the next (a restart finds its data again).
            &dir.join(format!("etcd-{client}")).display().to_string(),
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("default={peer_url}"),
        ]);
        let mut proc = Proc::spawn(cmd);
        // Ready when it answers a range (its port opens before it has
        // elected itself leader).
        let mut exited = false;
        wait_for("etcd answers", T, || {
            if proc.wait_exit(Duration::ZERO).is_some() {
                exited = true;
                return true;
            }
            use std::io::{Read, Write};
            let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", client)) else {
                return false;
            };
            let body = r#"{"key":"AA=="}"#;
            let req = format!(
                "POST /v3/kv/range HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut answer = String::new();
            s.write_all(req.as_bytes()).is_ok()
                && s.read_to_string(&mut answer).is_ok()
                && answer.starts_with("HTTP/1.0 200")
        });
        (!exited).then_some(Etcd { proc, url })
    }
}

#[test]
fn with_discovery_etcd_nodes_find_each_other_and_a_lease_is_a_node_s_liveness() {
    let env = Env::new("etcd");
    let hosts: Vec<TempDir> = (0..4)
        .map(|i| TempDir::new(&format!("etcd-h{i}")))
        .collect();
    let (mut etcd, client, peer) = Etcd::start_anywhere(hosts[0].path());
    let config = |dir: &Path, name: &str| {
        let mut c = Config::new(&env.locator(), name);
        c.runtime_dir = Some(dir.to_path_buf());
        c.local_discovery = false;
        c.transport = Transport::Tcp;
        c.discovery = "etcd".into();
        c.etcd_endpoints = vec![etcd.url.clone()];
        c
    };
    let a = Node::open_with(config(hosts[1].path(), "a")).unwrap();
    let p = a.publisher("etcd/a").unwrap();
    let b = Node::open_with(config(hosts[2].path(), "b")).unwrap();
    let (a_id, b_id) = (a.id().to_hex(), b.id().to_hex());
    assert!(knows(&b, &a_id), "b knows a when open returns");
    wait_for("a knows b", T, || knows(&a, &b_id));
    let sub = b.subscribe("etcd/a").unwrap();
    let next = || {
        let end = Instant::now() + T;
        loop {
            p.put(1.0).unwrap();
            if let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(50)) {
                return s;
            }
            assert!(Instant::now() < end, "no sample");
        }
    };
    next();
    // A node that closes revokes its lease: gone at once.
    let c = Node::open_with(config(hosts[3].path(), "c")).unwrap();
    let c_id = c.id().to_hex();
    wait_for("a knows c", T, || knows(&a, &c_id));
    let closed = Instant::now();
    c.close();
    wait_for("c gone", T, || !knows(&a, &c_id));
    assert!(
        closed.elapsed() < Duration::from_secs(1),
        "{:?}",
        closed.elapsed()
    );
    // One killed with -9: gone when its lease ends (3 s: the default
    // heartbeat_timeout_ms).
    let mut killed = {
        let mut cmd = env.cmd(&["pub", "etcd/killed", "1", "--rate", "10"]);
        cmd.env("MILONGA_RUNTIME_DIR", hosts[3].path())
            .env("MILONGA_LOCAL_DISCOVERY", "0")
            .env("MILONGA_TRANSPORT", "tcp")
            .env("MILONGA_DISCOVERY", "etcd")
            .env("MILONGA_ETCD_ENDPOINTS", &etcd.url);
        Proc::spawn(cmd)
    };
    let published = |n: &Node| {
        n.peers()
            .iter()
            .any(|x| x.publications.iter().any(|p| p.key == "etcd/killed"))
    };
    wait_for("a knows the CLI publisher", T, || published(&a));
    killed.kill9();
    let at = Instant::now();
    wait_for("the killed node gone", T, || !published(&a));
    assert!(at.elapsed() < Duration::from_secs(5), "{:?}", at.elapsed());
    // etcd dies: data still flows and views stay; started again on its
    // data, a newcomer finds the nodes there.
    etcd.proc.kill9();
    for _ in 0..5 {
        next();
    }
    assert!(knows(&b, &a_id) && knows(&a, &b_id));
    let _etcd = Etcd::start(hosts[0].path(), client, peer);
    let d = Node::open_with(config(hosts[3].path(), "d")).unwrap();
    wait_for("d knows a and b", T, || {
        knows(&d, &a_id) && knows(&d, &b_id)
    });
    wait_for("a knows d", T, || knows(&a, &d.id().to_hex()));
}
