//! Calls a service and prints the reply, or why there is none.
//!
//! Run: `cargo run --example call -- [locator] [key] [value]` (default
//! `milonga:///lab`, `sr/ps/1/set_current`, 12.5; a value is a number,
//! `null`, or else text). (`milonga call` takes any JSON value.)

use std::time::Duration;

use milonga::{CallError, Node, Value};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let locator = args.next().unwrap_or_else(|| "milonga:///lab".into());
    let key = args.next().unwrap_or_else(|| "sr/ps/1/set_current".into());
    let arg = args.next().unwrap_or_else(|| "12.5".into());
    let value = match (arg.as_str(), arg.parse::<f64>()) {
        ("null", _) => Value::Null,
        (_, Ok(x)) => Value::Float(x),
        _ => Value::Text(arg),
    };
    let node = Node::open(&locator, "call-example")?;
    // Discovery needs a moment after opening: retry "no server" briefly.
    for attempt in 0.. {
        match node.call(&key, value.clone(), Duration::from_secs(2)) {
            Ok(reply) => {
                match reply {
                    Value::Float(x) => println!("{x}"),
                    Value::Text(t) => println!("{t:?}"),
                    other => println!("{other:?}"),
                }
                return Ok(());
            }
            Err(CallError::NoServer { .. }) if attempt < 49 => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
