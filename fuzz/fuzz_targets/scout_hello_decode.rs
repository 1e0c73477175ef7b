//! Fuzzes what a node does with every datagram that reaches its scouting
//! socket: `scout::Hello::decode` (anyone on the network can send one), and
//! the re-encoding of what decodes, which must give the same datagram back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use milonga_wire::scout::Hello;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Hello::decode(data) {
        let again = h.encode();
        // Unknown flag bits and the reserved bytes are not kept.
        assert_eq!(Hello::decode(&again).as_ref(), Ok(&h));
    }
});
