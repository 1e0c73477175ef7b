//! Promises of docs/guarantees.md that no other test enforced: each test is
//! named after what it promises, says what breaking the promise would look
//! like, and fails when it breaks. Forged peers (an announcement file that
//! points at a raw libzmq socket of this test) play publishers that a
//! Milonga node would never be, as in `tests/bad_input.rs`.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use milonga::p2p::{NodeExt, NodeInfo, ServiceExt, CONTROL_INFO, CONTROL_MAGIC};
use milonga::wire::filter::Declaration;
use milonga::wire::frame::{self, domain_tag, Encoding, Header, Kind, NodeId};
use milonga::wire::history::{Query, QUERY_TAG, REPLY_KEY_PREFIX};
use milonga::wire::service::{Failure, ReplyStatus};
use milonga::{
    Config, Event, Filter, Key, Node, OpenError, PutError, Reliability, SubscriberQos, Value,
};
use milonga_testkit::{wait_for, Proc, TempDir};

/// The bound of every wait: long enough for a loaded 2-core machine.
const T: Duration = Duration::from_secs(10);

mod forge;
use forge::{forged, own_endpoint, until_delivered, FORGER};

/// [`forge::forge_publisher`] with this file's timeout.
fn forge_publisher(
    dir: &Path,
    domain: &str,
    key: &str,
    history: usize,
    kind: zmq::SocketType,
) -> (zmq::Context, zmq::Socket) {
    forge::forge_publisher(dir, domain, key, history, kind, T)
}
fn config(domain: &str, name: &str, dir: &Path) -> Config {
    let mut cfg = Config::new(&format!("milonga:///{domain}"), name);
    cfg.runtime_dir = Some(dir.to_path_buf());
    cfg
}

fn open(domain: &str, name: &str, dir: &Path) -> Node {
    Node::open_with(config(domain, name, dir)).expect("open node")
}

/// Whether `node`'s discovery shows a publication of `key` by `publisher`.
fn knows(node: &Node, publisher: &str, key: &str) -> bool {
    node.peers()
        .iter()
        .any(|a| a.node_id == publisher && a.publications.iter().any(|p| p.key == key))
}

/// The next sample; a reported loss fails the test.
fn next_sample(sub: &milonga::Subscriber) -> milonga::Sample {
    let end = Instant::now() + T;
    loop {
        assert!(Instant::now() < end, "no sample in {T:?}");
        match sub.recv_timeout(T).expect("a sample in time") {
            Event::Sample(s) => return s,
            Event::Lost(l) => panic!("unexpected loss: {l:?}"),
            _ => {}
        }
    }
}

/// An echo service of `key` on `server` that counts the requests its
/// handler ran, and a raw DEALER of the test connected to it.
fn counted_echo(
    server: &Node,
    key: &str,
) -> (
    milonga::Service,
    Arc<AtomicUsize>,
    zmq::Context,
    zmq::Socket,
) {
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    let svc = server
        .serve(key, move |req| {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(req.value)
        })
        .unwrap();
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.set_rcvtimeo(T.as_millis() as i32).unwrap();
    dealer.connect(svc.endpoint()).unwrap();
    (svc, ran, ctx, dealer)
}

// ---------------------------------------------------------------- Keys

/// docs/guarantees.md, Keys: "Subscribers connect only to publishers whose
/// keys can match".
///
/// Broken, this looks like a subscription of `cm/a/b` that also opens a
/// data connection to the node publishing only `cm/a/bc` (it connects to
/// every publisher, or matches keys by prefix): the subscription shows two
/// data endpoints, and the non-matching node's data socket receives its
/// subscribe messages (`subscription_messages` > 0), even though ZeroMQ's
/// `key NUL` prefix filter would still keep the samples from crossing.
#[test]
fn subscribers_connect_only_to_publishers_whose_keys_can_match() {
    let dir = TempDir::new("g-match");
    let a = open("cm", "match", dir.path());
    let c = open("cm", "sibling", dir.path());
    let b = open("cm", "sub", dir.path());
    let pa = a.publisher("cm/a/b").unwrap();
    let pc = c.publisher("cm/a/bc").unwrap();
    let (a_id, c_id) = (a.id().to_hex(), c.id().to_hex());
    wait_for("the subscriber's node to know both publishers", T, || {
        knows(&b, &a_id, "cm/a/b") && knows(&b, &c_id, "cm/a/bc")
    });
    let sub = b.subscribe("cm/a/b").unwrap();
    wait_for("the matching publisher to hear the subscription", T, || {
        pa.subscriber_count() == 1
    });
    assert_eq!(
        sub.connected_endpoints(),
        1,
        "the subscription opened a data connection to a publisher it cannot match"
    );
    assert_eq!(pc.subscriber_count(), 0);
    assert_eq!(
        c.stats().subscription_messages,
        0,
        "the non-matching publisher's data socket heard a subscriber: it was connected to"
    );
    // The same counter does see a subscription that can match both: the
    // zero above is not a counter that never moves.
    let both = b.subscribe("cm/**").unwrap();
    wait_for("a subscription of both to reach the sibling", T, || {
        pc.subscriber_count() == 1 && c.stats().subscription_messages > 0
    });
    assert_eq!(both.connected_endpoints(), 2);
    assert_eq!(sub.connected_endpoints(), 1);
}

// ---------------------------------------------------------------- Filters

/// docs/guarantees.md, Filters: "a sample the expression cannot be
/// evaluated on does not pass and is counted (`filter_errors`)".
///
/// Broken, this looks like a number reaching a subscription whose filter
/// `status == "ON"` names a field a number does not have (a failed
/// evaluation taken as a pass), or a publisher node whose `filter_errors`
/// stays 0 for it, or counts a plain `false` (a map with `status` "OFF")
/// as an error.
#[test]
fn a_sample_a_filter_cannot_be_evaluated_on_does_not_pass_and_is_counted() {
    let dir = TempDir::new("g-ferr");
    let a = open("fe", "pub", dir.path());
    let b = open("fe", "sub", dir.path());
    let p = a.publisher("fe/x").unwrap();
    let on = Filter {
        expr: Some(r#"status == "ON""#.into()),
        ..Filter::default()
    };
    let sub = b
        .subscribe_with("fe/x", SubscriberQos::default().filter(on))
        .unwrap();
    wait_for("the filter declared to the publisher", T, || {
        p.subscriber_count() == 1 && a.stats().filters_declared == 1
    });
    let status = |s: &str| Value::Map(vec![(Value::from("status"), Value::from(s))]);
    // A number has no field `status`: the evaluation fails.
    p.put(1.5f64).unwrap();
    let st = a.stats();
    assert_eq!((st.filter_evaluations, st.filter_errors), (1, 1), "{st:?}");
    // A map whose status is "OFF": evaluated, false, no error.
    p.put(status("OFF")).unwrap();
    let st = a.stats();
    assert_eq!((st.filter_evaluations, st.filter_errors), (2, 1), "{st:?}");
    // A map whose status is "ON" passes, and is the first sample to arrive.
    p.put(status("ON")).unwrap();
    let s = next_sample(&sub);
    assert_eq!(s.key, "fe/x");
    assert_eq!(
        s.value.get("status"),
        Some(&Value::from("ON")),
        "a sample that did not pass the filter arrived: {:?}",
        s.value
    );
    assert_eq!(s.seq, 1, "filtered copies are numbered per filter and key");
    assert_eq!(sub.lost(), 0);
    assert_eq!(a.stats().filter_errors, 1);
    assert_eq!(b.stats().samples_received, 1);
}

/// docs/guarantees.md, Filters: "a data socket keeps at most 256 filters
/// (`filters_refused`)".
///
/// Broken, this looks like a publisher that keeps the 257th distinct filter
/// a subscriber declares (`filters_declared` reaching 257: every filter
/// costs an evaluation per sample, so a peer could declare without end),
/// or refuses it without counting it, or refuses a filter it already keeps.
#[test]
fn a_data_socket_refuses_its_257th_distinct_filter_and_counts_it() {
    let dir = TempDir::new("g-fcap");
    let a = open("fc", "pub", dir.path());
    let p = a.publisher("fc/x").unwrap();
    let data = own_endpoint(&a, Reliability::BestEffort);
    let ctx = zmq::Context::new();
    let raw = ctx.socket(zmq::XSUB).unwrap();
    raw.set_linger(0).unwrap();
    raw.connect(&data).unwrap();
    // Distinct filters: the same filter on different key expressions.
    let declaration = |i: usize| {
        Declaration {
            node: a.id().to_hex(),
            socket: "best_effort".into(),
            keys: format!("fc/{i}"),
            filter: Filter {
                min_period_ms: Some(100),
                ..Filter::default()
            },
        }
        .encode()
    };
    // A malformed declaration after the others: once it is counted, every
    // declaration before it on this connection has been read.
    let sentinel = &b"\x03\xa0"[..];
    for i in 0..257 {
        raw.send(declaration(i), 0).unwrap();
    }
    raw.send(sentinel, 0).unwrap();
    wait_for("the declarations read", T, || {
        let _ = p.subscriber_count(); // reads the socket
        a.stats().filters_malformed == 1
    });
    let st = a.stats();
    assert_eq!(st.filters_declared, 256, "{st:?}");
    assert_eq!(st.filters_refused, 1, "{st:?}");
    // A filter the socket keeps already is not refused; a new one is.
    raw.send(declaration(0), 0).unwrap();
    raw.send(declaration(1000), 0).unwrap();
    raw.send(sentinel, 0).unwrap();
    wait_for("the second declarations read", T, || {
        let _ = p.subscriber_count();
        a.stats().filters_malformed == 2
    });
    let st = a.stats();
    assert_eq!(st.filters_declared, 256, "{st:?}");
    assert_eq!(st.filters_refused, 2, "{st:?}");
    // The publisher goes on.
    p.put(1u64).unwrap();
}

// ------------------------------------------------------ History replies

/// A subscription asking for the last sample of a forged publisher that
/// keeps history (an `XPUB` of this test, which reads the query): the
/// forger answers garbage (`answer_garbage`), or nothing at all. Either
/// way the query is counted unanswered after 2 s, `SubscriptionLive`
/// follows, and live samples are delivered.
fn history_query_to_a_forger(tag: &str, answer_garbage: bool) {
    let dir = TempDir::new(tag);
    let node = open("hq", "victim", dir.path());
    let (_ctx, xpub) = forge_publisher(dir.path(), "hq", "hq/x", 5, zmq::XPUB);
    let forger = FORGER.to_hex();
    wait_for("the forged publisher in discovery", T, || {
        knows(&node, &forger, "hq/x")
    });
    let before = node.stats();
    let asked = Instant::now();
    let sub = node
        .subscribe_with("hq/**", SubscriberQos::default().last(1))
        .unwrap();
    // The forger reads the query (after the subscription's subscribe
    // messages, on the same connection).
    let end = Instant::now() + T;
    let query = loop {
        assert!(Instant::now() < end, "no history query in {T:?}");
        let msg = xpub
            .recv_bytes(0)
            .expect("the subscription's history query");
        if msg.first() == Some(&QUERY_TAG) {
            break Query::decode(&msg).expect("a well-formed query");
        }
    };
    assert_eq!(query.node, forger);
    assert_eq!(query.last, 1);
    if answer_garbage {
        let key = format!("{REPLY_KEY_PREFIX}{}", query.token);
        let reply = forged(
            "hq",
            &key,
            Kind::History,
            Encoding::Cbor,
            1,
            &[0xff, 0x00, 0x13],
        );
        xpub.send(reply, 0).unwrap();
    }
    // No sample, then `SubscriptionLive` once the query times out.
    let end = Instant::now() + T;
    loop {
        assert!(Instant::now() < end, "no SubscriptionLive in {T:?}");
        match sub.recv_timeout(T).expect("SubscriptionLive in time") {
            Event::SubscriptionLive => break,
            Event::Sample(s) => panic!("a sample before the history query ended: {s:?}"),
            _ => {}
        }
    }
    let waited = asked.elapsed();
    if answer_garbage {
        wait_for("the garbage reply counted", T, || {
            let _ = sub.try_recv();
            node.stats().frames_malformed > before.frames_malformed
        });
    }
    let after = node.stats();
    assert_eq!(
        after.history_queries_unanswered - before.history_queries_unanswered,
        1,
        "{after:?}"
    );
    assert_eq!(
        after.frames_malformed - before.frames_malformed,
        u64::from(answer_garbage),
        "{after:?}"
    );
    assert!(
        waited >= Duration::from_secs(2),
        "the subscription went live after {waited:?}, before the 2 s a query is given"
    );
    // The subscription goes on live.
    xpub.send(
        forged("hq", "hq/x", Kind::Sample, Encoding::Raw, 1, b"live"),
        0,
    )
    .unwrap();
    let s = next_sample(&sub);
    assert_eq!((s.key.as_str(), s.seq), ("hq/x", 1));
    assert_eq!(s.value, Value::Bytes(milonga::Bytes::from_static(b"live")));
}

/// docs/guarantees.md, Last value, history and repair: "A malformed history
/// ... reply is dropped and counted (`frames_malformed`); an unanswered
/// query times out after 2 s (`history_queries_unanswered`) and the
/// subscription goes on live".
///
/// Broken, this looks like a garbage reply to a subscription's query that
/// is not counted, or that ends the query (the subscription goes live
/// without the 2 s), or panics the subscriber, or leaves the query waiting
/// for ever (no `SubscriptionLive`, no live sample).
#[test]
fn a_malformed_history_reply_is_counted_and_the_query_times_out_into_live() {
    history_query_to_a_forger("g-hgarbage", true);
}

/// docs/guarantees.md, Last value, history and repair: "an unanswered query
/// times out after 2 s (`history_queries_unanswered`) and the subscription
/// goes on live".
///
/// Broken, this looks like a subscription that waits for ever for a
/// publisher that never answers its query (no `SubscriptionLive`, its
/// samples held), or goes live without counting the unanswered query, or
/// gives up before the 2 s.
#[test]
fn a_withheld_history_reply_times_out_is_counted_and_the_subscription_goes_on_live() {
    history_query_to_a_forger("g-hsilent", false);
}

// ---------------------------------------------------------------- Bad input

/// docs/guarantees.md: "no duplicate": a late copy of a recently delivered
/// sample (the same publisher reached on two paths, one lagging) is
/// dropped and counted, not delivered as a sequence that went back.
///
/// Broken, this looks like the copy delivered again (a duplicate reaching
/// the application) and counted in `sequence_resets`.
#[test]
fn a_late_copy_of_a_recent_sample_is_dropped_as_a_duplicate() {
    let dir = TempDir::new("g-copy");
    let node = open("gc", "victim", dir.path());
    let sub = node.subscribe("gc/**").unwrap();
    let (_ctx, pubsock) = forge_publisher(dir.path(), "gc", "gc/x", 0, zmq::PUB);
    wait_for("the subscriber to connect to the forged node", T, || {
        sub.connected_endpoints() == 1
    });
    let next = until_delivered(&pubsock, &sub, &node, "gc", "gc/x", 1);
    let send = |seq: u64| {
        let f = forged("gc", "gc/x", Kind::Sample, Encoding::Raw, seq, b"x");
        pubsock.send(f, 0).unwrap();
    };
    for seq in next..next + 5 {
        send(seq);
    }
    loop {
        if next_sample(&sub).seq == next + 4 {
            break;
        }
    }
    let before = node.stats();
    // Late copies of three delivered samples, then the next one.
    for seq in [next + 1, next + 3, next + 2, next + 5] {
        send(seq);
    }
    let s = next_sample(&sub);
    assert_eq!(s.seq, next + 5, "a copy was delivered");
    let after = node.stats();
    let delta = |f: fn(&milonga::NodeStats) -> u64| f(&after) - f(&before);
    assert_eq!(delta(|s| s.samples_duplicate), 3, "{after:?}");
    assert_eq!(delta(|s| s.sequence_resets), 0, "{after:?}");
    assert_eq!(delta(|s| s.samples_lost), 0, "{after:?}");
}

/// docs/guarantees.md, Bad input: "a sequence number that goes backwards |
/// `sequence_resets` (delivered; the baseline restarts so one forged frame
/// cannot mute a stream)".
///
/// Broken, this looks like a sample whose sequence number went back that is
/// dropped (muting the stream until it passes its old number), counted as
/// a duplicate, a jump or a loss, or not counted; or a baseline that does
/// not restart, so that the next sample (seq 2, after the reset to 1) is
/// counted as a second reset.
#[test]
fn a_sequence_that_goes_back_is_delivered_counted_as_a_reset_and_restarts_the_baseline() {
    let dir = TempDir::new("g-reset");
    let node = open("gr", "victim", dir.path());
    let sub = node.subscribe("gr/**").unwrap();
    let (_ctx, pubsock) = forge_publisher(dir.path(), "gr", "gr/x", 0, zmq::PUB);
    wait_for("the subscriber to connect to the forged node", T, || {
        sub.connected_endpoints() == 1
    });
    let next = until_delivered(&pubsock, &sub, &node, "gr", "gr/x", 1);
    // Three in a row, up to `next + 2` (at least 4), all read.
    for seq in next..next + 3 {
        let f = forged("gr", "gr/x", Kind::Sample, Encoding::Raw, seq, b"ok");
        pubsock.send(f, 0).unwrap();
    }
    loop {
        let s = next_sample(&sub);
        assert!(s.seq <= next + 2, "{s:?}");
        if s.seq == next + 2 {
            break;
        }
    }
    let before = node.stats();
    let send = |seq: u64| {
        let f = forged("gr", "gr/x", Kind::Sample, Encoding::Raw, seq, b"back");
        pubsock.send(f, 0).unwrap();
    };
    // 0 was never delivered (1 may have been: a late copy of a delivered
    // sample is a duplicate, a_late_copy_of_a_recent_sample_is_dropped_as_a_duplicate).
    send(0);
    let s = next_sample(&sub);
    assert_eq!(s.seq, 0, "the sample that went back was not delivered");
    send(1);
    let s = next_sample(&sub);
    assert_eq!(s.seq, 1, "the sample after the reset was not delivered");
    let after = node.stats();
    let delta = |f: fn(&milonga::NodeStats) -> u64| f(&after) - f(&before);
    assert_eq!(delta(|s| s.sequence_resets), 1, "{after:?}");
    assert_eq!(delta(|s| s.sequence_jumps), 0, "{after:?}");
    assert_eq!(delta(|s| s.samples_duplicate), 0, "{after:?}");
    assert_eq!(delta(|s| s.samples_lost), 0, "{after:?}");
    assert_eq!(delta(|s| s.samples_received), 2, "{after:?}");
    assert_eq!(sub.lost(), 0);
}

/// docs/guarantees.md, Bad input: "a put larger than `max_message_bytes` |
/// `PutError::TooLarge` to the caller".
///
/// Broken, this looks like a put over the limit that returns `Ok` (or
/// another error), or that sends the sample anyway or takes its sequence
/// number: the subscriber would then receive it, or see the next sample
/// as seq 2 with one lost, and `samples_sent` would count it.
#[test]
fn a_put_over_max_message_bytes_returns_too_large_and_sends_nothing() {
    let dir = TempDir::new("g-large");
    let limit = 16 << 10;
    let mut cfg = config("tl", "pub", dir.path());
    cfg.max_message_bytes = limit;
    let a = Node::open_with(cfg).expect("open node");
    let b = open("tl", "sub", dir.path());
    let p = a.publisher("tl/x").unwrap();
    let sub = b.subscribe("tl/x").unwrap();
    wait_for("the subscription", T, || p.subscriber_count() == 1);
    // 32 KiB of f64.
    match p.put(vec![0.5f64; 4096]) {
        Err(PutError::TooLarge { size, limit: l }) => {
            assert_eq!(l, limit);
            assert!(
                size > limit,
                "{size} bytes reported over a limit of {limit}"
            );
        }
        other => panic!("a put over max_message_bytes returned {other:?}"),
    }
    match p.try_put(vec![0.5f64; 4096]) {
        Err(PutError::TooLarge { .. }) => {}
        other => panic!("a try_put over max_message_bytes returned {other:?}"),
    }
    assert_eq!(a.stats().samples_sent, 0);
    p.put(1.0f64).unwrap();
    let s = next_sample(&sub);
    assert_eq!(s.value, Value::Float(1.0), "the over-size sample arrived");
    assert_eq!(s.seq, 1, "the over-size sample took a sequence number");
    assert_eq!(a.stats().samples_sent, 1);
    assert_eq!(sub.lost(), 0);
    assert!(b.stats().bytes_received < limit as u64);
}

/// docs/guarantees.md, Bad input: "malformed control request |
/// `control_malformed`", and the node goes on.
///
/// Broken, this looks like garbage on the control ROUTER that is not
/// counted, that is answered (the first reply the raw client reads would
/// not be the answer to its good request), or that stops the node
/// answering `info` (the good request or `Node::query` times out).
#[test]
fn malformed_control_requests_are_counted_and_the_node_goes_on_answering() {
    let dir = TempDir::new("g-ctl");
    let node = open("ctl", "target", dir.path());
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.set_rcvtimeo(T.as_millis() as i32).unwrap();
    dealer.connect(node.control_endpoint()).unwrap();
    dealer.send(&b"hello"[..], 0).unwrap();
    dealer
        .send_multipart([CONTROL_MAGIC, &b"shutdown"[..]], 0)
        .unwrap();
    dealer
        .send_multipart([&b"MILONGA-CTL/9"[..], CONTROL_INFO], 0)
        .unwrap();
    dealer
        .send_multipart([CONTROL_MAGIC, CONTROL_INFO, &b"extra"[..]], 0)
        .unwrap();
    wait_for("the malformed requests counted", T, || {
        node.stats().control_malformed == 4
    });
    dealer
        .send_multipart([CONTROL_MAGIC, CONTROL_INFO], 0)
        .unwrap();
    let reply = dealer
        .recv_multipart(0)
        .expect("an answer to a good request after the garbage");
    assert_eq!(reply.len(), 3, "{reply:?}");
    assert_eq!(&reply[0][..], CONTROL_MAGIC);
    assert_eq!(&reply[1][..], CONTROL_INFO);
    let info: NodeInfo = serde_json::from_slice(&reply[2]).expect("a NodeInfo");
    assert_eq!(info.announcement.node_id, node.id().to_hex());
    assert_eq!(info.stats.control_malformed, 4);
    assert!(node.query(node.control_endpoint(), T).is_some());
    assert_eq!(node.stats().control_malformed, 4);
}

/// docs/guarantees.md, Bad input: "a gossip request whose endpoint is
/// not where it came from | `gossip_readdressed`"; a genuine one is learned.
///
/// Broken, this looks like a node that starts asking an address a request
/// merely named (any client could then point a node at any address), one
/// that is not counted, an asker that gets no answer, a genuine asker that
/// is never asked back, or the node's peers told to a plain `info` or to
/// another domain.
#[test]
fn a_gossip_asker_is_learned_only_at_the_address_it_came_from() {
    let dir = TempDir::new("g-gossip");
    let node = open("gsp", "target", dir.path());
    let ctx = zmq::Context::new();
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.set_rcvtimeo(T.as_millis() as i32).unwrap();
    dealer.connect(node.control_endpoint()).unwrap();
    let ask = |control: &str, domain: &str| {
        dealer
            .send_multipart(
                [
                    CONTROL_MAGIC,
                    &b"gossip"[..],
                    control.as_bytes(),
                    domain.as_bytes(),
                ],
                0,
            )
            .unwrap();
        let reply = dealer.recv_multipart(0).expect("gossip is answered");
        assert_eq!(&reply[1][..], CONTROL_INFO);
        serde_json::from_slice::<NodeInfo>(&reply[2]).expect("a NodeInfo")
    };
    // Control ROUTERs of our own on loopback, which the node must ask.
    let asker = || {
        let router = ctx.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.set_rcvtimeo(T.as_millis() as i32).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let ep = router.get_last_endpoint().unwrap().unwrap();
        (router, ep)
    };
    let asked_frames = |router: &zmq::Socket| {
        let asked = router.recv_multipart(0).expect("the node asks the asker");
        asked[1..].to_vec()
    };
    let own_gossip = [
        CONTROL_MAGIC.to_vec(),
        b"gossip".to_vec(),
        node.control_endpoint().as_bytes().to_vec(),
        b"gsp".to_vec(),
    ];
    // A forged address: the request comes from 127.0.0.1, so the node
    // asks 127.0.0.1 at the port named, never 10.9.9.9.
    let (forged, forged_ep) = asker();
    let port = forged_ep.rsplit_once(':').unwrap().1;
    let info = ask(&format!("tcp://10.9.9.9:{port}"), "gsp");
    assert_eq!(info.announcement.node_id, node.id().to_hex());
    assert_eq!(info.stats.gossip_readdressed, 1);
    assert_eq!(
        asked_frames(&forged),
        own_gossip,
        "asked at the address it came from"
    );
    // Another domain: answered with no peers, not learned.
    let (_other, other_ep) = asker();
    let info = ask(&other_ep, "elsewhere");
    assert!(info.peers.is_empty(), "{:?}", info.peers);
    assert_eq!(node.stats().peers_foreign_domain, 1);
    // A genuine asker, once the forged one answered: asked back, and told
    // of the nodes the node has checked (the first asker).
    forged
        .send_multipart(
            [
                &asked_frames_id(&forged, &node)[..],
                CONTROL_MAGIC,
                CONTROL_INFO,
                &serde_json::to_vec(&fake_info(&node, "gsp", &forged_ep)).unwrap(),
            ],
            0,
        )
        .unwrap();
    let (genuine, genuine_ep) = asker();
    wait_for("the node to know the first asker", T, || {
        node.peers().iter().any(|p| p.control == forged_ep)
    });
    let info = ask(&genuine_ep, "gsp");
    assert_eq!(info.peers, [forged_ep.as_str()], "told what it checked");
    assert_eq!(asked_frames(&genuine), own_gossip);
    // A plain info is told no peers.
    dealer
        .send_multipart([CONTROL_MAGIC, CONTROL_INFO], 0)
        .unwrap();
    let reply = dealer.recv_multipart(0).unwrap();
    let info: NodeInfo = serde_json::from_slice(&reply[2]).unwrap();
    assert!(info.peers.is_empty(), "{:?}", info.peers);
    assert_eq!(node.stats().gossip_readdressed, 1);
    assert_eq!(node.stats().control_malformed, 0);
}

/// The routing identity of the node's next request on `router`.
fn asked_frames_id(router: &zmq::Socket, _node: &Node) -> Vec<u8> {
    router.recv_multipart(0).expect("the node asks again")[0].clone()
}

/// A NodeInfo for a fake node of `domain` answering at `control`.
fn fake_info(node: &Node, domain: &str, control: &str) -> NodeInfo {
    let mut info = node
        .query(node.control_endpoint(), T)
        .expect("the node answers");
    info.announcement.node_id = "cd".repeat(16);
    info.announcement.name = "fake".into();
    info.announcement.domain = domain.into();
    info.announcement.control = control.into();
    info.announcement.publications.clear();
    info.announcement.data_best_effort = None;
    info.announcement.data_reliable = None;
    info.announcement.liveliness = None;
    info.peers.clear();
    info
}

/// A node told by gossip of a node it already asks, at another endpoint
/// (another address of a node on several networks), keeps using the
/// address it has.
///
/// Broken, this looks like the peer's endpoints switching to the address
/// gossip told (the last answer winning): subscriptions reconnect, and an
/// address of a network this node is not on would make it unreachable.
#[test]
fn gossip_of_a_known_node_at_another_address_changes_nothing() {
    let dir_a = TempDir::new("g-alias-a");
    let dir_b = TempDir::new("g-alias-b");
    // `b`'s control socket listens on every loopback address: reached at
    // 127.0.0.1 and at 127.0.0.2, it is one node at two addresses (as a
    // node on two networks is).
    let port = milonga_testkit::free_port();
    let mut cfg = config("alias", "b", dir_b.path());
    cfg.local_discovery = false;
    cfg.control_endpoint = Some(format!("tcp://0.0.0.0:{port}"));
    // Listening on every address turns `auto` security on; this test is
    // about addresses, with the plain peers of the rest of this file.
    cfg.security = milonga::Security::Off;
    let b = Node::open_with(cfg).unwrap();
    let _p = b.publisher("alias/x").unwrap();
    let known_at = format!("tcp://127.0.0.1:{port}");
    let alias = format!("tcp://127.0.0.2:{port}");
    // A fake peer whose replies tell of `b` at the other address.
    let ctx = zmq::Context::new();
    let fake = ctx.socket(zmq::ROUTER).unwrap();
    fake.set_linger(0).unwrap();
    fake.bind("tcp://127.0.0.1:*").unwrap();
    let fake_ep = fake.get_last_endpoint().unwrap().unwrap();
    let mut cfg = config("alias", "a", dir_a.path());
    cfg.local_discovery = false;
    cfg.peers = vec![known_at.clone(), fake_ep];
    let a = Node::open_with(cfg).unwrap();
    let b_id = b.id().to_hex();
    let control_of_b = || {
        a.peers()
            .into_iter()
            .find(|p| p.node_id == b_id)
            .map(|p| p.control)
    };
    wait_for("a to know b at 127.0.0.1", T, || {
        control_of_b().as_deref() == Some(known_at.as_str())
    });
    let mut fake_info = a.query(&known_at, T).expect("b answers");
    fake_info.announcement.node_id = "ab".repeat(16);
    fake_info.announcement.name = "fake".into();
    fake_info.peers = vec![alias.clone()];
    let body = serde_json::to_vec(&fake_info).unwrap();
    // Four answers, 500 ms apart: `a` learns the alias from the first,
    // asks it at once, and `b` answers there well before the last; `b`'s
    // address is checked all along.
    let end = Instant::now() + T;
    let mut answered = 0;
    while answered < 4 {
        assert!(Instant::now() < end, "a stopped asking the fake peer");
        if fake.poll(zmq::POLLIN, 5).unwrap() > 0 {
            let req = fake.recv_multipart(0).unwrap();
            fake.send_multipart([&req[0][..], CONTROL_MAGIC, CONTROL_INFO, &body], 0)
                .unwrap();
            answered += 1;
        }
        assert_eq!(
            control_of_b().as_deref(),
            Some(known_at.as_str()),
            "b's address changed after gossip told {alias}"
        );
    }
}

/// docs/guarantees.md, Bad input: "a request from another domain |
/// `frames_foreign_domain`, answered `rejected` / `wrong_domain`".
///
/// Broken, this looks like a request whose domain tag is another domain's
/// that runs the handler, or gets no answer (the caller waits for its
/// deadline), or an answer of another status or kind, or is not counted
/// in `frames_foreign_domain`.
#[test]
fn a_service_request_of_another_domain_is_rejected_wrong_domain_and_counted() {
    let dir = TempDir::new("g-svcdom");
    let server = open("svcd", "server", dir.path());
    let (_svc, ran, _ctx, dealer) = counted_echo(&server, "sd/echo");
    let request = |domain: &str, seq: u64| {
        let header = Header {
            kind: Kind::Request,
            flags: 0,
            encoding: Encoding::Cbor,
            domain_tag: domain_tag(domain),
            schema_id: 0,
            node_id: NodeId([7; 16]),
            seq,
            timestamp_ns: 1,
        };
        // CBOR 5.
        frame::encode(&Key::new("sd/echo").unwrap(), &header, &[0x05])
    };
    let before = server.stats();
    dealer.send(request("elsewhere", 77), 0).unwrap();
    let reply = dealer.recv_multipart(0).expect("an answer to the request");
    assert_eq!(reply.len(), 1, "{reply:?}");
    let view = frame::decode(&reply[0]).expect("a reply frame");
    assert_eq!(view.header.kind, Kind::Reply);
    assert_eq!(
        view.header.seq, 77,
        "the reply answers the request's call id"
    );
    assert_eq!(view.key, "sd/echo");
    assert_eq!(view.body.first(), Some(&(ReplyStatus::Rejected as u8)));
    let failure = Failure::decode(&view.body[1..]).expect("a failure body");
    assert_eq!(failure.kind, "wrong_domain", "{failure:?}");
    let after = server.stats();
    assert_eq!(
        after.frames_foreign_domain - before.frames_foreign_domain,
        1,
        "{after:?}"
    );
    assert_eq!(after.calls_served, before.calls_served);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler ran");
    // The same request in the service's own domain is served.
    dealer.send(request("svcd", 78), 0).unwrap();
    let reply = dealer.recv_multipart(0).expect("an answer to the request");
    let view = frame::decode(&reply[0]).expect("a reply frame");
    assert_eq!(view.header.seq, 78);
    assert_eq!(view.body.first(), Some(&(ReplyStatus::Ok as u8)));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

/// docs/guarantees.md, bad input: "a malformed request to a service (no
/// call id to answer)" is counted in `frames_malformed`, and the service
/// goes on.
///
/// Broken, this looks like a service thread that stops (or panics) on
/// bytes that are not a request frame, a handler run on them, or drops
/// nobody counts.
#[test]
fn a_malformed_service_request_is_counted_and_the_service_goes_on() {
    let dir = TempDir::new("g-svcbad");
    let server = open("svcb", "server", dir.path());
    let (_svc, ran, _ctx, dealer) = counted_echo(&server, "sb/echo");
    let before = server.stats().frames_malformed;
    // Random bytes, a truncated header, three frames.
    dealer.send(&b"not a frame at all"[..], 0).unwrap();
    dealer.send(&[1u8, 2][..], 0).unwrap();
    dealer.send_multipart([&b"a"[..], b"b", b"c"], 0).unwrap();
    wait_for("the bad requests counted", T, || {
        server.stats().frames_malformed - before == 3
    });
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a handler ran on garbage");
    // A real call is served by the same service.
    let client = open("svcb", "client", dir.path());
    wait_for("the service in discovery", T, || {
        client
            .peers()
            .iter()
            .any(|a| a.services.iter().any(|s| s.key == "sb/echo"))
    });
    assert_eq!(
        client.call("sb/echo", 5, T).unwrap(),
        milonga::Value::from(5)
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------- Discovery

/// Set in the child process that
/// [`the_runtime_directory_is_created_mode_0700_and_an_open_default_one_is_refused`]
/// starts with its own `XDG_RUNTIME_DIR` (setting it in this process would
/// race with the other tests' threads).
const RUNTIME_CHILD: &str = "MILONGA_GUARANTEES_RUNTIME_CHILD";

/// docs/guarantees.md, Discovery: "The default runtime directory must
/// belong to the user and be closed to others (mode 0700), so no other user
/// can plant announcements".
///
/// Broken, this looks like a runtime directory (given, or the default
/// `$XDG_RUNTIME_DIR/milonga`) or domain directory created with the umask's
/// mode (0755: others can list it, and a group- or world-writable one lets
/// them plant announcements), or a default directory opened to others that
/// a node still opens.
#[test]
fn the_runtime_directory_is_created_mode_0700_and_an_open_default_one_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    if std::env::var_os(RUNTIME_CHILD).is_some() {
        // The child: the default runtime directory, under the parent's
        // temporary XDG_RUNTIME_DIR.
        let xdg = std::path::PathBuf::from(
            std::env::var_os("XDG_RUNTIME_DIR").expect("XDG_RUNTIME_DIR set by the parent"),
        );
        let root = xdg.join("milonga");
        let node = Node::open_with(Config::new("milonga:///rtd", "default"))
            .expect("open a node in the default runtime directory");
        assert_eq!(mode(&root), 0o700, "{}", root.display());
        assert_eq!(mode(&root.join("rtd")), 0o700);
        node.close();
        drop(node);
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = Node::open_with(Config::new("milonga:///rtd", "second"))
            .expect_err("a default runtime directory open to others was used");
        assert!(matches!(err, OpenError::RuntimeDir { .. }), "{err}");
        assert!(err.to_string().contains("mode 0700"), "{err}");
        std::fs::write(xdg.join("child-passed"), b"ok").unwrap();
        return;
    }
    // A runtime directory given in the configuration, created with its
    // parents.
    let dir = TempDir::new("g-rtdir");
    let root = dir.path().join("nested").join("runtime");
    let mut cfg = Config::new("milonga:///rtd", "explicit");
    cfg.runtime_dir = Some(root.clone());
    let node = Node::open_with(cfg).expect("open node");
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&root.join("rtd")), 0o700);
    drop(node);
    // The default one, in a child process of this test alone.
    let xdg = TempDir::new("g-xdg");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "the_runtime_directory_is_created_mode_0700_and_an_open_default_one_is_refused",
        "--exact",
        "--test-threads=1",
    ])
    .env(RUNTIME_CHILD, "1")
    .env("XDG_RUNTIME_DIR", xdg.path());
    let mut child = Proc::spawn(cmd);
    let status = child
        .wait_exit(Duration::from_secs(60))
        .expect("the child test to end");
    let mut out = Vec::new();
    while let Some(line) = child.line(Duration::from_millis(100)) {
        out.push(line);
    }
    assert!(status.success(), "the child test failed: {out:#?}");
    assert!(
        xdg.path().join("child-passed").exists(),
        "the child ran no test: {out:#?}"
    );
}

/// docs/guarantees.md, Discovery: "A subscription declared after
/// `Node::open` connects to the publishers that existed at `open` before
/// `subscribe` returns".
///
/// Broken, this looks like a subscription that has no data connection when
/// `subscribe` returns (`connected_endpoints()` 0): the node learns of the
/// publisher only at its thread's first scan instead of in `open`, or the
/// subscription is connected later by that thread instead of by
/// `subscribe` under the state lock. (What is put right after `subscribe`
/// may still miss it: the connection is made, not yet established.)
#[test]
fn a_subscription_declared_after_open_connects_before_subscribe_returns() {
    let dir = TempDir::new("g-early");
    let a = open("early", "pub", dir.path());
    let p = a.publisher("early/x").unwrap();
    // The publisher exists (its announcement is written) before `open`.
    let b = open("early", "sub", dir.path());
    let sub = b.subscribe("early/x").unwrap();
    assert_eq!(
        sub.connected_endpoints(),
        1,
        "subscribe returned before connecting to a publisher that existed at open"
    );
    // The connection is a real one.
    wait_for("the publisher to hear the subscription", T, || {
        p.subscriber_count() == 1
    });
    p.put(7u64).unwrap();
    let s = next_sample(&sub);
    assert_eq!(s.publisher, a.id());
    assert_eq!(s.seq, 1);
    assert_eq!(s.value, Value::from(7u64));
}

/// A node of `domain` with a lease of 500 ms (heartbeats every 100 ms).
fn short_lease_node(domain: &str, name: &str, dir: &Path) -> Node {
    let mut c = config(domain, name, dir);
    c.heartbeat_interval_ms = 100;
    c.heartbeat_timeout_ms = 500;
    Node::open_with(c).unwrap()
}

/// A reliable subscriber whose application does not read for four leases:
/// the reliable publisher waits (or its samples wait in queues), and once
/// the application reads again every sample comes, in order. Broken, the
/// subscriber's socket timed out its own connection while it was not
/// reading (libzmq's heartbeat timeout ends only at a message read), and
/// what was sent until it reconnected vanished without a loss report.
#[test]
fn a_reliable_subscriber_that_stops_reading_for_a_while_gets_every_sample_after() {
    let dir = TempDir::new("stall");
    let short_lease = |name| short_lease_node("stall", name, dir.path());
    let subscribing = short_lease("sub");
    let sub = subscribing
        .subscribe_with("stall/k", SubscriberQos::default().reliable())
        .unwrap();
    let publishing = short_lease("pub");
    let p = publishing
        .publisher_with("stall/k", milonga::PublisherQos::reliable())
        .unwrap();
    wait_for("a subscriber", T, || p.subscriber_count() > 0);
    // Four leases of puts, one every 100 us (paced, so that the two
    // seconds pass whatever the machine's speed), none read meanwhile.
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        p.put(sent as f64).unwrap();
        sent += 1;
        std::thread::sleep(Duration::from_micros(100));
    }
    let mut seqs = Vec::new();
    let end = Instant::now() + T;
    while (seqs.len() as u64) < sent && Instant::now() < end {
        match sub.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Sample(s)) => seqs.push(s.seq),
            Ok(Event::Lost(l)) => panic!("{} lost after {} samples", l.count, seqs.len()),
            _ => {}
        }
    }
    milonga_testkit::in_order_from_1(&seqs, sent).unwrap();
    assert_eq!(subscribing.stats().connections_closed, 0);
}

/// A best-effort subscriber over TCP whose application does not read for
/// four leases while its publisher floods it: its connection stays (the
/// publisher closes one only when the subscriber's I/O thread stops
/// sending PINGs, and sets no `TCP_USER_TIMEOUT`, which would end a
/// connection whose window stays closed that long), what did not fit in
/// the queues is reported lost, exactly, and delivery goes on. Broken,
/// the publisher's kernel ended the connection within half a second of
/// the window closing, and the subscriber reconnected.
#[test]
fn a_best_effort_subscriber_that_stops_reading_keeps_its_connection_and_counts_its_losses() {
    let dir = TempDir::new("stallbe");
    let short_lease = |name| short_lease_node("stallbe", name, dir.path());
    let subscribing = short_lease("sub");
    let sub = subscribing.subscribe("stallbe/k").unwrap();
    let publishing = short_lease("pub");
    let p = publishing.publisher("stallbe/k").unwrap();
    wait_for("a subscriber", T, || p.subscriber_count() > 0);
    // 16 KiB samples (below the shared-memory threshold: through the
    // socket), one every 100 us for four leases, none read: far more
    // than the queues and the kernel's buffers hold, so the window closes.
    let value = Value::Bytes(vec![7u8; 16 << 10].into());
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        p.put(value.clone()).unwrap();
        sent += 1;
        std::thread::sleep(Duration::from_micros(100));
    }
    // Then one put every 10 ms while reading, until the subscriber has
    // caught up with the last one put.
    let (mut received, mut lost, mut last) = (0u64, 0u64, 0u64);
    let end = Instant::now() + T;
    let mut next_put = Instant::now();
    while last < sent && Instant::now() < end {
        if Instant::now() >= next_put {
            p.put(value.clone()).unwrap();
            sent += 1;
            next_put += Duration::from_millis(10);
        }
        match sub.recv_timeout(Duration::from_millis(5)) {
            Ok(Event::Sample(s)) => {
                received += 1;
                last = s.seq;
            }
            Ok(Event::Lost(l)) => lost += l.count,
            _ => {}
        }
    }
    assert_eq!(last, sent, "the last sample put arrives");
    assert_eq!(
        received + lost,
        sent,
        "every sample received or reported lost"
    );
    assert!(lost > 0, "the stall overflowed the queues");
    assert_eq!(subscribing.stats().connections_closed, 0);
    assert_eq!(publishing.stats().peer_disconnects, 0);
}

/// The low-latency mode (`recv_spin_us`): a subscription that polls
/// before blocking receives every sample in order, and a `recv_timeout`
/// still ends (the polling is bounded by the wait).
#[test]
fn a_spinning_subscription_receives_everything_and_its_waits_end() {
    let dir = TempDir::new("spin");
    let domain = "spin";
    let publishing = open(domain, "pub", dir.path());
    let mut cfg = config(domain, "spinner", dir.path());
    cfg.recv_spin_us = 200;
    let spinning = Node::open_with(cfg).unwrap();
    let p = publishing
        .publisher_with("spin/x", milonga::PublisherQos::reliable())
        .unwrap();
    let sub = spinning.subscribe("spin/x").unwrap();
    wait_for("the subscriber", T, || p.subscriber_count() > 0);
    for i in 1..=500 {
        p.put(Value::Int(i.into())).unwrap();
        if i % 50 == 0 {
            // Now and then the subscriber catches up and waits.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    for i in 1..=500 {
        assert_eq!(next_sample(&sub).value, Value::Int(i.into()));
    }
    // A wait spins 200 us, then blocks for the rest: it ends at its
    // timeout, neither before (the spin counted twice, or not waited) nor
    // long after (the spin never giving way to the blocking wait).
    let t = Instant::now();
    assert!(matches!(
        sub.recv_timeout(Duration::from_millis(20)),
        Err(milonga::RecvError::Timeout)
    ));
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(20) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}

/// A status record of the kind a device server sends many of: small,
/// alike from one to the next.
fn status_record(i: i64) -> Value {
    let t = |k: &str| Value::Text(k.into());
    Value::Map(vec![
        (t("device"), t("sr/ps/quadrupole-17")),
        (t("state"), t(if i % 50 == 0 { "FAULT" } else { "ON" })),
        (
            t("current_a"),
            Value::Float(120.25 + (i % 7) as f64 * 0.125),
        ),
        (t("voltage_v"), Value::Float(48.5 - (i % 5) as f64 * 0.25)),
        (t("temperature_c"), Value::Float(31.0 + (i % 3) as f64)),
        (t("interlock"), Value::Bool(false)),
        (t("count"), Value::Int(i.into())),
    ])
}

/// The samples of `sub` until `n` came, in order from `first`, each the
/// status record of its number.
fn expect_records(sub: &milonga::Subscriber, first: i64, n: usize) {
    for k in 0..n {
        let s = next_sample(sub);
        let i = first + k as i64;
        assert_eq!(s.value, status_record(i), "record {i}");
    }
}

/// zstd with a dictionary (docs/compression.md, "Dictionaries"): the
/// publisher trains one from its first 128 samples, then compresses small
/// samples with it; a subscriber learns it when a frame names it (asked
/// once, the node's messages waiting meanwhile), live and as a late
/// joiner, and every sample arrives as it was put, in order.
#[test]
fn a_zstd_dictionary_is_trained_sent_to_who_asks_and_samples_arrive_as_put() {
    let dir = TempDir::new("dictionary");
    let domain = "dictionary";
    let publishing = open(domain, "pub", dir.path());
    let early_node = open(domain, "early", dir.path());
    let late_node = open(domain, "late", dir.path());
    let q = milonga::PublisherQos::reliable()
        .compression(milonga::Compression::zstd().dictionary().threshold(32));
    let p = publishing.publisher_with("ps/status", q).unwrap();
    let early = early_node.subscribe("ps/**").unwrap();
    wait_for("the early subscriber", T, || p.subscriber_count() > 0);
    let trained_after = milonga::DICTIONARY_TRAINING_SAMPLES;
    for i in 1..=300 {
        p.put(status_record(i)).unwrap();
    }
    expect_records(&early, 1, 300);
    let st = early_node.stats();
    assert_eq!(st.dictionaries_learned, 1, "learned once");
    assert_eq!(st.frames_unknown_dictionary, 0);
    assert_eq!(st.frames_malformed, 0);
    assert!(
        st.frames_inflated >= (300 - trained_after) as u64,
        "the samples after training arrive compressed: {}",
        st.frames_inflated
    );
    // A subscriber that joins once the dictionary is in use asks for it
    // when the first frame names it.
    let late = late_node.subscribe("ps/**").unwrap();
    wait_for("the late subscriber", T, || p.subscriber_count() > 1);
    for i in 301..=350 {
        p.put(status_record(i)).unwrap();
    }
    expect_records(&late, 301, 50);
    expect_records(&early, 301, 50);
    let st = late_node.stats();
    assert_eq!(st.dictionaries_learned, 1);
    assert_eq!(st.frames_unknown_dictionary, 0);
    assert!(st.frames_inflated >= 50);
    assert!(publishing.stats().frames_deflated >= (350 - trained_after) as u64);
}

#[test]
fn compressed_samples_arrive_as_they_were_put_live_and_from_history() {
    let dir = TempDir::new("compress");
    let domain = "compress";
    let sub_node = open(domain, "sub", dir.path());
    let sub = sub_node.subscribe("cz/**").unwrap();
    // A node that takes only a compressed key: its bytes received show
    // what compression saved.
    let zsub_node = open(domain, "zsub", dir.path());
    let zsub = zsub_node.subscribe("cz/zstd").unwrap();
    // One publisher with zstd from its QoS, one with LZ4 from the node's
    // settings, one plain: the same values reach the subscriber.
    let mut lz4_cfg = config(domain, "lz4", dir.path());
    lz4_cfg.compression = "lz4".into();
    let zstd_node = open(domain, "zstd", dir.path());
    let lz4_node = Node::open_with(lz4_cfg).unwrap();
    let plain_node = open(domain, "plain", dir.path());
    let zq = milonga::PublisherQos::reliable()
        .history(2)
        .compression(milonga::Compression::zstd());
    let pubs = [
        ("cz/zstd", zstd_node.publisher_with("cz/zstd", zq).unwrap()),
        ("cz/lz4", lz4_node.publisher("cz/lz4").unwrap()),
        ("cz/plain", plain_node.publisher("cz/plain").unwrap()),
    ];
    for (key, _) in &pubs {
        wait_for("the publication in discovery", T, || {
            sub_node
                .peers()
                .iter()
                .any(|a| a.publications.iter().any(|p| p.key == *key))
        });
    }
    // A long text, and a typed array past the zero-copy threshold (its own
    // frame when plain, joined and compressed otherwise).
    let text = Value::from("beam current 12.5 mA, vacuum 1e-9 mbar; ".repeat(200));
    let ramp: Vec<f64> = (0..20_000).map(|i| f64::from(i % 100)).collect();
    let array = Value::Typed(milonga::wire::value::TypedArray::from_vec(ramp));
    let received_before = zsub_node.stats().bytes_received;
    let mut got = std::collections::BTreeMap::new();
    let mut zgot = 0u64;
    wait_for("every value from every publisher", T, || {
        for (_, p) in &pubs {
            p.put(text.clone()).unwrap();
            p.put(array.clone()).unwrap();
        }
        while let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(50)) {
            assert!(
                s.value == text || s.value == array,
                "{}: a value as put",
                s.key
            );
            *got.entry(s.key.clone()).or_insert(0) += 1;
        }
        while let Ok(Event::Sample(s)) = zsub.try_recv() {
            assert!(s.value == text || s.value == array);
            zgot += 1;
        }
        got.len() == 3 && got.values().all(|n| *n >= 2) && zgot >= 2
    });
    assert!(zstd_node.stats().frames_deflated >= 2);
    assert!(lz4_node.stats().frames_deflated >= 2);
    assert_eq!(plain_node.stats().frames_deflated, 0);
    assert!(sub_node.stats().frames_inflated >= 4);
    assert_eq!(sub_node.stats().frames_malformed, 0);
    // Far fewer bytes than the plain values would have taken, heartbeats
    // included: counted as if every sample were the 8 kB text (the array
    // is 160 kB).
    while let Ok(Event::Sample(_)) = zsub.recv_timeout(Duration::from_millis(200)) {
        zgot += 1;
    }
    let received = zsub_node.stats().bytes_received - received_before;
    assert!(
        received < zgot * 8_000 / 4,
        "{received} bytes for {zgot} samples"
    );
    // A compression setting that is none of lz4, zstd or none is refused
    // at open, set as a key or directly.
    let mut bad = config(domain, "bad", dir.path());
    assert!(bad
        .set("compression", milonga::ConfigValue::Text("gzip".into()))
        .is_err());
    bad.compression = "ZSTD".into();
    match Node::open_with(bad) {
        Err(OpenError::Config { key, .. }) => assert_eq!(key, "compression"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    // A late joiner gets the kept samples (kept plain, sent in a history
    // reply).
    let late = sub_node
        .subscribe_with("cz/zstd", milonga::SubscriberQos::default().last(2))
        .unwrap();
    let a = next_sample(&late);
    let b = next_sample(&late);
    assert_eq!((a.value, b.value), (text, array));
}

/// A reliable subscriber that is behind (its socket has stopped reading:
/// back-pressure) when its publisher goes away outlives it: it keeps its
/// process, accounts for every sample the publisher put (delivered, in
/// order, or inside a loss report), and hears the next publisher of the
/// key. Broken, libzmq 4.3.5 aborted the whole process (SIGABRT, an
/// assertion in its heartbeat) within a heartbeat interval of the hang-up,
/// and this test binary died with it (crates/zeromq-src-patched/PATCHES.md).
#[test]
fn a_reliable_subscriber_behind_survives_its_publisher_leaving() {
    let dir = TempDir::new("behind");
    let short_lease = |name| short_lease_node("behind", name, dir.path());
    let subscribing = short_lease("sub");
    let sub = subscribing
        .subscribe_with("behind/k", SubscriberQos::default().reliable())
        .unwrap();
    let publishing = short_lease("pub");
    let p = publishing
        .publisher_with("behind/k", milonga::PublisherQos::reliable())
        .unwrap();
    let publisher = publishing.id().to_string();
    wait_for("a subscriber", T, || p.subscriber_count() > 0);
    // Puts until the subscriber, which reads nothing, holds the publisher
    // back (a put that waits) or for one second, paced so that its queues
    // fill whatever the machine's speed.
    let mut sent = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        match p.put_timeout(sent as f64, Duration::from_millis(200)) {
            Ok(()) => sent += 1,
            Err(PutError::Timeout(_)) => break,
            Err(e) => panic!("put {sent}: {e}"),
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    assert!(sent > 100, "only {sent} puts");
    drop(p);
    drop(publishing);
    // The subscriber stays behind for several heartbeat intervals after the
    // hang-up: the time in which the heartbeat used to abort the process.
    std::thread::sleep(Duration::from_secs(1));
    let mut ledger = milonga_testkit::SeqLedger::default();
    let (mut lost_publisher, mut accounted) = (false, 0);
    let end = Instant::now() + T;
    while (!lost_publisher || accounted < sent) && Instant::now() < end {
        match sub.recv_timeout(Duration::from_millis(100)) {
            Ok(Event::Sample(s)) => {
                ledger.sample(&publisher, "behind/k", s.seq);
                accounted += 1;
            }
            Ok(Event::Lost(l)) => {
                ledger.lost(&publisher, "behind/k", l.first_seq, l.count);
                accounted += l.count;
            }
            Ok(Event::PublisherLost(_)) => lost_publisher = true,
            _ => {}
        }
    }
    assert!(lost_publisher, "the publisher was never reported lost");
    let streams = ledger.check().unwrap();
    assert_eq!(streams.len(), 1, "{streams:?}");
    let a = streams[0];
    assert_eq!((a.first, a.last), (1, sent), "{a:?}");
    assert!(a.delivered > 0, "{a:?}");
    // The subscription still works.
    let again = short_lease("pub2");
    let p2 = again
        .publisher_with("behind/k", milonga::PublisherQos::reliable())
        .unwrap();
    wait_for("the subscriber again", T, || p2.subscriber_count() > 0);
    p2.put(42.0).unwrap();
    let end = Instant::now() + T;
    loop {
        assert!(Instant::now() < end, "nothing from the next publisher");
        if let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(100)) {
            assert_eq!(s.value, Value::Float(42.0));
            break;
        }
    }
}
