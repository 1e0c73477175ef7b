"""Serves a power supply's commands: `sr/ps/1/set_current` (a number, 0..120)
and `sr/ps/1/get_current`.

Run: python examples/python/serve.py [locator] [seconds]
(default milonga:///lab, 30 s), then python examples/python/call.py.
"""

import sys
import threading

import milonga

locator = sys.argv[1] if len(sys.argv) > 1 else "milonga:///lab"
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0

setpoint = 0.0
lock = threading.Lock()


def set_current(req: milonga.Request) -> float:
    global setpoint
    value = float(req.value)
    if not 0.0 <= value <= 120.0:
        raise milonga.ServiceError("out_of_range", f"{value} A is outside 0..120 A")
    with lock:
        setpoint = value
    return value


def get_current(req: milonga.Request) -> float:
    with lock:
        return setpoint


with milonga.open(locator, name="serve-example") as node:
    node.serve("sr/ps/1/set_current", set_current)
    node.serve("sr/ps/1/get_current", get_current)
    print("serving sr/ps/1/set_current and sr/ps/1/get_current", flush=True)
    threading.Event().wait(seconds)
