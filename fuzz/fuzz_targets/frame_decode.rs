//! Fuzzes everything a subscriber does with the bytes of a data message:
//! frame decoding, batch iteration and payload decoding, with and without a
//! payload frame. Nothing may panic, loop or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use milonga_wire::cbor::decode_payload;
use milonga_wire::frame::{decode, BatchEntries, Kind};
use milonga_wire::Bytes;

fuzz_target!(|data: &[u8]| {
    // The first byte picks where a second frame would start, if anywhere.
    let (split, data) = match data.split_first() {
        Some((s, rest)) => (*s as usize, rest),
        None => return,
    };
    let (f1, f2) = if split % 2 == 1 && split / 2 < data.len() {
        let (a, b) = data.split_at(data.len() - split / 2);
        (a, Some(Bytes::copy_from_slice(b)))
    } else {
        (data, None)
    };
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
        // A refusal's body is JSON, read by serde_json.
        Kind::Denied => {}
        Kind::Sample | Kind::Heartbeat | Kind::Request => {
            let _ = decode_payload(view.header.encoding, Bytes::copy_from_slice(view.body), f2);
        }
        Kind::Batch => {
            for e in BatchEntries::new(view.body).into_iter().flatten().flatten() {
                let _ = decode_payload(view.header.encoding, Bytes::copy_from_slice(e.payload), None);
            }
        }
    }
});
