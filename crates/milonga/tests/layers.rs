//! The engine's layers (docs/internals.md) hold: ZeroMQ is named only in
//! the peer-to-peer backend, the lower layers import nothing from the
//! higher ones, and `unsafe` is allowed only in the two FFI modules. A
//! change that breaks one fails here, not in a review.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every source file of the crate, by path relative to `src/`.
fn files() -> Vec<(String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    sources(&src, &mut paths);
    paths.sort();
    assert!(paths.len() > 20, "found the sources");
    paths
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

#[test]
fn zeromq_is_named_only_in_the_peer_to_peer_backend() {
    let outside: Vec<String> = files()
        .into_iter()
        .filter(|(path, text)| !path.starts_with("backend/p2p/") && text.contains("zmq"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        outside.is_empty(),
        "zmq named outside backend/p2p: {outside:?}"
    );
}

#[test]
fn lower_layers_import_nothing_from_higher_ones() {
    // Layer -> the modules it may not use.
    let rules: [(&str, &[&str]); 6] = [
        (
            "util/",
            &["model", "engine", "discovery", "session", "backend", "api"],
        ),
        (
            "model/",
            &["engine", "discovery", "session", "backend", "api"],
        ),
        ("engine/", &["discovery", "session", "backend", "api"]),
        ("discovery/", &["engine", "session", "backend", "api"]),
        // The backend reaches the node through traits it defines
        // (control::Host, sub_link::ConnectionWatcher).
        ("backend/", &["session", "api"]),
        // The session reaches subscriptions through session::RouteTarget.
        ("session/", &["api"]),
    ];
    let mut broken = Vec::new();
    for (path, text) in files() {
        for (layer, banned) in rules {
            if !path.starts_with(layer) {
                continue;
            }
            for m in banned {
                if text.contains(&format!("crate::{m}::")) {
                    broken.push(format!("{path} uses crate::{m}"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn unsafe_is_allowed_only_in_the_ffi_modules() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    assert!(lib.contains("#![deny(unsafe_code)]"));
    let mut allowed: Vec<String> = Vec::new();
    for (path, text) in files() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains("#[allow(unsafe_code)]") {
                let next = lines.get(i + 1).copied().unwrap_or_default().trim();
                allowed.push(format!("{path}: {next}"));
            }
        }
    }
    allowed.sort();
    assert_eq!(
        allowed,
        [
            "backend/p2p/mod.rs: pub(crate) mod zmq_io;",
            "util/mod.rs: pub(crate) mod sys;",
        ]
    );
}
