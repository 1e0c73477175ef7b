//! Fuzzes what a publisher's data socket does first with a history query a
//! subscriber sends upstream: `history::Query::decode`, on the message as
//! it comes and on its bytes behind the query tag (so that the fuzzer need
//! not find the tag to reach the CBOR). Nothing may panic, loop or allocate
//! without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use milonga_wire::history::{Query, QUERY_TAG};
use milonga_wire::KeyExpr;

fuzz_target!(|data: &[u8]| {
    let _ = Query::decode(data);
    let mut msg = Vec::with_capacity(data.len() + 1);
    msg.push(QUERY_TAG);
    msg.extend_from_slice(data);
    if let Ok(q) = Query::decode(&msg) {
        // What the publisher does next with a query that decodes.
        let _ = KeyExpr::new(q.expr.as_str());
    }
});
