//! A device server: a simulated power supply `sr/ps/1` publishing what a
//! Tango device server's attribute events carry (docs/event-kinds.md):
//!
//! | key | Tango event | how a client gets it |
//! |---|---|---|
//! | `sr/ps/1/current` (10 Hz, reliable, history 100) | change, archive, periodic | `--abs-change`, `--abs-change` + `--min-period-ms`, `--min-period-ms` |
//! | `sr/ps/1/current/config` (history 1, on change) | attribute configuration | `--last 1` |
//! | `sr/ps/1/state` (history 1, on change) | change on a state | `--last 1` |
//! | `sr/ps/1/current/data_ready` (a counter per 10 readings) | data ready | plain subscription |
//! | `sr/ps/1/user/ramp_done` (when a ramp ends) | user | plain subscription |
//! | liveliness (every node) | heartbeat | `publisher_alive` / `publisher_lost` events |
//!
//! Run: `cargo run --example device_server -- [locator] [seconds]`
//! (default `milonga:///lab`, until interrupted), then for instance
//! `milonga --locator milonga:///lab sub 'sr/ps/1/**' --last 1 --json`.

use std::time::{Duration, Instant};

use milonga::{Node, PublisherQos, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let locator = args.next().unwrap_or_else(|| "milonga:///lab".into());
    let seconds: Option<f64> = args.next().map(|s| s.parse()).transpose()?;
    let node = Node::open(&locator, "ps-1")?;

    let current = node.publisher_with("sr/ps/1/current", PublisherQos::reliable().history(100))?;
    let config =
        node.publisher_with("sr/ps/1/current/config", PublisherQos::default().history(1))?;
    let state = node.publisher_with("sr/ps/1/state", PublisherQos::default().history(1))?;
    let data_ready = node.publisher("sr/ps/1/current/data_ready")?;
    let ramp_done = node.publisher("sr/ps/1/user/ramp_done")?;

    // The attribute's configuration, as Tango's attribute configuration
    // event carries it: put once, and again whenever it changes.
    config.put(Value::Map(vec![
        ("unit".into(), "A".into()),
        ("min".into(), Value::Float(0.0)),
        ("max".into(), Value::Float(120.0)),
        ("abs_change".into(), Value::Float(0.1)),
        ("archive_period_ms".into(), Value::from(1000u64)),
    ]))?;
    state.put("ON")?;

    let started = Instant::now();
    let mut setpoint: f64 = 100.0;
    let mut reading = 0u64;
    while seconds.is_none_or(|s| started.elapsed().as_secs_f64() < s) {
        let t = started.elapsed().as_secs_f64();
        // A ramp every 2 s; noise on top.
        let target: f64 = if (t as u64 / 2) % 2 == 0 { 100.0 } else { 50.0 };
        let ramping = (setpoint - target).abs() > 0.5;
        setpoint += (target - setpoint) * 0.5;
        if ramping && (setpoint - target).abs() <= 0.5 {
            ramp_done.put(Value::Map(vec![("target".into(), Value::Float(target))]))?;
        }
        current.put(setpoint + 0.05 * (t * 7.0).sin())?;
        reading += 1;
        if reading % 10 == 0 {
            data_ready.put(reading)?;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    state.put("OFF")?;
    node.close();
    Ok(())
}
