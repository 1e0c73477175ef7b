"""Security from Python (docs/security.md): keys made by ``milonga.keygen``,
nodes with ``security="on"`` that admit only the keys of their trust
directory, and what a refused subscriber and caller are told."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path
from typing import TypeVar

import pytest

import milonga
from conftest import Domain


def _keys(tmp: Path, *names: str) -> Path:
    for n in names:
        milonga.keygen(n, tmp / "keys")
    return tmp / "keys"


def _trust(tmp: Path, keys: Path, tag: str, *names: str) -> Path:
    d = tmp / f"trust-{tag}"
    # Writable by its owner alone, whatever the umask (a trust directory
    # others may write is refused).
    d.mkdir(mode=0o700)
    for n in names:
        shutil.copy(keys / f"{n}.pub", d / f"{n}.pub")
    return d


T = TypeVar("T")


def _first(sub: milonga.Subscription, kind: type[T], pub: milonga.Publisher) -> T:
    """The first event of ``kind`` on ``sub`` within 10 s, putting 5 on
    ``pub`` meanwhile (a best-effort sample put before the subscription
    connects is not delivered). A sample of another kind fails."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pub.put(5)
        event = sub.try_recv()
        while event is not None:
            if isinstance(event, kind):
                return event
            assert not isinstance(event, milonga.Sample), f"unexpected {event!r}"
            event = sub.try_recv()
        time.sleep(0.02)
    raise AssertionError(f"no {kind.__name__} within 10 s")


def _secured(domain: Domain, name: str, keys: Path, trust: Path) -> milonga.Node:
    return domain.open(
        name,
        security="on",
        key_file=str(keys / f"{name}.key"),
        trust_dir=str(trust),
    )


def test_keygen_writes_a_private_secret_and_refuses_to_overwrite(tmp_path: Path) -> None:
    key, public = milonga.keygen("ps", tmp_path / "k")
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert "public-key" in Path(public).read_text()
    with pytest.raises(milonga.OpenError, match="exists already"):
        milonga.keygen("ps", tmp_path / "k")
    with pytest.raises(milonga.ConfigError, match="bad key name"):
        milonga.keygen("../x", tmp_path / "k")


def test_trusted_nodes_talk_and_an_untrusted_one_is_told(domain: Domain, tmp_path: Path) -> None:
    keys = _keys(tmp_path, "alice", "bob", "eve")
    ab = _trust(tmp_path, keys, "ab", "alice", "bob")
    ae = _trust(tmp_path, keys, "ae", "alice", "eve")
    alice = _secured(domain, "alice", keys, ab)
    bob = _secured(domain, "bob", keys, ab)
    eve = _secured(domain, "eve", keys, ae)
    pub = alice.publisher("sec/x")
    got = bob.subscribe("sec/x")
    denied = eve.subscribe("sec/x")
    first = _first(got, milonga.Sample, pub)
    assert first.value == 5
    told = _first(denied, milonga.PermissionDenied, pub)
    assert "trust directory" in told.reason
    # A call from eve ends CallDenied, not a hang.
    svc = alice.serve("sec/echo", lambda req: req.value)
    with pytest.raises(milonga.CallDenied, match="permission denied"):
        for _ in range(100):
            try:
                eve.call("sec/echo", 1, timeout=5)
                break
            except milonga.NoServer:
                time.sleep(0.05)
    assert bob.call("sec/echo", 7, timeout=5) == 7
    svc.close()


def test_a_key_file_others_can_read_is_refused(domain: Domain, tmp_path: Path) -> None:
    keys = _keys(tmp_path, "alice")
    trust = _trust(tmp_path, keys, "a", "alice")
    os.chmod(keys / "alice.key", 0o644)
    with pytest.raises(milonga.OpenError, match="chmod 600"):
        _secured(domain, "alice", keys, trust)
    # A key and no trust directory: the user's default one (conftest points
    # XDG_CONFIG_HOME at a directory of the test session).
    os.chmod(keys / "alice.key", 0o600)
    domain.open("x", security="on", key_file=str(keys / "alice.key"))
    assert (Path(os.environ["XDG_CONFIG_HOME"]) / "milonga" / "trust").is_dir()


def test_access_control_denies_a_call_no_rule_allows(domain: Domain, tmp_path: Path) -> None:
    keys = _keys(tmp_path, "srv", "ops", "guest")
    trust = _trust(tmp_path, keys, "all", "srv", "ops", "guest")
    rules = tmp_path / "acl.rules"
    rules.write_text("allow srv serve lab/**\nallow ops call lab/**\n")

    def node(name: str) -> milonga.Node:
        return domain.open(
            name,
            security="on",
            key_file=str(keys / f"{name}.key"),
            trust_dir=str(trust),
            acl_file=str(rules),
        )

    srv, ops, guest = node("srv"), node("ops"), node("guest")
    svc = srv.serve("lab/echo", lambda req: req.value)

    def call(who: milonga.Node, value: int) -> object:
        # Until discovery shows the service, a call finds no server.
        deadline = time.monotonic() + 10
        while True:
            try:
                return who.call("lab/echo", value, timeout=5)
            except milonga.NoServer:
                assert time.monotonic() < deadline, "the service never showed"
                time.sleep(0.05)

    assert call(ops, 3) == 3
    with pytest.raises(milonga.CallDenied, match="no rule of .*acl.rules allows guest call"):
        call(guest, 1)
    assert srv.stats()["acl_denied"] >= 1
    svc.close()
    with pytest.raises(milonga.ConfigError, match="needs security on"):
        domain.open("plain", acl_file=str(rules))


def test_a_secured_node_receives_its_own_samples(domain: Domain, tmp_path: Path) -> None:
    keys = _keys(tmp_path, "solo")
    trust = _trust(tmp_path, keys, "s", "solo")
    node = _secured(domain, "solo", keys, trust)
    sub = node.subscribe("own/x")
    got = _first(sub, milonga.Sample, node.publisher("own/x"))
    assert got.value == 5


def test_through_a_secured_broker_trusted_clients_talk_and_an_untrusted_key_is_refused(
    domain: Domain, tmp_path: Path
) -> None:
    """A broker with security on (docs/broker.md "Security"), its key named
    in the clients' locator: trusted clients exchange samples and a call
    through it; a client whose key it does not trust fails to open, saying
    so."""
    from test_broker import broker_process

    keys = _keys(tmp_path, "ctl", "alice", "bob", "eve")
    trust = _trust(tmp_path, keys, "ok", "ctl", "alice", "bob")
    eve_trust = _trust(tmp_path, keys, "eve", "ctl", "alice", "bob", "eve")
    _, line = broker_process(domain, ["--key", str(keys / "ctl.key"), "--trust", str(trust)])
    assert line["key"], line
    hp = str(line["listen"]).removeprefix("tcp://")
    locator = f"milonga://ctl@{hp}/{domain.locator.removeprefix('milonga:///')}"

    def client(who: str, trust_dir: Path) -> milonga.Node:
        node = milonga.open(
            locator,
            name=who,
            runtime_dir=str(domain.dir),
            key_file=str(keys / f"{who}.key"),
            trust_dir=str(trust_dir),
        )
        domain.nodes.append(node)
        return node

    alice = client("alice", trust)
    bob = client("bob", trust)
    pub = alice.publisher("sec/b")
    sub = bob.subscribe("sec/b")
    assert _first(sub, milonga.Sample, pub).value == 5
    svc = alice.serve("sec/echo", lambda req: req.value)
    for _ in range(100):
        try:
            assert bob.call("sec/echo", 7, timeout=5) == 7
            break
        except milonga.NoServer:
            # Bob's view does not show the service yet: ask again (at most
            # 100 times, 5 s).
            time.sleep(0.05)
    else:
        raise AssertionError("the service never reached bob")
    svc.close()
    with pytest.raises(milonga.OpenError, match="refused this node's key"):
        client("eve", eve_trust)


def test_a_secured_broker_bridges_its_hosts_nodes_and_keeps_a_secured_registry(
    domain: Domain, tmp_path: Path
) -> None:
    """A secured broker (docs/broker.md "Security") is a node of its host's
    domain for the nodes of its own identity: a client and a host node of
    the broker's key exchange samples each way through it. Nodes with
    security on register with it (``registry = NAME@tcp://HOST:PORT``,
    docs/discovery.md "A registry") and find each other without local
    discovery."""
    from test_broker import broker_process

    keys = _keys(tmp_path, "ctl", "alice")
    trust = _trust(tmp_path, keys, "ok", "ctl", "alice")
    _, line = broker_process(domain, ["--key", str(keys / "ctl.key"), "--trust", str(trust)])
    listen = str(line["listen"])
    name = domain.locator.removeprefix("milonga:///")
    client = milonga.open(
        f"milonga://ctl@{listen.removeprefix('tcp://')}/{name}",
        name="alice",
        runtime_dir=str(domain.dir),
        key_file=str(keys / "alice.key"),
        trust_dir=str(trust),
    )
    domain.nodes.append(client)

    def host(who: str, **config: object) -> milonga.Node:
        node = milonga.open(
            domain.locator,
            name=who,
            runtime_dir=str(domain.dir),
            key_file=str(keys / "ctl.key"),
            trust_dir=str(trust),
            security="on",
            **config,
        )
        domain.nodes.append(node)
        return node

    on_host = host("host")
    assert _first(client.subscribe("br/h"), milonga.Sample, on_host.publisher("br/h")).value == 5
    assert _first(on_host.subscribe("br/c"), milonga.Sample, client.publisher("br/c")).value == 5

    registered = {
        "local_discovery": False,
        "registry": [f"ctl@{listen}"],
    }
    writer = host("writer", **registered)
    reader = host("reader", **registered)
    assert _first(reader.subscribe("br/r"), milonga.Sample, writer.publisher("br/r")).value == 5
