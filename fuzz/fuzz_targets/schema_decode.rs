//! Fuzzes what a subscriber does with what a publisher sends it under a
//! schema: `schema::Schema::decode` of a schema (then the plans made of
//! it), and `schema::Plan::read` (and `Plan::deserialize`, the typed reader)
//! of a compact payload, by a fixed writer's
//! plan and by a reader's that converts. Nothing may panic, loop or
//! allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use milonga_wire::schema::{Field, Plan, Schema, Type};
use milonga_wire::{Bytes, ElementType};

fuzz_target!(|data: &[u8]| {
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
