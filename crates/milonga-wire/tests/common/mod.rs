//! Helpers the golden-vector checks share.

use std::collections::BTreeSet;
use std::path::Path;

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of hex text `s` (panics on anything else: vectors are ours).
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The start of every vector check: with `MILONGA_BLESS_VECTORS` set,
/// `bless` rewrites the files in `dir` and the check fails on purpose (the
/// files were just written from the code under test: checking them now
/// would compare the code with itself). Otherwise the names `made` by the
/// cases must be exactly the `listed` ones, each listed once; they are
/// returned, for the check to compare with what it finds on disk.
pub fn listed_or_bless<'a>(
    dir: &Path,
    listed: &[&'a str],
    made: BTreeSet<&'a str>,
    bless: impl FnOnce(),
) -> BTreeSet<&'a str> {
    if std::env::var_os("MILONGA_BLESS_VECTORS").is_some() {
        bless();
        panic!(
            "vectors rewritten in {}; review the diff and run again without MILONGA_BLESS_VECTORS",
            dir.display()
        );
    }
    let expected: BTreeSet<&str> = listed.iter().copied().collect();
    assert_eq!(expected.len(), listed.len(), "a vector listed twice");
    assert_eq!(made, expected, "cases() makes exactly the listed vectors");
    expected
}
