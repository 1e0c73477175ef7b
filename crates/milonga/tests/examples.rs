//! The examples under examples/rust run, and do what their documentation
//! says (cargo builds them for the tests).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use milonga::{Config, Event, Node, SubscriberQos};
use milonga_testkit::{Proc, TempDir};

fn example(name: &str) -> std::path::PathBuf {
    let deps = std::env::current_exe().unwrap();
    deps.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

/// The device server publishes every Tango event kind it documents: a
/// late joiner gets the configuration and state first (history 1), then the
/// current, data-ready and user events.
#[test]
fn device_server_publishes_every_event_kind() {
    let dir = TempDir::new("ex-device");
    let locator = format!("milonga:///ex-{}", std::process::id());
    let mut cmd = std::process::Command::new(example("device_server"));
    cmd.arg(&locator)
        .arg("8")
        .env("MILONGA_RUNTIME_DIR", dir.path());
    let _server = Proc::spawn(cmd);
    let mut cfg = Config::new(&locator, "client");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    let node = Node::open_with(cfg).unwrap();
    let sub = node
        .subscribe_with("sr/ps/1/**", SubscriberQos::default().last(1))
        .unwrap();
    let want: BTreeSet<&str> = [
        "sr/ps/1/current",
        "sr/ps/1/current/config",
        "sr/ps/1/state",
        "sr/ps/1/current/data_ready",
        "sr/ps/1/user/ramp_done",
    ]
    .into();
    let mut seen = BTreeSet::new();
    let mut alive = false;
    let end = Instant::now() + Duration::from_secs(20);
    while seen.len() < want.len() {
        assert!(Instant::now() < end, "only {seen:?}");
        match sub.recv_timeout(Duration::from_secs(10)).expect("an event") {
            Event::Sample(s) => {
                if s.key == "sr/ps/1/current/config" {
                    assert_eq!(s.value.get("unit"), Some(&milonga::Value::from("A")));
                }
                if want.contains(s.key.as_str()) {
                    seen.insert(s.key);
                }
            }
            Event::PublisherAlive(a) => alive |= a.name.starts_with("ps-1@"),
            _ => {}
        }
    }
    assert!(alive, "the device server's liveliness was reported");
}
