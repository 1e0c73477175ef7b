//! `#[derive(milonga::Compact)]` (docs/schemas.md, "Derived types"): the
//! schema a derived type declares is the one `Schema::of` traces from the
//! same type's serde impl, its payloads are byte for byte the serde
//! writer's and read back by the schema's own reader; bad payloads are
//! errors, never panics or wrong values; through a publisher and a typed
//! subscription the type travels by position, and another release of it
//! is read through the subscription's schema.

use std::path::Path;
use std::time::Duration;

use milonga::wire::compact::{from_slice, to_vec, CompactRecord};
use milonga::{
    Config, Encoding, Event, FieldType, Node, PublisherQos, Schema, SubscriberQos, Value,
};
use milonga_testkit::{wait_for, TempDir};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, milonga::Compact)]
enum Status {
    Tentative,
    Confirmed,
    Coasted,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, milonga::Compact)]
struct Plot {
    sensor: u16,
    range_m: f32,
    time_ns: u64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, milonga::Compact)]
struct Pos {
    x: f64,
    y: f64,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, milonga::Compact)]
struct Track {
    id: u32,
    offset: i16,
    big: i64,
    pos: Pos,
    status: Status,
    callsign: String,
    note: Option<String>,
    alarm: bool,
    plots: Vec<Plot>,
    covariance: [f32; 4],
    wave: Vec<f64>,
    raw: Vec<u8>,
}

fn track(n: u32) -> Track {
    Track {
        id: 40_000 + n,
        offset: -300,
        big: -(1 << 40),
        pos: Pos {
            x: 1.5 + f64::from(n),
            y: -2.25,
        },
        status: Status::Confirmed,
        callsign: "AZA1234".into(),
        note: (n % 2 == 0).then(|| "even".into()),
        alarm: n % 3 == 0,
        plots: (0..3)
            .map(|i| Plot {
                sensor: 3 + i,
                range_m: 85_000.0 + f32::from(i),
                time_ns: 1_732_400_000_000_000_000 + u64::from(i),
            })
            .collect(),
        covariance: [25.0, 1.5, 1.5, 25.0],
        wave: vec![0.5, -1.0, 2.0],
        raw: vec![1, 2, 255],
    }
}

#[test]
fn a_derived_type_s_schema_and_payloads_are_the_serde_path_s() {
    let mine = Track::record_schema().unwrap();
    let traced = Schema::of::<Track>().unwrap();
    assert_eq!(mine.schema, traced, "the same schema from both");
    assert_eq!(
        mine.id,
        Schema::id_of(&traced.encode().unwrap()),
        "and so the same id"
    );
    assert_eq!(
        mine.schema.fields[10].ty,
        FieldType::Array(milonga::ElementType::F64)
    );
    let writer = traced.writer();
    for n in 0..4 {
        let t = track(n);
        let derived = to_vec(&t);
        let mut serde_bytes = Vec::new();
        writer.write_serde(&t, &mut serde_bytes).unwrap();
        assert_eq!(derived, serde_bytes, "track {n}: byte for byte");
        assert_eq!(from_slice::<Track>(&derived).unwrap(), t);
        // The schema's own reader (what a subscriber in any language
        // does) reads the derived payload as the map of the value.
        let map = traced.read_compact(&derived.clone().into()).unwrap();
        assert_eq!(map.get("callsign"), Some(&Value::Text("AZA1234".into())));
        assert_eq!(map.get("status"), Some(&Value::Text("Confirmed".into())));
        assert_eq!(map.get("id"), Some(&Value::Int((40_000 + n).into())));
    }
}

#[test]
fn bad_payloads_are_errors_naming_the_field_never_panics() {
    let good = to_vec(&track(2));
    // Cut anywhere: an error, never a panic or a value.
    for cut in 0..good.len() {
        assert!(from_slice::<Track>(&good[..cut]).is_err(), "cut at {cut}");
    }
    // Every byte changed in turn: an error or some value, never a panic.
    for i in 0..good.len() {
        for b in [0x00, 0x17, 0x1f, 0x5f, 0x7f, 0x9f, 0xbf, 0xdf, 0xf7, 0xff] {
            let mut bytes = good.clone();
            bytes[i] = b;
            let _ = from_slice::<Track>(&bytes);
        }
    }
    // Trailing bytes.
    let mut long = good.clone();
    long.push(0);
    assert!(from_slice::<Track>(&long).is_err());
    // A struct of another length.
    let e = from_slice::<Pos>(&[0x83, 0xfb, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err();
    assert!(e.to_string().contains("2 fields"), "{e}");
    // A u16 field given 70,000 (its schema type is u32: another writer
    // may send it), a negative u32, a variant past the last.
    let plot = |sensor: &[u8]| {
        let mut b = vec![0x83];
        b.extend_from_slice(sensor);
        b.extend_from_slice(&[0xfa, 0, 0, 0, 0, 0x01]);
        b
    };
    let e = from_slice::<Plot>(&plot(&[0x1a, 0, 1, 0x11, 0x70])).unwrap_err();
    assert!(e.to_string().contains("sensor"), "{e}");
    assert!(e.to_string().contains("70000"), "{e}");
    assert!(from_slice::<Plot>(&plot(&[0x20])).is_err());
    assert!(from_slice::<Status>(&[0x03]).is_err());
    assert_eq!(from_slice::<Status>(&[0x02]).unwrap(), Status::Coasted);
    // What §5.1 lets a writer send and a reader accept: a float64 or a
    // float16 for an f32, any head length for an integer, a big-endian
    // typed array, undefined for an absent optional.
    assert_eq!(
        from_slice::<Plot>(&[0x83, 0x19, 0, 7, 0xf9, 0x3c, 0x00, 0x1b, 0, 0, 0, 0, 0, 0, 0, 9])
            .unwrap(),
        Plot {
            sensor: 7,
            range_m: 1.0,
            time_ns: 9
        }
    );
    let mut be = vec![0xd8, 82, 0x50];
    for f in [1.0f64, 2.0] {
        be.extend_from_slice(&f.to_be_bytes());
    }
    assert_eq!(from_slice::<Vec<f64>>(&be).unwrap(), vec![1.0, 2.0]);
    assert_eq!(from_slice::<Option<String>>(&[0xf7]).unwrap(), None);
    // A typed array's bytes in chunks (an indefinite byte string, §5).
    let mut chunked = vec![0xd8, 86, 0x5f, 0x48];
    chunked.extend_from_slice(&1.5f64.to_le_bytes());
    chunked.extend_from_slice(&[0x48]);
    chunked.extend_from_slice(&(-2.0f64).to_le_bytes());
    chunked.push(0xff);
    assert_eq!(from_slice::<Vec<f64>>(&chunked).unwrap(), vec![1.5, -2.0]);
    // An array of another element type: refused, not converted.
    assert!(from_slice::<Vec<f64>>(&[0xd8, 85, 0x44, 0, 0, 0x80, 0x3f]).is_err());
    // Many one-byte items of a large type: refused by the payload's
    // memory budget, not allocated (200,000 x 520 bytes).
    let mut nulls = vec![0x9a, 0, 3, 0x0d, 0x40];
    nulls.resize(nulls.len() + 200_000, 0xf6);
    let e = from_slice::<Vec<Option<[f64; 64]>>>(&nulls).unwrap_err();
    assert!(e.to_string().contains("more than"), "{e}");
    // A type that contains itself, read from a deep payload: an error at
    // the schema's depth limit, not a stack overflow.
    let mut deep = Vec::new();
    for _ in 0..100_000 {
        deep.extend_from_slice(&[0x82, 0x60, 0x81]);
    }
    let e = from_slice::<Tree>(&deep).unwrap_err();
    assert!(e.to_string().contains("deeper"), "{e}");
    // A list claiming more items than bytes left: refused before any
    // allocation of that size.
    assert!(
        from_slice::<Vec<Pos>>(&[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).is_err()
    );
    // A nested error names its path.
    let mut t = track(1);
    t.plots[1].sensor = 9;
    let mut bytes = to_vec(&t);
    let at = bytes.windows(2).position(|w| w == [0x83, 0x09]).unwrap();
    bytes[at + 1] = 0x38; // -25: a negative sensor
    bytes.insert(at + 2, 0x18);
    let e = from_slice::<Track>(&bytes).unwrap_err();
    assert!(e.to_string().contains("plots[1].sensor"), "{e}");
}

#[derive(Debug, milonga::Compact)]
struct Tree {
    label: String,
    children: Vec<Tree>,
}

/// A type that contains itself three times over: its type tree would
/// grow as 3^depth.
#[derive(Debug, milonga::Compact)]
struct Bushy {
    a: Vec<Bushy>,
    b: Vec<Bushy>,
    c: Option<Box<Bushy>>,
}

#[allow(non_camel_case_types)]
#[derive(Debug, PartialEq, serde::Deserialize, milonga::Compact)]
enum r#Raw {
    r#type,
    r#match,
}

#[derive(Debug, PartialEq, serde::Deserialize, milonga::Compact)]
struct r#Keywords {
    r#type: r#Raw,
    r#loop: u8,
}

#[derive(Debug, PartialEq, milonga::Compact)]
struct Renamed {
    #[compact(rename = "id", alias = "ident")]
    track_id: u32,
    #[compact(default = 1.0)]
    gain: f64,
}

#[test]
fn attributes_name_the_schema_s_fields_and_a_type_that_contains_itself_is_refused() {
    let s = &Renamed::record_schema().unwrap().schema;
    assert_eq!(s.name, "Renamed");
    assert_eq!(s.fields[0].name, "id");
    assert_eq!(s.fields[0].aliases, ["ident"]);
    assert_eq!(s.fields[1].default, Some(Value::Float(1.0)));
    let e = Tree::record_schema().unwrap_err();
    assert!(e.to_string().contains("contains itself"), "{e}");
    let e = Bushy::record_schema().unwrap_err();
    assert!(e.to_string().contains("contains itself"), "{e}");
    // Raw identifiers are named as serde names them.
    assert_eq!(
        Keywords::record_schema().unwrap().schema,
        Schema::of::<Keywords>().unwrap()
    );
}

fn open(domain: &str, name: &str, dir: &Path) -> Node {
    let mut cfg = Config::new(&format!("milonga:///{domain}"), name);
    cfg.runtime_dir = Some(dir.to_path_buf());
    Node::open_with(cfg).expect("open node")
}

fn next_sample(sub: &milonga::Subscriber) -> milonga::Sample {
    let end = std::time::Instant::now() + T;
    loop {
        assert!(std::time::Instant::now() < end, "no sample in {T:?}");
        if let Ok(Event::Sample(s)) = sub.recv_timeout(Duration::from_millis(200)) {
            return s;
        }
    }
}

/// A newer release of `Pos`: a field added, with a default.
#[derive(Debug, PartialEq, milonga::Compact)]
struct PosV2 {
    x: f64,
    y: f64,
    #[compact(default = 0.0)]
    z: f64,
}

#[test]
fn a_derived_type_travels_by_position_and_another_release_reads_it_through_its_schema() {
    let dir = TempDir::new("compact-derive");
    let domain = "compact-derive";
    let a = open(domain, "writer", dir.path());
    let b = open(domain, "reader", dir.path());
    let schema = Track::record_schema().unwrap().schema.clone();
    let p = a
        .publisher_with("radar/track", PublisherQos::reliable().schema(schema))
        .unwrap();
    let typed = b
        .subscribe_with("radar/track", SubscriberQos::default().reliable().typed())
        .unwrap();
    let plain = b
        .subscribe_with("radar/track", SubscriberQos::default().reliable())
        .unwrap();
    wait_for("the subscribers", T, || p.subscriber_count() > 1);
    p.put_compact(&track(4)).unwrap();
    let s = next_sample(&typed);
    assert_eq!(s.encoding, Encoding::Compact);
    assert!(matches!(s.value, Value::Bytes(_)), "kept as the payload");
    assert_eq!(s.read::<Track>().unwrap(), track(4));
    assert_eq!(s.deserialize::<Track>().unwrap(), track(4));
    let s = next_sample(&plain);
    assert!(matches!(s.value, Value::Map(_)), "read into its map");
    assert_eq!(s.read::<Track>().unwrap(), track(4));
    // A type whose schema the sample's is not: an error, not a value.
    assert!(s.read::<Pos>().is_err());

    // A writer of the old `Pos`, a reader of the new: through the
    // subscription's schema, the added field takes its default.
    let old = a
        .publisher_with(
            "radar/pos",
            PublisherQos::reliable().schema(Pos::record_schema().unwrap().schema.clone()),
        )
        .unwrap();
    let newer = b
        .subscribe_with(
            "radar/pos",
            SubscriberQos::default()
                .reliable()
                .typed()
                .schema(PosV2::record_schema().unwrap().schema.clone()),
        )
        .unwrap();
    let unconverted = b
        .subscribe_with("radar/pos", SubscriberQos::default().reliable().typed())
        .unwrap();
    wait_for("the pos subscribers", T, || old.subscriber_count() > 1);
    old.put_compact(&Pos { x: 1.0, y: 2.0 }).unwrap();
    assert_eq!(
        next_sample(&newer).read::<PosV2>().unwrap(),
        PosV2 {
            x: 1.0,
            y: 2.0,
            z: 0.0
        }
    );
    assert_eq!(
        next_sample(&unconverted).read::<Pos>().unwrap(),
        Pos { x: 1.0, y: 2.0 }
    );

    // A publisher without the type's schema puts its map of fields.
    let loose = a
        .publisher_with("radar/loose", PublisherQos::reliable())
        .unwrap();
    let sub = b
        .subscribe_with("radar/loose", SubscriberQos::default().reliable())
        .unwrap();
    wait_for("the loose subscriber", T, || loose.subscriber_count() > 0);
    loose.put_compact(&track(5)).unwrap();
    let s = next_sample(&sub);
    assert_eq!(s.encoding, Encoding::Cbor);
    assert_eq!(s.read::<Track>().unwrap(), track(5));
    assert_eq!(
        s.value.get("status"),
        Some(&Value::Text("Confirmed".into()))
    );
    // A publisher of another schema refuses the value.
    assert!(old.put_compact(&track(6)).is_err());
}
