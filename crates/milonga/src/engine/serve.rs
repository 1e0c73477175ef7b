//! The serving side of a service call, with no socket: which received
//! requests a handler may see (docs/protocol.md §4.5), which are answered
//! at once, and the reply frames. The worker pool that runs handlers is
//! `api::service`'s.

use milonga_wire::cbor::Encoded;
use milonga_wire::frame::{self, Encoding, Header, Kind, FLAG_PAYLOAD_FRAME};
use milonga_wire::service::{Failure, ReplyStatus};
use milonga_wire::{Bytes, Key};

use crate::engine::Me;
use crate::util::stats;

/// A request a handler may see.
pub(crate) struct Received {
    pub(crate) header: Header,
    /// The first frame; the payload starts at `body_offset`.
    pub(crate) frame: Bytes,
    pub(crate) body_offset: usize,
    /// The payload frame, if the caller sent one.
    pub(crate) second: Option<Bytes>,
}

/// What to do with a received message.
pub(crate) enum Check {
    /// Run the handler.
    Accept(Received),
    /// Answer at once with this status and failure, without the handler;
    /// under the request's key when it is not the service's (a reply goes
    /// under the key of the request it answers, docs/protocol.md §4.5).
    Refuse(Header, ReplyStatus, Failure, Option<Key>),
    /// Nothing to answer (malformed: counted in `frames_malformed`).
    Drop,
}

/// Checks a message received by the service of `key` in `domain`.
pub(crate) fn check_request(me: &Me<'_>, domain: &str, key: &Key, mut frames: Vec<Bytes>) -> Check {
    let c = me.counters;
    if frames.is_empty() || frames.len() > 2 {
        stats::inc(&c.frames_malformed);
        return Check::Drop;
    }
    let second = (frames.len() == 2).then(|| frames.pop().expect("2 frames"));
    let frame = frames.pop().expect("1 frame");
    let view = match frame::decode(&frame) {
        Ok(v) => v,
        Err(err) => {
            let n = c
                .frames_malformed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            if n <= 10 || n % 1000 == 0 {
                tracing::warn!(service = %key.as_str(), %err, dropped_so_far = n, "dropped a malformed request");
            }
            return Check::Drop;
        }
    };
    let header = view.header;
    if header.kind != Kind::Request || (header.flags & FLAG_PAYLOAD_FRAME != 0) != second.is_some()
    {
        stats::inc(&c.frames_malformed);
        return Check::Drop;
    }
    // A refusal goes under the request's key (docs/protocol.md §4.5).
    // Decoded, so a valid key (one of `@` too, which no service has).
    let asked = || {
        (view.key != key.as_str())
            .then(|| Key::internal(view.key).ok())
            .flatten()
    };
    if header.domain_tag != me.domain_tag {
        stats::inc(&c.frames_foreign_domain);
        let f = Failure {
            kind: "wrong_domain".into(),
            message: format!("this service is in domain {domain:?}"),
        };
        return Check::Refuse(header, ReplyStatus::Rejected, f, asked());
    }
    if view.key != key.as_str() {
        let f = Failure {
            kind: "no_such_service".into(),
            message: format!(
                "this endpoint serves {:?}, not {:?}",
                key.as_str(),
                view.key
            ),
        };
        return Check::Refuse(header, ReplyStatus::NoSuchService, f, asked());
    }
    let body_offset = view.body_offset;
    Check::Accept(Received {
        header,
        frame,
        body_offset,
        second,
    })
}

/// `key | 0 | header | status | body` for a reply to `req`, sent at
/// `timestamp_ns`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reply_frame(
    me: &Me<'_>,
    key: &Key,
    req: &Header,
    status: ReplyStatus,
    encoding: Encoding,
    flags: u8,
    body: &[u8],
    timestamp_ns: u64,
) -> Vec<u8> {
    let header = Header {
        kind: Kind::Reply,
        flags,
        encoding,
        domain_tag: me.domain_tag,
        schema_id: 0,
        node_id: me.id,
        seq: req.seq,
        timestamp_ns,
    };
    let n = frame::head_len(key);
    let mut out = vec![0u8; n + 1 + body.len()];
    frame::write_head(key, &header, &mut out);
    out[n] = status as u8;
    out[n + 1..].copy_from_slice(body);
    out
}

/// The reply to `req` for a handler's outcome (the reply value, encoded, or
/// a status and failure): the first frame and, for a large value, the
/// payload frame. A value over `max_message_bytes` becomes an error of
/// kind `too_large`.
pub(crate) fn reply_of(
    me: &Me<'_>,
    key: &Key,
    req: &Header,
    outcome: Result<Encoded, (ReplyStatus, Failure)>,
    timestamp_ns: u64,
) -> (Vec<u8>, Option<Bytes>) {
    let failed = |status, f: &Failure| {
        let body = f.encode();
        let head = reply_frame(me, key, req, status, Encoding::Cbor, 0, &body, timestamp_ns);
        (head, None)
    };
    match outcome {
        Ok(Encoded {
            encoding,
            head,
            tail,
        }) => {
            let size = frame::head_len(key) + 1 + head.len() + tail.as_ref().map_or(0, Bytes::len);
            if size > me.max_message_bytes {
                let f = Failure {
                    kind: "too_large".into(),
                    message: format!(
                        "the reply has {size} bytes, over the limit of {} (max_message_bytes)",
                        me.max_message_bytes
                    ),
                };
                return failed(ReplyStatus::Error, &f);
            }
            let flags = if tail.is_some() {
                FLAG_PAYLOAD_FRAME
            } else {
                0
            };
            let first = reply_frame(
                me,
                key,
                req,
                ReplyStatus::Ok,
                encoding,
                flags,
                &head,
                timestamp_ns,
            );
            (first, tail)
        }
        Err((status, f)) => failed(status, &f),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use milonga_wire::cbor::encode_payload;
    use milonga_wire::frame::domain_tag;
    use milonga_wire::{NodeId, Value};

    use super::*;
    use crate::engine::call::{outcome, request_frame, Waiting};
    use crate::model::error::CallError;
    use crate::util::stats::Counters;

    fn me<'a>(counters: &'a Counters, domain: &str, max: usize) -> Me<'a> {
        Me {
            id: NodeId([3; 16]),
            domain_tag: domain_tag(domain),
            max_message_bytes: max,
            counters,
        }
    }

    fn request(domain: &str, key: &str, value: &Value) -> Vec<Bytes> {
        let c = Counters::default();
        let enc = encode_payload(value, 1 << 20).unwrap();
        let f = request_frame(
            &me(&c, domain, 1 << 20),
            &Key::new(key).unwrap(),
            7,
            &enc,
            1,
        );
        vec![Bytes::from(f)]
    }

    const TO: Waiting<'static> = Waiting {
        call_id: 7,
        key: "sr/ps/set",
        server: "s",
    };

    #[test]
    fn a_request_goes_to_the_handler_and_its_reply_back_to_the_caller() {
        let c = Counters::default();
        let server = me(&c, "lab", 1 << 20);
        let key = Key::new("sr/ps/set").unwrap();
        let Check::Accept(r) = check_request(
            &server,
            "lab",
            &key,
            request("lab", "sr/ps/set", &Value::Float(2.0)),
        ) else {
            panic!("accepted");
        };
        assert_eq!(r.header.seq, 7);
        let value = milonga_wire::cbor::decode_payload(
            r.header.encoding,
            r.frame.slice(r.body_offset..),
            None,
        )
        .unwrap();
        assert_eq!(value, Value::Float(2.0));
        let enc = encode_payload(&Value::Float(4.0), 1 << 20).unwrap();
        let (head, tail) = reply_of(&server, &key, &r.header, Ok(enc), 5);
        assert!(tail.is_none());
        let caller_c = Counters::default();
        let got = outcome(&me(&caller_c, "lab", 1 << 20), &TO, vec![Bytes::from(head)]);
        assert_eq!(got.unwrap().unwrap(), Value::Float(4.0));
    }

    #[test]
    fn a_request_of_another_domain_or_key_is_refused_and_a_malformed_one_dropped() {
        let c = Counters::default();
        let server = me(&c, "lab", 1 << 20);
        let key = Key::new("sr/ps/set").unwrap();
        let refused = |frames| match check_request(&server, "lab", &key, frames) {
            Check::Refuse(_, status, f, asked) => {
                Some((status, f.kind, asked.map(|k| k.as_str().to_owned())))
            }
            _ => None,
        };
        assert_eq!(
            refused(request("other", "sr/ps/set", &Value::Null)),
            Some((ReplyStatus::Rejected, "wrong_domain".to_owned(), None))
        );
        assert_eq!(
            refused(request("other", "sr/ps/get", &Value::Null)),
            Some((
                ReplyStatus::Rejected,
                "wrong_domain".to_owned(),
                Some("sr/ps/get".to_owned())
            ))
        );
        assert_eq!(
            refused(request("lab", "sr/ps/get", &Value::Null)),
            Some((
                ReplyStatus::NoSuchService,
                "no_such_service".to_owned(),
                Some("sr/ps/get".to_owned())
            ))
        );
        assert_eq!(c.frames_foreign_domain.load(Relaxed), 2);
        assert!(matches!(
            check_request(&server, "lab", &key, vec![Bytes::from_static(b"junk")]),
            Check::Drop
        ));
        assert!(matches!(
            check_request(&server, "lab", &key, Vec::new()),
            Check::Drop
        ));
        assert_eq!(c.frames_malformed.load(Relaxed), 2);
    }

    #[test]
    fn a_reply_over_the_limit_becomes_a_too_large_error() {
        let c = Counters::default();
        let server = me(&c, "lab", 64);
        let key = Key::new("sr/ps/set").unwrap();
        let Check::Accept(r) = check_request(
            &server,
            "lab",
            &key,
            request("lab", "sr/ps/set", &Value::Null),
        ) else {
            panic!("accepted");
        };
        let big = encode_payload(&Value::Bytes(Bytes::from(vec![0u8; 100])), 1 << 20).unwrap();
        let (head, _) = reply_of(&server, &key, &r.header, Ok(big), 5);
        let caller_c = Counters::default();
        let got = outcome(&me(&caller_c, "lab", 1 << 20), &TO, vec![Bytes::from(head)]).unwrap();
        assert!(
            matches!(&got, Err(CallError::Remote { kind, .. }) if kind == "too_large"),
            "{got:?}"
        );
    }
}
