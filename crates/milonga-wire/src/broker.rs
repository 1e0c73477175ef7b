//! The broker's client protocol (docs/protocol.md §11): what a node opened
//! on `milonga://HOST:PORT/DOMAIN` says to the broker's ROUTER at
//! HOST:PORT, from a DEALER. Every message is a few frames, the first
//! [`MAGIC`]; these are the frames after the ROUTER's identity frame.
//!
//! - `[MAGIC, "hello", domain]` -> `[MAGIC, "hello", BrokerHello (JSON)]`,
//!   or `[MAGIC, "error", text]` when the broker does not serve the domain.
//! - `[MAGIC, "attach", announcement (JSON), view]` -> `[MAGIC, "view",
//!   version, announcements (a JSON array)]`, or `[MAGIC, "same", version]`
//!   when `view` (decimal text) is the version the broker holds.
//! - `[MAGIC, "detach", node id]`: the node is leaving; no reply.
//! - `[MAGIC, "clients", domain]` -> `[MAGIC, "clients", ClientInfo array
//!   (JSON)]`: who the broker serves, for `milonga ls`.
//!
//! An attach may carry a fifth frame, the client's report (JSON: its
//! subscriptions and counters), which the broker keeps for `clients`.
//!
//! A peer-to-peer node that uses a broker as its registry (registry mode,
//! docs/protocol.md §11.6) sends `[MAGIC, "register", RegisterHeader
//! (JSON), announcement (JSON, optional)]` and `[MAGIC, "unregister",
//! domain, node id]`; the broker sends it `[MAGIC, "entries",
//! EntriesHeader (JSON), announcement (JSON)...]` and `[MAGIC,
//! "announce"]`.
//!
//! Brokers linked in a federation (docs/protocol.md §11.5) talk over the
//! same kind of connection: `[MAGIC, "peer", PeerHeader (JSON), Lsa
//! (JSON)...]`, answered in kind.

use serde::{Deserialize, Serialize};

use crate::announce::Announcement;

/// First frame of every broker request and reply.
pub const MAGIC: &[u8] = b"MILONGA-BRK/1";
/// "Which endpoints do you serve this domain on".
pub const HELLO: &[u8] = b"hello";
/// "Here I am (my announcement); what is there".
pub const ATTACH: &[u8] = b"attach";
/// "I am leaving".
pub const DETACH: &[u8] = b"detach";
/// Reply to `attach`: the view changed.
pub const VIEW: &[u8] = b"view";
/// Reply to `attach`: the view is the one the client has.
pub const SAME: &[u8] = b"same";
/// "Whom do you serve" (and its reply).
pub const CLIENTS: &[u8] = b"clients";
/// Reply to `hello` for a domain the broker does not serve.
pub const ERROR: &[u8] = b"error";
/// A federated broker's link message (and its answer).
pub const PEER: &[u8] = b"peer";
/// Registry mode (docs/protocol.md §11.6): "keep me in the registry of
/// the domain; here is what I hold of it".
pub const REGISTER: &[u8] = b"register";
/// Registry mode: the changes a registered node has not seen (sent when
/// there are some and none is unacknowledged).
pub const ENTRIES: &[u8] = b"entries";
/// Registry mode: "take me out of the registry".
pub const UNREGISTER: &[u8] = b"unregister";
/// Registry mode, broker to node: "I do not hold your announcement: send
/// it" (a renewal without one, from a node the registry removed).
pub const ANNOUNCE: &[u8] = b"announce";
/// Most announcements one `entries` message carries.
pub const MAX_PAGE_ENTRIES: usize = 512;
/// Largest `entries` message a registry sends (bytes of announcements; a
/// single larger announcement goes alone).
pub const MAX_PAGE_BYTES: usize = 64 << 10;
/// Most link-state records one peer message carries (a federation of at
/// most this many brokers).
pub const MAX_LSAS: usize = 256;
/// Largest request a broker reads (bytes): an announcement with its
/// publications and services.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Most subscriptions a client's report may list.
pub const MAX_REPORT_SUBSCRIPTIONS: usize = 256;
/// Most counters a client's report may carry.
pub const MAX_REPORT_STATS: usize = 512;
/// Largest report frame (bytes): 256 key expressions of the longest key,
/// with room for the counters.
pub const MAX_REPORT_BYTES: usize = 192 << 10;

/// Where a broker serves one domain. A client's data and liveliness
/// sockets connect to the `*_in` endpoints (the broker subscribes to
/// them); its subscriptions connect to the `*_out` ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerHello {
    /// The domain.
    pub domain: String,
    /// The broker's node id in that domain (32 hex digits).
    pub node_id: String,
    /// Clients' best-effort data sockets connect here.
    pub data_best_effort_in: String,
    /// Clients' reliable data sockets connect here.
    pub data_reliable_in: String,
    /// Clients' liveliness sockets connect here.
    pub liveliness_in: String,
    /// Clients subscribe here to best-effort data.
    pub data_best_effort_out: String,
    /// Clients subscribe here to reliable data.
    pub data_reliable_out: String,
    /// Clients subscribe here to heartbeats.
    pub liveliness_out: String,
    /// Callers connect here to call a service behind the broker (the
    /// service's endpoint, tagged, says which).
    pub calls: String,
    /// Clients' service sockets connect here.
    pub services_in: String,
    /// How often a client should attach (ms); it is forgotten after
    /// [`BrokerHello::lease_ms`] without one.
    pub attach_interval_ms: u64,
    /// How long the broker keeps a client that stopped attaching (ms).
    pub lease_ms: u64,
}

/// What a client tells its broker of itself now and then (every 4th
/// attach): what it subscribes to and its counters (docs/protocol.md
/// §9.1's `stats`), for `milonga ls` through the broker.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClientReport {
    /// Its subscriptions' key expressions (at most 256 are told).
    #[serde(default)]
    pub subscriptions: Vec<String>,
    /// Its counters, by name.
    #[serde(default)]
    pub stats: std::collections::BTreeMap<String, u64>,
}

/// A broker client, as `clients` tells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientInfo {
    /// Its node id (hex).
    pub node_id: String,
    /// Its name (`name@host:pid`).
    pub name: String,
    /// Seconds since it first attached.
    pub attached_s: f64,
    /// Milliseconds since its last attach.
    pub last_attach_ms: u64,
    /// Its last report (none yet: empty).
    pub subscriptions: Vec<String>,
    /// Its counters as last reported.
    pub stats: std::collections::BTreeMap<String, u64>,
    /// Per second, between its last two reports: samples sent, received
    /// and lost.
    pub rates: std::collections::BTreeMap<String, f64>,
}

/// The first frame of a link message between federated brokers, after
/// `peer` (docs/protocol.md §11.5).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PeerHeader {
    /// The sender's broker id (32 hex digits, new at each start).
    pub broker: String,
    /// Where the sender listens.
    pub listen: String,
    /// The sender's link sockets for the receiver, by domain: the XPUBs
    /// (best effort, reliable, liveliness) the receiver's link XSUBs
    /// connect to. Empty while the link is not in the spanning tree.
    #[serde(default)]
    pub links: std::collections::BTreeMap<String, [String; 3]>,
}

/// A link-state record: what one broker of a federation tells of itself,
/// flooded to every broker (docs/protocol.md §11.5).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Lsa {
    /// The broker it is of (32 hex digits).
    pub broker: String,
    /// Grows with each new record of that broker (at least every second):
    /// a record whose number stops growing for a lease is of a broker gone.
    pub seq: u64,
    /// The brokers it has a link with now.
    #[serde(default)]
    pub neighbors: Vec<String>,
    /// What it serves, by domain.
    #[serde(default)]
    pub domains: std::collections::BTreeMap<String, LsaDomain>,
    /// The broker's public key (Z85), when its security is on: the key
    /// another broker of the federation names when it relays a call to
    /// this one's calls socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A broker's part of one domain in its [`Lsa`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LsaDomain {
    /// The broker's own node in the domain.
    pub node_id: String,
    /// The nodes it reaches without another broker: its clients, and the
    /// peer-to-peer nodes it sees.
    #[serde(default)]
    pub nodes: Vec<Announcement>,
}

/// The first frame of a `register` request, after the command (registry
/// mode, docs/protocol.md §11.6).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RegisterHeader {
    /// The domain the node is of.
    pub domain: String,
    /// The node's id (32 hex digits).
    pub node_id: String,
    /// The registry epoch the node's view is of (0: none yet).
    pub epoch: u64,
    /// The registry version the node's view is at.
    pub have: u64,
    /// FNV-1a 64 of the announcement the node last sent (0: not said): a
    /// registry holding another one answers `announce`.
    #[serde(default)]
    pub announced: u64,
}

/// The first frame of an `entries` message, after the command: the
/// changes of registry versions `from` (exclusive) to `to` (inclusive).
/// The announcements of the nodes added or changed follow, one a frame.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EntriesHeader {
    /// The registry's epoch (new at each start of the registry).
    pub epoch: u64,
    /// The version the changes start after: the receiver applies them
    /// only when it is at this version (or `reset`).
    pub from: u64,
    /// The version the receiver is at after applying them.
    pub to: u64,
    /// The receiver forgets what it holds first: the registry lists every
    /// node from the start (another epoch, or changes too old to list).
    #[serde(default)]
    pub reset: bool,
    /// The nodes removed (expired or unregistered), by id.
    #[serde(default)]
    pub removed: Vec<String>,
    /// The registry's lease (ms): a node renews its registration at least
    /// three times a lease, or is removed.
    #[serde(default)]
    pub lease_ms: u64,
    /// The registry's version when it sent this: a reset is complete
    /// once `to` reaches it (until then the receiver keeps its old view
    /// in use and fills the new one aside).
    #[serde(default)]
    pub latest: u64,
}

/// A request a broker reads.
#[derive(Debug, Clone, PartialEq)]
pub enum BrokerRequest {
    /// `hello`: the endpoints of `domain`.
    Hello {
        /// The domain asked for.
        domain: String,
    },
    /// `attach`: the client's announcement, and the view version it holds
    /// (0: none yet).
    Attach {
        /// Its announcement.
        announcement: Box<Announcement>,
        /// The version of the view it has.
        view: u64,
        /// Its report, when it sent one.
        report: Option<ClientReport>,
        /// Its client key, when it sent one: a random secret of the
        /// client's (32 lower-case hex digits, kept for its life), which
        /// every later attach and its detach must carry (docs/protocol.md
        /// §11.2).
        key: Option<String>,
    },
    /// `clients`: the clients served in `domain`.
    Clients {
        /// The domain asked about.
        domain: String,
    },
    /// `detach`: the node with this id (hex) is leaving.
    Detach {
        /// Its node id.
        node_id: String,
        /// The client key it attached with, if any.
        key: Option<String>,
    },
    /// `register`: a node keeps its place in the domain's registry
    /// (registry mode) and says what it holds of it.
    Register {
        /// Who, where and what it holds.
        header: RegisterHeader,
        /// Its announcement, as sent (validated), when it sent it: on
        /// a renewal or a change, not on an acknowledgement.
        announcement: Option<Vec<u8>>,
    },
    /// `unregister`: the node with this id leaves the domain's registry.
    Unregister {
        /// The domain.
        domain: String,
        /// Its node id.
        node_id: String,
    },
    /// `peer`: a federated broker's link message.
    Peer {
        /// Who sends it, and its link sockets.
        header: PeerHeader,
        /// The link-state records it passes on.
        lsas: Vec<Lsa>,
    },
}

/// Why frames are not a broker request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// Not the frames of a request of this version.
    #[error("not a broker request: {0}")]
    Malformed(String),
}

/// The largest announcement a broker takes from a client.
pub const MAX_ANNOUNCEMENT_BYTES: usize = 256 << 10;

/// 32 lower-case hex digits: a node id as announcements write it (and the
/// only form a broker takes, since it names files after it); a broker id
/// likewise.
pub fn is_node_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A client key frame: 32 lower-case hex digits.
fn client_key(f: &[u8]) -> Result<String, BrokerError> {
    let k = text(f, "the client key")?;
    if !is_node_id(&k) {
        return Err(BrokerError::Malformed(
            "the client key is not 32 lower-case hex digits".into(),
        ));
    }
    Ok(k)
}

fn text(f: &[u8], what: &str) -> Result<String, BrokerError> {
    std::str::from_utf8(f)
        .map(str::to_owned)
        .map_err(|_| BrokerError::Malformed(format!("{what} is not UTF-8")))
}

impl BrokerRequest {
    /// Reads a request's frames (after the ROUTER's identity).
    pub fn decode<F: AsRef<[u8]>>(frames: &[F]) -> Result<BrokerRequest, BrokerError> {
        let bad = |why: &str| BrokerError::Malformed(why.to_owned());
        if frames.first().map(AsRef::as_ref) != Some(MAGIC) {
            return Err(bad("the first frame is not MILONGA-BRK/1"));
        }
        let f: Vec<&[u8]> = frames.iter().map(AsRef::as_ref).collect();
        match (f.get(1).copied(), f.len()) {
            (Some(HELLO), 3) => {
                // Not UTF-8: a name no domain has (U+FFFD is not allowed in
                // one), so that the broker answers that it is not a
                // domain's rather than nothing; at most 64 bytes of it, so
                // that a long one is not echoed back in full.
                let domain = match std::str::from_utf8(f[2]) {
                    Ok(d) => d.to_owned(),
                    Err(_) => String::from_utf8_lossy(&f[2][..f[2].len().min(64)]).into_owned(),
                };
                Ok(BrokerRequest::Hello { domain })
            }
            (Some(ATTACH), 4..=6) => {
                if f[2].len() > MAX_ANNOUNCEMENT_BYTES {
                    return Err(bad("the announcement is over 256 KiB"));
                }
                let announcement = Announcement::from_json(f[2])
                    .map_err(|e| BrokerError::Malformed(format!("the announcement: {e}")))?;
                if !is_node_id(&announcement.node_id) {
                    return Err(bad(
                        "the announcement's node id is not 32 lower-case hex digits",
                    ));
                }
                let view = text(f[3], "the view version")?
                    .parse::<u64>()
                    .map_err(|_| bad("the view version is not a decimal integer"))?;
                // An empty report frame: none this time (a key follows).
                let report = match f.get(4).filter(|r| !r.is_empty()) {
                    Some(r) if r.len() > MAX_REPORT_BYTES => {
                        return Err(bad("the report is over 192 KiB"));
                    }
                    Some(r) => {
                        let r = serde_json::from_slice::<ClientReport>(r)
                            .map_err(|e| BrokerError::Malformed(format!("the report: {e}")))?;
                        // What a broker keeps of each client is bounded.
                        if r.subscriptions.len() > MAX_REPORT_SUBSCRIPTIONS
                            || r.stats.len() > MAX_REPORT_STATS
                            || r.subscriptions
                                .iter()
                                .any(|s| s.len() > crate::key::MAX_KEY_BYTES)
                            || r.stats.keys().any(|k| k.len() > 64)
                        {
                            return Err(bad(
                                "the report lists over 256 subscriptions or 512 counters, or one too long",
                            ));
                        }
                        Some(r)
                    }
                    None => None,
                };
                let key = f.get(5).map(|k| client_key(k)).transpose()?;
                Ok(BrokerRequest::Attach {
                    announcement: Box::new(announcement),
                    view,
                    report,
                    key,
                })
            }
            (Some(CLIENTS), 3) => {
                let domain = text(f[2], "the domain")?;
                Ok(BrokerRequest::Clients { domain })
            }
            (Some(DETACH), 3 | 4) => {
                let node_id = text(f[2], "the node id")?;
                if !is_node_id(&node_id) {
                    return Err(bad("the node id is not 32 lower-case hex digits"));
                }
                let key = f.get(3).map(|k| client_key(k)).transpose()?;
                Ok(BrokerRequest::Detach { node_id, key })
            }
            (Some(REGISTER), 3 | 4) => {
                let header: RegisterHeader = serde_json::from_slice(f[2])
                    .map_err(|e| BrokerError::Malformed(format!("the register header: {e}")))?;
                if !is_node_id(&header.node_id) {
                    return Err(bad("the node id is not 32 lower-case hex digits"));
                }
                let announcement = match f.get(3) {
                    Some(raw) => {
                        if raw.len() > MAX_ANNOUNCEMENT_BYTES {
                            return Err(bad("the announcement is over 256 KiB"));
                        }
                        let a = Announcement::from_json(raw).map_err(|e| {
                            BrokerError::Malformed(format!("the announcement: {e}"))
                        })?;
                        if a.node_id != header.node_id || a.domain != header.domain {
                            return Err(bad(
                                "the announcement is of another node or domain than the header",
                            ));
                        }
                        Some(raw.to_vec())
                    }
                    None => None,
                };
                Ok(BrokerRequest::Register {
                    header,
                    announcement,
                })
            }
            (Some(UNREGISTER), 4) => {
                let domain = text(f[2], "the domain")?;
                let node_id = text(f[3], "the node id")?;
                if !is_node_id(&node_id) {
                    return Err(bad("the node id is not 32 lower-case hex digits"));
                }
                Ok(BrokerRequest::Unregister { domain, node_id })
            }
            (Some(PEER), n) if n >= 3 && n - 3 <= MAX_LSAS => {
                let header: PeerHeader = serde_json::from_slice(f[2])
                    .map_err(|e| BrokerError::Malformed(format!("the peer header: {e}")))?;
                if !is_node_id(&header.broker) {
                    return Err(bad("the broker id is not 32 lower-case hex digits"));
                }
                let mut lsas = Vec::with_capacity(n - 3);
                for frame in &f[3..] {
                    let l: Lsa = serde_json::from_slice(frame)
                        .map_err(|e| BrokerError::Malformed(format!("a link-state record: {e}")))?;
                    let ids_ok = is_node_id(&l.broker)
                        && l.neighbors.len() <= MAX_LSAS
                        && l.neighbors.iter().all(|b| is_node_id(b))
                        && l.domains.values().all(|d| {
                            is_node_id(&d.node_id) && d.nodes.iter().all(|a| is_node_id(&a.node_id))
                        });
                    if !ids_ok {
                        return Err(bad(
                            "a link-state record names an id that is not 32 lower-case hex digits",
                        ));
                    }
                    lsas.push(l);
                }
                Ok(BrokerRequest::Peer { header, lsas })
            }
            (Some(cmd), n) => Err(BrokerError::Malformed(format!(
                "{:?} with {n} frames",
                String::from_utf8_lossy(cmd)
            ))),
            (None, _) => Err(bad("no command frame")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_decode_and_bad_ones_are_refused() {
        assert_eq!(
            BrokerRequest::decode(&[MAGIC, HELLO, b"lab"]).unwrap(),
            BrokerRequest::Hello {
                domain: "lab".into()
            }
        );
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            BrokerRequest::decode(&[MAGIC, DETACH, id.as_bytes()]).unwrap(),
            BrokerRequest::Detach {
                node_id: id.into(),
                key: None
            }
        );
        let key = "fedcba9876543210fedcba9876543210";
        assert_eq!(
            BrokerRequest::decode(&[MAGIC, DETACH, id.as_bytes(), key.as_bytes()]).unwrap(),
            BrokerRequest::Detach {
                node_id: id.into(),
                key: Some(key.into())
            }
        );
        // An attach naming a node id that is not one (a broker names files
        // after it) is refused, however well-formed the rest.
        let evil = br#"{"protocol":1,"domain":"lab","node_id":"/../../../../home/u/x","name":"n@h:1","host":"h","pid":1,"start_time":0,"control":"tcp://127.0.0.1:1","publications":[]}"#;
        let good = String::from_utf8_lossy(evil)
            .replace("/../../../../home/u/x", "0123456789abcdef0123456789abcdef");
        assert!(BrokerRequest::decode(&[MAGIC, ATTACH, good.as_bytes(), b"0"]).is_ok());
        assert!(BrokerRequest::decode(&[MAGIC, ATTACH, &evil[..], b"0"]).is_err());
        // A client key after an empty report frame (no report this time),
        // or after a report; a key that is not 32 hex digits is refused.
        for report in [&b""[..], br#"{"subscriptions":["a/b"]}"#] {
            match BrokerRequest::decode(&[
                MAGIC,
                ATTACH,
                good.as_bytes(),
                b"0",
                report,
                key.as_bytes(),
            ])
            .unwrap()
            {
                BrokerRequest::Attach {
                    key: k, report: r, ..
                } => {
                    assert_eq!(k.as_deref(), Some(key));
                    assert_eq!(r.is_some(), !report.is_empty());
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(
            BrokerRequest::decode(&[MAGIC, ATTACH, good.as_bytes(), b"0", b"", b"short"]).is_err()
        );
        // A report past what a broker keeps of a client is refused: too
        // many subscriptions or counters, one too long, or too many bytes.
        let subs = |n: usize, len: usize| {
            let list: Vec<String> = (0..n).map(|i| format!("{i:0len$}")).collect();
            serde_json::to_vec(&serde_json::json!({ "subscriptions": list })).unwrap()
        };
        let stats = |n: usize| {
            let m: std::collections::BTreeMap<String, u64> =
                (0..n).map(|i| (format!("c{i}"), 1)).collect();
            serde_json::to_vec(&serde_json::json!({ "stats": m })).unwrap()
        };
        let attach = |report: &[u8]| {
            BrokerRequest::decode(&[MAGIC, ATTACH, good.as_bytes(), b"0", report, key.as_bytes()])
        };
        assert!(attach(&subs(256, 512)).is_ok());
        assert!(attach(&subs(257, 4)).is_err());
        assert!(attach(&subs(1, 513)).is_err());
        assert!(attach(&stats(512)).is_ok());
        assert!(attach(&stats(513)).is_err());
        let mut big = br#"{"subscriptions":[],"pad":""#.to_vec();
        big.resize(MAX_REPORT_BYTES, b' ');
        big.extend_from_slice(br#""}"#);
        assert!(attach(&big).is_err());
        assert!(BrokerRequest::decode(&[MAGIC, DETACH, id.as_bytes(), b"KEY"]).is_err());
        // A peer message: its ids are checked like a client's.
        let header = format!(r#"{{"broker":"{id}","listen":"tcp://h:1"}}"#);
        let lsa = format!(r#"{{"broker":"{id}","seq":3,"neighbors":["{id}"]}}"#);
        match BrokerRequest::decode(&[MAGIC, PEER, header.as_bytes(), lsa.as_bytes()]).unwrap() {
            BrokerRequest::Peer { header, lsas } => {
                assert_eq!(header.broker, id);
                assert_eq!(lsas[0].seq, 3);
            }
            other => panic!("{other:?}"),
        }
        let evil_lsa = format!(r#"{{"broker":"{id}","seq":3,"neighbors":["../x"]}}"#);
        assert!(
            BrokerRequest::decode(&[MAGIC, PEER, header.as_bytes(), evil_lsa.as_bytes()]).is_err()
        );
        // A registration: its announcement must be the header's node's.
        let reg = format!(r#"{{"domain":"lab","node_id":"{id}","epoch":0,"have":0}}"#);
        let other = format!(
            r#"{{"domain":"lab","node_id":"{}","epoch":0,"have":0}}"#,
            "1".repeat(32)
        );
        match BrokerRequest::decode(&[MAGIC, REGISTER, reg.as_bytes(), good.as_bytes()]).unwrap() {
            BrokerRequest::Register {
                header,
                announcement,
            } => {
                assert_eq!(header.node_id, id);
                assert_eq!(announcement.as_deref(), Some(good.as_bytes()));
            }
            other => panic!("{other:?}"),
        }
        assert!(BrokerRequest::decode(&[MAGIC, REGISTER, reg.as_bytes()]).is_ok());
        assert!(
            BrokerRequest::decode(&[MAGIC, REGISTER, other.as_bytes(), good.as_bytes()]).is_err()
        );
        assert!(BrokerRequest::decode(&[MAGIC, UNREGISTER, b"lab", id.as_bytes()]).is_ok());
        let huge = vec![b' '; MAX_ANNOUNCEMENT_BYTES + 1];
        assert!(BrokerRequest::decode(&[MAGIC, ATTACH, &huge[..], b"0"]).is_err());
        for bad in [
            vec![&b"MILONGA-CTL/1"[..], HELLO, b"lab"],
            vec![MAGIC, HELLO],
            vec![MAGIC, b"stop", b"x"],
            vec![MAGIC, DETACH, b"xyz"],
            vec![MAGIC, DETACH, b"/../../../../../../tmp/x-padding-to-32"],
            vec![MAGIC, DETACH, b"0123456789ABCDEF0123456789ABCDEF"],
            vec![MAGIC, ATTACH, b"{}", b"0"],
            vec![MAGIC, CLIENTS],
            vec![MAGIC, PEER],
            vec![MAGIC, REGISTER, b"{}"],
            vec![MAGIC, UNREGISTER, b"lab", b"../x"],
            vec![MAGIC, PEER, br#"{"broker":"x","listen":"tcp://h:1"}"#],
            vec![MAGIC],
        ] {
            assert!(BrokerRequest::decode(&bad).is_err(), "{bad:?}");
        }
    }
}
