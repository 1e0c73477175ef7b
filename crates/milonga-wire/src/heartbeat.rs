//! The body of a heartbeat (a frame of kind 3 under [`HEARTBEAT_KEY`],
//! docs/protocol.md §4.1): a CBOR map with `leaving` (true in the goodbye
//! a closing node sends) and, in a goodbye, `last`: the last sequence
//! number of each of its keys. Other fields are ignored.
//!
//! [`HEARTBEAT_KEY`]: crate::frame::HEARTBEAT_KEY

use bytes::Bytes;

use crate::cbor::{decode_cbor, encode_cbor};
use crate::Value;

/// A heartbeat's body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Heartbeat {
    /// The node is closing: this is its goodbye.
    pub leaving: bool,
    /// In a goodbye, the last sequence number of each key.
    pub last: Last,
}

/// The `last` field of a heartbeat, as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Last {
    /// Absent (or empty: an encoder leaves an empty one out).
    #[default]
    Absent,
    /// Key -> last sequence number, in the order sent.
    Keys(Vec<(String, u64)>),
    /// Present but not a map (its value, for the log).
    NotAMap(String),
    /// A map with an entry that is not text -> unsigned integer.
    BadEntry,
}

/// Why bytes are not a heartbeat body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a heartbeat's body is not a CBOR map")]
pub struct NotAMap;

impl Heartbeat {
    /// The body: `{"leaving": bool}`, with `"last": {key: seq, ...}` when
    /// `last` holds keys.
    pub fn encode(&self) -> Vec<u8> {
        let mut fields = vec![(Value::from("leaving"), Value::Bool(self.leaving))];
        if let Last::Keys(keys) = &self.last {
            if !keys.is_empty() {
                let last = keys
                    .iter()
                    .map(|(k, s)| (Value::from(k.as_str()), Value::from(*s)))
                    .collect();
                fields.push((Value::from("last"), Value::Map(last)));
            }
        }
        let mut out = Vec::new();
        // Text, booleans and integers: encoding cannot fail.
        let _ = encode_cbor(&Value::Map(fields), &mut out);
        out
    }

    /// Reads a body. `leaving` is true only when the field is `true`.
    pub fn decode(body: &[u8]) -> Result<Heartbeat, NotAMap> {
        let Ok(Value::Map(pairs)) = decode_cbor(&Bytes::copy_from_slice(body)) else {
            return Err(NotAMap);
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == Value::from(name))
                .map(|(_, v)| v)
        };
        let leaving = field("leaving") == Some(&Value::Bool(true));
        let last = match field("last") {
            None => Last::Absent,
            Some(Value::Map(entries)) => entries
                .iter()
                .map(|(k, v)| match (k, v) {
                    (Value::Text(k), Value::Int(i)) => {
                        u64::try_from(*i).ok().map(|s| (k.clone(), s))
                    }
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .map_or(Last::BadEntry, Last::Keys),
            Some(other) => Last::NotAMap(format!("{other:?}")),
        };
        Ok(Heartbeat { leaving, last })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goodbye_round_trips_and_an_alive_heartbeat_carries_no_last() {
        let bye = Heartbeat {
            leaving: true,
            last: Last::Keys(vec![("a/b".into(), 7), ("c".into(), 1)]),
        };
        assert_eq!(Heartbeat::decode(&bye.encode()).unwrap(), bye);
        let alive = Heartbeat::default();
        assert_eq!(Heartbeat::decode(&alive.encode()).unwrap(), alive);
        // An empty `last` is left out.
        let empty = Heartbeat {
            leaving: true,
            last: Last::Keys(vec![]),
        };
        assert_eq!(
            Heartbeat::decode(&empty.encode()).unwrap().last,
            Last::Absent
        );
    }

    #[test]
    fn bad_bodies_and_bad_last_fields_are_told_apart() {
        let enc = |v: Value| {
            let mut out = Vec::new();
            encode_cbor(&v, &mut out).unwrap();
            out
        };
        assert_eq!(Heartbeat::decode(&enc(Value::Int(1))), Err(NotAMap));
        assert_eq!(Heartbeat::decode(b"\xff"), Err(NotAMap));
        let with_last = |last: Value| {
            Heartbeat::decode(&enc(Value::Map(vec![
                (Value::from("leaving"), Value::Bool(true)),
                (Value::from("last"), last),
                (Value::from("unknown"), Value::Null),
            ])))
            .unwrap()
            .last
        };
        assert_eq!(with_last(Value::Int(3)), Last::NotAMap("Int(3)".into()));
        assert_eq!(
            with_last(Value::Map(vec![(Value::from("k"), Value::Int(-1))])),
            Last::BadEntry
        );
        assert_eq!(
            with_last(Value::Map(vec![(Value::Int(1), Value::Int(1))])),
            Last::BadEntry
        );
        // `leaving` is true only when it says so.
        let not = enc(Value::Map(vec![(Value::from("leaving"), Value::Int(1))]));
        assert!(!Heartbeat::decode(&not).unwrap().leaving);
    }
}
