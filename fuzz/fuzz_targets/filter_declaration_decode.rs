//! Fuzzes what a publisher's data socket does first with a filter
//! declaration a subscriber sends upstream: `filter::Declaration::decode`
//! (which validates the filter and parses its expression), on the message
//! as it comes and on its bytes behind the declaration tag; and the
//! expression parser and evaluator on the input as text. Nothing may
//! panic, loop or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use milonga_wire::filter::{Declaration, Expr, DECLARE_TAG};
use milonga_wire::{KeyExpr, Value};

fuzz_target!(|data: &[u8]| {
    let _ = Declaration::decode(data);
    let mut msg = Vec::with_capacity(data.len() + 1);
    msg.push(DECLARE_TAG);
    msg.extend_from_slice(data);
    if let Ok(d) = Declaration::decode(&msg) {
        // What the publisher does next with a declaration that decodes.
        let _ = d.filter.id_for(&d.keys);
        let _ = KeyExpr::new(d.keys.as_str());
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(e) = Expr::parse(text) {
            for v in [
                Value::Float(4.0),
                Value::Null,
                Value::Map(vec![(Value::from("status"), Value::from("ON"))]),
            ] {
                let _ = e.eval(&v);
            }
        }
    }
});
