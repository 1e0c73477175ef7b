//! Access control per key expression (docs/security.md): a rules file
//! that says which identities may do what on which keys. With a rules file
//! present everything not allowed is denied; without one every trusted
//! identity may do everything.
//!
//! ```text
//! # allow WHO OPERATIONS KEY-EXPRESSION...
//! allow console    subscribe,history,call   sr/**
//! allow ps-server  put,serve                sr/ps/**
//! allow *          subscribe                public/**
//! ```
//!
//! `WHO` is a key's name (its `.pub` file in the trust directory), a key
//! in Z85, or `*` (every trusted key). `OPERATIONS` is a comma-separated
//! list of `put`, `subscribe`, `serve`, `call`, `history`, or `all`.

use std::path::{Path, PathBuf};

use milonga_wire::KeyExpr;

use crate::model::error::SecurityError;

/// What an identity may be allowed to do on a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Publish samples of the key (checked by the subscribers).
    Put,
    /// Receive the key's samples (checked by the publisher).
    Subscribe,
    /// Serve the key (checked by the callers).
    Serve,
    /// Call the key (checked by the server).
    Call,
    /// Ask for the key's history (checked by the publisher).
    History,
}

impl Operation {
    const ALL: [Operation; 5] = [
        Operation::Put,
        Operation::Subscribe,
        Operation::Serve,
        Operation::Call,
        Operation::History,
    ];

    /// Its name in a rules file.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Put => "put",
            Operation::Subscribe => "subscribe",
            Operation::Serve => "serve",
            Operation::Call => "call",
            Operation::History => "history",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// Who a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Who {
    Any,
    /// A name or a Z85 key: compared with both.
    Named(String),
}

#[derive(Debug, Clone)]
struct Rule {
    line: usize,
    who: Who,
    ops: u8,
    exprs: Vec<KeyExpr>,
}

/// A rules file, parsed.
#[derive(Debug, Clone)]
pub struct Acl {
    path: PathBuf,
    rules: Vec<Rule>,
}

/// Largest rules file read.
const MAX_ACL_BYTES: u64 = 1 << 20;

/// Who asks: the name its key goes by in the trust directory and the key
/// (Z85).
#[derive(Debug, Clone, Copy)]
pub struct Asker<'a> {
    /// The `.pub` file's name.
    pub name: &'a str,
    /// The key in Z85.
    pub key: &'a str,
}

impl Acl {
    /// Reads and parses `path`; an error names the line.
    pub fn load(path: &Path) -> Result<Acl, SecurityError> {
        let meta = std::fs::metadata(path).map_err(|source| SecurityError::Io {
            path: path.into(),
            source,
        })?;
        if !meta.is_file() || meta.len() > MAX_ACL_BYTES {
            return Err(SecurityError::Malformed {
                path: path.into(),
                why: format!("not a regular file of at most {MAX_ACL_BYTES} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| SecurityError::Io {
            path: path.into(),
            source,
        })?;
        Acl::parse(&text, path)
    }

    /// Parses the text of a rules file read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Acl, SecurityError> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            // A comment starts a line or follows a space: `#` is also one of
            // Z85's characters, so a key may hold one.
            let line = match line.trim_start().starts_with('#') {
                true => "",
                false => line.split(" #").next().unwrap_or_default().trim(),
            };
            if line.is_empty() {
                continue;
            }
            let bad = |why: String| SecurityError::Malformed {
                path: path.into(),
                why: format!("line {n}: {why}"),
            };
            let mut words = line.split_whitespace();
            match words.next() {
                Some("allow") => {}
                Some(other) => {
                    return Err(bad(format!(
                        "a rule starts with \"allow\", not {other:?} (everything not allowed is denied)"
                    )))
                }
                None => continue,
            }
            let who = match words.next() {
                Some("*") => Who::Any,
                Some(w) => Who::Named(w.to_owned()),
                None => return Err(bad("no identity (a key's name, a Z85 key, or *)".into())),
            };
            let ops_text = words.next().ok_or_else(|| {
                bad("no operations (put, subscribe, serve, call, history, all)".into())
            })?;
            let mut ops = 0u8;
            for op in ops_text.split(',') {
                ops |= match op {
                    "all" => Operation::ALL.iter().fold(0, |m, o| m | o.bit()),
                    _ => Operation::ALL
                        .iter()
                        .find(|o| o.as_str() == op)
                        .map(|o| o.bit())
                        .ok_or_else(|| {
                            bad(format!(
                                "unknown operation {op:?}: put, subscribe, serve, call, history or all"
                            ))
                        })?,
                };
            }
            let exprs = words
                .map(|e| KeyExpr::new(e).map_err(|err| bad(format!("{e:?}: {err}"))))
                .collect::<Result<Vec<_>, _>>()?;
            if exprs.is_empty() {
                return Err(bad("no key expression".into()));
            }
            rules.push(Rule {
                line: n,
                who,
                ops,
                exprs,
            });
        }
        Ok(Acl {
            path: path.into(),
            rules,
        })
    }

    /// The file the rules came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rules_for<'a>(
        &'a self,
        asker: Asker<'a>,
        op: Operation,
    ) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules.iter().filter(move |r| {
            r.ops & op.bit() != 0
                && match &r.who {
                    Who::Any => true,
                    Who::Named(w) => w == asker.name || w == asker.key,
                }
        })
    }

    /// Whether `asker` may do `op` on `key`: `Ok(line)` of the first rule
    /// allowing it, or `Err` saying that none does.
    pub fn check(&self, asker: Asker<'_>, op: Operation, key: &str) -> Result<usize, String> {
        self.rules_for(asker, op)
            .find(|r| r.exprs.iter().any(|e| e.matches(key)))
            .map(|r| r.line)
            .ok_or_else(|| self.denied(asker, op, key))
    }

    /// Whether some rule lets `asker` subscribe to something: the line of
    /// the first, or why none does.
    pub fn may_subscribe(&self, asker: Asker<'_>) -> Result<usize, String> {
        self.rules_for(asker, Operation::Subscribe)
            .next()
            .map(|r| r.line)
            .ok_or_else(|| {
                format!(
                    "no rule of {} allows {} to subscribe to anything",
                    self.path.display(),
                    asker.name
                )
            })
    }

    /// The lines of the rules that let someone subscribe to `key`: keys
    /// with the same lines have the same allowed subscribers, so they can
    /// share a data socket whose connections are judged once, at the
    /// handshake (docs/security.md).
    pub fn subscribe_class(&self, key: &str) -> Vec<usize> {
        self.rules
            .iter()
            .filter(|r| {
                r.ops & Operation::Subscribe.bit() != 0 && r.exprs.iter().any(|e| e.matches(key))
            })
            .map(|r| r.line)
            .collect()
    }

    fn denied(&self, asker: Asker<'_>, op: Operation, what: &str) -> String {
        format!(
            "no rule of {} allows {} {} on {what}",
            self.path.display(),
            asker.name,
            op.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "# a comment\n\
        allow console   subscribe,history,call  sr/**\n\
        allow ps-server put,serve               sr/ps/** lab/x\n\
        allow *         subscribe               public/**   # anyone\n";

    fn acl() -> Acl {
        Acl::parse(RULES, Path::new("acl.rules")).unwrap()
    }

    const CONSOLE: Asker<'static> = Asker {
        name: "console",
        key: "k1",
    };
    const PS: Asker<'static> = Asker {
        name: "ps-server",
        key: "k2",
    };

    #[test]
    fn each_operation_is_allowed_by_its_rule_and_denied_otherwise() {
        let a = acl();
        assert_eq!(a.check(CONSOLE, Operation::Subscribe, "sr/ps/1"), Ok(2));
        assert_eq!(a.check(CONSOLE, Operation::Call, "sr/ps/1/set"), Ok(2));
        assert_eq!(a.check(PS, Operation::Put, "lab/x"), Ok(3));
        assert_eq!(a.check(PS, Operation::Subscribe, "public/news"), Ok(4));
        let e = a.check(CONSOLE, Operation::Put, "sr/ps/1").unwrap_err();
        assert!(
            e.contains("no rule of acl.rules allows console put on sr/ps/1"),
            "{e}"
        );
        assert!(a.check(PS, Operation::Subscribe, "sr/ps/1").is_err());
        // A key's Z85 form names it as well as its name.
        let by_key = Acl::parse("allow k2 call a/b", Path::new("r")).unwrap();
        assert!(by_key.check(PS, Operation::Call, "a/b").is_ok());
        // A key may hold '#', one of Z85's characters; a comment follows a space.
        let hashed = Asker {
            name: "x",
            key: "ab#cd",
        };
        let by_hash = Acl::parse("allow ab#cd call a/b  # a comment", Path::new("r")).unwrap();
        assert!(by_hash.check(hashed, Operation::Call, "a/b").is_ok());
        // Someone with no subscribe rule may subscribe to nothing at all.
        assert_eq!(a.may_subscribe(PS), Ok(4), "the rule for everyone");
        let none = Acl::parse("allow console call a/b", Path::new("r")).unwrap();
        assert!(none.may_subscribe(CONSOLE).is_err());
    }

    #[test]
    fn keys_covered_by_the_same_subscribe_rules_are_of_one_class() {
        let a = acl();
        assert_eq!(a.subscribe_class("sr/ps/1"), vec![2]);
        assert_eq!(a.subscribe_class("sr/rf/1"), vec![2]);
        assert_eq!(a.subscribe_class("public/news"), vec![4]);
        // `put` and `serve` rules do not count: nobody may subscribe.
        assert_eq!(a.subscribe_class("lab/x"), Vec::<usize>::new());
        let b = Acl::parse(
            "allow a subscribe x/**\nallow b subscribe x/1 y/*\n",
            Path::new("r"),
        )
        .unwrap();
        assert_eq!(b.subscribe_class("x/1"), vec![1, 2]);
        assert_eq!(b.subscribe_class("x/2"), vec![1]);
        assert_eq!(b.subscribe_class("y/2"), vec![2]);
    }

    #[test]
    fn a_bad_rules_file_names_its_line() {
        for (text, says) in [
            ("deny * all **", "line 1: a rule starts with \"allow\""),
            ("allow console", "line 1: no operations"),
            (
                "\nallow console fly sr/**",
                "line 2: unknown operation \"fly\"",
            ),
            ("allow console put", "line 1: no key expression"),
            ("allow console put sr//x", "line 1: \"sr//x\""),
        ] {
            let e = Acl::parse(text, Path::new("r")).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
