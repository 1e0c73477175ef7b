//! Keys and key expressions.
//!
//! A *key* names what a publisher puts: `/`-separated chunks of UTF-8, such as
//! `sr/ps/1/current`. A *key expression* selects keys for a subscription: a
//! chunk `*` matches exactly one chunk, a chunk `**` matches zero or more.
//!
//! Rules (normative, see docs/protocol.md §Keys):
//! - 1 to [`MAX_KEY_BYTES`] bytes of UTF-8;
//! - no empty chunk (so no leading, trailing or doubled `/`);
//! - no NUL byte (the wire terminates keys with NUL);
//! - a published key has no `*` at all; in an expression `*` may only form a
//!   whole chunk `*` or `**` (`a*` is refused rather than guessed at);
//! - a key or expression may not begin with `@`: such keys are Milonga's own
//!   (heartbeats, `@hb`), made with [`Key::internal`].

use std::fmt;

/// The longest key or key expression, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 512;

/// Why a key or key expression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is the empty string.
    #[error("key is empty")]
    Empty,
    /// The key is longer than [`MAX_KEY_BYTES`].
    #[error("key is {len} bytes long, the limit is {MAX_KEY_BYTES}")]
    TooLong {
        /// Length of the refused key in bytes.
        len: usize,
    },
    /// The key bytes are not valid UTF-8.
    #[error("key is not valid UTF-8 (invalid byte at offset {offset})")]
    BadUtf8 {
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// A chunk between two `/` (or at either end) is empty.
    #[error("key {key:?} has an empty chunk (leading, trailing or doubled '/')")]
    EmptyChunk {
        /// The refused key.
        key: String,
    },
    /// The key contains a NUL character, reserved as the wire terminator.
    #[error("key {key:?} contains a NUL character")]
    Nul {
        /// The refused key.
        key: String,
    },
    /// The key contains a control character (U+0001 to U+001F, U+007F to
    /// U+009F): keys reach operators' terminals, where such characters
    /// are commands.
    #[error("key {key:?} contains a control character")]
    Control {
        /// The refused key.
        key: String,
    },
    /// A published key contains a wildcard.
    #[error("key {key:?} contains the wildcard '*': published keys must be concrete")]
    Wildcard {
        /// The refused key.
        key: String,
    },
    /// The key begins with `@`, which Milonga reserves for its own keys.
    #[error("key {key:?} begins with '@', which is reserved for Milonga's own keys")]
    Reserved {
        /// The refused key.
        key: String,
    },
    /// A chunk mixes `*` with other characters (`a*`, `***`).
    #[error("key expression {expr:?}: chunk {chunk:?} mixes '*' with other characters; use '*' or '**' as a whole chunk")]
    PartialWildcard {
        /// The refused expression.
        expr: String,
        /// The offending chunk.
        chunk: String,
    },
}

fn check_common(s: &str) -> Result<(), KeyError> {
    if s.is_empty() {
        return Err(KeyError::Empty);
    }
    if s.len() > MAX_KEY_BYTES {
        return Err(KeyError::TooLong { len: s.len() });
    }
    if s.contains('\0') {
        return Err(KeyError::Nul { key: s.to_owned() });
    }
    if s.chars().any(char::is_control) {
        return Err(KeyError::Control { key: s.to_owned() });
    }
    if s.split('/').any(str::is_empty) {
        return Err(KeyError::EmptyChunk { key: s.to_owned() });
    }
    Ok(())
}

fn utf8(bytes: &[u8]) -> Result<&str, KeyError> {
    std::str::from_utf8(bytes).map_err(|e| KeyError::BadUtf8 {
        offset: e.valid_up_to(),
    })
}

/// A validated, concrete key (no wildcards).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

impl Key {
    /// Validates `s` as a published key.
    pub fn new(s: impl Into<String>) -> Result<Self, KeyError> {
        let s = s.into();
        check_common(&s)?;
        if s.contains('*') {
            return Err(KeyError::Wildcard { key: s });
        }
        if s.starts_with('@') {
            return Err(KeyError::Reserved { key: s });
        }
        Ok(Key(s))
    }

    /// One of Milonga's own keys (beginning with `@`, such as the heartbeat
    /// key `@hb`): the rules of [`Key::new`] except the reservation.
    pub fn internal(s: impl Into<String>) -> Result<Self, KeyError> {
        let s = s.into();
        check_common(&s)?;
        if s.contains('*') {
            return Err(KeyError::Wildcard { key: s });
        }
        Ok(Key(s))
    }

    /// Validates raw bytes (as read off the wire) as a key.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        Key::new(utf8(bytes)?)
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Key::new(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Chunk {
    Literal(String),
    /// `*`: exactly one chunk.
    One,
    /// `**`: zero or more chunks.
    Any,
}

/// A validated key expression with `*` and `**` wildcards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyExpr {
    text: String,
    chunks: Vec<Chunk>,
    literal: bool,
}

impl KeyExpr {
    /// Validates `s` as a key expression. Consecutive `**` chunks are
    /// equivalent to one and are merged.
    pub fn new(s: impl Into<String>) -> Result<Self, KeyError> {
        let text = s.into();
        check_common(&text)?;
        if text.starts_with('@') {
            return Err(KeyError::Reserved { key: text });
        }
        let mut chunks = Vec::new();
        for c in text.split('/') {
            let chunk = match c {
                "*" => Chunk::One,
                "**" => Chunk::Any,
                c if c.contains('*') => {
                    return Err(KeyError::PartialWildcard {
                        expr: text.clone(),
                        chunk: c.to_owned(),
                    })
                }
                c => Chunk::Literal(c.to_owned()),
            };
            if chunk == Chunk::Any && chunks.last() == Some(&Chunk::Any) {
                continue;
            }
            chunks.push(chunk);
        }
        let literal = chunks.iter().all(|c| matches!(c, Chunk::Literal(_)));
        Ok(KeyExpr {
            text,
            chunks,
            literal,
        })
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the expression has no wildcard (it names one key).
    pub fn is_literal(&self) -> bool {
        self.literal
    }

    /// Whether `key` is selected by this expression.
    pub fn matches(&self, key: &str) -> bool {
        if self.literal {
            return key == self.text;
        }
        let key: Vec<&str> = key.split('/').collect();
        // dp[j]: the first i expression chunks match the first j key chunks.
        let mut dp = vec![false; key.len() + 1];
        dp[0] = true;
        for chunk in &self.chunks {
            let mut next = vec![false; key.len() + 1];
            match chunk {
                Chunk::Any => {
                    let mut reach = false;
                    for j in 0..=key.len() {
                        reach |= dp[j];
                        next[j] = reach;
                    }
                }
                Chunk::One => next[1..].copy_from_slice(&dp[..key.len()]),
                Chunk::Literal(l) => {
                    for j in 1..=key.len() {
                        next[j] = dp[j - 1] && key[j - 1] == l;
                    }
                }
            }
            dp = next;
        }
        dp[key.len()]
    }

    /// The subscription prefixes (docs/protocol.md §4) that let through
    /// every frame this expression can match, and as few others as prefix
    /// filtering allows.
    ///
    /// Data frames start with the key followed by NUL, so a literal
    /// expression `a/b` subscribes to `a/b\0` and can never receive `a/bc`.
    /// For a wildcard expression the prefix is the literal chunks before the
    /// first wildcard; the subscriber still checks [`KeyExpr::matches`] on
    /// every frame.
    pub fn subscription_prefixes(&self) -> Vec<Vec<u8>> {
        let lead: Vec<&str> = self
            .chunks
            .iter()
            .map_while(|c| match c {
                Chunk::Literal(l) => Some(l.as_str()),
                _ => None,
            })
            .collect();
        if lead.is_empty() {
            return vec![Vec::new()];
        }
        let joined = lead.join("/");
        if lead.len() == self.chunks.len() {
            let mut p = joined.into_bytes();
            p.push(0);
            return vec![p];
        }
        let mut prefixes = vec![format!("{joined}/").into_bytes()];
        if self.chunks[lead.len()..].iter().all(|c| *c == Chunk::Any) {
            // `a/**` also matches `a` itself.
            let mut exact = joined.into_bytes();
            exact.push(0);
            prefixes.push(exact);
        }
        prefixes
    }
}

impl fmt::Display for KeyExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for KeyExpr {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        KeyExpr::new(s)
    }
}

impl From<Key> for KeyExpr {
    fn from(k: Key) -> Self {
        KeyExpr::new(k.0).expect("a valid key is a valid key expression")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_validation_errors() {
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert!(matches!(Key::new("a//b"), Err(KeyError::EmptyChunk { .. })));
        assert!(matches!(Key::new("/a"), Err(KeyError::EmptyChunk { .. })));
        assert!(matches!(Key::new("a/"), Err(KeyError::EmptyChunk { .. })));
        assert!(matches!(Key::new("a/*"), Err(KeyError::Wildcard { .. })));
        assert!(matches!(Key::new("a/b*"), Err(KeyError::Wildcard { .. })));
        assert!(matches!(Key::new("a\0b"), Err(KeyError::Nul { .. })));
        // Control characters (an escape sequence for the terminal that
        // prints the key), C0, DEL and C1; printable Unicode is fine.
        for bad in ["sr/\u{1b}[2J", "a\tb", "a\u{7f}", "a/\u{85}", "a\nb"] {
            assert!(
                matches!(Key::new(bad), Err(KeyError::Control { .. })),
                "{bad:?}"
            );
            assert!(
                matches!(KeyExpr::new(bad), Err(KeyError::Control { .. })),
                "{bad:?}"
            );
            let mut f = crate::frame::encode(
                &Key::new("x").unwrap(),
                &crate::frame::Header {
                    kind: crate::frame::Kind::Sample,
                    flags: 0,
                    encoding: crate::Encoding::Raw,
                    domain_tag: 1,
                    schema_id: 0,
                    node_id: crate::NodeId([0; 16]),
                    seq: 1,
                    timestamp_ns: 1,
                },
                b"v",
            );
            f.splice(0..1, bad.bytes());
            assert!(crate::frame::decode(&f).is_err(), "{bad:?} on the wire");
        }
        assert!(Key::new("sr/µA/température").is_ok());
        assert!(matches!(Key::new("@hb"), Err(KeyError::Reserved { .. })));
        assert!(Key::new("a/@b").is_ok(), "only a leading '@' is reserved");
        assert_eq!(Key::internal("@hb").unwrap().as_str(), "@hb");
        assert!(matches!(
            Key::internal("@h/*"),
            Err(KeyError::Wildcard { .. })
        ));
        assert!(matches!(
            Key::new("x".repeat(MAX_KEY_BYTES + 1)),
            Err(KeyError::TooLong { len: 513 })
        ));
        assert!(Key::new("x".repeat(MAX_KEY_BYTES)).is_ok());
        assert_eq!(
            Key::from_bytes(b"ab\xffc"),
            Err(KeyError::BadUtf8 { offset: 2 })
        );
        assert_eq!(
            Key::new("sr/ps/1/current").unwrap().as_str(),
            "sr/ps/1/current"
        );
        assert!(Key::new("µ/température").is_ok());
    }

    #[test]
    fn expr_validation_errors() {
        assert!(matches!(
            KeyExpr::new("@hb"),
            Err(KeyError::Reserved { .. })
        ));
        assert!(matches!(
            KeyExpr::new("a/b*"),
            Err(KeyError::PartialWildcard { .. })
        ));
        assert!(matches!(
            KeyExpr::new("a/***"),
            Err(KeyError::PartialWildcard { .. })
        ));
        assert!(matches!(
            KeyExpr::new("a//*"),
            Err(KeyError::EmptyChunk { .. })
        ));
        assert!(KeyExpr::new("**").is_ok());
        assert!(KeyExpr::new("a/b").unwrap().is_literal());
        assert!(!KeyExpr::new("a/*").unwrap().is_literal());
    }

    #[test]
    fn matching_table() {
        let table: &[(&str, &str, bool)] = &[
            ("a", "a", true),
            ("a", "b", false),
            ("a/b", "a/b", true),
            ("a/b", "a/bc", false),
            ("a/b", "a/b/c", false),
            ("a/*", "a/b", true),
            ("a/*", "a", false),
            ("a/*", "a/b/c", false),
            ("a/*/c", "a/b/c", true),
            ("a/*/c", "a/c", false),
            ("a/*/c", "a/b/d/c", false),
            ("a/**", "a", true),
            ("a/**", "a/b", true),
            ("a/**", "a/b/c/d", true),
            ("a/**", "ab", false),
            ("a/**", "b/a", false),
            ("**/b", "b", true),
            ("**/b", "a/b", true),
            ("**/b", "x/y/b", true),
            ("**/b", "a/bc", false),
            ("**/b", "b/a", false),
            ("**", "anything/at/all", true),
            ("*", "a", true),
            ("*", "a/b", false),
            ("a/**/c", "a/c", true),
            ("a/**/c", "a/b/c", true),
            ("a/**/c", "a/b/x/c", true),
            ("a/**/c", "a/b/x/d", false),
            ("a/**/**/c", "a/c", true),
            ("*/**/*", "a", false),
            ("*/**/*", "a/b", true),
            ("**/*/**", "a", true),
            ("sr/*/1/**", "sr/ps/1/current/change", true),
            ("sr/*/1/**", "sr/ps/2/current", false),
        ];
        for (expr, key, want) in table {
            let e = KeyExpr::new(*expr).unwrap();
            assert_eq!(e.matches(key), *want, "{expr} vs {key}");
        }
    }

    #[test]
    fn subscription_prefixes_never_let_a_longer_sibling_through() {
        assert_eq!(
            KeyExpr::new("a/b").unwrap().subscription_prefixes(),
            vec![b"a/b\0".to_vec()]
        );
        // What the prefixes computed above do with the frame of a longer
        // sibling (or a child) of what the expression selects: ZeroMQ's
        // prefix filter must drop it at the publisher.
        for (expr, key) in [
            ("a/b", "a/bc"),
            ("a/b", "a/b/c"),
            ("a/**", "ab"),
            ("a/**", "ab/c"),
            ("a/*/c", "ab/x/c"),
        ] {
            let mut frame = key.as_bytes().to_vec();
            frame.push(0);
            assert!(
                !KeyExpr::new(expr)
                    .unwrap()
                    .subscription_prefixes()
                    .iter()
                    .any(|p| frame.starts_with(p)),
                "the prefixes of {expr} let {key} through"
            );
        }
        assert_eq!(
            KeyExpr::new("a/*/c").unwrap().subscription_prefixes(),
            vec![b"a/".to_vec()]
        );
        assert_eq!(
            KeyExpr::new("a/**").unwrap().subscription_prefixes(),
            vec![b"a/".to_vec(), b"a\0".to_vec()]
        );
        assert_eq!(
            KeyExpr::new("**/b").unwrap().subscription_prefixes(),
            vec![Vec::<u8>::new()]
        );
        assert_eq!(
            KeyExpr::new("a/**/c").unwrap().subscription_prefixes(),
            vec![b"a/".to_vec()]
        );
    }

    #[test]
    fn prefixes_cover_every_matching_key() {
        let keys = ["a", "a/b", "a/b/c", "a/c", "ab", "x/a/b", "a/bc"];
        for expr in ["a/**", "a/*", "a/b", "a/**/c", "**/b", "*/b"] {
            let e = KeyExpr::new(expr).unwrap();
            for k in keys {
                if e.matches(k) {
                    let mut frame = k.as_bytes().to_vec();
                    frame.push(0);
                    assert!(
                        e.subscription_prefixes()
                            .iter()
                            .any(|p| frame.starts_with(p)),
                        "{expr} matches {k} but no prefix lets it through"
                    );
                }
            }
        }
    }
}
