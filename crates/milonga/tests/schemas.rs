//! Schema'd publishers (docs/schemas.md): samples travel by position
//! (encoding 3) and arrive as the maps they were put as, live and from
//! history; a reader's schema reads an older or newer writer's samples
//! and refuses, naming the field, one that does not agree; values that do
//! not fit are refused at the put; a compact sample whose schema never
//! comes is counted, never delivered wrong.

use std::path::Path;
use std::time::{Duration, Instant};

use milonga::wire::frame::{self, Encoding, Kind};
use milonga::{
    Config, Encoding as Enc, Event, Field, FieldType, Node, PublisherQos, PutError, QosPolicy,
    Schema, SubscriberQos, Value,
};
use milonga_testkit::{wait_for, TempDir};

const T: Duration = Duration::from_secs(10);

mod forge;

fn open(domain: &str, name: &str, dir: &Path) -> Node {
    let mut cfg = Config::new(&format!("milonga:///{domain}"), name);
    cfg.runtime_dir = Some(dir.to_path_buf());
    Node::open_with(cfg).expect("open node")
}

fn map(pairs: &[(&str, Value)]) -> Value {
    Value::Map(
        pairs
            .iter()
            .map(|(k, v)| (Value::Text((*k).into()), v.clone()))
            .collect(),
    )
}

fn point() -> FieldType {
    FieldType::Struct(vec![
        Field::new("x", FieldType::F64),
        Field::new("y", FieldType::F64),
    ])
}

fn track_v1() -> Schema {
    Schema::new(
        "track",
        vec![
            Field::new("id", FieldType::I32),
            Field::new("pos", point()),
            Field::new("kind", FieldType::Enum(vec!["air".into(), "ground".into()])),
            Field::new("wave", FieldType::Array(milonga::ElementType::F32)),
        ],
    )
}

fn track(id: i64) -> Value {
    map(&[
        ("id", Value::Int(id.into())),
        (
            "pos",
            map(&[("x", Value::Float(1.5)), ("y", Value::Float(id as f64))]),
        ),
        ("kind", Value::Text("air".into())),
        (
            "wave",
            Value::Typed(milonga::TypedArray::from_vec(vec![0.5f32, 1.0, 2.0])),
        ),
    ])
}

/// The samples and events of `sub` until `n` samples came.
fn samples(sub: &milonga::Subscriber, n: usize) -> (Vec<milonga::Sample>, Vec<Event>) {
    let (mut got, mut other) = (Vec::new(), Vec::new());
    let end = Instant::now() + T;
    while got.len() < n {
        assert!(
            Instant::now() < end,
            "{} of {n} samples in {T:?}: {other:?}",
            got.len()
        );
        match sub.recv_timeout(Duration::from_millis(200)) {
            Ok(Event::Sample(s)) => got.push(s),
            Ok(e) => other.push(e),
            Err(_) => {}
        }
    }
    (got, other)
}

#[test]
fn schema_d_samples_arrive_as_the_maps_put_live_and_from_history() {
    let dir = TempDir::new("schemas");
    let domain = "schema-live";
    let a = open(domain, "writer", dir.path());
    let b = open(domain, "reader", dir.path());
    let p = a
        .publisher_with(
            "radar/track",
            PublisherQos::reliable().history(4).schema(track_v1()),
        )
        .unwrap();
    for i in 1..=3 {
        p.put(track(i)).unwrap();
    }
    let sub = b
        .subscribe_with("radar/**", SubscriberQos::default().last(3).reliable())
        .unwrap();
    // The kept samples first (the join is answered when its query reaches
    // the publisher; samples put before that would be among the last 3
    // kept, not after them), then live ones.
    let (mut got, events) = samples(&sub, 3);
    if !events.contains(&Event::SubscriptionLive) {
        let end = Instant::now() + T;
        while sub.recv_timeout(T).ok() != Some(Event::SubscriptionLive) {
            assert!(Instant::now() < end, "no SubscriptionLive");
        }
    }
    for i in 4..=6 {
        p.put(track(i)).unwrap();
    }
    got.extend(samples(&sub, 3).0);
    for (i, s) in got.iter().enumerate() {
        assert_eq!(s.value, track(i as i64 + 1), "sample {}", i + 1);
        assert_eq!(s.encoding, Enc::Compact);
        assert_ne!(s.schema_id, 0);
        assert_eq!(s.seq, i as u64 + 1);
    }
    let st = b.stats();
    assert_eq!(st.schemas_learned, 1, "learned once, by (publisher, id)");
    assert_eq!(st.samples_unknown_schema, 0);
    assert_eq!(st.payloads_malformed, 0);
    // A value that does not fit is refused at the put, naming the field.
    let mut bad = track(7);
    if let Value::Map(pairs) = &mut bad {
        pairs[0].1 = Value::Text("seven".into());
    }
    match p.put(bad) {
        Err(PutError::Schema(e)) => assert!(e.to_string().contains("id"), "{e}"),
        other => panic!("expected a schema error, got {other:?}"),
    }
    let mut extra = track(7);
    if let Value::Map(pairs) = &mut extra {
        pairs.push((Value::Text("colour".into()), Value::Null));
    }
    assert!(matches!(p.put(extra), Err(PutError::Schema(_))));
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum Kind2 {
    Air,
    Ground,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Pos {
    x: f64,
    y: f64,
}

/// What a newer release reads of a `Beam`.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct BeamV2 {
    pos: Pos,
    id: i64,
    gain: f64,
    name: String,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Beam {
    id: u32,
    name: String,
    pos: Pos,
    kind: Kind2,
    note: Option<String>,
    samples: Vec<f64>,
    tags: Vec<String>,
}

#[test]
fn a_serde_type_s_schema_is_traced_and_its_values_round_trip() {
    let schema = Schema::of::<Beam>().unwrap();
    assert_eq!(schema.name, "Beam");
    let names: Vec<&str> = schema.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["id", "name", "pos", "kind", "note", "samples", "tags"]
    );
    assert_eq!(
        schema.fields[5].ty,
        FieldType::Array(milonga::ElementType::F64)
    );
    let dir = TempDir::new("schemas");
    let domain = "schema-serde";
    let a = open(domain, "writer", dir.path());
    let b = open(domain, "reader", dir.path());
    let p = a
        .publisher_with("beam/1", PublisherQos::reliable().schema(schema))
        .unwrap();
    let sub = b
        .subscribe_with("beam/1", SubscriberQos::default())
        .unwrap();
    // A typed subscription of a newer release's type: fields reordered,
    // `id` widened, `tags` dropped, `gain` added with a default.
    let newer = Schema::new(
        "Beam",
        vec![
            Field::new("pos", point()),
            Field::new("id", FieldType::I64),
            Field::new("gain", FieldType::F64).default_value(1.0),
            Field::new("name", FieldType::Text),
        ],
    );
    let typed = b
        .subscribe_with("beam/1", SubscriberQos::default().schema(newer).typed())
        .unwrap();
    wait_for("the subscribers", T, || p.subscriber_count() > 1);
    let beam = Beam {
        id: 3,
        name: "quad".into(),
        pos: Pos { x: 1.0, y: -2.0 },
        kind: Kind2::Ground,
        note: None,
        samples: vec![0.25, 0.5],
        tags: vec!["a".into()],
    };
    p.put_serde(&beam, 0).unwrap();
    let (got, _) = samples(&sub, 1);
    assert_eq!(got[0].encoding, Enc::Compact);
    assert_eq!(got[0].deserialize::<Beam>().unwrap(), beam);
    assert!(got[0].compact.is_none(), "a map, read as usual");
    // The typed subscription keeps the payload and reads the type from it.
    let (got, _) = samples(&typed, 1);
    assert_eq!(got[0].encoding, Enc::Compact);
    assert!(got[0].compact.is_some());
    assert!(
        matches!(got[0].value, Value::Bytes(_)),
        "{:?}",
        got[0].value
    );
    assert_eq!(
        got[0].deserialize::<BeamV2>().unwrap(),
        BeamV2 {
            pos: Pos { x: 1.0, y: -2.0 },
            id: 3,
            gain: 1.0,
            name: "quad".into(),
        }
    );
    // A type that does not fit is an error, not a wrong value.
    assert!(got[0].deserialize::<Pos>().is_err());
    // Recorded, a typed sample keeps the value map it stands for.
    use milonga::recording::{Entry, RecordOptions, RecordReader, RecordWriter};
    let file = dir.path().join("typed.mcap");
    let mut w = RecordWriter::create(&file, &RecordOptions::default()).unwrap();
    w.sample(&got[0], got[0].timestamp_ns).unwrap();
    w.finish().unwrap();
    let back: Vec<_> = RecordReader::open(&file)
        .unwrap()
        .filter_map(|e| match e.unwrap() {
            Entry::Sample(s, _) => Some(s),
            Entry::Event(..) => None,
        })
        .collect();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].value.get("name"), Some(&Value::Text("quad".into())));
    assert_eq!(back[0].value.get("gain"), Some(&Value::Float(1.0)));
    // Types with no schema are refused clearly.
    assert!(Schema::of::<u32>().is_err());
    assert!(Schema::of::<(u32, f64)>().is_err());
}

#[test]
fn a_reader_schema_reads_an_older_writer_and_refuses_an_incompatible_one_naming_the_field() {
    let dir = TempDir::new("schemas");
    let domain = "schema-evolve";
    let a = open(domain, "writers", dir.path());
    let b = open(domain, "reader", dir.path());
    // The reader is v2: `id` widened to i64 and renamed `ident` (alias
    // `id`), a field added with a default, `kind` dropped.
    let reader = Schema::new(
        "track",
        vec![
            Field::new("ident", FieldType::I64).alias("id"),
            Field::new("pos", point()),
            Field::new("wave", FieldType::Array(milonga::ElementType::F64)),
            Field::new("quality", FieldType::Text).default_value("unknown"),
        ],
    );
    let old = a
        .publisher_with("radar/old", PublisherQos::reliable().schema(track_v1()))
        .unwrap();
    // An incompatible writer: `pos.x` is text.
    let narrowed = Schema::new(
        "track",
        vec![
            Field::new("id", FieldType::I32),
            Field::new(
                "pos",
                FieldType::Struct(vec![
                    Field::new("x", FieldType::Text),
                    Field::new("y", FieldType::F64),
                ]),
            ),
            Field::new("wave", FieldType::Array(milonga::ElementType::F32)),
        ],
    );
    let bad = a
        .publisher_with("radar/bad", PublisherQos::reliable().schema(narrowed))
        .unwrap();
    let sub = b
        .subscribe_with("radar/**", SubscriberQos::default().schema(reader))
        .unwrap();
    wait_for("the subscriber", T, || {
        old.subscriber_count() > 0 && bad.subscriber_count() > 0
    });
    let bad_value = map(&[
        ("id", Value::Int(1)),
        (
            "pos",
            map(&[("x", Value::Text("far".into())), ("y", Value::Float(0.0))]),
        ),
        ("wave", Value::Array(vec![])),
    ]);
    bad.put(bad_value.clone()).unwrap();
    old.put(track(9)).unwrap();
    bad.put(bad_value).unwrap();
    old.put(track(10)).unwrap();
    let (got, events) = samples(&sub, 2);
    for (s, id) in got.iter().zip([9, 10]) {
        assert_eq!(
            s.key, "radar/old",
            "the incompatible writer's samples are refused"
        );
        assert_eq!(
            s.value,
            map(&[
                ("ident", Value::Int(id)),
                (
                    "pos",
                    map(&[("x", Value::Float(1.5)), ("y", Value::Float(id as f64))])
                ),
                (
                    "wave",
                    Value::Typed(milonga::TypedArray::from_vec(vec![0.5f64, 1.0, 2.0]))
                ),
                ("quality", Value::Text("unknown".into())),
            ])
        );
    }
    let refused: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::IncompatibleQos(q) if q.policy == QosPolicy::Schema => Some(q),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    assert_eq!(refused[0].key, "radar/bad");
    assert!(refused[0].detail.contains("pos.x"), "{}", refused[0].detail);
    wait_for("two refused samples", T, || {
        b.stats().samples_schema_refused == 2
    });
}

#[test]
fn a_compact_sample_whose_schema_never_comes_is_counted_not_delivered() {
    // A forged publisher sends compact samples naming a schema it never
    // answers for: the subscriber asks, waits (bounded), counts them in
    // `samples_unknown_schema`, and delivers the plain samples after them.
    let dir = TempDir::new("schemas");
    let domain = "schema-unknown";
    let b = open(domain, "reader", dir.path());
    let sub = b.subscribe("forged/k").unwrap();
    let (_ctx, pub_sock) =
        forge::forge_publisher(dir.path(), domain, "forged/k", 0, zmq::SocketType::XPUB, T);
    let send = |seq: u64, encoding: Encoding, schema_id: u32, payload: &[u8]| {
        let mut h = forge::header(domain, Kind::Sample, encoding, seq);
        h.schema_id = schema_id;
        let f = frame::encode(&milonga::Key::new("forged/k").unwrap(), &h, payload);
        pub_sock.send(f, 0).unwrap();
    };
    let seq = forge::until_delivered(&pub_sock, &sub, &b, domain, "forged/k", 1);
    // [1, 2.0]: a struct of two fields, by position.
    send(
        seq,
        Encoding::Compact,
        0x1234_5678,
        &[0x82, 0x01, 0xf9, 0x40, 0x00],
    );
    send(
        seq + 1,
        Encoding::Compact,
        0x1234_5678,
        &[0x82, 0x02, 0xf9, 0x40, 0x00],
    );
    send(seq + 2, Encoding::Cbor, 0, &[0x03]);
    let (got, events) = samples(&sub, 1);
    assert_eq!(got[0].seq, seq + 2);
    assert_eq!(got[0].value, Value::Int(3));
    assert!(
        !events.iter().any(|e| matches!(e, Event::Lost(_))),
        "arrived, so not lost: {events:?}"
    );
    assert_eq!(b.stats().samples_unknown_schema, 2);
}

#[test]
fn a_filter_at_the_publisher_reads_a_schema_d_sample_s_fields() {
    let dir = TempDir::new("schemas");
    let domain = "schema-filter";
    let a = open(domain, "writer", dir.path());
    let b = open(domain, "reader", dir.path());
    let p = a
        .publisher_with("radar/f", PublisherQos::default().schema(track_v1()))
        .unwrap();
    let filter = milonga::Filter {
        expr: Some("id >= 3 && pos.y > 2.5".into()),
        ..Default::default()
    };
    let sub = b
        .subscribe_with("radar/f", SubscriberQos::default().filter(filter))
        .unwrap();
    wait_for("the subscriber", T, || p.subscriber_count() > 0);
    let mut got = Vec::new();
    let mut i = 0;
    wait_for("filtered samples", T, || {
        i += 1;
        p.put(track(i)).unwrap();
        // Paces the puts (one per poll of the deadline-bound wait): the
        // filter declaration may reach the publisher after the first.
        std::thread::sleep(Duration::from_millis(10));
        while let Ok(e) = sub.try_recv() {
            if let Event::Sample(s) = e {
                got.push(s);
            }
        }
        got.len() >= 2
    });
    assert_eq!(got[0].value, track(3), "1 and 2 did not pass");
    assert_eq!(got[1].value, track(4));
    assert_eq!(a.stats().filter_errors, 0);
}
