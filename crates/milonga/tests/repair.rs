//! History and repair: a fault proxy (milonga-testkit) sits between a
//! reliable publisher that keeps history and a reliable subscriber, and
//! cuts their connection while samples flow. The subscriber comes back,
//! asks for what it missed, and receives it, or is told exactly which
//! samples are gone beyond the history.

use std::time::{Duration, Instant};

use milonga::{Config, Event, Node, Publisher, PublisherQos, Subscriber, SubscriberQos};
use milonga_testkit::{wait_for, FaultProxy, TempDir};

const T: Duration = Duration::from_secs(20);

struct Rig {
    _dir: TempDir,
    a: Node,
    b: Node,
    p: Publisher,
    s: Subscriber,
    proxy: std::sync::Arc<FaultProxy>,
}

/// A publisher whose reliable data socket is reached only through a fault
/// proxy: its announcement (written by the test, as its own discovery is
/// off) gives the proxy's address.
fn rig(tag: &str, history: usize) -> Rig {
    let dir = TempDir::new(tag);
    let mut cfg = Config::new(&format!("milonga:///{tag}"), "pub");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    cfg.local_discovery = false;
    let a = Node::open_with(cfg).unwrap();
    let p = a
        .publisher_with("rp/x", PublisherQos::reliable().history(history))
        .unwrap();
    let mut me = a
        .peers()
        .into_iter()
        .find(|x| x.node_id == a.id().to_hex())
        .unwrap();
    let real = me.data_reliable.clone().unwrap();
    let addr = real.strip_prefix("tcp://").unwrap().parse().unwrap();
    let proxy = std::sync::Arc::new(FaultProxy::start(addr));
    me.data_reliable = Some(format!("tcp://127.0.0.1:{}", proxy.port()));
    let domain_dir = dir.path().join(tag);
    std::fs::create_dir_all(&domain_dir).unwrap();
    std::fs::write(
        domain_dir.join(format!("{}.json", me.node_id)),
        serde_json::to_vec(&me).unwrap(),
    )
    .unwrap();
    let mut cfg = Config::new(&format!("milonga:///{tag}"), "sub");
    cfg.runtime_dir = Some(dir.path().to_path_buf());
    let b = Node::open_with(cfg).unwrap();
    let s = b
        .subscribe_with("rp/x", SubscriberQos::default().reliable())
        .unwrap();
    wait_for("the subscriber, through the proxy", T, || {
        p.subscriber_count() == 1
    });
    Rig {
        _dir: dir,
        a,
        b,
        p,
        s,
        proxy,
    }
}

/// Puts `n` samples, about five a millisecond, cutting the connection
/// after `cut_at` of them and keeping it down for `down` meanwhile.
fn put_through_a_cut(p: &Publisher, proxy: &FaultProxy, n: u64, cut_at: u64, down: Duration) {
    let mut up_at = None;
    for i in 1..=n {
        p.put(i).unwrap();
        if i == cut_at {
            proxy.set_down(true);
            proxy.cut();
            up_at = Some(Instant::now() + down);
        }
        if up_at.is_some_and(|t| Instant::now() >= t) {
            proxy.set_down(false);
            up_at = None;
        }
        if i % 5 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// What the subscriber saw until sample `n`: the sequence numbers of the
/// samples, and the (first, count) of each loss reported.
fn collect(s: &Subscriber, n: u64) -> (Vec<u64>, Vec<(u64, u64)>) {
    let (mut seqs, mut lost) = (Vec::new(), Vec::new());
    let end = Instant::now() + T;
    while seqs.last() != Some(&n) {
        assert!(Instant::now() < end, "stuck at {:?}", seqs.last());
        match s.recv_timeout(Duration::from_secs(5)) {
            Ok(Event::Sample(x)) => seqs.push(x.seq),
            Ok(Event::Lost(l)) => lost.push((l.first_seq, l.count)),
            Ok(_) => {}
            Err(e) => panic!("{e} after {:?}", seqs.last()),
        }
    }
    (seqs, lost)
}

#[test]
fn a_broken_connection_is_repaired_from_history() {
    let r = rig("repair", 100_000);
    let n = 4000;
    let (p, proxy) = (&r.p, r.proxy.clone());
    std::thread::scope(|sc| {
        sc.spawn(|| put_through_a_cut(p, &proxy, n, 1000, Duration::from_millis(200)));
        let (seqs, lost) = collect(&r.s, n);
        assert_eq!(lost, vec![], "nothing reported lost");
        assert_eq!(
            seqs,
            (1..=n).collect::<Vec<_>>(),
            "every sample, in order, once"
        );
    });
    let st = r.b.stats();
    assert!(
        st.connections_closed >= 1,
        "the proxy cut the connection: {st:?}"
    );
    assert!(
        st.samples_replayed >= 1,
        "the gap was filled from history: {st:?}"
    );
    assert_eq!(st.samples_duplicate, 0);
    assert!(r.a.stats().history_queries_answered >= 1);
}

#[test]
fn what_history_no_longer_holds_is_reported_exactly() {
    let r = rig("gone", 10);
    let n = 4000;
    let (p, proxy) = (&r.p, r.proxy.clone());
    std::thread::scope(|sc| {
        sc.spawn(|| put_through_a_cut(p, &proxy, n, 1000, Duration::from_millis(200)));
        let (seqs, lost) = collect(&r.s, n);
        // Every sequence number is either received or reported lost,
        // exactly once, in order.
        let mut expect = 1u64;
        let mut si = seqs.iter().peekable();
        let mut li = lost.iter().peekable();
        while expect <= n {
            if let Some(&&(first, count)) = li.peek() {
                if first == expect {
                    expect += count;
                    li.next();
                    continue;
                }
            }
            assert_eq!(si.next(), Some(&expect), "received or reported, in order");
            expect += 1;
        }
        assert!(!lost.is_empty(), "the cut lost more than 10 samples");
        assert_eq!(lost.iter().map(|l| l.1).sum::<u64>(), r.s.lost());
    });
    // What the history still held came back from it, or live from a batch
    // that was waiting when the query was read: either way it was received,
    // as the partition above shows.
    assert!(
        r.a.stats().history_queries_answered >= 1,
        "a repair was asked for"
    );
}
