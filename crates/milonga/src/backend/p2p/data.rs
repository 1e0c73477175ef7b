//! A data socket: the XPUB that the publishers of one reliability share,
//! with the [`Outlet`] state they share with it. This module moves frames
//! between the two: what subscribers send upstream, waiting batches, the
//! frames of history replies and filters.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crate::api::node::NodeInner;
use crate::backend::p2p::zmq_io;
use crate::engine::batch::Pending;
use crate::engine::outlet::{Outlet, Upstream};
use crate::model::qos::Reliability;
use crate::util::stats::{self, Counters};

/// A data socket (XPUB) shared by the publishers of one reliability.
pub(crate) struct DataSocket {
    pub(crate) sock: Mutex<DataSock>,
    pub(crate) endpoint: String,
}

/// The socket and its publications' state, behind one lock.
pub(crate) struct DataSock {
    pub(crate) sock: zmq::Socket,
    pub(crate) out: Outlet,
}

/// Most messages (subscriptions, queries, declarations) one call of
/// [`DataSock::drain_subscriptions`] reads: under a flood, the node thread
/// goes on to its other duties (heartbeats) and puts get the socket, then
/// comes back at once. libzmq's XPUB moves what peers send upstream into
/// an unbounded queue of its own, so reading fast is what bounds memory.
const MAX_DRAIN: usize = 65_536;

impl DataSock {
    pub(crate) fn new(sock: zmq::Socket, reliability: Reliability) -> Self {
        DataSock {
            sock,
            out: Outlet::new(reliability),
        }
    }

    /// Reads the subscribe/unsubscribe messages and history queries queued
    /// on the XPUB socket, and answers the queries.
    /// Whether it stopped at [`MAX_DRAIN`] with more to read.
    pub(crate) fn drain_subscriptions(&mut self, node: &NodeInner) -> bool {
        let me = node.me();
        for _ in 0..MAX_DRAIN {
            let Ok(msg) = self.sock.recv_msg(zmq::DONTWAIT) else {
                return false;
            };
            match self.out.upstream(&me, &msg) {
                Upstream::Done => {}
                Upstream::Freed(bytes) => zmq_io::note_freed(bytes),
                Upstream::Answer(answer) => {
                    for r in &answer.replies {
                        let f = self.out.reply_frame(&me, &answer, r);
                        if self.sock.send(f, zmq::DONTWAIT).is_err() {
                            stats::inc(&me.counters.history_replies_dropped);
                            limited!(warn, token = %answer.token, "could not send a history reply at once; the subscriber will go on live");
                            break;
                        }
                    }
                }
                Upstream::Unknown => {
                    let n = me.counters.frames_malformed.fetch_add(1, Ordering::Relaxed) + 1;
                    if n <= 10 || n % 1000 == 0 {
                        tracing::warn!(
                            len = msg.len(),
                            dropped_so_far = n,
                            "dropped a message sent to a data port that is not a subscription"
                        );
                    }
                }
            }
        }
        true
    }

    /// Tries to send the waiting batch, if any (see [`Pending::send`]).
    pub(crate) fn send_pending(&mut self, flags: i32, counters: &Counters) -> zmq::Result<()> {
        let pending = self.out.pending();
        let n = pending.as_ref().map_or(0, Pending::samples);
        let sock = &mut self.sock;
        Pending::send(pending, |frame| zmq_io::send_bytes(sock, frame, flags))?;
        if n > 0 {
            stats::inc(&counters.batches_sent);
            stats::add(&counters.samples_batched, n);
        }
        Ok(())
    }

    /// Sends the frames of the filters a sample passed (see
    /// [`Outlet::accepted`]); one the socket refuses is counted
    /// `filtered_dropped`.
    pub(crate) fn send_filtered(&mut self, frames: Vec<Vec<u8>>, counters: &Counters) {
        for f in frames {
            if self.sock.send(f, zmq::DONTWAIT).is_err() {
                stats::inc(&counters.filtered_dropped);
            }
        }
    }
}
