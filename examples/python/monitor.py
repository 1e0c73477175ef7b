"""A monitor: subscribes to an expression and prints, every second, a table
of keys with their last value, rate and lost count (as `milonga demo` does).

Run: python examples/python/monitor.py [locator] [expr] [seconds]
(default milonga:///lab, **, until Ctrl-C).
"""

import math
import sys
import time
from typing import Any

import numpy as np

import milonga

locator = sys.argv[1] if len(sys.argv) > 1 else "milonga:///lab"
expr = sys.argv[2] if len(sys.argv) > 2 else "**"
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else math.inf


def show(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)} min {value.min():.3f} max {value.max():.3f}"
    text = repr(value)
    return text if len(text) < 40 else text[:37] + "..."


rows: dict[str, list[Any]] = {}  # key -> [count, last value, lost]
with milonga.open(locator, name="monitor") as node:
    sub = node.subscribe(expr, qos=milonga.SubscriberQos(last=1))
    started = time.monotonic()
    next_print = started + 1.0
    try:
        while (now := time.monotonic()) - started < seconds:
            try:
                event = sub.recv(timeout=max(0.0, min(next_print - now, 0.5)))
            except milonga.TimeoutError:
                event = None
            if isinstance(event, milonga.Sample):
                row = rows.setdefault(event.key, [0, None, 0])
                row[0] += 1
                row[1] = event.value
            elif isinstance(event, milonga.Lost):
                rows.setdefault(event.key, [0, None, 0])[2] += event.count
            elif event is not None:
                print(f"# {event!r}", flush=True)
            if time.monotonic() >= next_print:
                elapsed = time.monotonic() - started
                print(f"{'key':<32} {'rate/s':>8} {'count':>8} {'lost':>6}  last value")
                for key in sorted(rows):
                    count, value, lost = rows[key]
                    print(f"{key:<32} {count / elapsed:>8.1f} {count:>8} {lost:>6}  {show(value)}")
                print(flush=True)
                next_print += 1.0
    except KeyboardInterrupt:
        pass
