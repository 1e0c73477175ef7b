//! Serves a power supply's commands: `sr/ps/1/set_current` (a number,
//! 0..120) and `sr/ps/1/get_current`.
//!
//! Run: `cargo run --example serve -- [locator] [seconds]` (default
//! `milonga:///lab`, 30 s), then the `call` example.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use milonga::{Node, ServiceError, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let locator = args.next().unwrap_or_else(|| "milonga:///lab".into());
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(30.0);
    let node = Node::open(&locator, "serve-example")?;
    let setpoint = Arc::new(Mutex::new(0.0f64));
    let s = setpoint.clone();
    let _set = node.serve("sr/ps/1/set_current", move |req| {
        let amps = req.value.as_f64().ok_or("expected a number")?;
        if !(0.0..=120.0).contains(&amps) {
            return Err(ServiceError::new(
                "out_of_range",
                format!("{amps} A is outside 0..120 A"),
            ));
        }
        *s.lock().unwrap_or_else(|e| e.into_inner()) = amps;
        Ok(Value::Float(amps))
    })?;
    let _get = node.serve("sr/ps/1/get_current", move |_req| {
        Ok(Value::Float(
            *setpoint.lock().unwrap_or_else(|e| e.into_inner()),
        ))
    })?;
    println!("serving sr/ps/1/set_current and sr/ps/1/get_current");
    std::thread::sleep(Duration::from_secs_f64(seconds));
    Ok(())
}
