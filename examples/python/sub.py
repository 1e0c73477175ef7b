"""Prints what arrives on an expression, with status events.

Run: python examples/python/sub.py [locator] [expr] [seconds]
(default milonga:///lab, sr/**, 10 s).
"""

import sys
import time

import milonga

locator = sys.argv[1] if len(sys.argv) > 1 else "milonga:///lab"
expr = sys.argv[2] if len(sys.argv) > 2 else "sr/**"
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0

with milonga.open(locator, name="sub-example") as node:
    sub = node.subscribe(expr, qos=milonga.SubscriberQos(last=1))
    end = time.monotonic() + seconds
    samples = 0
    while (left := end - time.monotonic()) > 0:
        try:
            event = sub.recv(timeout=left)
        except milonga.TimeoutError:
            break
        if isinstance(event, milonga.Sample):
            samples += 1
            print(f"{event.key} #{event.seq} = {event.value!r}", flush=True)
        elif isinstance(event, milonga.Lost):
            print(f"lost {event.count} samples of {event.key}", flush=True)
        else:
            print(event, flush=True)
    print(f"{samples} samples, {sub.lost} lost")
