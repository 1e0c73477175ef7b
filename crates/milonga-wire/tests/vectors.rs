//! Golden vectors (tests/vectors/ at the repository root): every `<name>.bin`
//! (ZeroMQ frame 1, plus `<name>.frame2.bin` when a payload frame follows)
//! must decode to what `<name>.json` describes, and the description must
//! encode back to the same bytes. Implementations in other languages run the
//! same check against the same files.
//!
//! `MILONGA_BLESS_VECTORS=1 cargo test -p milonga-wire --test vectors`
//! rewrites the files from the cases below and then fails on purpose: a run
//! that rewrote what it checks against proves nothing. Review the diff, then
//! run again without the variable.

mod common;
use common::{hex, unhex};

use std::collections::BTreeSet;
use std::path::PathBuf;

use milonga_wire::cbor::{decode_payload, encode_cbor};
use milonga_wire::frame::{
    self, domain_tag, push_batch_entry, BatchEntries, Encoding, Header, Kind, NodeId,
};
use milonga_wire::value::{ElementType, TypedArray};
use milonga_wire::{Bytes, Key, Value};
use serde_json::{json, Value as Json};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors")
}

fn element(name: &str) -> ElementType {
    use ElementType::*;
    [U8, U16, U32, U64, I8, I16, I32, I64, F32, F64]
        .into_iter()
        .find(|e| e.name() == name)
        .unwrap_or_else(|| panic!("unknown element {name}"))
}

/// A value in the vectors' lossless JSON form.
fn value_json(v: &Value) -> Json {
    match v {
        Value::Null => json!({"type": "null"}),
        Value::Bool(b) => json!({"type": "bool", "value": b}),
        Value::Int(i) => json!({"type": "int", "value": i.to_string()}),
        Value::Float(f) => json!({"type": "float", "value": f}),
        Value::Text(s) => json!({"type": "text", "value": s}),
        Value::Bytes(b) => json!({"type": "bytes", "hex": hex(b)}),
        Value::Array(a) => {
            json!({"type": "array", "items": a.iter().map(value_json).collect::<Vec<_>>()})
        }
        Value::Map(m) => {
            json!({"type": "map", "pairs": m.iter().map(|(k, v)| json!([value_json(k), value_json(v)])).collect::<Vec<_>>()})
        }
        Value::Typed(t) => {
            json!({"type": "typed", "element": t.element().name(), "hex": hex(t.bytes())})
        }
        Value::Tagged(t, v) => json!({"type": "tag", "tag": t, "value": value_json(v)}),
        other => panic!("no vector form for {other:?}"),
    }
}

fn value_from_json(j: &Json) -> Value {
    match j["type"].as_str().unwrap() {
        "null" => Value::Null,
        "bool" => Value::Bool(j["value"].as_bool().unwrap()),
        "int" => Value::Int(j["value"].as_str().unwrap().parse().unwrap()),
        "float" => Value::Float(j["value"].as_f64().unwrap()),
        "text" => Value::Text(j["value"].as_str().unwrap().to_owned()),
        "bytes" => Value::Bytes(Bytes::from(unhex(j["hex"].as_str().unwrap()))),
        "array" => Value::Array(
            j["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(value_from_json)
                .collect(),
        ),
        "map" => Value::Map(
            j["pairs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (value_from_json(&p[0]), value_from_json(&p[1])))
                .collect(),
        ),
        "typed" => Value::Typed(
            TypedArray::from_bytes(
                element(j["element"].as_str().unwrap()),
                Bytes::from(unhex(j["hex"].as_str().unwrap())),
            )
            .unwrap(),
        ),
        "tag" => Value::Tagged(
            j["tag"].as_u64().unwrap(),
            Box::new(value_from_json(&j["value"])),
        ),
        t => panic!("unknown value type {t}"),
    }
}

fn encoding_name(e: Encoding) -> &'static str {
    match e {
        Encoding::Raw => "raw",
        Encoding::Cbor => "cbor",
        Encoding::Json => "json",
        Encoding::Compact => "compact",
    }
}

fn header_json(h: &Header, domain: &str) -> Json {
    json!({
        "version": 1,
        "kind": match h.kind {
            Kind::Sample => "sample",
            Kind::Batch => "batch",
            Kind::Heartbeat => "heartbeat",
            Kind::History => "history",
            Kind::Request => "request",
            Kind::Reply => "reply",
            Kind::Denied => "denied",
        },
        "flags": h.flags,
        "encoding": encoding_name(h.encoding),
        "domain": domain,
        "domain_tag": format!("{:#010x}", h.domain_tag),
        "schema_id": h.schema_id,
        "node_id": h.node_id.to_hex(),
        "seq": h.seq,
        "timestamp_ns": h.timestamp_ns,
    })
}

fn header_from_json(j: &Json) -> Header {
    let tag = domain_tag(j["domain"].as_str().unwrap());
    assert_eq!(
        format!("{tag:#010x}"),
        j["domain_tag"],
        "domain_tag is FNV-1a 32 of the domain"
    );
    Header {
        kind: match j["kind"].as_str().unwrap() {
            "sample" => Kind::Sample,
            "heartbeat" => Kind::Heartbeat,
            "history" => Kind::History,
            "request" => Kind::Request,
            "reply" => Kind::Reply,
            _ => Kind::Batch,
        },
        flags: j["flags"].as_u64().unwrap() as u8,
        encoding: match j["encoding"].as_str().unwrap() {
            "raw" => Encoding::Raw,
            "cbor" => Encoding::Cbor,
            "compact" => Encoding::Compact,
            "json" => Encoding::Json,
            other => panic!("unknown encoding {other}"),
        },
        domain_tag: tag,
        schema_id: j["schema_id"].as_u64().unwrap() as u32,
        node_id: NodeId::from_hex(j["node_id"].as_str().unwrap()).unwrap(),
        seq: j["seq"].as_u64().unwrap(),
        timestamp_ns: j["timestamp_ns"].as_u64().unwrap(),
    }
}

/// What a valid vector decodes to: key, header, values and timestamps.
type Expected = (String, Json, Vec<Value>, Vec<u64>);

/// One vector: frame bytes and their description.
struct Case {
    name: &'static str,
    description: &'static str,
    frame1: Vec<u8>,
    frame2: Option<Vec<u8>>,
    /// For a valid vector in a form decoders accept and encoders never
    /// write (a float16, a big-endian array): the frame 1 they write.
    canonical: Option<Vec<u8>>,
    /// For valid vectors: key, header, and decoded values (one per sample).
    expect: Result<Expected, &'static str>,
}

const NODE: NodeId = NodeId([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);
const TS: u64 = 1_700_000_000_000_000_000;

fn header(kind: Kind, encoding: Encoding, flags: u8, schema_id: u32, seq: u64) -> Header {
    Header {
        kind,
        flags,
        encoding,
        domain_tag: domain_tag("lab"),
        schema_id,
        node_id: NODE,
        seq,
        timestamp_ns: TS,
    }
}

fn cbor(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    encode_cbor(v, &mut out).unwrap();
    out
}

fn sample(
    name: &'static str,
    description: &'static str,
    key: &str,
    h: Header,
    value: Value,
) -> Case {
    let body = match (&value, h.encoding) {
        (Value::Bytes(b), Encoding::Raw) => b.to_vec(),
        (v, _) => cbor(v),
    };
    let k = Key::new(key).unwrap();
    Case {
        name,
        description,
        frame1: frame::encode(&k, &h, &body),
        frame2: None,
        canonical: None,
        expect: Ok((
            key.to_owned(),
            header_json(&h, "lab"),
            vec![value],
            vec![TS],
        )),
    }
}

/// Every vector, by name. The directory must hold exactly these, and
/// `cases()` must make exactly these: a vector that goes missing (its files
/// deleted, or its case) fails the check instead of shrinking it, here and
/// in every language that checks the same files.
const VECTORS: [&str; 31] = [
    "sample_cbor_float",
    "sample_split_ndarray_u16",
    "history_reply_schemas",
    "sample_compact",
    "sample_cbor_float16",
    "sample_cbor_float32",
    "sample_f32_array",
    "sample_f64_array_big_endian",
    "service_reply_ok",
    "service_reply_rejected",
    "service_reply_no_such_service",
    "sample_raw_bytes",
    "sample_cbor_map",
    "sample_f64_array",
    "sample_schema_unicode_key",
    "sample_split_u8_array",
    "batch_three_samples",
    "heartbeat_leaving",
    "heartbeat_goodbye_last",
    "history_reply",
    "service_request",
    "service_reply_error",
    "bad_version",
    "bad_kind",
    "bad_flags",
    "bad_encoding",
    "truncated_header",
    "key_with_wildcard",
    "key_with_control",
    "key_bad_utf8",
    "batch_truncated_entry",
];

/// The schema of the compact vector: `{id: i32, kind: enum(a|b), name:
/// text}` (docs/protocol.md §5.1).
fn compact_schema() -> milonga_wire::schema::Schema {
    use milonga_wire::schema::{Field, Schema, Type};
    Schema::new(
        "p",
        vec![
            Field::new("id", Type::I32),
            Field::new("kind", Type::Enum(vec!["a".into(), "b".into()])),
            Field::new("name", Type::Text),
        ],
    )
}

fn cases() -> Vec<Case> {
    let compact_id = milonga_wire::schema::Schema::id_of(&compact_schema().encode().unwrap());
    let mut v = vec![
        sample(
            "sample_compact",
            "encoding 3: {id: 7, kind: \"b\", name: \"q1\"} by position under the schema in `schema_hex` (its id in the header); `named` is what a reader delivers",
            "sr/ps/1/state",
            header(Kind::Sample, Encoding::Compact, 0, compact_id, 5),
            Value::Array(vec![Value::Int(7), Value::Int(1), Value::Text("q1".into())]),
        ),
        sample(
            "sample_cbor_float",
            "one sample: CBOR float64 12.5 on sr/ps/1/current, domain lab",
            "sr/ps/1/current",
            header(Kind::Sample, Encoding::Cbor, 0, 0, 1),
            Value::Float(12.5),
        ),
        sample(
            "sample_raw_bytes",
            "raw encoding: the payload is the bytes, untouched",
            "daq/raw",
            header(Kind::Sample, Encoding::Raw, 0, 0, 7),
            Value::Bytes(Bytes::from_static(b"\x00\x01\x02\xffraw")),
        ),
        sample(
            "sample_cbor_map",
            "a CBOR map of every scalar kind and a nested array",
            "sr/ps/1/state",
            header(Kind::Sample, Encoding::Cbor, 0, 0, 2),
            Value::Map(vec![
                (Value::from("current"), Value::Float(12.5)),
                (Value::from("status"), Value::from("ON")),
                (Value::from("ok"), Value::Bool(true)),
                (Value::from("n"), Value::Int(-3)),
                (Value::from("big"), Value::Int(u64::MAX.into())),
                (Value::from("none"), Value::Null),
                (
                    Value::from("blob"),
                    Value::Bytes(Bytes::from_static(b"\xca\xfe")),
                ),
                (
                    Value::from("list"),
                    Value::Array(vec![Value::Int(1), Value::Int(2)]),
                ),
            ]),
        ),
        sample(
            "sample_f64_array",
            "an RFC 8746 float64 little-endian typed array (tag 86), inline",
            "sr/bpm/1/positions",
            header(Kind::Sample, Encoding::Cbor, 0, 0, 3),
            Value::from(vec![1.0f64, 2.5, -3.0]),
        ),
        sample(
            "sample_schema_unicode_key",
            "schema id 42, a key with non-ASCII characters, a tagged value (tag 1, epoch time)",
            "µ/température",
            header(Kind::Sample, Encoding::Cbor, 0, 42, 9),
            Value::Tagged(1, Box::new(Value::Int(1_700_000_000))),
        ),
    ];
    // A payload split over two frames: frame 1 ends with the CBOR head of a
    // uint8 typed array (tag 64, byte string of 16), frame 2 holds the bytes.
    {
        let k = Key::new("sr/cam/1/image").unwrap();
        let h = header(
            Kind::Sample,
            Encoding::Cbor,
            frame::FLAG_PAYLOAD_FRAME,
            0,
            4,
        );
        let data: Vec<u8> = (0..16).collect();
        v.push(Case {
            name: "sample_split_u8_array",
            description: "a uint8 typed array whose bytes travel in a second frame (flag bit 0)",
            frame1: frame::encode(&k, &h, &[0xd8, 64, 0x50]),
            frame2: Some(data.clone()),
            canonical: None,
            expect: Ok((
                "sr/cam/1/image".into(),
                header_json(&h, "lab"),
                vec![Value::from(data)],
                vec![TS],
            )),
        });
    }
    // A multi-dimensional array split the same way: frame 1 ends with
    // `40([[2, 3], ` and the head of a uint16 typed array (tag 69, byte
    // string of 12), frame 2 holds the elements.
    {
        let k = Key::new("sr/cam/1/frame").unwrap();
        let h = header(
            Kind::Sample,
            Encoding::Cbor,
            frame::FLAG_PAYLOAD_FRAME,
            0,
            5,
        );
        let elements: Vec<u16> = (0..6).collect();
        let data: Vec<u8> = elements.iter().flat_map(|e| e.to_le_bytes()).collect();
        let image = Value::Tagged(
            40,
            Box::new(Value::Array(vec![
                Value::Array(vec![Value::Int(2), Value::Int(3)]),
                Value::Typed(TypedArray::from_vec(elements)),
            ])),
        );
        v.push(Case {
            name: "sample_split_ndarray_u16",
            description:
                "a 2 x 3 uint16 array (RFC 8746 tag 40) whose elements travel in a second frame",
            frame1: frame::encode(&k, &h, &[0xd8, 40, 0x82, 0x82, 0x02, 0x03, 0xd8, 69, 0x4c]),
            frame2: Some(data),
            canonical: None,
            expect: Ok((
                "sr/cam/1/frame".into(),
                header_json(&h, "lab"),
                vec![image],
                vec![TS],
            )),
        });
    }
    // A batch of three raw samples with sequence numbers 10, 11, 12.
    {
        let k = Key::new("daq/adc/0").unwrap();
        let h = header(Kind::Batch, Encoding::Raw, 0, 0, 10);
        let mut body = Vec::new();
        let payloads: [&[u8]; 3] = [b"one", b"", b"three"];
        for (i, p) in payloads.iter().enumerate() {
            push_batch_entry(&mut body, TS + i as u64, p);
        }
        v.push(Case {
            name: "batch_three_samples",
            description:
                "kind 2: three samples of one key, seq 10..12, each with its own timestamp",
            frame1: frame::encode(&k, &h, &body),
            frame2: None,
            canonical: None,
            expect: Ok((
                "daq/adc/0".into(),
                header_json(&h, "lab"),
                payloads
                    .iter()
                    .map(|p| Value::Bytes(Bytes::copy_from_slice(p)))
                    .collect(),
                vec![TS, TS + 1, TS + 2],
            )),
        });
    }
    // A heartbeat: kind 3 under the reserved key `@hb`, a CBOR map body.
    {
        let k = Key::internal(frame::HEARTBEAT_KEY).unwrap();
        let h = header(Kind::Heartbeat, Encoding::Cbor, 0, 0, 5);
        let body = Value::Map(vec![(Value::from("leaving"), Value::Bool(true))]);
        v.push(Case {
            name: "heartbeat_leaving",
            description: "kind 3: heartbeat number 5 of a node that is closing (leaving: true)",
            frame1: frame::encode(&k, &h, &cbor(&body)),
            frame2: None,
            canonical: None,
            expect: Ok((
                frame::HEARTBEAT_KEY.into(),
                header_json(&h, "lab"),
                vec![body],
                vec![TS],
            )),
        });
        // The goodbye with the last sequence number of each key, as
        // `milonga_wire::heartbeat::Heartbeat::encode` writes it.
        let h = header(Kind::Heartbeat, Encoding::Cbor, 0, 0, 6);
        let bye = milonga_wire::heartbeat::Heartbeat {
            leaving: true,
            last: milonga_wire::heartbeat::Last::Keys(vec![
                ("sr/ps/1/current".into(), 41),
                ("sr/ps/1/voltage".into(), 7),
            ]),
        };
        let body = milonga_wire::cbor::decode_cbor(&Bytes::from(bye.encode())).unwrap();
        v.push(Case {
            name: "heartbeat_goodbye_last",
            description: "kind 3: the goodbye of a node that put seq 41 of sr/ps/1/current and 7 of sr/ps/1/voltage last (leaving: true, last: {key: seq})",
            frame1: frame::encode(&k, &h, &bye.encode()),
            frame2: None,
            canonical: None,
            expect: Ok((
                frame::HEARTBEAT_KEY.into(),
                header_json(&h, "lab"),
                vec![body],
                vec![TS],
            )),
        });
    }
    // A history reply: kind 4 under `@r/<token>`, one key, two kept samples.
    {
        use milonga_wire::history::{Entry, KeyHistory, Reply};
        let k = Key::internal("@r/000102030405060708090a0b0c0d0e0f-1").unwrap();
        let h = header(Kind::History, Encoding::Cbor, 0, 0, 1);
        let reply = Reply {
            socket: "reliable".into(),
            keys: vec![KeyHistory {
                key: "sr/ps/1/current".into(),
                first: 8,
                last: 9,
                entries: (8..=9u64)
                    .map(|seq| Entry {
                        seq,
                        timestamp_ns: TS + seq,
                        encoding: Encoding::Cbor,
                        schema_id: 0,
                        payload: Bytes::from(cbor(&Value::Float(seq as f64))),
                    })
                    .collect(),
                replayed: false,
            }],
            done: true,
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        let body = reply.encode();
        let value = milonga_wire::cbor::decode_cbor(&Bytes::from(body.clone())).unwrap();
        v.push(Case {
            name: "history_reply",
            description: "kind 4: the last two samples (seq 8, 9) of sr/ps/1/current kept by the publisher's reliable data socket, for subscription token 000102030405060708090a0b0c0d0e0f-1",
            frame1: frame::encode(&k, &h, &body),
            frame2: None,
            canonical: None,
            expect: Ok((k.as_str().into(), header_json(&h, "lab"), vec![value], vec![TS])),
        });
    }
    // A reply to a query that asked for a schema: no key kept, the
    // schema of `sample_compact` (its id, its bytes) in the first frame.
    {
        use milonga_wire::history::Reply;
        let k = Key::internal("@r/000102030405060708090a0b0c0d0e0f-1").unwrap();
        let h = header(Kind::History, Encoding::Cbor, 0, 0, 2);
        let schema = compact_schema().encode().unwrap();
        let reply = Reply {
            socket: "best_effort".into(),
            keys: vec![],
            done: true,
            id: Some(7),
            schemas: vec![(
                milonga_wire::schema::Schema::id_of(&schema),
                Bytes::from(schema),
            )],
            dictionaries: Vec::new(),
        };
        let body = reply.encode();
        let value = milonga_wire::cbor::decode_cbor(&Bytes::from(body.clone())).unwrap();
        v.push(Case {
            name: "history_reply_schemas",
            description: "kind 4: the answer to query 7, which asked the best-effort socket for a schema (docs/protocol.md §4.2, §5.1): no key, the schema of sample_compact as [id, its CBOR bytes]",
            frame1: frame::encode(&k, &h, &body),
            frame2: None,
            canonical: None,
            expect: Ok((k.as_str().into(), header_json(&h, "lab"), vec![value], vec![TS])),
        });
    }
    // A service call: a request with a CBOR map, and a failed reply.
    {
        let k = Key::new("sr/ps/1/set_current").unwrap();
        let h = header(Kind::Request, Encoding::Cbor, 0, 0, 17);
        let body = Value::Map(vec![(Value::from("amps"), Value::Float(12.5))]);
        v.push(Case {
            name: "service_request",
            description: "kind 5: call 17 of node 000102...0f to the service sr/ps/1/set_current with {\"amps\": 12.5}",
            frame1: frame::encode(&k, &h, &cbor(&body)),
            frame2: None,
            canonical: None,
            expect: Ok((k.as_str().into(), header_json(&h, "lab"), vec![body], vec![TS])),
        });
        use milonga_wire::service::{Failure, ReplyStatus};
        let h = header(Kind::Reply, Encoding::Cbor, 0, 0, 17);
        let failure = Failure {
            kind: "out_of_range".into(),
            message: "12.5 A is above the limit".into(),
        };
        let mut body = vec![ReplyStatus::Error as u8];
        body.extend(failure.encode());
        // The expected "value" is the body after the status byte.
        let value = milonga_wire::cbor::decode_cbor(&Bytes::from(body[1..].to_vec())).unwrap();
        v.push(Case {
            name: "service_reply_error",
            description: "kind 6: the answer to call 17, status 1 (the handler failed) then the CBOR failure map; the sample value below is the body after the status byte",
            frame1: frame::encode(&k, &h, &body),
            frame2: None,
            canonical: None,
            expect: Ok((k.as_str().into(), header_json(&h, "lab"), vec![value], vec![TS])),
        });
    }
    // Forms a decoder accepts and an encoder never writes: half and single
    // precision floats (Milonga writes float64), a big-endian typed array
    // (Milonga writes little-endian). Each gives the frame an encoder
    // writes for the same value.
    {
        let k = Key::new("sr/ps/1/current").unwrap();
        let h = header(Kind::Sample, Encoding::Cbor, 0, 0, 2);
        let mut narrow = |name, description, body: &[u8], value: Value| {
            v.push(Case {
                name,
                description,
                frame1: frame::encode(&k, &h, body),
                frame2: None,
                canonical: Some(frame::encode(&k, &h, &cbor(&value))),
                expect: Ok((
                    k.as_str().into(),
                    header_json(&h, "lab"),
                    vec![value],
                    vec![TS],
                )),
            });
        };
        narrow(
            "sample_cbor_float16",
            "a CBOR half-precision float (major 7, 0xf9) 1.5: read as a float; written back as float64",
            &[0xf9, 0x3e, 0x00],
            Value::Float(1.5),
        );
        narrow(
            "sample_cbor_float32",
            "a CBOR single-precision float (0xfa) 12.5: read as a float; written back as float64",
            &[0xfa, 0x41, 0x48, 0x00, 0x00],
            Value::Float(12.5),
        );
        let be: Vec<u8> = [1.0f64, -0.5]
            .iter()
            .flat_map(|x| x.to_be_bytes())
            .collect();
        let mut body = vec![0xd8, 82, 0x50];
        body.extend(&be);
        narrow(
            "sample_f64_array_big_endian",
            "RFC 8746 tag 82 (float64, big-endian) [1.0, -0.5]: read as the same float64 array; written back little-endian (tag 86)",
            &body,
            Value::from(vec![1.0f64, -0.5]),
        );
    }
    v.push(sample(
        "sample_f32_array",
        "RFC 8746 tag 85 (float32, little-endian) [1.5, -2.0, 0.25], inline",
        "sr/bpm/1/positions",
        header(Kind::Sample, Encoding::Cbor, 0, 0, 4),
        Value::Typed(TypedArray::from_vec(vec![1.5f32, -2.0, 0.25])),
    ));
    // A reply of every other status: a value (0), refused (2), no such
    // service (3); the failure map travels after 2 and 3 as after 1.
    {
        use milonga_wire::service::{Failure, ReplyStatus};
        let k = Key::new("sr/ps/1/set_current").unwrap();
        let h = header(Kind::Reply, Encoding::Cbor, 0, 0, 18);
        let mut reply = |name, description, status: ReplyStatus, value: Value| {
            let mut body = vec![status as u8];
            body.extend(cbor(&value));
            v.push(Case {
                name,
                description,
                frame1: frame::encode(&k, &h, &body),
                frame2: None,
                canonical: None,
                expect: Ok((
                    k.as_str().into(),
                    header_json(&h, "lab"),
                    vec![value],
                    vec![TS],
                )),
            });
        };
        let failure = |kind: &str, message: &str| {
            let f = Failure {
                kind: kind.into(),
                message: message.into(),
            };
            milonga_wire::cbor::decode_cbor(&Bytes::from(f.encode())).unwrap()
        };
        reply(
            "service_reply_ok",
            "kind 6: the answer to call 18, status 0 (the handler returned) then the value, 12.5",
            ReplyStatus::Ok,
            Value::Float(12.5),
        );
        reply(
            "service_reply_rejected",
            "kind 6: status 2, the server refused the call without running the handler (its queue was full), then the failure map",
            ReplyStatus::Rejected,
            failure("busy", "12 requests queued; the limit is 12"),
        );
        reply(
            "service_reply_no_such_service",
            "kind 6: status 3, the server no longer serves this key, then the failure map",
            ReplyStatus::NoSuchService,
            failure("no_such_service", "sr/ps/1/set_current is not served here"),
        );
    }
    // Invalid frames: each must be refused with the named error.
    let good = frame::encode(
        &Key::new("a/b").unwrap(),
        &header(Kind::Sample, Encoding::Raw, 0, 0, 1),
        b"x",
    );
    let with = |i: usize, b: u8| {
        let mut f = good.clone();
        f[i] = b;
        f
    };
    let bad = |name, description, frame1, err| Case {
        name,
        description,
        frame1,
        frame2: None,
        canonical: None,
        expect: Err(err),
    };
    v.push(bad(
        "bad_version",
        "version byte 2: refused, counted in frames_bad_version",
        with(4, 2),
        "UnsupportedVersion",
    ));
    v.push(bad(
        "bad_kind",
        "kind 9: refused, counted in frames_unknown_kind",
        with(5, 9),
        "UnknownKind",
    ));
    v.push(bad(
        "bad_flags",
        "an unknown flag bit: refused",
        with(6, 0x80),
        "UnknownFlags",
    ));
    v.push(bad(
        "bad_encoding",
        "encoding 200: refused",
        with(7, 200),
        "UnknownEncoding",
    ));
    v.push(bad(
        "truncated_header",
        "the header stops after 20 bytes",
        good[..24].to_vec(),
        "Truncated",
    ));
    v.push(bad(
        "key_with_wildcard",
        "a published key may not hold '*'",
        with(0, b'*'),
        "BadKey",
    ));
    v.push(bad(
        "key_with_control",
        "a key may not hold a control character (here ESC, U+001B)",
        with(0, 0x1b),
        "BadKey",
    ));
    v.push(bad(
        "key_bad_utf8",
        "the key is not UTF-8",
        with(0, 0xff),
        "BadKey",
    ));
    {
        let k = Key::new("daq/adc/0").unwrap();
        let mut body = Vec::new();
        push_batch_entry(&mut body, TS, b"abc");
        body.pop();
        v.push(bad(
            "batch_truncated_entry",
            "a batch entry claims more bytes than the frame holds",
            frame::encode(&k, &header(Kind::Batch, Encoding::Raw, 0, 0, 1), &body),
            "BadBatch",
        ));
    }
    v
}

fn bless() {
    let d = dir();
    std::fs::create_dir_all(&d).unwrap();
    for c in cases() {
        std::fs::write(d.join(format!("{}.bin", c.name)), &c.frame1).unwrap();
        if let Some(f2) = &c.frame2 {
            std::fs::write(d.join(format!("{}.frame2.bin", c.name)), f2).unwrap();
        }
        let desc = match &c.expect {
            Ok((key, header, values, ts)) => {
                let mut d = json!({
                    "name": c.name,
                    "description": c.description,
                    "valid": true,
                    "frames": 1 + usize::from(c.frame2.is_some()),
                    "key": key,
                    "header": header,
                    "samples": values.iter().zip(ts).enumerate().map(|(i, (v, t))| json!({
                        "seq": header["seq"].as_u64().unwrap() + i as u64,
                        "timestamp_ns": t,
                        "value": value_json(v),
                    })).collect::<Vec<_>>(),
                });
                // A reply's body starts with its status byte.
                if header["kind"] == "reply" {
                    let view = frame::decode(&c.frame1).unwrap();
                    d["reply_status"] = json!(view.body[0]);
                }
                if let Some(canon) = &c.canonical {
                    d["canonical"] = json!(false);
                    d["canonical_frame1_hex"] = json!(hex(canon));
                }
                // A compact sample: its schema, and the value a reader
                // makes of it.
                if header["encoding"] == "compact" {
                    let s = compact_schema();
                    let view = frame::decode(&c.frame1).unwrap();
                    let named = milonga_wire::schema::Plan::identity(&s)
                        .read(&Bytes::copy_from_slice(view.body))
                        .unwrap();
                    d["schema_hex"] = json!(hex(&s.encode().unwrap()));
                    d["named"] = value_json(&named);
                }
                d
            }
            Err(e) => json!({
                "name": c.name,
                "description": c.description,
                "valid": false,
                "frames": 1,
                "error": e,
            }),
        };
        std::fs::write(
            d.join(format!("{}.json", c.name)),
            serde_json::to_string_pretty(&desc).unwrap() + "\n",
        )
        .unwrap();
    }
}

#[test]
fn golden_vectors_decode_and_reencode_byte_for_byte() {
    let made: BTreeSet<&str> = cases().iter().map(|c| c.name).collect();
    let expected = common::listed_or_bless(&dir(), &VECTORS, made, bless);
    let mut checked: BTreeSet<String> = BTreeSet::new();
    for entry in std::fs::read_dir(dir()).expect("tests/vectors exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let desc: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = desc["name"].as_str().unwrap();
        assert_eq!(
            path.file_stem().and_then(|s| s.to_str()),
            Some(name),
            "a description names its own files"
        );
        assert!(checked.insert(name.to_owned()), "{name} described twice");
        let frame1 = std::fs::read(dir().join(format!("{name}.bin"))).unwrap();
        let frame2 = std::fs::read(dir().join(format!("{name}.frame2.bin"))).ok();
        let decoded = frame::decode(&frame1);
        if desc["valid"] == false {
            let err = decoded.expect_err(name);
            assert!(
                format!("{err:?}").starts_with(desc["error"].as_str().unwrap()),
                "{name}: got {err:?}"
            );
            continue;
        }
        let view = decoded.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(view.key, desc["key"], "{name}");
        assert_eq!(
            header_json(&view.header, desc["header"]["domain"].as_str().unwrap()),
            desc["header"],
            "{name}"
        );
        assert_eq!(
            frame2.is_some(),
            view.header.flags & frame::FLAG_PAYLOAD_FRAME != 0,
            "{name}"
        );
        let samples = desc["samples"].as_array().unwrap();
        let bodies: Vec<(u64, Bytes)> = match view.header.kind {
            Kind::Sample | Kind::Heartbeat | Kind::History | Kind::Request | Kind::Denied => {
                vec![(view.header.timestamp_ns, Bytes::copy_from_slice(view.body))]
            }
            Kind::Reply => {
                assert_eq!(
                    u64::from(view.body[0]),
                    desc["reply_status"].as_u64().unwrap(),
                    "{name}"
                );
                vec![(
                    view.header.timestamp_ns,
                    Bytes::copy_from_slice(&view.body[1..]),
                )]
            }
            Kind::Batch => BatchEntries::new(view.body)
                .unwrap()
                .map(|e| e.unwrap())
                .map(|e| (e.timestamp_ns, Bytes::copy_from_slice(e.payload)))
                .collect(),
        };
        assert_eq!(bodies.len(), samples.len(), "{name}");
        for ((ts, body), s) in bodies.into_iter().zip(samples) {
            let v = decode_payload(view.header.encoding, body, frame2.clone().map(Bytes::from))
                .unwrap();
            assert_eq!(value_json(&v), s["value"], "{name}");
            assert_eq!(ts, s["timestamp_ns"].as_u64().unwrap(), "{name}");
            if view.header.encoding == Encoding::Compact {
                // The schema's id is its bytes', and it names the value.
                let schema = unhex(desc["schema_hex"].as_str().unwrap());
                assert_eq!(
                    milonga_wire::schema::Schema::id_of(&schema),
                    view.header.schema_id,
                    "{name}"
                );
                let s = milonga_wire::schema::Schema::decode(&schema).unwrap();
                let named = milonga_wire::schema::Plan::identity(&s)
                    .read(&Bytes::copy_from_slice(view.body))
                    .unwrap();
                assert_eq!(value_json(&named), desc["named"], "{name}");
            }
        }
        // Re-encode from the description alone.
        let h = header_from_json(&desc["header"]);
        let key = Key::internal(desc["key"].as_str().unwrap()).unwrap();
        let body: Vec<u8> = match h.kind {
            Kind::Heartbeat | Kind::History | Kind::Request => {
                cbor(&value_from_json(&samples[0]["value"]))
            }
            // No vector of a refusal yet: its body is JSON (docs/protocol.md §2.2).
            Kind::Denied => panic!("{name}: no refusal vectors"),
            Kind::Reply => {
                let mut b = vec![desc["reply_status"].as_u64().unwrap() as u8];
                b.extend(cbor(&value_from_json(&samples[0]["value"])));
                b
            }
            Kind::Batch => {
                let mut b = Vec::new();
                for s in samples {
                    let Value::Bytes(p) = value_from_json(&s["value"]) else {
                        panic!("{name}: raw batch")
                    };
                    push_batch_entry(&mut b, s["timestamp_ns"].as_u64().unwrap(), &p);
                }
                b
            }
            Kind::Sample => match (value_from_json(&samples[0]["value"]), frame2.as_ref()) {
                (Value::Bytes(b), None) if h.encoding == Encoding::Raw => b.to_vec(),
                (Value::Typed(t), Some(f2)) => {
                    assert_eq!(t.bytes(), &f2[..], "{name}: frame 2 is the array's bytes");
                    let whole = cbor(&Value::Typed(t.clone()));
                    whole[..whole.len() - f2.len()].to_vec()
                }
                (v @ Value::Tagged(40, _), Some(f2)) => {
                    let whole = cbor(&v);
                    assert!(whole.ends_with(f2), "{name}: frame 2 is the elements");
                    whole[..whole.len() - f2.len()].to_vec()
                }
                (v, _) => cbor(&v),
            },
        };
        let written = desc
            .get("canonical_frame1_hex")
            .map_or_else(|| hex(&frame1), |c| c.as_str().unwrap().to_owned());
        assert_eq!(
            hex(&frame::encode(&key, &h, &body)),
            written,
            "{name}: re-encoding"
        );
    }
    // Every listed vector was checked, and nothing else was found.
    let checked: BTreeSet<&str> = checked.iter().map(String::as_str).collect();
    assert_eq!(
        checked,
        expected,
        "the vectors in {} are exactly the listed ones",
        dir().display()
    );
}
