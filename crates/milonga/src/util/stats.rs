//! Counters of a node: everything dropped is counted here.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// A snapshot of a node's counters.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(default)]
        #[non_exhaustive]
        pub struct NodeStats { $($(#[$doc])* pub $name: u64,)* }

        #[derive(Debug, Default)]
        pub(crate) struct Counters { $(pub $name: AtomicU64,)* }

        impl Counters {
            pub(crate) fn snapshot(&self) -> NodeStats {
                NodeStats { $($name: self.$name.load(Relaxed),)* }
            }
        }
    };
}

counters! {
    /// Samples sent by this node's publishers.
    samples_sent,
    /// Samples delivered to this node's subscriptions.
    samples_received,
    /// Samples lost, as seen from gaps in sequence numbers, over all subscriptions.
    samples_lost,
    /// Data frames dropped as malformed (bad key, truncated header, unknown flags...).
    frames_malformed,
    /// Data frames dropped for an unsupported protocol version.
    frames_bad_version,
    /// Data frames dropped for an unknown kind or encoding.
    frames_unknown_kind,
    /// Data frames dropped because they came from another domain.
    frames_foreign_domain,
    /// Samples dropped because their payload did not decode.
    payloads_malformed,
    /// Frames that passed a subscription's ZeroMQ prefix filter but not its
    /// key expression (wildcard subscriptions only; a literal one never sees any).
    frames_filtered,
    /// Connections to publishers closed by the peer, or by ZeroMQ after a
    /// protocol violation such as an over-size frame (`max_message_bytes`).
    connections_closed,
    /// Connections a subscription made again after one closed, each after
    /// an exponential back-off with jitter (50 ms doubling to 2 s).
    reconnects,
    /// Samples dropped as duplicates.
    samples_duplicate,
    /// Samples whose sequence number went backwards (corrupt or forged):
    /// delivered, and the sequence baseline restarted from them.
    sequence_resets,
    /// Samples whose sequence number jumped ahead by more than 2^32 (corrupt
    /// or forged; no publisher puts that many between two samples a
    /// subscriber receives): delivered, not counted as lost, and the
    /// baseline restarted from them.
    sequence_jumps,
    /// Samples dropped because their publisher node id is neither in
    /// discovery nor remembered by the subscription (forged, or from a node
    /// long gone): each would cost the subscription state.
    samples_unknown_publisher,
    /// Announcements refused because their node id is not the one their
    /// key and `id_salt` give (security on: a peer claiming another node's
    /// id, or a build before node ids were keyed), once per node id.
    peers_unattributed,
    /// Data frames dropped because the node their header names announced
    /// another key than the one of the connection they came on (security
    /// on: a trusted peer claiming another node's id), or announced none
    /// the subscription knows.
    frames_unattributed,
    /// Samples of a new key dropped because the subscription already
    /// follows 65,536 keys of that publisher node.
    samples_over_key_limit,
    /// Publisher nodes whose sequence state a subscription dropped: more
    /// than 256 (or more than 65,536 of their keys) were absent from discovery at once (reported to the
    /// subscription as `PublisherLost` with reason `forgotten`).
    publisher_states_dropped,
    /// Connections dropped because the peer did not speak ZMTP correctly
    /// (random bytes on a data or control port, for example).
    handshakes_failed,
    /// Connections to this node's sockets refused because the peer's key
    /// is not in the trust directory (security on; docs/security.md).
    auth_refused,
    /// Connections this node made that the peer refused: this node's key
    /// is not in the peer's trust directory (security on).
    auth_rejected,
    /// Peers this node did not connect to because their announced key is
    /// missing or not trusted (security on).
    peers_untrusted,
    /// Operations of others this node's access control rules refused: a
    /// subscription prefix, a history query, a call (docs/security.md).
    acl_denied,
    /// Refusals by others' access control rules that reached this node's
    /// subscriptions (each a `PermissionDenied` event the first time).
    acl_denied_here,
    /// Publications and services of peers ignored because the rules do not
    /// let their node `put` or `serve` that key.
    acl_ignored,
    /// Connections peers had made to this node's data, liveliness, control
    /// and service sockets that closed: a subscriber leaving, or ZeroMQ closing
    /// one that broke the protocol, such as a message over the socket's
    /// size limit (ZeroMQ reports no event of its own for that).
    peer_disconnects,
    /// Connections this node's subscriptions could not make to a
    /// publisher discovery shows (no answer within `handshake_timeout_ms`,
    /// refused, no route): each attempt, logged with the endpoint and
    /// retried with back-off.
    connects_failed,
    /// Connections a listening socket could not accept (file descriptors
    /// exhausted, for example); logged as errors.
    accepts_failed,
    /// Control requests dropped as malformed.
    control_malformed,
    /// Control replies not sent: the asking connection had 16 unread
    /// already (a peer that asks and does not read), or had gone.
    control_replies_dropped,
    /// Peers ignored because they belong to another domain.
    peers_foreign_domain,
    /// Scouting datagrams dropped: not a hello, of another version,
    /// truncated, or with a bad endpoint.
    scout_malformed,
    /// Hellos of new nodes ignored because scouting already knows 10,000
    /// nodes (logged when it happens).
    scout_nodes_dropped,
    /// Nodes heard by scouting whose control endpoint did not answer
    /// within 2 s (no route, a firewall, an address of another network);
    /// logged with the endpoint, and asked again at their next hello.
    scout_unreachable,
    /// Nodes told by gossip but not asked: this node already asks 1,024
    /// learned nodes (logged when it happens).
    gossip_dropped,
    /// Gossip requests whose endpoint is not at the address they came
    /// from: the asker is learned at that address, with the port it named.
    gossip_readdressed,
    /// Announcement files that could not be read.
    announcements_malformed,
    /// Subscribe/unsubscribe messages received by the data sockets.
    subscription_messages,
    /// Samples a reliable publisher sent inside batches (a subscriber was
    /// full, so they queued up and left together).
    samples_batched,
    /// Batches sent.
    batches_sent,
    /// Reliable puts that found no room (a subscriber was full): they
    /// waited, or returned WouldBlock or Timeout.
    puts_blocked,
    /// Microseconds reliable puts spent waiting for room, in all.
    puts_blocked_us,
    /// History queries answered by this node's publishers.
    history_queries_answered,
    /// History queries dropped as malformed (bad CBOR, bad expression or token).
    history_queries_malformed,
    /// History queries refused: over the rate a data socket answers (200
    /// per second, 10 per subscription, 64 MiB of replies), or naming a
    /// token not subscribed on that socket.
    history_queries_refused,
    /// History reply frames that could not be sent at once (the asking
    /// subscriber's queue was full); it times out and goes on live.
    history_replies_dropped,
    /// History queries of this node's subscriptions that got no answer in time.
    history_queries_unanswered,
    /// History queries sent again because no reply had begun (§4.2).
    history_queries_resent,
    /// Samples this node's publishers sent compressed (§4).
    frames_deflated,
    /// Compressed frames this node's subscriptions inflated (§4).
    frames_inflated,
    /// Samples this node's publishers wrote into shared memory for
    /// subscriptions on their host (docs/shared-memory.md).
    shm_sent,
    /// Samples that could have gone through shared memory and went
    /// through the socket: no slot could be had (every one still held or
    /// awaited), the segment could not be made (logged), more than 55
    /// subscriptions wanted the sample, or a loan of another socket's
    /// segment was put.
    shm_fallbacks,
    /// Shared-memory payloads this node's subscriptions read in place.
    shm_received,
    /// Shared-memory references this node's subscriptions could not read
    /// (the slot rewritten before they came, a segment that cannot be
    /// mapped; logged): the sample is missing and reported lost.
    shm_unreadable,
    /// Samples delivered from a publisher's history (late joining or repair).
    samples_replayed,
    /// Schemas this node's subscriptions learned from publishers
    /// (docs/schemas.md).
    schemas_learned,
    /// Schemas received that do not parse, or whose id is not their
    /// content's.
    schemas_malformed,
    /// Compact samples dropped because their schema was not known (asked
    /// for, not answered in time, or unknown to their publisher).
    samples_unknown_schema,
    /// zstd dictionaries this node's subscriptions learned from publishers
    /// (docs/compression.md, "Dictionaries").
    dictionaries_learned,
    /// Compressed frames dropped because the dictionary they name was not
    /// known (asked for, not answered in time) or too much waited for it.
    frames_unknown_dictionary,
    /// Compact samples dropped because their publisher's schema does not
    /// agree with the subscription's (reported once as `IncompatibleQos`).
    samples_schema_refused,
    /// Filter evaluations by this node's publishers (one per distinct
    /// filter and sample of a key it matches).
    filter_evaluations,
    /// Filter evaluations that failed (a missing field, values that cannot
    /// be compared); the sample did not pass.
    filter_errors,
    /// Distinct filters declared to this node's publishers.
    filters_declared,
    /// Filter declarations dropped as malformed.
    filters_malformed,
    /// Filter declarations refused because a data socket keeps too many.
    filters_refused,
    /// Samples that passed a filter but could not be sent at once.
    filtered_dropped,
    /// Bytes of data messages received by this node's subscriptions.
    bytes_received,
    /// Samples replaced by a newer one of their key in a `keep_last`
    /// application queue (not lost: superseded).
    samples_squashed,
    /// Calls sent by this node.
    calls_sent,
    /// Calls answered with a value.
    calls_replied,
    /// Calls answered with the handler's error.
    calls_remote_errors,
    /// Calls that reached their deadline.
    calls_timed_out,
    /// Calls that found no server.
    calls_no_server,
    /// Calls whose server was lost mid-call.
    calls_server_lost,
    /// Calls rejected (over-size requests here; overload or bad requests
    /// at a server of this node).
    calls_rejected,
    /// Replies that came after their call had ended, dropped.
    calls_late_replies,
    /// Requests this node's services read (well-formed and of this
    /// domain), whether they were then run, queued or refused.
    requests_received,
    /// Requests this node's services answered.
    calls_served,
    /// Handlers that panicked (each answered with a remote error).
    handler_panics,
    /// Replies that could not be delivered (the caller had gone).
    replies_undeliverable,
}

/// Logs the first drops of a kind, then one in a thousand (`count` is the
/// counter's value after this one), so that a flood of bad input cannot
/// flood the log; the counters count every one.
pub(crate) fn log_drop(count: u64, what: &str, detail: &dyn std::fmt::Display) {
    if count <= 10 || count % 1000 == 0 {
        tracing::warn!(dropped_so_far = count, "dropped {what}: {detail}");
    }
}

/// [`log_drop`] at `info`, for drops that are expected in normal use
/// (counted all the same).
pub(crate) fn log_drop_info(count: u64, what: &str, detail: &dyn std::fmt::Display) {
    if count <= 10 || count % 1000 == 0 {
        tracing::info!(dropped_so_far = count, "dropped {what}: {detail}");
    }
}

pub(crate) fn inc(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// Adds `n`, saturating at `u64::MAX`: a forged number must not wrap a
/// counter around.
pub(crate) fn add(c: &AtomicU64, n: u64) {
    let _ = c.fetch_update(Relaxed, Relaxed, |v| Some(v.saturating_add(n)));
}
