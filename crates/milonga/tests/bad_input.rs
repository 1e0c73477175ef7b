//! Bad input from the network: every kind is dropped, counted and logged,
//! and the node goes on serving. A forged peer (an announcement file that
//! points at a raw libzmq PUB socket of this test) feeds a subscriber frames
//! that a Milonga publisher would never send.

use std::time::Duration;

use milonga::p2p::{NodeExt, ServiceExt};
use milonga::wire::frame::{self, Encoding, Kind, NodeId};
use milonga::{Config, Event, Key, Node, NodeStats, Reliability};
use milonga_testkit::{wait_for, TempDir};

const T: Duration = Duration::from_secs(10);

mod forge;
use forge::{header, own_endpoint, FORGER};

fn frame(domain: &str, kind: Kind, encoding: Encoding, seq: u64, body: &[u8]) -> Vec<u8> {
    forge::forged(domain, "bad/x", kind, encoding, seq, body)
}

/// Sends valid samples until one arrives (the connection is up), and
/// returns the next sequence number to use.
fn until_delivered(pubsock: &zmq::Socket, sub: &milonga::Subscriber, node: &Node, seq: u64) -> u64 {
    forge::until_delivered(pubsock, sub, node, "bad", "bad/x", seq)
}

/// A raw libzmq PUB socket of this test announced in `domain` as the node
/// [`FORGER`] publishing `bad/**`-matching key `bad/x`.
fn forge_publisher(dir: &std::path::Path, domain: &str) -> (zmq::Context, zmq::Socket) {
    forge::forge_publisher(dir, domain, "bad/x", 0, zmq::PUB, T)
}

/// A subscriber of `bad/**` connected to a forged publisher ([`FORGER`])
/// that a raw PUB socket of this test plays, and has heard from it.
struct Victim {
    _dir: TempDir,
    node: Node,
    sub: milonga::Subscriber,
    _ctx: zmq::Context,
    pubsock: zmq::Socket,
}

fn victim(tag: &str, max_message_bytes: Option<usize>) -> Victim {
    let dir = TempDir::new(tag);
    let mut cfg = Config::new("milonga:///bad", "victim");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    if let Some(m) = max_message_bytes {
        cfg.max_message_bytes = m;
    }
    let node = Node::open_with(cfg).unwrap();
    let sub = node.subscribe("bad/**").unwrap();
    let (ctx, pubsock) = forge_publisher(dir.path(), "bad");
    wait_for("the subscriber to connect to the forged node", T, || {
        sub.connected_endpoints() == 1
    });
    Victim {
        _dir: dir,
        node,
        sub,
        _ctx: ctx,
        pubsock,
    }
}

#[test]
fn malformed_frames_are_dropped_counted_and_the_node_goes_on() {
    let Victim {
        _dir,
        node,
        sub,
        _ctx,
        pubsock,
    } = victim("badinput", Some(1 << 20));
    let mut seq = until_delivered(&pubsock, &sub, &node, 1);

    let before = node.stats();
    let mut bad_version = frame("bad", Kind::Sample, Encoding::Raw, seq, b"v2");
    bad_version[6] = 2; // the version byte follows "bad/x\0"
    let mut unknown_kind = frame("bad", Kind::Sample, Encoding::Raw, seq, b"k");
    unknown_kind[7] = 42;
    let truncated = frame("bad", Kind::Sample, Encoding::Raw, seq, b"")[..20].to_vec();
    let mut random = b"bad/".to_vec();
    random.extend((0..300u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let foreign = frame("other-domain", Kind::Sample, Encoding::Raw, seq, b"foreign");
    let bad_cbor = frame(
        "bad",
        Kind::Sample,
        Encoding::Cbor,
        seq,
        &[0x5b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    );
    let flagged = {
        let mut h = header("bad", Kind::Sample, Encoding::Raw, seq);
        h.flags = frame::FLAG_PAYLOAD_FRAME;
        frame::encode(&Key::new("bad/x").unwrap(), &h, b"")
    };
    let hb_key = Key::internal(frame::HEARTBEAT_KEY).unwrap();
    let heartbeat_not_a_map = frame::encode(
        &hb_key,
        &header("bad", Kind::Heartbeat, Encoding::Cbor, 1),
        &[0x01],
    );
    let heartbeat_flagged = {
        let mut h = header("bad", Kind::Heartbeat, Encoding::Cbor, 2);
        h.flags = frame::FLAG_PAYLOAD_FRAME;
        frame::encode(&hb_key, &h, &[0xa0])
    };
    for f in [
        &heartbeat_not_a_map,
        &heartbeat_flagged,
        &bad_version,
        &unknown_kind,
        &truncated,
        &random,
        &foreign,
        &bad_cbor,
        &flagged,
    ] {
        pubsock.send(&f[..], 0).unwrap();
    }
    // Three frames in one message.
    pubsock
        .send_multipart([&b"bad/x"[..], b"two", b"three"], 0)
        .unwrap();
    seq = until_delivered(&pubsock, &sub, &node, seq + 1);
    let after = node.stats();
    let delta = |f: fn(&NodeStats) -> u64| f(&after) - f(&before);
    assert_eq!(delta(|s| s.frames_bad_version), 1);
    assert_eq!(delta(|s| s.frames_unknown_kind), 1);
    assert_eq!(delta(|s| s.frames_foreign_domain), 1);
    assert_eq!(delta(|s| s.payloads_malformed), 1);
    // two bad heartbeats, truncated, random bytes, a payload-frame flag
    // without the frame, three frames
    assert_eq!(delta(|s| s.frames_malformed), 6);

    // An over-size message: libzmq closes the connection, the subscription
    // counts it, reconnects, and delivery resumes.
    let closed = node.stats().connections_closed;
    pubsock
        .send(
            frame("bad", Kind::Sample, Encoding::Raw, seq, &vec![0u8; 2 << 20]),
            0,
        )
        .unwrap();
    seq += 1;
    let mut next = seq;
    wait_for("the over-size message to close the connection", T, || {
        // recv drives the subscription's socket, which reads its monitor.
        let _ = sub.recv_timeout(Duration::from_millis(20));
        node.stats().connections_closed > closed
    });
    next = until_delivered(&pubsock, &sub, &node, next);
    assert!(next > seq);
    // Each oddity was logged and counted; none stopped the node: a
    // publication of its own reaches its subscription (`bad/**` matches it).
    let p = node.publisher("bad/own").unwrap();
    wait_for(
        "the subscription to reach the node's own publisher",
        T,
        || p.subscriber_count() == 1,
    );
    p.put(1).unwrap();
    let end = std::time::Instant::now() + T;
    loop {
        assert!(
            std::time::Instant::now() < end,
            "no bad/own sample in {T:?}"
        );
        match sub.recv_timeout(T).expect("the node's own sample") {
            Event::Sample(s) if s.key == "bad/own" => {
                assert_eq!(s.value, milonga::Value::from(1));
                break;
            }
            _ => {}
        }
    }
}

#[test]
fn garbage_on_the_data_and_control_ports_is_counted() {
    let dir = TempDir::new("garbage");
    let mut cfg = Config::new("milonga:///garbage", "target");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    let node = Node::open_with(cfg).unwrap();
    let p = node.publisher("g/x").unwrap();
    let data = own_endpoint(&node, Reliability::BestEffort);
    let garbage = milonga_testkit::zmtp_garbage;
    garbage(node.control_endpoint());
    garbage(&data);
    // Two connections on each port, each failed (or timed out in the
    // handshake).
    wait_for("failed handshakes on both ports", T, || {
        node.stats().handshakes_failed >= 4
    });
    // Issue 10, finding 10: a service port counts them too.
    let svc = node.serve("g/svc", |r| Ok(r.value)).expect("serve");
    let before = node.stats().handshakes_failed;
    garbage(svc.endpoint());
    wait_for("failed handshakes on the service port", T, || {
        node.stats().handshakes_failed > before
    });
    // The node still publishes, answers control requests, and serves.
    p.put(1).unwrap();
    assert!(node.query(node.control_endpoint(), T).is_some());
    assert_eq!(node.call("g/svc", 5, T).unwrap(), milonga::Value::from(5));
}

/// A connection to a node's control port that asks `info` 10,000 times
/// and never reads: the node keeps at most 16 answers for it and counts
/// the rest (`control_replies_dropped`) rather than queueing a thousand
/// NodeInfos per connection, and answers everyone else.
#[test]
fn a_control_asker_that_never_reads_has_its_answers_dropped_and_counted() {
    let dir = TempDir::new("ctl-asker");
    let mut cfg = Config::new("milonga:///ctlasker", "target");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    let node = Node::open_with(cfg).unwrap();
    let ctx = zmq::Context::new();
    let asker = ctx.socket(zmq::DEALER).unwrap();
    asker.set_linger(0).unwrap();
    asker.set_rcvhwm(1).unwrap();
    asker.set_sndhwm(0).unwrap();
    asker.connect(node.control_endpoint()).unwrap();
    // Each answer is a few KiB: 10,000 pass what the kernel buffers.
    for _ in 0..10_000 {
        asker
            .send_multipart(milonga::wire::control::Request::Info.frames(), 0)
            .unwrap();
    }
    wait_for("answers dropped for the asker that never reads", T, || {
        node.stats().control_replies_dropped > 0
    });
    assert!(node.query(node.control_endpoint(), T).is_some());
}

/// Bad history queries and filter declarations, an absurd repair range and
/// a flood of subscribe/unsubscribe, sent by a raw XSUB to a publisher's
/// data socket: each is answered, counted or dropped, and the publisher
/// goes on serving a normal subscriber.
#[test]
fn bad_queries_and_a_subscription_flood_leave_the_publisher_serving() {
    use milonga::wire::history::{Query, Reply};
    use milonga::{PublisherQos, SubscriberQos};
    let dir = TempDir::new("badquery");
    let mut cfg = Config::new("milonga:///bq", "pub");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    let a = Node::open_with(cfg.clone()).unwrap();
    cfg.name = "sub".into();
    let b = Node::open_with(cfg).unwrap();
    let p = a
        .publisher_with("bq/x", PublisherQos::reliable().history(5))
        .unwrap();
    for i in 0..10u64 {
        p.put(i).unwrap();
    }
    let data = own_endpoint(&a, Reliability::Reliable);
    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::XSUB).unwrap();
    // No high-water mark on this side: an XSUB drops what it cannot queue,
    // and an unsubscribe of the flood below dropped here would leave a
    // subscription behind that is no fault of the publisher's.
    raw.set_sndhwm(0).unwrap();
    raw.connect(&data).unwrap();
    raw.send(&b"\x01@r/evil\x00"[..], 0).unwrap();
    raw.set_rcvtimeo(5000).unwrap();
    let query = |since: u64| Query {
        node: a.id().to_hex(),
        socket: "reliable".into(),
        token: "evil".into(),
        expr: "bq/**".into(),
        last: 0,
        since: vec![("bq/x".into(), since)],
        id: None,
        schemas: Vec::new(),
        dictionaries: Vec::new(),
    };
    // An absurd range: after the end of time. Answered, with nothing.
    raw.send(query(u64::MAX).encode(), 0).unwrap();
    let reply = loop {
        let f = raw.recv_bytes(0).expect("a history reply");
        let v = frame::decode(&f).unwrap();
        if v.header.kind == Kind::History {
            break Reply::decode(&milonga::Bytes::copy_from_slice(v.body)).unwrap();
        }
    };
    assert!(reply.done && reply.keys[0].entries.is_empty(), "{reply:?}");
    assert_eq!((reply.keys[0].first, reply.keys[0].last), (6, 10));
    // Garbage, a bad expression, a bad filter declaration.
    raw.send(&b"\x02\xff\xff"[..], 0).unwrap();
    let mut bad_expr = query(0);
    bad_expr.expr = "a/b*".into();
    raw.send(bad_expr.encode(), 0).unwrap();
    raw.send(&b"\x03\xa0"[..], 0).unwrap();
    // A flood of subscribe/unsubscribe.
    for i in 0..5000 {
        let prefix = format!("flood/{i}");
        let mut s = vec![1u8];
        s.extend_from_slice(prefix.as_bytes());
        raw.send(s.clone(), 0).unwrap();
        s[0] = 0;
        raw.send(s, 0).unwrap();
    }
    // `@r/evil`, then 5,000 subscribe and 5,000 unsubscribe messages, all
    // read (they come in order, after the bad messages).
    wait_for("the bad messages and the flood counted", T, || {
        let _ = p.subscriber_count(); // reads the socket
        let st = a.stats();
        st.history_queries_malformed == 2
            && st.filters_malformed == 1
            && st.subscription_messages >= 10_001
    });
    // The flood left no subscription behind: publishers of flooded keys on
    // the same (reliable) socket have no subscriber (`flood/2500` would
    // count `flood/2`, `flood/25`, `flood/250` and `flood/2500`), and
    // neither has `bq/x`.
    for key in ["flood/0", "flood/2500", "flood/4999"] {
        let probe = a.publisher_with(key, PublisherQos::reliable()).unwrap();
        assert_eq!(probe.subscriber_count(), 0, "{key}");
    }
    assert_eq!(p.subscriber_count(), 0);
    // The publisher goes on serving a normal subscriber.
    let s = b.subscribe_with("bq/x", SubscriberQos::default()).unwrap();
    wait_for("a normal subscriber", T, || p.subscriber_count() == 1);
    p.put(99u64).unwrap();
    let end = std::time::Instant::now() + T;
    loop {
        assert!(std::time::Instant::now() < end, "no sample in {T:?}");
        if let Event::Sample(x) = s.recv_timeout(T).expect("the sample put") {
            assert_eq!(x.value, milonga::Value::from(99u64));
            break;
        }
    }
    assert_eq!(a.stats().history_queries_answered, 1);
}

/// Issue 10, finding 5: forged node ids, keys and sequence numbers cost the
/// subscriber bounded state and never a false loss count. A sample of a
/// node that discovery does not show is dropped and counted; a sequence
/// number 2^63 ahead is a jump, not 9.2e18 lost samples; past 65,536 keys
/// of one publisher, samples of new keys are dropped and counted.
#[test]
fn finding_05_forged_ids_keys_and_sequence_numbers_cost_bounded_state() {
    let Victim {
        _dir,
        node,
        sub,
        _ctx,
        pubsock,
    } = victim("forged", None);
    let seq = until_delivered(&pubsock, &sub, &node, 1);
    let before = node.stats();
    // Another node id, from a connection of the forged node.
    for i in 0..100u8 {
        let mut h = header("bad", Kind::Sample, Encoding::Raw, 1);
        h.node_id = NodeId([i; 16]);
        if h.node_id == FORGER {
            continue;
        }
        let f = frame::encode(&Key::new("bad/x").unwrap(), &h, b"ghost");
        pubsock.send(f, 0).unwrap();
    }
    // A jump of 2^63.
    let jump = seq + (1 << 63);
    pubsock
        .send(frame("bad", Kind::Sample, Encoding::Raw, jump, b"far"), 0)
        .unwrap();
    let next = until_delivered(&pubsock, &sub, &node, jump + 1);
    let after = node.stats();
    assert_eq!(
        after.samples_unknown_publisher - before.samples_unknown_publisher,
        99
    );
    assert_eq!(after.sequence_jumps - before.sequence_jumps, 1);
    assert_eq!(after.samples_lost, before.samples_lost, "a jump is no loss");
    assert_eq!(sub.lost(), 0);
    // The state of 65,536 keys is held per publisher (`bad/x` is one);
    // at the limit, the keys the node does not announce (here all but
    // `bad/x`) are forgotten to make room, so a new key is followed
    // again and the state stays bounded (`seq::tests::
    // a_node_holds_at_most_max_keys_per_publisher` shows the forgetting;
    // a key the node announces is never forgotten, and past 65,536 of
    // those a new key's samples are dropped). Sent in rounds that the
    // subscriber reads, so that the PUB socket's high-water mark drops
    // nothing.
    let n = 1u64 << 16;
    let mut keys = 0;
    for round in 0..(n + 10).div_ceil(500) {
        for i in round * 500..((round + 1) * 500).min(n + 10) {
            let key = Key::new(format!("bad/k/{i}")).unwrap();
            let f = frame::encode(&key, &header("bad", Kind::Sample, Encoding::Raw, 1), b"k");
            pubsock.send(f, 0).unwrap();
        }
        while keys < ((round + 1) * 500).min(n + 10) {
            match sub.recv_timeout(T).expect("every key, past the limit too") {
                Event::Sample(s) if s.key.starts_with("bad/k/") => keys += 1,
                Event::Lost(l) => panic!("{l:?}"),
                _ => {}
            }
        }
    }
    until_delivered(&pubsock, &sub, &node, next);
    let st = node.stats();
    assert_eq!(keys, n + 10);
    assert_eq!(st.samples_over_key_limit, 0, "{st:?}");
}

/// Issue 10, finding 3: a flood of history queries neither freezes the
/// publisher (its puts and heartbeats go on: a normal subscriber sees no
/// lease expire and gets what is put meanwhile) nor makes it push replies
/// at another subscriber named in the queries; what it does not answer is
/// counted.
#[test]
fn finding_03_a_flood_of_history_queries_freezes_nothing_and_amplifies_nothing() {
    use milonga::wire::history::Query;
    use milonga::{PublisherQos, SubscriberQos};
    let dir = TempDir::new("qflood");
    let mut cfg = Config::new("milonga:///qf", "pub");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    cfg.heartbeat_interval_ms = 100;
    cfg.heartbeat_timeout_ms = 1000;
    let a = Node::open_with(cfg.clone()).unwrap();
    cfg.name = "victim".into();
    let b = Node::open_with(cfg).unwrap();
    let p = a
        .publisher_with("qf/x", PublisherQos::best_effort().history(1000))
        .unwrap();
    for i in 0..1000u64 {
        p.put(vec![i as f64; 100]).unwrap();
    }
    let victim = b.subscribe_with("qf/x", SubscriberQos::default()).unwrap();
    wait_for("the victim", T, || p.subscriber_count() == 1);
    let data = own_endpoint(&a, Reliability::BestEffort);
    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::XSUB).unwrap();
    raw.set_sndhwm(0).unwrap();
    raw.connect(&data).unwrap();
    raw.send(&b"\x01@r/evil\x00"[..], 0).unwrap();
    let query = |token: &str| {
        Query {
            node: a.id().to_hex(),
            socket: "best_effort".into(),
            token: token.into(),
            expr: "qf/**".into(),
            last: u64::MAX,
            since: vec![],
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        }
        .encode()
    };
    // What a token used to be: the subscriber's node id and a number.
    let guessed: Vec<Vec<u8>> = (1..4).map(|i| query(&format!("{}-{i}", b.id()))).collect();
    let own = query("evil");
    let victim_bytes = b.stats().bytes_received;
    let started = std::time::Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(2) {
        for q in guessed.iter().chain(std::iter::once(&own)) {
            raw.send(&q[..], zmq::DONTWAIT).unwrap();
            sent += 1;
        }
        if sent % 400 == 0 {
            p.put(vec![0.0f64; 100]).unwrap();
        }
    }
    // The victim hears the publisher all along: samples put during the
    // flood, no lost lease, and no history reply of anyone's asking.
    let (mut samples, mut lost) = (0, 0);
    while let Ok(ev) = victim.recv_timeout(Duration::from_millis(200)) {
        match ev {
            Event::Sample(_) => samples += 1,
            Event::PublisherLost(_) => lost += 1,
            _ => {}
        }
    }
    assert!(samples > 0, "the victim got nothing put during the flood");
    assert_eq!(lost, 0, "the publisher's lease ran out during the flood");
    let st = a.stats();
    assert!(st.history_queries_refused > 0, "{st:?}");
    // At most the budget: 10 per token and second, 200 in all.
    assert!(st.history_queries_answered <= 10 * 3, "{st:?}");
    let got = b.stats().bytes_received - victim_bytes;
    assert!(
        got < (samples as u64 + 1) * 1000,
        "the victim received {got} bytes for {samples} samples: replies were pushed at it"
    );
}

/// Issue 10, finding 6: a peer that breaks every connection at once (an
/// over-size frame to each newcomer) does not make the subscriber spin:
/// it reconnects after an exponential back-off (counted in `reconnects`),
/// and delivery resumes when the peer behaves.
#[test]
fn finding_06_a_peer_that_breaks_every_connection_meets_a_back_off() {
    let Victim {
        _dir,
        node,
        sub,
        _ctx,
        pubsock,
    } = victim("storm", Some(1 << 16));
    let seq = until_delivered(&pubsock, &sub, &node, 1);
    let big = frame("bad", Kind::Sample, Encoding::Raw, seq, &vec![0u8; 1 << 17]);
    let started = std::time::Instant::now();
    // Two seconds of an over-size frame every millisecond: each connection
    // the subscriber makes breaks at once.
    while started.elapsed() < Duration::from_secs(2) {
        pubsock.send(&big[..], zmq::DONTWAIT).unwrap();
        let _ = sub.recv_timeout(Duration::from_millis(1));
    }
    let st = node.stats();
    assert!(
        st.connections_closed >= 2,
        "the frames broke connections: {st:?}"
    );
    // 50 ms doubling to 2 s: a handful in two seconds, not thousands.
    assert!(st.reconnects <= 20 && st.connections_closed <= 21, "{st:?}");
    until_delivered(&pubsock, &sub, &node, seq + 1);
}

/// Issue 10, finding 16: a sample whose payload does not decode arrived:
/// it is dropped and counted in `payloads_malformed`, and not also reported
/// lost when the next sample comes (docs/protocol.md §7, rows 12-14).
#[test]
fn finding_16_an_undecodable_sample_is_not_also_reported_lost() {
    let Victim {
        _dir,
        node,
        sub,
        _ctx,
        pubsock,
    } = victim("undecodable", None);
    let seq = until_delivered(&pubsock, &sub, &node, 1);
    let bad_cbor = frame("bad", Kind::Sample, Encoding::Cbor, seq, &[0x5b, 0xff]);
    pubsock.send(bad_cbor, 0).unwrap();
    pubsock
        .send(frame("bad", Kind::Sample, Encoding::Raw, seq + 1, b"ok"), 0)
        .unwrap();
    loop {
        match sub.recv_timeout(T).expect("the good sample") {
            Event::Lost(l) => panic!("an undecodable sample reported lost too: {l:?}"),
            Event::Sample(s) if s.seq == seq + 1 => break,
            _ => {}
        }
    }
    assert_eq!(node.stats().payloads_malformed, 1);
    assert_eq!(sub.lost(), 0);
}

/// Issue 10, finding 10: an over-size message sent to a node's data port
/// (over its 256 KiB limit for what subscribers send) makes libzmq close
/// that connection; the node counts it in `peer_disconnects` and goes on.
#[test]
fn finding_10_an_over_size_message_to_a_data_port_is_counted() {
    let dir = TempDir::new("oversize-in");
    let mut cfg = Config::new("milonga:///bad", "target");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    let node = Node::open_with(cfg).unwrap();
    let p = node.publisher("big/x").unwrap();
    let data = own_endpoint(&node, Reliability::BestEffort);
    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::XSUB).unwrap();
    raw.connect(&data).unwrap();
    raw.send(&b"\x01big/x\x00"[..], 0).unwrap();
    wait_for("the raw subscriber", T, || p.subscriber_count() == 1);
    let before = node.stats().peer_disconnects;
    let mut big = vec![0x42u8; 512 << 10];
    big[0] = 0x02;
    raw.send(big, 0).unwrap();
    wait_for("the over-size message to be counted", T, || {
        node.stats().peer_disconnects > before
    });
    p.put(1).unwrap();
}
