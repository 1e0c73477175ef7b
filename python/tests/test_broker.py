"""A node opened on ``milonga://HOST:PORT/DOMAIN`` works through a broker
process (``milonga broker``) as it does peer-to-peer: samples both ways with
peer-to-peer nodes, kept values, calls (docs/broker.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import milonga
from conftest import REPO, Domain, next_sample, ready_line, wait_for

# Built by `cargo test` (and `make test`) before the Python tests run.
MILONGA = Path(os.environ.get("MILONGA_BIN", REPO / "target" / "debug" / "milonga"))


@pytest.fixture
def broker(domain: Domain) -> Iterator[str]:
    """A broker serving the test's domain on a free port; its locator."""
    if not MILONGA.exists():
        pytest.fail(f"{MILONGA} is missing: build it first (cargo build -p milonga-cli)")
    name = domain.locator.removeprefix("milonga:///")
    child = subprocess.Popen(
        [str(MILONGA), "broker", "--listen", "tcp://127.0.0.1:0", "--domain", name, "--json"],
        env=domain.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    domain.children.append(child)
    line = json.loads(ready_line(child))
    assert line["event"] == "listening", line
    yield str(line["locators"][0])


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
