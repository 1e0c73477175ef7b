//! History queries and replies (docs/protocol.md §4.2).
//!
//! A subscriber asks a publisher's data socket for samples it keeps by
//! sending a *query* upstream on the same connection as its subscriptions
//! (an XSUB message whose first byte is [`QUERY_TAG`]); so the publisher
//! reads the query after the subscriptions that precede it are in effect,
//! and everything it puts after answering reaches the subscriber live. The
//! answer is one or more *history* frames (kind 4) under the key
//! `@r/<token>`, which only the asking subscription subscribes to.

use bytes::Bytes;

use crate::cbor::{decode_cbor, encode_cbor};
use crate::frame::Encoding;
use crate::Value;

/// First byte of a query message (0 and 1 are ZeroMQ unsubscribe and
/// subscribe).
pub const QUERY_TAG: u8 = 0x02;
/// Prefix of the key history frames are sent under: `@r/<token>`.
pub const REPLY_KEY_PREFIX: &str = "@r/";
/// Longest token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 64;
/// Most schema ids one query asks for (`schemas`).
pub const MAX_SCHEMAS_ASKED: usize = 64;
/// Most compression dictionary ids one query asks for (`dictionaries`).
pub const MAX_DICTIONARIES_ASKED: usize = 8;

/// Why a query or a history frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistoryError {
    /// Not CBOR, or not the expected shape.
    #[error("malformed history message: {0}")]
    Malformed(String),
}

fn bad(what: impl Into<String>) -> HistoryError {
    HistoryError::Malformed(what.into())
}

/// A subscriber's request for kept samples.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// The publisher node asked (32 hex digits): a query reaches every
    /// publisher the subscription is connected to, and only this node's
    /// data socket `socket` answers.
    pub node: String,
    /// Which of its data sockets: `"best_effort"` or `"reliable"`.
    pub socket: String,
    /// The subscription's token: the reply goes under `@r/<token>`.
    pub token: String,
    /// Key expression: which keys.
    pub expr: String,
    /// For keys not in `since`: how many of the latest samples to send.
    pub last: u64,
    /// Per key, the last sequence number the subscriber has: everything
    /// after it that is still kept is sent (a repair).
    pub since: Vec<(String, u64)>,
    /// A number the subscriber chose, which the reply repeats: an answer
    /// to a copy sent again is told from the answer to a later query.
    /// Absent in queries of older subscribers.
    pub id: Option<u64>,
    /// Schema ids (docs/protocol.md §5.1) the subscriber needs: the reply's
    /// first frame carries those the node knows. Written only when not
    /// empty; at most [`MAX_SCHEMAS_ASKED`].
    pub schemas: Vec<u32>,
    /// Compression dictionary ids (docs/protocol.md §4) the subscriber
    /// needs to inflate the node's frames: the reply's first frame carries
    /// those the node knows. Written only when not empty; at most
    /// [`MAX_DICTIONARIES_ASKED`].
    pub dictionaries: Vec<u32>,
}

/// Ids asked for (`schemas`, `dictionaries`): at most `max`, each a u32.
fn ids(v: &Value, name: &str, max: usize) -> Result<Vec<u32>, HistoryError> {
    match v.get(name) {
        None => Ok(Vec::new()),
        Some(a) => {
            let a = array(a, name)?;
            if a.len() > max {
                return Err(bad(format!("more than {max} {name} asked")));
            }
            a.iter()
                .map(|i| u32::try_from(uint(i, name)?).map_err(|_| bad(format!("{name} id"))))
                .collect()
        }
    }
}

/// Ids written as an array field `name`, unless there are none.
fn push_ids(v: &mut Value, name: &str, ids: &[u32]) {
    if let (false, Value::Map(pairs)) = (ids.is_empty(), v) {
        let ids = ids.iter().map(|i| Value::from(u64::from(*i)));
        pairs.push((Value::from(name), Value::Array(ids.collect())));
    }
}

/// (id, bytes) pairs of field `name` (`schemas`, `dictionaries`).
fn blobs(v: &Value, name: &str) -> Result<Vec<(u32, Bytes)>, HistoryError> {
    match v.get(name) {
        None => Ok(Vec::new()),
        Some(a) => array(a, name)?
            .iter()
            .map(|e| match e {
                Value::Array(p) if p.len() == 2 => match &p[1] {
                    Value::Bytes(b) => Ok((
                        u32::try_from(uint(&p[0], name)?).map_err(|_| bad(format!("{name} id")))?,
                        b.clone(),
                    )),
                    _ => Err(bad(format!("a {name} entry's bytes are not a byte string"))),
                },
                _ => Err(bad(format!("{name} entry is not [id, bytes]"))),
            })
            .collect(),
    }
}

/// (id, bytes) pairs as an array field `name`, unless there are none.
fn push_blobs(fields: &mut Vec<(&str, Value)>, name: &'static str, blobs: &[(u32, Bytes)]) {
    if !blobs.is_empty() {
        let b = blobs.iter().map(|(id, b)| {
            Value::Array(vec![Value::from(u64::from(*id)), Value::Bytes(b.clone())])
        });
        fields.push((name, Value::Array(b.collect())));
    }
}

fn text(v: &Value, what: &str) -> Result<String, HistoryError> {
    match v {
        Value::Text(t) => Ok(t.clone()),
        _ => Err(bad(format!("{what} is not text"))),
    }
}

fn uint(v: &Value, what: &str) -> Result<u64, HistoryError> {
    match v {
        Value::Int(i) => u64::try_from(*i).map_err(|_| bad(format!("{what} is out of range"))),
        _ => Err(bad(format!("{what} is not an unsigned integer"))),
    }
}

fn field<'a>(m: &'a Value, name: &str) -> Result<&'a Value, HistoryError> {
    m.get(name).ok_or_else(|| bad(format!("no field {name:?}")))
}

fn array<'a>(v: &'a Value, what: &str) -> Result<&'a [Value], HistoryError> {
    match v {
        Value::Array(a) => Ok(a),
        _ => Err(bad(format!("{what} is not an array"))),
    }
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

/// `m` with `"id": id` last, when there is one.
fn with_id(m: Value, id: Option<u64>) -> Value {
    match (m, id) {
        (Value::Map(mut pairs), Some(id)) => {
            pairs.push((Value::from("id"), Value::from(id)));
            Value::Map(pairs)
        }
        (m, _) => m,
    }
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Only maps of text, integers, booleans, byte strings and arrays:
    // encoding cannot fail.
    let _ = encode_cbor(v, &mut out);
    out
}

impl Query {
    /// The message: [`QUERY_TAG`] then a CBOR map.
    pub fn encode(&self) -> Vec<u8> {
        let since = self
            .since
            .iter()
            .map(|(k, s)| Value::Array(vec![Value::from(k.as_str()), Value::from(*s)]))
            .collect();
        let v = map(vec![
            ("node", Value::from(self.node.as_str())),
            ("socket", Value::from(self.socket.as_str())),
            ("token", Value::from(self.token.as_str())),
            ("expr", Value::from(self.expr.as_str())),
            ("last", Value::from(self.last)),
            ("since", Value::Array(since)),
        ]);
        let mut v = with_id(v, self.id);
        push_ids(&mut v, "schemas", &self.schemas);
        push_ids(&mut v, "dictionaries", &self.dictionaries);
        let mut out = vec![QUERY_TAG];
        out.extend(encode(&v));
        out
    }

    /// Reads a query message. Unknown fields are ignored.
    pub fn decode(msg: &[u8]) -> Result<Query, HistoryError> {
        let Some((&QUERY_TAG, body)) = msg.split_first() else {
            return Err(bad("not a query"));
        };
        let v = decode_cbor(&Bytes::copy_from_slice(body)).map_err(|e| bad(e.to_string()))?;
        let token = text(field(&v, "token")?, "token")?;
        if token.is_empty() || token.len() > MAX_TOKEN_BYTES || token.contains(['\0', '/', '*']) {
            return Err(bad("bad token"));
        }
        let mut since = Vec::new();
        for e in array(field(&v, "since")?, "since")? {
            match e {
                Value::Array(p) if p.len() == 2 => {
                    since.push((text(&p[0], "since key")?, uint(&p[1], "since seq")?))
                }
                _ => return Err(bad("since entry is not [key, seq]")),
            }
        }
        Ok(Query {
            node: text(field(&v, "node")?, "node")?,
            socket: text(field(&v, "socket")?, "socket")?,
            token,
            expr: text(field(&v, "expr")?, "expr")?,
            last: uint(field(&v, "last")?, "last")?,
            since,
            id: v.get("id").map(|i| uint(i, "id")).transpose()?,
            schemas: ids(&v, "schemas", MAX_SCHEMAS_ASKED)?,
            dictionaries: ids(&v, "dictionaries", MAX_DICTIONARIES_ASKED)?,
        })
    }
}

/// One kept sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its sequence number.
    pub seq: u64,
    /// Its source timestamp.
    pub timestamp_ns: u64,
    /// Its payload encoding.
    pub encoding: Encoding,
    /// Its schema id.
    pub schema_id: u32,
    /// The payload, as a sample would carry it (frames joined).
    pub payload: Bytes,
}

/// What a publisher keeps of one key, as sent in a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyHistory {
    /// The key.
    pub key: String,
    /// The oldest sequence number still kept (`last + 1` when none is).
    pub first: u64,
    /// The last sequence number put on this key when the query was read:
    /// every later sample reaches the subscriber live.
    pub last: u64,
    /// The samples sent, in order.
    pub entries: Vec<Entry>,
    /// Whether its publisher republishes a recording (the header flag
    /// `FLAG_REPLAYED` of its live samples): `"replayed": true` in the
    /// key's map, absent otherwise.
    pub replayed: bool,
}

/// The body of a history frame (kind 4).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reply {
    /// The data socket that answers (as in the query); the node is the
    /// frame header's.
    pub socket: String,
    /// The keys of this frame.
    pub keys: Vec<KeyHistory>,
    /// Whether this is the last frame of the reply.
    pub done: bool,
    /// The query's `id`, if it had one.
    pub id: Option<u64>,
    /// The schemas asked for that the node knows: (id, the schema's CBOR
    /// bytes, docs/protocol.md §5.1). Written only when not empty.
    pub schemas: Vec<(u32, Bytes)>,
    /// The compression dictionaries asked for that the node knows: (id,
    /// the dictionary's bytes, docs/protocol.md §4). Written only when not
    /// empty.
    pub dictionaries: Vec<(u32, Bytes)>,
}

impl Reply {
    /// The CBOR body.
    pub fn encode(&self) -> Vec<u8> {
        let keys = self
            .keys
            .iter()
            .map(|k| {
                let entries = k
                    .entries
                    .iter()
                    .map(|e| {
                        Value::Array(vec![
                            Value::from(e.seq),
                            Value::from(e.timestamp_ns),
                            Value::from(e.encoding as u8 as u64),
                            Value::from(u64::from(e.schema_id)),
                            Value::Bytes(e.payload.clone()),
                        ])
                    })
                    .collect();
                let mut fields = vec![
                    ("key", Value::from(k.key.as_str())),
                    ("first", Value::from(k.first)),
                    ("last", Value::from(k.last)),
                    ("entries", Value::Array(entries)),
                ];
                if k.replayed {
                    fields.push(("replayed", Value::Bool(true)));
                }
                map(fields)
            })
            .collect();
        let mut fields = vec![
            ("socket", Value::from(self.socket.as_str())),
            ("keys", Value::Array(keys)),
            ("done", Value::Bool(self.done)),
        ];
        push_blobs(&mut fields, "schemas", &self.schemas);
        push_blobs(&mut fields, "dictionaries", &self.dictionaries);
        encode(&with_id(map(fields), self.id))
    }

    /// Reads a history frame's body. Payloads are views of `body`.
    pub fn decode(body: &Bytes) -> Result<Reply, HistoryError> {
        let v = decode_cbor(body).map_err(|e| bad(e.to_string()))?;
        let mut keys = Vec::new();
        for k in array(field(&v, "keys")?, "keys")? {
            let mut entries = Vec::new();
            for e in array(field(k, "entries")?, "entries")? {
                let e = array(e, "entry")?;
                let [seq, ts, enc, schema, Value::Bytes(payload)] = e else {
                    return Err(bad("entry is not [seq, ts, encoding, schema, bytes]"));
                };
                let enc = u8::try_from(uint(enc, "encoding")?).map_err(|_| bad("encoding"))?;
                entries.push(Entry {
                    seq: uint(seq, "seq")?,
                    timestamp_ns: uint(ts, "timestamp")?,
                    encoding: Encoding::from_u8(enc).ok_or_else(|| bad("unknown encoding"))?,
                    schema_id: u32::try_from(uint(schema, "schema")?)
                        .map_err(|_| bad("schema id"))?,
                    payload: payload.clone(),
                });
            }
            keys.push(KeyHistory {
                key: text(field(k, "key")?, "key")?,
                first: uint(field(k, "first")?, "first")?,
                last: uint(field(k, "last")?, "last")?,
                entries,
                replayed: matches!(k.get("replayed"), Some(Value::Bool(true))),
            });
        }
        Ok(Reply {
            socket: text(field(&v, "socket")?, "socket")?,
            keys,
            done: matches!(field(&v, "done")?, Value::Bool(true)),
            id: v.get("id").map(|i| uint(i, "id")).transpose()?,
            schemas: blobs(&v, "schemas")?,
            dictionaries: blobs(&v, "dictionaries")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_round_trip_and_refusals() {
        let q = Query {
            node: "00".repeat(16),
            socket: "reliable".into(),
            token: "00ff-3".into(),
            expr: "sr/**".into(),
            last: 5,
            since: vec![("sr/a".into(), 41)],
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        assert_eq!(Query::decode(&q.encode()).unwrap(), q);
        let with_id = Query {
            id: Some(7),
            schemas: vec![3, u32::MAX],
            dictionaries: vec![9],
            ..q.clone()
        };
        assert_eq!(Query::decode(&with_id.encode()).unwrap(), with_id);
        let too_many = Query {
            dictionaries: (0..9).collect(),
            ..q.clone()
        };
        assert!(Query::decode(&too_many.encode()).is_err(), "at most 8");
        assert_ne!(with_id.encode(), q.encode());
        assert!(Query::decode(b"\x02\xff").is_err());
        assert!(Query::decode(b"\x01abc").is_err());
        let mut bad_token = q.clone();
        bad_token.token = "a/b".into();
        assert!(Query::decode(&bad_token.encode()).is_err());
    }

    #[test]
    fn reply_round_trip() {
        let r = Reply {
            socket: "best_effort".into(),
            keys: vec![KeyHistory {
                key: "k".into(),
                first: 3,
                last: 4,
                entries: vec![Entry {
                    seq: 4,
                    timestamp_ns: 7,
                    encoding: Encoding::Cbor,
                    schema_id: 9,
                    payload: Bytes::from_static(&[0xf9, 0x3c, 0x00]),
                }],
                replayed: false,
            }],
            done: true,
            id: None,
            schemas: Vec::new(),
            dictionaries: Vec::new(),
        };
        assert_eq!(Reply::decode(&Bytes::from(r.encode())).unwrap(), r);
        // Schemas and dictionaries asked for, as (id, bytes) pairs.
        let blobs = Reply {
            schemas: vec![(5, Bytes::from_static(b"schema"))],
            dictionaries: vec![(6, Bytes::from_static(b"dict"))],
            ..r.clone()
        };
        assert_eq!(Reply::decode(&Bytes::from(blobs.encode())).unwrap(), blobs);
        let with_id = Reply {
            id: Some(u64::MAX),
            ..r.clone()
        };
        assert_eq!(
            Reply::decode(&Bytes::from(with_id.encode())).unwrap(),
            with_id
        );
        assert!(Reply::decode(&Bytes::from_static(b"\xa0")).is_err());
        // `replayed` is written only when true, and read back.
        let plain = r.encode();
        let mut replayed = r.clone();
        replayed.keys[0].replayed = true;
        let bytes = replayed.encode();
        assert_eq!(bytes.len(), plain.len() + "replayed".len() + 2);
        assert_eq!(Reply::decode(&Bytes::from(bytes)).unwrap(), replayed);
    }
}
