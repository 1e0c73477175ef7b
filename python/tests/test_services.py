"""Services from Python: every outcome of a call, with servers in other
processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import pytest

import milonga
from conftest import Domain, ready_line, wait_for

SERVER = """
import os, time, milonga

def echo(req):
    return req.value

def fail(req):
    if req.value == "choose":
        raise milonga.ServiceError("out_of_range", "12 is over the limit")
    raise ValueError("bad value " + repr(req.value))

def slow(req):
    print(f"slow {req.value} started", flush=True)
    time.sleep(float(req.value))
    print(f"slow {req.value} done", flush=True)
    return "late"

with milonga.open(os.environ["LOCATOR"], name="server") as n:
    n.serve("lab/echo", echo)
    n.serve("lab/fail", fail)
    n.serve("lab/slow", slow, workers=8)
    print("ready", flush=True)
    time.sleep(60)
"""


def served(node: milonga.Node, key: str, n: int = 1) -> None:
    wait_for(
        f"{key} in discovery",
        lambda: sum(
            1 for p in node.peers() for s in p.get("services", []) if s["key"] == key
        )
        == n,
    )


def test_every_outcome_of_a_call(domain: Domain) -> None:
    server = domain.spawn(SERVER)
    ready_line(server)
    client = domain.open("client", max_message_bytes=1 << 20)
    every_outcome_of_a_call(client, server)


def every_outcome_of_a_call(client: milonga.Node, server: subprocess.Popen[str]) -> None:
    """Each outcome of a call from ``client`` to the services of ``SERVER``
    running in ``server`` (ready): reply, remote errors, no server, timeout,
    too large, and ``ServerLost`` once ``server`` is killed (well before the
    deadline). ``test_broker.py`` runs it through a broker."""
    for key in ["lab/echo", "lab/fail", "lab/slow"]:
        served(client, key)
    # Reply.
    assert client.call("lab/echo", {"amps": 12.5}, timeout=5) == {"amps": 12.5}
    # Remote errors, with the kind and message of the handler.
    with pytest.raises(milonga.RemoteError) as e:
        client.call("lab/fail", 3, timeout=5)
    assert e.value.kind == "ValueError" and e.value.remote_message == "bad value 3"
    with pytest.raises(milonga.RemoteError) as e:
        client.call("lab/fail", "choose", timeout=5)
    assert e.value.kind == "out_of_range" and "over the limit" in e.value.remote_message
    assert client.call("lab/echo", 1, timeout=5) == 1, "the service goes on"
    # No server: at once, not after the timeout. call_start refuses before
    # there is a pending call to wait on, and call raises NoServer, not the
    # TimeoutError that waiting out its 30 s would have given.
    with pytest.raises(milonga.NoServer):
        client.call_start("lab/nobody", 1, timeout=30)
    with pytest.raises(milonga.NoServer):
        client.call("lab/nobody", 1, timeout=30)
    # Timeout: not before the deadline, and while the handler still runs. It
    # sleeps 30 s (a reply would be "late"); the server prints a line when a
    # slow handler starts and when it is done, and the line after this one's
    # "started" is the next call's "started" (below), not this one's "done".
    started = time.monotonic()
    with pytest.raises(milonga.TimeoutError) as t:
        client.call("lab/slow", 30.0, timeout=0.5)
    assert isinstance(t.value, TimeoutError)
    assert time.monotonic() - started >= 0.5, "the call ended before its deadline"
    assert ready_line(server) == "slow 30.0 started"
    # Rejected before sending: over the size limit.
    with pytest.raises(milonga.Rejected) as r:
        client.call("lab/echo", b"x" * (2 << 20), timeout=5)
    assert r.value.kind == "too_large"
    # Server lost: its process is killed once its handler has the call.
    # ServerLost, not the TimeoutError of the 20 s deadline: the loss is
    # noticed, not waited out.
    pending = client.call_start("lab/slow", 60.0, timeout=20)
    assert ready_line(server) == "slow 60.0 started", (
        "the timed-out call's handler ended first: the call waited for it"
    )
    killed = time.monotonic()
    server.send_signal(signal.SIGKILL)
    with pytest.raises(milonga.ServerLost):
        pending.wait()
    assert time.monotonic() - killed < 10, "noticed, not waited out"
    stats = client.stats()
    assert stats["calls_server_lost"] == 1
    assert stats["calls_timed_out"] == 1, "only the call to the 30 s handler"


def test_serve_in_python_and_gather_with_call_all(domain: Domain) -> None:
    servers = [domain.open(f"ps-{i}") for i in range(3)]
    for s in servers:
        s.serve("lab/who", lambda req, name=s.name: name)
    servers[0].serve("lab/other", lambda req: req.value * 2)
    client = domain.open("client")
    served(client, "lab/who", 3)
    served(client, "lab/other")
    replies = client.call_all("lab/*", 21, timeout=5)
    assert len(replies) == 4
    assert sorted(r.value for r in replies if r.key == "lab/who") == sorted(
        s.name for s in servers
    )
    assert [r.value for r in replies if r.key == "lab/other"] == [42]
    assert all(r.error is None for r in replies)
    # Several servers share the calls.
    assert {client.call("lab/who", 0) for _ in range(12)} == {s.name for s in servers}


def test_a_handler_can_call_and_calls_await(domain: Domain) -> None:
    server = domain.open("server")
    server.serve("lab/double", lambda req: req.value * 2)
    server.serve(
        "lab/quad", lambda req: server.call("lab/double", req.value * 2, timeout=5)
    )
    client = domain.open("client")
    served(client, "lab/quad")

    async def main() -> list[object]:
        return list(
            await asyncio.gather(*(client.call_async("lab/quad", i) for i in range(10)))
        )

    assert asyncio.run(main()) == [4 * i for i in range(10)]
    svc = server.serve("lab/gone", lambda req: 1)
    served(client, "lab/gone")
    svc.close()
    served(client, "lab/gone", 0)
    with pytest.raises(milonga.NoServer):
        client.call("lab/gone", 1)


def test_a_handler_s_unexpected_exception_is_logged_at_the_server(
    domain: Domain, caplog: pytest.LogCaptureFixture
) -> None:
    # The caller got RemoteError and the server's log said nothing: a bug
    # in a handler left no traceback where it ran. A ServiceError raised on
    # purpose is an answer, not logged; a reply that cannot be sent is.
    node = domain.open("server")

    def handler(req: milonga.Request) -> object:
        if req.value == "refuse":
            raise milonga.ServiceError("busy", "come back later")
        if req.value == "unsendable":
            return object()
        return 1 / 0

    node.serve("lab/buggy", handler)
    client = domain.open("client")
    served(client, "lab/buggy")
    with caplog.at_level("ERROR", logger="milonga"):
        with pytest.raises(milonga.RemoteError) as e:
            client.call("lab/buggy", "divide", timeout=5)
        assert e.value.kind == "ZeroDivisionError"
        with pytest.raises(milonga.RemoteError):
            client.call("lab/buggy", "refuse", timeout=5)
        with pytest.raises(milonga.RemoteError) as e:
            client.call("lab/buggy", "unsendable", timeout=5)
        assert e.value.kind == "bad_reply"
    records = [r for r in caplog.records if r.name == "milonga"]
    assert len(records) == 2, [r.getMessage() for r in records]
    raised, unsendable = records
    assert "lab/buggy" in raised.getMessage() and "raised" in raised.getMessage()
    assert raised.exc_info is not None and raised.exc_info[0] is ZeroDivisionError
    assert "cannot be sent" in unsendable.getMessage()


def test_a_handler_may_close_its_own_service_or_node(domain: Domain) -> None:
    """A "stop" or "shutdown" service: its handler closes its service, or
    its whole node. The close ran on a helper thread that waited for the
    handler's worker, which waited for the close: the caller timed out, the
    node never closed. Now each call ends at once (its reply, or the server
    lost), and the service, then the node, is gone."""
    server = domain.open("server")
    client = domain.open("client")
    services: dict[str, milonga.Service] = {}

    def stop_service(req: milonga.Request) -> str:
        services["stop"].close()
        return "stopped"

    def shutdown(req: milonga.Request) -> str:
        server.close()
        return "bye"

    services["stop"] = server.serve("ctl/stop", stop_service)
    server.serve("ctl/shutdown", shutdown)
    served(client, "ctl/stop")
    served(client, "ctl/shutdown")
    for key in ["ctl/stop", "ctl/shutdown"]:
        start = time.monotonic()
        try:
            client.call(key, 1, timeout=20)
        except (milonga.ServerLost, milonga.NoServer):
            pass
        took = time.monotonic() - start
        assert took < 10, f"{key}: the call took {took:.1f} s"
    served(client, "ctl/stop", 0)
    served(client, "ctl/shutdown", 0)
