"""A peer written from docs/protocol.md alone, with pyzmq and the standard
library (no Milonga code on its side), against Milonga's own nodes: what an
outside implementer gets by following the document.

- A raw subscriber reads a Milonga publisher: it finds the publisher's
  announcement file (§9.3), connects to its data endpoint (§2), subscribes
  with the prefix of §3, and decodes each frame (§4: key, 44-byte header,
  domain tag, CBOR body, §5).
- A raw publisher is read by a Milonga subscription: it binds its sockets,
  writes its announcement (§9.2, §9.3), sends heartbeats (§4.1) and samples,
  then a goodbye, and the subscription sees it come, its samples and
  numbers, and go (`closed`).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import zmq

import milonga
from conftest import Domain, wait_for

HEADER = struct.Struct("<BBBBII16sQQ")  # §4: 44 bytes, little-endian
assert HEADER.size == 44


def domain_tag(name: str) -> int:
    """§4 "Domain tag": FNV-1a 32 of the domain name."""
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) % 2**32
    return h


def test_the_domain_tag_of_the_worked_example() -> None:
    # §4.3
    assert domain_tag("lab") == 0x626092F4
    assert domain_tag("") == 0x811C9DC5


def frame(key: str, kind: int, domain: str, node: bytes, seq: int, ts: int, body: bytes) -> bytes:
    """Frame 1 of a single-frame data message, encoding CBOR (§4)."""
    head = HEADER.pack(1, kind, 0, 1, domain_tag(domain), 0, node, seq, ts)
    return key.encode() + b"\x00" + head + body


def cbor_float(x: float) -> bytes:
    """§5: a float is always written as float64, `fb` and 8 bytes."""
    return b"\xfb" + struct.pack(">d", x)


def cbor_leaving(leaving: bool) -> bytes:
    """A heartbeat body (§4.1): the CBOR map {"leaving": bool}."""
    return b"\xa1" + b"\x67leaving" + (b"\xf5" if leaving else b"\xf4")


def next_event(sub: milonga.Subscription, timeout: float) -> object | None:
    """The subscription's next event, or None if none comes within
    `timeout` seconds."""
    try:
        return sub.recv(timeout=timeout)
    except milonga.TimeoutError:
        return None


def domain_name(domain: Domain) -> str:
    return domain.locator.removeprefix("milonga:///")


def announcement_of(domain: Domain, key: str) -> dict[str, Any]:
    """§9.3: the announcement file in `<root>/<domain>/` of the node that
    publishes `key`, once one is there."""
    found: list[dict[str, Any]] = []

    def announced() -> bool:
        for f in (domain.dir / domain_name(domain)).glob("*.json"):
            a = json.loads(f.read_text())
            if any(p["key"] == key for p in a["publications"]):
                found.append(a)
                return True
        return False

    wait_for(f"the announcement of {key}", announced)
    return found[0]


def raw_announcement(
    domain: Domain, node: bytes, what: str, control: str, **endpoints: object
) -> dict[str, Any]:
    """§9.2: a raw node's announcement (`name` `what@host:pid`), its
    `data_best_effort`, `data_reliable`, `liveliness`, `publications`,
    `services` and `start_time` as given (none, empty or 0 by default)."""
    host = socket.gethostname()
    a: dict[str, Any] = {
        "protocol": 1,
        "domain": domain_name(domain),
        "node_id": node.hex(),
        "name": f"{what}@{host}:{os.getpid()}",
        "host": host,
        "pid": os.getpid(),
        "start_time": 0,
        "control": control,
        "data_best_effort": None,
        "data_reliable": None,
        "liveliness": None,
        "publications": [],
    }
    a.update(endpoints)
    return a


def write_announcement(domain: Domain, a: dict[str, Any]) -> Path:
    """§9.3: `a` written to `<root>/<domain>/.<id>.tmp`, then renamed to
    `<id>.json`; the domain's directory."""
    d = domain.dir / domain_name(domain)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{a['node_id']}.tmp"
    tmp.write_text(json.dumps(a, indent=2))
    tmp.rename(d / f"{a['node_id']}.json")
    return d


def start_time() -> int:
    """§9.2: field 22 of /proc/<pid>/stat (after the command in parentheses)."""
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def test_a_raw_subscriber_reads_a_milonga_publisher(domain: Domain) -> None:
    node = domain.open("pub")
    pub = node.publisher("sr/raw/x")
    name = domain_name(domain)
    # §9.3: <root>/<domain>/<node id hex>.json, the node that publishes it.
    a = announcement_of(domain, "sr/raw/x")
    assert a["protocol"] == 1 and a["domain"] == name
    ctx = zmq.Context()
    try:
        got = read_raw(ctx, a, pub, name)
    finally:
        ctx.destroy(linger=0)
    # §6: numbers from 1, one a sample; the value is the one put with it.
    for s, v, _ in got:
        assert v == s - 1 + 0.5, got
    seqs = [s for s, _, _ in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def read_raw(
    ctx: zmq.Context[zmq.Socket[bytes]], a: dict[str, Any], pub: milonga.Publisher, name: str
) -> list[tuple[int, float, int]]:
    """Twenty samples of sr/raw/x read on a SUB of `a`'s best-effort data
    socket, each put as the raw side waits: (seq, value, timestamp)."""
    sub = ctx.socket(zmq.SUB)
    try:
        return read_from(sub, a, pub, name)
    finally:
        sub.close()


def read_from(
    sub: zmq.Socket[bytes], a: dict[str, Any], pub: milonga.Publisher, name: str
) -> list[tuple[int, float, int]]:
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(a["data_best_effort"])
    # §3: a literal expression subscribes to its key and a NUL.
    sub.setsockopt(zmq.SUBSCRIBE, b"sr/raw/x\x00")
    wait_for("the raw subscription", lambda: pub.subscriber_count() == 1)
    got: list[tuple[int, float, int]] = []
    sent = 0
    end = time.monotonic() + 20
    while len(got) < 20:
        assert time.monotonic() < end, got
        pub.put(float(sent) + 0.5)
        sent += 1
        if not sub.poll(20):
            continue
        while sub.poll(0):
            msg = sub.recv_multipart()
            assert len(msg) == 1, "a float takes no payload frame"
            f1 = msg[0]
            nul = f1.index(b"\x00")
            assert f1[:nul] == b"sr/raw/x"
            version, kind, flags, enc, tag, schema, nid, seq, ts = HEADER.unpack_from(f1, nul + 1)
            assert (version, kind, flags, enc, schema) == (1, 1, 0, 1, 0)
            assert tag == domain_tag(name)
            assert nid.hex() == a["node_id"]
            assert abs(ts - time.time_ns()) < 60 * 10**9
            body = f1[nul + 1 + 44 :]
            assert body[0] == 0xFB and len(body) == 9
            got.append((seq, struct.unpack(">d", body[1:])[0], ts))
    return got


def test_a_milonga_subscription_reads_a_raw_publisher(domain: Domain) -> None:
    name = domain_name(domain)
    reader = domain.open("reader")
    sub = reader.subscribe("sr/raw/**")
    ctx = zmq.Context()
    data = ctx.socket(zmq.XPUB)
    live = ctx.socket(zmq.XPUB)
    live.setsockopt(zmq.XPUB_VERBOSE, 1)
    control = ctx.socket(zmq.ROUTER)
    for s in (data, live, control):
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://127.0.0.1:*")
    node = uuid.uuid4().bytes

    def endpoint(s: zmq.Socket[bytes]) -> str:
        return s.getsockopt_string(zmq.LAST_ENDPOINT)

    announcement = raw_announcement(
        domain,
        node,
        "raw",
        endpoint(control),
        start_time=start_time(),
        data_best_effort=endpoint(data),
        liveliness=endpoint(live),
        publications=[{"key": "sr/raw/y", "reliability": "best_effort", "history": 0}],
    )
    d = write_announcement(domain, announcement)
    try:
        # The subscription's prefix reaches the data XPUB (§3: `sr/` for
        # `sr/raw/**`), and its liveliness subscription the liveliness one.
        subscribed: list[bytes] = []
        end = time.monotonic() + 20
        while not any(p.startswith(b"\x01sr/") for p in subscribed):
            assert time.monotonic() < end, subscribed
            if data.poll(50):
                subscribed.append(data.recv())
        # §4.1: a heartbeat at once when the liveliness subscription
        # comes, then every `heartbeat_interval_ms` (1 s; here every 0.5 s)
        # while the test waits.
        while not live.poll(100) or not live.recv().startswith(b"\x01@hb\x00"):
            assert time.monotonic() < end, "no liveliness subscription"
        hb = [0, 0.0]

        def heartbeat(leaving: bool = False) -> None:
            if leaving or time.monotonic() - hb[1] >= 0.5:
                hb[0] += 1
                hb[1] = time.monotonic()
                body = cbor_leaving(leaving)
                live.send(frame("@hb", 3, name, node, int(hb[0]), time.time_ns(), body))

        heartbeat()
        stamps = []
        for seq in range(1, 6):
            ts = time.time_ns()
            stamps.append(ts)
            data.send(frame("sr/raw/y", 1, name, node, seq, ts, cbor_float(seq * 1.25)))
        # A gap (§6): seq 8 after 5, two samples lost.
        data.send(frame("sr/raw/y", 1, name, node, 8, time.time_ns(), cbor_float(10.0)))
        # A batch (kind 2, §4): seq 9, 10, 11, each entry its length, its
        # timestamp and its payload; the header's timestamp the first's.
        batch_ts = [time.time_ns() + i for i in range(3)]
        entries = b"".join(
            struct.pack("<IQ", 9, t) + cbor_float(11.0 + i) for i, t in enumerate(batch_ts)
        )
        data.send(frame("sr/raw/y", 2, name, node, 9, batch_ts[0], entries))
        events: list[Any] = []
        end = time.monotonic() + 20
        while sum(isinstance(e, milonga.Sample) for e in events) < 9:
            assert time.monotonic() < end, events
            heartbeat()
            e = next_event(sub, 0.2)
            if e is not None:
                events.append(e)
        samples = [e for e in events if isinstance(e, milonga.Sample)]
        assert [(s.key, s.seq, s.value) for s in samples] == [
            ("sr/raw/y", 1, 1.25),
            ("sr/raw/y", 2, 2.5),
            ("sr/raw/y", 3, 3.75),
            ("sr/raw/y", 4, 5.0),
            ("sr/raw/y", 5, 6.25),
            ("sr/raw/y", 8, 10.0),
            ("sr/raw/y", 9, 11.0),
            ("sr/raw/y", 10, 12.0),
            ("sr/raw/y", 11, 13.0),
        ]
        assert [s.timestamp_ns for s in samples[:5]] == stamps
        assert [s.timestamp_ns for s in samples[6:]] == batch_ts
        assert all(s.publisher == node.hex() for s in samples)
        alive = [e for e in events if isinstance(e, milonga.PublisherAlive)]
        assert alive and alive[0].publisher == node.hex()
        assert alive[0].name == announcement["name"]
        lost = [e for e in events if isinstance(e, milonga.Lost)]
        assert [(x.first_seq, x.count) for x in lost] == [(6, 2)]
        # The goodbye (§4.1), then the file goes (§9.3): told `closed`.
        heartbeat(leaving=True)
        (d / f"{node.hex()}.json").unlink()
        end = time.monotonic() + 20
        while True:
            assert time.monotonic() < end, "no publisher_lost"
            e = next_event(sub, 1.0)
            if isinstance(e, milonga.PublisherLost):
                assert (e.publisher, e.reason) == (node.hex(), "closed")
                break
        assert reader.stats()["frames_malformed"] == 0
    finally:
        (d / f"{node.hex()}.json").unlink(missing_ok=True)
        ctx.destroy(linger=0)


MAGIC = b"MILONGA-BRK/1"  # §11.2


def broker_hello(
    ctx: zmq.Context[zmq.Socket[bytes]], domain: Domain
) -> tuple[str, zmq.Socket[bytes], dict[str, Any]]:
    """A broker started for the domain: its locator, a DEALER connected to
    its listen endpoint, and its answer to `hello` (§11.2)."""
    from test_broker import start_broker

    _, locator = start_broker(domain)
    req = ctx.socket(zmq.DEALER)
    req.setsockopt(zmq.LINGER, 0)
    req.connect("tcp://" + locator.removeprefix("milonga://").split("/")[0])
    req.send_multipart([MAGIC, b"hello", domain_name(domain).encode()])
    assert req.poll(10_000), "no answer to hello"
    magic, what, body = req.recv_multipart()
    assert (magic, what) == (MAGIC, b"hello"), body
    hello = json.loads(body)
    assert hello["domain"] == domain_name(domain)
    return locator, req, hello


def test_a_raw_broker_client_publishes_to_a_milonga_client_of_the_broker(domain: Domain) -> None:
    name = domain_name(domain)
    ctx = zmq.Context()
    try:
        # hello (§11.2): the broker's sockets for the domain.
        locator, req, hello = broker_hello(ctx, domain)
        reader = milonga.open(locator, name="reader", runtime_dir=str(domain.dir))
        domain.nodes.append(reader)
        sub = reader.subscribe("sr/raw/**")
        # The client's data and liveliness XPUBs connect to the broker's `_in`
        # sockets (§11.1); it announces the `_out` ones, tagged with its id
        # (§11.2 "What a client announces", §11.3).
        data = ctx.socket(zmq.XPUB)
        live = ctx.socket(zmq.XPUB)
        live.setsockopt(zmq.XPUB_VERBOSE, 1)
        control = ctx.socket(zmq.ROUTER)
        for s in (data, live, control):
            s.setsockopt(zmq.LINGER, 0)
        data.connect(hello["data_best_effort_in"])
        live.connect(hello["liveliness_in"])
        control.bind("tcp://127.0.0.1:*")
        node = uuid.uuid4().bytes
        announcement = raw_announcement(
            domain,
            node,
            "rawclient",
            control.getsockopt_string(zmq.LAST_ENDPOINT),
            data_best_effort=f"{hello['data_best_effort_out']}#{node.hex()}",
            liveliness=f"{hello['liveliness_out']}#{node.hex()}",
            publications=[{"key": "sr/raw/b", "reliability": "best_effort", "history": 0}],
        )
        key = uuid.uuid4().hex
        view = [b"0"]

        def attach() -> None:
            """§11.2: attach, the view held, no report, the client key; the
            reply read if there is one."""
            req.send_multipart(
                [MAGIC, b"attach", json.dumps(announcement).encode(), view[0], b"", key.encode()]
            )
            while req.poll(0):
                reply = req.recv_multipart()
                assert reply[1] in (b"view", b"same"), reply
                view[0] = reply[2]

        end = time.monotonic() + 20
        while view[0] == b"0":
            assert time.monotonic() < end, "no view"
            attach()
            req.poll(100)
        last_attach = time.monotonic()
        subscribed: list[bytes] = []
        end = time.monotonic() + 20
        while not any(p.startswith(b"\x01sr/") for p in subscribed):
            assert time.monotonic() < end, subscribed
            if time.monotonic() - last_attach > hello["attach_interval_ms"] / 1000:
                attach()
                last_attach = time.monotonic()
            if data.poll(50):
                subscribed.append(data.recv())
        got: list[milonga.Sample] = []
        seq = 0
        hb = 0
        end = time.monotonic() + 20
        while len(got) < 5:
            assert time.monotonic() < end, got
            if time.monotonic() - last_attach > hello["attach_interval_ms"] / 1000:
                attach()
                last_attach = time.monotonic()
                hb += 1
                live.send(frame("@hb", 3, name, node, hb, time.time_ns(), cbor_leaving(False)))
            seq += 1
            data.send(frame("sr/raw/b", 1, name, node, seq, time.time_ns(), cbor_float(seq / 4)))
            e = next_event(sub, 0.05)
            if isinstance(e, milonga.Sample):
                got.append(e)
        assert all(s.key == "sr/raw/b" and s.publisher == node.hex() for s in got)
        assert all(s.value == s.seq / 4 for s in got), [(s.seq, s.value) for s in got]
        # detach (§11.2): the broker withdraws it at once.
        req.send_multipart([MAGIC, b"detach", node.hex().encode(), key.encode()])
        wait_for(
            "the raw client gone from the reader's view",
            lambda: node.hex() not in {a["node_id"] for a in reader.peers()},
        )
    finally:
        ctx.destroy(linger=0)


def cbor_text_map(b: bytes) -> dict[str, str]:
    """A CBOR map of short text to short text (§4.5's failure map),
    decoded by hand: heads of major types 5 and 3, lengths under 24 or in
    one byte (0x18)."""

    def head(i: int, major: int) -> tuple[int, int]:
        assert b[i] >> 5 == major, (b.hex(), i)
        n = b[i] & 0x1F
        if n < 24:
            return n, i + 1
        assert n == 24, b.hex()
        return b[i + 1], i + 2

    def text(i: int) -> tuple[str, int]:
        n, i = head(i, 3)
        return b[i : i + n].decode(), i + n

    pairs, i = head(0, 5)
    out = {}
    for _ in range(pairs):
        k, i = text(i)
        v, i = text(i)
        out[k] = v
    assert i == len(b)
    return out


def test_a_raw_caller_gets_every_outcome_of_a_milonga_service(domain: Domain) -> None:
    name = domain_name(domain)
    server = domain.open("server")

    def fail(req: milonga.Request) -> object:
        raise RuntimeError("no beam")

    server.serve("sr/raw/double", lambda req: req.value * 2)
    server.serve("sr/raw/fail", fail)
    found: dict[str, str] = {}

    def announced() -> bool:
        for f in (domain.dir / name).glob("*.json"):
            a = json.loads(f.read_text())
            for s in a.get("services", []):
                found[s["key"]] = s["endpoint"]
            if len(found) == 2:
                found["node"] = a["node_id"]
                return True
        return False

    wait_for("the services' announcement", announced)
    ctx = zmq.Context()
    caller = uuid.uuid4().bytes

    def call(endpoint: str, key: str, seq: int, body: bytes, dom: str = name) -> tuple[int, bytes]:
        """§4.5: a request (kind 5) on a DEALER; the reply's status and rest."""
        d = ctx.socket(zmq.DEALER)
        try:
            d.setsockopt(zmq.LINGER, 0)
            d.connect(endpoint)
            d.send(frame(key, 5, dom, caller, seq, time.time_ns(), body))
            assert d.poll(10_000), f"no reply to {key}"
            msg = d.recv_multipart()
        finally:
            d.close()
        assert len(msg) == 1
        f1 = msg[0]
        nul = f1.index(b"\x00")
        assert f1[:nul] == key.encode()
        version, kind, flags, _enc, _tag, _schema, nid, rseq, _ts = HEADER.unpack_from(f1, nul + 1)
        assert (version, kind, flags, rseq) == (1, 6, 0, seq)
        assert nid.hex() == found["node"]
        body = f1[nul + 1 + 44 :]
        return body[0], body[1:]

    try:
        status, rest = call(found["sr/raw/double"], "sr/raw/double", 1, cbor_float(2.5))
        assert (status, rest) == (0, cbor_float(5.0))
        status, rest = call(found["sr/raw/fail"], "sr/raw/fail", 2, cbor_float(1.0))
        assert status == 1
        failure = cbor_text_map(rest)
        assert "no beam" in failure["message"], failure
        # Another domain's tag: rejected (status 2, `wrong_domain`).
        status, rest = call(found["sr/raw/double"], "sr/raw/double", 3, cbor_float(1.0), "other")
        assert (status, cbor_text_map(rest)["kind"]) == (2, "wrong_domain")
        # A request the value of which does not decode: `bad_request`.
        status, rest = call(found["sr/raw/double"], "sr/raw/double", 4, b"\xff\xff")
        assert (status, cbor_text_map(rest)["kind"]) == (2, "bad_request")
        # Another key on that service's socket: status 3.
        status, rest = call(found["sr/raw/double"], "sr/raw/other", 5, cbor_float(1.0))
        assert (status, cbor_text_map(rest)["kind"]) == (3, "no_such_service")
    finally:
        ctx.destroy(linger=0)


def test_a_milonga_caller_calls_a_raw_server(domain: Domain) -> None:
    name = domain_name(domain)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    live = ctx.socket(zmq.XPUB)
    control = ctx.socket(zmq.ROUTER)
    for s in (router, live, control):
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://127.0.0.1:*")
    node = uuid.uuid4().bytes
    announcement = raw_announcement(
        domain,
        node,
        "rawserver",
        control.getsockopt_string(zmq.LAST_ENDPOINT),
        start_time=start_time(),
        liveliness=live.getsockopt_string(zmq.LAST_ENDPOINT),
        services=[
            {
                "key": "sr/raw/add1",
                "endpoint": router.getsockopt_string(zmq.LAST_ENDPOINT),
                "workers": 1,
                "max_request_bytes": 65536,
            }
        ],
    )
    d = write_announcement(domain, announcement)
    caller = domain.open("caller")
    wait_for(
        "the raw server in the caller's view",
        lambda: node.hex() in {a["node_id"] for a in caller.peers()},
    )
    try:
        import threading

        served: list[tuple[int, float]] = []
        stop = threading.Event()

        def serve() -> None:
            # One request: [identity, frame 1] (§4.5), answered status 0
            # with its value plus one; then one answered status 1.
            for status in (0, 1):
                while not router.poll(50):
                    if stop.is_set():
                        return
                identity, f1 = router.recv_multipart()
                nul = f1.index(b"\x00")
                key = f1[:nul].decode()
                _v, kind, _f, enc, tag, _s, _nid, seq, _ts = HEADER.unpack_from(f1, nul + 1)
                assert (kind, enc, tag) == (5, 1, domain_tag(name))
                body = f1[nul + 1 + 44 :]
                x = struct.unpack(">d", body[1:])[0]
                served.append((seq, x))
                if status == 0:
                    reply = bytes([0]) + cbor_float(x + 1)
                else:
                    # {"kind": "busy", "message": "try later"}
                    reply = bytes([1]) + b"\xa2\x64kind\x64busy\x67message\x69try later"
                head = HEADER.pack(1, 6, 0, 1, domain_tag(name), 0, node, seq, time.time_ns())
                router.send_multipart([identity, key.encode() + b"\x00" + head + reply])

        t = threading.Thread(target=serve)
        t.start()
        try:
            assert caller.call("sr/raw/add1", 41.5) == 42.5
            try:
                caller.call("sr/raw/add1", 1.0)
                raise AssertionError("a failure reply was taken as a value")
            except milonga.RemoteError as e:
                assert (e.kind, e.remote_message) == ("busy", "try later"), e
        finally:
            # The router is the thread's until it ends (a socket is not
            # shared between threads).
            stop.set()
            t.join(20)
            assert not t.is_alive()
        assert [x for _, x in served] == [41.5, 1.0]
        assert served[0][0] != served[1][0], "call ids are unique"
    finally:
        (d / f"{node.hex()}.json").unlink(missing_ok=True)
        ctx.destroy(linger=0)


def cbor_encode(v: object) -> bytes:
    """§5's written forms for what a history query holds: unsigned
    integers, text, arrays and maps, definite lengths, shortest heads."""

    def head(major: int, n: int) -> bytes:
        if n < 24:
            return bytes([major << 5 | n])
        for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
            if n < 1 << (8 * size):
                return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
        raise ValueError(n)

    if isinstance(v, bool):
        return b"\xf5" if v else b"\xf4"
    if isinstance(v, int):
        return head(0, v)
    if isinstance(v, float):
        return cbor_float(v)
    if isinstance(v, str):
        b = v.encode()
        return head(3, len(b)) + b
    if isinstance(v, list):
        return head(4, len(v)) + b"".join(cbor_encode(x) for x in v)
    if isinstance(v, dict):
        return head(5, len(v)) + b"".join(cbor_encode(k) + cbor_encode(x) for k, x in v.items())
    raise TypeError(v)


def cbor_decode(b: bytes) -> object:
    """One CBOR item of definite lengths (what a history reply holds, §4.2)."""

    def item(i: int) -> tuple[object, int]:
        major, n = b[i] >> 5, b[i] & 0x1F
        i += 1
        if major == 7:
            if n in (20, 21, 22):
                return {20: False, 21: True, 22: None}[n], i
            if n == 26:
                return struct.unpack(">f", b[i : i + 4])[0], i + 4
            assert n == 27, b[i - 1]
            return struct.unpack(">d", b[i : i + 8])[0], i + 8
        if n >= 24:
            size = 1 << (n - 24)
            n, i = int.from_bytes(b[i : i + size], "big"), i + size
        if major == 0:
            return n, i
        if major in (2, 3):
            raw = b[i : i + n]
            return (raw if major == 2 else raw.decode()), i + n
        if major == 4:
            out = []
            for _ in range(n):
                x, i = item(i)
                out.append(x)
            return out, i
        if major == 5:
            m = {}
            for _ in range(n):
                k, i = item(i)
                x, i = item(i)
                m[k] = x
            return m, i
        raise ValueError(f"major {major}")

    v, end = item(0)
    assert end == len(b)
    return v


def test_a_raw_subscriber_gets_a_milonga_publisher_s_kept_samples(domain: Domain) -> None:
    name = domain_name(domain)
    node = domain.open("keeper")
    pub = node.publisher("sr/raw/h", milonga.PublisherQos(history=3))
    for i in range(1, 6):
        pub.put(i * 1.5)
    a = announcement_of(domain, "sr/raw/h")
    ctx = zmq.Context()
    try:
        xsub = ctx.socket(zmq.XSUB)
        xsub.setsockopt(zmq.LINGER, 0)
        xsub.connect(a["data_best_effort"])
        token = uuid.uuid4().hex
        # §3, §4.2: the key, then the reply prefix, subscribed upstream; the
        # query once the connection is there.
        xsub.send(b"\x01sr/raw/h\x00")
        xsub.send(b"\x01@r/" + token.encode() + b"\x00")
        wait_for("the raw subscription", lambda: pub.subscriber_count() == 1)
        query = {
            "node": a["node_id"],
            "socket": "best_effort",
            "token": token,
            "expr": "sr/raw/**",
            "last": 2,
            "since": [],
            "id": 7,
        }
        xsub.send(b"\x02" + cbor_encode(query))
        assert xsub.poll(10_000), "no history reply"
        f1 = xsub.recv()
        nul = f1.index(b"\x00")
        assert f1[:nul] == b"@r/" + token.encode()
        version, kind, flags, enc, tag, _schema, nid, _seq, _ts = HEADER.unpack_from(f1, nul + 1)
        assert (version, kind, flags, enc, tag) == (1, 4, 0, 1, domain_tag(name))
        assert nid.hex() == a["node_id"]
        reply = cbor_decode(f1[nul + 1 + 44 :])
        assert isinstance(reply, dict)
        assert (reply["socket"], reply["done"], reply["id"]) == ("best_effort", True, 7)
        [k] = reply["keys"]
        assert (k["key"], k["last"]) == ("sr/raw/h", 5)
        entries = k["entries"]
        assert [e[0] for e in entries] == [4, 5]
        assert all(e[2] == 1 and e[3] == 0 for e in entries)
        assert [cbor_decode(e[4]) for e in entries] == [6.0, 7.5]
        assert node.stats()["history_queries_answered"] == 1
        # A later live sample comes after the reply, on the same connection.
        pub.put(9.0)
        assert xsub.poll(10_000)
        live = xsub.recv()
        assert live.startswith(b"sr/raw/h\x00")
        assert HEADER.unpack_from(live, 9)[7] == 6
    finally:
        ctx.destroy(linger=0)


def test_a_raw_control_query_gets_a_milonga_node_s_info(domain: Domain) -> None:
    name = domain_name(domain)
    node = domain.open("asked")
    pub = node.publisher("sr/raw/c")
    for i in range(3):
        pub.put(float(i))
    a = announcement_of(domain, "sr/raw/c")
    ctl = b"MILONGA-CTL/1"  # §9.1
    ctx = zmq.Context()
    try:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(a["control"])
        # A command §9.1 does not define: no reply, counted.
        d.send_multipart([ctl, b"status"])
        d.send_multipart([ctl, b"info"])
        assert d.poll(10_000), "no answer to info"
        magic, what, body = d.recv_multipart()
        assert (magic, what) == (ctl, b"info")
        info = json.loads(body)
        assert info["announcement"]["node_id"] == a["node_id"]
        assert info["announcement"]["domain"] == name
        stats = info["stats"]
        assert stats["samples_sent"] == 3
        assert stats["control_malformed"] == 1
        assert not d.poll(200), "the bad command was answered"
    finally:
        ctx.destroy(linger=0)


def test_a_raw_broker_client_subscribes_to_a_milonga_client_of_the_broker(domain: Domain) -> None:
    name = domain_name(domain)
    ctx = zmq.Context()
    try:
        locator, req, hello = broker_hello(ctx, domain)
        writer = milonga.open(locator, name="writer", runtime_dir=str(domain.dir))
        domain.nodes.append(writer)
        pub = writer.publisher("sr/raw/m")
        control = ctx.socket(zmq.ROUTER)
        control.setsockopt(zmq.LINGER, 0)
        control.bind("tcp://127.0.0.1:*")
        node = uuid.uuid4().bytes
        announcement = raw_announcement(
            domain,
            node,
            "rawreader",
            control.getsockopt_string(zmq.LAST_ENDPOINT),
        )
        key = uuid.uuid4().hex
        # §11.2: attach until the view shows the publisher's node with
        # its publication; §11.3: its endpoint is the broker's, tagged.
        entry: dict[str, Any] = {}
        end = time.monotonic() + 20
        while not entry:
            assert time.monotonic() < end, "the publisher never in the view"
            req.send_multipart(
                [MAGIC, b"attach", json.dumps(announcement).encode(), b"0", b"", key.encode()]
            )
            if not req.poll(1000):
                continue
            reply = req.recv_multipart()
            assert reply[1] == b"view", reply
            for a in json.loads(reply[3]):
                if any(p["key"] == "sr/raw/m" for p in a["publications"]):
                    entry = a
            if not entry:
                # Attach again after an interval, as a client does (§11.2).
                time.sleep(hello["attach_interval_ms"] / 1000)
        endpoint, tag = entry["data_best_effort"].split("#")
        assert tag == entry["node_id"]
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"sr/raw/m\x00")
        got: list[tuple[int, float]] = []
        i = 0
        end = time.monotonic() + 20
        while len(got) < 5:
            assert time.monotonic() < end, got
            i += 1
            pub.put(i * 0.25)
            if not sub.poll(20):
                continue
            while sub.poll(0):
                f1 = sub.recv()
                nul = f1.index(b"\x00")
                assert f1[:nul] == b"sr/raw/m"
                head = HEADER.unpack_from(f1, nul + 1)
                assert head[1] == 1 and head[6].hex() == entry["node_id"]
                got.append((head[7], struct.unpack(">d", f1[nul + 1 + 44 + 1 :])[0]))
        assert all(v == seq * 0.25 for seq, v in got), got
        req.send_multipart([MAGIC, b"detach", node.hex().encode(), key.encode()])
    finally:
        ctx.destroy(linger=0)


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64 (§4.4's filter id)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def test_the_filter_id_of_the_document_s_example() -> None:
    # §4.4
    text = b"abs_change=3ff8000000000000;min_period_ms=100\nsr/**"
    assert f"{fnv1a64(text):016x}" == "aa72652949134c50"


def test_a_raw_subscriber_s_filter_is_applied_at_a_milonga_publisher(domain: Domain) -> None:
    name = domain_name(domain)
    node = domain.open("source")
    pub = node.publisher("sr/raw/f")
    a = announcement_of(domain, "sr/raw/f")
    expr = "sr/raw/**"
    canonical = "abs_change=" + struct.pack(">d", 1.5).hex()
    fid = "%016x" % fnv1a64((canonical + "\n" + expr).encode())
    ctx = zmq.Context()
    try:
        xsub = ctx.socket(zmq.XSUB)
        xsub.setsockopt(zmq.LINGER, 0)
        xsub.connect(a["data_best_effort"])
        # §3's prefixes of `sr/raw/**`, each behind `@f/<id>/`, instead of
        # the plain ones; then the declaration (0x03, §4.4).
        for prefix in (b"sr/raw/", b"sr/raw\x00"):
            xsub.send(b"\x01@f/" + fid.encode() + b"/" + prefix)
        wait_for("the raw subscription", lambda: pub.subscriber_count() == 1)
        declaration = {
            "node": a["node_id"],
            "socket": "best_effort",
            "keys": expr,
            "abs_change": 1.5,
        }
        xsub.send(b"\x03" + cbor_encode(declaration))
        wait_for("the filter declared", lambda: node.stats()["filters_declared"] == 1)
        values = [0.0, 0.5, 1.0, 2.0, 2.5, 4.0, 4.1, 5.5]
        for v in values:
            pub.put(v)
        got: list[tuple[str, int, object]] = []
        end = time.monotonic() + 20
        while len(got) < 4:
            assert time.monotonic() < end, got
            if not xsub.poll(100):
                continue
            f1 = xsub.recv()
            nul = f1.index(b"\x00")
            head = HEADER.unpack_from(f1, nul + 1)
            assert head[1] == 1 and head[6].hex() == a["node_id"]
            got.append((f1[:nul].decode(), head[7], cbor_decode(f1[nul + 1 + 44 :])))
        # The first passes, then each that moved at least 1.5 from the
        # last that passed; numbered per filter and key from 1.
        k = f"@f/{fid}/sr/raw/f"
        assert got == [(k, 1, 0.0), (k, 2, 2.0), (k, 3, 4.0), (k, 4, 5.5)]
        assert not xsub.poll(200), "more passed the filter"
    finally:
        ctx.destroy(linger=0)


def test_a_milonga_node_finds_a_raw_static_peer_and_reads_it(domain: Domain) -> None:
    """§9.4: a node given a static peer asks its control socket (`gossip`,
    four frames, with a `tcp://` control endpoint of its own), takes the
    announcement of the NodeInfo it gets back (§9.1), and subscribes to
    what it publishes; no announcement file is written (§9.3 is not used)."""
    name = domain_name(domain)
    ctx = zmq.Context()
    try:
        control = ctx.socket(zmq.ROUTER)
        data = ctx.socket(zmq.XPUB)
        live = ctx.socket(zmq.XPUB)
        live.setsockopt(zmq.XPUB_VERBOSE, 1)
        for s in (control, data, live):
            s.setsockopt(zmq.LINGER, 0)
            s.bind("tcp://127.0.0.1:*")
        node = uuid.uuid4().bytes
        info = {
            "announcement": raw_announcement(
                domain,
                node,
                "rawpeer",
                control.getsockopt_string(zmq.LAST_ENDPOINT),
                start_time=start_time(),
                data_best_effort=data.getsockopt_string(zmq.LAST_ENDPOINT),
                liveliness=live.getsockopt_string(zmq.LAST_ENDPOINT),
                publications=[{"key": "sr/raw/s", "reliability": "best_effort"}],
            ),
            "stats": {},
        }
        ctl = b"MILONGA-CTL/1"
        asked: list[list[bytes]] = []

        def answer() -> None:
            """Answers every control request waiting (§9.1, §9.4)."""
            while control.poll(0):
                identity, *frames = control.recv_multipart()
                assert frames[0] == ctl, frames
                asked.append(frames)
                control.send_multipart([identity, ctl, b"info", json.dumps(info).encode()])

        seeker = domain.open(
            "seeker",
            local_discovery=False,
            peers=[info["announcement"]["control"]],
            control_endpoint="tcp://127.0.0.1:*",
        )
        sub = seeker.subscribe("sr/raw/**")
        subscribed: list[bytes] = []
        end = time.monotonic() + 20
        while not any(p.startswith(b"\x01sr/") for p in subscribed):
            assert time.monotonic() < end, (asked, subscribed)
            answer()
            if data.poll(20):
                subscribed.append(data.recv())
        # gossip: the asker's own tcp:// control endpoint and its domain.
        command, *rest = asked[0][1:]
        assert command == b"gossip", asked[0]
        assert rest[0].startswith(b"tcp://127.0.0.1:") and rest[1] == name.encode()
        got: list[milonga.Sample] = []
        seq = 0
        end = time.monotonic() + 20
        while len(got) < 3:
            assert time.monotonic() < end, got
            answer()
            seq += 1
            live.send(frame("@hb", 3, name, node, seq, time.time_ns(), cbor_leaving(False)))
            data.send(frame("sr/raw/s", 1, name, node, seq, time.time_ns(), cbor_float(seq + 0.5)))
            e = next_event(sub, 0.05)
            if isinstance(e, milonga.Sample):
                got.append(e)
        assert all(s.publisher == node.hex() and s.value == s.seq + 0.5 for s in got)
    finally:
        ctx.destroy(linger=0)


def test_a_raw_node_registers_with_a_broker_and_a_milonga_node_reads_it(domain: Domain) -> None:
    """§11.6: a raw peer-to-peer node registers its announcement with a
    broker, gets the domain's nodes in pages and acknowledges them; a
    Milonga node using the same broker as its registry (no announcement
    files) finds it and reads its samples directly."""
    from test_broker import start_broker

    name = domain_name(domain)
    _, locator = start_broker(domain)
    listen = "tcp://" + locator.removeprefix("milonga://").split("/")[0]
    ctx = zmq.Context()
    try:
        reg = ctx.socket(zmq.DEALER)
        data = ctx.socket(zmq.XPUB)
        live = ctx.socket(zmq.XPUB)
        control = ctx.socket(zmq.ROUTER)
        for s in (reg, data, live, control):
            s.setsockopt(zmq.LINGER, 0)
        for s in (data, live, control):
            s.bind("tcp://127.0.0.1:*")
        reg.connect(listen)
        node = uuid.uuid4().bytes
        announcement = json.dumps(
            raw_announcement(
                domain,
                node,
                "rawreg",
                control.getsockopt_string(zmq.LAST_ENDPOINT),
                start_time=start_time(),
                data_best_effort=data.getsockopt_string(zmq.LAST_ENDPOINT),
                liveliness=live.getsockopt_string(zmq.LAST_ENDPOINT),
                publications=[{"key": "sr/raw/r", "reliability": "best_effort"}],
            )
        ).encode()
        view: dict[str, Any] = {"epoch": 0, "have": 0, "nodes": {}, "lease_ms": 3000}
        renewed = [0.0]

        def register(with_announcement: bool) -> None:
            header = {
                "domain": name,
                "node_id": node.hex(),
                "epoch": view["epoch"],
                "have": view["have"],
                "announced": fnv1a64(announcement),
            }
            frames = [MAGIC, b"register", json.dumps(header).encode()]
            reg.send_multipart(frames + ([announcement] if with_announcement else []))
            renewed[0] = time.monotonic()

        def follow() -> None:
            """Reads the broker's pages and answers, renews every third of
            the lease (§11.6)."""
            while reg.poll(0):
                frames = reg.recv_multipart()
                assert frames[0] == MAGIC, frames
                if frames[1] == b"announce":
                    register(True)
                    continue
                assert frames[1] == b"entries", frames
                head = json.loads(frames[2])
                if head["reset"]:
                    view["nodes"] = {}
                elif head["epoch"] != view["epoch"] or head["from"] != view["have"]:
                    register(False)
                    continue
                for a in frames[3:]:
                    a = json.loads(a)
                    view["nodes"][a["node_id"]] = a
                for gone in head["removed"]:
                    view["nodes"].pop(gone, None)
                view.update(epoch=head["epoch"], have=head["to"], lease_ms=head["lease_ms"])
                register(False)
            if time.monotonic() - renewed[0] > view["lease_ms"] / 3000:
                register(False)

        register(True)
        reader = domain.open("reader", local_discovery=False, registry=[listen])
        sub = reader.subscribe("sr/raw/**")
        subscribed: list[bytes] = []
        end = time.monotonic() + 20
        while not any(p.startswith(b"\x01sr/") for p in subscribed):
            assert time.monotonic() < end, (view, subscribed)
            follow()
            if data.poll(20):
                subscribed.append(data.recv())
        # The registry told the raw node the reader (and itself).
        end = time.monotonic() + 20
        while reader.id not in view["nodes"]:
            assert time.monotonic() < end, view
            follow()
            reg.poll(20)  # the next page, if one comes
        assert node.hex() in view["nodes"]
        got: list[milonga.Sample] = []
        seq = 0
        end = time.monotonic() + 20
        while len(got) < 3:
            assert time.monotonic() < end, got
            follow()
            seq += 1
            live.send(frame("@hb", 3, name, node, seq, time.time_ns(), cbor_leaving(False)))
            data.send(frame("sr/raw/r", 1, name, node, seq, time.time_ns(), cbor_float(seq * 2.0)))
            e = next_event(sub, 0.05)
            if isinstance(e, milonga.Sample):
                got.append(e)
        assert all(s.publisher == node.hex() and s.value == s.seq * 2.0 for s in got)
        # §11.6: unregister; the reader's view loses it.
        reg.send_multipart([MAGIC, b"unregister", name.encode(), node.hex().encode()])
        wait_for(
            "the raw node gone from the reader's view",
            lambda: node.hex() not in {a["node_id"] for a in reader.peers()},
        )
    finally:
        ctx.destroy(linger=0)


def test_a_raw_subscriber_reads_a_schema_d_publisher_by_position(domain: Domain) -> None:
    """§5.1: a compact payload (encoding 3) under the schema of the
    document's example; the schema asked for in a history query (§4.2
    `schemas`), its id checked (FNV-1a 32 of its bytes), the value read by
    position."""
    name = domain_name(domain)
    node = domain.open("typed")
    schema = {
        "name": "p",
        "fields": [
            {"name": "id", "type": "i32"},
            {"name": "kind", "type": {"enum": ["a", "b"]}},
            {"name": "x", "type": "f32"},
        ],
    }
    pub = node.publisher("sr/raw/t", milonga.PublisherQos(schema=schema))
    a = announcement_of(domain, "sr/raw/t")
    [publication] = [p for p in a["publications"] if p["key"] == "sr/raw/t"]
    ctx = zmq.Context()
    try:
        xsub = ctx.socket(zmq.XSUB)
        xsub.setsockopt(zmq.LINGER, 0)
        xsub.connect(a["data_best_effort"])
        token = uuid.uuid4().hex
        xsub.send(b"\x01sr/raw/t\x00")
        xsub.send(b"\x01@r/" + token.encode() + b"\x00")
        wait_for("the raw subscription", lambda: pub.subscriber_count() == 1)
        pub.put({"id": 7, "kind": "b", "x": 0.5})
        assert xsub.poll(10_000), "no sample"
        f1 = xsub.recv()
        nul = f1.index(b"\x00")
        _v, kind, _f, enc, _t, schema_id, _n, _s, _ts = HEADER.unpack_from(f1, nul + 1)
        assert (kind, enc) == (1, 3)
        assert schema_id == publication["schema"] != 0
        body = f1[nul + 1 + 44 :]
        assert body == bytes.fromhex("8307 01fa 3f000000".replace(" ", ""))
        # The schema, asked for by id.
        query = {
            "node": a["node_id"],
            "socket": "best_effort",
            "token": token,
            "expr": "sr/raw/t",
            "last": 0,
            "since": [],
            "schemas": [schema_id],
        }
        xsub.send(b"\x02" + cbor_encode(query))
        assert xsub.poll(10_000), "no history reply"
        r1 = xsub.recv()
        reply = cbor_decode(r1[r1.index(b"\x00") + 1 + 44 :])
        assert isinstance(reply, dict)
        [(sid, raw)] = reply["schemas"]
        assert sid == schema_id and domain_tag_of_bytes(raw) == schema_id
        told = cbor_decode(raw)
        assert isinstance(told, dict) and told["name"] == "p"
        fields = told["fields"]
        values = cbor_decode(body)
        assert isinstance(values, list) and len(values) == len(fields)
        read = {}
        for f, v in zip(fields, values):
            t = f["type"]
            read[f["name"]] = t["enum"][v] if isinstance(t, dict) else v
        assert read == {"id": 7, "kind": "b", "x": 0.5}
    finally:
        ctx.destroy(linger=0)


def domain_tag_of_bytes(data: bytes) -> int:
    """§5.1's schema id: FNV-1a 32 (as §4's domain tag) of the bytes, 0
    read as 1."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) % 2**32
    return h or 1
