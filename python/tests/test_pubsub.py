"""Publish/subscribe from Python: values, discovery across processes,
wildcards, loss counts, reliable mode, status events, callbacks, asyncio."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, TypeVar

import numpy as np
import pytest

import milonga
from conftest import Domain, next_sample, ready_line, wait_for

T = TypeVar("T")

VALUES: list[object] = [
    None,
    True,
    False,
    0,
    -(2**63),
    2**64 - 1,
    -(2**64),
    1.5,
    float("inf"),
    "",
    "grüß",
    b"",
    b"\x00raw",
    [1, "a", None],
    {"amps": 3.0, "on": True, "nested": {"list": [1, 2]}},
    [],
    {},
]


def test_compressed_samples_arrive_as_they_were_put(domain: Domain) -> None:
    a = domain.open("pub")
    lz = domain.open("lz", compression="lz4")
    b = domain.open("sub")
    text = "beam current 12.5 mA, vacuum 1e-9 mbar; " * 100
    pub = a.publisher("lab/z", milonga.PublisherQos(compression="zstd", compression_level=5))
    plain = a.publisher("lab/plain", milonga.PublisherQos(compression="none"))
    from_node = lz.publisher("lab/lz")
    sub = b.subscribe("lab/**")
    for p in (pub, plain, from_node):
        wait_for("the subscription", lambda p=p: p.subscriber_count() == 1)
        p.put(text)
        assert next_sample(sub).value == text
    assert a.stats()["frames_deflated"] == 1
    assert lz.stats()["frames_deflated"] == 1
    assert b.stats()["frames_inflated"] == 2
    with pytest.raises(ValueError, match="expected 'none', 'lz4' or 'zstd'"):
        a.publisher("lab/bad", milonga.PublisherQos(compression="gzip"))


def test_a_zstd_dictionary_is_learned_and_small_samples_arrive_as_put(domain: Domain) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    qos = milonga.PublisherQos(
        reliable=True, compression="zstd", compression_threshold=16, compression_dictionary=True
    )
    pub = a.publisher("lab/status", qos)
    sub = b.subscribe("lab/status")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    records = [
        {"device": "sr/ps/q17", "state": "ON", "current_a": 120.0 + i % 7, "count": i}
        for i in range(200)
    ]
    for r in records:
        pub.put(r)
    for r in records:
        assert next_sample(sub).value == r
    stats = b.stats()
    assert stats["dictionaries_learned"] == 1
    assert stats["frames_unknown_dictionary"] == 0
    # The samples after the first 128 (the training) went with it.
    assert stats["frames_inflated"] >= 200 - 128


def test_every_kind_of_value_arrives_as_it_was_sent(domain: Domain) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("lab/value")
    sub = b.subscribe("lab/value")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    before = time.time()
    for v in VALUES:
        pub.put(v)
    pub.put((1, 2))  # a tuple is a CBOR array: it comes back a list
    for i, v in enumerate(VALUES):
        s = next_sample(sub)
        assert s.value == v and type(s.value) is type(v), (v, s.value)
        assert s.key == "lab/value"
        assert s.seq == i + 1
        assert s.publisher == a.id
        assert before - 1 <= s.timestamp <= time.time() + 1
        assert s.timestamp_ns // 1_000_000_000 == int(s.timestamp)
    assert next_sample(sub).value == [1, 2]
    assert b.stats()["samples_received"] == len(VALUES) + 1


def test_every_config_key_is_a_keyword_argument(domain: Domain) -> None:
    """The keys come from one table (Config::keys); a key the binding once
    forgot (handshake_timeout_ms) works like the others, a path may be a
    pathlib.Path, an optional key may be None, and a wrong kind is refused
    naming the key."""
    node = domain.open(
        "keys",
        handshake_timeout_ms=300,
        heartbeat_interval_ms=200,
        heartbeat_timeout_ms=900,
        local_discovery=True,
        peers=[],
        control_endpoint=None,
        send_hwm=50,
        close_linger_ms=-1,
    )
    assert node.name.startswith("keys@")
    other = milonga.open(domain.locator, name="path", runtime_dir=domain.dir)
    other.close()
    with pytest.raises(milonga.ConfigError, match="send_hwm.*whole number"):
        milonga.open(domain.locator, name="x", runtime_dir=str(domain.dir), send_hwm="10")
    with pytest.raises(milonga.ConfigError, match="send_hwm.*out of range"):
        milonga.open(domain.locator, name="x", runtime_dir=str(domain.dir), send_hwm=1 << 40)


def test_bad_input_gets_a_clear_error(domain: Domain) -> None:
    node = domain.open("bad")
    with pytest.raises(milonga.InvalidKey, match="empty chunk") as e:
        node.publisher("a//b")
    assert isinstance(e.value, KeyError) and isinstance(e.value, milonga.Error)
    with pytest.raises(milonga.InvalidKey):
        node.subscribe("a/b*")
    with pytest.raises(milonga.ConfigError, match='unknown config key "colour"'):
        milonga.open(domain.locator, name="x", colour="red")
    with pytest.raises(milonga.ConfigError, match="transport"):
        milonga.open(domain.locator, name="x", transport="carrier-pigeon")
    with pytest.raises(milonga.ConfigError):
        milonga.open("http://lab", name="x")
    pub = node.publisher("lab/bad")
    with pytest.raises(milonga.EncodeError, match="cannot send a object"):
        pub.put(object())
    with pytest.raises(milonga.EncodeError, match="outside CBOR's range"):
        pub.put(2**64)
    with pytest.raises(milonga.EncodeError, match="nests deeper"):
        deep: list[object] = []
        for _ in range(100):
            deep = [deep]
        pub.put(deep)
    with pytest.raises(milonga.AlreadyDeclared):
        node.publisher("lab/bad")
    with pytest.raises(ValueError, match="seconds >= 0"):
        node.subscribe("lab/bad").recv(timeout=-1)
    # A bad timeout is refused even where no wait was needed (it went
    # unnoticed on a put that found room); infinity is no limit.
    for t in (-1.0, float("nan")):
        with pytest.raises(milonga.ConfigError, match="seconds >= 0"):
            pub.put(1, timeout=t)
    pub.put(1, timeout=float("inf"))
    # A coroutine function is called on a thread with no event loop: never
    # run (a callback), or a reply that cannot be sent (a handler).

    async def coro(_: object) -> None:
        return None

    with pytest.raises(TypeError, match="coroutine function"):
        node.subscribe("lab/async", callback=coro)
    with pytest.raises(TypeError, match="coroutine function"):
        node.serve("lab/async", coro)
    # A loan's shape without its dtype.
    with pytest.raises(milonga.ConfigError, match="shape needs a dtype"):
        pub.put_loan(pub.loan(16), shape=[4])
    # A tagged value is hashable (a map may be keyed by one).
    tagged = milonga.Tagged(1000, "x")
    assert {tagged: 1}[milonga.Tagged(1000, "x")] == 1
    # QoS values out of range or of the wrong type: a ConfigError (a
    # milonga.Error), not the native call's OverflowError or TypeError.
    for bad in [
        lambda: milonga.PublisherQos(history=-1),
        lambda: milonga.PublisherQos(history=1.5),  # type: ignore[arg-type]
        lambda: milonga.PublisherQos(history=10**400),
        lambda: milonga.PublisherQos(put_timeout=10**400),
        lambda: milonga.PublisherQos(put_timeout=-1),
        lambda: milonga.PublisherQos(compression="gzip"),
        lambda: milonga.SubscriberQos(last=-1),
        lambda: milonga.SubscriberQos(deadline=0),
        lambda: milonga.SubscriberQos(keep_all=-1),
        lambda: node.serve("lab/bad-svc", lambda r: r, workers=-1),
    ]:
        with pytest.raises(milonga.ConfigError):
            bad()
    # A numpy integer is an integer.
    assert milonga.PublisherQos(history=np.int64(5)).history == 5
    pub.close()
    with pytest.raises(milonga.Closed):
        pub.put(1)


def test_closing_from_another_thread_ends_the_waits_on_it(domain: Domain) -> None:
    """A recv, an iteration or a reliable put waiting in one thread ends
    with Closed when another thread closes its subscription or publisher
    (they held their own handle and waited on)."""
    a = domain.open("pub")
    b = domain.open("sub")
    ended: dict[str, BaseException] = {}

    def wait_in_thread(name: str, wait: Callable[[], object]) -> threading.Thread:
        def run() -> None:
            try:
                wait()
            except BaseException as e:  # noqa: BLE001 - kept for the assertion
                ended[name] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    quiet = b.subscribe("cl/quiet")
    iterated = b.subscribe("cl/quiet2")
    t1 = wait_in_thread("recv", quiet.recv)
    t2 = wait_in_thread("iter", lambda: list(iterated))
    # A reliable publisher whose one subscriber reads nothing: its puts
    # wait once the queues are full.
    stuck = b.subscribe("cl/full", qos=milonga.SubscriberQos(reliable=True, queue_depth=1))
    pub = a.publisher("cl/full", milonga.PublisherQos(reliable=True))
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    puts = [0]

    def put_until_closed() -> None:
        while True:
            pub.put(b"x" * 65536)
            puts[0] += 1

    t3 = wait_in_thread("put", put_until_closed)

    def waiting() -> bool:
        # Whether the puts stopped: none counted in 0.3 s (a reliable put
        # without room waits in 50 ms slices, so a put still going would
        # count several). Polled by wait_for, which has the deadline.
        n = puts[0]
        time.sleep(0.3)
        return n > 0 and puts[0] == n

    wait_for("the puts to wait", waiting)
    quiet.close()
    iterated.close()
    pub.close()
    for name, t in [("recv", t1), ("iter", t2), ("put", t3)]:
        t.join(timeout=5)
        assert not t.is_alive(), f"{name} still waits after close"
    assert isinstance(ended["recv"], milonga.Closed), ended
    assert isinstance(ended["put"], milonga.Closed), ended
    # Iteration ends quietly at Closed.
    assert "iter" not in ended, ended
    stuck.close()


def test_a_callback_subscription_goes_on_past_an_event_it_cannot_convert(
    domain: Domain, caplog: pytest.LogCaptureFixture
) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("cv/k")
    got: list[object] = []
    done = threading.Event()

    def callback(event: milonga.Event) -> None:
        if isinstance(event, milonga.Sample):
            got.append(event.value)
            if event.value == 5:
                done.set()

    sub = b.subscribe("cv/**", callback=callback)
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    with caplog.at_level(logging.ERROR, logger="milonga"):
        # A map key that arrives as a list, which Python cannot hash.
        pub.put({(1, (2,)): "x"})
        pub.put(5)
        assert done.wait(10), got
    assert got == [5]
    assert "could not be received" in caplog.text
    sub.close()


def test_a_dict_changed_while_it_is_converted_is_an_error_not_a_panic(domain: Domain) -> None:
    node = domain.open("dict")
    pub = node.publisher("dc/k")
    d: dict[object, object] = {}

    class Grows:
        def __index__(self) -> int:
            d[len(d) + 100] = 0
            return 1

    d["a"] = Grows()
    d["b"] = 2
    # Sent as the items were when its conversion began, or refused: never a
    # pyo3 PanicException (a BaseException that `except Exception` misses).
    try:
        pub.put(d)
    except milonga.Error:
        pass
    with pytest.raises(milonga.ConfigError, match="queue_depth"):
        node.subscribe("dc/k", qos=milonga.SubscriberQos(queue_depth=0))


class Ticker:
    """Another thread, counting its turns; each ends in a sleep of
    ``pause`` seconds, which gives the interpreter back."""

    def __init__(self, pause: float) -> None:
        self.ran = 0
        self._pause = pause
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._done.is_set():
            self.ran += 1
            time.sleep(self._pause)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def test_a_large_put_lets_other_threads_run_while_it_compresses(domain: Domain) -> None:
    # With a switch interval of a minute, the thread below runs while the
    # main thread holds the interpreter only where the main thread releases
    # it: a best-effort put of 16 MiB compressed by zstd (which held it
    # throughout) must, and so must a reliable one.
    a, b = domain.open("pub"), domain.open("sub")
    best = a.publisher("gil/b", milonga.PublisherQos(compression="zstd"))
    reliable = a.publisher("gil/r", milonga.PublisherQos(reliable=True, compression="zstd"))
    sub = b.subscribe("gil/**", qos=milonga.SubscriberQos(reliable=True))
    for p in (best, reliable):
        wait_for("the subscription", lambda p=p: p.subscriber_count() == 1)
    value = np.random.default_rng(1).integers(0, 256, 16 << 20, dtype=np.uint8)
    # Its sleep gives the interpreter back at once, so the main thread
    # takes it when its put returns.
    other = Ticker(0.0001)
    before = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        other.start()
        # The value alone, and inside a dict. On a busy machine the other
        # thread may not get a core before a put is over: a few tries each.
        puts = 0
        for p, v in ((best, value), (reliable, {"image": value})):
            start = other.ran
            for _ in range(5):
                time.sleep(0.01)  # the other thread waits for the interpreter
                p.put(v)
                puts += 1
                if other.ran > start:
                    break
            assert other.ran > start, p
    finally:
        other.stop()
        sys.setswitchinterval(before)
    for _ in range(puts):
        got = next_sample(sub).value
        got = got["image"] if isinstance(got, dict) else got
        assert got.nbytes == value.nbytes


def test_a_read_only_view_let_go_under_a_node_lock_never_deadlocks_a_thread_holding_the_gil(
    domain: Domain,
) -> None:
    # A read-only memoryview of 64 KiB or more is sent from its own
    # memory, held until the message is let go: here by the history of
    # one sample, while the node's socket lock is held, in a thread whose
    # put released the interpreter. The main thread holds the interpreter
    # in small puts, which take that lock. Letting the view go waited for
    # the interpreter under the lock: both threads stopped for good. In a
    # child process, so that a hang is a timeout here, not a hung suite.
    child = domain.spawn(
        """
        import os, threading, time, milonga
        node = milonga.open(os.environ["LOCATOR"], name="relay", transport="tcp")
        big = node.publisher("dl/big", milonga.PublisherQos(history=1))
        small = node.publisher("dl/small")
        view = memoryview(bytes(1 << 20))
        stop = time.monotonic() + 3
        puts = [0]
        def pump():
            while time.monotonic() < stop:
                big.put(view)
                puts[0] += 1
        t = threading.Thread(target=pump)
        t.start()
        n = 0
        while time.monotonic() < stop:
            small.put(float(n))
            n += 1
        t.join()
        node.close()
        print("done", puts[0], n, flush=True)
        """
    )
    try:
        out, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("deadlocked: the child did not end within 30 s")
    assert child.returncode == 0, err
    words = out.split()
    assert words[0] == "done" and int(words[1]) > 10 and int(words[2]) > 10, out


def test_a_node_let_go_without_close_lets_other_threads_run_while_it_closes(
    domain: Domain,
) -> None:
    # A node closing waits up to `close_linger_ms` for subscribers sent a
    # shared-memory reference to open the segment; here one is stopped
    # (SIGSTOP), so the wait is the whole linger. `close()` waits without
    # the interpreter; a node let go without it (garbage) waited with it,
    # and every other thread of the program stopped meanwhile.
    child = domain.spawn(
        """
        import os, milonga
        node = milonga.open(os.environ["LOCATOR"], name="sub")
        sub = node.subscribe("gc/**")
        print("ready", flush=True)
        for event in sub:
            pass
        """
    )
    assert ready_line(child) == "ready"
    node = milonga.open(
        domain.locator, name="pub", runtime_dir=str(domain.dir), close_linger_ms=1500
    )
    pub = node.publisher("gc/big")
    wait_for("the subscriber", lambda: pub.subscriber_count() == 1)
    value = np.zeros(1 << 17)  # 1 MiB: through shared memory
    pub.put(value)
    child.send_signal(signal.SIGSTOP)
    try:
        pub.put(value)
        other = Ticker(0.001)
        other.start()
        wait_for("the other thread to run", lambda: other.ran > 0)
        before = other.ran
        started = time.monotonic()
        del pub, node
        gc.collect()
        took = time.monotonic() - started
        during = other.ran - before
        other.stop()
    finally:
        child.send_signal(signal.SIGCONT)
    assert took >= 0.5, f"no wait to look at ({took:.2f} s)"
    assert during >= 10, f"other threads ran {during} times in the {took:.2f} s the drop took"


def test_a_publisher_and_a_subscription_keep_their_node_open(domain: Domain) -> None:
    # `milonga.open(...).publisher(k)` let the node go at once: it closed,
    # and the publisher could only raise Closed.
    opened = lambda name: milonga.open(  # noqa: E731
        domain.locator, name=name, runtime_dir=str(domain.dir), transport="tcp"
    )
    pub = opened("keep-pub").publisher("keep/x")
    sub = opened("keep-sub").subscribe("keep/x")
    gc.collect()
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    pub.put(1.5)
    assert next_sample(sub).value == 1.5
    pub.close()
    sub.close()


def test_a_publisher_in_another_process_is_found_and_its_loss_reported(domain: Domain) -> None:
    node = domain.open("gui")
    sub = node.subscribe("sr/*/1/**")
    child = domain.spawn(
        """
        import os, sys, time, milonga
        with milonga.open(os.environ["LOCATOR"], name="ps") as n:
            p = n.publisher("sr/ps/1/current")
            print("ready", flush=True)
            i = 0
            while True:
                p.put(float(i)); i += 1
                time.sleep(0.01)
        """
    )
    assert ready_line(child) == "ready"
    alive = sub.recv(timeout=10)
    assert isinstance(alive, milonga.PublisherAlive)
    first = next_sample(sub)
    assert first.key == "sr/ps/1/current"
    second = next_sample(sub)
    assert second.seq == first.seq + 1 and second.value == first.value + 1
    child.send_signal(signal.SIGKILL)
    child.wait()
    while True:
        event = sub.recv(timeout=10)
        if isinstance(event, milonga.PublisherLost):
            assert event.reason == "disconnected"
            assert event.name == alive.name
            break


def test_wildcards_deliver_what_matches_and_nothing_else(domain: Domain) -> None:
    node = domain.open("sub")
    exact = node.subscribe("a/b")
    one = node.subscribe("a/*")
    many = node.subscribe("a/**")
    child = domain.spawn(
        """
        import os, time, milonga
        with milonga.open(os.environ["LOCATOR"], name="pub") as n:
            pubs = [n.publisher(k) for k in ["a/b", "a/bc", "a/x/b", "b/a"]]
            print("ready", flush=True)
            for i in range(300):
                for p in pubs:
                    p.put(i)
                time.sleep(0.005)
        """
    )
    ready_line(child)
    for sub, keys in [
        (exact, {"a/b"}),
        (one, {"a/b", "a/bc"}),
        (many, {"a", "a/b", "a/bc", "a/x/b"}),
    ]:
        seen: set[str] = set()
        end = time.monotonic() + 10
        while time.monotonic() < end and len(seen) < len(keys & {"a/b", "a/bc", "a/x/b"}):
            seen.add(next_sample(sub).key)
        assert seen == keys & {"a/b", "a/bc", "a/x/b"}, sub.key_expr
    child.wait(timeout=30)
    # What was queued meanwhile matches too.
    for sub, keys in [(exact, {"a/b"}), (one, {"a/b", "a/bc"})]:
        while (e := sub.try_recv()) is not None:
            if isinstance(e, milonga.Sample):
                assert e.key in keys


def test_best_effort_losses_are_counted_exactly(domain: Domain) -> None:
    node = domain.open("slow", recv_hwm=20)
    sub = node.subscribe("flood")
    child = domain.spawn(
        """
        import os, signal, time
        # SIGUSR1 and SIGUSR2 are taken with sigtimedwait: blocked before
        # any thread starts, they wait for it (rather than end the process).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
        import milonga
        with milonga.open(os.environ["LOCATOR"], name="flood", send_hwm=20) as n:
            p = n.publisher("flood")
            while p.subscriber_count() < 1:
                time.sleep(0.01)
            for i in range(3000):
                p.put(b"x" * 1000)
            print("sent", flush=True)
            # One more sample that gets through reveals any gap before it:
            # one now, and another each time the test asks (SIGUSR1), until
            # it says it is done (SIGUSR2; a minute without a word: a hang
            # guard).
            p.put(b"end")
            while True:
                got = signal.sigtimedwait({signal.SIGUSR1, signal.SIGUSR2}, 60)
                if got is None or got.si_signo == signal.SIGUSR2:
                    break
                p.put(b"end")
        """
    )
    # The subscription has read nothing while the publisher put its 3,000
    # samples: it fell behind (high-water marks of 20 on both sides).
    assert ready_line(child) == "sent"
    received, lost = 0, 0
    hang_guard = time.monotonic() + 30
    while True:
        assert time.monotonic() < hang_guard, 'hang guard: no "end" reached the subscription'
        try:
            event = sub.recv(timeout=0.2)
        except milonga.TimeoutError:
            # Nothing for 200 ms: the queues have drained and the last "end"
            # was dropped with the flood, so ask for another. (Had they not
            # drained, that one may be dropped too: it is counted lost like
            # the others, and another is asked for.)
            child.send_signal(signal.SIGUSR1)
            continue
        if isinstance(event, milonga.Sample):
            received += 1
            if event.value == b"end":
                last = event.seq
                break
        elif isinstance(event, milonga.Lost):
            lost += event.count
    assert lost > 0, "the subscription fell behind: it must have lost samples"
    assert last > 3000
    assert received + lost == last, "every sample up to the last received is received or lost"
    assert sub.lost == lost
    assert sum(n for _, n in sub.lost_by_publisher().items()) == lost
    child.send_signal(signal.SIGUSR2)
    assert child.wait(timeout=30) == 0


def test_reliable_mode_loses_nothing_to_a_slow_subscriber(domain: Domain) -> None:
    node = domain.open("slow", recv_hwm=20)
    sub = node.subscribe("steady", qos=milonga.SubscriberQos(queue_depth=20))
    child = domain.spawn(
        """
        import os, time, milonga
        with milonga.open(os.environ["LOCATOR"], name="rel", reliable_send_hwm=16) as n:
            p = n.publisher("steady", milonga.PublisherQos(reliable=True, put_timeout=30))
            while p.subscriber_count() < 1:
                time.sleep(0.01)
            print("ready", flush=True)
            for i in range(2000):
                p.put(i)
            print("sent", flush=True)
            time.sleep(2)
        """
    )
    ready_line(child)
    got = []
    while len(got) < 2000:
        s = next_sample(sub, timeout=20)
        got.append(s.value)
        if len(got) % 100 == 0:
            time.sleep(0.01)
    assert got == list(range(2000))
    assert sub.lost == 0
    child.wait(timeout=30)


def test_deadline_history_and_liveliness_events(domain: Domain) -> None:
    a = domain.open("dev")
    state = a.publisher("dev/state", milonga.PublisherQos(history=1))
    state.put("ON")
    state.put("OFF")
    b = domain.open("gui")
    sub = b.subscribe("dev/state", qos=milonga.SubscriberQos(last=1, deadline=0.3))
    events: list[object] = []
    while not any(isinstance(e, milonga.DeadlineMissed) for e in events):
        events.append(sub.recv(timeout=10))
    samples = [e for e in events if isinstance(e, milonga.Sample)]
    assert [s.value for s in samples] == ["OFF"], "the last kept value, once"
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("Sample") < kinds.index("SubscriptionLive")
    missed = next(e for e in events if isinstance(e, milonga.DeadlineMissed))
    assert missed.key == "dev/state" and missed.silent_for >= 0.3
    # A reliable subscription of a best-effort publication is told.
    rel = b.subscribe("dev/state", qos=milonga.SubscriberQos(reliable=True))
    while True:
        e = rel.recv(timeout=10)
        if isinstance(e, milonga.IncompatibleQos):
            assert e.key == "dev/state" and e.policy == "reliability"
            break
    a.close()
    while True:
        e = sub.recv(timeout=10)
        if isinstance(e, milonga.PublisherLost):
            assert e.reason == "closed"
            break


def test_a_callback_gets_the_events_and_survives_its_own_exceptions(
    domain: Domain, caplog: pytest.LogCaptureFixture
) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("cb/k")
    got: list[int] = []
    done = threading.Event()
    main = threading.get_ident()
    threads: set[int] = set()

    def callback(event: milonga.Event) -> None:
        if not isinstance(event, milonga.Sample):
            return
        threads.add(threading.get_ident())
        if event.value == 2:
            raise RuntimeError("boom on 2")
        got.append(event.value)
        if event.value == 4:
            done.set()

    sub = b.subscribe("cb/**", callback=callback)
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    with caplog.at_level(logging.ERROR, logger="milonga"):
        for i in range(5):
            pub.put(i)
        assert done.wait(10)
    assert got == [0, 1, 3, 4]
    assert main not in threads and len(threads) == 1, "one dispatcher thread"
    record = next(r for r in caplog.records if "raised" in r.getMessage())
    assert "'cb/k'" in record.getMessage() and "boom on 2" in caplog.text
    sub.close()


class Recording(ThreadPoolExecutor):
    """A thread pool that keeps the futures of what was submitted to it."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[Future[Any]] = []

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future = super().submit(fn, *args, **kwargs)
        self.submitted.append(future)
        return future


def test_async_for_and_a_cancelled_await_loses_nothing(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("aio/k")
    sub = b.subscribe("aio/k")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)

    async def until(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
        """`wait_for` for a coroutine: the loop runs while it polls."""
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                pytest.fail(f"timed out after {timeout} s waiting for {what}")
            await asyncio.sleep(0.001)

    async def main() -> list[int]:
        # An await on the subscription runs its `_fill` in a worker thread of
        # Milonga's pool: with a pool that keeps the futures of what it runs,
        # the test sees when one is in `_fill` and when it left.
        executor = Recording()
        monkeypatch.setattr(milonga, "_fills", executor)
        # An await cancelled while its worker thread waits for an event...
        while True:
            n = len(executor.submitted)
            waiting = asyncio.ensure_future(sub.__anext__())
            await until(
                "the await to wait on its worker thread",
                lambda: waiting.done()
                or (len(executor.submitted) > n and executor.submitted[n].running()),
            )
            if not waiting.done():
                break
            # A status event was there at once (nothing was put yet): again.
            assert not isinstance(waiting.result(), milonga.Sample)
        waiting.cancel()
        # ...and whose worker has ended its wait (its slice of 0.1 s) before
        # anything is put (the next test puts while it still waits).
        fill = executor.submitted[n]
        await until("the cancelled await's worker thread to end its wait", fill.done)
        await until("the await to be cancelled", waiting.done)
        assert waiting.cancelled()
        for i in range(10):
            pub.put(i)
        got = []
        async for event in sub:
            if isinstance(event, milonga.Sample):
                got.append(event.value)
                if len(got) == 10:
                    break
        return got

    assert asyncio.run(main()) == list(range(10))


def test_a_cancelled_await_with_samples_in_flight_loses_none_and_keeps_their_order(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancelled await's worker is still waiting when samples come: it
    takes the first one into the subscription's stash while the next await
    takes the others. Broken, the first sample is lost (taken by a worker
    whose await is gone) or comes after later ones."""
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("aio/f")
    sub = b.subscribe("aio/f")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)

    async def main() -> list[int]:
        executor = Recording()
        monkeypatch.setattr(milonga, "_fills", executor)
        rounds: list[int] = []
        for r in range(20):
            while True:
                n = len(executor.submitted)
                waiting = asyncio.ensure_future(sub.__anext__())
                end = time.monotonic() + 10
                while not (
                    waiting.done()
                    or (len(executor.submitted) > n and executor.submitted[n].running())
                ):
                    assert time.monotonic() < end, "hang guard: the await never waited"
                    await asyncio.sleep(0.001)
                if not waiting.done():
                    break
                assert not isinstance(waiting.result(), milonga.Sample)
            waiting.cancel()
            # Its worker is still in its wait: these samples race it.
            for i in range(20):
                pub.put(r * 100 + i)
            got: list[int] = []
            async for event in sub:
                if isinstance(event, milonga.Sample):
                    got.append(event.value)
                    if len(got) == 20:
                        break
            rounds.extend(got)
        return rounds

    expected = [r * 100 + i for r in range(20) for i in range(20)]
    assert asyncio.run(main()) == expected


def test_awaits_that_time_out_share_one_receive_and_leave_the_default_executor_alone(
    domain: Domain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop polling a quiet subscription with short timeouts started a
    receive of a tenth of a second in the loop's default executor at each
    await, faster than they ended: the pile grew for as long as it polled,
    and `asyncio.run` waited it out at its end. One receive at a time now,
    in Milonga's own pool."""
    a = domain.open("pub")
    b = domain.open("sub")
    pub = a.publisher("aio/p")
    sub = b.subscribe("aio/p")
    wait_for("the subscription", lambda: pub.subscriber_count() == 1)
    fills = Recording()
    default = Recording()
    monkeypatch.setattr(milonga, "_fills", fills)

    async def main() -> object:
        asyncio.get_running_loop().set_default_executor(default)
        timeouts = 0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            try:
                event = await asyncio.wait_for(sub.__anext__(), 0.01)
                assert not isinstance(event, milonga.Sample), event
            except asyncio.TimeoutError:
                timeouts += 1
            pending = [f for f in fills.submitted if not f.done()]
            assert len(pending) <= 1, f"{len(pending)} receives at once"
        assert timeouts >= 10, timeouts
        pub.put(7)
        while True:
            event = await asyncio.wait_for(sub.__anext__(), 10)
            if isinstance(event, milonga.Sample):
                return event.value

    assert asyncio.run(main()) == 7
    assert default.submitted == [], "the default executor was used"
    # A tenth of a second each, one at a time, over about a second.
    assert 1 <= len(fills.submitted) <= 15, len(fills.submitted)
