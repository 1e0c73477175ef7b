//! Fuzzes what a subscriber does with what a publisher sends it under a
//! schema: `schema::Schema::decode` of a schema (then the plans made of
//! it), and `schema::Plan::read` (and `Plan::deserialize`, the typed reader)
//! of a compact payload, by a fixed writer's
//! plan and by a reader's that converts; and the reader a
//! `#[derive(Compact)]` type has, which must read what the schema's own
//! reader reads, as the same value, and refuse what it refuses. Nothing
//! may panic, loop or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use milonga_wire::schema::{Field, Plan, Schema, Type};
use milonga_wire::{Bytes, ElementType};

#[derive(milonga_derive::Compact)]
#[compact(crate = "milonga_wire")]
enum Kind {
    A,
    B,
}

#[derive(milonga_derive::Compact)]
#[compact(crate = "milonga_wire")]
struct Point {
    x: f64,
    y: f64,
}

#[derive(milonga_derive::Compact)]
#[compact(crate = "milonga_wire")]
struct Derived {
    id: i32,
    pos: Point,
    kind: Kind,
    note: Option<String>,
    wave: Vec<i16>,
    items: Vec<Point>,
    b: Bytes,
    count: u64,
}

/// A value as CBOR (a NaN compares equal to itself there).
fn cbor(v: &milonga_wire::Value) -> Vec<u8> {
    let mut out = Vec::new();
    milonga_wire::cbor::encode_cbor(v, &mut out).unwrap();
    out
}

fuzz_target!(|data: &[u8]| {
    {
        use milonga_wire::compact::{from_slice, to_vec, CompactRecord};
        let schema = &Derived::record_schema().unwrap().schema;
        let plan = Plan::identity(schema);
        let by_schema = plan.read(&Bytes::copy_from_slice(data));
        match from_slice::<Derived>(data) {
            Ok(v) => {
                let again = plan.read(&Bytes::from(to_vec(&v))).unwrap();
                assert_eq!(by_schema.as_ref().map(cbor).ok(), Some(cbor(&again)));
            }
            Err(_) => assert!(by_schema.is_err()),
        }
    }
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
        ],
    );
    let reader = Schema::new(
        "t",
        vec![
            Field::new("ident", Type::F64).alias("id"),
            Field::new("wave", Type::Array(ElementType::F64)),
            Field::new("note", Type::Text).default_value("-"),
        ],
    );
    if let Ok(w) = Schema::decode(data) {
        let _ = Plan::resolve(&reader, &w);
        let _ = Plan::resolve(&w, &writer);
        let _ = w.encode();
    }
    let payload = Bytes::copy_from_slice(data);
    let _ = Plan::identity(&writer).read(&payload);
    let _ = Plan::identity(&writer).deserialize::<serde_json::Value>(&payload);
    if let Ok(p) = Plan::resolve(&reader, &writer) {
        let _ = p.read(&payload);
        let _ = p.deserialize::<serde_json::Value>(&payload);
    }
});
