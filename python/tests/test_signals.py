"""Ctrl-C interrupts a blocking recv, call, call_all or service close (which
waits for a running handler). How long it takes is measured by ``python -m
milonga.bench signals`` (recv and call), with the same child program."""

from __future__ import annotations

import signal
import time

import pytest

from milonga.bench import SIGNALS_CHILD
from conftest import Domain, ready_line

# A hang guard, not a measurement: 10 times the 200 ms promise of
# docs/guarantees.md, which the bench checks.
HANG_GUARD_S = 2.0


@pytest.mark.parametrize("what", ["recv", "call", "call_all", "close"])
def test_ctrl_c_interrupts_a_blocking_wait(domain: Domain, what: str) -> None:
    child = domain.spawn(SIGNALS_CHILD, what)
    # Printed once the child's main thread is inside the native call (see
    # SIGNALS_CHILD): from here on, only SIGINT can end that call in time (a
    # recv of a key nobody publishes, a call whose handler sleeps 30 s).
    assert ready_line(child) == "blocked"
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=20)
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert lines and lines[0].startswith("interrupted "), (
        f"no KeyboardInterrupt where the call blocked; the child printed {out!r}, {err}"
    )
    # CLOCK_MONOTONIC is the same in both processes.
    interrupted = float(lines[0].split()[1])
    assert sent <= interrupted, "KeyboardInterrupt came before SIGINT was sent"
    assert interrupted - sent < HANG_GUARD_S, (
        f"hang guard: KeyboardInterrupt came {interrupted - sent:.1f} s after SIGINT"
    )
