//! JSON <-> Milonga values, and the JSON lines `milonga sub --json` prints.

use milonga::{Event, Value};
use serde_json::{json, Map, Number};

/// Arrays and byte strings up to this many elements print in full; longer
/// ones print as a summary (type, length, min, max, first elements).
pub const FULL_ARRAY_LIMIT: usize = 4096;

/// A JSON document as a value: numbers with no fraction become integers,
/// objects become maps with text keys.
pub fn from_json(j: &serde_json::Value) -> Value {
    match j {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Value::Int(i128::from(u))
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::Text(s.clone()),
        serde_json::Value::Array(a) => Value::Array(a.iter().map(from_json).collect()),
        serde_json::Value::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (Value::Text(k.clone()), from_json(v)))
                .collect(),
        ),
    }
}

fn float(f: f64) -> serde_json::Value {
    Number::from_f64(f).map_or_else(|| json!(f.to_string()), serde_json::Value::Number)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A value as JSON. Byte strings become `{"$bytes": "<hex>"}`; large
/// arrays and byte strings become summaries (see [`FULL_ARRAY_LIMIT`]).
pub fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => i64::try_from(*i)
            .map(|x| json!(x))
            .or_else(|_| u64::try_from(*i).map(|x| json!(x)))
            .unwrap_or_else(|_| json!(i.to_string())),
        Value::Float(f) => float(*f),
        Value::Text(s) => json!(s),
        Value::Bytes(b) if b.len() <= FULL_ARRAY_LIMIT => json!({ "$bytes": hex(b) }),
        Value::Bytes(b) => json!({ "$bytes_len": b.len(), "head": hex(&b[..16]) }),
        Value::Array(a) => serde_json::Value::Array(a.iter().map(to_json).collect()),
        Value::Map(pairs) => {
            let mut m = Map::new();
            for (k, v) in pairs {
                let key = match k {
                    Value::Text(s) => s.clone(),
                    other => to_json(other).to_string(),
                };
                m.insert(key, to_json(v));
            }
            serde_json::Value::Object(m)
        }
        Value::Typed(a) => {
            let n = a.len();
            let all = |k: usize| {
                (0..k)
                    .map(|i| float(a.get_f64(i).unwrap_or(f64::NAN)))
                    .collect::<Vec<_>>()
            };
            if n <= FULL_ARRAY_LIMIT {
                serde_json::Value::Array(all(n))
            } else {
                let (min, max) = summary(a);
                json!({ "$array": a.element().name(), "len": n, "min": float(min), "max": float(max), "first": all(8) })
            }
        }
        Value::Tagged(t, inner) => json!({ "$tag": t, "value": to_json(inner) }),
        _ => json!(format!("{v:?}")),
    }
}

/// Minimum and maximum of a typed array.
pub fn summary(a: &milonga::TypedArray) -> (f64, f64) {
    (0..a.len())
        .filter_map(|i| a.get_f64(i))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        })
}

/// Text from the network or a file (a key, a node's name, host or
/// endpoint, a reason) for a terminal: control characters, line breaks
/// included, written as `\u{..}` escapes, so that it cannot move the
/// cursor, retitle the terminal or forge a line.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// A short human summary of a value, for tables.
pub fn short(v: &Value) -> String {
    match v {
        Value::Typed(a) => {
            let (min, max) = summary(a);
            format!(
                "{}[{}] min {min:.3} max {max:.3}",
                a.element().name(),
                a.len()
            )
        }
        Value::Bytes(b) => format!("bytes[{}]", b.len()),
        Value::Float(f) => format!("{f:.4}"),
        other => {
            let s = to_json(other).to_string();
            if s.len() > 40 {
                format!("{}...", s.chars().take(37).collect::<String>())
            } else {
                s
            }
        }
    }
}

/// One JSON line for an event of `milonga sub --json`.
pub fn event_line(ev: &Event) -> serde_json::Value {
    match ev {
        Event::Sample(s) => {
            let mut j = json!({
                "key": s.key,
                "seq": s.seq,
                "timestamp_ns": s.timestamp_ns,
                "publisher": s.publisher.to_hex(),
                "value": to_json(&s.value),
            });
            if s.replayed {
                j["replayed"] = true.into();
            }
            j
        }
        // Status events: the form recordings keep (one definition).
        other => milonga::recording::status_json(other)
            .unwrap_or_else(|| json!({ "event": format!("{other:?}") })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What other nodes announce reaches the terminal with its control
    /// characters escaped, line breaks included (a node named with an
    /// escape sequence sent the operator's terminal commands; one named
    /// with a line break could add lines of its own to `ls`).
    #[test]
    fn control_characters_of_remote_text_are_shown_escaped() {
        assert_eq!(printable("sr/ps/1"), "sr/ps/1");
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(
            printable("x\n  pub sr/fake (reliable)\u{9b}"),
            "x\\u{a}  pub sr/fake (reliable)\\u{9b}"
        );
        assert!(matches!(printable("ok"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn json_round_trip() {
        let j: serde_json::Value =
            serde_json::from_str(r#"{"a": 1, "b": [true, null, 2.5, "x"], "c": -7}"#).unwrap();
        assert_eq!(to_json(&from_json(&j)), j);
    }

    #[test]
    fn a_key_prints_without_its_control_characters() {
        assert_eq!(printable("sr/ps/1"), "sr/ps/1");
        let evil = "a/\u{1b}]0;pwned\u{7}\r\nfake: 1";
        let shown = printable(evil);
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert_eq!(shown, "a/\\u{1b}]0;pwned\\u{7}\\u{d}\\u{a}fake: 1");
    }

    #[test]
    fn big_arrays_are_summarised() {
        let v = Value::from(vec![1.0f64; 5000]);
        let j = to_json(&v);
        assert_eq!(j["len"], 5000);
        assert_eq!(j["$array"], "f64");
    }
}
