//! A forged peer for the tests that feed a node what a Milonga publisher
//! would never send: an announcement file in the runtime directory that
//! points at a raw libzmq socket of the test, announced as node [`FORGER`].
#![allow(dead_code)] // each test crate uses its part

use std::path::Path;
use std::time::Duration;

use milonga::wire::frame::{self, domain_tag, Encoding, Header, Kind, NodeId};
use milonga::{Announcement, Event, Key, Node, PublicationInfo, Reliability};
use milonga_testkit::{free_port, process_start_time};

/// The node id forged publishers announce.
pub const FORGER: NodeId = NodeId([9; 16]);

/// A header of the forged node in `domain`.
pub fn header(domain: &str, kind: Kind, encoding: Encoding, seq: u64) -> Header {
    Header {
        kind,
        flags: 0,
        encoding,
        domain_tag: domain_tag(domain),
        schema_id: 0,
        node_id: FORGER,
        seq,
        timestamp_ns: 1,
    }
}

/// A data frame of the forged node in `domain`.
pub fn forged(
    domain: &str,
    key: &str,
    kind: Kind,
    encoding: Encoding,
    seq: u64,
    body: &[u8],
) -> Vec<u8> {
    let h = header(domain, kind, encoding, seq);
    frame::encode(&Key::internal(key).expect("a valid key"), &h, body)
}

/// A raw libzmq socket of the test (`PUB`, or `XPUB` to read what
/// subscribers send upstream) announced in `domain` as the node [`FORGER`]
/// publishing `key` best effort, keeping `history` samples. Receives time
/// out after `timeout`.
pub fn forge_publisher(
    dir: &Path,
    domain: &str,
    key: &str,
    history: usize,
    kind: zmq::SocketType,
    timeout: Duration,
) -> (zmq::Context, zmq::Socket) {
    let ctx = zmq::Context::new();
    let sock = ctx.socket(kind).unwrap();
    sock.set_linger(0).unwrap();
    sock.set_rcvtimeo(timeout.as_millis() as i32).unwrap();
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    sock.bind(&endpoint).unwrap();
    let announcement = Announcement {
        protocol: 1,
        domain: domain.into(),
        node_id: FORGER.to_hex(),
        name: "forger".into(),
        host: "localhost".into(),
        pid: std::process::id(),
        start_time: process_start_time(std::process::id()).unwrap(),
        control: "tcp://127.0.0.1:9".into(),
        data_best_effort: Some(endpoint),
        data_reliable: None,
        liveliness: None,
        publications: vec![PublicationInfo {
            key: key.into(),
            reliability: Reliability::BestEffort,
            history,
            endpoint: None,
            socket: None,
            schema: None,
        }],
        services: vec![],
        key: None,
        id_salt: None,
        via: None,
    };
    let file = dir.join(domain).join(format!("{}.json", FORGER.to_hex()));
    std::fs::write(file, serde_json::to_vec(&announcement).unwrap()).unwrap();
    (ctx, sock)
}

/// `node`'s own data endpoint of `reliability`, as it announces it.
pub fn own_endpoint(node: &Node, reliability: Reliability) -> String {
    node.peers()
        .into_iter()
        .find(|a| a.node_id == node.id().to_hex())
        .and_then(|a| a.data_endpoint(reliability).map(str::to_owned))
        .expect("the node announces that data endpoint")
}

/// Sends samples of `key` from the forged `PUB` socket until one arrives
/// (the connection is up); the next sequence number to use.
pub fn until_delivered(
    pubsock: &zmq::Socket,
    sub: &milonga::Subscriber,
    node: &Node,
    domain: &str,
    key: &str,
    mut seq: u64,
) -> u64 {
    let first = seq;
    loop {
        let f = forged(domain, key, Kind::Sample, Encoding::Raw, seq, b"ok");
        pubsock.send(f, 0).unwrap();
        seq += 1;
        // A sample sent by an earlier call may still arrive: only one of
        // this call proves that what was sent before it has been read.
        while let Ok(ev) = sub.recv_timeout(Duration::from_millis(50)) {
            if let Event::Sample(s) = ev {
                assert_eq!(s.key, key);
                if s.seq >= first {
                    while sub.try_recv().is_ok() {}
                    return seq;
                }
            }
        }
        assert!(
            seq < first + 200,
            "the forged publisher is never heard: {:?}",
            node.stats()
        );
    }
}
