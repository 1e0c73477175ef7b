//! Services between nodes of one process: every outcome of a call, load
//! sharing, gathering, concurrency. (Crashes and dying callers, which need
//! real processes, are in crates/milonga-cli/tests/services.rs.)

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use milonga::{CallError, Config, Node, ServeOptions, ServiceError, Transport, Value};
use milonga_testkit::{wait_for, TempDir};

fn open(name: &str, dir: &std::path::Path) -> Node {
    let mut cfg = Config::new("milonga:///svc", name);
    cfg.transport = Transport::Tcp;
    cfg.runtime_dir = Some(dir.to_path_buf());
    Node::open_with(cfg).expect("open node")
}

/// A server and a client node in one directory; the client knows the
/// server's services once this returns.
fn pair(dir: &TempDir) -> (Node, Node) {
    (open("server", dir.path()), open("client", dir.path()))
}

fn known(client: &Node, key: &str, n: usize) {
    wait_for("the service in discovery", Duration::from_secs(5), || {
        client
            .peers()
            .iter()
            .flat_map(|a| &a.services)
            .filter(|s| s.key == key)
            .count()
            == n
    });
}

fn echo(req: milonga::Request) -> Result<Value, ServiceError> {
    Ok(req.value)
}

/// A flag a handler waits on and a test raises: handlers that end when the
/// test says so, not after a guessed time. The wait gives up after 30 s, a
/// hang guard.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn open(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    fn wait(&self) {
        let (open, cv) = &*self.0;
        let guard = open.lock().unwrap();
        let _ = cv
            .wait_timeout_while(guard, Duration::from_secs(30), |o| !*o)
            .unwrap();
    }
}

#[test]
fn a_call_gets_the_reply_value() {
    let dir = TempDir::new("svc-reply");
    let (server, client) = pair(&dir);
    let _svc = server.serve("lab/echo", echo).unwrap();
    known(&client, "lab/echo", 1);
    let t = Duration::from_secs(5);
    assert_eq!(
        client.call("lab/echo", 12.5, t).unwrap(),
        Value::Float(12.5)
    );
    let big = vec![7u8; 300_000];
    assert_eq!(
        client.call("lab/echo", big.clone(), t).unwrap(),
        Value::from(big),
        "a large request and reply travel in payload frames"
    );
    let map = Value::Map(vec![(Value::from("amps"), Value::Float(3.0))]);
    assert_eq!(client.call("lab/echo", map.clone(), t).unwrap(), map);
    // The node's own services are callable too.
    assert_eq!(server.call("lab/echo", "me", t).unwrap(), Value::from("me"));
    assert_eq!(client.stats().calls_replied, 3);
    assert_eq!(server.stats().calls_served, 4);
}

#[test]
fn a_handler_error_arrives_with_its_kind_and_message() {
    let dir = TempDir::new("svc-error");
    let (server, client) = pair(&dir);
    let _svc = server
        .serve("sr/ps/1/set_current", |req| {
            let amps = req.value.as_f64().ok_or("expected a number")?;
            Err(ServiceError::new(
                "out_of_range",
                format!("{amps} A is above 500 A"),
            ))
        })
        .unwrap();
    known(&client, "sr/ps/1/set_current", 1);
    let t = Duration::from_secs(5);
    match client.call("sr/ps/1/set_current", 900.0, t) {
        Err(CallError::Remote { kind, message, .. }) => {
            assert_eq!(kind, "out_of_range");
            assert_eq!(message, "900 A is above 500 A");
        }
        other => panic!("expected a remote error, got {other:?}"),
    }
    match client.call("sr/ps/1/set_current", "x", t) {
        Err(CallError::Remote { kind, message, .. }) => {
            assert_eq!(kind, "error");
            assert_eq!(message, "expected a number");
        }
        other => panic!("expected a remote error, got {other:?}"),
    }
}

#[test]
fn a_panicking_handler_is_a_remote_error_and_the_service_goes_on() {
    let dir = TempDir::new("svc-panic");
    let (server, client) = pair(&dir);
    let _svc = server
        .serve_with("lab/fragile", ServeOptions::default().workers(1), |req| {
            if req.value == Value::from("boom") {
                panic!("asked to fail");
            }
            Ok(req.value)
        })
        .unwrap();
    known(&client, "lab/fragile", 1);
    let t = Duration::from_secs(5);
    for _ in 0..3 {
        match client.call("lab/fragile", "boom", t) {
            Err(CallError::Remote { kind, message, .. }) => {
                assert_eq!(kind, "panic");
                assert!(message.contains("asked to fail"), "{message}");
            }
            other => panic!("expected a remote error, got {other:?}"),
        }
        // The one worker survived.
        assert_eq!(client.call("lab/fragile", 1, t).unwrap(), Value::Int(1));
    }
    assert_eq!(server.stats().handler_panics, 3);
}

#[test]
fn no_server_is_reported_at_once() {
    let dir = TempDir::new("svc-none");
    let client = open("client", dir.path());
    // NoServer, not the Timeout that waiting out the deadline would give.
    let r = client.call("lab/nobody", 1, Duration::from_secs(60));
    assert!(matches!(r, Err(CallError::NoServer { .. })), "{r:?}");
    assert!(matches!(
        client.call_all("lab/**", 1, Duration::from_secs(10)),
        Err(CallError::NoServer { .. })
    ));
    assert!(matches!(
        client.call("lab/*", 1, Duration::from_secs(1)),
        Err(CallError::Key(_))
    ));
}

/// How far past its deadline a call ends is measured by `milonga bench
/// deadlines` (docs/benchmarks.md); here, the order of events: not before
/// the deadline, and while the handler still runs.
#[test]
fn a_slow_handler_times_out_at_the_deadline_and_its_late_reply_goes_nowhere() {
    let dir = TempDir::new("svc-timeout");
    let (server, client) = pair(&dir);
    let release = Gate::default();
    let gate = release.clone();
    let returned = Arc::new(AtomicBool::new(false));
    let handler_returned = returned.clone();
    let _svc = server
        .serve_with("lab/slow", ServeOptions::default().workers(1), move |req| {
            if req.value == Value::from("wait") {
                gate.wait();
                handler_returned.store(true, Ordering::SeqCst);
            }
            Ok(req.value)
        })
        .unwrap();
    known(&client, "lab/slow", 1);
    let started = Instant::now();
    let r = client.call("lab/slow", "wait", Duration::from_millis(100));
    let took = started.elapsed();
    assert!(matches!(r, Err(CallError::Timeout { .. })), "{r:?}");
    assert!(
        took >= Duration::from_millis(100),
        "ended before its deadline: {took:?}"
    );
    assert!(
        !returned.load(Ordering::SeqCst),
        "the call ended when the handler did (its 30 s hang guard), not at its deadline"
    );
    release.open();
    // The next call uses the same connection; the first call's reply comes
    // first and must not be taken for this one's.
    let r = client
        .call("lab/slow", 1.0, Duration::from_secs(5))
        .unwrap();
    assert_eq!(r, Value::Float(1.0));
    assert_eq!(client.stats().calls_late_replies, 1);
}

#[test]
fn a_slow_handler_does_not_block_the_other_workers() {
    let dir = TempDir::new("svc-pool");
    let (server, client) = pair(&dir);
    // The slow handler runs until the fast calls are done: were they
    // waiting for it, they would time out.
    let release = Gate::default();
    let gate = release.clone();
    let slow_started = Arc::new(AtomicBool::new(false));
    let started = slow_started.clone();
    let _svc = server
        .serve_with(
            "lab/mixed",
            ServeOptions::default().workers(4),
            move |req| {
                if req.value == Value::from("slow") {
                    started.store(true, Ordering::SeqCst);
                    gate.wait();
                }
                Ok(req.value)
            },
        )
        .unwrap();
    known(&client, "lab/mixed", 1);
    let slow = client
        .call_async("lab/mixed", "slow", Duration::from_secs(60))
        .unwrap();
    wait_for("the slow handler to run", Duration::from_secs(10), || {
        slow_started.load(Ordering::SeqCst)
    });
    for i in 0..20 {
        assert_eq!(
            client.call("lab/mixed", i, Duration::from_secs(5)).unwrap(),
            Value::Int(i.into()),
            "a fast call waited for the slow one"
        );
    }
    release.open();
    assert_eq!(slow.wait().unwrap(), Value::from("slow"));
}

/// A worker that finishes after losing the lead must not clear the busy
/// mark of the leader that replaced it: the first handler returns the
/// moment the second one starts, which is when the new leader has just
/// marked itself busy. If that mark were lost, no standby would take over
/// and the fast calls would wait for the second handler, which runs until
/// they are done: they would time out.
#[test]
fn a_worker_finishing_late_leaves_the_new_leader_watched() {
    let dir = TempDir::new("svc-handover");
    let (server, client) = pair(&dir);
    let first_started = Arc::new(AtomicBool::new(false));
    let second_started = Gate::default();
    let release = Gate::default();
    let (first_flag, second_flag, gate) = (
        first_started.clone(),
        second_started.clone(),
        release.clone(),
    );
    let _svc = server
        .serve_with(
            "lab/handover",
            ServeOptions::default().workers(3),
            move |req| {
                if req.value == Value::from("first") {
                    first_flag.store(true, Ordering::SeqCst);
                    second_flag.wait();
                } else if req.value == Value::from("second") {
                    second_flag.open();
                    gate.wait();
                }
                Ok(req.value)
            },
        )
        .unwrap();
    known(&client, "lab/handover", 1);
    let t = Duration::from_secs(60);
    let mut first = client.call_async("lab/handover", "first", t).unwrap();
    wait_for("the first handler to run", Duration::from_secs(10), || {
        first_started.load(Ordering::SeqCst)
    });
    let second = client.call_async("lab/handover", "second", t).unwrap();
    // The second handler runs until the test ends it, so 10 s is a hang
    // guard: a first reply that waited for it would never come.
    let reply = first
        .wait_for(Duration::from_secs(10))
        .expect("the first reply waited for the second handler");
    assert_eq!(reply.unwrap(), Value::from("first"));
    for i in 0..10 {
        assert_eq!(
            client
                .call("lab/handover", i, Duration::from_secs(5))
                .unwrap(),
            Value::Int(i.into()),
            "a fast call waited for the second handler"
        );
    }
    release.open();
    assert_eq!(second.wait().unwrap(), Value::from("second"));
}

#[test]
fn an_over_size_request_is_rejected_before_sending() {
    let dir = TempDir::new("svc-size");
    let mut cfg = Config::new("milonga:///svc", "server");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    cfg.max_message_bytes = 1 << 16;
    let server = Node::open_with(cfg).unwrap();
    let client = open("client", dir.path());
    let _svc = server.serve("lab/small", echo).unwrap();
    known(&client, "lab/small", 1);
    match client.call("lab/small", vec![0u8; 100_000], Duration::from_secs(5)) {
        Err(CallError::Rejected { server, kind, .. }) => {
            assert_eq!(kind, "too_large");
            assert_eq!(
                server, None,
                "refused here, with the server's announced limit"
            );
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // The service is unharmed.
    assert_eq!(
        client.call("lab/small", 1, Duration::from_secs(5)).unwrap(),
        Value::Int(1)
    );
}

#[test]
fn a_reply_over_the_callers_limit_is_refused_and_the_connection_lives() {
    let dir = TempDir::new("svc-bigreply");
    let server = open("server", dir.path());
    let mut cfg = Config::new("milonga:///svc", "small");
    cfg.transport = Transport::Tcp;
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    cfg.max_message_bytes = 64 * 1024;
    let client = Node::open_with(cfg).unwrap();
    let _svc = server
        .serve("lab/blob", |req| {
            let n = req.value.as_f64().unwrap_or(0.0) as usize;
            Ok(Value::from(vec![1u8; n]))
        })
        .unwrap();
    known(&client, "lab/blob", 1);
    let t = Duration::from_secs(5);
    match client.call("lab/blob", 200_000, t) {
        Err(CallError::BadReply { why, .. }) => {
            assert!(why.contains("max_message_bytes"), "{why}")
        }
        other => panic!("expected BadReply, got {other:?}"),
    }
    assert_eq!(
        client.call("lab/blob", 10, t).unwrap(),
        Value::from(vec![1u8; 10])
    );
    assert_eq!(client.stats().calls_server_lost, 0);
}

#[test]
fn a_full_queue_rejects_with_overload() {
    let dir = TempDir::new("svc-overload");
    let (server, client) = pair(&dir);
    // Two workers: one runs the first call, the other reads and queues.
    let opts = ServeOptions::default().workers(2).max_queued(2);
    let _svc = server
        .serve_with("lab/busy", opts, |req| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(req.value)
        })
        .unwrap();
    known(&client, "lab/busy", 1);
    let calls: Vec<_> = (0..10)
        .map(|i| {
            client
                .call_async("lab/busy", i, Duration::from_secs(10))
                .unwrap()
        })
        .collect();
    let outcomes: Vec<_> = calls.into_iter().map(|c| c.wait()).collect();
    let ok = outcomes.iter().filter(|r| r.is_ok()).count();
    let overload = outcomes
        .iter()
        .filter(|r| matches!(r, Err(CallError::Rejected { kind, .. }) if kind == "overload"))
        .count();
    assert_eq!(ok + overload, 10, "{outcomes:?}");
    assert!(overload >= 1, "{outcomes:?}");
    assert!(ok >= 3, "one running and two queued at least: {outcomes:?}");
}

#[test]
fn several_servers_share_the_calls_and_call_all_gathers_them() {
    let dir = TempDir::new("svc-share");
    let client = open("client", dir.path());
    let servers: Vec<Node> = (0..3)
        .map(|i| open(&format!("server{i}"), dir.path()))
        .collect();
    let counts: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let _svcs: Vec<_> = servers
        .iter()
        .zip(&counts)
        .map(|(n, c)| {
            let c = c.clone();
            let name = n.name().to_owned();
            n.serve("lab/who", move |_| {
                c.fetch_add(1, Ordering::Relaxed);
                Ok(Value::from(name.as_str()))
            })
            .unwrap()
        })
        .collect();
    let _other = servers[0].serve("lab/other", echo).unwrap();
    known(&client, "lab/who", 3);
    for _ in 0..30 {
        client
            .call("lab/who", Value::Null, Duration::from_secs(5))
            .unwrap();
    }
    for c in &counts {
        assert_eq!(
            c.load(Ordering::Relaxed),
            10,
            "round robin among idle servers"
        );
    }
    let all = client.call_all("lab/*", 5, Duration::from_secs(5)).unwrap();
    assert_eq!(all.len(), 4, "three lab/who and one lab/other");
    let mut names: Vec<_> = all
        .iter()
        .filter(|r| r.key == "lab/who")
        .map(|r| r.result.as_ref().unwrap().as_str().unwrap().to_owned())
        .collect();
    names.sort();
    let mut expected: Vec<_> = servers.iter().map(|n| n.name().to_owned()).collect();
    expected.sort();
    assert_eq!(names, expected);
}

#[test]
fn many_threads_call_through_one_node() {
    let dir = TempDir::new("svc-threads");
    let (server, client) = pair(&dir);
    let _svc = server.serve("lab/echo", echo).unwrap();
    known(&client, "lab/echo", 1);
    let client = Arc::new(client);
    let start = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let client = client.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for i in 0..50i64 {
                    let v = t * 1000 + i;
                    let r = client.call("lab/echo", v, Duration::from_secs(10)).unwrap();
                    assert_eq!(r, Value::Int(v.into()), "each thread gets its own replies");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(client.stats().calls_replied, 800);
}

#[test]
fn an_awaited_call_completes() {
    let dir = TempDir::new("svc-async");
    let (server, client) = pair(&dir);
    let _svc = server.serve("lab/echo", echo).unwrap();
    known(&client, "lab/echo", 1);
    let pending = client
        .call_async("lab/echo", "later", Duration::from_secs(5))
        .unwrap();
    // A minimal executor: poll, park until woken, poll again.
    let r = block_on(pending);
    assert_eq!(r.unwrap(), Value::from("later"));
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// A handler that does `work` (its length is the scenario, not a wait for
/// anything), then drops its own service: the reply of that call still
/// goes out, and the service is gone.
fn a_handler_withdraws_its_own_service(tag: &str, work: Duration) {
    let dir = TempDir::new(tag);
    let (server, client) = pair(&dir);
    let slot: Arc<std::sync::Mutex<Option<milonga::Service>>> = Arc::default();
    let inner = slot.clone();
    let svc = server
        .serve("lab/once", move |req| {
            std::thread::sleep(work);
            drop(inner.lock().unwrap().take());
            Ok(req.value)
        })
        .unwrap();
    *slot.lock().unwrap() = Some(svc);
    known(&client, "lab/once", 1);
    assert_eq!(
        client.call("lab/once", 1, Duration::from_secs(5)).unwrap(),
        Value::Int(1),
        "the reply of the call that withdrew the service still goes out"
    );
    known(&client, "lab/once", 0);
    assert!(slot.lock().unwrap().is_none());
}

#[test]
fn a_handler_may_withdraw_its_own_service() {
    a_handler_withdraws_its_own_service("svc-selfdrop", Duration::ZERO);
}

/// The same, from a handler that runs longer (10 x) than the 2 ms after
/// which the standby worker takes the lead (`TAKEOVER`): the reply must not
/// be left for a leader that the withdrawal has already stopped.
#[test]
fn a_slow_handler_may_withdraw_its_own_service() {
    a_handler_withdraws_its_own_service("svc-selfdrop-slow", Duration::from_millis(20));
}

#[test]
fn a_withdrawn_service_is_no_longer_found() {
    let dir = TempDir::new("svc-withdraw");
    let (server, client) = pair(&dir);
    let svc = server.serve("lab/echo", echo).unwrap();
    assert!(matches!(
        server.serve("lab/echo", echo),
        Err(milonga::ServeError::AlreadyServed(_))
    ));
    known(&client, "lab/echo", 1);
    drop(svc);
    known(&client, "lab/echo", 0);
    assert!(matches!(
        client.call("lab/echo", 1, Duration::from_secs(5)),
        Err(CallError::NoServer { .. })
    ));
    // And the key can be served again.
    let _again = server.serve("lab/echo", echo).unwrap();
    known(&client, "lab/echo", 1);
    assert_eq!(
        client.call("lab/echo", 2, Duration::from_secs(5)).unwrap(),
        Value::Int(2)
    );
}
