//! Quality of service of publishers and subscribers.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a publisher does when a subscriber cannot keep up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reliability {
    /// Drop at the high-water mark; the subscriber that lost samples sees
    /// the gap in sequence numbers and reports it as [`crate::Event::Lost`].
    #[default]
    BestEffort,
    /// Never drop: `put` waits until the slowest subscriber has room (up
    /// to [`PublisherQos::put_timeout`]); `try_put` returns `WouldBlock`.
    Reliable,
}

impl std::str::FromStr for Reliability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "best-effort" | "best_effort" => Ok(Reliability::BestEffort),
            "reliable" => Ok(Reliability::Reliable),
            other => Err(format!(
                "unknown reliability {other:?}: expected reliable or best-effort"
            )),
        }
    }
}

/// QoS of a publisher.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherQos {
    /// Best effort (default) or reliable.
    pub reliability: Reliability,
    /// How long a reliable `put` waits for room; `None` waits as long as it
    /// takes.
    pub put_timeout: Option<Duration>,
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
        }
    }

    /// Sets how long a reliable `put` may wait.
    pub fn put_timeout(mut self, timeout: Duration) -> Self {
        self.put_timeout = Some(timeout);
        self
    }
}

/// QoS of a subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
}

impl SubscriberQos {
    /// Sets the deadline: the longest silence of a key before it is
    /// reported.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets the per-publisher queue depth.
    pub fn queue_depth(mut self, depth: i32) -> Self {
        self.queue_depth = Some(depth);
        self
    }
}
