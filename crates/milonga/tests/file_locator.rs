//! The `file:///PATH` locator (docs/recording.md): publishers write into
//! the recording, subscriptions read it back with the events a live
//! subscription yields, and end.

use std::time::{Duration, Instant};

use milonga::recording::{Entry, RecordReader};
use milonga::{Config, Event, Node, OpenError, PublisherQos, RecvError, Value};
use milonga_testkit::TempDir;

fn node(path: &std::path::Path, speed: &str) -> Result<Node, OpenError> {
    let mut cfg = Config::new(&format!("file://{}", path.display()), "file-test");
    cfg.set("file_speed", milonga::ConfigValue::Text(speed.into()))?;
    Node::open_with(cfg)
}

fn samples(path: &std::path::Path) -> Vec<milonga::Sample> {
    RecordReader::open(path)
        .unwrap()
        .filter_map(|e| match e.unwrap() {
            Entry::Sample(s, _) => Some(s),
            Entry::Event(..) => None,
        })
        .collect()
}

#[test]
fn publishers_write_the_file_and_subscriptions_read_it_back_then_end() {
    let dir = TempDir::new("file-loc");
    let path = dir.path().join("run.mcap");
    let writer = node(&path, "max").unwrap();
    let id = writer.id();
    let p = writer.publisher("f/a").unwrap();
    for i in 1..=100u64 {
        if i % 10 == 0 {
            p.put_at(i, 1_000 + i).unwrap();
        } else {
            p.put(i).unwrap();
        }
    }
    assert_eq!(p.subscriber_count(), 0, "nothing goes over the network");
    writer.close();
    assert!(matches!(p.put(0u64), Err(milonga::PutError::Closed)));
    let written = samples(&path);
    assert_eq!(written.len(), 100);
    assert!(written.iter().all(|s| s.publisher == id && s.key == "f/a"));
    assert_eq!(written[9].timestamp_ns, 1_010);

    // Read back: the same samples, publisher, sequence numbers and
    // timestamps, then the end.
    let reader = node(&path, "max").unwrap();
    let sub = reader.subscribe("f/**").unwrap();
    let mut got = Vec::new();
    loop {
        match sub.recv_timeout(Duration::from_secs(10)) {
            Ok(Event::Sample(s)) => got.push(s),
            Ok(_) => {}
            Err(RecvError::EndOfRecording) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, written);
    assert_eq!(
        got.iter().map(|s| s.seq).collect::<Vec<_>>(),
        (1..=100).collect::<Vec<_>>()
    );
    // A second subscription reads from the start too; iteration ends.
    let other = reader.subscribe("f/a").unwrap();
    assert_eq!(
        (&other)
            .into_iter()
            .filter(|e| e.as_sample().is_some())
            .count(),
        100
    );
    // With a queue policy (a pump thread between the recording and the
    // application): the same samples, and the same end (it was `Closed`).
    let queued = reader
        .subscribe_with("f/**", milonga::SubscriberQos::default().keep_all(1000))
        .unwrap();
    let mut n = 0;
    loop {
        match queued.recv_timeout(Duration::from_secs(10)) {
            Ok(Event::Sample(_)) => n += 1,
            Ok(_) => {}
            Err(RecvError::EndOfRecording) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(n, 100);
    // One that matches nothing ends at once.
    let none = reader.subscribe("g/**").unwrap();
    assert!(matches!(
        none.recv_timeout(Duration::from_secs(10)),
        Err(RecvError::EndOfRecording)
    ));
}

/// A new recording's open chunk is written out once it is a second old
/// (`flush_every`) even when no put follows: a node that then dies loses
/// at most that second, as `milonga record` does (it waited for the next
/// put, so an idle node killed lost all it had put since the chunk began).
#[test]
fn an_idle_node_writes_out_its_open_chunk_within_a_second_or_so() {
    let dir = TempDir::new("file-idle");
    let path = dir.path().join("run.mcap");
    let writer = node(&path, "max").unwrap();
    let p = writer.publisher("f/idle").unwrap();
    for i in 1..=5u64 {
        p.put(i).unwrap();
    }
    // Read as another process would, while the node lives (no summary
    // yet): what completed chunks hold. A hang guard, not a timing.
    let readable = || {
        let Ok(mut r) = RecordReader::open(&path) else {
            return 0;
        };
        let mut n = 0;
        while let Ok(Some(e)) = r.next_entry() {
            n += usize::from(matches!(e, Entry::Sample(..)));
        }
        n
    };
    let end = Instant::now() + Duration::from_secs(20);
    while readable() < 5 {
        assert!(
            Instant::now() < end,
            "the idle node's samples never reached the file"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    writer.close();
    assert_eq!(samples(&path).len(), 5);
}

#[test]
fn a_node_appends_to_an_existing_recording() {
    let dir = TempDir::new("file-append");
    let path = dir.path().join("run.mcap");
    let first = node(&path, "max").unwrap();
    let p = first.publisher("f/a").unwrap();
    for i in 0..10u64 {
        p.put(i).unwrap();
    }
    drop(p);
    drop(first);
    let second = node(&path, "max").unwrap();
    let q = second
        .publisher_with("f/b", PublisherQos::reliable())
        .unwrap();
    for i in 0..5u64 {
        q.put(Value::from(format!("b{i}"))).unwrap();
    }
    // Until the node closes, the original stays as it was.
    assert_eq!(samples(&path).len(), 10);
    drop(q);
    second.close();
    let all = samples(&path);
    assert_eq!(all.len(), 15);
    assert_eq!(all.iter().filter(|s| s.key == "f/b").count(), 5);
    assert!(!dir.path().join("run.mcap.milonga-tmp").exists());
}

/// Two nodes appending to one recording at once would each replace the
/// other's copy (one's samples lost, its puts all `Ok`): the second is
/// refused while the first writes, and its puts go through once the
/// first has closed; both nodes' samples are in the file.
#[test]
fn a_second_node_appending_at_once_waits_for_the_first() {
    let dir = TempDir::new("file-append2");
    let path = dir.path().join("run.mcap");
    let first = node(&path, "max").unwrap();
    first.publisher("f/a").unwrap().put(0u64).unwrap();
    first.close();
    let (a, b) = (node(&path, "max").unwrap(), node(&path, "max").unwrap());
    let (pa, pb) = (a.publisher("f/a").unwrap(), b.publisher("f/b").unwrap());
    pa.put(1u64).unwrap();
    let refused = pb.put(2u64).unwrap_err().to_string();
    assert!(refused.contains("another node writes it"), "{refused}");
    pa.put(3u64).unwrap();
    drop(pa);
    a.close();
    pb.put(4u64).unwrap();
    drop(pb);
    b.close();
    let keys: Vec<(String, f64)> = samples(&path)
        .into_iter()
        .map(|s| (s.key, s.value.as_f64().unwrap()))
        .collect();
    let want = [("f/a", 0.0), ("f/a", 1.0), ("f/a", 3.0), ("f/b", 4.0)];
    assert_eq!(keys, want.map(|(k, v)| (k.to_owned(), v)));
}

/// Two nodes putting their first sample into the same new recording at
/// one instant: one creates it, the other waits (`another node writes it
/// now`, a put tries again) and appends once the first closed. Before, the
/// second could lock the file the first had just created and not yet
/// locked, find it unfinished and refuse every put for good. Fifty rounds.
#[test]
fn two_nodes_creating_one_recording_at_once_both_write_it() {
    let dir = TempDir::new("file-create2");
    for round in 0..50 {
        let path = dir.path().join(format!("run-{round}.mcap"));
        let go = std::sync::Arc::new(std::sync::Barrier::new(2));
        let writers: Vec<_> = ["f/a", "f/b"]
            .into_iter()
            .map(|key| {
                let (path, go) = (path.clone(), go.clone());
                std::thread::spawn(move || {
                    let n = node(&path, "max").unwrap();
                    let p = n.publisher(key).unwrap();
                    go.wait();
                    let end = Instant::now() + Duration::from_secs(20);
                    loop {
                        match p.put(1u64) {
                            Ok(()) => break,
                            Err(e) => {
                                let e = e.to_string();
                                assert!(e.contains("another node writes it"), "{key}: {e}");
                                assert!(Instant::now() < end, "{key}: still refused: {e}");
                                // A put tries again (until the other closes).
                                std::thread::sleep(Duration::from_millis(2));
                            }
                        }
                    }
                    drop(p);
                    n.close();
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let mut keys: Vec<String> = samples(&path).into_iter().map(|s| s.key).collect();
        keys.sort();
        assert_eq!(keys, ["f/a", "f/b"], "round {round}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("milonga-"))
            .collect();
        assert!(names.is_empty(), "left behind: {names:?}");
    }
}

/// A node killed while creating a new recording leaves its hidden file
/// (`.milonga-new-<node id>`): the next node creating a recording in that
/// directory removes those a minute old that no node holds, and leaves a
/// younger one (a node creating its own now).
#[test]
fn hidden_files_a_killed_node_left_are_removed_by_the_next_creation() {
    let dir = TempDir::new("file-stale");
    let stale = dir
        .path()
        .join(".milonga-new-00112233445566778899aabbccddeeff");
    let young = dir
        .path()
        .join(".milonga-new-ffeeddccbbaa99887766554433221100");
    for f in [&stale, &young] {
        std::fs::write(f, b"\x89MCAP0\r\n").unwrap();
    }
    let old = std::time::SystemTime::now() - Duration::from_secs(120);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let path = dir.path().join("run.mcap");
    let n = node(&path, "max").unwrap();
    n.publisher("f/a").unwrap().put(1u64).unwrap();
    n.close();
    assert!(!stale.exists(), "the stale hidden file stayed");
    assert!(young.exists(), "a young hidden file was removed");
    assert_eq!(samples(&path).len(), 1);
}

/// A node appends to a recording by copying it and putting the copy in
/// its place: never to one the copy would not hold whole (cut short, or
/// with what is not Milonga's), which is left as it is, the put refused
/// with the reason.
#[test]
fn a_node_does_not_append_to_a_recording_a_copy_would_not_keep_whole() {
    let dir = TempDir::new("file-noappend");
    let good = dir.path().join("good.mcap");
    let n = node(&good, "max").unwrap();
    let p = n.publisher("f/a").unwrap();
    for i in 0..10u64 {
        p.put(i).unwrap();
    }
    drop(p);
    n.close();
    let bytes = std::fs::read(&good).unwrap();
    // Cut short (its summary gone), and foreign (a JSON channel's
    // message beside Milonga's).
    let cut = dir.path().join("cut.mcap");
    std::fs::write(&cut, &bytes[..bytes.len() - 200]).unwrap();
    let foreign = dir.path().join("foreign.mcap");
    {
        let f = std::io::BufWriter::new(std::fs::File::create(&foreign).unwrap());
        let mut w = mcap::Writer::new(f).unwrap();
        let ch = w
            .add_channel(0, "other/topic", "json", &Default::default())
            .unwrap();
        let header = mcap::records::MessageHeader {
            channel_id: ch,
            sequence: 1,
            log_time: 1,
            publish_time: 1,
        };
        w.write_to_known_channel(&header, b"{}").unwrap();
        w.finish().unwrap();
    }
    // Milonga's own channel, with what its channels never hold (another
    // metadata key): a copy would drop it.
    let extra = dir.path().join("extra.mcap");
    {
        let f = std::io::BufWriter::new(std::fs::File::create(&extra).unwrap());
        let mut w = mcap::Writer::new(f).unwrap();
        let meta = std::collections::BTreeMap::from([
            ("milonga.publisher".to_owned(), "07".repeat(16)),
            ("unit".to_owned(), "A".to_owned()),
        ]);
        let ch = w.add_channel(0, "f/c", "cbor", &meta).unwrap();
        let header = mcap::records::MessageHeader {
            channel_id: ch,
            sequence: 1,
            log_time: 1,
            publish_time: 1,
        };
        w.write_to_known_channel(&header, &[0x01]).unwrap();
        w.finish().unwrap();
    }
    for (path, why) in [
        (&cut, "cut short"),
        (&foreign, "leave out"),
        (&extra, "1 other records"),
    ] {
        let before = std::fs::read(path).unwrap();
        let n = node(path, "max").unwrap();
        let p = n.publisher("f/b").unwrap();
        let err = p.put(1u64).unwrap_err();
        assert!(
            err.to_string().contains("cannot append") && err.to_string().contains(why),
            "{err}"
        );
        // Said again at the next put, the file not copied again.
        let again = p.put(2u64).unwrap_err();
        assert_eq!(again.to_string(), err.to_string());
        drop(p);
        n.close();
        assert_eq!(std::fs::read(path).unwrap(), before, "{path:?} changed");
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".milonga-tmp");
        assert!(!std::path::Path::new(&tmp).exists());
    }
}

#[test]
fn file_speed_one_reads_at_the_recorded_pace() {
    let dir = TempDir::new("file-pace");
    let path = dir.path().join("run.mcap");
    let w = node(&path, "max").unwrap();
    let p = w.publisher("f/t").unwrap();
    // The input, not a wait: samples recorded 100 ms apart, the pace
    // that `file_speed = 1` must reproduce.
    for i in 0..6u64 {
        p.put(i).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    w.close();
    let r = node(&path, "1").unwrap();
    let sub = r.subscribe("f/t").unwrap();
    let started = Instant::now();
    let n = sub.iter().filter(|e| e.as_sample().is_some()).count();
    assert_eq!(n, 6);
    // Five gaps of 100 ms between the first sample and the last.
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
    let fast = node(&path, "max").unwrap();
    let started = Instant::now();
    assert_eq!(fast.subscribe("f/t").unwrap().iter().count(), 6);
    assert!(
        started.elapsed() < Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn what_is_not_a_recording_is_a_clear_error() {
    let dir = TempDir::new("file-bad");
    let bad = dir.path().join("bad.mcap");
    std::fs::write(&bad, b"this is not MCAP").unwrap();
    let err = node(&bad, "max").unwrap_err();
    assert!(err.to_string().contains("not a readable MCAP"), "{err}");
    let nowhere = dir.path().join("no/such/dir/run.mcap");
    let err = node(&nowhere, "max").unwrap_err();
    assert!(err.to_string().contains("no such recording"), "{err}");
    let err = node(&dir.path().join("x.mcap"), "fast").unwrap_err();
    assert!(err.to_string().contains("file_speed"), "{err}");
    assert!(Node::open_with(Config::new("file://relative.mcap", "x")).is_err());
}

/// A subscription on a path that holds no recording (a typo, or one not
/// written yet) is an error at `subscribe`: it read as an empty recording
/// that ended at once.
#[test]
fn a_subscription_where_no_recording_is_fails_saying_why() {
    let dir = TempDir::new("file-none");
    let missing = dir.path().join("nosuch.mcap");
    let n = node(&missing, "max").unwrap();
    let err = n.subscribe("f/**").unwrap_err();
    assert!(
        matches!(err, milonga::SubscribeError::Recording(_)),
        "{err:?}"
    );
    assert!(err.to_string().contains("nosuch.mcap"), "{err}");
    let text = dir.path().join("notes.mcap");
    std::fs::write(&text, "not a recording\n").unwrap();
    // (A file that is not a recording is refused at open already.)
    let err = node(&text, "max").unwrap_err();
    assert!(
        err.to_string().contains("not a readable MCAP recording"),
        "{err}"
    );
}

/// Runs `f` on a thread and fails the test if it has not returned within
/// 10 s (a FIFO's open would block it for ever).
fn within_10_s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what}: still waiting after 10 s"))
}

fn mkfifo(path: &std::path::Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

/// A FIFO where a recording should be, or among the hidden names a node
/// creating a recording sweeps (anyone who may write the directory can
/// make one): a clear error, or passed over, never an open that waits for
/// a writer for ever (`milonga info`, `sub` and `pub` on such a path hung
/// until killed, SIGTERM included).
#[test]
fn a_fifo_at_the_path_or_among_hidden_names_is_refused_or_passed_over_never_waited_on() {
    let dir = TempDir::new("file-fifo");
    let fifo = dir.path().join("f.mcap");
    mkfifo(&fifo);
    let at = fifo.clone();
    let err = within_10_s("opening a node on a FIFO", move || {
        node(&at, "max").map(|_| ()).unwrap_err().to_string()
    });
    assert!(err.contains("not a regular file"), "{err}");
    let at = fifo.clone();
    let err = within_10_s("opening a FIFO as a recording", move || {
        RecordReader::open(&at).map(|_| ()).unwrap_err().to_string()
    });
    assert!(err.contains("not a regular file"), "{err}");
    mkfifo(&dir.path().join(".milonga-new-evil"));
    let path = dir.path().join("run.mcap");
    let at = path.clone();
    within_10_s("creating a recording beside a hidden FIFO", move || {
        let n = node(&at, "max").unwrap();
        n.publisher("f/a").unwrap().put(1u64).unwrap();
        n.close();
    });
    assert_eq!(samples(&path).len(), 1);
}

/// The copy a node killed while appending left (`PATH.milonga-tmp`: the
/// recording and what that node added) is kept beside the recording when
/// the next node appends, never removed (the next node removed it: what
/// the killed node wrote was lost for good).
#[test]
fn the_copy_a_killed_appender_left_is_kept_aside_not_removed() {
    let dir = TempDir::new("file-killed");
    let path = dir.path().join("run.mcap");
    let first = node(&path, "max").unwrap();
    first.publisher("f/a").unwrap().put(1u64).unwrap();
    first.close();
    // What a killed appender leaves: its copy, cut short.
    let left = std::fs::read(&path).unwrap();
    let tmp = dir.path().join("run.mcap.milonga-tmp");
    std::fs::write(&tmp, &left[..left.len() / 2]).unwrap();
    let second = node(&path, "max").unwrap();
    second.publisher("f/b").unwrap().put(2u64).unwrap();
    second.close();
    assert_eq!(samples(&path).len(), 2, "the append went on");
    let kept: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("run.mcap.unfinished-") && n.ends_with(".mcap"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        std::fs::read(dir.path().join(&kept[0])).unwrap(),
        &left[..left.len() / 2],
        "kept as it was"
    );
    assert!(!tmp.exists(), "the copy of this append took its place");
}

/// Appending replaces the file with a copy: the copy keeps the
/// recording's mode; through a symbolic link the link's target is
/// appended to and the link stays a link; a recording nobody may write
/// is not replaced (the put refused, saying so). Before, a `chmod 444`
/// recording was replaced by one of mode 0644, and a link by a file.
#[test]
fn appending_keeps_the_mode_follows_a_link_and_refuses_a_read_only_recording() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("file-mode");
    let path = dir.path().join("run.mcap");
    let first = node(&path, "max").unwrap();
    first.publisher("f/a").unwrap().put(1u64).unwrap();
    first.close();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = dir.path().join("latest.mcap");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let second = node(&link, "max").unwrap();
    second.publisher("f/b").unwrap().put(2u64).unwrap();
    second.close();
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link stays a link"
    );
    assert_eq!(samples(&path).len(), 2, "the target was appended to");
    assert_eq!(mode(&path), 0o640);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&path).unwrap();
    let third = node(&path, "max").unwrap();
    let err = third.publisher("f/c").unwrap().put(3u64).unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    third.close();
    assert_eq!(std::fs::read(&path).unwrap(), before, "left as it was");
    assert_eq!(mode(&path), 0o444);
}
