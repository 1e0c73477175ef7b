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
    let s = next_stats(&broker);
    assert_eq!(s["frames_forwarded"], 0, "{s}");
    assert_eq!(s["registered"], 2, "{s}");

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
    let d = Node::open_with(config(&env, hosts[3].path(), "d", &listen)).unwrap();
    wait_for("d knows a and b", T, || {
        knows(&d, &a.id().to_hex()) && knows(&d, &b.id().to_hex())
    });
    wait_for("a knows d", T, || knows(&a, &d.id().to_hex()));
    assert_eq!(next_stats(&broker)["registered"], 3);
}
