//! The calling side of a service call, with no socket: the request frame
//! (docs/protocol.md §4.5) and what a received message means for the call
//! that waits (its reply, or nothing of its own: counted and dropped).

use milonga_wire::cbor::{decode_payload, Encoded};
use milonga_wire::frame::{self, Header, Kind, FLAG_PAYLOAD_FRAME};
use milonga_wire::service::{Failure, ReplyStatus};
use milonga_wire::{Bytes, Key, Value};

use crate::engine::Me;
use crate::model::error::CallError;
use crate::util::stats;

/// The request frame of call `call_id` to `key`, sent at `timestamp_ns`:
/// the frame and, for a large payload, the second frame to send after it
/// (`enc.tail`).
pub(crate) fn request_frame(
    me: &Me<'_>,
    key: &Key,
    call_id: u64,
    enc: &Encoded,
    timestamp_ns: u64,
) -> Vec<u8> {
    let header = Header {
        kind: Kind::Request,
        flags: if enc.tail.is_some() {
            FLAG_PAYLOAD_FRAME
        } else {
            0
        },
        encoding: enc.encoding,
        domain_tag: me.domain_tag,
        schema_id: 0,
        node_id: me.id,
        seq: call_id,
        timestamp_ns,
    };
    let mut msg = vec![0u8; frame::head_len(key) + enc.head.len()];
    let n = frame::write_head(key, &header, &mut msg);
    msg[n..].copy_from_slice(&enc.head);
    msg
}

/// The call a reply may answer.
pub(crate) struct Waiting<'a> {
    /// The call's id: the request's sequence number, the reply's too.
    pub(crate) call_id: u64,
    /// The service key called.
    pub(crate) key: &'a str,
    /// The server's name, for errors.
    pub(crate) server: &'a str,
}

/// The outcome `parts` (one received message) gives the call `to`, or
/// `None` if it is not that call's reply: malformed (counted in
/// `frames_malformed`) or the late reply of an earlier call on the same
/// connection (`calls_late_replies`). Replies are counted by status.
pub(crate) fn outcome(
    me: &Me<'_>,
    to: &Waiting<'_>,
    mut parts: Vec<Bytes>,
) -> Option<Result<Value, CallError>> {
    let c = me.counters;
    if parts.is_empty() || parts.len() > 2 {
        stats::inc(&c.frames_malformed);
        return None;
    }
    let second = (parts.len() == 2).then(|| parts.pop().expect("2"));
    let frame = parts.pop().expect("1");
    let view = match frame::decode(&frame) {
        Ok(v) => v,
        Err(err) => {
            stats::inc(&c.frames_malformed);
            limited!(warn, server = %to.server, %err, "dropped a malformed reply");
            return None;
        }
    };
    let h = view.header;
    if h.kind != Kind::Reply
        || view.body.is_empty()
        || (h.flags & FLAG_PAYLOAD_FRAME != 0) != second.is_some()
    {
        stats::inc(&c.frames_malformed);
        return None;
    }
    if h.seq != to.call_id {
        // The reply to an earlier call on this connection that ended
        // (timed out) before it came.
        stats::inc(&c.calls_late_replies);
        return None;
    }
    let server = to.server.to_owned();
    let body = frame.slice(view.body_offset + 1..);
    let status = view.body[0];
    let failure = |body: &Bytes| {
        Failure::decode(body).unwrap_or_else(|e| Failure {
            kind: "undecodable".into(),
            message: format!("the server's failure report does not decode: {e}"),
        })
    };
    Some(match ReplyStatus::from_u8(status) {
        Some(ReplyStatus::Ok) => {
            stats::inc(&c.calls_replied);
            let size = frame.len() + second.as_ref().map_or(0, Bytes::len);
            if size > me.max_message_bytes {
                return Some(Err(CallError::BadReply {
                    server,
                    why: format!(
                        "the reply has {size} bytes, over this node's limit of {} (max_message_bytes)",
                        me.max_message_bytes
                    ),
                }));
            }
            decode_payload(h.encoding, body, second).map_err(|e| CallError::BadReply {
                server,
                why: e.to_string(),
            })
        }
        Some(ReplyStatus::Error) => {
            stats::inc(&c.calls_remote_errors);
            let f = failure(&body);
            Err(CallError::Remote {
                server,
                kind: f.kind,
                message: f.message,
            })
        }
        Some(ReplyStatus::Rejected) => {
            stats::inc(&c.calls_rejected);
            let f = failure(&body);
            if f.kind == "permission_denied" {
                return Some(Err(CallError::PermissionDenied {
                    server,
                    reason: f.message,
                }));
            }
            Err(CallError::Rejected {
                server: Some(server),
                kind: f.kind,
                message: f.message,
            })
        }
        Some(ReplyStatus::NoSuchService) => {
            stats::inc(&c.calls_no_server);
            Err(CallError::NoServer {
                key: to.key.to_owned(),
            })
        }
        None => Err(CallError::BadReply {
            server,
            why: format!("unknown reply status {status}"),
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use milonga_wire::frame::domain_tag;
    use milonga_wire::{Encoding, NodeId};

    use super::*;
    use crate::util::stats::Counters;

    fn me(counters: &Counters, max: usize) -> Me<'_> {
        Me {
            id: NodeId([1; 16]),
            domain_tag: domain_tag("lab"),
            max_message_bytes: max,
            counters,
        }
    }

    const TO: Waiting<'static> = Waiting {
        call_id: 7,
        key: "sr/ps/set",
        server: "ps@h:1",
    };

    fn reply(call_id: u64, status: u8, body: &[u8]) -> Vec<Bytes> {
        let h = Header {
            kind: Kind::Reply,
            flags: 0,
            encoding: Encoding::Cbor,
            domain_tag: domain_tag("lab"),
            schema_id: 0,
            node_id: NodeId([2; 16]),
            seq: call_id,
            timestamp_ns: 1,
        };
        let mut b = vec![status];
        b.extend_from_slice(body);
        let key = Key::new(TO.key).unwrap();
        vec![Bytes::from(frame::encode(&key, &h, &b))]
    }

    fn cbor(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        milonga_wire::cbor::encode_cbor(v, &mut out).unwrap();
        out
    }

    #[test]
    fn the_request_frame_carries_the_call_id_and_this_node() {
        let c = Counters::default();
        let enc = milonga_wire::cbor::encode_payload(&Value::Float(12.5), 1 << 20).unwrap();
        let key = Key::new(TO.key).unwrap();
        let f = request_frame(&me(&c, 1 << 20), &key, 7, &enc, 99);
        let v = frame::decode(&f).unwrap();
        assert_eq!((v.header.kind, v.header.seq), (Kind::Request, 7));
        assert_eq!(
            (v.header.node_id, v.header.timestamp_ns),
            (NodeId([1; 16]), 99)
        );
        assert_eq!((v.key, v.header.flags), (TO.key, 0));
    }

    #[test]
    fn each_status_gives_its_outcome_and_counter() {
        let c = Counters::default();
        let m = me(&c, 1 << 20);
        let ok = outcome(
            &m,
            &TO,
            reply(7, ReplyStatus::Ok as u8, &cbor(&Value::Float(1.5))),
        );
        assert_eq!(ok.unwrap().unwrap(), Value::Float(1.5));
        let fail = Failure {
            kind: "out_of_range".into(),
            message: "too much".into(),
        };
        let err = outcome(&m, &TO, reply(7, ReplyStatus::Error as u8, &fail.encode())).unwrap();
        assert!(
            matches!(&err, Err(CallError::Remote { kind, message, .. }) if kind == "out_of_range" && message == "too much"),
            "{err:?}"
        );
        let rej = outcome(
            &m,
            &TO,
            reply(7, ReplyStatus::Rejected as u8, &fail.encode()),
        )
        .unwrap();
        assert!(matches!(rej, Err(CallError::Rejected { .. })), "{rej:?}");
        let none = outcome(&m, &TO, reply(7, ReplyStatus::NoSuchService as u8, &[])).unwrap();
        assert!(
            matches!(&none, Err(CallError::NoServer { key }) if key == TO.key),
            "{none:?}"
        );
        let unknown = outcome(&m, &TO, reply(7, 9, &[])).unwrap();
        assert!(
            matches!(unknown, Err(CallError::BadReply { .. })),
            "{unknown:?}"
        );
        assert_eq!(
            [
                c.calls_replied.load(Relaxed),
                c.calls_remote_errors.load(Relaxed),
                c.calls_rejected.load(Relaxed),
                c.calls_no_server.load(Relaxed),
            ],
            [1, 1, 1, 1]
        );
    }

    #[test]
    fn a_late_reply_or_a_malformed_message_is_not_the_outcome() {
        let c = Counters::default();
        let m = me(&c, 1 << 20);
        assert!(outcome(&m, &TO, reply(6, 0, &cbor(&Value::Null))).is_none());
        assert_eq!(c.calls_late_replies.load(Relaxed), 1);
        assert!(outcome(&m, &TO, vec![Bytes::from_static(b"junk")]).is_none());
        assert!(outcome(&m, &TO, Vec::new()).is_none());
        // A reply with an empty body (no status).
        assert!(outcome(
            &m,
            &TO,
            reply(7, 0, &[])
                .into_iter()
                .map(|f| f.slice(..f.len() - 1))
                .collect()
        )
        .is_none());
        assert_eq!(c.frames_malformed.load(Relaxed), 3);
    }

    #[test]
    fn a_reply_over_this_nodes_limit_is_a_bad_reply() {
        let c = Counters::default();
        let m = me(&c, 64);
        let big = Value::Bytes(Bytes::from(vec![0u8; 100]));
        let r = outcome(&m, &TO, reply(7, 0, &cbor(&big))).unwrap();
        assert!(
            matches!(&r, Err(CallError::BadReply { why, .. }) if why.contains("max_message_bytes")),
            "{r:?}"
        );
    }
}
