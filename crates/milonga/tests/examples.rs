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

fn run(name: &str, args: &[&str], dir: &TempDir) -> std::process::Output {
    std::process::Command::new(example(name))
        .args(args)
        .env("MILONGA_RUNTIME_DIR", dir.path())
        .output()
        .expect("run the example")
}

#[test]
fn pub_and_sub() {
    let dir = TempDir::new("ex-pubsub");
    let locator = format!("milonga:///expub-{}", std::process::id());
    let mut cmd = std::process::Command::new(example("sub"));
    cmd.args([&locator, "sr/**", "8"])
        .env("MILONGA_RUNTIME_DIR", dir.path())
        .stdout(std::process::Stdio::piped());
    let sub = cmd.spawn().unwrap();
    let p = run("pub", &[&locator, "30"], &dir);
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    assert!(String::from_utf8_lossy(&p.stdout).contains("published 30 values"));
    let out = sub.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("sr/ps/1/current #"), "{text}");
    assert!(text.contains(", 0 lost"), "{text}");
}

#[test]
fn serve_and_call() {
    let dir = TempDir::new("ex-svc");
    let locator = format!("milonga:///exsvc-{}", std::process::id());
    let mut cmd = std::process::Command::new(example("serve"));
    cmd.args([&locator, "20"])
        .env("MILONGA_RUNTIME_DIR", dir.path());
    let _server = Proc::spawn(cmd);
    let ok = run("call", &[&locator, "sr/ps/1/set_current", "42.5"], &dir);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "42.5");
    let back = run("call", &[&locator, "sr/ps/1/get_current", "null"], &dir);
    assert_eq!(String::from_utf8_lossy(&back.stdout).trim(), "42.5");
    let bad = run("call", &[&locator, "sr/ps/1/set_current", "500"], &dir);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("out_of_range"));
}

#[test]
fn monitor_shows_the_device_server() {
    let dir = TempDir::new("ex-monitor");
    let locator = format!("milonga:///exmon-{}", std::process::id());
    let mut cmd = std::process::Command::new(example("device_server"));
    cmd.args([&locator, "8"])
        .env("MILONGA_RUNTIME_DIR", dir.path());
    let _server = Proc::spawn(cmd);
    let m = run("monitor", &[&locator, "sr/ps/1/**", "3"], &dir);
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    let text = String::from_utf8_lossy(&m.stdout);
    assert!(
        text.contains("sr/ps/1/current") && text.contains("sr/ps/1/state"),
        "{text}"
    );
}
