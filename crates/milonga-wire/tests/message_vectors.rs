//! Golden vectors of the messages that are not data frames
//! (tests/vectors/messages/ at the repository root): history queries and
//! filter declarations (sent upstream on a data connection), control
//! requests and replies, and announcements. Each `<name>.json` holds the
//! message's frames in hex and what they mean; a valid vector must decode
//! to its meaning, and the meaning must encode back to the same frames
//! (unless the vector says `"canonical": false`: a form a decoder accepts
//! and an encoder never writes, whose canonical frames are given). An
//! invalid vector must be refused with the error named. Implementations in
//! other languages run the same check against the same files.
//!
//! `MILONGA_BLESS_VECTORS=1 cargo test -p milonga-wire --test message_vectors`
//! rewrites the files from the cases below and then fails on purpose.

mod common;
use common::{hex, unhex};

use std::collections::BTreeSet;
use std::path::PathBuf;

use milonga_wire::announce::{Announcement, PublicationInfo, Reliability, ServiceInfo};
use milonga_wire::control::{self, Request};
use milonga_wire::filter::{Declaration, Filter};
use milonga_wire::history::Query;
use milonga_wire::scout::Hello;
use serde_json::{json, Value as Json};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/messages")
}

const NODE: &str = "000102030405060708090a0b0c0d0e0f";
const TOKEN: &str = "0f0e0d0c0b0a09080706050403020100";

/// One vector: its frames and what they mean.
struct Case {
    name: &'static str,
    family: &'static str,
    description: &'static str,
    frames: Vec<Vec<u8>>,
    /// The meaning (valid), or the start of the refusal's Debug form.
    expect: Result<Json, &'static str>,
    /// For a non-canonical valid vector: the frames an encoder writes.
    canonical: Option<Vec<Vec<u8>>>,
}

fn query_json(q: &Query) -> Json {
    let mut j = json!({
        "node": q.node, "socket": q.socket, "token": q.token, "expr": q.expr,
        "last": q.last, "since": q.since,
    });
    if let Some(id) = q.id {
        j["id"] = json!(id);
    }
    if !q.schemas.is_empty() {
        j["schemas"] = json!(q.schemas);
    }
    if !q.dictionaries.is_empty() {
        j["dictionaries"] = json!(q.dictionaries);
    }
    j
}

fn query_from_json(j: &Json) -> Query {
    Query {
        node: j["node"].as_str().unwrap().into(),
        socket: j["socket"].as_str().unwrap().into(),
        token: j["token"].as_str().unwrap().into(),
        expr: j["expr"].as_str().unwrap().into(),
        last: j["last"].as_u64().unwrap(),
        since: serde_json::from_value(j["since"].clone()).unwrap(),
        id: j["id"].as_u64(),
        schemas: j["schemas"]
            .as_array()
            .map(|a| a.iter().map(|i| i.as_u64().unwrap() as u32).collect())
            .unwrap_or_default(),
        dictionaries: j["dictionaries"]
            .as_array()
            .map(|a| a.iter().map(|i| i.as_u64().unwrap() as u32).collect())
            .unwrap_or_default(),
    }
}

fn declaration_json(d: &Declaration) -> Json {
    let f = &d.filter;
    json!({
        "node": d.node, "socket": d.socket, "keys": d.keys,
        "where": f.expr, "abs_change": f.abs_change, "rel_change": f.rel_change,
        "min_period_ms": f.min_period_ms,
    })
}

fn declaration_from_json(j: &Json) -> Declaration {
    Declaration {
        node: j["node"].as_str().unwrap().into(),
        socket: j["socket"].as_str().unwrap().into(),
        keys: j["keys"].as_str().unwrap().into(),
        filter: Filter {
            expr: j["where"].as_str().map(str::to_owned),
            abs_change: j["abs_change"].as_f64(),
            rel_change: j["rel_change"].as_f64(),
            min_period_ms: j["min_period_ms"].as_u64(),
        },
    }
}

fn announcement() -> Announcement {
    Announcement {
        protocol: 1,
        domain: "lab".into(),
        node_id: NODE.into(),
        name: "ps-server@host1:4242".into(),
        host: "host1".into(),
        pid: 4242,
        start_time: 123_456,
        control: "tcp://192.0.2.1:40001".into(),
        data_best_effort: Some("tcp://192.0.2.1:40002".into()),
        data_reliable: None,
        liveliness: Some("tcp://192.0.2.1:40003".into()),
        publications: vec![PublicationInfo {
            key: "sr/ps/1/current".into(),
            reliability: Reliability::BestEffort,
            history: 10,
            endpoint: None,
            socket: None,
            schema: None,
        }],
        services: vec![ServiceInfo {
            key: "sr/ps/1/set_current".into(),
            endpoint: "tcp://192.0.2.1:40004".into(),
            workers: 1,
            max_request_bytes: 1 << 20,
        }],
        key: None,
        id_salt: None,
        via: None,
    }
}

/// Every vector, by name: the directory must hold exactly these.
const VECTORS: [&str; 20] = [
    "history_query_join",
    "history_query_schemas",
    "history_query_dictionaries",
    "history_query_repair",
    "history_query_without_since",
    "history_query_bad_token",
    "filter_declaration_where",
    "filter_declaration_changes",
    "filter_declaration_without_keys",
    "control_info_request",
    "control_gossip_request",
    "control_gossip_ipc_endpoint",
    "control_gossip_without_domain",
    "control_wrong_version",
    "control_info_reply",
    "announcement_full",
    "announcement_oldest_accepted",
    "announcement_without_control",
    "scout_hello_ask",
    "scout_hello_wrong_version",
];

fn cases() -> Vec<Case> {
    let valid = |name, family, description, frames, meaning| Case {
        name,
        family,
        description,
        frames,
        expect: Ok(meaning),
        canonical: None,
    };
    let invalid = |name, family, description, frames, error| Case {
        name,
        family,
        description,
        frames,
        expect: Err(error),
        canonical: None,
    };
    let join = Query {
        node: NODE.into(),
        socket: "reliable".into(),
        token: TOKEN.into(),
        expr: "sr/ps/**".into(),
        last: 1,
        since: vec![],
        id: None,
        schemas: Vec::new(),
        dictionaries: Vec::new(),
    };
    let repair = Query {
        since: vec![
            ("sr/ps/1/current".into(), 41),
            ("sr/ps/2/current".into(), 7),
        ],
        last: 0,
        ..join.clone()
    };
    let schema_query = Query {
        socket: "best_effort".into(),
        expr: "sr/ps/1/state".into(),
        last: 0,
        id: Some(7),
        schemas: vec![4_096_453_397],
        ..join.clone()
    };
    let dictionary_query = Query {
        socket: "reliable".into(),
        expr: "sr/ps/1/waveform".into(),
        last: 0,
        id: Some(8),
        dictionaries: vec![0x1234_5678],
        ..join.clone()
    };
    let mut no_since = join.encode();
    // The map's last pair is `"since": []` (5 + 1 bytes): drop it and
    // say the map has 5 pairs.
    no_since.truncate(no_since.len() - 7);
    no_since[1] = 0xa5;
    let mut bad_token = join.clone();
    bad_token.token = "a/b".into();
    let where_ = Declaration {
        node: NODE.into(),
        socket: "best_effort".into(),
        keys: "sr/ps/*/current".into(),
        filter: Filter {
            expr: Some("value > 10.5".into()),
            ..Filter::default()
        },
    };
    let changes = Declaration {
        filter: Filter {
            expr: None,
            abs_change: Some(0.5),
            rel_change: Some(0.01),
            min_period_ms: Some(100),
        },
        ..where_.clone()
    };
    // A map without "keys": node, socket, where.
    let no_keys = {
        let mut m = vec![milonga_wire::filter::DECLARE_TAG, 0xa3];
        for (k, v) in [
            ("node", NODE),
            ("socket", "best_effort"),
            ("where", "value > 1"),
        ] {
            for t in [k, v] {
                m.push(0x60 | t.len() as u8);
                if t.len() >= 24 {
                    // Text of 24 bytes or more takes a length byte.
                    m.pop();
                    m.extend([0x78, t.len() as u8]);
                }
                m.extend(t.as_bytes());
            }
        }
        m
    };
    // NodeInfo as a node writes it: the announcement, then the counters.
    let mut info_body = br#"{"announcement":"#.to_vec();
    info_body.extend(announcement().to_json());
    info_body.extend(br#","stats":{"samples_received":3,"samples_sent":12}}"#);
    let ann = announcement();
    let oldest = json!({
        "protocol": 1, "domain": "lab", "node_id": NODE, "name": "old@host1:7",
        "host": "host1", "pid": 7, "start_time": 99, "control": "ipc:///run/m/ctl.sock",
        "data_best_effort": null, "data_reliable": "ipc:///run/m/r.sock",
        "publications": [{"key": "a/b", "reliability": "reliable"}],
        "a_field_of_a_newer_version": true,
    });
    let oldest_bytes = serde_json::to_vec(&oldest).unwrap();
    let oldest_decoded = Announcement::from_json(&oldest_bytes).unwrap();
    let mut no_control = serde_json::from_slice::<Json>(&ann.to_json()).unwrap();
    no_control.as_object_mut().unwrap().remove("control");
    vec![
        valid(
            "history_query_join",
            "history_query",
            "tag 2 then a CBOR map: a subscription joining asks the reliable socket of node 000102...0f for the last sample of each key under sr/ps/**",
            vec![join.encode()],
            query_json(&join),
        ),
        valid(
            "history_query_schemas",
            "history_query",
            "a query for schemas only (docs/protocol.md §4.2, §5.1): last 0, since empty, id 7, schemas [4096453397], the id of the schema of tests/vectors/sample_compact",
            vec![schema_query.encode()],
            query_json(&schema_query),
        ),
        valid(
            "history_query_dictionaries",
            "history_query",
            "a query for a compression dictionary only (docs/protocol.md §4, §4.2): last 0, since empty, id 8, dictionaries [305419896] (0x12345678), the id a compressed frame's head (compressor 3) named",
            vec![dictionary_query.encode()],
            query_json(&dictionary_query),
        ),
        valid(
            "history_query_repair",
            "history_query",
            "a repair: everything kept after seq 41 of sr/ps/1/current and seq 7 of sr/ps/2/current (last 0: nothing for other keys)",
            vec![repair.encode()],
            query_json(&repair),
        ),
        invalid(
            "history_query_without_since",
            "history_query",
            "every field of a query is required, since too (an empty array when there is nothing to repair)",
            vec![no_since],
            "Malformed(\"no field \\\"since\\\"\")",
        ),
        invalid(
            "history_query_bad_token",
            "history_query",
            "a token holding '/' (or NUL or '*', or empty, or over 64 bytes) is refused: replies travel under @r/<token>",
            vec![bad_token.encode()],
            "Malformed(\"bad token\")",
        ),
        valid(
            "filter_declaration_where",
            "filter_declaration",
            "tag 3 then a CBOR map: a filter 'value > 10.5' declared to the best-effort socket for sr/ps/*/current; absent members are null here and absent on the wire",
            vec![where_.encode()],
            declaration_json(&where_),
        ),
        valid(
            "filter_declaration_changes",
            "filter_declaration",
            "a deadband filter: abs_change 0.5, rel_change 0.01 (CBOR float64), min_period_ms 100",
            vec![changes.encode()],
            declaration_json(&changes),
        ),
        invalid(
            "filter_declaration_without_keys",
            "filter_declaration",
            "node, socket and keys are required",
            vec![no_keys],
            "FilterError { text: \"\", at: 0, why: \"no keys\"",
        ),
        valid(
            "control_info_request",
            "control_request",
            "two frames after the ROUTER identity: the magic MILONGA-CTL/1, then info",
            Request::Info.frames().iter().map(|f| f.to_vec()).collect(),
            json!({"request": "info"}),
        ),
        valid(
            "control_gossip_request",
            "control_request",
            "four frames after the ROUTER identity: the magic, gossip, the asker's tcp control endpoint, its domain; answered like info; an asker of the node's domain is learned at the address the request came from, with the port its endpoint names",
            Request::Gossip {
                control: "tcp://10.99.0.2:7100".into(),
                domain: "lab".into(),
            }
            .frames()
            .iter()
            .map(|f| f.to_vec())
            .collect(),
            json!({"request": "gossip", "control": "tcp://10.99.0.2:7100", "domain": "lab"}),
        ),
        invalid(
            "control_gossip_ipc_endpoint",
            "control_request",
            "a gossip endpoint must be tcp:// (an ipc endpoint is of one host: local discovery finds it)",
            vec![
                b"MILONGA-CTL/1".to_vec(),
                b"gossip".to_vec(),
                b"ipc:///tmp/x.sock".to_vec(),
                b"lab".to_vec(),
            ],
            "BadGossip",
        ),
        invalid(
            "control_gossip_without_domain",
            "control_request",
            "gossip has four frames: one missing is refused (counted control_malformed)",
            vec![
                b"MILONGA-CTL/1".to_vec(),
                b"gossip".to_vec(),
                b"tcp://10.99.0.2:7100".to_vec(),
            ],
            "FrameCount(3, 4)",
        ),
        invalid(
            "control_wrong_version",
            "control_request",
            "another version's magic is refused (counted control_malformed); nothing is answered",
            vec![b"MILONGA-CTL/9".to_vec(), b"info".to_vec()],
            "BadMagic",
        ),
        valid(
            "control_info_reply",
            "control_reply",
            "three frames: the magic, info, then NodeInfo as compact JSON: the announcement and the counters by name (a reader ignores counters it does not know)",
            control::info_reply(&info_body)
                .iter()
                .map(|f| f.to_vec())
                .collect(),
            serde_json::from_slice(&info_body).unwrap(),
        ),
        valid(
            "announcement_full",
            "announcement",
            "one JSON object, compact, fields in this order (a discovery file may be indented; the fields are the same)",
            vec![ann.to_json()],
            serde_json::from_slice(&ann.to_json()).unwrap(),
        ),
        Case {
            canonical: Some(vec![oldest_decoded.to_json()]),
            ..valid(
                "announcement_oldest_accepted",
                "announcement",
                "liveliness, services and a publication's history may be missing (null, empty, 0); a field a reader does not know is ignored; re-encoded with every field",
                vec![oldest_bytes],
                serde_json::from_slice(&oldest_decoded.to_json()).unwrap(),
            )
        },
        valid(
            "scout_hello_ask",
            "scout_hello",
            "a UDP datagram of scouting (§9.5): a node that just opened (flag ask), domain tag of \"lab\", announcement version 3, its control endpoint, and its announcement (JSON) inline",
            vec![hello().encode()],
            hello_json(&hello()),
        ),
        invalid(
            "scout_hello_wrong_version",
            "scout_hello",
            "another version is refused (counted scout_malformed)",
            vec![{
                let mut b = hello().encode();
                b[4] = 2;
                b
            }],
            "Version(2)",
        ),
        invalid(
            "announcement_without_control",
            "announcement",
            "every other field is required: without control, the announcement is refused",
            vec![serde_json::to_vec(&no_control).unwrap()],
            "AnnounceError(\"missing field `control`",
        ),
    ]
}

/// Decodes frames of `family`: the meaning, or the refusal's Debug form.
fn decode(family: &str, frames: &[Vec<u8>]) -> Result<Json, String> {
    let one = || {
        assert_eq!(frames.len(), 1, "a {family} is one frame");
        &frames[0][..]
    };
    match family {
        "history_query" => Query::decode(one())
            .map(|q| query_json(&q))
            .map_err(|e| format!("{e:?}")),
        "filter_declaration" => Declaration::decode(one())
            .map(|d| declaration_json(&d))
            .map_err(|e| format!("{e:?}")),
        "control_request" => Request::decode(frames)
            .map(|r| match r {
                Request::Info => json!({"request": "info"}),
                Request::Gossip { control, domain } => {
                    json!({"request": "gossip", "control": control, "domain": domain})
                }
            })
            .map_err(|e| format!("{e:?}")),
        "control_reply" => control::decode_info_reply(frames)
            .map(|body| serde_json::from_slice(body).expect("NodeInfo is JSON"))
            .map_err(|e| format!("{e:?}")),
        "announcement" => Announcement::from_json(one())
            .map(|a| serde_json::from_slice(&a.to_json()).unwrap())
            .map_err(|e| format!("{e:?}")),
        "scout_hello" => Hello::decode(one())
            .map(|h| hello_json(&h))
            .map_err(|e| format!("{e:?}")),
        other => panic!("unknown family {other}"),
    }
}

/// Encodes a meaning of `family` back to frames.
fn encode(family: &str, meaning: &Json) -> Vec<Vec<u8>> {
    match family {
        "history_query" => vec![query_from_json(meaning).encode()],
        "filter_declaration" => vec![declaration_from_json(meaning).encode()],
        "control_request" => {
            let r = match meaning["request"].as_str() {
                Some("info") => Request::Info,
                Some("gossip") => Request::Gossip {
                    control: meaning["control"].as_str().unwrap().into(),
                    domain: meaning["domain"].as_str().unwrap().into(),
                },
                other => panic!("unknown control request {other:?}"),
            };
            r.frames().iter().map(|f| f.to_vec()).collect()
        }
        "control_reply" => {
            // The announcement re-encoded by the crate, the counters as
            // they were: NodeInfo's JSON with its fields in order.
            let a: Announcement = serde_json::from_value(meaning["announcement"].clone()).unwrap();
            let mut body = br#"{"announcement":"#.to_vec();
            body.extend(a.to_json());
            body.extend(br#","stats":"#);
            body.extend(serde_json::to_vec(&meaning["stats"]).unwrap());
            body.push(b'}');
            control::info_reply(&body)
                .iter()
                .map(|f| f.to_vec())
                .collect()
        }
        "announcement" => {
            let a: Announcement = serde_json::from_value(meaning.clone()).unwrap();
            vec![a.to_json()]
        }
        "scout_hello" => vec![Hello {
            leaving: meaning["leaving"].as_bool().unwrap(),
            ask: meaning["ask"].as_bool().unwrap(),
            domain_tag: meaning["domain_tag"].as_u64().unwrap() as u32,
            node_id: milonga_wire::NodeId::from_hex(meaning["node_id"].as_str().unwrap()).unwrap(),
            version: meaning["version"].as_u64().unwrap(),
            control: meaning["control"].as_str().unwrap().to_owned(),
            announcement: meaning["announcement_hex"].as_str().map(unhex),
            key: None,
        }
        .encode()],
        other => panic!("unknown family {other}"),
    }
}

/// The hello of the scouting vectors.
fn hello() -> Hello {
    Hello {
        leaving: false,
        ask: true,
        domain_tag: milonga_wire::frame::domain_tag("lab"),
        node_id: milonga_wire::NodeId([0x5a; 16]),
        version: 3,
        control: "tcp://10.99.0.1:7100".into(),
        announcement: Some(
            br#"{"protocol":1,"domain":"lab","node_id":"5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a","name":"ps@h:1","host":"h","pid":1,"start_time":0,"control":"tcp://10.99.0.1:7100","data_best_effort":null,"data_reliable":null,"liveliness":null,"publications":[],"services":[]}"#.to_vec(),
        ),
        key: None,
    }
}

fn hello_json(h: &Hello) -> Json {
    json!({
        "leaving": h.leaving,
        "ask": h.ask,
        "domain_tag": h.domain_tag,
        "node_id": h.node_id.to_hex(),
        "version": h.version,
        "control": h.control,
        "announcement_hex": h.announcement.as_deref().map(hex),
    })
}

fn bless() {
    let d = dir();
    std::fs::create_dir_all(&d).unwrap();
    for e in std::fs::read_dir(&d).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    for c in cases() {
        let mut desc = json!({
            "name": c.name,
            "family": c.family,
            "description": c.description,
            "frames": c.frames.iter().map(|f| hex(f)).collect::<Vec<_>>(),
        });
        match &c.expect {
            Ok(meaning) => {
                desc["valid"] = json!(true);
                desc["meaning"] = meaning.clone();
                if let Some(canon) = &c.canonical {
                    desc["canonical"] = json!(false);
                    desc["canonical_frames"] =
                        json!(canon.iter().map(|f| hex(f)).collect::<Vec<_>>());
                }
            }
            Err(error) => {
                desc["valid"] = json!(false);
                desc["error"] = json!(error);
            }
        }
        let text = serde_json::to_string_pretty(&desc).unwrap() + "\n";
        std::fs::write(d.join(format!("{}.json", c.name)), text).unwrap();
    }
}

#[test]
fn message_vectors_decode_and_reencode_byte_for_byte() {
    let made: BTreeSet<&str> = cases().iter().map(|c| c.name).collect();
    let expected = common::listed_or_bless(&dir(), &VECTORS, made, bless);
    let mut checked = BTreeSet::new();
    for entry in std::fs::read_dir(dir()).expect("tests/vectors/messages exists") {
        let path = entry.unwrap().path();
        let desc: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = desc["name"].as_str().unwrap().to_owned();
        assert_eq!(
            path.file_name().and_then(|s| s.to_str()),
            Some(format!("{name}.json").as_str()),
            "a description names its own file"
        );
        let family = desc["family"].as_str().unwrap();
        let frames: Vec<Vec<u8>> = desc["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| unhex(f.as_str().unwrap()))
            .collect();
        let decoded = decode(family, &frames);
        if desc["valid"] == false {
            let err = decoded.expect_err(&name);
            let want = desc["error"].as_str().unwrap();
            assert!(err.starts_with(want), "{name}: got {err}, want {want}...");
        } else {
            let meaning = decoded.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(meaning, desc["meaning"], "{name}");
            let canonical = match desc.get("canonical_frames") {
                Some(c) => c
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| unhex(f.as_str().unwrap()))
                    .collect(),
                None => frames.clone(),
            };
            let again: Vec<String> = encode(family, &desc["meaning"])
                .iter()
                .map(|f| hex(f))
                .collect();
            let want: Vec<String> = canonical.iter().map(|f| hex(f)).collect();
            assert_eq!(again, want, "{name}: re-encoding");
        }
        assert!(checked.insert(name.clone()), "{name} described twice");
    }
    let checked: BTreeSet<&str> = checked.iter().map(String::as_str).collect();
    assert_eq!(
        checked, expected,
        "the vectors on disk are exactly the listed ones"
    );
}
