//! Rate-limited logging for every line that a remote peer or a file can
//! trigger: a flood of bad input must not flood the log (the counters in
//! `stats` count every occurrence).

/// Logs at `$level` (`warn`, `info`, ...) the first ten times this call
/// site runs, then one time in a thousand, with the count so far as `seen`.
macro_rules! limited {
    ($level:ident, $($arg:tt)+) => {{
        static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n <= 10 || n % 1000 == 0 {
            tracing::$level!(seen = n, $($arg)+);
        }
    }};
}
