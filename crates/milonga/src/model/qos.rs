//! Quality of service of publishers and subscribers.

use std::time::Duration;

pub use milonga_wire::announce::Reliability;

/// QoS of a publisher.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct PublisherQos {
    /// Best effort (default) or reliable.
    pub reliability: Reliability,
    /// How long a reliable `put` waits for room; `None` waits as long as it
    /// takes.
    pub put_timeout: Option<Duration>,
    /// Samples kept per key for late joiners and repair (0: none). Memory:
    /// `history` samples of this key.
    pub history: usize,
    /// The samples are republished from a recording: each carries the
    /// replayed flag (`Sample::replayed`), and `Publisher::put_at` gives
    /// their original timestamps.
    pub replayed: bool,
    /// How its samples are compressed on the wire (docs/compression.md);
    /// `None`: as the node's `compression` settings say.
    pub compression: Option<crate::Compression>,
    /// The schema its samples are written with (docs/schemas.md): each
    /// value must be a map of its fields, and travels by position
    /// (encoding 3) without field names. `None`: plain CBOR.
    pub schema: Option<milonga_wire::schema::Schema>,
}

impl PublisherQos {
    /// Best effort.
    pub fn best_effort() -> Self {
        Self::default()
    }

    /// Reliable, waiting without a limit.
    pub fn reliable() -> Self {
        PublisherQos {
            reliability: Reliability::Reliable,
            put_timeout: None,
            history: 0,
            replayed: false,
            compression: None,
            schema: None,
        }
    }

    /// Keeps the last `depth` samples for late joiners and repair.
    pub fn history(mut self, depth: usize) -> Self {
        self.history = depth;
        self
    }

    /// Marks the samples as republished from a recording (see
    /// [`PublisherQos::replayed`](PublisherQos#structfield.replayed)).
    pub fn replay(mut self) -> Self {
        self.replayed = true;
        self
    }

    /// Compresses its samples so (docs/compression.md), whatever the
    /// node's `compression` settings say.
    pub fn compression(mut self, c: crate::Compression) -> Self {
        self.compression = Some(c);
        self
    }

    /// Writes its samples with `schema` (docs/schemas.md): compact, by
    /// position, the schema sent once to each subscriber that asks.
    pub fn schema(mut self, schema: milonga_wire::schema::Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Sets how long a reliable `put` may wait.
    pub fn put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = Some(timeout);
        self
    }
}

/// QoS of a subscription.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct SubscriberQos {
    /// Messages queued per connected publisher before the subscriber pushes
    /// back (reliable) or the publisher drops (best effort). `None` uses
    /// the node's `recv_hwm`.
    pub queue_depth: Option<i32>,
    /// Report [`crate::Event::DeadlineMissed`] for a key silent longer
    /// than this (and again each period until it speaks). `None`: no
    /// deadline.
    pub deadline: Option<Duration>,
    /// Durability `transient_local(last)`: on joining, first receive the
    /// last `last` samples of every matching key that publishers keep,
    /// then the live stream, then [`crate::Event::SubscriptionLive`]. 0
    /// (default): live samples only.
    pub last: usize,
    /// Ask for reliable delivery: samples of reliable publishers that keep
    /// history are repaired after a gap (a broken connection), and a
    /// best-effort publisher is reported as
    /// [`crate::Event::IncompatibleQos`].
    pub reliable: bool,
    /// How this subscription falls behind when its application is slow:
    /// `None` (default) leaves events in the socket's queue
    /// (`queue_depth`), where a best-effort publisher drops them and a
    /// reliable one waits; a [`crate::QueuePolicy`] reads them at once into
    /// an application queue that keeps all (bounded) or the last per key.
    pub queue: Option<crate::QueuePolicy>,
    /// A filter the publishers apply before sending (docs/filters.md):
    /// samples that do not pass never reach this subscription.
    pub filter: Option<crate::Filter>,
    /// The reader's schema (docs/schemas.md): samples of schema'd
    /// publishers arrive in its shape (fields the writer lacks take their
    /// defaults, fields it lacks are left out, renamed and widened fields
    /// are read), and a publication whose schema does not agree with it is
    /// reported as [`crate::Event::IncompatibleQos`] naming the field, its
    /// samples refused. `None`: each writer's own fields. Plain (CBOR)
    /// samples are delivered as they are either way.
    pub schema: Option<milonga_wire::schema::Schema>,
    /// The application reads samples as its own serde type
    /// ([`crate::Sample::deserialize`]): samples of schema'd publishers
    /// keep their compact payload (`value` is its bytes,
    /// [`Value::Bytes`](crate::Value::Bytes)) and `deserialize` reads the
    /// type straight from it by the subscription's plan, without making
    /// the value map first (docs/schemas.md, "Reading into a type"). A
    /// payload that does not fit its schema is then `deserialize`'s error
    /// rather than a sample dropped and counted. Plain samples are
    /// delivered as they are either way.
    pub typed: bool,
}

impl SubscriberQos {
    /// Reads schema'd samples straight into the application's type (see
    /// [`SubscriberQos::typed`](SubscriberQos#structfield.typed)).
    pub fn typed(mut self) -> Self {
        self.typed = true;
        self
    }

    /// Reads schema'd samples with `schema` (see
    /// [`SubscriberQos::schema`](SubscriberQos#structfield.schema)).
    pub fn schema(mut self, schema: milonga_wire::schema::Schema) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Asks for the last `n` kept samples of every matching key on joining.
    pub fn last(mut self, n: usize) -> Self {
        self.last = n;
        self
    }

    /// Keeps every sample in an application queue of at most `bound`;
    /// beyond, new samples are dropped and reported lost.
    pub fn keep_all(mut self, bound: usize) -> Self {
        self.queue = Some(crate::QueuePolicy::KeepAll(bound));
        self
    }

    /// Keeps only the newest `n` samples of each key for the application;
    /// older ones are squashed (counted, not lost).
    pub fn keep_last(mut self, n: usize) -> Self {
        self.queue = Some(crate::QueuePolicy::KeepLast(n));
        self
    }

    /// Attaches a filter, applied by the publishers.
    pub fn filter(mut self, filter: crate::Filter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Asks for reliable delivery, with repair of gaps.
    pub fn reliable(mut self) -> Self {
        self.reliable = true;
        self
    }

    /// Sets the deadline: the longest silence of a key before it is
    /// reported.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the per-publisher queue depth (at least 1: a subscription
    /// with less is refused, `SubscribeError::Qos`).
    pub fn queue_depth(mut self, depth: i32) -> Self {
        self.queue_depth = Some(depth);
        self
    }
}
