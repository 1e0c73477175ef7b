"""``python -m milonga.bench pubsub``: Milonga's Python API against raw pyzmq.

The same options and CSV columns as ``milonga bench pubsub``; ``system`` is
``milonga-py`` (a publisher putting ``bytes`` payloads, subscribers reading
``sample.value``) or ``pyzmq`` (XPUB/SUB sockets sending and receiving the
same payloads), measured in the same run. Every publisher and subscriber is
its own Python process. A publisher sends as fast as it can for
``--duration`` seconds, then end markers; a subscriber's rate is what it
received divided by the time from its first to its last arrival, and a
cell's figure is the median over its subscribers. High-water marks are
64 MiB / size (16..10000) for both systems; payloads of 64 KiB or more go
without a copy on both (pyzmq ``copy=False``; Milonga by default).

``python -m milonga.bench signals``: how long Ctrl-C takes to interrupt a
blocking ``recv`` and a blocking ``call``. Each trial starts a Python
process (``SIGNALS_CHILD``) whose main thread blocks in the call; once a
watcher thread in it sees that thread inside the native call, the bench
sends SIGINT (at a random time up to 100 ms later, so that it falls anywhere
in the 50 ms slices of the native wait) and reads when the child caught
KeyboardInterrupt. Printed: median, p99 (nearest rank) and max over
``--trials`` trials per case, in ms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

COLUMNS = "system,transport,payload_bytes,subscribers,events_per_s_per_sub,mb_per_s_per_sub,lost,sent,received"
ZERO_COPY = 64 << 10


def hwm_for(size: int) -> int:
    return max(16, min(10_000, (64 << 20) // max(size, 1)))


def free_endpoint(transport: str, tmp: str, tag: str) -> str:
    if transport == "ipc":
        return f"ipc://{tmp}/raw-{tag}.sock"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


# ---- workers (each in its own process) ----


def pyzmq_pub(role: dict[str, Any]) -> dict[str, Any]:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.XPUB)
    s.setsockopt(zmq.SNDHWM, role["hwm"])
    s.setsockopt(zmq.RCVHWM, role["hwm"])
    s.setsockopt(zmq.LINGER, 5000)
    s.setsockopt(zmq.XPUB_VERBOSE, 1)
    s.setsockopt(zmq.XPUB_NODROP, 1 if role["mode"] == "reliable" else 0)
    s.bind(role["address"])
    joined = 0
    while joined < role["subs"]:
        if s.recv()[:1] == b"\x01":
            joined += 1
    size = role["size"]
    payload = b"\xa5" * size
    copy = size < ZERO_COPY
    send = s.send
    sent = 0
    start = time.perf_counter()
    end = start + role["duration_s"]
    while time.perf_counter() < end:
        for _ in range(64):
            send(payload, copy=copy)
        sent += 64
    seconds = time.perf_counter() - start
    end_markers(lambda: _try(lambda: s.send(b"", zmq.DONTWAIT)))
    s.close()
    ctx.term()
    return {"sent": sent, "seconds": seconds}


def pyzmq_sub(role: dict[str, Any]) -> dict[str, Any]:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, role["hwm"])
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVTIMEO, int(role["deadline_s"] * 1000))
    s.connect(role["address"])
    copy = role["size"] < ZERO_COPY
    recv = s.recv
    clock = time.perf_counter
    received, first, last = 0, 0.0, 0.0
    try:
        while True:
            m = recv(copy=copy)
            if len(m) == 0:
                break
            last = clock()
            if received == 0:
                first = last
            received += 1
    except zmq.Again:
        pass
    s.close(linger=0)
    ctx.term()
    return {"received": received, "seconds": last - first}


def _milonga_node(role: dict[str, Any], name: str) -> Any:
    import milonga

    return milonga.open(
        role["address"],
        name=name,
        runtime_dir=role["runtime_dir"],
        transport=role["transport"],
        send_hwm=role["hwm"],
        recv_hwm=role["hwm"],
        close_linger_ms=5000,
        shared_memory=role.get("shared_memory", True),
    )


def milonga_pub(role: dict[str, Any]) -> dict[str, Any]:
    import milonga

    node = _milonga_node(role, "bench-pub")
    qos = milonga.PublisherQos(reliable=role["mode"] == "reliable", history=role["history"])
    p = node.publisher("bench/data", qos)
    give_up = time.monotonic() + 30
    while p.subscriber_count() < role["subs"]:
        if time.monotonic() > give_up:
            raise SystemExit(f"only {p.subscriber_count()} of {role['subs']} subscribers joined")
        time.sleep(0.002)
    payload = b"\xa5" * role["size"]
    put = p.put
    sent = 0
    start = time.perf_counter()
    end = start + role["duration_s"]
    if role.get("loans"):
        # A loan taken and put as it is, as a driver writing straight into
        # it would (its own writing left out, as in `milonga bench`).
        size, loan, put_loan = role["size"], p.loan, p.put_loan
        while time.perf_counter() < end:
            for _ in range(64):
                put_loan(loan(size))
            sent += 64
    else:
        while time.perf_counter() < end:
            for _ in range(64):
                put(payload)
            sent += 64
    seconds = time.perf_counter() - start
    end_markers(lambda: _try(lambda: p.try_put(b"")))
    node.close()
    return {"sent": sent, "seconds": seconds}


def milonga_sub(role: dict[str, Any]) -> dict[str, Any]:
    import milonga

    node = _milonga_node(role, "bench-sub")
    sub = node.subscribe("bench/data")
    recv = sub.recv
    Sample = milonga.Sample
    clock = time.perf_counter
    received, lost, first, last = 0, 0, 0.0, 0.0
    # Like the pyzmq subscriber's RCVTIMEO: a fixed timeout per receive.
    timeout = role["deadline_s"]
    try:
        while True:
            ev = recv(timeout)
            if type(ev) is Sample:
                if len(ev.value) == 0:
                    break
                last = clock()
                if received == 0:
                    first = last
                received += 1
            elif type(ev) is milonga.Lost:
                lost += ev.count
    except milonga.TimeoutError:
        pass
    node.close()
    return {"received": received, "seconds": last - first, "lost_reported": lost}


def _try(f: Any) -> bool:
    try:
        f()
        return True
    except Exception:
        return False


def end_markers(send: Any) -> None:
    """Sends end markers for 2 s (best effort may drop some)."""
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        send()
        time.sleep(0.01)


WORKERS = {
    "pyzmq-pub": pyzmq_pub,
    "pyzmq-sub": pyzmq_sub,
    "milonga-py-pub": milonga_pub,
    "milonga-py-sub": milonga_sub,
    "mlg-py-sock-pub": milonga_pub,
    "mlg-py-sock-sub": milonga_sub,
    "mlg-py-loan-pub": milonga_pub,
    "mlg-py-loan-sub": milonga_sub,
}


# ---- the driver ----


def run_cell(system: str, role: dict[str, Any], subs: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    def start(kind: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "milonga.bench", "_worker", json.dumps({**role, "kind": kind})],
            stdout=subprocess.PIPE,
            text=True,
        )

    # pyzmq: the publisher binds first. Milonga: either order works.
    pub = start(f"{system}-pub")
    if system == "pyzmq":
        time.sleep(0.2)
    subs_p = [start(f"{system}-sub") for _ in range(subs)]
    outs = []
    for p in [pub, *subs_p]:
        out, _ = p.communicate(timeout=role["deadline_s"] + 60)
        if p.returncode != 0:
            raise SystemExit(f"a {system} worker failed (exit {p.returncode})")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs[0], outs[1:]


def pubsub(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m milonga.bench pubsub")
    ap.add_argument("--sizes", default="92,4096,1048576", help="payload sizes in bytes")
    ap.add_argument("--subs", default="1,2,5,10", help="numbers of subscriber processes")
    ap.add_argument("--mode", choices=["reliable", "best-effort"], default="reliable")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds of sending per cell")
    ap.add_argument("--baseline", choices=["raw-zmq", "pyzmq", "none"], default="pyzmq",
                    help="raw pyzmq in the same run (raw-zmq is accepted as a synonym)")
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--format", choices=["table", "csv"], default="table")
    ap.add_argument("--transport", choices=["tcp", "ipc"], default="tcp")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",")]
    subs_list = [int(x) for x in a.subs.split(",")]
    import milonga

    if a.baseline != "none":
        try:
            import zmq  # noqa: F401
        except ImportError:
            raise SystemExit(
                "the pyzmq baseline needs pyzmq: pip install 'milonga[bench]' "
                "(or run with --baseline none)"
            ) from None

    print(
        f"# python -m milonga.bench pubsub: transport {a.transport}, mode {a.mode}, "
        f"{a.duration} s per cell, hwm = 64 MiB / size (16..10000) for both systems "
        f"(a reliable milonga publisher: reliable_send_hwm = 16 messages, a message being "
        f"a sample or a batch <= 128 KiB); "
        f"every publisher and subscriber a Python {sys.version.split()[0]} process; "
        f"milonga-py {milonga.__version__} puts bytes and reads sample.value "
        f"(from 64 KiB on through shared memory; mlg-py-sock: with it off; "
        f"mlg-py-loan: puts loans as taken, unfilled), "
        f"pyzmq sends and receives bytes (copy=False from 64 KiB)",
        file=sys.stderr,
    )
    print(
        "# events_per_s_per_sub = median over subscribers of received / (last - first arrival); "
        "MB = 10^6 bytes; sent = the publisher's puts (pyzmq: sends), received = summed over "
        "subscribers, lost = sent - received, summed over subscribers (received > sent is flagged)",
        file=sys.stderr,
    )
    if a.format == "csv":
        print(COLUMNS, flush=True)
    else:
        print(
            f"{'system':<11} {'transp':>6} {'bytes':>9} {'subs':>5} {'events/s/sub':>14} "
            f"{'MB/s/sub':>10} {'lost':>8} {'sent':>10} {'received':>10}",
            flush=True,
        )
    tmp = tempfile.mkdtemp(prefix="mlg-pybench-")
    systems = ["milonga-py"] if a.baseline == "none" else ["pyzmq", "milonga-py"]
    # Large payloads on one host go through shared memory
    # (docs/shared-memory.md): from 64 KiB on, the same cells with it off,
    # and with loans (no copy at all).
    systems += ["mlg-py-sock", "mlg-py-loan"]
    cell = 0
    for size in sizes:
        for subs in subs_list:
            for system in systems:
                if system.startswith("mlg-py-") and size < 65536:
                    continue
                cell += 1
                role = {
                    "size": size,
                    "subs": subs,
                    "mode": a.mode,
                    "duration_s": a.duration,
                    "history": a.history,
                    "hwm": hwm_for(size),
                    "transport": a.transport,
                    "runtime_dir": tmp,
                    "deadline_s": a.duration + 20 + size / 1e6,
                    "address": free_endpoint(a.transport, tmp, str(cell))
                    if system == "pyzmq"
                    else f"milonga:///pybench-{os.getpid()}-{cell}",
                    "shared_memory": system != "mlg-py-sock",
                    "loans": system == "mlg-py-loan",
                }
                pub, subs_out = run_cell(system, role, subs)
                sent = pub["sent"]
                lost = sum(max(0, sent - s["received"]) for s in subs_out)
                received = sum(s["received"] for s in subs_out)
                rates = [s["received"] / s["seconds"] if s["seconds"] > 0 else 0.0 for s in subs_out]
                rate = statistics.median(rates)
                mb = rate * size / 1e6
                if a.format == "csv":
                    print(f"{system},{a.transport},{size},{subs},{rate:.0f},{mb:.2f},{lost},{sent},{received}", flush=True)
                else:
                    print(
                        f"{system:<11} {a.transport:>6} {size:>9} {subs:>5} {rate:>14.0f} "
                        f"{mb:>10.2f} {lost:>8} {sent:>10} {received:>10}",
                        flush=True,
                    )
                if any(s["received"] > sent for s in subs_out):
                    print(f"# note: {system} {size} B x{subs}: a subscriber received more than the {sent} sent: duplicates", file=sys.stderr)
                reported = sum(s.get("lost_reported", 0) for s in subs_out)
                if reported > lost:
                    print(f"# note: {system} subscribers reported {reported} lost (gaps), more than sent - received = {lost}", file=sys.stderr)


# ---- signals: Ctrl-C during a blocking call ----

#: The child of ``signals``, and of tests/test_signals.py (which checks the
#: outcome that this bench times): ``python -c SIGNALS_CHILD recv|call``, with
#: ``LOCATOR`` in its environment (also ``call_all`` and ``close``). Its
#: main thread blocks in ``sub.recv()`` on a key nobody publishes, in
#: ``node.call()`` or ``node.call_all()`` of its own service, whose handler
#: sleeps 30 s (the call's timeout is 60 s), or in that service's
#: ``close()`` while a call from another thread runs the handler. It prints ``blocked`` once
#: that thread is inside the native call, then ``interrupted <t>`` (``t`` =
#: ``time.monotonic()`` where KeyboardInterrupt is caught) or ``returned`` if
#: the call ended by itself.
SIGNALS_CHILD = """
import dis, os, signal, sys, threading, time, milonga

# Python raises KeyboardInterrupt on SIGINT unless SIGINT was ignored when it
# started, as it is for a background job of a non-interactive shell (CI):
# install the interactive behaviour explicitly.
signal.signal(signal.SIGINT, signal.default_int_handler)
n = milonga.open(os.environ["LOCATOR"], name="blocked")
if sys.argv[1] == "recv":
    sub = n.subscribe("nothing/ever")
    block = lambda: sub.recv()
else:
    started = threading.Event()
    def slow(req):
        started.set()
        time.sleep(30)
    svc = n.serve("lab/slow", slow)
    while not any(s["key"] == "lab/slow" for p in n.peers() for s in p.get("services", [])):
        time.sleep(0.01)
    if sys.argv[1] == "call":
        block = lambda: n.call("lab/slow", 1, timeout=60)
    elif sys.argv[1] == "call_all":
        block = lambda: n.call_all("lab/slow", 1, timeout=60)
    else:
        # close: a handler runs (a call from another thread), and closing
        # the service waits for it to finish.
        threading.Thread(target=lambda: n.call("lab/slow", 1, timeout=60), daemon=True).start()
        started.wait(10)
        block = lambda: svc.close()

# Evidence that the main thread is blocked inside the call, not about to
# enter it: a watcher thread samples the main thread's innermost Python
# frame. The native recv/call has no frame of its own, so while it runs that
# frame is the lambda's, at its call instruction. And the watcher runs only
# while the main thread has given up the GIL, which the interpreter does
# between instructions, not within one: seen at the call instruction, the
# main thread is in the native call's wait (it releases the GIL for slices of
# 50 ms and checks for signals between them), where SIGINT must interrupt it.
def watch():
    main = threading.main_thread().ident
    calls = [i.offset for i in dis.get_instructions(block) if i.opname in ("PRECALL", "CALL")]
    while True:
        frame = sys._current_frames().get(main)
        if frame is not None and frame.f_code is block.__code__ and frame.f_lasti >= min(calls):
            print("blocked", flush=True)
            return
        time.sleep(0.001)

threading.Thread(target=watch, daemon=True).start()
try:
    block()
except KeyboardInterrupt:
    print(f"interrupted {time.monotonic():.6f}", flush=True)
else:
    print("returned", flush=True)
# (A handler still sleeping would hold up a clean close for 30 s.)
os._exit(0)
"""

SIGNALS_COLUMNS = "case,trials,p50_ms,p99_ms,max_ms"
#: SIGINT goes at a random time up to this long after the child is blocked.
SIGNAL_SPREAD_S = 0.1


def first_line(p: subprocess.Popen[str], timeout: float) -> str:
    """The first line `p` prints, waiting at most `timeout` seconds."""
    assert p.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise SystemExit(f"a signals child printed nothing in {timeout} s")
    return p.stdout.readline().strip()


def signal_trial(case: str, runtime_dir: str, tag: str) -> float:
    """Seconds from just before SIGINT is sent to a child blocked in `case`
    to its KeyboardInterrupt (CLOCK_MONOTONIC is the same in both)."""
    env = dict(os.environ)
    env["MILONGA_RUNTIME_DIR"] = runtime_dir
    env["MILONGA_TRANSPORT"] = "tcp"
    # A domain per trial: a child killed before it could say goodbye leaves
    # nothing (a service, above all) for the next one to find.
    env["LOCATOR"] = f"milonga:///pybench-signals-{os.getpid()}-{tag}"
    child = subprocess.Popen(
        [sys.executable, "-c", SIGNALS_CHILD, case],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = first_line(child, 60)
        if ready != "blocked":
            _, err = child.communicate(timeout=60)
            raise SystemExit(f"a signals child ({case}) printed {ready!r}, not 'blocked': {err}")
        # As a user's Ctrl-C would, land anywhere in the native wait's 50 ms
        # slices: sent at once, SIGINT would always come at a slice's start.
        time.sleep(random.uniform(0.0, SIGNAL_SPREAD_S))
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    words = (out.splitlines() or [""])[0].split()
    if child.returncode != 0 or words[:1] != ["interrupted"]:
        raise SystemExit(f"a signals child ({case}) was not interrupted: {out!r} {err}")
    return float(words[1]) - sent


def nearest_rank(sorted_values: list[float], q: float) -> float:
    """The `q` quantile of `sorted_values` by the nearest-rank method."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def signals(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m milonga.bench signals")
    ap.add_argument("--trials", type=int, default=20, help="trials per case (recv, call)")
    ap.add_argument("--format", choices=["table", "csv"], default="table")
    a = ap.parse_args(argv)
    if a.trials < 1:
        ap.error("--trials must be at least 1")
    import milonga

    print(
        f"# python -m milonga.bench signals: milonga-py {milonga.__version__}, Python "
        f"{sys.version.split()[0]}, {a.trials} trials per case, a new child process each; "
        f"its main thread blocks in sub.recv() (nothing published) or node.call() (its own "
        f"handler sleeps 30 s); SIGINT is sent at a random time 0-"
        f"{SIGNAL_SPREAD_S * 1000:.0f} ms after a watcher thread in the child sees that "
        f"thread inside the native call",
        file=sys.stderr,
    )
    print(
        "# ms from just before os.kill(SIGINT) in the bench to the child's except "
        "KeyboardInterrupt (time.monotonic() in both); p99 by nearest rank (the max "
        "below 100 trials)",
        file=sys.stderr,
    )
    if a.format == "csv":
        print(SIGNALS_COLUMNS, flush=True)
    else:
        print(f"{'case':<6} {'trials':>6} {'p50_ms':>8} {'p99_ms':>8} {'max_ms':>8}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mlg-pybench-") as tmp:
        for case in ["recv", "call"]:
            ms = sorted(
                1000 * signal_trial(case, tmp, f"{case}-{i}") for i in range(a.trials)
            )
            p50, p99, top = statistics.median(ms), nearest_rank(ms, 0.99), ms[-1]
            if a.format == "csv":
                print(f"{case},{a.trials},{p50:.1f},{p99:.1f},{top:.1f}", flush=True)
            else:
                print(f"{case:<6} {a.trials:>6} {p50:>8.1f} {p99:>8.1f} {top:>8.1f}", flush=True)


MODES = {"pubsub": pubsub, "signals": signals}


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "_worker":
        role = json.loads(argv[1])
        print(json.dumps(WORKERS[role["kind"]](role)), flush=True)
        return
    if not argv or argv[0] not in MODES:
        raise SystemExit(
            "usage: python -m milonga.bench {pubsub,signals} [options] (--help for the options)"
        )
    MODES[argv[0]](argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
