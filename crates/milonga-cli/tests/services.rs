//! Services with real processes: `milonga serve` and `milonga call`, each
//! outcome of a call, a server killed with calls in flight, callers that die
//! with calls pending.

use std::process::{Command, Output};
use std::time::Duration;

use milonga::{CallError, Node};
use milonga_testkit::{fd_count, rss_kib, wait_for, Proc};

mod common;
use common::Env;
use serde_json::Value as Json;

const T: Duration = Duration::from_secs(20);

/// What these tests add to the shared environment.
impl Env {
    /// `milonga serve ...`, once it says it is serving.
    fn serve(&self, args: &[&str]) -> Proc {
        self.serve_cmd(self.cmd(&[&["serve"], args].concat()))
    }

    fn serve_cmd(&self, cmd: Command) -> Proc {
        let p = Proc::spawn(cmd);
        let line = p.line(T).expect("the server says it is serving");
        assert!(line.starts_with("serving "), "{line}");
        p
    }

    fn call(&self, args: &[&str]) -> Output {
        self.cmd(&[&["call"], args].concat())
            .output()
            .expect("run milonga call")
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_owned()
}

/// Waits until `node` knows `n` servers of `key`.
fn known(node: &Node, key: &str, n: usize) {
    wait_for("servers in discovery", T, || {
        node.peers()
            .iter()
            .flat_map(|a| &a.services)
            .filter(|s| s.key == key)
            .count()
            == n
    });
}

#[test]
fn call_prints_the_reply_and_ls_lists_the_service() {
    let env = Env::new("svc-cli-reply");
    let _server = env.serve(&["lab/echo", "--echo"]);
    let o = env.call(&[
        "lab/echo",
        r#"{"amps": 12.5, "on": true, "tags": ["a", 1]}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let reply: Json = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        reply,
        serde_json::json!({"amps": 12.5, "on": true, "tags": ["a", 1]})
    );
    let out = env.cmd(&["ls", "--json"]).output().unwrap();
    let nodes: Json = serde_json::from_slice(&out.stdout).unwrap();
    let services: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["services"].as_array().unwrap())
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["lab/echo"]);
    let text = stdout(&env.cmd(&["ls"]).output().unwrap());
    assert!(text.contains("service lab/echo at tcp://"), "{text}");
}

#[test]
fn each_failure_has_its_message_and_exit_status() {
    let env = Env::new("svc-cli-fail");
    let _failing = env.serve(&["lab/failing", "--error", "out_of_range"]);
    let _fragile = env.serve(&["lab/fragile", "--echo", "--panic-on", r#""boom""#]);
    let _slow = env.serve(&["lab/slow", "--echo", "--delay-ms", "3000"]);

    // No server: at once, not at the 30 s deadline (which would be a
    // timeout, exit status 3).
    let o = env.call(&["lab/nobody", "1", "--timeout", "30"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no server of \"lab/nobody\""),
        "{}",
        stderr(&o)
    );

    // Remote error, with the handler's kind.
    let o = env.call(&["lab/failing", "1"]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("out_of_range"), "{}", stderr(&o));

    // A panic is a remote error, and the server goes on.
    let o = env.call(&["lab/fragile", r#""boom""#]);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert!(stderr(&o).contains("panic"), "{}", stderr(&o));
    let o = env.call(&["lab/fragile", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "2");

    // Timeout.
    let o = env.call(&["lab/slow", "1", "--timeout", "0.3"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("did not answer"), "{}", stderr(&o));

    // Rejected: over the server's size limit.
    let mut cmd = env.cmd(&["serve", "lab/small", "--echo"]);
    cmd.env("MILONGA_MAX_MESSAGE_BYTES", "65536");
    let _small = env.serve_cmd(cmd);
    let big = format!("\"{}\"", "x".repeat(100_000));
    let o = env.call(&["lab/small", &big]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    assert!(stderr(&o).contains("too_large"), "{}", stderr(&o));

    // Bad input to the command itself.
    let o = env.call(&["lab/echo", "{not json"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is not JSON"), "{}", stderr(&o));
}

#[test]
fn an_overloaded_server_rejects_what_it_cannot_queue() {
    let env = Env::new("svc-overload");
    let _server = env.serve(&[
        "lab/busy",
        "--echo",
        "--workers",
        "2",
        "--max-queued",
        "2",
        "--delay-ms",
        "300",
    ]);
    let node = env.node("caller");
    known(&node, "lab/busy", 1);
    let calls: Vec<_> = (0..12)
        .map(|i| node.call_async("lab/busy", i, T).unwrap())
        .collect();
    let outcomes: Vec<_> = calls.into_iter().map(|c| c.wait()).collect();
    let overload = outcomes
        .iter()
        .filter(|r| matches!(r, Err(CallError::Rejected { kind, .. }) if kind == "overload"))
        .count();
    let ok = outcomes.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok + overload, 12, "{outcomes:?}");
    assert!(overload >= 1 && ok >= 3, "{outcomes:?}");
}

/// One control connection to the node that serves something, kept for
/// the whole test: asking its counters over a new connection each time
/// (as `Node::query` does) would open and close connections at the server,
/// moving the very file descriptors and `peer_disconnects` a test watches.
struct Control(zmq::Socket);

impl Control {
    fn to_server(node: &Node) -> Control {
        let endpoint = node
            .peers()
            .into_iter()
            .find(|a| !a.services.is_empty())
            .map(|a| a.control)
            .expect("a server in discovery");
        let sock = zmq::Context::new().socket(zmq::DEALER).unwrap();
        sock.set_linger(0).unwrap();
        sock.set_rcvtimeo(T.as_millis() as i32).unwrap();
        sock.connect(&endpoint).unwrap();
        Control(sock)
    }

    fn stats(&self) -> milonga::NodeStats {
        self.0
            .send_multipart([milonga::p2p::CONTROL_MAGIC, milonga::p2p::CONTROL_INFO], 0)
            .unwrap();
        let frames = self.0.recv_multipart(0).expect("the server answers");
        assert_eq!(frames.len(), 3, "a control answer");
        serde_json::from_slice::<milonga::p2p::NodeInfo>(&frames[2])
            .expect("a control answer")
            .stats
    }
}

/// The time from the kill to each call's end is measured by `milonga bench
/// deadlines` (docs/benchmarks.md); here, the outcome: every call ends with
/// `ServerLost`, none waits for its deadline.
#[test]
fn a_server_killed_with_100_calls_in_flight_ends_every_call_with_server_lost() {
    let env = Env::new("svc-kill9");
    let mut server = env.serve(&[
        "lab/slow",
        "--echo",
        "--delay-ms",
        "10000",
        "--workers",
        "4",
    ]);
    let node = env.node("caller");
    known(&node, "lab/slow", 1);
    // A hang guard: the kill must end the calls long before it.
    let deadline = Duration::from_secs(60);
    let control = Control::to_server(&node);
    let calls: Vec<_> = (0..100)
        .map(|i| node.call_async("lab/slow", i, deadline).unwrap())
        .collect();
    wait_for("the server to read the 100 requests", T, || {
        control.stats().requests_received == 100
    });
    // 4 run, 96 wait in its queue.
    server.kill9();
    let waiters: Vec<_> = calls
        .into_iter()
        .map(|c| std::thread::spawn(move || c.wait()))
        .collect();
    for w in waiters {
        match w.join().unwrap() {
            Err(CallError::ServerLost { .. }) => {}
            other => panic!("expected ServerLost, got {other:?}"),
        }
    }
    assert_eq!(node.stats().calls_server_lost, 100);
    assert!(matches!(
        node.call("lab/slow", 1, Duration::from_secs(1)),
        Err(CallError::NoServer { .. }) | Err(CallError::ServerLost { .. })
    ));
}

#[test]
fn callers_that_die_with_calls_pending_leave_the_server_as_it_was() {
    let env = Env::new("svc-dying-callers");
    // A request takes 2.5 s, and waits for one of 10 workers: each caller
    // is dead, and the server has seen its connection close, long before
    // its reply is sent (each cycle checks the second: the server counts
    // the caller's connection gone before the next caller starts). (The warm-up runs all 10 workers, so that their
    // stacks count in the memory measured before the 40 more.)
    let server = env.serve(&[
        "lab/slow",
        "--echo",
        "--delay-ms",
        "2500",
        "--workers",
        "10",
    ]);
    let pid = server.pid();
    let check = env.node("check");
    known(&check, "lab/slow", 1);
    let control = Control::to_server(&check);
    // Connections to the server that are not a caller's: the check node's
    // and this control connection. A caller makes its own, closed by its
    // death; each is counted in `peer_disconnects` once the server has
    // closed its side.
    let mut callers: u64 = 0;
    let mut cycle = |n: usize| {
        for _ in 0..n {
            let before = control.stats();
            let mut c = Proc::spawn(env.cmd(&["call", "lab/slow", "1", "--timeout", "30"]));
            callers += 1;
            wait_for("the server to read the call", T, || {
                control.stats().requests_received == callers
            });
            c.kill9();
            wait_for("the server to see the caller go", T, || {
                control.stats().peer_disconnects > before.peer_disconnects
            });
        }
        callers
    };
    let settled = |what: &str, callers: u64, fds: Option<usize>| {
        // Every reply has been tried (and dropped: its caller is gone)...
        wait_for("the server to answer every call", T, || {
            control.stats().calls_served == callers
        });
        // ...and the connections of the dead callers are closed: the
        // count settles (the server closes its side of a connection a
        // moment after it counts it gone), and comes back to where it was.
        let mut last = fd_count(pid);
        wait_for("the file descriptors to settle", T, || {
            let now = fd_count(pid);
            let same = now == last && fds.is_none_or(|f| now == Some(f));
            last = now;
            same
        });
        let fds = fd_count(pid).unwrap();
        let rss = rss_kib(pid).unwrap();
        eprintln!("{what}: {fds} fds, {rss} KiB");
        (fds, rss)
    };
    // The warm-up: 10 callers, then 40, so that the allocator's own
    // growth (its arenas and free lists, which move a few hundred KiB
    // either way from one cycle to the next: 21,876 KiB after 50
    // callers, 21,752 after 90, 22,052 after 130 in one run) is behind
    // the measure.
    cycle(10);
    let n = cycle(40);
    let (fds0, rss0) = settled("after warm-up", n, None);
    let n = cycle(40);
    let (fds1, rss1) = settled("after 40 more dead callers", n, Some(fds0));
    assert_eq!(fds1, fds0, "file descriptors as they were");
    assert!(
        rss1 <= rss0 + 512,
        "memory grew from {rss0} KiB to {rss1} KiB"
    );
    assert_eq!(
        control.stats().replies_undeliverable,
        90,
        "every reply to a dead caller is counted"
    );
    // And the server still answers.
    let o = env.call(&["lab/slow", "7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "7");
}
