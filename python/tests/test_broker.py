"""A node opened on ``milonga://HOST:PORT/DOMAIN`` works through a broker
process (``milonga broker``) as it does peer-to-peer: samples both ways with
peer-to-peer nodes, kept values, filters, deadlines, every outcome of a
call, failover (docs/broker.md)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

import milonga
from conftest import REPO, Domain, next_sample, ready_line, wait_for
from test_services import SERVER, every_outcome_of_a_call

# Built by `cargo test` (and `make test`) before the Python tests run.
MILONGA = Path(os.environ.get("MILONGA_BIN", REPO / "target" / "debug" / "milonga"))


def broker_process(
    domain: Domain, options: list[str] | None = None
) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """A broker process (with global ``options`` such as ``--key``) serving
    the test's domain on a free port, and its ``listening`` line."""
    if not MILONGA.exists():
        pytest.fail(f"{MILONGA} is missing: build it first (cargo build -p milonga-cli)")
    name = domain.locator.removeprefix("milonga:///")
    child = subprocess.Popen(
        [str(MILONGA), *(options or [])]
        + ["broker", "--listen", "tcp://127.0.0.1:0", "--domain", name, "--json"],
        env=domain.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    domain.children.append(child)
    line = json.loads(ready_line(child))
    assert line["event"] == "listening", line
    return child, line


def start_broker(domain: Domain) -> tuple[subprocess.Popen[str], str]:
    """A broker process serving the test's domain on a free port, and its
    locator."""
    child, line = broker_process(domain)
    locators = line["locators"]
    assert isinstance(locators, list)
    return child, str(locators[0])


@pytest.fixture
def broker(domain: Domain) -> Iterator[str]:
    """A broker serving the test's domain on a free port; its locator."""
    yield start_broker(domain)[1]


def test_a_brokered_node_and_a_peer_to_peer_node_exchange_samples_kept_values_and_calls(
    domain: Domain, broker: str
) -> None:
    assert broker.startswith("milonga://127.0.0.1:")
    client = milonga.open(broker, name="client", runtime_dir=str(domain.dir))
    domain.nodes.append(client)
    peer = domain.open("peer")
    # A brokered publisher keeping its last value, read peer-to-peer with
    # `last`, and the reverse.
    cp = client.publisher("sr/c/1", milonga.PublisherQos(history=1))
    pp = peer.publisher("sr/p/1", milonga.PublisherQos(history=1))
    cp.put({"amps": 1.5})
    pp.put([1.0, 2.0, 3.0])
    wait_for(
        "both publications at the client",
        lambda: {"sr/c/1", "sr/p/1"}
        <= {p["key"] for a in client.peers() for p in a["publications"]},
    )
    from_peer = peer.subscribe("sr/c/**", qos=milonga.SubscriberQos(last=1))
    from_client = client.subscribe("sr/p/**", qos=milonga.SubscriberQos(last=1))
    s = next_sample(from_peer)
    assert (s.key, s.value) == ("sr/c/1", {"amps": 1.5})
    s = next_sample(from_client)
    assert s.key == "sr/p/1"
    assert list(s.value) == [1.0, 2.0, 3.0]
    # Live, both ways.
    cp.put({"amps": 2.5})
    pp.put([4.0])
    assert next_sample(from_peer).value == {"amps": 2.5}
    assert list(next_sample(from_client).value) == [4.0]
    # A call from the peer-to-peer node to a brokered service.
    svc = client.serve("sr/c/double", lambda req: req.value * 2)
    wait_for(
        "the service at the peer",
        lambda: any(s["key"] == "sr/c/double" for a in peer.peers() for s in a["services"]),
    )
    assert peer.call("sr/c/double", 21, timeout=5) == 42
    svc.close()


def test_no_broker_is_a_clear_open_error(domain: Domain) -> None:
    with pytest.raises(milonga.OpenError, match="no broker answered"):
        milonga.open(
            "milonga://127.0.0.1:1/lab", name="x", handshake_timeout_ms=200
        )


def test_a_client_fails_over_to_the_next_broker_and_its_subscription_says_so(
    domain: Domain,
) -> None:
    """kill -9 of the broker a client uses: the client moves to the next
    broker of its locator, its subscription yields ``BrokerChanged`` (from
    the dead one to the other), and the reliable stream of a peer-to-peer
    publisher goes on with every sequence number once: what the move missed
    is repaired from history or reported lost, never skipped silently."""
    b1, l1 = start_broker(domain)
    _b2, l2 = start_broker(domain)

    def host_port(locator: str) -> str:
        return locator.removeprefix("milonga://").split("/")[0]

    name = domain.locator.removeprefix("milonga:///")
    client = milonga.open(
        f"milonga://{host_port(l1)},{host_port(l2)}/{name}",
        name="client",
        runtime_dir=str(domain.dir),
    )
    domain.nodes.append(client)
    peer = domain.open("peer")
    pub = peer.publisher("fo/x", milonga.PublisherQos(reliable=True, history=10_000))
    sub = client.subscribe("fo/**", qos=milonga.SubscriberQos(reliable=True))
    n = 0

    def put() -> None:
        nonlocal n
        n += 1
        pub.put(n)

    seqs: list[int] = []
    lost = 0
    changed: list[milonga.BrokerChanged] = []
    # Every event but samples, with the number of samples before it: what
    # a failure shows (a failover that stalls the stream was seen once).
    others: list[str] = []

    def take(timeout: float) -> bool:
        """Takes one event; False when none came within ``timeout``."""
        nonlocal lost
        try:
            event = sub.recv(timeout=timeout)
        except milonga.TimeoutError:
            return False
        if isinstance(event, milonga.Sample):
            seqs.append(event.seq)
            return True
        others.append(f"after {len(seqs)} samples: {event!r}")
        if isinstance(event, milonga.Lost):
            lost += event.count
        elif isinstance(event, milonga.BrokerChanged):
            changed.append(event)
        return True

    def diagnosis() -> str:
        """What the client saw and sees, for a failure's message."""
        views = [
            (a["name"], [(p["key"], p.get("endpoint")) for p in a["publications"]])
            for a in client.peers()
        ]
        return f"events {others[-12:]}; the client's view {views}; put {n}"

    end = time.monotonic() + 20
    while not seqs:
        assert time.monotonic() < end, "no sample through the first broker"
        put()
        take(0.05)
    b1.kill()
    b1.wait()
    # Samples go on being put until the client says it moved, and a
    # while after; then the rest is drained (each phase with a bound of
    # its own). Between puts the test waits for events, not a fixed time:
    # the wait for one paces the puts.
    end = time.monotonic() + 20
    while not changed:
        assert time.monotonic() < end, f"no failover: last {seqs[-1:]}, put {n}"
        put()
        while take(0.01):
            pass
    for _ in range(50):
        put()
        take(0.005)
    end = time.monotonic() + 20
    while (not seqs or seqs[-1] < n) and time.monotonic() < end:
        take(0.2)
    assert seqs and seqs[-1] == n, (
        f"the last sample, {n}, through the second broker: {seqs[-5:]}; {diagnosis()}"
    )
    assert host_port(l1) in changed[0].from_broker, changed[0].from_broker
    assert host_port(l2) in changed[0].to_broker, changed[0].to_broker
    # Every number once, in order, from the first received: those not
    # received are the ones reported lost.
    assert seqs == sorted(set(seqs)), seqs
    assert seqs[-1] - seqs[0] + 1 == len(seqs) + lost, (seqs, lost)


def test_a_filter_and_a_deadline_hold_for_a_client_of_the_broker(
    domain: Domain, broker: str
) -> None:
    """A brokered subscription's filter runs at the peer-to-peer publisher
    (only passing samples arrive; the publisher's node evaluated it), and
    its deadline reports the key's silence."""
    client = milonga.open(broker, name="client", runtime_dir=str(domain.dir))
    domain.nodes.append(client)
    peer = domain.open("peer")
    pub = peer.publisher("fd/x")
    sub = client.subscribe(
        "fd/x", qos=milonga.SubscriberQos(filter="value >= 100", deadline=0.5)
    )
    got: list[float] = []
    last_sample = 0.0
    end = time.monotonic() + 20
    # Until the filter reached the publisher and a sample came through.
    while not got:
        assert time.monotonic() < end, "no sample through the broker"
        pub.put(50.0)
        pub.put(150.0)
        try:
            while True:
                e = sub.recv(timeout=0.05)
                if isinstance(e, milonga.Sample):
                    got.append(e.value)
                    last_sample = time.monotonic()
        except milonga.TimeoutError:
            pass
    assert all(v >= 100 for v in got), got
    assert peer.stats()["filter_evaluations"] > 0, "filtered at the publisher"
    # Silent from the last sample on: the deadline is missed, 0.5 s after
    # it (less the few milliseconds the sample took to reach Python).
    silent = last_sample
    while True:
        e = sub.recv(timeout=10)
        if isinstance(e, milonga.DeadlineMissed):
            assert e.key == "fd/x" and e.silent_for >= 0.5, e
            assert time.monotonic() - silent >= 0.45
            break
        if isinstance(e, milonga.Sample):
            assert e.value >= 100, e


def test_every_outcome_of_a_call_through_a_broker(domain: Domain, broker: str) -> None:
    """A client of the broker calls a peer-to-peer server in another
    process: every outcome, as peer-to-peer (``test_services.py``)."""
    server = domain.spawn(SERVER)
    assert ready_line(server) == "ready"
    client = milonga.open(
        broker, name="client", runtime_dir=str(domain.dir), max_message_bytes=1 << 20
    )
    domain.nodes.append(client)
    every_outcome_of_a_call(client, server)
