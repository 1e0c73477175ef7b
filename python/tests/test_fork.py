"""A process forked from one with open nodes (`os.fork`, `multiprocessing`
with the fork start method): the child cannot use what it inherited, its
own nodes work, and the parent goes on (docs/python.md, "Processes")."""

from __future__ import annotations

from conftest import Domain

# The parent opens a node with a publisher, a subscription and a service,
# then forks. The child tries each inherited object, opens a node of its
# own, and exits the normal way (the interpreter finalizes, dropping what
# it inherited). The parent then publishes, receives and calls again.
FORKING = r"""
import asyncio, os, sys, time, warnings
import milonga

LOCATOR = os.environ["LOCATOR"]

def sample(sub, value):
    end = time.monotonic() + 10
    while time.monotonic() < end:
        ev = sub.recv(timeout=max(0.0, end - time.monotonic()))
        if isinstance(ev, milonga.Sample) and ev.value == value:
            return
    raise SystemExit(f"no sample {value}")

node = milonga.open(LOCATOR, name="parent")
pub = node.publisher("fork/k", milonga.PublisherQos(reliable=True, history=10))
sub = node.subscribe("fork/**", qos=milonga.SubscriberQos(reliable=True))
svc = node.serve("fork/echo", lambda req: req.value)
end = time.monotonic() + 10
while pub.subscriber_count() < 1 and time.monotonic() < end:
    time.sleep(0.01)
pub.put(1.0)
sample(sub, 1.0)
assert node.call("fork/echo", 1.0) == 1.0

async def first(s, value):
    async def go():
        async for ev in s:
            if isinstance(ev, milonga.Sample) and ev.value == value:
                return
    await asyncio.wait_for(go(), 10)

# `async for` before the fork, waiting for a sample put later: Milonga's
# pool of receiving threads exists (the child has its object, none of its
# threads).
import threading
threading.Timer(0.3, pub.put, args=(1.5,)).start()
asyncio.run(first(sub, 1.5))
# And a recording open for reading.
path = os.path.join(os.environ["MILONGA_RUNTIME_DIR"], "fork.mcap")
writer = milonga.open("file://" + path, name="rec")
writer.publisher("fork/rec").put(1.0)
writer.close()
rec = milonga.open_recording(path)
# And a loan not yet put.
loan = pub.loan(64)

with warnings.catch_warnings():
    # Python 3.12 and later warn of a fork in a process with threads.
    warnings.simplefilter("ignore", DeprecationWarning)
    pid = os.fork()
if pid == 0:
    wrong = []
    uses = {
        "put": lambda: pub.put(2.0),
        "recv": lambda: sub.recv(timeout=0.1),
        "call": lambda: node.call("fork/echo", 2.0, timeout=1.0),
        "publisher": lambda: node.publisher("fork/other"),
        "subscribe": lambda: node.subscribe("fork/other"),
        "recording": lambda: next(iter(rec)),
        "loan": lambda: memoryview(loan),
    }
    for name, use in uses.items():
        try:
            use()
            wrong.append(f"{name}: worked")
        except milonga.errors.Closed as e:
            if "forked" not in str(e):
                wrong.append(f"{name}: {e}")
        except Exception as e:
            wrong.append(f"{name}: {type(e).__name__}: {e}")
    # Closing them is nothing to the parent.
    pub.close()
    sub.close()
    svc.close()
    node.close()
    # A node of its own works (a key the parent does not subscribe to:
    # the count of subscribers is then its own subscription alone).
    own = milonga.open(LOCATOR, name="child")
    p2 = own.publisher("forked/child", milonga.PublisherQos(reliable=True))
    s2 = own.subscribe("forked/child", qos=milonga.SubscriberQos(reliable=True))
    end = time.monotonic() + 10
    while p2.subscriber_count() < 1 and time.monotonic() < end:
        time.sleep(0.01)
    p2.put(5.0)
    sample(s2, 5.0)
    # `async for` in the child (it hung: its receive was queued to the
    # parent's pool, whose threads the child does not have).
    threading.Timer(0.3, p2.put, args=(6.0,)).start()
    try:
        asyncio.run(first(s2, 6.0))
    except asyncio.TimeoutError:
        wrong.append("async for: hung")
    own.close()
    print("child:", "; ".join(wrong) or "ok", flush=True)
    sys.exit(1 if wrong else 0)

_, status = os.waitpid(pid, 0)
# The parent goes on: its node, publisher, subscription, service and
# recording.
assert any(isinstance(ev, milonga.Sample) and ev.value == 1.0 for ev in rec)
pub.put(3.0)
sample(sub, 3.0)
assert node.call("fork/echo", 3.0) == 3.0
print("parent: ok, child exit", os.waitstatus_to_exitcode(status), flush=True)
node.close()
"""


def test_a_forked_child_cannot_use_what_it_inherited_and_the_parent_lives_on(
    domain: Domain,
) -> None:
    child = domain.spawn(FORKING)
    out, err = child.communicate(timeout=60)
    # Before, the child's first use of an inherited object (or its exit,
    # dropping them) woke the parent's libzmq threads with commands they
    # never found, and libzmq aborted the parent (status -6).
    assert child.returncode == 0, f"status {child.returncode}\n{out}\n{err}"
    assert out.splitlines() == ["child: ok", "parent: ok, child exit 0"], f"{out}\n{err}"
