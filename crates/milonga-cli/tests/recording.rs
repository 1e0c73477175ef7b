//! Recordings (docs/recording.md) with real processes: `milonga record`
//! while publishers run, `info` and `cat` reading the file, `replay` into
//! a subscriber, a recorder killed with -9 and its file recovered, and
//! files split by size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use milonga_testkit::{wait_for, Proc};
use serde_json::Value as Json;

mod common;
use common::Env;

const T: Duration = Duration::from_secs(30);

fn info(env: &Env, file: &Path) -> Json {
    let out = env.cmd(&["info", "--json"]).arg(file).output().unwrap();
    assert!(out.status.success(), "info: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `record --recover FILE -o clean.mcap` (in the test's directory), which
/// must succeed: the copy's path and the command's output.
fn recover(env: &Env, file: &Path) -> (PathBuf, std::process::Output) {
    let clean = env.dir.path().join("clean.mcap");
    let out = env
        .cmd(&["record", "--recover"])
        .arg(file)
        .arg("-o")
        .arg(&clean)
        .output()
        .unwrap();
    assert!(out.status.success(), "recover: {out:?}");
    (clean, out)
}

/// The samples of `cat --json`, as (key, seq, value).
fn cat(env: &Env, file: &Path) -> Vec<(String, u64, Json)> {
    cat_all(env, file)
        .into_iter()
        .map(|j| {
            (
                j["key"].as_str().unwrap().to_owned(),
                j["seq"].as_u64().unwrap(),
                j["value"].clone(),
            )
        })
        .collect()
}

/// The samples of `cat --json`, whole.
fn cat_all(env: &Env, file: &Path) -> Vec<Json> {
    cat_lines(env, file)
        .into_iter()
        .filter(|j| j.get("event").is_none())
        .collect()
}

/// Every line of `cat --json`: samples and events.
fn cat_lines(env: &Env, file: &Path) -> Vec<Json> {
    let out = env.cmd(&["cat", "--json"]).arg(file).output().unwrap();
    assert!(out.status.success(), "cat: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .collect()
}

/// A sample of `key` as a recording's test holds it: value `seq`, source
/// timestamp `base + seq` ms.
fn float_sample(key: &str, seq: u64, base_ns: u64) -> milonga::Sample {
    milonga::Sample {
        key: key.into(),
        value: milonga::Value::Float(seq as f64),
        publisher: milonga::NodeId([7; 16]),
        seq,
        timestamp_ns: base_ns + seq * 1_000_000,
        encoding: milonga::Encoding::Cbor,
        schema_id: 0,
        replayed: false,
        compact: None,
    }
}

#[test]
fn a_recording_holds_every_sample_once_and_replays_into_a_subscriber() {
    let env = Env::new("rec-replay");
    let file = env.dir.path().join("run.mcap");
    let pa = env.spawn(&["pub", "rr/a", "{\"v\": [1.5, 2]}", "--rate", "200"]);
    let pb = env.spawn(&["pub", "rr/b", "\"text\"", "--rate", "50"]);
    // Two expressions that overlap (rr/a matches both): the recorder
    // merges two subscriptions (one is read directly; the other tests do
    // that), and records each sample and each publisher's liveliness once.
    let mut rec = env.cmd(&["record", "rr/a", "rr/*", "--duration", "2", "-o"]);
    rec.arg(&file);
    let out = rec.output().unwrap();
    assert!(out.status.success(), "record: {out:?}");
    let i = info(&env, &file);
    assert_eq!(i["complete"], true, "{i}");
    assert_eq!(i["gaps"], 0, "{i}");
    assert_eq!(i["lost_reported"], 0, "{i}");
    let a = i["keys"]["rr/a"]["samples"].as_u64().unwrap();
    let b = i["keys"]["rr/b"]["samples"].as_u64().unwrap();
    // Two seconds at 200/s and 50/s, joined late and left early.
    assert!(a > 150 && b > 40, "{i}");
    let samples = cat(&env, &file);
    assert_eq!(samples.len() as u64, a + b);
    // Every sequence number once, in order, per key.
    for key in ["rr/a", "rr/b"] {
        let seqs: Vec<u64> = samples.iter().filter(|s| s.0 == key).map(|s| s.1).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{key}: {seqs:?}");
    }
    assert!(samples
        .iter()
        .any(|s| s.0 == "rr/a" && s.2 == serde_json::json!({"v": [1.5, 2]})));
    let alive: Vec<Json> = cat_lines(&env, &file)
        .into_iter()
        .filter(|j| j["event"] == "publisher_alive")
        .map(|j| j["publisher"].clone())
        .collect();
    assert_eq!(alive.len(), 2, "each publisher told alive once: {alive:?}");
    // The live publishers go; the replay, as fast as a reliable
    // subscriber takes it, gives the same samples in the same order, with
    // their original timestamps and the replayed flag.
    drop((pa, pb));
    let replay_into = |extra: &[&str], n: usize| -> Vec<Json> {
        let sub = Proc::spawn(env.cmd(&[
            "sub",
            "rr/**",
            "--json",
            "--reliable",
            "--count",
            &n.to_string(),
            "--timeout",
            "20",
        ]));
        let mut replay = env.cmd(&["replay", "--speed", "max", "--wait-subscribers", "1"]);
        replay.args(extra).arg(&file);
        let out = replay.output().unwrap();
        assert!(out.status.success(), "replay: {out:?}");
        let mut got = Vec::new();
        while got.len() < n {
            let Some(line) = sub.line(T) else { break };
            let j: Json = serde_json::from_str(&line).unwrap();
            if j.get("event").is_none() {
                got.push(j);
            }
        }
        got
    };
    let recorded = cat_all(&env, &file);
    let got = replay_into(&[], recorded.len());
    let fields = |j: &Json| {
        (
            j["key"].clone(),
            j["value"].clone(),
            j["timestamp_ns"].clone(),
        )
    };
    for key in ["rr/a", "rr/b"] {
        let want: Vec<_> = recorded
            .iter()
            .filter(|j| j["key"] == key)
            .map(fields)
            .collect();
        let have: Vec<_> = got.iter().filter(|j| j["key"] == key).map(fields).collect();
        assert_eq!(
            have, want,
            "the replayed {key} samples, in order, with their timestamps"
        );
    }
    assert!(
        got.iter().all(|j| j["replayed"] == true),
        "{:?}",
        got.first()
    );
    // --from and --to pick the samples received in that window, counted
    // from the recording's first entry (events included).
    let t0 = cat_lines(&env, &file)
        .iter()
        .map(|j| j["received_ns"].as_u64().unwrap())
        .min()
        .unwrap();
    let window: Vec<_> = recorded
        .iter()
        .filter(|j| {
            let off = j["received_ns"].as_u64().unwrap() - t0;
            (500_000_000..=1_000_000_000).contains(&off)
        })
        .map(fields)
        .collect();
    assert!(window.len() > 50, "{}", window.len());
    // --from as a time (RFC 3339), --to as an offset.
    let from = humantime::format_rfc3339_nanos(
        std::time::UNIX_EPOCH + Duration::from_nanos(t0 + 500_000_000),
    )
    .to_string();
    let got = replay_into(&["--from", &from, "--to", "1.0"], window.len());
    let mut have: Vec<_> = got.iter().map(fields).collect();
    let mut want = window;
    have.sort_by_key(|f| f.2.as_u64());
    want.sort_by_key(|f| f.2.as_u64());
    assert_eq!(have, want);
    // Both ends belong to the window; a window that holds nothing (`--to`
    // before the recording began) publishes nothing and succeeds, as
    // documented (it exited 1, as did `--from 0 --to 0`); `--to` before
    // `--from` is an error.
    let replay = |args: &[&str]| {
        let out = env
            .cmd(&["replay", "--speed", "max"])
            .args(args)
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), err)
    };
    let (code, err) = replay(&["--to", "2000-01-01T00:00:00Z"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("0 samples published"), "{err}");
    let (code, err) = replay(&["--from", "0", "--to", "0"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = replay(&["--from", "2", "--to", "1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--to comes before --from"), "{err}");
}

#[test]
fn a_recorder_killed_mid_run_leaves_a_file_that_reads_and_recovers() {
    let env = Env::new("rec-kill");
    let file = env.dir.path().join("run.mcap");
    let _p = env.spawn(&["pub", "rk/x", "[1, 2, 3]", "--rate", "500"]);
    let mut rec = env.cmd(&["record", "rk/x", "-o"]);
    rec.arg(&file);
    let mut rec = Proc::spawn(rec);
    // Chunks end every second: wait for two to be on disk, then about
    // three seconds more (a fixed span: chunks kept longer than a second,
    // the loss at the kill would reach it).
    wait_for("two chunks on disk", T, || {
        file.exists() && info(&env, &file)["samples"].as_u64().unwrap_or(0) > 500
    });
    std::thread::sleep(Duration::from_millis(2700));
    let killed_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    rec.kill9();
    let i = info(&env, &file);
    assert_eq!(i["complete"], false, "{i}");
    let n = i["samples"].as_u64().unwrap();
    assert!(n > 500, "{i}");
    assert_eq!(i["gaps"], 0, "{i}");
    // At most about a second lost: the last sample on disk was received
    // less than 2 s (the chunk's second, and one of slack for a busy
    // machine) before the kill.
    let last = cat_all(&env, &file)
        .iter()
        .map(|j| j["received_ns"].as_u64().unwrap())
        .max()
        .unwrap();
    let lost_ms = killed_ns.saturating_sub(last) / 1_000_000;
    assert!(lost_ms < 2000, "the last {lost_ms} ms before the kill lost");
    // A clean copy: complete, the same samples.
    let (clean, _) = recover(&env, &file);
    let c = info(&env, &clean);
    assert_eq!(c["complete"], true, "{c}");
    assert_eq!(c["samples"].as_u64().unwrap(), n, "{c}");
    assert_eq!(cat(&env, &clean), cat(&env, &file));
}

#[test]
fn max_bytes_splits_a_recording_into_complete_files() {
    let env = Env::new("rec-split");
    let file = env.dir.path().join("run.mcap");
    let _p = env.spawn(&[
        "pub",
        "rs/x",
        "\"a value of some length\"",
        "--rate",
        "1000",
    ]);
    // Wait until the publisher is there, so that every file gets samples.
    let sub = Proc::spawn(env.cmd(&["sub", "rs/x", "--count", "1", "--timeout", "20"]));
    assert!(sub.line(T).is_some());
    // Uncompressed, so that sizes follow the stream: about 100 KB/s.
    const MAX: u64 = 40_000;
    let mut rec = env.cmd(&[
        "record",
        "rs/x",
        "--duration",
        "3",
        "--compression",
        "none",
        "--max-bytes",
        &MAX.to_string(),
        "-o",
    ]);
    rec.arg(&file);
    let out = rec.output().unwrap();
    assert!(out.status.success(), "record: {out:?}");
    let mut files: Vec<_> = std::fs::read_dir(env.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("run-"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    assert!(
        !file.exists(),
        "split files are numbered, the plain name is not used"
    );
    // Each file but the last ends at the first chunk that takes it to
    // MAX: it passes MAX by at most a chunk (MAX / 8), that chunk's
    // message index and the summary (a few KiB here).
    for (i, f) in files.iter().enumerate() {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size <= MAX + MAX / 8 + 4096, "{f:?}: {size} bytes");
        if i + 1 < files.len() {
            assert!(size >= MAX, "{f:?} ended early: {size} bytes");
        }
    }
    // Sequence numbers run on from one file to the next.
    let mut last = None;
    for f in &files {
        let i = info(&env, f);
        assert_eq!(i["complete"], true, "{f:?}: {i}");
        for (_, seq, _) in cat(&env, f) {
            if let Some(l) = last {
                assert_eq!(seq, l + 1, "{f:?}");
            }
            last = Some(seq);
        }
    }
    assert!(last.is_some());
}

/// `record --deadline-ms`: a key that falls silent is recorded as a
/// `deadline_missed` event, after its last sample, so that the recording
/// shows when it went quiet.
#[test]
fn a_key_that_falls_silent_is_recorded_as_a_missed_deadline() {
    let env = Env::new("rec-deadline");
    let file = env.dir.path().join("run.mcap");
    let mut rec = env.cmd(&[
        "record",
        "rd/**",
        "--deadline-ms",
        "200",
        "--duration",
        "3",
        "-o",
    ]);
    rec.arg(&file);
    let mut rec = Proc::spawn(rec);
    // Its subscription is up once it sees the publisher: 20 samples at
    // 100/s, then silence for the rest of the recording.
    let out = env
        .cmd(&[
            "pub",
            "rd/x",
            "1.5",
            "--rate",
            "100",
            "--count",
            "20",
            "--wait-subscribers",
            "1",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "pub: {out:?}");
    let status = rec
        .wait_exit(T)
        .expect("the recorder stops after --duration");
    assert!(status.success(), "{status:?}");
    let lines = cat_lines(&env, &file);
    let last_sample = lines
        .iter()
        .rposition(|j| j["key"] == "rd/x" && j.get("event").is_none())
        .unwrap_or_else(|| panic!("the samples recorded: {lines:?}"));
    // (A stall of the publisher on a busy machine may miss a deadline
    // earlier too: the last one must come after the last sample.)
    let missed = lines
        .iter()
        .rposition(|j| j["event"] == "deadline_missed" && j["key"] == "rd/x")
        .unwrap_or_else(|| panic!("a deadline_missed event for rd/x: {lines:?}"));
    assert!(missed > last_sample, "after the last sample: {lines:?}");
}

/// A loss the recording holds reaches the subscribers of its replay, where
/// it was: the replaying publisher's numbers skip as many, and a reliable
/// subscriber, asking for them in vain, reports them lost before the
/// samples that came after them.
#[test]
fn a_replay_passes_a_recorded_loss_on_to_its_subscribers() {
    use milonga::recording::{RecordOptions, RecordWriter};
    use milonga::{Event, LostSamples, NodeId};
    let env = Env::new("rec-gap");
    let file = env.dir.path().join("gap.mcap");
    let publisher = NodeId([7; 16]);
    let sample = |seq: u64| float_sample("rg/x", seq, 1_700_000_000_000_000_000);
    let mut w = RecordWriter::create(&file, &RecordOptions::default()).unwrap();
    let t = |seq: u64| 1_700_000_000_000_000_000 + seq * 1_000_000 + 500;
    for seq in 1..=5 {
        w.sample(&sample(seq), t(seq)).unwrap();
    }
    // Samples 6, 7 and 8 were lost to the recorder, and said so.
    let lost = Event::Lost(LostSamples {
        publisher,
        key: "rg/x".into(),
        count: 3,
        first_seq: 6,
    });
    w.event(&lost, t(9)).unwrap();
    for seq in 9..=12 {
        w.sample(&sample(seq), t(seq)).unwrap();
    }
    w.finish().unwrap();

    let sub = Proc::spawn(env.cmd(&[
        "sub",
        "rg/**",
        "--json",
        "--reliable",
        "--count",
        "9",
        "--timeout",
        "20",
    ]));
    let mut replay = env.cmd(&["replay", "--speed", "max", "--wait-subscribers", "1"]);
    replay.arg(&file);
    let out = replay.output().unwrap();
    assert!(out.status.success(), "replay: {out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("3 recorded as lost"), "{said}");
    // What the subscriber saw, in order: values, and the loss.
    let mut seen = Vec::new();
    let mut summary = Json::Null;
    while let Some(line) = sub.line(T) {
        let j: Json = serde_json::from_str(&line).unwrap();
        match j["event"].as_str() {
            Some("summary") => {
                summary = j;
                break;
            }
            Some("lost") => seen.push(format!("lost {}", j["count"])),
            Some(_) => {}
            None => seen.push(j["value"].to_string()),
        }
    }
    let want: Vec<String> = ["1.0", "2.0", "3.0", "4.0", "5.0", "lost 3"]
        .iter()
        .map(|s| s.to_string())
        .chain(
            ["9.0", "10.0", "11.0", "12.0"]
                .iter()
                .map(|s| s.to_string()),
        )
        .collect();
    assert_eq!(seen, want, "{summary}");
    assert_eq!(summary["lost"], 3, "{summary}");
}

/// A recording of `rt/x`, values 1 to 6 received 200 ms apart (1 s from
/// the first to the last).
fn paced_recording(file: &Path) {
    use milonga::recording::{RecordOptions, RecordWriter};
    let base = 1_700_000_000_000_000_000u64;
    let mut w = RecordWriter::create(file, &RecordOptions::default()).unwrap();
    for seq in 1..=6u64 {
        w.sample(&float_sample("rt/x", seq, base), base + seq * 200_000_000)
            .unwrap();
    }
    w.finish().unwrap();
}

/// `replay --speed 2` and `--speed 0.5` keep the recorded spacing, halved
/// and doubled: a subscriber sees the six samples spread over at least
/// 0.5 s and 2 s (lower bounds, which a busy machine cannot break; that
/// the first is the shorter by far tells the speeds apart).
#[test]
fn replay_keeps_the_recorded_timing_at_the_speed_asked() {
    let env = Env::new("rec-speed");
    let file = env.dir.path().join("paced.mcap");
    paced_recording(&file);
    // `info` in text: the time range, as UTC times.
    let out = env.cmd(&["info"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("received:  2023-11-14T22:13:20.200Z to 2023-11-14T22:13:21.200Z (UTC)")
            && text.contains("duration:  1.000 s")
            && text.contains("rt/x: 6 samples, 1 publisher(s), 5.0/s, 0 missing"),
        "{text}"
    );
    let node = env.node("watcher");
    let sub = node.subscribe("rt/x").unwrap();
    let spread = |speed: &str| {
        let mut replay = env.cmd(&["replay", "--speed", speed, "--wait-subscribers", "1"]);
        replay.arg(&file);
        let mut replay = Proc::spawn(replay);
        let mut at = Vec::new();
        while at.len() < 6 {
            match sub.recv_timeout(T) {
                Ok(milonga::Event::Sample(s)) => {
                    assert_eq!(s.value, milonga::Value::Float(at.len() as f64 + 1.0));
                    assert!(s.replayed);
                    at.push(std::time::Instant::now());
                }
                Ok(_) => {}
                Err(e) => panic!("speed {speed}: {} samples, then {e}", at.len()),
            }
        }
        let status = replay.wait_exit(T).map(|s| s.code());
        assert_eq!(status, Some(Some(0)), "speed {speed}");
        at[5] - at[0]
    };
    let fast = spread("2");
    let slow = spread("0.5");
    assert!(fast >= Duration::from_millis(450), "speed 2: {fast:?}");
    assert!(slow >= Duration::from_millis(1950), "speed 0.5: {slow:?}");
    assert!(fast * 2 < slow, "speed 2 {fast:?}, speed 0.5 {slow:?}");
}

/// `replay --loop` starts over at the end, its numbers running on, until
/// stopped; on a terminal it shows a progress line, and nowhere else.
#[test]
fn replay_loops_until_stopped_and_shows_progress_only_on_a_terminal() {
    let env = Env::new("rec-loop");
    let file = env.dir.path().join("paced.mcap");
    paced_recording(&file);
    let node = env.node("watcher");
    let sub = node
        .subscribe_with("rt/x", milonga::SubscriberQos::default().reliable())
        .unwrap();
    let mut replay = env.cmd(&[
        "replay",
        "--speed",
        "max",
        "--loop",
        "--wait-subscribers",
        "1",
    ]);
    replay.arg(&file);
    let mut replay = Proc::spawn(replay);
    let mut seen = Vec::new();
    let end = std::time::Instant::now() + T;
    while seen.len() < 18 {
        assert!(std::time::Instant::now() < end, "{seen:?}");
        match sub.recv_timeout(T) {
            Ok(milonga::Event::Sample(s)) => seen.push((s.seq, s.value)),
            Ok(_) => {}
            Err(e) => panic!("after {seen:?}: {e}"),
        }
    }
    // The replay publishes reliably: with its subscriber gone it cannot be
    // blocked in a put when it is told to stop.
    drop(sub);
    drop(node);
    replay.signal(libc::SIGINT);
    assert_eq!(replay.wait_exit(T).map(|s| s.code()), Some(Some(0)));
    let want: Vec<_> = (1..=18u64)
        .map(|n| (n, milonga::Value::Float(((n - 1) % 6 + 1) as f64)))
        .collect();
    assert_eq!(seen, want);

    // No terminal: the final line alone.
    let mut plain = env.cmd(&["replay", "--speed", "4"]);
    let out = plain.arg(&file).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("of 6 samples"), "{err}");
    assert!(err.contains("6 samples published"), "{err}");
    // On a terminal (script(1) gives it one), the progress line, redrawn.
    let mut tty = std::process::Command::new("script");
    let line = format!(
        "{} replay --speed 4 '{}'",
        env!("CARGO_BIN_EXE_milonga"),
        file.display()
    );
    tty.args(["-qec", &line, "/dev/null"])
        .env("MILONGA_RUNTIME_DIR", env.dir.path())
        .env("MILONGA_LOCATOR", env.locator())
        .env_remove("MILONGA_PEERS");
    let out = tty.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("\rmilonga replay: ") && shown.contains(" of 6 samples, "),
        "{shown:?}"
    );
}

/// A replay publishes each recorded publisher from a node of its own, so
/// that a recorded `publisher_lost` reaches its subscribers: that node
/// leaves (they are told) where the recording says the publisher went,
/// and its next sample comes from a new node (they see it come), while
/// the other publisher's stream goes on untouched.
#[test]
fn a_replay_passes_a_recorded_publisher_loss_on_to_its_subscribers() {
    use milonga::recording::{RecordOptions, RecordWriter};
    use milonga::{Event, LostReason, NodeId, PublisherLost};
    let env = Env::new("rec-plost");
    let file = env.dir.path().join("plost.mcap");
    let base = 1_700_000_000_000_000_000u64;
    let of = |key: &str, publisher: u8, seq: u64| milonga::Sample {
        publisher: NodeId([publisher; 16]),
        ..float_sample(key, seq, base)
    };
    let mut w = RecordWriter::create(&file, &RecordOptions::default()).unwrap();
    let mut t = base;
    let mut at = || {
        t += 1_000_000;
        t
    };
    for seq in 1..=3 {
        w.sample(&of("rp/a", 1, seq), at()).unwrap();
        w.sample(&of("rp/b", 2, seq), at()).unwrap();
    }
    let gone = Event::PublisherLost(PublisherLost {
        publisher: NodeId([1; 16]),
        name: "a@host:1".into(),
        reason: LostReason::Disconnected,
    });
    w.event(&gone, at()).unwrap();
    for seq in 4..=6 {
        w.sample(&of("rp/a", 1, seq), at()).unwrap();
        w.sample(&of("rp/b", 2, seq), at()).unwrap();
    }
    w.finish().unwrap();

    let node = env.node("watcher");
    let sub = node
        .subscribe_with("rp/**", milonga::SubscriberQos::default().reliable())
        .unwrap();
    let mut replay = env.cmd(&["replay", "--speed", "max", "--wait-subscribers", "1"]);
    replay.arg(&file);
    let replay = Proc::spawn(replay);
    // Per key: (publisher, value) in order; the publishers told lost.
    let mut seen: std::collections::BTreeMap<String, Vec<(NodeId, f64)>> = Default::default();
    let mut lost = Vec::new();
    let end = std::time::Instant::now() + T;
    while seen.values().map(Vec::len).sum::<usize>() < 12 || lost.is_empty() {
        assert!(std::time::Instant::now() < end, "{seen:?} {lost:?}");
        match sub.recv_timeout(T) {
            Ok(Event::Sample(s)) => seen
                .entry(s.key.clone())
                .or_default()
                .push((s.publisher, s.value.as_f64().unwrap())),
            Ok(Event::PublisherLost(l)) => lost.push(l.publisher),
            Ok(_) => {}
            Err(e) => panic!("{seen:?} {lost:?}: {e}"),
        }
    }
    let mut replay = replay;
    assert_eq!(replay.wait_exit(T).map(|s| s.code()), Some(Some(0)));
    let a = &seen["rp/a"];
    let b = &seen["rp/b"];
    let values = |v: &[(NodeId, f64)]| v.iter().map(|x| x.1).collect::<Vec<_>>();
    assert_eq!(values(a), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(values(b), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // rp/a: one node up to the loss, another after; rp/b: one node,
    // neither of those.
    let (a1, a2, b1) = (a[0].0, a[3].0, b[0].0);
    assert!(a[..3].iter().all(|x| x.0 == a1) && a[3..].iter().all(|x| x.0 == a2));
    assert!(b.iter().all(|x| x.0 == b1));
    assert!(a1 != a2 && a1 != b1 && a2 != b1, "{a:?} {b:?}");
    // The first rp/a node was told gone. The rp/b node was not closed
    // with it: all six of its samples came from one node. (It closes when
    // the replay ends, and its goodbye may be told before its last samples
    // arrive, docs/protocol.md "Closing": a `PublisherLost` of it is no
    // sign of a wrong close, so the test does not look at one.)
    assert!(lost.contains(&a1), "{lost:?}");
}

/// A publisher recorded as lost and then publishing again (a partition
/// that healed) is replayed from a new node, which waits for its
/// subscribers to find it. Its samples wait meanwhile; the other
/// publishers' do not. Here one subscriber is stopped (SIGSTOP) and never
/// finds the new node, so it waits its whole `--wait-timeout`: every
/// sample of rs/b, which runs on through that, arrives before the first
/// rs/a sample of the new node, and then all of those do, in order.
#[test]
fn a_node_opened_again_waits_for_its_subscribers_without_stalling_the_others() {
    use milonga::recording::{RecordOptions, RecordWriter};
    use milonga::{Event, LostReason, NodeId, PublisherLost};
    let env = Env::new("rec-stall");
    let file = env.dir.path().join("stall.mcap");
    let base = 1_700_000_000_000_000_000u64;
    let ms = 1_000_000u64;
    let of = |key: &str, publisher: u8, seq: u64| milonga::Sample {
        publisher: NodeId([publisher; 16]),
        ..float_sample(key, seq, base)
    };
    // rs/b every 20 ms for 3 s; rs/a every 200 ms, lost at 1 s, back
    // (the same publisher) at 1.2 s.
    let mut entries: Vec<(u64, Option<milonga::Sample>)> = Vec::new();
    for seq in 1..=150 {
        entries.push((base + seq * 20 * ms, Some(of("rs/b", 2, seq))));
    }
    for seq in 1..=8 {
        let at = if seq <= 5 { seq * 200 } else { seq * 200 + 200 };
        entries.push((base + at * ms - ms, Some(of("rs/a", 1, seq))));
    }
    entries.push((base + 1_100 * ms, None));
    entries.sort_by_key(|e| e.0);
    let mut w = RecordWriter::create(&file, &RecordOptions::default()).unwrap();
    for (at, s) in &entries {
        match s {
            Some(s) => w.sample(s, *at).unwrap(),
            None => {
                let gone = Event::PublisherLost(PublisherLost {
                    publisher: NodeId([1; 16]),
                    name: "a@host:1".into(),
                    reason: LostReason::Disconnected,
                });
                w.event(&gone, *at).unwrap();
            }
        }
    }
    w.finish().unwrap();

    let node = env.node("watcher");
    let sub = node.subscribe("rs/**").unwrap();
    let stopped = env.spawn(&["sub", "rs/**"]);
    let mut replay = env.cmd(&[
        "replay",
        "--speed",
        "1",
        "--wait-subscribers",
        "2",
        "--wait-timeout",
        "6",
    ]);
    replay.arg(&file);
    let mut replay = Proc::spawn(replay);
    // (key, publisher, value) in arrival order.
    let mut seen: Vec<(String, NodeId, f64)> = Vec::new();
    let end = std::time::Instant::now() + T;
    while seen.len() < 158 {
        assert!(std::time::Instant::now() < end, "{seen:?}");
        match sub.recv_timeout(T) {
            Ok(Event::Sample(s)) => {
                if seen.is_empty() {
                    // Both subscribers were found; the second one now
                    // stops answering, a second before rs/a's loss.
                    stopped.signal(libc::SIGSTOP);
                }
                seen.push((s.key.clone(), s.publisher, s.value.as_f64().unwrap()));
            }
            Ok(_) => {}
            Err(e) => panic!("{seen:?}: {e}"),
        }
    }
    stopped.signal(libc::SIGCONT);
    assert_eq!(replay.wait_exit(T).map(|s| s.code()), Some(Some(0)));
    let a: Vec<_> = seen.iter().filter(|x| x.0 == "rs/a").collect();
    let values =
        |key: &str| -> Vec<f64> { seen.iter().filter(|x| x.0 == key).map(|x| x.2).collect() };
    assert_eq!(values("rs/a"), (1..=8).map(f64::from).collect::<Vec<_>>());
    assert_eq!(values("rs/b"), (1..=150).map(f64::from).collect::<Vec<_>>());
    let (a1, a2) = (a[0].1, a[5].1);
    assert!(a[..5].iter().all(|x| x.1 == a1) && a[5..].iter().all(|x| x.1 == a2));
    assert_ne!(a1, a2, "rs/a's node opened again");
    let first_again = seen.iter().position(|x| x.1 == a2).unwrap();
    let last_b = seen.iter().rposition(|x| x.0 == "rs/b").unwrap();
    assert!(
        last_b < first_again,
        "rs/b waited with rs/a's new node: {seen:?}"
    );
}

/// `record --last N` starts with the samples publishers keep (here the
/// last 3 of 10, then nothing more is put), and `--split-every` starts a
/// new complete file every interval, numbers running on.
#[test]
fn record_last_starts_with_kept_samples_and_split_every_makes_complete_files() {
    let env = Env::new("rec-last");
    let node = env.node("keeper");
    let p = node
        .publisher_with("rl/x", milonga::PublisherQos::best_effort().history(10))
        .unwrap();
    for i in 1..=10 {
        p.put(f64::from(i)).unwrap();
    }
    let file = env.dir.path().join("run.mcap");
    let mut rec = env.cmd(&[
        "record",
        "rl/**",
        "--last",
        "3",
        "--split-every",
        "1",
        "--duration",
        "3",
        "-o",
    ]);
    rec.arg(&file);
    let out = rec.output().unwrap();
    assert!(out.status.success(), "record: {out:?}");
    let parts: Vec<_> = (0..)
        .map(|n| env.dir.path().join(format!("run-{n:04}.mcap")))
        .take_while(|f| f.exists())
        .collect();
    assert!(parts.len() >= 2, "a file every second over 3 s: {parts:?}");
    assert!(!file.exists(), "split files only");
    let mut samples = Vec::new();
    for f in &parts {
        assert_eq!(info(&env, f)["complete"], true, "{f:?}");
        samples.extend(cat(&env, f));
    }
    let got: Vec<(String, u64, Json)> = samples;
    let want: Vec<(String, u64, Json)> = (8..=10)
        .map(|i| ("rl/x".to_owned(), i, serde_json::json!(i as f64)))
        .collect();
    assert_eq!(got, want);
    // A split file's name taken already: never overwritten; the recorder
    // stops (exit 1) saying so once, and the file it was writing is
    // finished (it said to recover it, and named the cause twice).
    let other = env.dir.path().join("other.mcap");
    let taken = env.dir.path().join("other-0001.mcap");
    std::fs::write(&taken, b"someone else's").unwrap();
    let mut rec = env.cmd(&[
        "record",
        "rl/**",
        "--split-every",
        "1",
        "--duration",
        "5",
        "-o",
    ]);
    rec.arg(&other);
    let out = rec.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("File exists").count(), 1, "{err}");
    assert!(err.contains("other-0000.mcap is finished"), "{err}");
    assert_eq!(std::fs::read(&taken).unwrap(), b"someone else's");
    let first = env.dir.path().join("other-0000.mcap");
    assert_eq!(info(&env, &first)["complete"], true);
}

/// `replay --keys` and `cat --keys` take only the keys an expression
/// matches.
#[test]
fn replay_and_cat_take_only_the_keys_asked_for() {
    use milonga::recording::{RecordOptions, RecordWriter};
    let env = Env::new("rec-keys");
    let file = env.dir.path().join("keys.mcap");
    let mut w = RecordWriter::create(&file, &RecordOptions::default()).unwrap();
    for seq in 1..=4u64 {
        for key in ["rk/a", "rk/b"] {
            w.sample(&float_sample(key, seq, 0), 2_000_000_000 + seq)
                .unwrap();
        }
    }
    w.finish().unwrap();
    let out = env
        .cmd(&["cat", "--json", "--keys", "rk/a"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let keys: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .filter(|j| j.get("event").is_none())
        .map(|j| j["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, vec!["rk/a"; 4]);
    // A subscriber of both keys gets rk/a's four samples, then nothing.
    let sub = Proc::spawn(env.cmd(&["sub", "rk/**", "--json", "--reliable"]));
    let mut replay = env.cmd(&[
        "replay",
        "--speed",
        "max",
        "--keys",
        "rk/a",
        "--wait-subscribers",
        "1",
    ]);
    replay.arg(&file);
    let out = replay.output().unwrap();
    assert!(out.status.success(), "replay: {out:?}");
    let mut got = Vec::new();
    while let Some(line) = sub.line(Duration::from_secs(2)) {
        let j: Json = serde_json::from_str(&line).unwrap();
        if j.get("event").is_none() {
            got.push((j["key"].as_str().unwrap().to_owned(), j["value"].clone()));
        }
    }
    let want: Vec<(String, Json)> = (1..=4)
        .map(|i| ("rk/a".to_owned(), serde_json::json!(i as f64)))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn cat_and_info_refuse_a_file_that_is_not_a_recording() {
    let env = Env::new("rec-bad");
    let bad = env.dir.path().join("bad.mcap");
    std::fs::write(&bad, b"definitely not MCAP").unwrap();
    for cmd in ["cat", "info"] {
        let out = env.cmd(&[cmd]).arg(&bad).output().unwrap();
        assert!(!out.status.success(), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not a readable MCAP recording"),
            "{cmd}: {err}"
        );
    }
}

/// What a hostile recording claims gets a clear answer, never a panic:
/// losses that add past 2^64 (`info` saturates), a pace too slow to wait
/// for (`replay --speed`, `file_speed`: refused with their range), and
/// messages `cat` cannot show (said on stderr, not dropped silently).
#[test]
fn hostile_recordings_get_clear_answers() {
    use milonga::recording::{RecordOptions, RecordWriter};
    let env = Env::new("rec-hostile");
    let file = env.dir.path().join("lost.mcap");
    let mut w = RecordWriter::create(&file, &RecordOptions::default()).unwrap();
    let base = 1_700_000_000_000_000_000;
    w.sample(&float_sample("h/x", 1, base), base).unwrap();
    for first_seq in [2, 3] {
        let lost = milonga::Event::Lost(milonga::LostSamples {
            publisher: milonga::NodeId([7; 16]),
            key: "h/x".into(),
            count: u64::MAX,
            first_seq,
        });
        w.event(&lost, base + first_seq).unwrap();
    }
    w.finish().unwrap();
    assert_eq!(info(&env, &file)["lost_reported"], u64::MAX);
    let out = env.cmd(&["info"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("18446744073709551615 or more samples reported lost"),
        "{text}"
    );
    let out = env
        .cmd(&["replay", "--speed", "1e-300"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--speed") && err.contains("0.001"), "{err}");
    let locator = format!("file://{}", file.display());
    let out = env
        .cmd(&["--locator", &locator, "sub", "h/**", "--json"])
        .env("MILONGA_FILE_SPEED", "1e-300")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("FILE_SPEED") && err.contains("0.001"), "{err}");
    // --loop over a range that holds no sample: an error, not a spin.
    let out = env
        .cmd(&["replay", "--speed", "max", "--loop", "--from", "1000"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no sample"), "{err}");
    // A message of a channel that is not Milonga's: `cat` says so.
    let foreign = env.dir.path().join("foreign.mcap");
    {
        let f = std::io::BufWriter::new(std::fs::File::create(&foreign).unwrap());
        let mut w = mcap::Writer::new(f).unwrap();
        let ch = w.add_channel(0, "t", "json", &Default::default()).unwrap();
        let header = mcap::records::MessageHeader {
            channel_id: ch,
            sequence: 1,
            log_time: 1,
            publish_time: 1,
        };
        w.write_to_known_channel(&header, b"{}").unwrap();
        w.finish().unwrap();
    }
    let out = env.cmd(&["cat"]).arg(&foreign).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 messages of channels that are not Milonga's"),
        "{err}"
    );
}

/// A 44-byte file whose one record claims 256 MiB: the reader asks for no
/// more than the file holds, so `info` says it is cut short within a
/// 200 MiB address space (it allocated and zeroed the 256 MiB claimed,
/// and was aborted there).
#[test]
fn a_tiny_file_claiming_a_huge_record_allocates_nothing_of_it() {
    use std::os::unix::process::CommandExt;
    let env = Env::new("rec-claim");
    let file = env.dir.path().join("claims.mcap");
    let text = |s: &[u8]| [&(s.len() as u32).to_le_bytes()[..], s].concat();
    let header = [text(b""), text(b"milonga")].concat();
    let mut bytes = b"\x89MCAP0\r\n".to_vec();
    bytes.push(0x01);
    bytes.extend_from_slice(&(header.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&header);
    bytes.push(0x0c);
    bytes.extend_from_slice(&(256u64 << 20).to_le_bytes());
    bytes.extend_from_slice(b"abc");
    std::fs::write(&file, &bytes).unwrap();
    let mut cmd = env.cmd(&["info"]);
    cmd.arg(&file);
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 200 << 20,
                rlim_max: 200 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?} {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("cut short"), "{stdout}");
}

/// A recording with one byte changed in a chunk in its middle (a bad
/// sector, a bit flipped in storage): `info` says it is damaged and what
/// it skipped, `cat` shows the chunks before and after it, and
/// `record --recover` writes a complete copy of all of them.
#[test]
fn a_damaged_chunk_in_the_middle_is_skipped_and_the_rest_recovered() {
    use milonga::recording::{Compression, RecordOptions, RecordWriter};
    let env = Env::new("rec-flip");
    let file = env.dir.path().join("flipped.mcap");
    let opts = RecordOptions {
        compression: Compression::None,
        chunk_bytes: 4096,
        ..RecordOptions::default()
    };
    let mut w = RecordWriter::create(&file, &opts).unwrap();
    let base = 1_700_000_000_000_000_000;
    for seq in 1..=1000 {
        w.sample(&float_sample("d/x", seq, base), base + seq)
            .unwrap();
    }
    w.finish().unwrap();
    // The chunks (opcode 6) after the 8-byte magic: opcode, u64 length,
    // body. A byte in the middle one's records changes.
    let mut b = std::fs::read(&file).unwrap();
    let (mut at, mut chunks) = (8, Vec::new());
    while at + 9 <= b.len() {
        let len = u64::from_le_bytes(b[at + 1..at + 9].try_into().unwrap()) as usize;
        if b[at] == 6 {
            chunks.push((at, len));
        }
        at += 9 + len;
    }
    assert!(chunks.len() >= 5, "{} chunks", chunks.len());
    let (at, len) = chunks[chunks.len() / 2];
    let orig = b.clone();
    b[at + 9 + len - 3] ^= 0x40;
    std::fs::write(&file, &b).unwrap();
    let i = info(&env, &file);
    assert_eq!(i["complete"], false, "{i}");
    assert_eq!(i["skipped_damaged_chunks"], 1, "{i}");
    let state = i["state"].as_str().unwrap();
    assert!(
        state.contains("damaged") && state.contains("everything else read"),
        "{i}"
    );
    let n = i["samples"].as_u64().unwrap();
    assert!(n > 800 && n < 1000, "{i}");
    // The samples on both sides of it, and one run missing.
    let seqs: Vec<u64> = cat(&env, &file).into_iter().map(|(_, s, _)| s).collect();
    assert_eq!(seqs.len() as u64, n);
    assert!(seqs.contains(&1) && seqs.contains(&1000));
    assert_eq!(i["gaps"], 1000 - n, "{i}");
    // The loss is said where it shows, as a live subscription says it.
    assert_eq!(i["lost_reported"], 1000 - n, "{i}");
    let out = env.cmd(&["cat"]).arg(&file).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("1 damaged chunks") && err.contains("CRC"),
        "{err}"
    );
    let (clean, out) = recover(&env, &file);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("damaged (1 chunks skipped"), "{err}");
    let c = info(&env, &clean);
    assert_eq!(c["complete"], true, "{c}");
    assert_eq!(c["samples"].as_u64().unwrap(), n, "{c}");
    assert_eq!(c["lost_reported"], 1000 - n, "{c}");
    assert_eq!(cat(&env, &clean), cat(&env, &file));
    // The same chunk's length made shorter instead (its framing: no CRC
    // covers it): the summary's chunk index says where that chunk ends,
    // and everything is read, the damage said.
    let mut b = orig;
    let shorter = (len as u64 - 7).to_le_bytes();
    b[at + 1..at + 9].copy_from_slice(&shorter);
    let framing = env.dir.path().join("framing.mcap");
    std::fs::write(&framing, &b).unwrap();
    let f = info(&env, &framing);
    assert_eq!(f["complete"], false, "{f}");
    assert_eq!(f["skipped_damaged_chunks"], 0, "{f}");
    assert!(f["damage"].as_str().unwrap().contains("framing"), "{f}");
    let state = f["state"].as_str().unwrap();
    assert!(state.contains("everything else read"), "{f}");
    assert_eq!(f["samples"], 1000, "{f}");
    assert_eq!(f["lost_reported"], 0, "{f}");
    // Both damages at once: the chunk's data no longer matches its CRC
    // either, and it is passed, its samples said lost.
    b[at + 9 + len - 3] ^= 0x40;
    std::fs::write(&framing, &b).unwrap();
    let f = info(&env, &framing);
    assert_eq!(f["skipped_damaged_chunks"], 1, "{f}");
    assert_eq!(f["samples"].as_u64().unwrap(), n, "{f}");
    assert_eq!(f["lost_reported"], 1000 - n, "{f}");
    assert_eq!(cat(&env, &framing), cat(&env, &file));
}

/// A write that fails (here a file size limit, as a full disk would) stops
/// the recorder with an error that says why, and leaves the file without
/// a summary: read as cut short, never as complete.
#[test]
fn a_recorder_that_cannot_write_stops_and_says_why() {
    let env = Env::new("rec-full");
    let file = env.dir.path().join("run.mcap");
    let big = format!("\"{}\"", "x".repeat(500));
    let _p = env.spawn(&["pub", "rf/x", &big, "--rate", "1000"]);
    let rec = env.cmd(&[
        "record",
        "rf/x",
        "--compression",
        "none",
        "--duration",
        "20",
        "-o",
    ]);
    // 1 MiB at most (`ulimit -f` counts KiB), about two seconds of this
    // stream (a chunk a second); SIGXFSZ ignored, so that the write fails
    // with EFBIG instead of killing the process.
    let mut c = std::process::Command::new("bash");
    c.arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1024; exec \"$0\" \"$@\"")
        .arg(rec.get_program())
        .args(rec.get_args())
        .arg(&file);
    for (k, v) in rec.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let started = std::time::Instant::now();
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "it stopped at once"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("recording stopped") && err.contains("File too large"),
        "{err}"
    );
    let i = info(&env, &file);
    assert_eq!(i["complete"], false, "{i}");
    assert!(i["samples"].as_u64().unwrap() > 0, "{i}");
}

/// A disk that fills (a 256 KiB tmpfs mounted in a mount namespace of the
/// test's own, so that it goes with the test): the recorder stops at
/// ENOSPC with a clear error and exit 1; the file it leaves reads as
/// incomplete, the samples of its chunks written whole in order (chunks
/// of 125 KB, `--max-bytes 1000000`, so that some fit; the chunk cut
/// short is not read: its CRC is checked before any of its messages),
/// and `--recover` makes a complete copy of them. Needs root, as the multi-host tests do
/// (skipped, saying so, with MILONGA_SKIP_MULTIHOST=1).
#[test]
fn a_recorder_on_a_full_disk_stops_and_leaves_a_file_that_reads() {
    let env = Env::new("rec-enospc");
    let disk = env.dir.path().join("disk");
    std::fs::create_dir(&disk).unwrap();
    let big = format!("\"{}\"", "x".repeat(500));
    let _p = env.spawn(&["pub", "rn/x", &big, "--rate", "1000"]);
    let rec = env.cmd(&[
        "record",
        "rn/x",
        "--compression",
        "none",
        "--max-bytes",
        "1000000",
        "--duration",
        "20",
    ]);
    // In the namespace: mount, record onto it (about half a second of
    // this stream fills it; --max-bytes names the file run-0000.mcap),
    // then read what it left, with its exit
    // status and error beside, outside the small disk.
    let script = r#"set -e
mount -t tmpfs -o size=256k milonga-test "$DISK"
set +e
"$0" "$@" -o "$DISK/run.mcap" 2>"$OUT/err"
echo $? >"$OUT/rc"
"$0" info --json "$DISK/run-0000.mcap" >"$OUT/info.json" 2>>"$OUT/err"
"$0" cat --json "$DISK/run-0000.mcap" >"$OUT/cat.json" 2>>"$OUT/err"
"$0" record --recover "$DISK/run-0000.mcap" -o "$OUT/clean.mcap" 2>>"$OUT/err"
exit 0
"#;
    let mut c = std::process::Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "sh", "-c", script])
        .arg(rec.get_program())
        .args(rec.get_args())
        .env("DISK", &disk)
        .env("OUT", env.dir.path());
    for (k, v) in rec.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let started = std::time::Instant::now();
    let out = c.output().unwrap();
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        if std::env::var(milonga_testkit::netbed::SKIP_VAR).is_ok_and(|v| v == "1") {
            eprintln!("full-disk test SKIPPED: cannot mount a small disk ({why})");
            return;
        }
        panic!("cannot mount a small disk in a mount namespace (this test needs root; MILONGA_SKIP_MULTIHOST=1 skips it): {why}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "it stopped at once, not at --duration"
    );
    let read = |name: &str| std::fs::read_to_string(env.dir.path().join(name)).unwrap();
    let err = read("err");
    assert_eq!(read("rc").trim(), "1", "{err}");
    assert!(
        err.contains("recording stopped") && err.contains("No space left on device"),
        "{err}"
    );
    let i: Json = serde_json::from_str(&read("info.json")).expect(&err);
    assert_eq!(i["complete"], false, "{i}");
    let samples = i["samples"].as_u64().unwrap();
    assert!(samples > 0, "{i}");
    // The finished chunks' samples, in order, none twice.
    let seqs: Vec<u64> = read("cat.json")
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).unwrap())
        .filter(|j| j.get("event").is_none())
        .map(|j| j["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len() as u64, samples);
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let clean = info(&env, &env.dir.path().join("clean.mcap"));
    assert_eq!(clean["complete"], true, "{clean}");
    assert_eq!(clean["samples"].as_u64(), Some(samples), "{clean}");
}

/// A recording of 1,000 keys: a channel each, every sample once.
#[test]
fn a_recording_of_a_thousand_keys_holds_each_once() {
    use milonga::PublisherQos;
    let env = Env::new("rec-keys");
    let file = env.dir.path().join("run.mcap");
    let mut rec = env.cmd(&["record", "rk1000/**", "--reliable", "-o"]);
    rec.arg(&file);
    let mut rec = Proc::spawn(rec);
    let node = env.node("keys");
    let pubs: Vec<_> = (0..1000)
        .map(|i| {
            node.publisher_with(&format!("rk1000/{i}"), PublisherQos::reliable())
                .unwrap()
        })
        .collect();
    wait_for("the recorder's subscription", T, || {
        pubs.iter().all(|p| p.subscriber_count() > 0)
    });
    for round in 0..5u64 {
        for p in &pubs {
            p.put(round).unwrap();
        }
    }
    // Chunks reach the file every second: once all are there, the
    // recorder is stopped as a closed terminal would (SIGHUP, handled as
    // Ctrl-C is; it left the file unfinished), and finishes the file.
    wait_for("every sample on disk", T, || {
        info(&env, &file)["samples"].as_u64() == Some(5000)
    });
    rec.signal(libc::SIGHUP);
    assert!(rec.wait_exit(T).is_some_and(|s| s.success()));
    let i = info(&env, &file);
    assert_eq!(i["complete"], true);
    assert_eq!(
        i["keys"].as_object().unwrap().len(),
        1000,
        "{}",
        i["samples"]
    );
    assert_eq!(i["samples"], 5000);
    assert_eq!(i["gaps"], 0);
    assert!(i["keys"]
        .as_object()
        .unwrap()
        .values()
        .all(|k| k["samples"] == 5 && k["publishers"] == 1));
}

/// `milonga sub --locator file:///PATH` reads a recording as it would
/// subscribe live (samples and the recorded status events) and exits at
/// its end; `milonga pub --locator file:///PATH` writes one.
#[test]
fn the_file_locator_from_the_command_line() {
    let env = Env::new("rec-loc");
    let file = env.dir.path().join("run.mcap");
    let locator = format!("file://{}", file.display());
    let out = env
        .cmd(&["pub", "fl/x", "[1, 2]", "--count", "20", "--rate", "1000"])
        .args(["--locator", &locator])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = env
        .cmd(&["sub", "fl/**", "--json", "--timeout", "20"])
        .args(["--locator", &locator])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Json> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seqs: Vec<u64> = lines
        .iter()
        .filter(|j| j.get("event").is_none())
        .map(|j| j["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<_>>());
    assert_eq!(cat(&env, &file).len(), 20);
}
