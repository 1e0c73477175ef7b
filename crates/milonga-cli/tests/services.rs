//! Services with real processes: `milonga serve` and `milonga call`, each
//! outcome of a call, a server killed with calls in flight, callers that die
//! with calls pending.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

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

    // No server: at once, not after the timeout.
    let started = Instant::now();
    let o = env.call(&["lab/nobody", "1", "--timeout", "30"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no server of \"lab/nobody\""),
        "{}",
        stderr(&o)
    );
    assert!(started.elapsed() < Duration::from_secs(10));

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

#[test]
fn a_server_killed_with_100_calls_in_flight_ends_every_call_by_its_deadline() {
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
    let deadline = Duration::from_secs(4);
    let sent = Instant::now();
    let calls: Vec<_> = (0..100)
        .map(|i| node.call_async("lab/slow", i, deadline).unwrap())
        .collect();
    // Let the requests reach the server: 4 run, 96 wait in its queue.
    std::thread::sleep(Duration::from_millis(300));
    server.kill9();
    let killed = Instant::now();
    let waiters: Vec<_> = calls
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let r = c.wait();
                (r, Instant::now())
            })
        })
        .collect();
    let mut lost = 0;
    for w in waiters {
        let (r, at) = w.join().unwrap();
        assert!(
            at <= sent + deadline + Duration::from_millis(100),
            "a call ended {:?} after it was sent",
            at - sent
        );
        match r {
            Err(CallError::ServerLost { .. }) => {
                lost += 1;
                assert!(
                    at - killed < Duration::from_secs(1),
                    "server lost reported {:?} after the kill",
                    at - killed
                );
            }
            Err(CallError::Timeout { .. }) => {}
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(lost, 100, "every call sees the server go");
    assert!(matches!(
        node.call("lab/slow", 1, Duration::from_secs(1)),
        Err(CallError::NoServer { .. }) | Err(CallError::ServerLost { .. })
    ));
}

#[test]
fn callers_that_die_with_calls_pending_leave_the_server_as_it_was() {
    let env = Env::new("svc-dying-callers");
    let server = env.serve(&["lab/slow", "--echo", "--delay-ms", "200"]);
    let pid = server.pid();
    let cycle = |n: usize| {
        for _ in 0..n {
            let mut c = Proc::spawn(env.cmd(&["call", "lab/slow", "1", "--timeout", "10"]));
            // The call is sent and the server is busy with it.
            std::thread::sleep(Duration::from_millis(60));
            c.kill9();
        }
    };
    let settled = |what: &str| {
        // Connections of dead callers close; replies to them are dropped.
        std::thread::sleep(Duration::from_millis(500));
        let fds = fd_count(pid).unwrap();
        let rss = rss_kib(pid).unwrap();
        eprintln!("{what}: {fds} fds, {rss} KiB");
        (fds, rss)
    };
    cycle(10);
    let (fds0, rss0) = settled("after warm-up");
    cycle(40);
    let (fds1, rss1) = settled("after 40 more dead callers");
    assert_eq!(fds1, fds0, "file descriptors as they were");
    assert!(
        rss1 <= rss0 + 512,
        "memory grew from {rss0} KiB to {rss1} KiB"
    );
    // And the server still answers.
    let o = env.call(&["lab/slow", "7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "7");
    let node = env.node("check");
    known(&node, "lab/slow", 1);
    let stats = node
        .peers()
        .into_iter()
        .find(|a| !a.services.is_empty())
        .and_then(|a| node.query(&a.control, Duration::from_secs(2)))
        .expect("the server answers a control query")
        .stats;
    assert!(
        stats.replies_undeliverable >= 40,
        "replies to dead callers are counted: {stats:?}"
    );
}
