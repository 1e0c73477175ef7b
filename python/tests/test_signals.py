"""Ctrl-C interrupts a blocking recv or call within 200 ms."""

from __future__ import annotations

import signal
import time

import pytest

from conftest import Domain, ready_line

CHILD = """
import os, signal, sys, time, milonga
# Python raises KeyboardInterrupt on SIGINT unless SIGINT was ignored when it
# started, as it is for a background job of a non-interactive shell (CI):
# install the interactive behaviour explicitly.
signal.signal(signal.SIGINT, signal.default_int_handler)
n = milonga.open(os.environ["LOCATOR"], name="blocked")
what = sys.argv[1]
if what == "recv":
    sub = n.subscribe("nothing/ever")
    block = lambda: sub.recv()
else:
    def slow(req):
        time.sleep(30)
    n.serve("lab/slow", slow)
    while not any(s["key"] == "lab/slow" for p in n.peers() for s in p.get("services", [])):
        time.sleep(0.01)
    block = lambda: n.call("lab/slow", 1, timeout=60)
print("ready", flush=True)
try:
    block()
except KeyboardInterrupt:
    print(f"interrupted {time.monotonic():.6f}", flush=True)
# (A handler still sleeping would hold up a clean close for 30 s.)
os._exit(0)
"""


@pytest.mark.parametrize("what", ["recv", "call"])
def test_ctrl_c_interrupts_a_blocking_wait(domain: Domain, what: str) -> None:
    child = domain.spawn(CHILD, what)
    ready_line(child)
    time.sleep(0.3)  # well inside the blocking call
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=20)
    assert child.returncode == 0, err
    line = next(x for x in out.splitlines() if x.startswith("interrupted"))
    # CLOCK_MONOTONIC is the same in both processes.
    delay = float(line.split()[1]) - sent
    assert 0 <= delay < 0.2, f"KeyboardInterrupt came {delay * 1000:.0f} ms after SIGINT"
