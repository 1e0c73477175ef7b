//! A monitor: subscribes to an expression and prints, every second, a
//! table of keys with their rate, count, lost count and last value.
//!
//! Run: `cargo run --example monitor -- [locator] [expr] [seconds]`
//! (default `milonga:///lab`, `**`, until interrupted).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use milonga::{Event, Node, RecvError, SubscriberQos, Value};

fn show(v: &Value) -> String {
    match v {
        Value::Typed(t) => format!("{}[{}]", t.element().name(), t.len()),
        other => {
            let s = format!("{other:?}");
            if s.len() < 40 {
                s
            } else {
                format!("{}...", &s[..37])
            }
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let locator = args.next().unwrap_or_else(|| "milonga:///lab".into());
    let expr = args.next().unwrap_or_else(|| "**".into());
    let seconds: Option<f64> = args.next().map(|s| s.parse()).transpose()?;
    let node = Node::open(&locator, "monitor")?;
    let sub = node.subscribe_with(&expr, SubscriberQos::default().last(1))?;
    // key -> (count, last value, lost)
    let mut rows: BTreeMap<String, (u64, Option<Value>, u64)> = BTreeMap::new();
    let started = Instant::now();
    let mut next_print = started + Duration::from_secs(1);
    while seconds.is_none_or(|s| started.elapsed().as_secs_f64() < s) {
        let wait = next_print.saturating_duration_since(Instant::now());
        match sub.recv_timeout(wait.min(Duration::from_millis(500))) {
            Ok(Event::Sample(s)) => {
                let row = rows.entry(s.key).or_default();
                row.0 += 1;
                row.1 = Some(s.value);
            }
            Ok(Event::Lost(l)) => rows.entry(l.key).or_default().2 += l.count,
            Ok(other) => println!("# {other:?}"),
            Err(RecvError::Timeout) => {}
            Err(e) => return Err(e.into()),
        }
        if Instant::now() >= next_print {
            let elapsed = started.elapsed().as_secs_f64();
            println!(
                "{:<32} {:>8} {:>8} {:>6}  last value",
                "key", "rate/s", "count", "lost"
            );
            for (key, (count, value, lost)) in &rows {
                let v = value.as_ref().map(show).unwrap_or_default();
                println!(
                    "{key:<32} {:>8.1} {count:>8} {lost:>6}  {v}",
                    *count as f64 / elapsed
                );
            }
            println!();
            next_print += Duration::from_secs(1);
        }
    }
    Ok(())
}
