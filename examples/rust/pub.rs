//! Publishes a power supply's current, 10 values a second.
//!
//! Run: `cargo run --example pub -- [locator] [count]` (default
//! `milonga:///lab`, 50 values), then the `sub` example.

use std::time::Duration;

use milonga::{Node, PublisherQos};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let locator = args.next().unwrap_or_else(|| "milonga:///lab".into());
    let count: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(50);
    let node = Node::open(&locator, "pub-example")?;
    let current = node.publisher_with("sr/ps/1/current", PublisherQos::default().history(10))?;
    for i in 0..count {
        current.put(100.0 + (i as f64 / 5.0).sin())?;
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("published {count} values of sr/ps/1/current");
    Ok(())
}
