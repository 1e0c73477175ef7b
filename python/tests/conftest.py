"""Shared fixtures: every test gets its own domain and runtime directory, so
tests never see each other's nodes; child processes are real Python
processes running milonga."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

import milonga

REPO = Path(__file__).resolve().parents[2]

# Each test chooses its own domain; an exported MILONGA_LOCATOR would
# replace it (in this process and in the children, which inherit it).
os.environ.pop("MILONGA_LOCATOR", None)
# A default identity or trust directory a secured node makes (docs/security.md)
# goes with the test session, not into the user's home.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="milonga-py-config-")


class Domain:
    """A fresh domain: open nodes in it, start child processes in it."""

    def __init__(self, tmp: Path) -> None:
        self.locator = f"milonga:///py{uuid.uuid4().hex[:12]}"
        self.dir = tmp / "run"
        self.dir.mkdir()
        self.nodes: list[milonga.Node] = []
        self.children: list[subprocess.Popen[str]] = []

    def open(self, name: str, **config: object) -> milonga.Node:
        config.setdefault("transport", "tcp")
        node = milonga.open(self.locator, name=name, runtime_dir=str(self.dir), **config)
        self.nodes.append(node)
        return node

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["MILONGA_RUNTIME_DIR"] = str(self.dir)
        env["MILONGA_TRANSPORT"] = "tcp"
        env["LOCATOR"] = self.locator
        return env

    def spawn(self, code: str, *args: str) -> subprocess.Popen[str]:
        """Runs `code` in a child Python process (LOCATOR in its environment)."""
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), *args],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.children.append(child)
        return child

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=timeout
        )

    def close(self) -> None:
        for c in self.children:
            if c.poll() is None:
                c.kill()
            c.wait(timeout=10)
            if c.stdout:
                c.stdout.close()
            if c.stderr:
                c.stderr.close()
        for n in self.nodes:
            n.close()


@pytest.fixture
def domain(tmp_path: Path) -> Iterator[Domain]:
    d = Domain(tmp_path)
    yield d
    d.close()


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls `cond` until it holds; fails the test after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def next_sample(sub: milonga.Subscription, timeout: float = 10.0) -> milonga.Sample:
    """The next sample, skipping status events."""
    end = time.monotonic() + timeout
    while True:
        event = sub.recv(timeout=max(0.0, end - time.monotonic()))
        if isinstance(event, milonga.Sample):
            return event


def ready_line(child: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The child's first line of output (it prints one when ready)."""
    assert child.stdout is not None
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ)
    if not sel.select(timeout):
        child.kill()
        _, err = child.communicate()
        pytest.fail(f"the child printed nothing in {timeout} s; stderr: {err}")
    line = child.stdout.readline()
    if not line:
        _, err = child.communicate()
        pytest.fail(f"the child ended before it was ready; stderr: {err}")
    return line.strip()
