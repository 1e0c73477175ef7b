//! Filters a subscriber attaches to its subscription and the publisher
//! applies (docs/protocol.md §4.4, docs/filters.md).
//!
//! A [`Filter`] combines Tango's change semantics (`abs_change`,
//! `rel_change` against the last value sent to that filter, element-wise
//! for arrays, any change of array length passes), a minimum period, and an
//! expression over the sample's value:
//!
//! ```text
//! expr    := or
//! or      := and ("||" and)*
//! and     := not ("&&" not)*
//! not     := "!" not | cmp
//! cmp     := operand (("==" | "!=" | "<" | "<=" | ">" | ">=") operand)?
//! operand := number | string | "true" | "false" | "null" | path | "(" expr ")"
//! path    := ident ("." ident)*          ident := [A-Za-z_][A-Za-z0-9_]*
//! ```
//!
//! A path names a field of the value when the value is a map (`status`,
//! `limits.high`); a path that starts with `value` starts from the whole
//! value, unless the value is a map with a field `value` (`value > 3` on a
//! number, `value.status == "ON"` on a map). A comparison of a number with a number
//! compares numerically, text with text by bytes, booleans and null by
//! equality only; any other comparison, or a path to a missing field, makes
//! the expression fail for that sample (it does not pass, and the publisher
//! counts it).

use crate::Value;

/// Why a filter expression did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter {text:?}, at byte {at}: {why}")]
pub struct FilterError {
    /// The expression.
    pub text: String,
    /// Where the problem is.
    pub at: usize,
    /// What it is.
    pub why: String,
}

/// A filter, as a subscriber declares it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Filter {
    /// An expression that must be true (see the module documentation).
    pub expr: Option<String>,
    /// Pass when the value changed by at least this much (absolute).
    pub abs_change: Option<f64>,
    /// Pass when the value changed by at least this fraction (0.1 = 10%).
    pub rel_change: Option<f64>,
    /// Pass at most once per this many milliseconds.
    pub min_period_ms: Option<u64>,
}

impl Filter {
    /// The canonical text, the same for the same filter on every node: the
    /// filter's identity on the wire.
    pub fn canonical(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = &self.expr {
            parts.push(format!("expr={e}"));
        }
        if let Some(a) = self.abs_change {
            parts.push(format!("abs_change={a:?}"));
        }
        if let Some(r) = self.rel_change {
            parts.push(format!("rel_change={r:?}"));
        }
        if let Some(m) = self.min_period_ms {
            parts.push(format!("min_period_ms={m}"));
        }
        parts.join(";")
    }

    /// The text a filter's id is computed from: as [`Filter::canonical`],
    /// but each number written as the 16 lower-case hex digits of its
    /// IEEE 754 bits (`abs_change=3ff8000000000000` for 1.5), which every
    /// language can reproduce exactly (docs/protocol.md §4.4).
    pub fn identity_text(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = &self.expr {
            parts.push(format!("expr={e}"));
        }
        if let Some(a) = self.abs_change {
            parts.push(format!("abs_change={:016x}", a.to_bits()));
        }
        if let Some(r) = self.rel_change {
            parts.push(format!("rel_change={:016x}", r.to_bits()));
        }
        if let Some(m) = self.min_period_ms {
            parts.push(format!("min_period_ms={m}"));
        }
        parts.join(";")
    }

    /// A short id of the identity text (FNV-1a 64, 16 hex digits).
    pub fn id(&self) -> String {
        fnv64(self.identity_text().as_bytes())
    }

    /// The id of this filter on the keys `keys` selects: FNV-1a 64 of the
    /// identity text, a newline and the key expression. Subscriptions of
    /// different key expressions with the same filter are distinct filters.
    pub fn id_for(&self, keys: &str) -> String {
        fnv64(format!("{}\n{keys}", self.identity_text()).as_bytes())
    }

    /// Checks the filter: the expression parses, thresholds are finite and
    /// not negative.
    pub fn validate(&self) -> Result<Option<Expr>, FilterError> {
        for (name, v) in [
            ("abs_change", self.abs_change),
            ("rel_change", self.rel_change),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                return Err(FilterError {
                    text: self.canonical(),
                    at: 0,
                    why: format!("{name} must be a finite number, at least 0"),
                });
            }
        }
        self.expr.as_deref().map(Expr::parse).transpose()
    }
}

fn fnv64(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A parsed filter expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A literal.
    Lit(Value),
    /// A path into the value.
    Path(Vec<String>),
    /// Logical not.
    Not(Box<Expr>),
    /// Logical and.
    And(Box<Expr>, Box<Expr>),
    /// Logical or.
    Or(Box<Expr>, Box<Expr>),
    /// A comparison.
    Cmp(Box<Expr>, Op, Box<Expr>),
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

/// Longest expression accepted, in bytes.
pub const MAX_EXPR_BYTES: usize = 1024;
/// Deepest nesting accepted.
const MAX_DEPTH: usize = 32;

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err<T>(&self, why: impl Into<String>) -> Result<T, FilterError> {
        Err(FilterError {
            text: self.text.to_owned(),
            at: self.pos,
            why: why.into(),
        })
    }

    fn skip_ws(&mut self) {
        while self.text[self.pos..].starts_with(char::is_whitespace) {
            self.pos += self.text[self.pos..]
                .chars()
                .next()
                .map_or(1, char::len_utf8);
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.skip_ws();
        if self.text[self.pos..].starts_with(tok) {
            self.pos += tok.len();
            true
        } else {
            false
        }
    }

    fn or(&mut self) -> Result<Expr, FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err("nested too deep");
        }
        let mut e = self.and()?;
        while self.eat("||") {
            e = Expr::Or(Box::new(e), Box::new(self.and()?));
        }
        self.depth -= 1;
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, FilterError> {
        let mut e = self.not()?;
        while self.eat("&&") {
            e = Expr::And(Box::new(e), Box::new(self.not()?));
        }
        Ok(e)
    }

    fn not(&mut self) -> Result<Expr, FilterError> {
        self.skip_ws();
        if self.text[self.pos..].starts_with('!') && !self.text[self.pos..].starts_with("!=") {
            self.pos += 1;
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return self.err("nested too deep");
            }
            let e = Expr::Not(Box::new(self.not()?));
            self.depth -= 1;
            return Ok(e);
        }
        self.cmp()
    }

    fn cmp(&mut self) -> Result<Expr, FilterError> {
        let left = self.operand()?;
        for (tok, op) in [
            ("==", Op::Eq),
            ("!=", Op::Ne),
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("<", Op::Lt),
            (">", Op::Gt),
        ] {
            if self.eat(tok) {
                let right = self.operand()?;
                return Ok(Expr::Cmp(Box::new(left), op, Box::new(right)));
            }
        }
        Ok(left)
    }

    fn operand(&mut self) -> Result<Expr, FilterError> {
        self.skip_ws();
        let rest = &self.text[self.pos..];
        let Some(c) = rest.chars().next() else {
            return self.err("expected a value, a field or '(' and found the end");
        };
        if c == '(' {
            self.pos += 1;
            let e = self.or()?;
            if !self.eat(")") {
                return self.err("expected ')'");
            }
            return Ok(e);
        }
        if c == '"' {
            let mut out = String::new();
            let mut chars = rest[1..].char_indices();
            loop {
                match chars.next() {
                    None => return self.err("unterminated string"),
                    Some((i, '"')) => {
                        self.pos += i + 2;
                        return Ok(Expr::Lit(Value::Text(out)));
                    }
                    Some((_, '\\')) => match chars.next() {
                        Some((_, e @ ('"' | '\\'))) => out.push(e),
                        _ => return self.err("only \\\" and \\\\ may be escaped"),
                    },
                    Some((_, ch)) => out.push(ch),
                }
            }
        }
        if c.is_ascii_digit() || c == '-' || c == '.' {
            let len = rest
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || "+-.".contains(ch)))
                .unwrap_or(rest.len());
            let num = &rest[..len];
            if let Ok(i) = num.parse::<i64>() {
                self.pos += len;
                return Ok(Expr::Lit(Value::Int(i.into())));
            }
            return match num.parse::<f64>() {
                Ok(f) if f.is_finite() => {
                    self.pos += len;
                    Ok(Expr::Lit(Value::Float(f)))
                }
                _ => self.err(format!("{num:?} is not a number")),
            };
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let mut path = Vec::new();
            loop {
                let rest = &self.text[self.pos..];
                let len = rest
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .unwrap_or(rest.len());
                if len == 0 || rest.starts_with(|ch: char| ch.is_ascii_digit()) {
                    return self.err("expected a field name");
                }
                path.push(rest[..len].to_owned());
                self.pos += len;
                if !self.text[self.pos..].starts_with('.') {
                    break;
                }
                self.pos += 1;
            }
            return Ok(match (path.len(), path[0].as_str()) {
                (1, "true") => Expr::Lit(Value::Bool(true)),
                (1, "false") => Expr::Lit(Value::Bool(false)),
                (1, "null") => Expr::Lit(Value::Null),
                _ => Expr::Path(path),
            });
        }
        self.err(format!("unexpected {c:?}"))
    }
}

/// Why an expression could not be evaluated on a sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// The path names no field of the value.
    #[error("no field {0:?} in the value")]
    MissingField(String),
    /// The operands cannot be compared so.
    #[error("cannot compare {0} with {1} that way")]
    Incomparable(&'static str, &'static str),
    /// A value that is not a boolean where one is needed.
    #[error("{0} is not a boolean")]
    NotBool(&'static str),
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Int(_) | Value::Float(_) => "a number",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
        Value::Array(_) | Value::Typed(_) => "an array",
        Value::Map(_) => "a map",
        Value::Tagged(..) => "a tagged value",
    }
}

/// A number as f64, if the value is one.
pub fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

impl Expr {
    /// Parses an expression.
    pub fn parse(text: &str) -> Result<Expr, FilterError> {
        let mut p = Parser {
            text,
            pos: 0,
            depth: 0,
        };
        if text.len() > MAX_EXPR_BYTES {
            return p.err(format!("longer than {MAX_EXPR_BYTES} bytes"));
        }
        let e = p.or()?;
        p.skip_ws();
        if p.pos != text.len() {
            return p.err("unexpected text after the expression");
        }
        Ok(e)
    }

    fn value<'v>(&self, v: &'v Value) -> Result<std::borrow::Cow<'v, Value>, EvalError> {
        use std::borrow::Cow;
        match self {
            Expr::Lit(l) => Ok(Cow::Owned(l.clone())),
            Expr::Path(path) => {
                // `value` is the whole value unless the value is a map with
                // a field of that name: `value > 3`, `value.status == "ON"`.
                let rest = if path[0] == "value" && v.get("value").is_none() {
                    &path[1..]
                } else {
                    &path[..]
                };
                let mut cur = v;
                for p in rest {
                    cur = cur
                        .get(p)
                        .ok_or_else(|| EvalError::MissingField(path.join(".")))?;
                }
                Ok(Cow::Borrowed(cur))
            }
            other => Ok(Cow::Owned(Value::Bool(other.eval(v)?))),
        }
    }

    /// Whether the expression holds for `v`.
    pub fn eval(&self, v: &Value) -> Result<bool, EvalError> {
        Ok(match self {
            Expr::Not(e) => !e.eval(v)?,
            Expr::And(a, b) => a.eval(v)? && b.eval(v)?,
            Expr::Or(a, b) => a.eval(v)? || b.eval(v)?,
            Expr::Cmp(a, op, b) => {
                let (x, y) = (a.value(v)?, b.value(v)?);
                let ord = match (number(&x), number(&y), &*x, &*y) {
                    (Some(p), Some(q), _, _) => p.partial_cmp(&q),
                    (_, _, Value::Text(p), Value::Text(q)) => Some(p.cmp(q)),
                    (_, _, p, q) if matches!(op, Op::Eq | Op::Ne) => {
                        let eq = p == q;
                        return Ok(if *op == Op::Eq { eq } else { !eq });
                    }
                    _ => None,
                };
                let Some(o) = ord else {
                    return Err(EvalError::Incomparable(kind(&x), kind(&y)));
                };
                use std::cmp::Ordering::*;
                match op {
                    Op::Eq => o == Equal,
                    Op::Ne => o != Equal,
                    Op::Lt => o == Less,
                    Op::Le => o != Greater,
                    Op::Gt => o == Greater,
                    Op::Ge => o != Less,
                }
            }
            e @ (Expr::Lit(_) | Expr::Path(_)) => match &*e.value(v)? {
                Value::Bool(b) => *b,
                other => return Err(EvalError::NotBool(kind(other))),
            },
        })
    }
}

/// Whether `new` differs from `old` enough for a change filter: by at least
/// `abs` (absolute) or `rel` (relative to `old`), element-wise for arrays
/// (any element), any change of array length, any change of a value that
/// is not numeric.
pub fn changed(old: &Value, new: &Value, abs: Option<f64>, rel: Option<f64>) -> bool {
    let enough = |a: f64, b: f64| {
        // To or from NaN is a change; NaN to NaN is not.
        if a.is_nan() || b.is_nan() {
            return a.is_nan() != b.is_nan();
        }
        let d = (b - a).abs();
        abs.is_some_and(|t| d >= t) || rel.is_some_and(|t| d >= t * a.abs() && d > 0.0)
    };
    if let (Some(a), Some(b)) = (number(old), number(new)) {
        return enough(a, b);
    }
    let elems = |v: &Value| -> Option<Vec<f64>> {
        match v {
            Value::Typed(t) => (0..t.len()).map(|i| t.get_f64(i)).collect(),
            Value::Array(items) => items.iter().map(number).collect(),
            _ => None,
        }
    };
    match (elems(old), elems(new)) {
        (Some(a), Some(b)) if a.len() != b.len() => true,
        (Some(a), Some(b)) => a.iter().zip(&b).any(|(x, y)| enough(*x, *y)),
        _ => old != new,
    }
}

#[cfg(test)]
mod tests {
    use super::Filter as IdFilter;

    /// Issue 10, finding 16: a filter's id is reproducible from the
    /// protocol document alone (the example of docs/protocol.md §4.4,
    /// computed independently in Python).
    #[test]
    fn filter_ids_follow_the_documented_example() {
        let f = IdFilter {
            abs_change: Some(1.5),
            min_period_ms: Some(100),
            ..IdFilter::default()
        };
        assert_eq!(
            f.identity_text(),
            "abs_change=3ff8000000000000;min_period_ms=100"
        );
        assert_eq!(f.id_for("sr/**"), "aa72652949134c50");
    }

    use super::*;

    fn v(pairs: &[(&str, Value)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn expressions_evaluate() {
        let s = v(&[
            ("value", Value::Float(4.0)),
            ("status", Value::from("ON")),
            ("limits", v(&[("high", Value::Int(10))])),
        ]);
        for (text, want) in [
            (r#"value > 3.5 && status == "ON""#, true),
            (r#"value > 3.5 && status != "ON""#, false),
            ("!(value < 5) || limits.high >= 10", true),
            ("limits.high == 10.0", true),
            ("value <= 4", true),
        ] {
            assert_eq!(Expr::parse(text).unwrap().eval(&s), Ok(want), "{text}");
        }
        // `value` is the whole value when it is not a map.
        assert_eq!(
            Expr::parse("value >= -1e3")
                .unwrap()
                .eval(&Value::Float(0.5)),
            Ok(true)
        );
        assert_eq!(
            Expr::parse("current > 1").unwrap().eval(&s),
            Err(EvalError::MissingField("current".into()))
        );
        assert!(Expr::parse("status > 1").unwrap().eval(&s).is_err());
    }

    #[test]
    fn parse_errors_say_where_and_why() {
        for (text, at) in [
            ("value >", 7),
            ("(value > 1", 10),
            ("value > 1 junk", 10),
            (r#"status == "ON"#, 10),
            ("value > 1..2", 8),
            ("", 0),
        ] {
            let e = Expr::parse(text).unwrap_err();
            assert_eq!(e.at, at, "{text}: {e}");
        }
        let deep = format!("{}1{}", "(".repeat(100), ")".repeat(100));
        assert!(Expr::parse(&deep).unwrap_err().why.contains("deep"));
    }

    #[test]
    fn change_filters_are_element_wise_and_see_length_changes() {
        let f = |x: f64| Value::Float(x);
        assert!(!changed(&f(10.0), &f(10.4), Some(0.5), None));
        assert!(changed(&f(10.0), &f(10.5), Some(0.5), None));
        assert!(changed(&f(10.0), &f(11.0), None, Some(0.1)));
        assert!(!changed(&f(10.0), &f(10.9), None, Some(0.1)));
        let a = Value::from(vec![1.0f64, 2.0, 3.0]);
        assert!(!changed(
            &a,
            &Value::from(vec![1.1f64, 2.0, 3.0]),
            Some(0.5),
            None
        ));
        assert!(changed(
            &a,
            &Value::from(vec![1.0f64, 2.0, 3.6]),
            Some(0.5),
            None
        ));
        assert!(changed(
            &a,
            &Value::from(vec![1.0f64, 2.0]),
            Some(0.5),
            None
        ));
        assert!(changed(
            &Value::from("A"),
            &Value::from("B"),
            Some(1.0),
            None
        ));
    }

    #[test]
    fn filter_ids_follow_the_canonical_text() {
        let a = Filter {
            abs_change: Some(0.5),
            ..Filter::default()
        };
        let mut b = a.clone();
        assert_eq!(a.id(), b.id());
        b.min_period_ms = Some(100);
        assert_ne!(a.id(), b.id());
        assert_ne!(a.id_for("sr/a/**"), a.id_for("sr/b/**"));
        assert!(Filter {
            rel_change: Some(-1.0),
            ..Filter::default()
        }
        .validate()
        .is_err());
    }
}

/// First byte of a filter declaration (after history queries' 2).
pub const DECLARE_TAG: u8 = 0x03;
/// Prefix of the keys filtered samples travel under: `@f/<id>/<key>`.
pub const FILTERED_KEY_PREFIX: &str = "@f/";

/// A subscriber's filter declaration, sent upstream like a history query
/// (docs/protocol.md §4.4).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Declaration {
    /// The publisher node (32 hex digits).
    pub node: String,
    /// Which of its data sockets: `"best_effort"` or `"reliable"`.
    pub socket: String,
    /// The key expression of the subscription.
    pub keys: String,
    /// The filter.
    pub filter: Filter,
}

impl Declaration {
    /// The message: [`DECLARE_TAG`] then a CBOR map.
    pub fn encode(&self) -> Vec<u8> {
        let f = &self.filter;
        let mut pairs = vec![
            (Value::from("node"), Value::from(self.node.as_str())),
            (Value::from("socket"), Value::from(self.socket.as_str())),
            (Value::from("keys"), Value::from(self.keys.as_str())),
        ];
        if let Some(e) = &f.expr {
            pairs.push((Value::from("where"), Value::from(e.as_str())));
        }
        if let Some(a) = f.abs_change {
            pairs.push((Value::from("abs_change"), Value::Float(a)));
        }
        if let Some(r) = f.rel_change {
            pairs.push((Value::from("rel_change"), Value::Float(r)));
        }
        if let Some(m) = f.min_period_ms {
            pairs.push((Value::from("min_period_ms"), Value::from(m)));
        }
        let mut out = vec![DECLARE_TAG];
        let _ = crate::cbor::encode_cbor(&Value::Map(pairs), &mut out);
        out
    }

    /// Reads a declaration; the filter is validated.
    pub fn decode(msg: &[u8]) -> Result<Declaration, FilterError> {
        let bad = |why: &str| FilterError {
            text: String::new(),
            at: 0,
            why: why.to_owned(),
        };
        let Some((&DECLARE_TAG, body)) = msg.split_first() else {
            return Err(bad("not a filter declaration"));
        };
        let v = crate::cbor::decode_cbor(&bytes::Bytes::copy_from_slice(body))
            .map_err(|e| bad(&e.to_string()))?;
        let text = |k: &str| match v.get(k) {
            Some(Value::Text(t)) => Ok(Some(t.clone())),
            None => Ok(None),
            Some(_) => Err(bad(&format!("{k} is not text"))),
        };
        let num = |k: &str| match v.get(k) {
            None => Ok(None),
            Some(x) => number(x)
                .map(Some)
                .ok_or_else(|| bad(&format!("{k} is not a number"))),
        };
        let need = |x: Option<String>, k: &str| x.ok_or_else(|| bad(&format!("no {k}")));
        let d = Declaration {
            node: need(text("node")?, "node")?,
            socket: need(text("socket")?, "socket")?,
            keys: need(text("keys")?, "keys")?,
            filter: Filter {
                expr: text("where")?,
                abs_change: num("abs_change")?,
                rel_change: num("rel_change")?,
                min_period_ms: match v.get("min_period_ms") {
                    None => None,
                    Some(Value::Int(i)) => {
                        Some(u64::try_from(*i).map_err(|_| bad("min_period_ms"))?)
                    }
                    Some(_) => return Err(bad("min_period_ms is not an integer")),
                },
            },
        };
        d.filter.validate()?;
        Ok(d)
    }
}

#[cfg(test)]
mod declaration_tests {
    use super::*;

    #[test]
    fn declarations_round_trip_and_bad_ones_are_refused() {
        let d = Declaration {
            node: "ab".repeat(16),
            socket: "reliable".into(),
            keys: "sr/**".into(),
            filter: Filter {
                expr: Some("value > 1".into()),
                abs_change: Some(0.5),
                rel_change: None,
                min_period_ms: Some(100),
            },
        };
        assert_eq!(Declaration::decode(&d.encode()).unwrap(), d);
        let mut bad = d.clone();
        bad.filter.expr = Some("value >".into());
        assert!(Declaration::decode(&bad.encode()).is_err());
        assert!(Declaration::decode(b"\x03\x01").is_err());
    }
}
