//! How a slow subscription falls behind: the application-side queue of
//! [`QueuePolicy`].
//!
//! With a policy, a pump thread of the subscription reads its socket as fast
//! as events come, so the publisher never has to wait for (reliable) or drop
//! for (best effort) this subscriber's application; the policy then decides
//! what the application gets:
//!
//! - `KeepAll(bound)`: every event, up to `bound` queued samples; a sample
//!   that finds the queue full is dropped, counted, and reported as
//!   [`Event::Lost`] once there is room again;
//! - `KeepLast(n)`: per key, only the `n` newest samples wait; an older one
//!   is replaced ("squashed", as EPICS PV Access squashes monitor updates),
//!   counted apart from losses.
//!
//! Status events (liveliness, deadlines, losses) are never dropped or
//! squashed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use milonga_wire::NodeId;

use crate::model::sample::{Event, LostSamples};
use crate::util::lock;

/// What a subscription keeps when its application reads slower than events
/// arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuePolicy {
    /// Keep every sample, at most this many waiting; beyond, drop the new
    /// one and report it lost.
    KeepAll(usize),
    /// Keep the newest `n` samples of each key; older ones are squashed.
    KeepLast(usize),
}

#[derive(Debug, Default)]
struct Inner {
    events: VecDeque<Event>,
    /// Samples waiting, per key (for `KeepLast`) or in all (`KeepAll`).
    per_key: HashMap<String, usize>,
    samples: usize,
    /// Samples dropped on a full `KeepAll` queue and not yet reported:
    /// (publisher, key) -> (first seq, count).
    overflow: HashMap<(NodeId, String), (u64, u64)>,
    /// The pump stopped (the node or the subscription closed).
    closed: bool,
}

/// The queue between a subscription's pump thread and its application.
#[derive(Debug)]
pub(crate) struct AppQueue {
    policy: QueuePolicy,
    inner: Mutex<Inner>,
    ready: Condvar,
}

/// What [`AppQueue::push`] did with a sample.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    Queued,
    /// An older sample of the key was replaced.
    Squashed,
    /// The queue was full: the sample is dropped (reported later as lost).
    Dropped,
}

impl AppQueue {
    pub(crate) fn new(policy: QueuePolicy) -> AppQueue {
        AppQueue {
            policy,
            inner: Mutex::new(Inner::default()),
            ready: Condvar::new(),
        }
    }

    /// Queues an event by the policy.
    pub(crate) fn push(&self, ev: Event) -> Pushed {
        let mut q = lock(&self.inner);
        let mut outcome = Pushed::Queued;
        if let Event::Sample(s) = &ev {
            match self.policy {
                QueuePolicy::KeepAll(bound) => {
                    if q.samples >= bound.max(1) {
                        let k = (s.publisher, s.key.clone());
                        // A run of consecutive sequence numbers per key; a
                        // break in it reports the run so far.
                        if let Some(&(first, count)) = q.overflow.get(&k) {
                            if first + count != s.seq {
                                q.events.push_back(Event::Lost(LostSamples {
                                    publisher: s.publisher,
                                    key: s.key.clone(),
                                    count,
                                    first_seq: first,
                                }));
                                q.overflow.remove(&k);
                            }
                        }
                        q.overflow.entry(k).or_insert((s.seq, 0)).1 += 1;
                        return Pushed::Dropped;
                    }
                    q.samples += 1;
                }
                QueuePolicy::KeepLast(n) => {
                    let held = q.per_key.get(&s.key).copied().unwrap_or(0);
                    if held >= n.max(1) {
                        let key = s.key.clone();
                        if let Some(i) = q
                            .events
                            .iter()
                            .position(|e| matches!(e, Event::Sample(o) if o.key == key))
                        {
                            q.events.remove(i);
                        }
                        outcome = Pushed::Squashed;
                    } else {
                        *q.per_key.entry(s.key.clone()).or_insert(0) += 1;
                        q.samples += 1;
                    }
                }
            }
        }
        // Status events are never dropped, but a key's older pending
        // deadline report is replaced by the newer one, so that a stalled
        // reader does not pile them up.
        if let Event::DeadlineMissed(d) = &ev {
            if let Some(i) = q
                .events
                .iter()
                .position(|e| matches!(e, Event::DeadlineMissed(o) if o.key == d.key))
            {
                q.events.remove(i);
            }
        }
        q.events.push_back(ev);
        drop(q);
        self.ready.notify_one();
        outcome
    }

    /// The pump stopped: readers get `None` once the queue is empty.
    pub(crate) fn close(&self) {
        lock(&self.inner).closed = true;
        self.ready.notify_all();
    }

    /// The next event, waiting at most `timeout` (`None`: without a limit).
    /// `Err(true)`: closed and empty; `Err(false)`: nothing in time.
    /// Events waiting for the application.
    pub(crate) fn len(&self) -> usize {
        lock(&self.inner).events.len()
    }

    pub(crate) fn pop(&self, timeout: Option<Duration>) -> Result<Event, bool> {
        // A timeout too long to add to the clock waits forever.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut q = lock(&self.inner);
        loop {
            if let Some(ev) = q.events.pop_front() {
                if let Event::Sample(s) = &ev {
                    q.samples = q.samples.saturating_sub(1);
                    if let Some(n) = q.per_key.get_mut(&s.key) {
                        *n -= 1;
                        if *n == 0 {
                            q.per_key.remove(&s.key);
                        }
                    }
                }
                // Room again: report what a full queue dropped.
                let overflow: Vec<_> = q.overflow.drain().collect();
                for ((publisher, key), (first_seq, count)) in overflow {
                    q.events.push_back(Event::Lost(LostSamples {
                        publisher,
                        key,
                        count,
                        first_seq,
                    }));
                }
                return Ok(ev);
            }
            if q.closed {
                return Err(true);
            }
            match deadline {
                None => q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(false);
                    }
                    q = self
                        .ready
                        .wait_timeout(q, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample::Sample;
    use milonga_wire::{Encoding, Value};

    fn sample(key: &str, seq: u64) -> Event {
        Event::Sample(Sample {
            key: key.into(),
            value: Value::from(seq),
            publisher: NodeId([1; 16]),
            seq,
            timestamp_ns: 0,
            encoding: Encoding::Cbor,
            schema_id: 0,
            replayed: false,
            compact: None,
        })
    }

    #[test]
    fn keep_last_squashes_per_key_and_keeps_order() {
        let q = AppQueue::new(QueuePolicy::KeepLast(1));
        assert_eq!(q.push(sample("a", 1)), Pushed::Queued);
        assert_eq!(q.push(sample("b", 1)), Pushed::Queued);
        assert_eq!(q.push(sample("a", 2)), Pushed::Squashed);
        assert_eq!(q.push(Event::SubscriptionLive), Pushed::Queued);
        let got: Vec<_> = (0..3)
            .map(|_| q.pop(Some(Duration::ZERO)).unwrap())
            .collect();
        assert_eq!(
            got,
            vec![sample("b", 1), sample("a", 2), Event::SubscriptionLive]
        );
        assert_eq!(q.pop(Some(Duration::ZERO)), Err(false));
    }

    #[test]
    fn keep_all_reports_each_run_of_drops_exactly() {
        let q = AppQueue::new(QueuePolicy::KeepAll(1));
        q.push(sample("a", 1));
        for seq in [2, 3, 5] {
            assert_eq!(q.push(sample("a", seq)), Pushed::Dropped);
        }
        let mut lost = Vec::new();
        while let Ok(ev) = q.pop(Some(Duration::ZERO)) {
            if let Event::Lost(l) = ev {
                lost.push((l.first_seq, l.count));
            }
        }
        lost.sort();
        assert_eq!(lost, vec![(2, 2), (5, 1)]);
    }

    #[test]
    fn keep_all_drops_beyond_its_bound_and_reports_it() {
        let q = AppQueue::new(QueuePolicy::KeepAll(2));
        for seq in 1..=5 {
            q.push(sample("a", seq));
        }
        assert_eq!(q.pop(None).unwrap(), sample("a", 1));
        assert_eq!(q.pop(None).unwrap(), sample("a", 2));
        match q.pop(None).unwrap() {
            Event::Lost(l) => assert_eq!((l.first_seq, l.count), (3, 3)),
            ev => panic!("{ev:?}"),
        }
        q.close();
        assert_eq!(q.pop(None), Err(true));
    }
}
