//! Dropping an awaited call stops its helper thread. Alone in its test
//! binary: it counts this process's `milonga-call` threads.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use milonga::{Config, Node, Transport, Value};
use milonga_testkit::{poll_until, wait_for, TempDir};

fn call_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("procfs")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "milonga-call")
        .count()
}

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

#[test]
fn dropping_an_awaited_call_stops_its_wait() {
    let dir = TempDir::new("svc-cancel");
    let open = |name: &str| {
        let mut cfg = Config::new("milonga:///svc", name);
        cfg.transport = Transport::Tcp;
        cfg.runtime_dir = Some(dir.path().to_path_buf());
        Node::open_with(cfg).expect("open node")
    };
    let server = open("server");
    let client = open("client");
    // The handler runs until the test lets it end (30 s at most, a hang
    // guard): the helper thread must stop without waiting for it.
    let release = Arc::new(AtomicBool::new(false));
    let gate = release.clone();
    let _svc = server
        .serve("lab/slow", move |req| {
            if req.value == Value::from("x") {
                let _ = poll_until(Duration::from_secs(30), || gate.load(Ordering::SeqCst));
            }
            Ok(req.value)
        })
        .unwrap();
    wait_for("the service in discovery", Duration::from_secs(5), || {
        client
            .peers()
            .iter()
            .any(|a| a.services.iter().any(|s| s.key == "lab/slow"))
    });
    assert_eq!(call_threads(), 0);
    let mut pending = client
        .call_async("lab/slow", "x", Duration::from_secs(30))
        .unwrap();
    let waker = Waker::from(Arc::new(Noop));
    let poll = std::pin::Pin::new(&mut pending).poll(&mut Context::from_waker(&waker));
    assert!(poll.is_pending());
    // (The thread names itself once it runs.)
    wait_for("the helper thread", Duration::from_secs(10), || {
        call_threads() == 1
    });
    drop(pending);
    // While the handler still runs, long before the 30 s deadline (10 s is
    // a hang guard).
    wait_for("the helper thread to stop", Duration::from_secs(10), || {
        call_threads() == 0
    });
    release.store(true, Ordering::SeqCst);
    // The reply that comes later is dropped, and the connection serves the
    // next call (whose reply comes after it).
    wait_for("the late reply to be sent", Duration::from_secs(10), || {
        server.stats().calls_served == 1
    });
    assert_eq!(
        client.call("lab/slow", 2, Duration::from_secs(5)).unwrap(),
        Value::Int(2)
    );
    assert_eq!(client.stats().calls_late_replies, 1);
}
