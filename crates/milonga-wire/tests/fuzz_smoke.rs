//! A short, deterministic fuzz run on stable Rust, part of every test run:
//! the golden vectors and 200,000 mutations of them (bit flips, byte
//! changes, truncations, extensions) through the frame and payload decoders.
//! The coverage-guided fuzzer is fuzz/ (cargo-fuzz, nightly; docs/fuzzing.md).

use milonga_wire::cbor::decode_payload;
use milonga_wire::frame::{decode, BatchEntries, Kind};
use milonga_wire::Bytes;

fn run(f1: &[u8], f2: Option<&[u8]>) {
    let Ok(view) = decode(f1) else { return };
    match view.header.kind {
        Kind::Reply => {
            if let Some(status) = view.body.first() {
                if *status != 0 {
                    let _ = milonga_wire::service::Failure::decode(&view.body[1..]);
                }
            }
        }
        Kind::History => {
            let _ = milonga_wire::history::Reply::decode(&Bytes::copy_from_slice(view.body));
        }
        Kind::Denied => {
            let _ = serde_json::from_slice::<milonga_wire::frame::Denied>(view.body);
        }
        Kind::Sample | Kind::Heartbeat | Kind::Request => {
            let _ = decode_payload(
                view.header.encoding,
                Bytes::copy_from_slice(view.body),
                f2.map(Bytes::copy_from_slice),
            );
        }
        Kind::Batch => {
            for e in BatchEntries::new(view.body).into_iter().flatten().flatten() {
                let _ = decode_payload(
                    view.header.encoding,
                    Bytes::copy_from_slice(e.payload),
                    None,
                );
            }
        }
    }
}

#[test]
fn mutations_of_the_vectors_never_panic() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty());
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
    for i in 0..200_000 {
        let f = mutate(&seeds[i % seeds.len()], &mut rnd);
        let cut = (rnd() % (f.len() as u64 + 1)) as usize;
        run(&f, None);
        run(&f[..cut], Some(&f[cut..]));
    }
}

/// A deterministic xorshift generator from `seed` (the runs are the same
/// every time).
fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// One mutation of `seed`: a bit flip, a byte changed, a
/// truncation, an extension, or random bytes.
fn mutate(seed: &[u8], rnd: &mut impl FnMut() -> u64) -> Vec<u8> {
    let mut f = seed.to_vec();
    match rnd() % 5 {
        0 => {
            let n = f.len().max(1);
            let bit = (rnd() % (n as u64 * 8)) as usize;
            if let Some(b) = f.get_mut(bit / 8) {
                *b ^= 1 << (bit % 8);
            }
        }
        1 => {
            let n = f.len().max(1);
            let at = (rnd() % n as u64) as usize;
            if let Some(b) = f.get_mut(at) {
                *b = rnd() as u8;
            }
        }
        2 => {
            let keep = (rnd() % (f.len() as u64 + 1)) as usize;
            f.truncate(keep);
        }
        3 => {
            let extra = rnd() % 64;
            f.extend((0..extra).map(|_| rnd() as u8));
        }
        _ => {
            let len = rnd() % 200;
            f = (0..len).map(|_| rnd() as u8).collect();
        }
    }
    f
}

/// What a subscriber sends upstream to a publisher's data socket besides
/// subscriptions: history queries (`history::Query::decode`) and filter
/// declarations (`filter::Declaration::decode`, which parses the filter's
/// expression), and the expression parser and evaluator on their own.
/// 100,000 mutations of valid messages and expressions; nothing may panic.
#[test]
fn mutations_of_history_queries_and_filter_declarations_never_panic() {
    use milonga_wire::filter::{Declaration, Expr, Filter, DECLARE_TAG};
    use milonga_wire::history::{Query, QUERY_TAG};
    use milonga_wire::Value;

    let node = "ab".repeat(16);
    let exprs = [
        r#"value > 3.5 && status == "ON" || !(limits.high <= -1e3)"#,
        r#"((value != null)) && name >= "a\"b\\c""#,
        "!!true || x.y.z < 0.5e-3 && value == false",
    ];
    let mut seeds: Vec<Vec<u8>> = vec![
        Query {
            node: node.clone(),
            socket: "reliable".into(),
            token: "0123456789abcdef0123456789abcdef".into(),
            expr: "sr/**".into(),
            last: 5,
            since: vec![("sr/a".into(), 41), ("sr/b/c".into(), u64::MAX)],
            id: Some(3),
            schemas: vec![7, u32::MAX],
            dictionaries: Vec::new(),
        }
        .encode(),
        Query {
            node: node.clone(),
            socket: "best_effort".into(),
            token: "t".into(),
            expr: "a/*/c".into(),
            last: u64::MAX,
            since: vec![],
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        }
        .encode(),
    ];
    for (i, e) in exprs.iter().enumerate() {
        seeds.push(
            Declaration {
                node: node.clone(),
                socket: "best_effort".into(),
                keys: format!("sr/*/{i}/**"),
                filter: Filter {
                    expr: Some((*e).into()),
                    abs_change: Some(0.5),
                    rel_change: (i % 2 == 0).then_some(0.1),
                    min_period_ms: Some(100),
                },
            }
            .encode(),
        );
    }
    // The seeds are valid: mutations start from messages that decode.
    assert!(Query::decode(&seeds[0]).is_ok() && Query::decode(&seeds[1]).is_ok());
    for s in &seeds[2..] {
        assert!(Declaration::decode(s).is_ok());
    }
    let values = [
        Value::Float(4.0),
        Value::Map(vec![
            (Value::from("status"), Value::from("ON")),
            (
                Value::from("limits"),
                Value::Map(vec![(Value::from("high"), Value::Int(10))]),
            ),
        ]),
        Value::Null,
    ];
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
    for i in 0..100_000 {
        let f = mutate(&seeds[i % seeds.len()], &mut rnd);
        let _ = Query::decode(&f);
        let _ = Declaration::decode(&f);
        // The mutated body under each tag, so that every mutation reaches
        // both decoders' CBOR.
        if let Some((_, body)) = f.split_first() {
            let mut m = Vec::with_capacity(f.len());
            m.push(QUERY_TAG);
            m.extend_from_slice(body);
            let _ = Query::decode(&m);
            m[0] = DECLARE_TAG;
            let _ = Declaration::decode(&m);
        }
        let text = mutate(exprs[i % exprs.len()].as_bytes(), &mut rnd);
        if let Ok(e) = Expr::parse(&String::from_utf8_lossy(&text)) {
            for v in &values {
                let _ = e.eval(v);
            }
        }
    }
}

/// What a node does with every datagram on its scouting socket, which
/// anyone on the network can send: 100,000 mutations of a hello through
/// `scout::Hello::decode`; nothing may panic, and what decodes encodes to
/// a hello that decodes the same.
#[test]
fn mutations_of_a_scouting_hello_never_panic() {
    use milonga_wire::scout::Hello;
    let seed = Hello {
        leaving: false,
        ask: true,
        domain_tag: 0xdead_beef,
        node_id: milonga_wire::NodeId([9; 16]),
        version: 3,
        control: "tcp://10.99.0.1:7100".into(),
        announcement: Some(br#"{"node_id":"x"}"#.to_vec()),
        key: Some([3; 32]),
    }
    .encode();
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
    let mut decoded = 0;
    for _ in 0..100_000 {
        let f = mutate(&seed, &mut rnd);
        if let Ok(h) = Hello::decode(&f) {
            decoded += 1;
            assert_eq!(Hello::decode(&h.encode()).as_ref(), Ok(&h));
        }
    }
    // Some mutations (a flipped flag, a changed id) still decode.
    assert!(decoded > 0);
}

/// The reader's schema of the test below, as a serde type.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct ReaderType {
    ident: f64,
    wave: Vec<f64>,
    more: String,
    note: String,
}

/// Schemas a publisher answers (`schema::Schema::decode`, then the plans a
/// subscriber makes of one), and compact payloads read with a schema
/// (`schema::Plan::read`, and `Plan::deserialize` into a type): 100,000 mutations of a valid schema and of a
/// valid payload, each read by the writer's plan and by a reader's that
/// converts; nothing may panic.
#[test]
fn mutations_of_schemas_and_compact_payloads_never_panic() {
    use milonga_wire::schema::{Field, Plan, Schema, Type};
    use milonga_wire::{ElementType, TypedArray, Value};

    let point = Type::Struct(vec![Field::new("x", Type::F64), Field::new("y", Type::F32)]);
    let writer = Schema::new(
        "t",
        vec![
            Field::new("id", Type::I32),
            Field::new("pos", point.clone()),
            Field::new("kind", Type::Enum(vec!["a".into(), "b".into()])),
            Field::new("note", Type::Optional(Box::new(Type::Text))),
            Field::new("wave", Type::Array(ElementType::I16)),
            Field::new("items", Type::List(Box::new(point))),
            Field::new("any", Type::Any),
            Field::new("b", Type::Bytes),
        ],
    );
    let reader = Schema::new(
        "t",
        vec![
            Field::new("ident", Type::F64).alias("id"),
            Field::new("wave", Type::Array(ElementType::F64)),
            Field::new("more", Type::Text).default_value("x"),
            Field::new("note", Type::Text).default_value("-"),
        ],
    );
    let t = |s: &str| Value::Text(s.into());
    let pt = Value::Map(vec![
        (t("x"), Value::Float(1.0)),
        (t("y"), Value::Float(2.0)),
    ]);
    let value = Value::Map(vec![
        (t("id"), Value::Int(-7)),
        (t("pos"), pt.clone()),
        (t("kind"), t("b")),
        (t("note"), Value::Null),
        (
            t("wave"),
            Value::Typed(TypedArray::from_vec(vec![1i16, -2, 3])),
        ),
        (t("items"), Value::Array(vec![pt.clone(), pt])),
        (t("any"), Value::Array(vec![Value::Int(1), t("z")])),
        (t("b"), Value::Bytes(Bytes::from_static(b"\x00\x01"))),
    ]);
    let mut payload = Vec::new();
    writer.write_compact(&value, &mut payload).unwrap();
    let schema = writer.encode().unwrap();
    let plans = [
        Plan::identity(&writer),
        Plan::resolve(&reader, &writer).unwrap(),
    ];
    assert_eq!(plans[0].read(&Bytes::from(payload.clone())).unwrap(), value);
    let mut rnd = xorshift(0x5eed_5c4e_3a11_0001);
    for i in 0..100_000 {
        if i % 2 == 0 {
            let s = mutate(&schema, &mut rnd);
            if let Ok(w) = Schema::decode(&s) {
                let _ = Plan::resolve(&reader, &w);
                let _ = Plan::identity(&w).read(&Bytes::from(payload.clone()));
                let _ = w.encode();
            }
        } else {
            let p = Bytes::from(mutate(&payload, &mut rnd));
            for plan in &plans {
                let _ = plan.read(&p);
                // The typed reader (`Plan::deserialize`), into a type that
                // takes anything and into the reader's own.
                let _ = plan.deserialize::<serde_json::Value>(&p);
            }
            let _ = plans[1].deserialize::<ReaderType>(&p);
        }
    }
}

#[derive(Debug, PartialEq, milonga_derive::Compact)]
#[compact(crate = "milonga_wire")]
enum DerivedKind {
    A,
    B,
}

#[derive(Debug, PartialEq, milonga_derive::Compact)]
#[compact(crate = "milonga_wire")]
struct DerivedPoint {
    x: f64,
    y: f64,
}

/// A type with derived compact code (`#[derive(Compact)]`): its reader is
/// checked against the schema's own on every mutation.
#[derive(Debug, PartialEq, milonga_derive::Compact)]
#[compact(crate = "milonga_wire")]
struct Derived {
    id: i32,
    pos: DerivedPoint,
    kind: DerivedKind,
    note: Option<String>,
    wave: Vec<i16>,
    items: Vec<DerivedPoint>,
    b: Bytes,
    count: u64,
    flag: bool,
}

#[test]
fn mutations_of_a_derived_type_s_payload_never_panic_and_read_as_the_schema_reads_them() {
    use milonga_wire::compact::{from_slice, to_vec, CompactRecord};
    use milonga_wire::schema::Plan;

    let schema = &Derived::record_schema().unwrap().schema;
    let plan = Plan::identity(schema);
    let pt = |x: f64| DerivedPoint { x, y: -x };
    let value = Derived {
        id: -70_000,
        pos: pt(1.5),
        kind: DerivedKind::B,
        note: Some("note".into()),
        wave: vec![1, -2, 300],
        items: vec![pt(2.0), pt(3.0)],
        b: Bytes::from_static(b"\x00\x01"),
        count: 1 << 40,
        flag: true,
    };
    let payload = to_vec(&value);
    assert_eq!(from_slice::<Derived>(&payload).unwrap(), value);
    let mut rnd = xorshift(0x5eed_5c4e_3a11_0002);
    let (mut both, mut neither) = (0, 0);
    for _ in 0..100_000 {
        let p = mutate(&payload, &mut rnd);
        let by_schema = plan.read(&Bytes::from(p.clone()));
        match from_slice::<Derived>(&p) {
            // What the derived reader reads, the schema's reader reads
            // as the same value.
            Ok(v) => {
                let again = plan.read(&Bytes::from(to_vec(&v))).unwrap();
                // Compared as CBOR: a NaN is not equal to itself.
                let cbor = |v: &milonga_wire::Value| {
                    let mut out = Vec::new();
                    milonga_wire::cbor::encode_cbor(v, &mut out).unwrap();
                    out
                };
                let by_schema = by_schema.as_ref().map(cbor).ok();
                assert_eq!(by_schema, Some(cbor(&again)), "{p:02x?}");
                both += 1;
            }
            // And what it refuses, the schema's reader refuses.
            Err(e) => {
                assert!(
                    by_schema.is_err(),
                    "{p:02x?}: derived: {e}, schema: {by_schema:?}"
                );
                neither += 1;
            }
        }
    }
    assert!(
        both > 100 && neither > 100,
        "{both} read, {neither} refused"
    );
}
