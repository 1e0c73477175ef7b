//! Registry mode (docs/discovery.md "A registry" and "etcd"), with a real
//! broker process and a real etcd: peer-to-peer nodes of different
//! "hosts" (a runtime directory each, no local discovery) find each other
//! through the registry, and their data flows directly, not through it: a
//! killed registry stops no data, and one started again is filled again.

use std::path::Path;
use std::time::{Duration, Instant};

use milonga::{Config, Event, Node, Publisher, Sample, Subscriber, Transport};
use milonga_testkit::etcd::Etcd;
use milonga_testkit::{free_port, wait_for, Proc, TempDir};
use serde_json::Value as Json;

mod common;
use common::Env;

const T: Duration = Duration::from_secs(30);

/// What the nodes of a test find each other through.
enum Via {
    /// A broker's registry at this listen endpoint.
    Registry(String),
    /// etcd at this client URL.
    Etcd(String),
}

impl Via {
    /// The `MILONGA_*` settings of a node alone on its "host" `dir`, over
    /// tcp, whose only discovery is this.
    fn vars(&self, dir: &Path) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("MILONGA_RUNTIME_DIR", dir.display().to_string()),
            ("MILONGA_LOCAL_DISCOVERY", "0".into()),
            ("MILONGA_TRANSPORT", "tcp".into()),
        ];
        match self {
            Via::Registry(listen) => v.push(("MILONGA_REGISTRY", listen.clone())),
            Via::Etcd(url) => v.extend([
                ("MILONGA_DISCOVERY", "etcd".into()),
                ("MILONGA_ETCD_ENDPOINTS", url.clone()),
            ]),
        }
        v
    }

    /// The same node, opened in this process.
    fn node(&self, env: &Env, dir: &Path, name: &str) -> Node {
        let mut c = Config::new(&env.locator(), name);
        c.runtime_dir = Some(dir.to_path_buf());
        c.local_discovery = false;
        c.transport = Transport::Tcp;
        match self {
            Via::Registry(listen) => c.registry = vec![listen.clone()],
            Via::Etcd(url) => {
                c.discovery = "etcd".into();
                c.etcd_endpoints = vec![url.clone()];
            }
        }
        Node::open_with(c).unwrap()
    }
}

/// `milonga broker --json` on `listen` (lease 1 s), its own runtime
/// directory `dir`.
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

/// Reads the broker's stats lines (one a second, from its start, in turn)
/// until one holds `n` registered nodes; its counters.
fn until_registered(b: &Proc, n: u64) -> Json {
    let end = Instant::now() + T;
    loop {
        let line = b.line(T).expect("a stats line");
        let v: Json = serde_json::from_str(&line).unwrap();
        if v["event"] == "stats" && v["stats"]["registered"] == n {
            return v["stats"].clone();
        }
        assert!(Instant::now() < end, "{n} nodes registered: {v}");
    }
}

fn knows(node: &Node, id: &str) -> bool {
    node.peers().iter().any(|a| a.node_id == id)
}

fn know_each_other(a: &Node, b: &Node) -> bool {
    knows(a, &b.id().to_hex()) && knows(b, &a.id().to_hex())
}

/// Puts on `p` until `sub` has a sample.
fn next(p: &Publisher, sub: &Subscriber) -> Sample {
    let end = Instant::now() + T;
    loop {
        p.put(1.0).unwrap();
        if let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(50)) {
            return s;
        }
        assert!(Instant::now() < end, "no sample");
    }
}

/// `c`, once `a` knows it, closes: gone from `a`'s view within `bound`.
fn a_closed_node_leaves_within(a: &Node, c: Node, bound: Duration) {
    let id = c.id().to_hex();
    wait_for("a knows c", T, || knows(a, &id));
    let closed = Instant::now();
    c.close();
    wait_for("c gone from a's view", T, || !knows(a, &id));
    assert!(closed.elapsed() < bound, "{:?}", closed.elapsed());
}

/// A CLI publisher of `key` on "host" `dir` (its discovery from the
/// environment), once `a` knows it, killed with -9: gone from `a`'s view
/// within `bound`.
fn a_killed_node_leaves_within(
    env: &Env,
    via: &Via,
    dir: &Path,
    key: &str,
    a: &Node,
    bound: Duration,
) {
    let mut cmd = env.cmd(&["pub", key, "1", "--rate", "10"]);
    cmd.envs(via.vars(dir));
    let mut killed = Proc::spawn(cmd);
    let published = || {
        a.peers()
            .iter()
            .any(|x| x.publications.iter().any(|p| p.key == key))
    };
    wait_for("a knows the CLI publisher", T, published);
    killed.kill9();
    let at = Instant::now();
    wait_for("the killed node gone from a's view", T, || !published());
    assert!(at.elapsed() < bound, "{:?}", at.elapsed());
}

#[test]
fn nodes_find_each_other_through_the_registry_and_data_flows_directly_even_when_it_dies() {
    let env = Env::new("registry");
    let hosts: Vec<TempDir> = (0..4)
        .map(|i| TempDir::new(&format!("registry-h{i}")))
        .collect();
    let listen = format!("tcp://127.0.0.1:{}", free_port());
    let via = Via::Registry(listen.clone());
    let mut broker = registry(&env, hosts[0].path(), &listen);
    let a = via.node(&env, hosts[1].path(), "a");
    let p = a.publisher("reg/a").unwrap();
    // Opened after a: its view holds a when open returns (its first page
    // is awaited, as a peer-to-peer node reads its directory).
    let b = via.node(&env, hosts[2].path(), "b");
    assert!(knows(&b, &a.id().to_hex()), "b knows a when open returns");
    let sub = b.subscribe("reg/a").unwrap();
    wait_for("a knows b", T, || know_each_other(&a, &b));
    next(&p, &sub);
    // The samples went directly: the broker, which holds the two nodes,
    // forwarded none.
    let s = until_registered(&broker, 2);
    assert_eq!(s["frames_forwarded"], 0, "{s}");

    // A node that closes unregisters: gone within the pace (100 ms here);
    // one killed with -9 after the lease (1 s) and a check (every 100 ms).
    let c = via.node(&env, hosts[3].path(), "c");
    a_closed_node_leaves_within(&a, c, Duration::from_secs(1));
    a_killed_node_leaves_within(
        &env,
        &via,
        hosts[3].path(),
        "reg/killed",
        &a,
        Duration::from_secs(3),
    );

    // The registry dies: data still flows, views stay.
    broker.kill9();
    for _ in 0..5 {
        next(&p, &sub);
    }
    assert!(know_each_other(&a, &b));
    // Started again (another epoch), it is filled again by the renewals,
    // and a newcomer finds the nodes registered before.
    let broker = registry(&env, hosts[0].path(), &listen);
    // Meanwhile no view loses a node, not even for a moment (a reset
    // holding only the nodes renewed so far must not replace it): watched
    // every 20 ms for 3 s, three of the registry's leases, by which time
    // every node has renewed into the new table.
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_secs(3) {
        assert!(
            know_each_other(&a, &b),
            "a view lost a node {:?} after the registry started again",
            watch.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = via.node(&env, hosts[3].path(), "d");
    wait_for("d, a and b know each other", T, || {
        know_each_other(&d, &a) && know_each_other(&d, &b)
    });
    until_registered(&broker, 3);
}

#[test]
fn with_discovery_etcd_nodes_find_each_other_and_a_lease_is_a_node_s_liveness() {
    let env = Env::new("etcd");
    let hosts: Vec<TempDir> = (0..4)
        .map(|i| TempDir::new(&format!("etcd-h{i}")))
        .collect();
    let mut etcd = Etcd::start(hosts[0].path(), T).expect("etcd starts");
    let via = Via::Etcd(etcd.url.clone());
    let a = via.node(&env, hosts[1].path(), "a");
    let p = a.publisher("etcd/a").unwrap();
    let b = via.node(&env, hosts[2].path(), "b");
    assert!(knows(&b, &a.id().to_hex()), "b knows a when open returns");
    wait_for("a knows b", T, || know_each_other(&a, &b));
    let sub = b.subscribe("etcd/a").unwrap();
    next(&p, &sub);
    // A node that closes revokes its lease: gone at once; one killed with
    // -9 when its lease ends (3 s: the default heartbeat_timeout_ms).
    let c = via.node(&env, hosts[3].path(), "c");
    a_closed_node_leaves_within(&a, c, Duration::from_secs(1));
    a_killed_node_leaves_within(
        &env,
        &via,
        hosts[3].path(),
        "etcd/killed",
        &a,
        Duration::from_secs(5),
    );
    // etcd dies: data still flows and views stay; started again on its
    // data, a newcomer finds the nodes there.
    etcd.kill9();
    for _ in 0..5 {
        next(&p, &sub);
    }
    assert!(know_each_other(&a, &b));
    etcd.restart(T).expect("etcd starts again on its ports");
    let d = via.node(&env, hosts[3].path(), "d");
    wait_for("d, a and b know each other", T, || {
        know_each_other(&d, &a) && know_each_other(&d, &b)
    });
    // Nodes that come and go move etcd's revision on; then it starts again
    // with no data (as restored from an old snapshot), its revision far
    // behind the views': a newcomer is still found. (Here the watch fails
    // while etcd is down and the view is read again; a watch made again
    // at once on a store behind it is read again too, by the revision its
    // first answer names, a case this test does not make.)
    for i in 0..10 {
        let n = via.node(&env, hosts[3].path(), &format!("churn{i}"));
        n.close();
    }
    etcd.kill9();
    etcd.restart_empty(T)
        .expect("etcd starts again with no data");
    let e = via.node(&env, hosts[3].path(), "e");
    wait_for("a knows e", T, || knows(&a, &e.id().to_hex()));
}

/// With `discovery = etcd`: a node whose grown announcement etcd refuses
/// (over its `--max-request-bytes`) keeps its lease alive, so that its
/// entry already there stays (the writer used to retry the put alone,
/// and the lease ended after 3 s); an entry an operator deletes from etcd
/// is put back by its node; and the prefix is read in pages (a hundred
/// junk keys that sort before every node's, counted as malformed, and
/// the nodes after them found, 32 keys a page).
#[test]
fn with_discovery_etcd_an_entry_outlives_refused_puts_comes_back_when_deleted_and_is_read_in_pages()
{
    use milonga_testkit::etcd::b64;
    let env = Env::new("etcd-keep");
    let hosts: Vec<TempDir> = (0..4)
        .map(|i| TempDir::new(&format!("etcd-k{i}")))
        .collect();
    let etcd = Etcd::start_with(hosts[0].path(), T, &["--max-request-bytes", "65536"])
        .expect("etcd starts");
    let via = Via::Etcd(etcd.url.clone());
    let a = via.node(&env, hosts[1].path(), "a");
    let b = via.node(&env, hosts[2].path(), "b");
    wait_for("a and b know each other", T, || know_each_other(&a, &b));
    // a's announcement grows past 64 KiB: etcd refuses each put of it.
    let long = "x".repeat(200);
    let _pubs: Vec<Publisher> = (0..400)
        .map(|i| a.publisher(&format!("etcd/{long}/{i}")).unwrap())
        .collect();
    // Twice the lease (3 s) and more: b knows a all along. (A fixed span:
    // what is asserted is that nothing goes in it.)
    let end = Instant::now() + Duration::from_secs(7);
    while Instant::now() < end {
        assert!(
            knows(&b, &a.id().to_hex()),
            "a's entry went with its lease while etcd refused its puts"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // An operator deletes b's entry: b puts it back.
    let key = format!("milonga/{}/{}", env.domain, b.id().to_hex());
    let one = format!(r#"{{"key":"{}"}}"#, b64(key.as_bytes()));
    let deleted = etcd.post("/v3/kv/deleterange", &one).unwrap();
    assert!(deleted.contains(r#""deleted":"1""#), "{deleted}");
    wait_for("b's entry is back in etcd", T, || {
        etcd.post("/v3/kv/range", &one)
            .unwrap()
            .contains(r#""kvs""#)
    });
    // Junk before every node's key: a newcomer reads past it, page after
    // page, and finds a and b when it opens.
    for i in 0..100 {
        let k = format!("milonga/{}/!junk-{i:03}", env.domain);
        let put = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b64(k.as_bytes()),
            b64(b"junk")
        );
        let answer = etcd.post("/v3/kv/put", &put).unwrap();
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    }
    let c = via.node(&env, hosts[3].path(), "c");
    assert!(knows(&c, &a.id().to_hex()) && knows(&c, &b.id().to_hex()));
    assert_eq!(c.stats().announcements_malformed, 100);
}

/// The samples `sub` delivers until `SubscriptionLive`, by sequence
/// number.
fn until_live(sub: &Subscriber) -> Vec<u64> {
    let end = Instant::now() + T;
    let mut seqs = Vec::new();
    loop {
        match sub.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Sample(s)) => seqs.push(s.seq),
            Ok(Event::SubscriptionLive) => return seqs,
            _ => {}
        }
        assert!(Instant::now() < end, "not live; got {seqs:?}");
    }
}

/// A client of the broker listening at `listen`, on a "host" of its own
/// (`dir`).
fn client(env: &Env, listen: &str, dir: &Path) -> Node {
    let at = listen.strip_prefix("tcp://").unwrap();
    let mut cfg = Config::new(&format!("milonga://{at}/{}", env.domain), "client");
    cfg.runtime_dir = Some(dir.to_path_buf());
    Node::open_with(cfg).unwrap()
}

#[test]
fn registered_nodes_and_the_broker_s_clients_see_each_other_s_publications_and_services() {
    let env = Env::new("reg-join");
    let hosts: Vec<TempDir> = (0..4)
        .map(|i| TempDir::new(&format!("reg-join-h{i}")))
        .collect();
    let listen = format!("tcp://127.0.0.1:{}", free_port());
    let via = Via::Registry(listen.clone());
    let _broker = registry(&env, hosts[0].path(), &listen);
    // A registered node publishes (keeping 3) and serves before any
    // client is there.
    let a = via.node(&env, hosts[1].path(), "a");
    let pa = a
        .publisher_with("reg/a", milonga::PublisherQos::reliable().history(3))
        .unwrap();
    for i in 1..=3 {
        pa.put(f64::from(i)).unwrap();
    }
    let _echo = a
        .serve("reg/a/echo", |r: milonga::Request| Ok(r.value))
        .unwrap();
    // A client of the broker, on a host of its own.
    let c = client(&env, &listen, hosts[3].path());
    wait_for("the client sees the registered publication", T, || {
        c.peers()
            .iter()
            .any(|x| x.publications.iter().any(|p| p.key == "reg/a"))
    });
    // Its subscription gets the last two kept samples, then the live ones:
    // the broker connects to the registered publisher once the client asks
    // (and the history query, sent before that, goes again).
    let sub = c
        .subscribe_with("reg/a", milonga::SubscriberQos::default().last(2))
        .unwrap();
    assert_eq!(until_live(&sub), [2, 3], "the kept samples, then live");
    assert_eq!(next(&pa, &sub).seq, 4, "then the live one, no gap");
    let v = c
        .call("reg/a/echo", 7.5, Duration::from_secs(5))
        .expect("the client calls the registered node's service");
    assert_eq!(v.as_f64(), Some(7.5));
    // The other way: a registered node sees the client's publication and
    // service, at the broker's sockets.
    let pc = c.publisher("reg/c").unwrap();
    let _cecho = c
        .serve("reg/c/echo", |r: milonga::Request| Ok(r.value))
        .unwrap();
    let b = via.node(&env, hosts[2].path(), "b");
    let cid = c.id().to_hex();
    wait_for("the registered node sees the client's service", T, || {
        b.peers()
            .iter()
            .any(|x| x.node_id == cid && x.services.iter().any(|s| s.key == "reg/c/echo"))
    });
    let sb = b.subscribe("reg/c").unwrap();
    next(&pc, &sb);
    let v = b
        .call("reg/c/echo", 8.5, Duration::from_secs(5))
        .expect("the registered node calls the client's service");
    assert_eq!(v.as_f64(), Some(8.5));
    // A client that closes leaves the registered nodes' views.
    let closed = Instant::now();
    c.close();
    wait_for("the client gone from b's view", T, || !knows(&b, &cid));
    assert!(
        closed.elapsed() < Duration::from_secs(2),
        "{:?}",
        closed.elapsed()
    );
}

/// A client that asks for every publisher of a large registry does not
/// make the broker connect to all of them: past
/// `--max-registered-connected` endpoints (here 2: one node's data and
/// liveliness endpoints), the nodes are left out of the clients' view,
/// not shown without their samples, and counted.
#[test]
fn a_client_asking_for_everything_connects_the_broker_to_a_bounded_number_of_registered_nodes() {
    let env = Env::new("reg-cap");
    let hosts: Vec<TempDir> = (0..5)
        .map(|i| TempDir::new(&format!("reg-cap-h{i}")))
        .collect();
    let listen = format!("tcp://127.0.0.1:{}", free_port());
    let via = Via::Registry(listen.clone());
    let mut cmd = env.cmd(&[
        "broker",
        "--listen",
        &listen,
        "--json",
        "--domain",
        &env.domain,
        "--max-registered-connected",
        "2",
    ]);
    cmd.env("MILONGA_RUNTIME_DIR", hosts[0].path());
    let broker = Proc::spawn(cmd);
    broker.line(T).expect("the broker listens");
    let nodes: Vec<Node> = (1..=3)
        .map(|i| via.node(&env, hosts[i].path(), &format!("n{i}")))
        .collect();
    let pubs: Vec<Publisher> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| n.publisher(&format!("cap/{i}")).unwrap())
        .collect();
    let c = client(&env, &listen, hosts[4].path());
    wait_for("the client sees the three publications", T, || {
        c.peers()
            .iter()
            .filter(|x| x.publications.iter().any(|p| p.key.starts_with("cap/")))
            .count()
            == 3
    });
    // Asking for them all: one is connected, two are left out.
    let sub = c.subscribe("cap/**").unwrap();
    let end = Instant::now() + T;
    let stats = loop {
        let line = broker.line(T).expect("a stats line");
        let v: Json = serde_json::from_str(&line).unwrap();
        if v["event"] == "stats" && v["stats"]["registered_unconnected"] == 2 {
            break v;
        }
        assert!(Instant::now() < end, "two nodes left out: {v}");
    };
    assert_eq!(stats["stats"]["registered"], 3, "{stats}");
    wait_for("the client's view holds the connected one only", T, || {
        c.peers()
            .iter()
            .filter(|x| x.publications.iter().any(|p| p.key.starts_with("cap/")))
            .count()
            == 1
    });
    let shown: Vec<String> = c
        .peers()
        .iter()
        .flat_map(|x| x.publications.iter().map(|p| p.key.clone()))
        .filter(|k| k.starts_with("cap/"))
        .collect();
    // Its samples come; the others' never do.
    let end = Instant::now() + T;
    let mut got = std::collections::BTreeSet::new();
    while Instant::now() < end && got.is_empty() {
        for p in &pubs {
            p.put(1.0).unwrap();
        }
        while let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(20)) {
            got.insert(s.key);
        }
    }
    for _ in 0..20 {
        for p in &pubs {
            p.put(1.0).unwrap();
        }
        while let Ok(ev) = sub.recv_timeout(Duration::from_millis(10)) {
            if let Event::Sample(s) = ev {
                got.insert(s.key);
            }
        }
    }
    assert_eq!(got.into_iter().collect::<Vec<_>>(), shown);
}
