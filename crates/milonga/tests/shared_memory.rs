//! Same-host shared memory (docs/shared-memory.md): large payloads go
//! through a publisher's segment when every subscription that wants them
//! asked, read back exactly, in order; a payload a subscriber holds is
//! never rewritten; a subscription that did not ask gets the bytes through
//! the socket. Nodes of this process over tcp on the loopback (the
//! publisher and subscriber are on one host, as for two processes). The
//! kill -9 cases are tested with real processes in
//! `milonga-cli/tests/processes.rs`, the broker in `milonga-cli/tests/broker.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use milonga::wire::value::TypedArray;
use milonga::{Config, Node, PublisherQos, Sample, Value};
use milonga_testkit::{wait_for, TempDir};

const T: Duration = Duration::from_secs(10);

fn config(domain: &str, name: &str, dir: &Path) -> Config {
    let mut cfg = Config::new(&format!("milonga:///{domain}"), name);
    cfg.runtime_dir = Some(dir.to_path_buf());
    cfg
}

fn next(sub: &milonga::Subscriber) -> Sample {
    let end = Instant::now() + T;
    loop {
        assert!(Instant::now() < end, "no sample in {T:?}");
        match sub.recv_timeout(T).expect("a sample in time") {
            milonga::Event::Sample(s) => return s,
            e @ milonga::Event::Lost { .. } => panic!("a loss: {e:?}"),
            _ => {}
        }
    }
}

/// A waveform of `n` doubles that differs from one `i` to the next.
fn waveform(i: usize, n: usize) -> Value {
    Value::Typed(TypedArray::from_vec(
        (0..n).map(|j| (i * n + j) as f64).collect::<Vec<f64>>(),
    ))
}

/// Puts large probe samples until one goes through shared memory (the
/// subscription's marker has reached the publisher; before, samples go
/// through the socket), each received by `sub`: the number of probes, so
/// that the test's own samples are numbered from that number + 1.
fn marked(p: &milonga::Publisher, publishing: &Node, sub: &milonga::Subscriber) -> u64 {
    wait_for("the subscription", T, || p.subscriber_count() > 0);
    let before = publishing.stats().shm_sent;
    let mut probes = 0;
    while publishing.stats().shm_sent == before {
        assert!(probes < 100, "no probe went through shared memory");
        p.put(waveform(0, 10_000)).unwrap(); // 80 kB
        probes += 1;
        assert_eq!(next(sub).seq, probes);
    }
    probes
}

#[test]
fn large_samples_go_through_shared_memory_and_read_back_exactly_in_order() {
    let dir = TempDir::new("shm-exact");
    let publishing = Node::open_with(config("shm1", "pub", dir.path())).unwrap();
    let subscribing = Node::open_with(config("shm1", "sub", dir.path())).unwrap();
    let p = publishing
        .publisher_with("shm/wave", PublisherQos::reliable())
        .unwrap();
    let raw = publishing.publisher("shm/raw").unwrap();
    let sub = subscribing.subscribe("shm/wave").unwrap();
    let sub_raw = subscribing.subscribe("shm/raw").unwrap();
    let base = marked(&p, &publishing, &sub);
    marked(&raw, &publishing, &sub_raw);
    let (sent0, got0) = (publishing.stats(), subscribing.stats());
    for i in 0..60 {
        p.put(waveform(i, 25_000)).unwrap(); // 200 kB
    }
    for i in 0..60 {
        let s = next(&sub);
        assert_eq!(s.seq, base + i as u64 + 1);
        assert_eq!(
            s.value,
            waveform(i, 25_000),
            "sample {i} reads back exactly"
        );
    }
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    raw.put(Value::Bytes(bytes.clone().into())).unwrap();
    assert_eq!(next(&sub_raw).value, Value::Bytes(bytes.into()));
    // A small sample of the same key still goes through the socket.
    p.put(Value::Int(7)).unwrap();
    assert_eq!(next(&sub).value, Value::Int(7));
    let (sent, got) = (publishing.stats(), subscribing.stats());
    assert_eq!(
        sent.shm_sent - sent0.shm_sent,
        61,
        "every large sample went through shared memory"
    );
    assert_eq!(got.shm_received - got0.shm_received, 61);
    assert_eq!(got.shm_unreadable, 0);
    assert_eq!(got.samples_lost, 0);
}

#[test]
fn a_held_payload_is_never_rewritten_and_the_publisher_goes_on_through_the_socket() {
    let dir = TempDir::new("shm-held");
    let mut cfg = config("shm2", "pub", dir.path());
    // A small ring: a few payloads of 300 kB fit.
    cfg.shm_segment_bytes = 2 << 20;
    let publishing = Node::open_with(cfg).unwrap();
    let subscribing = Node::open_with(config("shm2", "sub", dir.path())).unwrap();
    let p = publishing
        .publisher_with("shm/frame", PublisherQos::reliable())
        .unwrap();
    let sub = subscribing.subscribe("shm/frame").unwrap();
    let base = marked(&p, &publishing, &sub);
    let st0 = publishing.stats();
    // The subscriber keeps every sample it received: their slots stay
    // leased, so the ring fills and later samples take the socket.
    let mut held = Vec::new();
    for i in 0..30 {
        p.put(waveform(i, 37_500)).unwrap(); // 300 kB
        held.push(next(&sub));
    }
    for (i, s) in held.iter().enumerate() {
        assert_eq!(s.seq, base + i as u64 + 1);
        assert_eq!(s.value, waveform(i, 37_500), "held sample {i} unchanged");
    }
    let st = publishing.stats();
    let shared = st.shm_sent - st0.shm_sent;
    let fell_back = st.shm_fallbacks - st0.shm_fallbacks;
    assert!(shared >= 3, "{st:?}");
    assert!(fell_back > 0, "a full ring sends through the socket");
    assert_eq!(shared + fell_back, 30);
    // Let go of them: the slots are free again.
    drop(held);
    let before = publishing.stats().shm_sent;
    for i in 30..40 {
        p.put(waveform(i, 37_500)).unwrap();
        assert_eq!(next(&sub).value, waveform(i, 37_500));
    }
    assert_eq!(publishing.stats().shm_sent - before, 10);
    assert_eq!(subscribing.stats().samples_lost, 0);
}

/// A reliable subscriber that does not read for longer than the hold time
/// still gets every sample (its slots are waited for; later samples go
/// through the socket); once a marked subscription leaves, slots awaited
/// longer than the hold time may be given up, and are reused.
#[test]
fn a_reliable_subscriber_that_stops_reading_loses_nothing() {
    let dir = TempDir::new("shm-slow");
    let mut cfg = config("shm5", "pub", dir.path());
    cfg.shm_segment_bytes = 2 << 20;
    cfg.shm_hold_ms = 200;
    let publishing = Node::open_with(cfg).unwrap();
    let subscribing = Node::open_with(config("shm5", "sub", dir.path())).unwrap();
    let p = publishing
        .publisher_with("shm/slow", PublisherQos::reliable())
        .unwrap();
    let sub = subscribing.subscribe("shm/slow").unwrap();
    let base = marked(&p, &publishing, &sub);
    let st0 = publishing.stats();
    // Ten samples of 300 kB while the subscriber reads nothing for a
    // second (five hold times): more than the ring holds (about 2 MB).
    for i in 0..10 {
        p.put(waveform(i, 37_500)).unwrap();
    }
    std::thread::sleep(Duration::from_secs(1));
    for i in 0..10 {
        let s = next(&sub);
        assert_eq!(s.seq, base + i as u64 + 1);
        assert_eq!(s.value, waveform(i, 37_500));
    }
    let st = publishing.stats();
    assert!(st.shm_sent - st0.shm_sent >= 1);
    assert!(st.shm_fallbacks > st0.shm_fallbacks, "{st:?}");
    let got = subscribing.stats();
    assert_eq!((got.shm_unreadable, got.samples_lost), (0, 0));
}

#[test]
fn a_subscription_that_did_not_ask_gets_every_sample_through_the_socket() {
    let dir = TempDir::new("shm-mixed");
    let publishing = Node::open_with(config("shm3", "pub", dir.path())).unwrap();
    let asking = Node::open_with(config("shm3", "asking", dir.path())).unwrap();
    let mut cfg = config("shm3", "plain", dir.path());
    cfg.shared_memory = false;
    let plain = Node::open_with(cfg).unwrap();
    let p = publishing.publisher("shm/mixed").unwrap();
    let a = asking.subscribe("shm/mixed").unwrap();
    // Everything (the empty prefix): no reference may reach it.
    let b = plain.subscribe("**").unwrap();
    wait_for("both subscriptions", T, || p.subscriber_count() >= 2);
    for i in 0..20 {
        p.put(waveform(i, 20_000)).unwrap();
    }
    for i in 0..20 {
        assert_eq!(next(&a).value, waveform(i, 20_000));
        assert_eq!(next(&b).value, waveform(i, 20_000));
    }
    assert_eq!(
        publishing.stats().shm_sent,
        0,
        "one subscription did not ask: all go through the socket"
    );
    assert_eq!(asking.stats().shm_received, 0);
    assert_eq!(plain.stats().frames_malformed, 0);
    // The plain one leaves: the asking one alone gets shared memory.
    drop(b);
    plain.close();
    wait_for("the plain subscription to leave", T, || {
        p.subscriber_count() == 1
    });
    let before = publishing.stats().shm_sent;
    for i in 20..30 {
        p.put(waveform(i, 20_000)).unwrap();
        assert_eq!(next(&a).value, waveform(i, 20_000));
    }
    assert_eq!(publishing.stats().shm_sent - before, 10);
}

#[test]
fn a_loan_is_filled_in_place_published_without_a_copy_and_given_back_when_dropped() {
    let dir = TempDir::new("shm-loan");
    let mut cfg = config("shm4", "pub", dir.path());
    cfg.shm_segment_bytes = 4 << 20;
    let publishing = Node::open_with(cfg).unwrap();
    let subscribing = Node::open_with(config("shm4", "sub", dir.path())).unwrap();
    let p = publishing
        .publisher_with("shm/loan", PublisherQos::reliable())
        .unwrap();
    let sub = subscribing.subscribe("shm/loan").unwrap();
    marked(&p, &publishing, &sub);
    let st0 = publishing.stats();
    // Loans dropped unpublished go back: far more than the ring holds.
    for _ in 0..100 {
        let l = p.loan(1 << 20);
        assert!(l.is_shared(), "{l:?}");
    }
    for i in 0..20u8 {
        let mut l = p.loan(300_000);
        assert!(l.is_shared());
        l.fill(i);
        p.put_loan(l).unwrap();
        assert_eq!(next(&sub).value, Value::Bytes(vec![i; 300_000].into()));
    }
    // As a typed array.
    let mut l = p.loan(8 * 40_000);
    for (j, c) in l.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&(j as f64).to_le_bytes());
    }
    p.put_loan_typed(l, milonga::wire::ElementType::F64)
        .unwrap();
    assert_eq!(
        next(&sub).value,
        Value::Typed(TypedArray::from_vec(
            (0..40_000).map(|j| j as f64).collect::<Vec<f64>>()
        ))
    );
    // As a row-major array of 200 x 300 (a numpy array's layout); a
    // shape that does not hold its elements is refused, the loan handed back.
    let mut l = p.loan(8 * 60_000);
    for (j, c) in l.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&(j as f64).to_le_bytes());
    }
    let wrong = milonga::LoanLayout::Array(milonga::wire::ElementType::F64, vec![200, 200]);
    let l = match p.put_loan_timeout(l, &wrong, T) {
        Err(milonga::LoanNotPut {
            error: milonga::PutError::Encode(_),
            loan: Some(l),
        }) => *l,
        other => panic!("{other:?}"),
    };
    let right = milonga::LoanLayout::Array(milonga::wire::ElementType::F64, vec![200, 300]);
    p.put_loan_timeout(l, &right, T).unwrap();
    let elements = Value::Typed(TypedArray::from_vec(
        (0..60_000).map(|j| j as f64).collect::<Vec<f64>>(),
    ));
    let dims = Value::Array(vec![Value::Int(200), Value::Int(300)]);
    assert_eq!(
        next(&sub).value,
        Value::Tagged(40, Box::new(Value::Array(vec![dims, elements])))
    );
    // Small: memory of its own, sent as any sample.
    let mut small = p.loan(100);
    assert!(!small.is_shared());
    small.fill(9);
    p.put_loan(small).unwrap();
    assert_eq!(next(&sub).value, Value::Bytes(vec![9u8; 100].into()));
    assert_eq!(publishing.stats().shm_sent - st0.shm_sent, 22);
    // A subscription elsewhere (here: one that does not ask): the loan
    // goes through the socket, its content intact.
    let mut cfg = config("shm4", "plain", dir.path());
    cfg.shared_memory = false;
    let plain = Node::open_with(cfg).unwrap();
    let other = plain.subscribe("shm/loan").unwrap();
    wait_for("the second subscription", T, || p.subscriber_count() == 2);
    let before = publishing.stats().shm_sent;
    let mut l = p.loan(200_000);
    l.fill(77);
    p.put_loan(l).unwrap();
    assert_eq!(next(&sub).value, Value::Bytes(vec![77u8; 200_000].into()));
    assert_eq!(next(&other).value, Value::Bytes(vec![77u8; 200_000].into()));
    assert_eq!(publishing.stats().shm_sent, before);
    assert_eq!(subscribing.stats().samples_lost, 0);
}

/// A loan that a full reliable subscriber has no room for comes back
/// from `put_loan_timeout` unchanged, and goes out once there is room:
/// every sample arrives, in order, with the bytes written into its loan.
/// With a subscription that asked for shared memory, the loan that comes
/// back is a slot or, once the ring is full of unread samples, memory of
/// its own; with one that did not, it is a slot (the loans go through the
/// socket, and the ring is larger than what the socket queues).
#[test]
fn a_loan_without_room_comes_back_unchanged_and_goes_out_later() {
    loan_comes_back(true);
    loan_comes_back(false);
}

fn loan_comes_back(asking: bool) {
    let dir = TempDir::new("shm-loan-back");
    let mut cfg = config("shm6", "pub", dir.path());
    cfg.reliable_send_hwm = 2;
    cfg.shm_segment_bytes = if asking { 4 << 20 } else { 64 << 20 };
    let publishing = Node::open_with(cfg).unwrap();
    let mut cfg = config("shm6", "sub", dir.path());
    cfg.recv_hwm = 2;
    cfg.shared_memory = asking;
    let subscribing = Node::open_with(cfg).unwrap();
    let p = publishing
        .publisher_with("shm/back", PublisherQos::reliable())
        .unwrap();
    let sub = subscribing.subscribe("shm/back").unwrap();
    let base = match asking {
        true => marked(&p, &publishing, &sub),
        false => {
            wait_for("the subscription", T, || p.subscriber_count() > 0);
            0
        }
    };
    let byte = |i: u64| (i % 251) as u8;
    // The subscriber reads nothing: loans go out until one comes back.
    let mut sent = 0u64;
    let (back, shared) = loop {
        assert!(sent < 100_000, "the subscriber never filled up");
        let mut l = p.loan(100_000);
        l.fill(byte(sent));
        let shared = l.is_shared();
        match p.put_loan_timeout(l, &milonga::LoanLayout::Bytes, Duration::ZERO) {
            Ok(()) => sent += 1,
            Err(milonga::LoanNotPut {
                error: milonga::PutError::WouldBlock,
                loan: Some(l),
            }) => break (*l, shared),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(back.is_shared(), shared);
    assert!(asking || shared, "a slot of the ring (through the socket)");
    assert!(
        back.iter().all(|&b| b == byte(sent)),
        "the loan came back changed"
    );
    // Waiting a while, without room: it comes back again.
    let back =
        match p.put_loan_timeout(back, &milonga::LoanLayout::Bytes, Duration::from_millis(20)) {
            Err(milonga::LoanNotPut {
                error: milonga::PutError::Timeout(_),
                loan: Some(l),
            }) => *l,
            // libzmq's I/O thread may have moved queued messages on.
            Ok(()) => {
                sent += 1;
                let mut l = p.loan(100_000);
                l.fill(byte(sent));
                l
            }
            Err(e) => panic!("{e}"),
        };
    for i in 0..sent {
        let s = next(&sub);
        assert_eq!(s.seq, base + i + 1);
        assert_eq!(s.value, Value::Bytes(vec![byte(i); 100_000].into()));
    }
    p.put_loan_timeout(back, &milonga::LoanLayout::Bytes, T)
        .unwrap();
    let s = next(&sub);
    assert_eq!(s.seq, base + sent + 1);
    assert_eq!(s.value, Value::Bytes(vec![byte(sent); 100_000].into()));
    assert_eq!(subscribing.stats().samples_lost, 0);
}

/// A loan whose slot was published in the ring but whose reference could
/// not leave (the subscriber's pipe full of another key's samples) comes
/// back still a slot, unchanged, and goes through shared memory once the
/// subscriber reads again.
#[test]
fn a_shared_loan_whose_reference_could_not_leave_comes_back_a_slot() {
    let dir = TempDir::new("shm-loan-ref");
    let mut cfg = config("shm7", "pub", dir.path());
    cfg.reliable_send_hwm = 2;
    let publishing = Node::open_with(cfg).unwrap();
    let mut cfg = config("shm7", "sub", dir.path());
    cfg.recv_hwm = 2;
    let subscribing = Node::open_with(cfg).unwrap();
    let big = publishing
        .publisher_with("ref/big", PublisherQos::reliable())
        .unwrap();
    let small = publishing
        .publisher_with("ref/small", PublisherQos::reliable())
        .unwrap();
    // One subscription, one connection, both keys.
    let sub = subscribing.subscribe("ref/**").unwrap();
    wait_for("both keys", T, || {
        small.subscriber_count() == 1 && big.subscriber_count() == 1
    });
    let base = marked(&big, &publishing, &sub);
    // Small samples of the other key until the connection is full (the
    // last of them wait in a batch of their own key).
    let mut smalls = 0u64;
    while small.try_put(smalls).is_ok() {
        smalls += 1;
        assert!(smalls < 10_000_000, "the subscriber never filled up");
    }
    let mut l = big.loan(100_000);
    assert!(l.is_shared(), "the ring is empty: a slot");
    l.fill(42);
    let sent_before = publishing.stats().shm_sent;
    let back = match big.put_loan_timeout(l, &milonga::LoanLayout::Bytes, Duration::ZERO) {
        Err(milonga::LoanNotPut {
            error: milonga::PutError::WouldBlock,
            loan: Some(l),
        }) => *l,
        other => panic!("{other:?}"),
    };
    assert!(back.is_shared(), "still its slot");
    assert!(back.iter().all(|&b| b == 42), "unchanged");
    assert_eq!(publishing.stats().shm_sent, sent_before);
    // The subscriber reads: the small samples, in order.
    let mut got = 0;
    while got < smalls {
        let s = next(&sub);
        assert_eq!((s.key.as_str(), s.seq), ("ref/small", got + 1));
        got += 1;
    }
    big.put_loan_timeout(back, &milonga::LoanLayout::Bytes, T)
        .unwrap();
    let s = next(&sub);
    assert_eq!((s.key.as_str(), s.seq), ("ref/big", base + 1));
    assert_eq!(s.value, Value::Bytes(vec![42u8; 100_000].into()));
    assert_eq!(publishing.stats().shm_sent, sent_before + 1);
    assert_eq!(subscribing.stats().samples_lost, 0);
}

/// Small samples go through shared memory when a publisher opts in
/// (`zero_copy_threshold_bytes` and `shm_threshold_bytes` lowered, as
/// `bench pubsub --shm-small` does), and read back exactly, in order.
#[test]
fn small_samples_go_through_shared_memory_when_the_thresholds_are_lowered() {
    let dir = TempDir::new("shm-small");
    let mut cfg = config("shm8", "pub", dir.path());
    cfg.zero_copy_threshold_bytes = 1024;
    cfg.shm_threshold_bytes = 1024;
    let publishing = Node::open_with(cfg).unwrap();
    let subscribing = Node::open_with(config("shm8", "sub", dir.path())).unwrap();
    let p = publishing
        .publisher_with("shm/small", PublisherQos::reliable())
        .unwrap();
    let sub = subscribing.subscribe("shm/small").unwrap();
    let base = marked(&p, &publishing, &sub);
    let before = publishing.stats().shm_sent;
    let payload = |i: u64| Value::Bytes(vec![(i % 251) as u8; 2048].into());
    for i in 0..100 {
        p.put(payload(i)).unwrap();
    }
    for i in 0..100 {
        let s = next(&sub);
        assert_eq!(s.seq, base + i + 1);
        assert_eq!(s.value, payload(i));
    }
    assert_eq!(publishing.stats().shm_sent - before, 100);
    // Below the lowered threshold: through the socket.
    p.put(Value::Bytes(vec![1u8; 512].into())).unwrap();
    assert_eq!(next(&sub).value, Value::Bytes(vec![1u8; 512].into()));
    assert_eq!(publishing.stats().shm_sent - before, 100);
}
