//! Value parsers for the command line's numbers of seconds, milliseconds
//! and rates: a value out of range is refused by clap with a clear error,
//! before any node or file is made, rather than panicking later in a
//! `Duration` or an `Instant` (NaN, infinity, a negative number, 1e20 s).

/// The longest time any option takes: 10^9 seconds (about 31 years),
/// which an `Instant` can always be moved by.
pub const MAX_SECONDS: f64 = 1e9;

fn number(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .map_err(|_| format!("{s:?} is not a number"))
}

fn within(v: f64, zero_ok: bool, max: f64, unit: &str) -> Result<f64, String> {
    let low_ok = if zero_ok { v >= 0.0 } else { v > 0.0 };
    if v.is_finite() && low_ok && v <= max {
        Ok(v)
    } else {
        let low = if zero_ok { "0" } else { "more than 0" };
        Err(format!("{v}: {unit} from {low} to {max:e}"))
    }
}

/// Seconds, zero or more, at most [`MAX_SECONDS`].
pub fn seconds(s: &str) -> Result<f64, String> {
    within(number(s)?, true, MAX_SECONDS, "seconds")
}

/// Seconds, more than zero, at most [`MAX_SECONDS`].
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    within(number(s)?, false, MAX_SECONDS, "seconds")
}

/// Milliseconds, zero or more, at most [`MAX_SECONDS`] worth.
pub fn millis(s: &str) -> Result<f64, String> {
    within(number(s)?, true, MAX_SECONDS * 1e3, "milliseconds")
}

/// A deadline in milliseconds: more than zero, at most a year (the
/// library's bound: a larger one would be refused after the command made
/// its file or node).
pub fn deadline_millis(s: &str) -> Result<f64, String> {
    within(number(s)?, false, 365.0 * 86_400e3, "milliseconds")
}

/// A benchmark's payload size in bytes: at least 1 (the raw baseline's
/// end marker is an empty message), at most 1 GiB.
pub fn payload_size(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1 << 30).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: a size from 1 to 1073741824 bytes")),
    }
}

/// Events a second: a period of at most [`MAX_SECONDS`], at least 1 ns.
pub fn rate(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if v.is_finite() && (1.0 / MAX_SECONDS..=1e9).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{v}: a rate from {:e} to 1e9 a second",
            1.0 / MAX_SECONDS
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn what_cannot_make_a_duration_is_refused() {
        for bad in ["nan", "inf", "-inf", "-1", "1e10", "1e300", "x", ""] {
            assert!(seconds(bad).is_err(), "{bad}");
            assert!(positive_seconds(bad).is_err(), "{bad}");
            assert!(rate(bad).is_err(), "{bad}");
        }
        for bad in ["nan", "inf", "-1", "1e13", "x"] {
            assert!(millis(bad).is_err(), "{bad}");
            assert!(deadline_millis(bad).is_err(), "{bad}");
        }
        assert!(deadline_millis("3.2e10").is_err(), "over a year");
        assert_eq!(deadline_millis("3.1e10").unwrap(), 3.1e10);
        assert!(positive_seconds("0").is_err());
        assert!(deadline_millis("0").is_err());
        assert!(rate("0").is_err());
        assert!(rate("1e-300").is_err());
        assert_eq!(seconds("0").unwrap(), 0.0);
        assert_eq!(seconds(" 2.5 ").unwrap(), 2.5);
        assert_eq!(rate("0.5").unwrap(), 0.5);
        // The extremes accepted make a Duration and move an Instant.
        let now = Instant::now();
        for s in [seconds("1e9"), positive_seconds("1e9")] {
            let _ = now + Duration::from_secs_f64(s.unwrap());
        }
        let _ = now + Duration::from_secs_f64(millis("1e12").unwrap() / 1e3);
        let _ = now + Duration::from_secs_f64(1.0 / rate("1e-9").unwrap());
        let _ = Duration::from_secs_f64(1.0 / rate("1e9").unwrap());
    }
}
