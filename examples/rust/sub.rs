//! Prints what arrives on an expression, with status events.
//!
//! Run: `cargo run --example sub -- [locator] [expr] [seconds]` (default
//! `milonga:///lab`, `sr/**`, 10 s).

use std::time::{Duration, Instant};

use milonga::{Event, Node, RecvError, SubscriberQos};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let locator = args.next().unwrap_or_else(|| "milonga:///lab".into());
    let expr = args.next().unwrap_or_else(|| "sr/**".into());
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(10.0);
    let node = Node::open(&locator, "sub-example")?;
    let sub = node.subscribe_with(&expr, SubscriberQos::default().last(1))?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut samples = 0;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match sub.recv_timeout(left) {
            Ok(Event::Sample(s)) => {
                samples += 1;
                println!("{} #{} = {:?}", s.key, s.seq, s.value);
            }
            Ok(Event::Lost(l)) => println!("lost {} samples of {}", l.count, l.key),
            Ok(other) => println!("{other:?}"),
            Err(RecvError::Timeout) => break,
            Err(e) => return Err(e.into()),
        }
    }
    println!("{samples} samples, {} lost", sub.lost());
    Ok(())
}
