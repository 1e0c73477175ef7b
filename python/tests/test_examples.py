"""The examples under examples/python run and do what they say."""

from __future__ import annotations

import sys

from conftest import REPO, Domain, ready_line

EX = REPO / "examples" / "python"


def py(name: str, *args: str) -> list[str]:
    return [sys.executable, str(EX / f"{name}.py"), *args]


def test_pub_and_sub(domain: Domain) -> None:
    sub = domain.spawn((EX / "sub.py").read_text(), domain.locator, "sr/**", "8")
    pub = domain.run(py("pub", domain.locator, "30"))
    assert pub.returncode == 0, pub.stderr
    assert "published 30 values" in pub.stdout
    out, err = sub.communicate(timeout=30)
    assert sub.returncode == 0, err
    assert "sr/ps/1/current #" in out
    assert "0 lost" in out


def test_serve_and_call(domain: Domain) -> None:
    server = domain.spawn((EX / "serve.py").read_text(), domain.locator, "20")
    assert "serving" in ready_line(server)
    ok = domain.run(py("call", domain.locator, "sr/ps/1/set_current", "42.5"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "42.5"
    back = domain.run(py("call", domain.locator, "sr/ps/1/get_current", "null"))
    assert back.stdout.strip() == "42.5"
    bad = domain.run(py("call", domain.locator, "sr/ps/1/set_current", "500"))
    assert bad.returncode != 0 and "out_of_range" in bad.stderr


def test_device_server_and_monitor(domain: Domain) -> None:
    dev = domain.spawn((EX / "device_server.py").read_text(), domain.locator, "6")
    assert ready_line(dev) == "ps-1 running"
    mon = domain.run(py("monitor", domain.locator, "sr/ps/1/**", "3"))
    assert mon.returncode == 0, mon.stderr
    assert "sr/ps/1/current" in mon.stdout and "sr/ps/1/state" in mon.stdout
    assert "float64[1024]" in mon.stdout
    off = domain.run(py("call", domain.locator, "sr/ps/1/off", "null"))
    assert off.stdout.strip() == '"OFF"'
    out, err = dev.communicate(timeout=30)
    assert dev.returncode == 0, err
    assert "stopped after" in out
